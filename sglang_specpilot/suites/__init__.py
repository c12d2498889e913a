"""Benchmark suites run by ``specpilot bench SUITE`` (registered with harness.bench)."""
