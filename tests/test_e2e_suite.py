"""The e2e suite (suites/e2e.py): its pieces, and a dry run of the whole suite on the CPU with tiny models.

The CPU run's timings mean nothing; what it checks is the bookkeeping a GPU run depends on: the sweep
picks configurations, every system runs interleaved, the cost model and token forcing land in the rows,
the metrics and the table are built, and a results file in the runner's format is written.
"""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch
from helpers import stand_in_folders, tiny_model

from sglang_specpilot.harness.bench import run_suite
from sglang_specpilot.harness.token_forcing import token_forcing
from sglang_specpilot.suites.e2e_configs import (
    batch_chunks,
    best,
    chain,
    config_label,
    config_options,
    parse_grid,
    parse_ints,
    run_order,
    tree,
    tree_search,
)
from sglang_specpilot.suites.e2e_results import cell_stats, cost_model, merge_reports, readme_table, summarize

V = 12


def test_parsing_and_order():
    assert parse_ints("3-8") == [3, 4, 5, 6, 7, 8] and parse_ints("1,4,16") == [1, 4, 16]
    assert parse_ints("1, 3-4") == [1, 3, 4]
    assert parse_grid("16,32,64:5,6,7:4,8") == ([16, 32, 64], [5, 6, 7], [4, 8])
    with pytest.raises(ValueError):
        parse_grid("16,32:5")
    assert run_order([1, 4, 16]) == [1, 16, 4] and run_order([4, 2]) == [4, 2]
    ps = list(range(10))
    assert batch_chunks(ps, 8, 1) == [[i] for i in range(8)]
    assert batch_chunks(ps, 8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert batch_chunks(ps, 8, 16) == []  # fewer prompts than the batch: no batch
    assert batch_chunks(list(range(20)), 8, 16) == [list(range(16))]  # a batch of 16 distinct prompts
    assert config_options(chain(5)) == {"num_speculative_tokens": 5}
    assert config_options(tree(32, 6, 8)) == {"tree_budget": 32, "tree_depth": 6, "tree_top_k": 8}
    assert config_label(tree(32, 6, 8)) == "tree N=32 D=6 K=8" and config_label({"kind": "ar"}) == "AR"


def test_tree_search_coordinates_then_full():
    # A made-up speed surface with its best at N 64, D 6, K 4; D 7 fails (as an invalid config would).
    def speed(c):
        return 100 - abs(c["depth"] - 6) * 10 - (c["top_k"] == 8) * 5 - {16: 8, 32: 4, 64: 0}[c["budget"]]

    seen = []

    def evaluate(c):
        seen.append(c)
        if c["depth"] == 7:
            return {"config": c, "error": "ValueError: no"}
        return {"config": c, "tokens_per_s": speed(c)}

    grid = ([16, 32, 64], [5, 6, 7], [4, 8])
    recs = tree_search(grid, evaluate)
    # D at (32, K 8), then K at D 6, then N at (D 6, K 4): six distinct configs, none twice.
    assert seen == [tree(32, 5, 8), tree(32, 6, 8), tree(32, 7, 8), tree(32, 6, 4), tree(16, 6, 4), tree(64, 6, 4)]
    assert best(recs, "tokens_per_s")["config"] == tree(64, 6, 4)
    seen.clear()
    assert len(tree_search(grid, evaluate, "full")) == 18 and len(seen) == 18
    assert best([{"error": "x"}, {"skipped": "budget"}], "tokens_per_s") is None


def test_larger_batches_try_the_batch1_choice_then_narrower_ones():
    from sglang_specpilot.suites.e2e import _nearest_below

    recs = [{"config": chain(g)} for g in (5, 4, 6, 3, 7, 8)]
    assert [r["config"]["gamma"] for r in _nearest_below(recs, "gamma", 6)] == [6, 5, 4, 3, 7, 8]


def _run(wall, decode, tokens, rounds, round_tokens):
    return {"wall_s": wall, "decode_s": decode, "tokens": tokens, "rounds": rounds, "round_tokens": round_tokens}


def test_cell_stats_and_cost_model():
    ar_runs = [_run(2.0, 1.9, [128, 128], [127, 127], [127, 127])]
    ar = {**cell_stats(ar_runs, None, None, None), "runs": ar_runs}
    assert ar["tau"] == 1.0 and ar["tokens_per_s"] == 128.0 and ar["straggler"] == 1.0
    # Two rows: 40 and 30 rounds emitting 127 tokens each; the batch ran 40 rounds.
    spec = [_run(0.8, 0.7, [128, 128], [40, 30], [127, 127])]
    s = cell_stats(spec, 12.0, ar, 5.0)
    assert s["tau"] == pytest.approx(254 / 70)
    assert s["straggler"] == pytest.approx(80 / 70)
    assert s["speedup_vs_ar"] == pytest.approx(2.0 / 0.8)
    assert s["decode_speedup_vs_ar"] == pytest.approx(1.9 / 0.7)
    assert s["c"] == pytest.approx(12.0 / 5.0)
    assert s["predicted_speedup"] == pytest.approx((254 / 70) / (12.0 / 5.0))
    assert s["costmodel_error"] == pytest.approx(abs(s["predicted_speedup"] / (1.9 / 0.7) - 1))
    assert s["costmodel_error_e2e"] == pytest.approx(abs(s["predicted_speedup"] / 2.5 - 1))
    assert s["per_batch_speedup_vs_ar"] == [pytest.approx(2.5)]
    # The wave: the batch ran its slowest row's 40 rounds, not the mean's 35, so S over 80 / 70 is what a
    # wave of these rows can show.
    assert s["wave_corrected_speedup"] == pytest.approx(s["predicted_speedup"] * 70 / 80)
    assert s["costmodel_error_wave"] == pytest.approx(abs(s["wave_corrected_speedup"] / (1.9 / 0.7) - 1))
    assert summarize([{"system": "ar", "batch": 2, "set": "x", **ar}, {"system": "trees", "batch": 2, "set": "x",
                      **s}], {})["costmodel_error_max_wave"] == round(s["costmodel_error_wave"], 4)  # fmt: skip
    assert cost_model(3.0, 6.0, 4.0) == {"c": 1.5, "predicted_speedup": 2.0}


def _cell(system, b, set_name, speedup, tau=None, err=None):
    return {
        "system": system,
        "batch": b,
        "set": set_name,
        "tokens_per_s": 100.0 * speedup,
        "tau": tau,
        "speedup_vs_ar": speedup,
        "costmodel_error": err,
        "costmodel_error_e2e": err,
    }


def test_summarize_names_the_issues_metrics():
    cells = []
    for s, (h, m) in {"ar": (1, 1), "stock": (1.5, 1.2), "trees": (2.0, 1.8), "w12": (2.4, 1.6)}.items():
        cells += [_cell(s, 1, "humaneval", h, 2.5, 0.01), _cell(s, 1, "mtbench", m, 2.0, 0.03)]
    cells += [_cell("ar", 16, "humaneval", 1), _cell("trees", 16, "humaneval", 1.4, 2.2, 0.08)]
    verdicts = {("ar", "all"): True, ("stock", "all"): True, ("trees", "all"): True, ("w12", "all"): False}
    m = summarize(cells, verdicts)
    trees, w12, stock = math.sqrt(2.0 * 1.8), math.sqrt(2.4 * 1.6), math.sqrt(1.5 * 1.2)
    assert m["e2e_speedup_vs_ar_bs1"] == pytest.approx(round(max(trees, w12), 3))
    assert m["e2e_best_is_w12_bs1"] == int(w12 > trees)
    assert m["e2e_speedup_vs_stock_bs1"] == pytest.approx(round(max(trees, w12) / stock, 3))
    assert m["e2e_speedup_vs_ar_bs16"] == 1.4 and "e2e_speedup_vs_stock_bs16" not in m  # no stock at 16
    assert m["costmodel_error_max"] == 0.08
    assert m["forcing_accepted_w12"] == 0 and m["forcing_all_accepted"] == 0 and m["forcing_accepted_trees"] == 1
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in m.values())


def test_merge_reports_equals_one_report_over_all():
    g = torch.Generator().manual_seed(0)
    table = {}

    def score(prompt, generated):
        key = (tuple(prompt), tuple(generated))
        if key not in table:
            table[key] = torch.randn(len(generated), 7, generator=g)
        return table[key]

    gens = [([1, 2], [3, 4, 5, 6]), ([2], [0, 1, 2]), ([5, 5, 5], [6, 6])]
    each = [token_forcing(score, [x]) for x in gens]
    whole = token_forcing(score, gens)
    merged = merge_reports(each)
    for f in ("tokens", "mismatches", "rate", "rate_low", "rate_high", "large_margin", "eps"):
        assert getattr(merged, f) == pytest.approx(getattr(whole, f)), f
    assert [(d.sequence, d.position) for d in merged.details] == [(d.sequence, d.position) for d in whole.details]


def test_w12_twin_shares_all_but_the_projections():
    from sglang_specpilot.models.w12_weights import w12_twin

    model = tiny_model("tiny-llama", dtype=torch.bfloat16)
    twin = w12_twin(model)
    assert type(model.layers[0].attn.wqkv).__name__ == "Linear"  # the original is left as it is
    assert type(twin.layers[0].attn.wqkv).__name__ == "W12Linear" and type(twin.lm_head).__name__ == "W12Linear"
    assert (
        twin.embed.weight is model.embed.weight and twin.layers[1].attn_norm.weight is model.layers[1].attn_norm.weight
    )
    from sglang_specpilot.models.lift import sequence_logits

    ids = [3, 7, 1, 9, 4]
    assert torch.equal(sequence_logits(twin, ids), sequence_logits(model, ids))  # CPU: exact decode


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny target (a safetensors folder with a synthetic tokenizer) and an EAGLE-3 drafter folder."""
    return stand_in_folders(tmp_path_factory.mktemp("e2e"), V, perturb=0.2)


def _argv(folders, out, *extra):
    return [
        "--model", str(folders / "target"), "--draft", str(folders / "draft"), "--device", "cpu",
        "--sets", "synthetic", "--tune-prompts", "synthetic:2", "--batches", "1,2", "--prompts-per-set", "2",
        "--new-tokens", "8", "--tune-tokens", "8", "--gammas", "2-3", "--tree-grid", "4,6:2,3:2",
        "--round-iters", "2", "--max-seq-len", "128", "--results-dir", str(out), *extra,
    ]  # fmt: skip


def test_dry_run_on_cpu(folders, tmp_path):
    # bf16, so the W12 twin runs too (its CPU path decodes exactly); the real model's path (no lift), by
    # the suite that defaults to it and writes its own file.
    # --no-fallback-ar: CPU round times can make every tree lose to AR at batch 2, and this run checks that
    # every system runs its own configuration (the auto-off has its own tests below).
    path = run_suite("e2e_smollm2", _argv(folders, tmp_path, "--dtype", "bfloat16", "--no-fallback-ar"))
    doc = json.loads(path.read_text())
    assert path.name == "e2e_smollm2_cpu.json" and doc["suite"] == "e2e_smollm2" and doc["gpu"] == "cpu"
    assert "partial" not in doc and doc["model"]["target"] == "smollm2"
    assert not doc["errors"], doc["errors"]
    m = doc["metrics"]
    for name in ("e2e_speedup_vs_ar_bs1", "e2e_speedup_vs_stock_bs1", "e2e_speedup_vs_ar_bs2", "costmodel_error_max"):
        assert name in m and m[name] > 0, name
    assert {f"forcing_accepted_{s}" for s in ("ar", "stock", "trees", "w12", "tlv")} <= set(m)
    assert m["forcing_accepted_ar"] == 1 and m["tlv_built"] == 1
    assert m["e2e_best_is_w12_bs1"] + m["e2e_best_is_tlv_bs1"] <= 1  # which system the headline speedups are
    cells = [r for r in doc["table"] if "status" not in r]
    assert {(c["system"], c["batch"]) for c in cells} == {
        (s, b) for s in ("ar", "stock", "trees", "w12", "tlv") for b in (1, 2)
    }
    assert len(cells) == len(doc["table"])  # every system ran: none is listed as not built
    rows = [r for r in doc["rows"] if r["case"] == "system"]
    for r in rows:  # raw timings behind every cell: one entry per timed batch, one per row inside it
        assert len(r["wall_s"]) == len(r["decode_s"]) == len(r["tokens"]) == 2 // r["batch"]
        assert all(len(t) == r["batch"] and all(n == 8 for n in t) for t in r["tokens"])
        if r["system"] != "ar":
            assert r["predicted_speedup"] > 0 and r["costmodel_error"] >= 0 and r["round_ms"]
    sel = doc["selection"]
    assert set(sel) == {"1", "2"} and sel["1"]["stock"].startswith("chain") and sel["1"]["trees"].startswith("tree")
    assert sel["1"]["w12"] == sel["1"]["trees"] and sel["2"]["w12"] == sel["2"]["trees"]
    assert sel["1"]["tlv"] == sel["1"]["trees"] + " + TLV L=4"  # the trees' config with a Q chain
    tune = next(r for r in doc["rows"] if r["case"] == "tune.bs1")
    assert len(tune["chain"]) == 2 and tune["tree"] and all("label" in t for t in tune["tree"])
    assert {r["case"] for r in doc["rows"]} >= {"ar_step", "round_times", "forcing", "w12_twin", "tune.bs2"}
    assert doc["model"]["lifted"] is False and doc["log"] and doc["command"].startswith("specpilot bench e2e_smollm2")
    table = readme_table(doc)
    assert table.count("\n| ") == len(doc["table"]) + 1 and "SpecPilot trees + W12" in table
    from sglang_specpilot.harness.report import render_file

    md = render_file(path)  # `make results`: the metrics, then the suite's own table
    assert "| e2e_speedup_vs_ar_bs1 |" in md and md.endswith(table)


def test_lifted_models_and_refusals(folders, tmp_path):
    from sglang_specpilot.suites import e2e

    p = argparse.ArgumentParser()
    p.add_argument("--results-dir", default=None)
    e2e._args(p)
    args = p.parse_args(_argv(folders, tmp_path, "--target", "tiny", "--lift-layers", "4", "--dtype", "float32"))
    run = e2e._Run(args)
    run.load()
    info = run.out["model"]
    assert info["lifted"] and " lifted to " in info["label"] and "stand-in" in info["label"]
    assert run.target.cfg.hidden_size == 640 and run.drafter.fc.weight.shape == (640, 3 * 640)
    assert run.drafter.embed is run.target.embed and run.real_vocab == V
    assert all(0 < len(p) and max(p) < V for p in run.tune_prompts())
    args.tune_prompts = "general:3"  # held-out chat prompts (the default's second half)
    assert len(run.tune_prompts()) == 3
    args.tune_prompts = "mtbench"
    with pytest.raises(SystemExit, match="evaluation set"):
        run.tune_prompts()
    args.systems = "ar,bogus"
    with pytest.raises(SystemExit, match="bogus"):
        e2e._Run(args)
    if not torch.cuda.is_available():
        args.device = "cuda"
        with pytest.raises(SystemExit, match="needs a CUDA GPU"):
            e2e.e2e(args)


def _planted_run(monkeypatch, tmp_path, argv, tau, round_ms, speed=None):
    """A ``_Run`` whose measurements are planted: ``tau(cfg)`` and ``round_ms(cfg, b)`` (AR's cfg is
    ``{"kind": "ar"}``); no model is loaded. Returns the run and the configs measured at batch 1, in order."""
    from sglang_specpilot.suites import e2e

    p = argparse.ArgumentParser()
    p.add_argument("--results-dir", default=str(tmp_path))
    e2e._args(p)
    run = e2e._Run(p.parse_args(["--device", "cpu", *argv]))
    measured = []

    def measure_bs1(cfg, prompts, deadline, context):
        measured.append(cfg)
        return {"config": cfg, "label": config_label(cfg), "tokens_per_s": (speed or tau)(cfg), "tau": tau(cfg)}

    monkeypatch.setattr(run, "measure_bs1", measure_bs1)
    monkeypatch.setattr(run, "engine", lambda cfg, w12=False: cfg)  # round_ms gets the config
    monkeypatch.setattr(run, "round_ms", lambda cfg, b, context: [round_ms(cfg, b)] * 3)
    run.ar_ms = {b: round_ms({"kind": "ar"}, b) for b in run.batches}
    return run, measured


def _h200_round_ms(cfg, b, scale=1.0):
    """Round times shaped like the H200's at batch 16 (ms = 4.7 + 0.022 per verified token: AR 5.05,
    stock gamma 5 6.8, N 32 16.3 against the measured 5.04, 7.22, 16.47); ``scale`` multiplies the
    speculative rounds."""
    nodes = {"ar": 1, "chain": cfg.get("gamma", 0) + 1, "tree": cfg.get("budget", 0) + 1}[cfg["kind"]]
    ms = 4.7 + 0.022 * b * nodes
    return ms if cfg["kind"] == "ar" else ms * scale


def test_larger_batches_measure_and_consider_smaller_trees(monkeypatch, tmp_path):
    # The H200's case: the batch-1 budget ran out at N 32 (N 16 and 64 skipped), N 32 D 3 K 8 won there.
    tau = {32: 3.0, 8: 2.4, 4: 1.9}

    def t(cfg):
        return None if cfg["kind"] == "tree" and cfg["budget"] not in tau else tau.get(cfg.get("budget"), 1.5)

    def speed(cfg):  # batch 1: N 32 D 3 K 8 fastest; N 16 and 64 "skipped" (no tokens/s)
        if cfg["kind"] == "chain":
            return 100.0
        return None if cfg["budget"] not in tau else 200.0 - cfg["depth"] - (cfg["top_k"] != 8) - cfg["budget"] % 32

    argv = ["--batches", "1,16", "--gammas", "5", "--tree-grid", "16,32,64:3,5:4,8", "--systems", "ar,stock,trees"]
    run, measured = _planted_run(monkeypatch, tmp_path, argv, t, _h200_round_ms, speed)
    run.sweep([[1, 2]], 100)
    assert run.selected[1]["trees"] == tree(32, 3, 8)
    # After the batch-1 sweep: N 8 then N 4 at its D and K (nothing else: two extra compiles).
    assert measured[-2:] == [tree(8, 3, 8), tree(4, 3, 8)]
    small = next(r for r in run.out["rows"] if r["case"] == "tune.small_trees")["tree"]
    assert [r["config"]["budget"] for r in small] == [8, 4] and all(r["tau"] for r in small)
    bs16 = next(r for r in run.out["rows"] if r["case"] == "tune.bs16")
    assert [r["config"]["budget"] for r in bs16["by_cost_model"] if r["system"] == "trees"] == [4, 8, 32]
    # S at 16: N 32 3.0 / (16.3 / 5.05) = 0.93, N 8 2.4 / (7.9 / 5.05) = 1.53, N 4 1.9 / (6.5 / 5.05) = 1.48.
    assert run.selected[16]["trees"] == tree(8, 3, 8) == run.selected[16]["w12"] and "fallback_ar" not in bs16
    assert run.out["selection"]["16"]["trees"] == "tree N=8 D=3 K=8"
    # Small budgets cap the depth: N 4 below a D 5 pick is D 4.
    from sglang_specpilot.suites.e2e_configs import smaller_trees

    assert smaller_trees(tree(32, 5, 8)) == [tree(8, 5, 8), tree(4, 4, 8)] and smaller_trees(tree(4, 3, 8)) == []
    # Batch 1 alone: no small tree is measured.
    run, measured = _planted_run(monkeypatch, tmp_path, [*argv[:-2], "--batches", "1"], t, _h200_round_ms, speed)
    run.sweep([[1, 2]], 100)
    assert all(c.get("budget") not in (4, 8) for c in measured)
    assert not any(r["case"] == "tune.small_trees" for r in run.out["rows"])


@pytest.mark.parametrize("fallback", [True, False])
def test_no_config_predicted_to_beat_ar_falls_back_to_ar(monkeypatch, tmp_path, fallback):
    # Every speculative round 10x the H200's: the best S at batch 16 is far below 1 for trees and chains.
    def rms(cfg, b):
        return _h200_round_ms(cfg, b, 10.0 if b > 1 else 1.0)

    argv = ["--batches", "1,4,16", "--gammas", "4-5", "--tree-grid", "32:3:8", "--systems", "ar,stock,trees"]
    if not fallback:
        argv.append("--no-fallback-ar")
    run, _ = _planted_run(monkeypatch, tmp_path, argv, lambda c: 2.5, rms)
    run.sweep([[1, 2]], 100)
    for b in (4, 16):
        row = next(r for r in run.out["rows"] if r["case"] == f"tune.bs{b}")
        assert run.selected[b]["stock"]["kind"] == "chain"  # stock has no auto-off
        assert run.selected[b]["w12"]["kind"] == "tree"
        if fallback:
            assert run.selected[b]["trees"]["kind"] == "ar" and row["fallback_ar"].startswith("no tree or chain")
            assert run.out["selection"][str(b)]["trees"].startswith(
                f"AR (fallback: no tree or chain predicted S > 1 at batch {b}; best tree N="
            )
        else:
            assert run.selected[b]["trees"]["kind"] == "tree" and "fallback_ar" not in row
    assert run.selected[1]["trees"]["kind"] == "tree"  # batch 1 is the sweep's measured pick, never off
    # The fallback runs on AR's engine: its reason is no part of the engine's key.
    from sglang_specpilot.suites.e2e_configs import config_key, fallback_ar

    assert config_key(fallback_ar("why")) == config_key({"kind": "ar"})


def test_dry_run_times_a_switched_off_batch_as_ar(folders, tmp_path, monkeypatch):
    # Planted round times: every speculative round at batch 2 costs 1000x its measurement, so nothing is
    # predicted to beat AR there and the trees are timed as AR; batch 1 measures its trees as usual. The
    # grid's one budget (12) leaves N 8 and 4 to measure for batch 2.
    from sglang_specpilot.suites import e2e

    measured_ms = e2e._Run.round_ms

    def round_ms(self, eng, b, context):
        ms = measured_ms(self, eng, b, context)
        return [x * 1000 for x in ms] if eng.draft is not None and b > 1 else ms

    monkeypatch.setattr(e2e._Run, "round_ms", round_ms)
    argv = _argv(folders, tmp_path, "--target", "smollm2", "--dtype", "float32", "--systems", "ar,stock,trees")
    doc = json.loads(run_suite("e2e", [*argv, "--tree-grid", "12:2,3:4"]).read_text())
    assert not doc["errors"], doc["errors"]
    small = next(r for r in doc["rows"] if r["case"] == "tune.small_trees")["tree"]
    assert [r["config"]["budget"] for r in small] == [8, 4] and all(r["tau"] for r in small)
    bs2 = next(r for r in doc["rows"] if r["case"] == "tune.bs2")
    assert {r["config"]["budget"] for r in bs2["by_cost_model"] if r["system"] == "trees"} == {12, 8, 4}
    assert all(r["predicted_speedup"] < 1 for r in bs2["by_cost_model"])
    sel, m = doc["selection"], doc["metrics"]
    assert sel["2"]["trees"].startswith("AR (fallback: no tree or chain predicted S > 1 at batch 2")
    assert sel["2"]["stock"].startswith("chain") and sel["1"]["trees"].startswith("tree")
    assert m["e2e_trees_fallback_ar_bs2"] == 1 and "e2e_trees_fallback_ar_bs1" not in m
    trees2 = next(c for c in doc["table"] if c["system"] == "trees" and c["batch"] == 2)
    assert trees2["setting"] == sel["2"]["trees"] and trees2["verdict"] == "accepted"
    rounds = next(r for r in doc["rows"] if r["case"] == "round_times" and r["batch"] == 2)
    assert rounds["configs"]["trees"]["kind"] == "ar"  # timed on AR's engine: the headline is AR's pace
    assert m["e2e_speedup_vs_ar_bs2"] == m["e2e_trees_speedup_vs_ar_bs2"] > 0
    assert "AR (fallback" in readme_table(doc)


def test_a_failing_system_is_reported_and_the_rest_go_on(folders, tmp_path):
    # No gamma can be built (33 > the engine's 32), so stock has no configuration: its failure is recorded
    # at every batch and AR and the trees are measured as usual.
    argv = _argv(folders, tmp_path, "--target", "smollm2", "--dtype", "float32", "--gammas", "33")
    doc = json.loads(run_suite("e2e", argv).read_text())
    stages = {(e["stage"], e.get("system")) for e in doc["errors"]}
    assert ("tune", None) in stages and ("setup", "stock") in stages
    assert {c["system"] for c in doc["table"] if "status" not in c} == {"ar", "trees"}
    assert "e2e_speedup_vs_ar_bs1" in doc["metrics"] and "e2e_speedup_vs_stock_bs1" not in doc["metrics"]
    assert any(s["part"] == "w12" for s in doc["skipped"])  # float32: no W12, said so


def test_past_the_deadline_parts_are_skipped_and_listed(folders, tmp_path):
    argv = _argv(folders, tmp_path, "--target", "smollm2", "--dtype", "float32", "--systems", "ar,trees")
    doc = json.loads(run_suite("e2e", [*argv, "--deadline-s", "0"]).read_text())
    assert [s["part"] for s in doc["skipped"]] == ["bs1", "bs2"]
    assert not [c for c in doc["table"] if "status" not in c] and doc["metrics"] == {"tlv_built": 0}


def test_where_a_chain_beats_every_tree_the_trees_run_it(monkeypatch, tmp_path):
    # The H200's batch 4 (62be095): tree N 64 ran at 0.99x AR while stock's gamma 3 ran at 1.15x. With
    # planted round times 3x the H200's for trees at batch 4, the chain's S is the best there; at batch 1
    # the tree still wins and TLV keeps a tree.
    def rms(cfg, b):
        return _h200_round_ms(cfg, b, 3.0 if b > 1 and cfg["kind"] == "tree" else 1.0)

    argv = ["--batches", "1,4", "--gammas", "3", "--tree-grid", "32:3:8", "--systems", "ar,stock,trees,tlv"]
    run, _ = _planted_run(monkeypatch, tmp_path, argv, lambda c: 2.0 if c["kind"] == "chain" else 2.6, rms)
    run.sweep([[1, 2]], 100)
    row = next(r for r in run.out["rows"] if r["case"] == "tune.bs4")
    assert run.selected[1]["trees"]["kind"] == "tree"
    assert (
        run.selected[4]["trees"] == run.selected[4]["stock"] == chain(3) and row["trees_run_chain"] == "chain gamma=3"
    )
    assert run.selected[4]["tlv"]["kind"] == "tree" and run.selected[4]["tlv"]["tlv"]
    assert "fallback_ar" not in row and run.out["selection"]["4"]["trees"] == "chain gamma=3"
    # Each system scored at least two candidates although the batch's share of the budget was short.
    assert sum(r["system"] == "trees" and "skipped" not in r for r in row["by_cost_model"]) >= 2
