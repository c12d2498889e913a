"""The colocate suite's bookkeeping, dry-run on the CPU with tiny presets (wall-clock times)."""

import json

from sglang_specpilot.harness.bench import run_suite


def test_colocate_suite_dry_run(tmp_path):
    argv = [
        "--pairs",
        "tiny-llama:tiny-qwen3",
        "--batch",
        "4",
        "--gamma",
        "2",
        "--prompt-len",
        "16",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--blocks",
        "2",
        "--inner",
        "1",
        "--search-iters",
        "3",
        "--state-dir",
        str(tmp_path / "state"),
        "--results-dir",
        str(tmp_path),
    ]
    doc = json.loads(run_suite("colocate", argv).read_text())
    m = doc["metrics"]
    slug = "tinyllama_tinyqwen3"
    # No kernel trace on the CPU, so no busy fractions; round times come from the baselines row.
    assert set(m) == {
        f"round_speedup_{slug}",
        f"round_speedup_no_interleave_{slug}",
        f"round_speedup_two_stream_{slug}",
        f"round_us_conventional_{slug}",
        f"round_us_two_stream_{slug}",
        f"round_us_conventional_full_batch_{slug}",
        f"throughput_vs_full_batch_{slug}",
    }
    assert all(v > 0 for v in m.values())
    base = doc["rows"][0]
    assert m[f"round_us_two_stream_{slug}"] == base["median_us"]["anchor"]
    cases = [r["case"] for r in doc["rows"]]
    assert cases == [f"{slug}.baselines", f"{slug}.best_no_interleave", f"{slug}.best_interleave"]
    assert doc["weights"] == "synthetic" and doc["gpu"] == "cpu"
    # The search state persisted, one file per search, with the root evaluated.
    for label in ("no_interleave", "interleave"):
        state = json.loads((tmp_path / "state" / f"{slug}_{label}.json").read_text())
        assert state["records"] and state["nodes"]


def test_merge_results_joins_runs_and_rederives(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "merge_results", Path(__file__).parents[1] / "benchmarks" / "merge_results.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def part(slug, commit, us):
        row = {
            "case": f"{slug}.baselines",
            "fastest_conventional": "seq_graph",
            "median_us": {"seq_graph": us, "back_to_back": us + 1, "anchor": us / 2},
            "gpu_busy": {"anchor": 0.9},
        }
        return {
            "suite": "colocate",
            "commit": commit,
            "date": f"2026-11-29T1{len(slug)}",
            "gpu": "g",
            "command": slug,
            "metrics": {f"round_speedup_{slug}": 2.0},
            "rows": [row],
        }

    doc = mod.merge([part("a", "c1", 10.0), part("bb", "c1", 20.0)])
    assert doc["commit"] == "c1" and doc["command"] == "a ; bb" and len(doc["runs"]) == 2
    assert doc["metrics"]["round_us_conventional_bb"] == 20.0 and doc["metrics"]["gpu_busy_anchor_a"] == 0.9
    try:
        mod.merge([part("a", "c1", 10.0), part("a", "c2", 10.0)])
    except SystemExit as e:
        assert "measured twice" in str(e)
    else:
        raise AssertionError("a metric measured twice must be refused")
