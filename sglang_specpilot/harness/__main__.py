"""``python -m sglang_specpilot.harness SUITE [options]``: the benchmark runner without the CLI."""

from .bench import main

raise SystemExit(main())
