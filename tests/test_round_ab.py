"""benchmarks/probes/round_ab.py: each variant's environment reaches its own process, runs alternate, medians
are over the runs, and a failed run is recorded instead of sinking the A/B."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("round_ab", Path(__file__).parents[1] / "benchmarks/probes/round_ab.py")
round_ab = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(round_ab)

# A stand-in for round_profile.py: a round time read from the environment, the call order appended to a log.
FAKE = """
import argparse, json, os, sys
p = argparse.ArgumentParser(); p.add_argument("--systems"); p.add_argument("--out"); p.add_argument("--extra")
a = p.parse_args()
open(os.environ["LOG"], "a").write(os.environ["WHO"] + "\\n")
if os.environ["WHO"] == "broken":
    sys.exit("no GPU")
ms = float(os.environ["MS"]) + len(open(os.environ["LOG"]).read().split()) * 1e-3
row = {"round_ms_median": ms, "kernels": 7, "kernel_us": 1.0, "by_category_us": {}, "round_ms": [ms]}
json.dump({"systems": {s: row for s in a.systems.split(",")}}, open(a.out, "w"))
print("done", a.extra)
"""


def test_variants_alternate_in_their_own_environment(tmp_path, monkeypatch):
    fake = tmp_path / "fake_profile.py"
    fake.write_text(FAKE)
    monkeypatch.setattr(round_ab, "PROFILE", fake)
    log = tmp_path / "log"
    monkeypatch.setenv("LOG", str(log))
    out = tmp_path / "ab.json"
    round_ab.main(["--variant", "a:WHO=a,MS=1", "--variant", "b:WHO=b,MS=2", "--variant", "broken:WHO=broken,MS=0",
                   "--systems", "ar,tree", "--reps", "2", "--out", str(out), "--", "--extra", "x"])  # fmt: skip
    assert log.read_text().split() == ["a", "b", "broken"] * 2
    doc = json.loads(out.read_text())
    assert doc["variants"]["a"] == {"WHO": "a", "MS": "1"}
    assert doc["median_round_ms"]["a"]["tree"] == pytest.approx(1 + (1 + 4) / 2 * 1e-3)
    assert doc["median_round_ms"]["b"]["ar"] == pytest.approx(2 + (2 + 5) / 2 * 1e-3)
    assert "broken" not in doc["runs"] and [f["rep"] for f in doc["failures"]] == [0, 1]
    assert "no GPU" in doc["failures"][0]["tail"]


def test_a_variant_needs_a_name_and_a_setting():
    assert round_ab.parse_variant("on:X=1,Y=2") == ("on", {"X": "1", "Y": "2"})
    # A value may hold commas: only ",VAR=" starts the next setting.
    tuning = "tree_d64=64,64,128,4,3,0.5,8,2"
    assert round_ab.parse_variant(f"b128:SPECPILOT_ATTENTION_TUNING={tuning},X=1") == (
        "b128",
        {"SPECPILOT_ATTENTION_TUNING": tuning, "X": "1"},
    )
    for bad in ("on", ":X=1", "on:"):
        with pytest.raises(Exception, match="variant"):
            round_ab.parse_variant(bad)
