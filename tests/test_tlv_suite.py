"""The tlv suite (suites/tlv.py): a dry run of the whole suite on the CPU with tiny models.

The CPU run's timings mean nothing; what it checks is the bookkeeping an H200 run depends on: both
targets load with their drafter and W12 twin, the two engines run interleaved on the same prompts with
the same text, AR's text and the token-forcing verdicts, the steps and the replay land in the rows, the
issue's four metrics are named per target, a failing target or forcing step is recorded while the rest
runs, and steps past the deadline are skipped and listed.
"""

from __future__ import annotations

import json

import pytest
from helpers import stand_in_folders

from sglang_specpilot.harness.bench import run_suite
from sglang_specpilot.suites.tlv import suffix

V = 12
METRICS = (
    "tlv_tokens_per_exact_pass_ratio",
    "tlv_e2e_speedup_vs_trees_w12_bs1",
    "tlv_q_pass_over_exact_pass",
    "tlv_q_chain_agreement",
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny target (a safetensors folder with a synthetic tokenizer) and an EAGLE-3 drafter folder."""
    return stand_in_folders(tmp_path_factory.mktemp("tlv"), V, perturb=0.2)


def _argv(folders, out, *extra):
    return [
        "--model", str(folders / "target"), "--draft", str(folders / "draft"), "--device", "cpu",
        "--sets", "synthetic", "--warm-prompts", "synthetic:1", "--prompts-per-set", "2", "--new-tokens", "8",
        "--tree", "6,3,2", "--chain-len", "2", "--replay-prompts", "1", "--step-iters", "2",
        "--max-seq-len", "128", "--lift-layers", "4", "--results-dir", str(out), *extra,
    ]  # fmt: skip


def test_dry_run_on_cpu(folders, tmp_path):
    # "tiny": the lift path (the 8B stand-in's), cut to 4 layers; "smollm2": the real model's path (no
    # lift), here on the tiny folder. A bogus target first: its failure is recorded, the others run.
    path = run_suite("tlv", _argv(folders, tmp_path, "--targets", "bogus,tiny,smollm2"))
    doc = json.loads(path.read_text())
    assert path.name == "tlv_cpu.json" and doc["suite"] == "tlv" and doc["gpu"] == "cpu" and "partial" not in doc
    assert [(e["step"], e["target"]) for e in doc["errors"]] == [("load", "bogus")], doc["errors"]
    m = doc["metrics"]
    for target in ("tiny", "smollm2"):
        s = suffix(target)
        for name in METRICS:
            assert m[name + s] > 0, name + s
        assert m[f"tlv_mismatched_prompts_vs_trees{s}"] == 0  # lossless: TLV's text is the trees' text
        # The CPU decodes exactly: AR's text too, and forcing finds no mismatch in any of the three.
        assert m[f"tlv_mismatched_prompts_vs_ar{s}"] == 0
        assert m[f"tlv_forcing_accepted{s}"] == m[f"trees_w12_forcing_accepted{s}"] == 1
        assert 0 < m[f"tlv_q_chain_agreement{s}"] <= 1
        rows = doc["targets"][target]["rows"]
        assert {r["case"] for r in rows} == {"setup", "timed", "forcing", "steps", "replay"}
        forcing = next(r for r in rows if r["case"] == "forcing")
        assert forcing["prompts"] == 2 and forcing["ar"]["tokens"] == 16 and forcing["ar"]["mismatches"] == 0
        for name in ("tlv", "trees_w12"):
            f = forcing[name]
            assert f["report"]["tokens"] == 16 and f["report"]["large_margin"] == 0 and f["verdict"]["accepted"]
            assert f["mismatched_prompts_vs_ar"] == 0
        timed = [r for r in rows if r["case"] == "timed"]
        assert {r["system"] for r in timed} == {"tlv", "trees_w12"}
        assert all(len(r["wall_s"]) == 2 and r["tokens"] == [[8], [8]] for r in timed)  # per prompt, per row
        steps = next(r for r in rows if r["case"] == "steps")
        assert len(steps["q_step_ms"]) == len(steps["exact_step_ms"]) == 2 and set(steps["round_ms"]) == {
            "tlv",
            "trees_w12",
        }
        replay = next(r for r in rows if r["case"] == "replay")
        assert replay["tlv_budget"] == 6 and replay["tlv_hang_budget"] == 4
    assert doc["targets"]["tiny"]["model"]["lifted"] and not doc["targets"]["smollm2"]["model"]["lifted"]
    assert doc["config"]["exact_pass_nodes"] == 6 and doc["config"]["tlv"]["tlv_hang_budget"] == 4
    assert suffix("llama-3.1-8b") == ""  # the 8B stand-in's metrics carry the names


def test_past_the_deadline_steps_are_skipped_and_listed(folders, tmp_path):
    doc = json.loads(
        run_suite("tlv", _argv(folders, tmp_path, "--targets", "smollm2", "--deadline-s", "0")).read_text()
    )
    assert [s["part"] for s in doc["skipped"]] == ["smollm2.load"] and doc["metrics"] == {}


def test_a_failing_tlv_engine_is_recorded_and_the_replay_still_runs(folders, tmp_path, monkeypatch):
    from sglang_specpilot.engine.tlv_round import TLVRound

    def broken(self, *a, **k):
        raise RuntimeError("Q pass broken")

    monkeypatch.setattr(TLVRound, "q_pass", broken)
    doc = json.loads(run_suite("tlv", _argv(folders, tmp_path, "--targets", "smollm2")).read_text())
    assert [e["step"] for e in doc["errors"]] == ["engines", "timed", "forcing", "steps"]
    assert "Q pass broken" in doc["errors"][0]["error"] and "no tlv engine" in doc["errors"][1]["error"]
    m = doc["metrics"]
    assert "tlv_e2e_speedup_vs_trees_w12_bs1_smollm2" not in m and 0 < m["tlv_q_chain_agreement_smollm2"] <= 1


def test_a_failing_forcing_step_is_recorded_and_the_run_goes_on(folders, tmp_path, monkeypatch):
    from sglang_specpilot.engine import Engine

    def broken(self, *a, **k):
        raise RuntimeError("teacher forcing broken")

    monkeypatch.setattr(Engine, "teacher_force_logits", broken)
    doc = json.loads(run_suite("tlv", _argv(folders, tmp_path, "--targets", "smollm2")).read_text())
    assert [(e["step"], e["target"]) for e in doc["errors"]] == [("forcing", "smollm2")]
    assert "teacher forcing broken" in doc["errors"][0]["error"] and "partial" not in doc
    m = doc["metrics"]
    assert not any("forcing" in k or k.endswith("vs_ar_smollm2") for k in m)
    assert m["tlv_mismatched_prompts_vs_trees_smollm2"] == 0 and m["tlv_q_pass_over_exact_pass_smollm2"] > 0
    assert 0 < m["tlv_q_chain_agreement_smollm2"] <= 1  # the steps and the replay after it still ran
