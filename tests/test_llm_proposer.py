"""The LLM proposer through the real anthropic client against a local Messages-API stand-in."""

from __future__ import annotations

import json

import pytest

anthropic = pytest.importorskip("anthropic", reason="the agent extra (anthropic) is not installed")

from messages_standin import MessagesStandIn, text_answer, tool_answer  # noqa: E402
from tune_helpers import PlantedBackend, tune_prompts  # noqa: E402

from sglang_specpilot.controller.llm_proposer import LLMProposer  # noqa: E402
from sglang_specpilot.controller.option_space import legal_edits  # noqa: E402
from sglang_specpilot.controller.tune_loop import TuneConfig, Tuner  # noqa: E402

CFG = TuneConfig(rounds=2, candidates=2, blocks=20, screen_blocks=20, kinds=("gamma",))


def _ctx():
    prof = {"categories_ms": {"gemm": 1.0}, "step_ms": 2.0, "ar_ms": 1.0, "tau": 1.5, "tau_best": 2.0}
    ceil = {"factors": {"trees": 1.3, "kernels": None, "outside": 1.1}, "largest": "trees", "unavailable": ["kernels"]}
    return {"round": 0, "profile": prof, "ceiling": ceil, "history": [], "best": {}}


def test_malformed_and_illegal_answers_are_refused_with_codes():
    edits = legal_edits(PlantedBackend().stock, {})
    answers = [
        tool_answer(["gamma=8", "gamma=99", "gamma=8", "tree=1/1/1"]),
        text_answer('{"edits": ["gamma=8"'),
        tool_answer("gamma=8"),
        text_answer('{"edits": ["gamma=2", "gamma=3", "gamma=5"]}'),
    ]
    with MessagesStandIn(answers) as srv:
        llm = LLMProposer(model="standin", base_url=srv.url, api_key="test-key")
        a = llm.propose(_ctx(), edits, 2)
        b = llm.propose(_ctx(), edits, 2)
        c = llm.propose(_ctx(), edits, 2)
        d = llm.propose(_ctx(), edits, 2)
        e = llm.propose(_ctx(), edits, 2)  # the stand-in has no answer left: HTTP 500
    assert a["accepted"] == ["gamma=8"]
    assert [f["code"] for f in a["feedback"]] == ["illegal_edit", "duplicate_edit", "illegal_edit"]
    assert b["accepted"] == [] and b["feedback"][0]["code"] == "malformed_json"
    assert c["accepted"] == [] and c["feedback"][0]["code"] == "schema_violation"
    assert d["accepted"] == ["gamma=2", "gamma=3"] and d["feedback"] == [{"code": "too_many", "edit": "gamma=5"}]
    assert e["feedback"][0]["code"] == "api_error"
    req = srv.requests[0]
    assert req["path"] == "/v1/messages"
    body = req["body"]
    assert body["tool_choice"] == {"type": "tool", "name": "propose_edits"} and body["tools"][0]["input_schema"]
    sent = json.loads(body["messages"][0]["content"])
    assert {x["id"] for x in sent["legal_edits"]} == {x.id for x in edits}
    assert sent["ceiling"]["largest"] == "trees" and "profile_ms_per_round" in sent


def test_loop_with_llm_shows_feedback_next_round_and_works_without_key(tmp_path):
    answers = [tool_answer(["gamma=8", "not-an-edit"]), tool_answer(["gamma=2"])]
    with MessagesStandIn(answers) as srv:
        llm = LLMProposer(model="standin", base_url=srv.url, api_key="test-key")
        res = Tuner(PlantedBackend(), tune_prompts(3), tune_prompts(3, seed=7), tmp_path / "a", CFG, llm=llm).run()
    assert res["rounds"][0]["llm"]["accepted"] == ["gamma=8"] and res["rounds"][0]["promoted"] == "gamma=8"
    second = json.loads(srv.requests[1]["body"]["messages"][0]["content"])
    assert {"code": "illegal_edit", "edit": "not-an-edit"} in second["your_past_feedback"]
    assert any(h["id"] == "gamma=8" and h["promoted"] for h in second["history"])
    # No key: the LLM is skipped with a code and the built-in proposer alone finds the same mechanism.
    nokey = LLMProposer(model="standin", api_key="")
    nokey.api_key = None
    cfg = TuneConfig(rounds=2, candidates=8, blocks=20, screen_blocks=20, kinds=("gamma",))
    res2 = Tuner(PlantedBackend(), tune_prompts(3), tune_prompts(3, seed=7), tmp_path / "b", cfg, llm=nokey).run()
    assert res2["rounds"][0]["llm"]["feedback"] == [{"code": "no_api_key"}]
    assert res2["best"] == {"num_speculative_tokens": 8}
