"""The colocate suite's bookkeeping, dry-run on the CPU with tiny presets (wall-clock times)."""

import json

from sglang_specpilot.harness.bench import run_suite


def test_colocate_suite_dry_run(tmp_path):
    argv = ["--pairs", "tiny-llama:tiny-qwen3", "--batch", "4", "--gamma", "2", "--prompt-len", "16",
            "--device", "cpu", "--dtype", "float32", "--blocks", "2", "--inner", "1", "--search-iters", "3",
            "--state-dir", str(tmp_path / "state"), "--results-dir", str(tmp_path)]
    doc = json.loads(run_suite("colocate", argv).read_text())
    m = doc["metrics"]
    slug = "tinyllama_tinyqwen3"
    assert set(m) == {f"round_speedup_{slug}", f"round_speedup_no_interleave_{slug}",
                      f"round_speedup_two_stream_{slug}"}
    assert all(v > 0 for v in m.values())
    cases = [r["case"] for r in doc["rows"]]
    assert cases == [f"{slug}.baselines", f"{slug}.best_no_interleave", f"{slug}.best_interleave"]
    assert doc["weights"] == "synthetic" and doc["gpu"] == "cpu"
    # The search state persisted, one file per search, with the root evaluated.
    for label in ("no_interleave", "interleave"):
        state = json.loads((tmp_path / "state" / f"{slug}_{label}.json").read_text())
        assert state["records"] and state["nodes"]
