"""The tuning loop on tiny models with planted mechanisms (tests/tune_helpers.py)."""

from __future__ import annotations

import json

import pytest
from tune_helpers import PlantedBackend, tune_prompts

from sglang_specpilot.controller.tune_loop import TuneConfig, Tuner

CFG = TuneConfig(rounds=3, candidates=8, blocks=20, screen_blocks=20, kinds=("gamma",))


def _tune(out, backend=None, cfg=CFG):
    b = backend or PlantedBackend()
    return Tuner(b, tune_prompts(3), tune_prompts(3, seed=7), out, cfg).run()


def test_planted_gain_promoted_small_gain_and_shortcut_rejected(tmp_path):
    res = _tune(tmp_path)
    r0 = res["rounds"][0]
    assert r0["promoted"] == "gamma=8"
    by_id = {h["id"]: h for h in res["history"] if h["round"] == 0}
    assert by_id["gamma=2"]["promoted"] is False and "below_gate" in by_id["gamma=2"]["feedback"]
    shortcut = by_id["gamma=6"]
    assert shortcut["timing"]["gain"] > 0.3  # faster by far ...
    assert shortcut["promoted"] is False and shortcut["feedback"] == ["forcing_rejected"]  # ... but not lossless
    assert res["best"] == {"num_speculative_tokens": 8}
    assert res["final"]["confirmed"] and res["final"]["timing"]["gain"] > 0.25
    assert res["rounds"][-1]["promoted"] is None  # the next round found nothing better: converged
    assert r0["ceiling"]["unavailable"] == ["kernels"]  # CPU: no floors, said so
    assert json.loads((tmp_path / "state.json").read_text())["records"]


def test_resume_after_kill(tmp_path):
    full = _tune(tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        _tune(tmp_path / "killed", PlantedBackend(fail_after=4))
    res = _tune(tmp_path / "killed")
    assert res["resumed_measurements"] > 0
    assert res["measured_now"] < full["measured_now"]
    assert res["best"] == full["best"] and [r["promoted"] for r in res["rounds"]] == [
        r["promoted"] for r in full["rounds"]
    ]


def test_other_settings_refuse_the_folder(tmp_path):
    _tune(tmp_path, cfg=TuneConfig(rounds=1, blocks=20, screen_blocks=20, kinds=("gamma",)))
    with pytest.raises(ValueError, match="other settings"):
        _tune(tmp_path, cfg=TuneConfig(rounds=2, blocks=20, screen_blocks=20, kinds=("gamma",)))


def test_noise_counts_a_second_build_of_stock():
    # The noise a gate subtracts compares stock with a second build of stock (replica_runner): an engine
    # timed against itself would hide what differs between two builds of one configuration.
    from sglang_specpilot.controller.judge import measure_noise

    same = measure_noise(PlantedBackend(replica_factor=1.0), {}, tune_prompts(), blocks=8)
    apart = measure_noise(PlantedBackend(replica_factor=1.3), {}, tune_prompts(), blocks=8)
    assert same < 0.05 and apart > 0.2, (same, apart)


def test_replica_engine_is_a_separate_build():
    b = PlantedBackend()
    eng, rep = b.engine({}), b.replica_engine({})
    assert rep is not eng and b.replica_engine({}) is rep and b.engine({}) is eng
    assert rep.options == eng.options
    # The replica is out of the LRU: building it evicts no candidate's engine.
    assert len(b._engines) == 1


def test_backend_logs_each_timed_generation():
    # The real runner (not the planted clock): each call records its prompt, rounds, TTFT and time.
    from sglang_specpilot.controller.tune_backend import EngineBackend

    b = PlantedBackend()
    run = EngineBackend.runner(b, {}, tune_prompts(2))
    run(), run(), run()
    (rows,) = b.gen_log.values()
    assert [r["prompt"] for r in rows] == [0, 1, 0]
    assert all(r["rounds"] >= 1 and r["tokens"] == b.new_tokens and 0 < r["ttft_ms"] <= r["ms"] for r in rows)
    (summary,) = b.gen_summary().values()
    assert summary["n"] == 3 and summary["ms_per_round"] > 0
