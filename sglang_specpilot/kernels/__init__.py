"""Triton kernels, each with a launcher and a plain PyTorch reference (see STYLE.md), one module a kernel.

Nothing is imported here: the engine imports kernel modules (and ``launch``) on CPU-only installs without
Triton too, where each kernel module keeps its reference, and an eager import of a Triton kernel would fail.
"""
