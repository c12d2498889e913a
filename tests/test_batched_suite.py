"""The batched suite (suites/batched.py) as a CPU dry run on tiny models: N closed-loop clients against the
server's scheduler for every system, the issue's metrics, partial files, the deadline and per-part errors.
The CPU's timings mean nothing; what is checked is the bookkeeping an H200 run depends on."""

from __future__ import annotations

import json

import pytest
from helpers import stand_in_folders

from sglang_specpilot.harness.bench import run_suite
from sglang_specpilot.suites.batched_results import cell, summarize

V = 12


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny target (a safetensors folder with a synthetic tokenizer) and an EAGLE-3 drafter folder."""
    return stand_in_folders(tmp_path_factory.mktemp("batched"), V)


def _argv(folders, out, *extra):
    return [
        "--target", "smollm2", "--model", str(folders / "target"), "--draft", str(folders / "draft"),
        "--device", "cpu", "--dtype", "float32", "--sets", "synthetic", "--concurrency", "1,2,4",
        "--new-tokens", "6", "--min-requests", "3", "--requests-per-client", "2", "--gamma", "2", "--tree", "4,3,2",
        "--adaptive-depths", "2",
        "--shared-budget", "6", "--prompt-admission", "64", "--max-seq-len", "128", "--results-dir", str(out),
        *extra,
    ]  # fmt: skip


def test_dry_run_on_cpu(folders, tmp_path):
    path = run_suite("batched", _argv(folders, tmp_path))
    doc = json.loads(path.read_text())
    assert path.name == "batched_cpu.json" and doc["suite"] == "batched" and "partial" not in doc
    assert not doc["errors"], doc["errors"]
    cells = {(c["system"], c["concurrency"]): c for c in doc["cells"]}
    systems = ("ar", "stock", "specpilot", "specpilot_batched")
    assert set(cells) == {(s, n) for s in systems for n in (1, 2, 4)}
    for (s, n), c in cells.items():
        assert c["requests"] == max(2 * n, 3) and c["failed"] == 0 and c["tokens"] == 6 * c["requests"]
        assert c["total_tokens_per_s"] > 0 and c["ttft_p50_s"] > 0 and c["itl_p50_s"] > 0
        if s != "ar":
            assert c["same_as_ar"] == 1.0, (s, n)  # greedy and lossless: every request's tokens are AR's
            f = c["forcing"]  # scored by AR's target: every token its argmax
            assert f["accepted"] and f["tokens"] == c["tokens"] and f["large_margin"] == 0, (s, n, f)
    m = doc["metrics"]
    assert m["batched_forcing_all_accepted"] == 1
    for name in ("batched_min_speedup_vs_ar", "batched_min_speedup_vs_stock", "batched_speedup_vs_ar_n1"):
        assert m[name] > 0, name
    # N = 16 was not run: the TTFT metric is missing and said to be.
    assert "batched_ttft_p50_ratio_vs_ar" not in m and any("ttft" in x for x in doc["incomplete"])
    d = cells[("specpilot_batched", 4)]["decisions"]
    assert d["shared_rounds"] > 0 and sum(d["depths"].values()) > 0
    assert "| SpecPilot trees + batched mechanisms | 4 |" in doc["table"]
    from sglang_specpilot.harness.report import render_file

    md = render_file(path)  # `make results`: the metrics, then the suite's own table
    assert "| batched_min_speedup_vs_ar |" in md and md.endswith(doc["table"])
    reqs = [r for r in doc["rows"] if r["case"] == "requests"]
    assert len(reqs) == 12 and all(len(r["requests"]) == max(2 * r["concurrency"], 3) for r in reqs)
    # Where each request's time to first token went: its arrival on the run's clock, the wait for admission and
    # admission to first token (a prompt that rode in a round has no prefill of its own: no stamps).
    for r in (x for row in reqs for x in row["requests"]):
        assert 0 <= r["submit_s"] and 0 < r["ttft_s"], r
        if r["prefill_s"] is not None:
            assert 0 <= r["admit_wait_s"] and 0 < r["prefill_s"] and r["prefill_group"] >= 1, r
            assert r["admit_wait_s"] + r["prefill_s"] <= r["ttft_s"] + 1e-6, r
            assert r["overtook"] is False  # the CPU runs no lookahead: nothing is in flight to overtake
    assert all(x["prefill_s"] is not None for row in reqs if row["system"] == "ar" for x in row["requests"])
    for n in (1, 2, 4):  # the steady requests' parts, summarized per cell
        c = cells[("ar", n)]
        assert 0 < c["prefill_steady_p50_s"] <= c["ttft_steady_p50_s"] and c["admit_wait_steady_p50_s"] >= 0
    with pytest.raises(SystemExit, match="--requests-per-client must be >= 1"):
        run_suite("batched", _argv(folders, tmp_path / "bad", "--requests-per-client", "0"))


def test_deadline_part_errors_and_resume(folders, tmp_path):
    # The batched system's options are invalid (shared_budget 0): its parts fail alone, the others run.
    first = tmp_path / "a"
    path = run_suite("batched", _argv(folders, first, "--concurrency", "1,2", "--shared-budget", "0"))
    doc = json.loads(path.read_text())
    failed = {(e["system"], e["concurrency"]) for e in doc["errors"]}
    assert failed == {("specpilot_batched", 1), ("specpilot_batched", 2)}
    assert {c["system"] for c in doc["cells"]} == {"ar", "stock", "specpilot"}
    # A second call past its deadline at once measures nothing new but carries the first call's cells over.
    path2 = run_suite("batched", _argv(folders, tmp_path / "b", "--concurrency", "1,2", "--deadline-s", "0",
                                       "--resume", str(path)))  # fmt: skip
    doc2 = json.loads(path2.read_text())
    assert len(doc2["skipped"]) == 2  # only the failed system's parts were left to run
    assert [c["carried_from"] for c in doc2["cells"]] == [doc["commit"]] * len(doc["cells"])
    assert doc2["metrics"]["batched_tokens_per_s_ar_n1"] == doc["metrics"]["batched_tokens_per_s_ar_n1"]


def test_two_calls_cover_the_grid(folders, tmp_path):
    a = run_suite("batched", _argv(folders, tmp_path / "a", "--concurrency", "1", "--warm-tokens", "0"))
    assert "batched_min_speedup_vs_ar" in json.loads(a.read_text())["metrics"]  # over N = 1 alone
    b = run_suite("batched", _argv(folders, tmp_path / "b", "--concurrency", "2", "--resume", str(a)))
    doc = json.loads(b.read_text())
    assert {(c["concurrency"], "carried_from" in c) for c in doc["cells"]} == {(1, True), (2, False)}
    m = doc["metrics"]
    per_n = [m[f"batched_tokens_per_s_specpilot_batched_n{n}"] / m[f"batched_tokens_per_s_ar_n{n}"] for n in (1, 2)]
    assert m["batched_min_speedup_vs_ar"] == pytest.approx(min(per_n), abs=2e-3)  # over both calls' N


def test_metrics_need_every_cell_they_cover():
    def rec(i, tokens=4, t=1.0):
        return {"prompt": i, "error": None, "tokens": tokens, "token_ids": [1] * tokens, "ttft_s": 0.1,
                "itl_s": 0.05, "request_s": t}  # fmt: skip

    cells = [cell(s, n, [rec(0)], wall, None) for s, n, wall in
             (("ar", 1, 2.0), ("specpilot_batched", 1, 1.0), ("stock", 1, 1.6), ("ar", 2, 2.0))]  # fmt: skip
    m, missing = summarize(cells, [1, 2])
    assert m["batched_speedup_vs_ar_n1"] == 2.0 and m["batched_tokens_per_s_ar_n1"] == 2.0
    assert "batched_min_speedup_vs_ar" not in m and any("min_speedup_vs_ar" in x for x in missing)  # N = 2
    m, missing = summarize(cells, [1])
    assert m["batched_min_speedup_vs_stock"] == 1.6 and m["batched_min_speedup_vs_ar"] == 2.0


def test_steady_ttft_leaves_out_each_clients_first_request():
    """At N = 2, prompts 0 and 1 are the first wave (every client's first); the steady median is over the rest."""

    def rec(i, ttft):
        return {"prompt": i, "error": None, "tokens": 4, "ttft_s": ttft, "itl_s": 0.01, "request_s": 1.0}

    wave = [rec(0, 0.3), rec(1, 0.3)]
    ar = cell("ar", 16, [rec(i, 0.3) for i in range(16)] + [rec(16 + i, 0.01) for i in range(4)], 1.0, None)
    mech = cell("specpilot_batched", 16, [rec(i, 0.3) for i in range(16)] + [rec(16 + i, 0.02) for i in range(4)],
                1.0, None)  # fmt: skip
    assert ar["ttft_p50_s"] == 0.3 and ar["ttft_steady_p50_s"] == 0.01
    m, _ = summarize([ar, mech], [16])
    assert m["batched_ttft_p50_ratio_vs_ar"] == 1.0 and m["batched_ttft_steady_p50_ratio_vs_ar"] == 2.0
    assert cell("ar", 2, wave + [rec(2, 0.1), rec(3, 0.2)], 1.0, None)["ttft_steady_p50_s"] == pytest.approx(0.15)
    assert cell("ar", 2, wave, 1.0, None)["ttft_steady_p50_s"] is None


def test_forcing_rejects_outputs_that_are_not_ars(folders, tmp_path, monkeypatch):
    """A system whose tokens were not AR's argmax (here: each token shifted by one) fails token forcing."""
    from sglang_specpilot.suites import batched as batched_mod

    real = batched_mod.run_clients

    def corrupt(sched, eng, prompts, n, new_tokens, timeout):
        records, wall = real(sched, eng, prompts, n, new_tokens, timeout)
        if eng.draft is not None and isinstance(new_tokens, list):  # the speculative systems' timed pass
            V = eng.target.cfg.vocab_size
            for r in records:
                r["token_ids"] = [(t + 1) % V for t in r["token_ids"]]
        return records, wall

    monkeypatch.setattr(batched_mod, "run_clients", corrupt)
    argv = _argv(folders, tmp_path, "--concurrency", "1", "--systems", "ar,stock", "--warm-tokens", "0")
    doc = json.loads(run_suite("batched", argv).read_text())
    f = next(c for c in doc["cells"] if c["system"] == "stock")["forcing"]
    assert not f["accepted"] and f["mismatches"] > 0 and f["reasons"]
    worst = f["worst"]  # the largest-margin mismatches, largest first, each with AR's argmax beside it
    assert 0 < len(worst) <= 5 and all(w["token"] != w["argmax"] and w["large"] for w in worst)
    assert [w["token_margin"] for w in worst] == sorted((w["token_margin"] for w in worst), reverse=True)
    assert all(w["ulps"] > 0 and w["top_logit"] is not None for w in worst)  # the margin in rounding steps
    assert "ar_worst" in f  # AR's own largest near-ties, the scale the system's are read against
    assert doc["metrics"]["batched_forcing_all_accepted"] == 0
    assert doc["metrics"]["batched_forcing_rejected_stock_n1"] == 1
    from sglang_specpilot.harness.headline import _batched_forcing

    assert _batched_forcing(doc["metrics"]) == "; token forcing REJECTED N = 1"  # the README headline says which
    assert _batched_forcing({"batched_forcing_all_accepted": 1}) == _batched_forcing({}) == ""


def test_plot_draws_measured_cells_only(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "plot_batched.py"
    spec = importlib.util.spec_from_file_location("plot_batched", path)
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    cells = [
        {"system": s, "concurrency": n, "total_tokens_per_s": v}
        for s, n, v in [("ar", 1, 100.0), ("ar", 4, 300.0), ("ar", 16, 900.0), ("specpilot_batched", 1, 200.0),
                        ("specpilot_batched", 4, None), ("specpilot_batched", 16, 1000.0)]
    ]  # fmt: skip
    out = plot.svg({"gpu": "G", "model": {"label": "m"}, "cells": cells})
    assert out.count("<polyline") == 1  # AR's line; the mechanisms' line has a gap at N = 4: two lone points
    assert out.count("<circle") == 5
    assert "SpecPilot trees + batched mechanisms" in out
    with pytest.raises(SystemExit):
        plot.svg({"cells": []})


def test_merge_batched_takes_each_n_from_one_file(tmp_path):
    """``benchmarks/merge_batched.py``: each N's cells come from the one input that names it, the metrics are
    recomputed over the merged grid, every cell names the commit its call carried, and an N two inputs give
    is refused."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "merge_batched", Path(__file__).parents[1] / "benchmarks" / "merge_batched.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def doc(commit, tps):  # tps: {(system, n): tokens/s}
        cells = [
            cell(s, n, [{"tokens": 10, "ttft_s": 0.1, "itl_s": 0.01, "request_s": 1.0, "error": None}], 10 / t, None)
            for (s, n), t in tps.items()
        ]
        rows = [{"case": "requests", "system": s, "concurrency": n, "requests": []} for s, n in tps]
        return {"suite": "batched", "commit": commit, "date": commit, "command": commit, "gpu": "g", "cells": cells,
                "rows": rows, "metrics": {"stale": 1}}  # fmt: skip

    a = doc("c0", {("ar", 1): 100.0, ("stock", 1): 150.0, ("specpilot_batched", 1): 210.0, ("ar", 4): 1.0})
    b = doc("c0", {("ar", 4): 300.0, ("stock", 4): 390.0, ("specpilot_batched", 4): 360.0, ("ar", 1): 1.0})
    out = mod.merge([(a, [1], "c1"), (b, [4], "c2")])
    m = out["metrics"]
    assert "stale" not in m and m["batched_speedup_vs_ar_n1"] == 2.1 and m["batched_min_speedup_vs_ar"] == 1.2
    assert m["batched_min_speedup_vs_stock"] == round(360 / 390, 3) and m["batched_min_speedup_vs_stock_at_n"] == 4
    assert {(c["system"], c["concurrency"], c["measured_at"]) for c in out["cells"]} == {
        ("ar", 1, "c1"), ("stock", 1, "c1"), ("specpilot_batched", 1, "c1"),
        ("ar", 4, "c2"), ("stock", 4, "c2"), ("specpilot_batched", 4, "c2"),
    }  # fmt: skip
    assert out["commit"] == "c1,c2" and out["metric_commits"]["batched_tokens_per_s_ar_n4"] == "c2"
    assert [r["concurrency"] for r in out["runs"]] == [[1], [4]] and out["runs"][0]["device_git_recorded"] == "c0"
    # Dirty as the device saw it against its recorded commit; clean where the carried commit was named.
    a["dirty"] = b["dirty"] = True
    assert mod.merge([(a, [1], "c1"), (b, [4], "c2")])["dirty"] is False
    assert mod.merge([(a, [1], "c1"), (b, [4], "c0")])["dirty"] is True
    with pytest.raises(SystemExit, match="N = 1"):
        mod.merge([(a, [1], "c1"), (b, [1, 4], "c2")])


def test_request_lengths_are_drawn_once_per_request():
    """``--new-tokens LO-HI``: each request's count drawn from a seeded generator, so request i generates as
    many tokens in every system and every run; "N" gives N to all; a malformed range is refused in one line."""
    from sglang_specpilot.suites.batched import request_lengths

    got = request_lengths("128-256", 64)
    assert got == request_lengths("128-256", 64) and all(128 <= n <= 256 for n in got)
    assert len(set(got)) > 16  # varied: the clients' requests do not end in the same round
    assert request_lengths("128", 5) == [128] * 5
    for bad in ("x", "256-128", "0-4"):
        with pytest.raises(SystemExit, match="new-tokens"):
            request_lengths(bad, 3)


def test_ttft_parts_probe_splits_steady_requests_by_arrival():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "probes" / "ttft_parts.py"
    spec = importlib.util.spec_from_file_location("ttft_parts", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def req(prompt, submit, ttft, wait, prefill, group=1):
        return {"prompt": prompt, "error": None, "submit_s": submit, "ttft_s": ttft, "admit_wait_s": wait,
                "prefill_s": prefill, "prefill_group": group, "overtook": True}  # fmt: skip

    reqs = [req(0, 0.0, 0.2, 0.0, 0.19), req(1, 0.0, 0.2, 0.0, 0.19)]  # the first wave: left out
    reqs += [req(2, 0.5, 0.020, 0.001, 0.018), req(3, 0.5015, 0.034, 0.014, 0.019)]  # together
    reqs += [req(4, 0.9, 0.016, 0.0005, 0.015, group=2)]  # alone
    rep = mod.parts(reqs, 2, 0.002)
    assert rep["steady"] == 3 and rep["together"]["requests"] == 2 and rep["alone"]["requests"] == 1
    assert rep["together"]["admit_wait_p50_ms"] == 7.5 and rep["alone"]["shared_prefill"] == 1
    assert rep["all"]["rest_p50_ms"] == 1.0 and rep["sorted_ttft_ms"] == [16.0, 20.0, 34.0]
