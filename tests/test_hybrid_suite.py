"""The hybrid suite's bookkeeping, dry-run on the CPU with the tiny hybrid (wall-clock times, PyTorch WY)."""

import json

from sglang_specpilot.harness.bench import run_suite
from sglang_specpilot.models.presets import preset_config
from sglang_specpilot.suites.hybrid import tree_parents


def test_hybrid_suite_dry_run(tmp_path):
    argv = ["--device", "cpu", "--model", "tiny-hybrid", "--budget", "8", "--depth", "3", "--context", "16"]
    argv += ["--blocks", "2", "--inner", "1", "--results-dir", str(tmp_path)]
    doc = json.loads(run_suite("hybrid", argv).read_text())
    m = doc["metrics"]
    for key in (
        "wy_verify_over_path_recompute",
        "tree32_verify_over_chain_verify",
        "wy_mix_over_path_mix",
        "wy_tree_ms",
        "path_tree_ms",
        "stock_chain_ms",
    ):
        assert m[key] > 0, key
    # The same inputs through two exact-in-fp32 forms: at most one bf16 step apart.
    assert m["wy_max_ulp_vs_path"] <= 1 and m["wy_max_ulp_vs_fp64"] <= 1
    # Measured from the verify step's tensors, it is what the shapes say: d_k d_v / (d_k + d_v + 1) per head.
    cfg = preset_config("tiny-hybrid")
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    assert m["snapshot_memory_ratio"] == round(dk * dv / (dk + dv + 1), 3)
    mem = next(r for r in doc["rows"] if r["case"] == "memory")
    assert mem["bytes_snapshots_chain"] * 9 == mem["bytes_snapshots_tree"] * 4  # 4 positions vs 9
    timing = next(r for r in doc["rows"] if r["case"] == "timing")
    assert timing["wy_impl"] == "pytorch" and timing["tree_nodes"] == 9 and timing["chain_nodes"] == 4
    assert doc["weights"] == "synthetic" and doc["gpu"] == "cpu" and doc["model"] == "tiny-hybrid"


def test_tree_parents_shape():
    parents = tree_parents(33, 6, seed=0)
    depth = [0]
    for p in parents[1:]:
        depth.append(depth[p] + 1)
    assert len(parents) == 33 and max(depth) == 6 and parents[:7] == [-1, 0, 1, 2, 3, 4, 5]
    assert all(p < i for i, p in enumerate(parents))
