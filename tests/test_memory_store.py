"""Memory entries: written from a tuned run, reproduced by hash, refused when tampered, reused elsewhere."""

from __future__ import annotations

import json

from tune_helpers import PlantedBackend, tune_prompts

from memory_store import RefusedEntry, Store, make_entry
from sglang_specpilot.controller.memory_cli import main as memory_main
from sglang_specpilot.controller.tune_loop import TuneConfig, Tuner
from sglang_specpilot.controller.tune_memory import remember, seeds, stock_dict
from sglang_specpilot.controller.tune_profile import write

CFG = TuneConfig(rounds=2, candidates=8, blocks=20, screen_blocks=20, kinds=("gamma",))


def _tuned(tmp_path, mem):
    b = PlantedBackend()
    res = Tuner(b, tune_prompts(3), tune_prompts(3, seed=7), tmp_path / "run", CFG).run()
    doc = write(tmp_path / "run", res, b.describe(), b.stock)
    return b, remember(mem, res, doc, b.stock)


def test_entry_reproduces_and_tamper_is_refused(tmp_path, capsys):
    mem = tmp_path / "mem"
    b, paths = _tuned(tmp_path, mem)
    assert len(paths) == 1
    entry = json.loads(paths[0].read_text())
    assert entry["delta"] == {"num_speculative_tokens": 8} and entry["requires"] == []
    sd = stock_dict(b.stock)
    assert Store(mem).get("gamma=8", sd)["id"] == entry["id"]
    assert memory_main(["--memory", str(mem), "verify"]) == 0
    assert memory_main(["--memory", str(mem), "apply", "gamma=8", "--out", str(tmp_path / "p")]) == 0
    assert json.loads((tmp_path / "p" / "profile.json").read_text())["delta"] == {"num_speculative_tokens": 8}
    # Tampered: a changed delta no longer matches the entry's id.
    bad = dict(entry, delta={"num_speculative_tokens": 6})
    paths[0].write_text(json.dumps(bad))
    assert memory_main(["--memory", str(mem), "verify"]) == 1
    assert "REFUSED" in capsys.readouterr().out
    assert seeds(mem, b.stock) == []  # a refused entry is never reused
    try:
        Store(mem).get("gamma=8", sd)
        raise AssertionError("tampered entry accepted")
    except RefusedEntry as e:
        assert "does not match its id" in str(e)


def test_reproduce_rule_refuses_an_entry_whose_source_differs(tmp_path):
    sd = stock_dict(PlantedBackend().stock)
    e = make_entry("x", {"num_speculative_tokens": 8}, [], sd, "c", {"stock_options": sd})
    other = dict(sd, max_seq_len=128)  # another stock: the same delta gives another system
    try:
        Store(tmp_path).add(e, other)
        raise AssertionError("entry kept though it does not reproduce")
    except RefusedEntry as err:
        assert "reproduce" in str(err)


def test_new_deployment_starts_from_memory(tmp_path):
    mem = tmp_path / "mem"
    _tuned(tmp_path, mem)
    b2 = PlantedBackend(seed=3)
    s = seeds(mem, b2.stock)
    assert s == [("gamma=8", {"num_speculative_tokens": 8})]
    cfg = TuneConfig(rounds=2, candidates=1, blocks=20, screen_blocks=20, kinds=("gamma",))
    res = Tuner(b2, tune_prompts(3), tune_prompts(3, seed=7), tmp_path / "run2", cfg, seeds=s).run()
    assert res["rounds"][0]["promoted"] == "memory:gamma=8"  # re-timed and promoted under the same gates
    assert res["best"] == {"num_speculative_tokens": 8}
