"""``specpilot tune``'s refusals and ``--profile DIR`` for generate / serve."""

from __future__ import annotations

import json

import pytest

from sglang_specpilot.cli import build_parser, engine_options, main, serve_options, with_profile


def _profile(tmp_path, delta):
    (tmp_path / "profile.json").write_text(
        json.dumps({"format": "specpilot-profile/1", "deployment": {"model": None}, "delta": delta})
    )
    return str(tmp_path)


def test_generate_and_serve_run_the_profile(tmp_path):
    d = _profile(tmp_path, {"num_speculative_tokens": 6})
    g = build_parser().parse_args(["generate", "--prompt", "x", "--device", "cpu", "--profile", d])
    assert with_profile(engine_options(g), g).num_speculative_tokens == 6
    s = build_parser().parse_args(["serve", "--device", "cpu", "--profile", d])
    assert serve_options(s).num_speculative_tokens == 6 and serve_options(s).max_batch_size == 8


def test_tune_refuses_mtbench_overlap_and_short_runs(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert main(["tune", "--out", out, "--prompts", "mtbench"]) == 2
    assert "evaluation set" in capsys.readouterr().err
    assert main(["tune", "--out", out, "--prompts", "humaneval:0-9", "--final-prompts", "humaneval:0-9"]) == 2
    assert "unseen prompts" in capsys.readouterr().err
    assert main(["tune", "--out", out, "--blocks", "10"]) == 2
    assert ">= 20" in capsys.readouterr().err


def test_missing_profile_is_one_line(tmp_path, capsys):
    assert main(["generate", "--prompt", "x", "--device", "cpu", "--profile", str(tmp_path)]) == 2
    assert "no tuned profile" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not a specpilot profile"):
        (tmp_path / "profile.json").write_text("{}")
        from sglang_specpilot.controller.tune_profile import read

        read(tmp_path)
