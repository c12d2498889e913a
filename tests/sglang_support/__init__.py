"""Test support for the SGLang contract tests: importing the real ``sglang`` package on a CPU-only torch."""
