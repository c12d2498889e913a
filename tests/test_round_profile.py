"""benchmarks/probes/round_profile.py on the CPU (no kernels to record there): at a batch of parked rows, the
batched system profiles every round kind its engine captured, each under its own name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import stand_in_folders

PROBE = Path(__file__).parents[1] / "benchmarks" / "probes" / "round_profile.py"


def test_batched_profiles_every_round_kind(tmp_path):
    folders = stand_in_folders(tmp_path, 12)
    out = tmp_path / "rp.json"
    argv = [
        sys.executable, str(PROBE), "--target", "smollm2", "--model", str(folders / "target"),
        "--draft", str(folders / "draft"), "--device", "cpu", "--dtype", "float32", "--batch", "2",
        "--systems", "ar,batched", "--iters", "2", "--context", "20", "--max-seq-len", "128", "--out", str(out),
        "--batched-args", "--tree 6,3,2 --adaptive-depths 2 --shared-budget 6 --chain-depths 2",
    ]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    systems = json.loads(out.read_text())["systems"]
    # The configured tree, its shallower depth, the shared budget's narrowed widths, the chain and the keep-up
    # AR round of automatic off: each profiled at the bucket, each with its times.
    assert {"ar", "batched", "batched:2", "batched:ar", "batched:chain2"} <= set(systems)
    assert any(name.startswith("batched:(") for name in systems)  # a narrowed width (depth, width)
    for name, r in systems.items():
        assert r["batch"] == 2 and len(r["round_ms"]) == 2 and r["round_ms_median"] > 0, name
    assert systems["batched:chain2"]["config"]["round_kind"] == "chain2"
