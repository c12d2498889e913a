"""The EAGLE-3 trainer (drafters/train_eagle3.py): its TTT steps are the engine's inference path, packing
keeps sequences apart, a short run learns, and the CLI refuses evaluation sets."""

import json

import pytest
import torch
from helpers import WordTokenizer, prompts, tiny_model
from safetensors.torch import load_file

from sglang_specpilot import cli
from sglang_specpilot.config import EngineOptions
from sglang_specpilot.drafters.eagle3 import continue_eagle3, init_eagle3, is_eagle3, load_eagle3
from sglang_specpilot.drafters.train_eagle3 import (
    Sequence,
    chain_tau,
    draft_vocabulary,
    make_batch,
    pack,
    parse_answers,
    target_pass,
    train_eagle3,
    ttt_forward,
    ttt_mask,
)
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.attn_meta import causal_tree
from sglang_specpilot.engine.runner import ModelRunner

TIGHT = {"rtol": 1e-10, "atol": 1e-10}


def _fp64_pair(name="tiny-llama", seed=0):
    """A float64 target and a drafter moved off its warm start (so every part of it matters)."""
    target = tiny_model(name, dtype=torch.float64)
    torch.manual_seed(seed)
    draft = init_eagle3(target)
    with torch.no_grad():
        for n, p in draft.named_parameters():
            if not n.startswith("embed."):
                p.add_(torch.randn_like(p) * 0.2)
    return target, draft


def _runner(model):
    return ModelRunner(model, 1, 256, cuda_graphs=False, scratch_slots=64)


def _true_features(target, draft, seq):
    """The target's features over ``seq`` [1, S] from the engine's eager prefill path."""
    anc, depth = causal_tree(seq.shape[1])
    _, feats = _runner(target).step(seq, torch.zeros(1, dtype=torch.long), anc, depth, eager=True,
                                    feature_layers=draft.feature_layers)  # fmt: skip
    return feats


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])  # GQA (2 query heads per KV head); qk-norm
@torch.inference_mode()
def test_step0_equals_the_prefill_path(name):
    target, draft = _fp64_pair(name)
    seq = torch.tensor(prompts([23], target.cfg.vocab_size, seed=3))
    feats = _true_features(target, draft, seq)
    # Engine._prefill_eagle: the drafter's chunk reads the features one position earlier, zeros at 0.
    g = draft.project(torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], 1))
    anc, depth = causal_tree(seq.shape[1])
    want = _runner(draft).step(seq, torch.zeros(1, dtype=torch.long), anc, depth, eager=True, g=g)
    (got,) = ttt_forward(draft, seq, feats, 1)
    torch.testing.assert_close(got, want, **TIGHT)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
@torch.inference_mode()
def test_step_k_equals_a_chain_at_inference(name):
    # A chain as draft_tree.expand_lattice grows it with top_k 1: the prefix up to the root r with true
    # features (the depth-0 window), then node d (token x_{r+d}, teacher-forced) at slot and position
    # r + d with its parent's h as g, seeing the prefix and its ancestors. Its h is TTT step d at r + d.
    target, draft = _fp64_pair(name, seed=1)
    S, depth = 20, 5
    seq = torch.tensor(prompts([S], target.cfg.vocab_size, seed=4))
    feats = _true_features(target, draft, seq)
    hs = ttt_forward(draft, seq, feats, depth + 1)
    g_true = draft.project(torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], 1))
    for r in (0, 6, S - 1 - depth):
        run = _runner(draft)
        anc, dep = causal_tree(r + 1)
        h = run.step(seq[:, : r + 1], torch.zeros(1, dtype=torch.long), anc, dep, eager=True, g=g_true[:, : r + 1])
        torch.testing.assert_close(h[:, r], hs[0][:, r], **TIGHT)
        parent = h[:, r : r + 1]
        for d in range(1, depth + 1):
            at = torch.tensor([[r + d]])
            window = torch.ones(1, 1, d, dtype=torch.bool)  # slots r+1 .. r+d: ancestors and the node itself
            parent = run.forward(seq[:, r + d : r + d + 1], at, at, torch.tensor([r + 1]), window, g=parent)
            torch.testing.assert_close(parent[:, 0], hs[d][:, r + d], **TIGHT, msg=f"root {r} depth {d}")


@torch.inference_mode()
def test_packed_rows_equal_sequences_alone():
    # Two sequences in one row (block-diagonal masks, positions from 0 each) give each one's own target
    # features and TTT states: nothing crosses a sequence boundary, at any step.
    target, draft = _fp64_pair()
    a, b = prompts([9, 13], target.cfg.vocab_size, seed=5)
    packed = make_batch([[Sequence(tuple(a), 3, 0, "greedy"), Sequence(tuple(b), 4, 1, "greedy")]])
    logits, feats = target_pass(target, packed, draft.feature_layers)
    hs = ttt_forward(draft, packed.tokens, feats, 4, packed.positions, packed.segments)
    assert packed.tokens.shape[1] == 32  # 22 tokens rounded up to 16; the tail is padding
    assert packed.answer[0].nonzero()[:, 0].tolist() == [*range(2, 8), *range(9 + 3, 9 + 12)]
    at = 0
    for ids in (a, b):
        seq = torch.tensor([ids])
        alone_feats = _true_features(target, draft, seq)
        sl = slice(at, at + len(ids))
        torch.testing.assert_close(feats[:, sl], alone_feats, **TIGHT)
        for k, h in enumerate(ttt_forward(draft, seq, alone_feats, 4)):
            torch.testing.assert_close(hs[k][:, sl][:, k:], h[:, k:], **TIGHT)  # positions with a chain behind
        at += len(ids)


def test_mask_vocabulary_packing_and_answers():
    seg = torch.zeros(1, 5, dtype=torch.long)
    m = ttt_mask(seg, 2)[0].int()
    # Query 4 at step 2: step-0 keys 0..2, step-1 key 3, step-2 key 4 (itself).
    assert m[4].tolist() == [1, 1, 1, 0, 0] + [0, 0, 0, 1, 0] + [0, 0, 0, 0, 1]
    assert (m.sum(-1) >= 1).all()
    seqs = [Sequence((5, 5, 7, 2), 1, 0, "greedy"), Sequence((7, 9, 2), 1, 1, "sampled")]
    # counts: 7 and 5 and 2 twice, 9 once; ties by id (2 before 5 before 7), then unseen ids by id.
    assert draft_vocabulary(seqs, 12, 4).tolist() == [2, 5, 7, 9]
    assert draft_vocabulary(seqs, 12, 5).tolist() == [0, 2, 5, 7, 9]
    assert draft_vocabulary([Sequence((2, 2, 1), 1, 0, "greedy")], 3, 32000).tolist() == [0, 1, 2]  # V < 32000
    many = [Sequence(tuple(range(n)), 1, i, "greedy") for i, n in enumerate([7, 3, 5, 2, 6, 9, 4])]
    rows = pack(many, 8)
    assert sorted(s.prompt_index for r in rows for s in r) == list(range(7))
    assert all(sum(len(s.ids) for s in r) <= 8 for r in rows) and len(rows) == 5
    assert max(len(s.ids) for r in rows for s in r) == 8  # the 9-token sequence is cut to max_len
    assert pack([Sequence((1, 2, 3), 3, 0, "greedy")], 8) == []  # no answer token: dropped
    assert parse_answers("sampled, greedy") == ("sampled", "greedy")
    with pytest.raises(ValueError, match="--answers"):
        parse_answers("greedy,beam")
    assert chain_tau([1.0, 1.0]) == 3.0 and chain_tau([0.5, 0.5]) == 1.75


def _ar(target, max_batch=6):
    opts = EngineOptions(max_seq_len=256, max_batch_size=max_batch, device="cpu", dtype="float32")
    return Engine(target, WordTokenizer(), opts)


def test_short_training_learns_and_the_folder_drives_the_engine(tmp_path):
    target = tiny_model("tiny-llama")
    ar = _ar(target)
    ps = prompts([5, 8, 6, 7, 9, 4], target.cfg.vocab_size, seed=1)
    summary = train_eagle3(
        ar, ps, tmp_path / "d", new_tokens=40, chat=False, steps=120, batch=4, lr=1e-2, max_len=128, ttt_steps=3,
        draft_vocab=256, eval_frac=0.0, progress=False, log=lambda m: None,
    )  # fmt: skip
    assert summary["sequences"] == 12 and summary["draft_vocab"] == 256  # greedy and sampled answers
    assert summary["last_loss"] < 0.3 * summary["first_loss"]
    assert all(b > a + 0.3 for a, b in zip(summary["first_acc"], summary["last_acc"], strict=True))
    marker = json.loads((tmp_path / "d" / "specpilot_drafter.json").read_text())
    meta = marker["training"]
    assert meta["tokens"] > meta["answer_tokens"] > 0 and meta["train_seconds"] > 0 and meta["steps"] == 120
    phases = meta["step_ms_by_phase"]  # five timed steps, every phase of the step booked
    assert set(phases) == {"batch", "target_pass", "ttt_forward", "head_loss", "backward", "optimizer"}
    assert all(v > 0 for v in phases.values()) and sum(phases.values()) < 1000 * meta["train_seconds"] / 5
    assert meta["answers"] == ["greedy", "sampled"] and marker["draft_vocab"] == 256
    assert is_eagle3(tmp_path / "d")
    draft = load_eagle3(tmp_path / "d", target)
    assert draft.d2t.numel() == 256 and draft.embed is target.embed
    assert marker["head"] == "target" and "lm_head.weight" not in load_file(str(tmp_path / "d" / "model.safetensors"))
    tree = EngineOptions(max_seq_len=256, max_batch_size=6, device="cpu", dtype="float32", tree_budget=8,
                         tree_depth=3, tree_top_k=2)  # fmt: skip
    spec = Engine(target, WordTokenizer(), tree, draft)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    assert [r.token_ids for r in spec.generate(ps, params)] == [r.token_ids for r in ar.generate(ps, params)]
    assert spec.batch.round_tokens > 1.2 * spec.batch.rounds  # the trained drafter's tokens get accepted


def _main(capsys, *argv):
    rc = cli.main(list(argv))
    return rc, capsys.readouterr()


def test_cli_eagle3_refuses_evaluation_sets_and_foreign_flags(capsys, monkeypatch):
    def no_loading(*a, **k):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(cli, "_ar_engine", no_loading)
    cases = [
        (["--prompts", "mtbench"], "MT-Bench is an evaluation set"),
        (["--prompts", "offline,mtbench"], "MT-Bench is an evaluation set"),
        (["--prompts", "humaneval:90-120"], "held out"),
        (["--prompts", "synthetic:2", "--layers", "2"], "--layers is a flag of --kind shared"),
        (["--prompts", "synthetic:2", "--ttt-steps", "0"], "--ttt-steps"),
        (["--prompts", "synthetic:2", "--answers", "beam"], "--answers"),
        (["--prompts", "synthetic:2", "--intermediate", "0"], "--intermediate must be >= 1"),
    ]
    for args, needle in cases:
        rc, out = _main(capsys, "train-drafter", "--kind", "eagle3", "--out", "/tmp/never-written", *args)
        assert rc == 2 and needle in out.err and out.err.count("\n") == 1, out.err
    rc, out = _main(capsys, "train-drafter", "--out", "/tmp/never", "--prompts", "synthetic:2", "--ttt-steps", "3")
    assert rc == 2 and "--ttt-steps is a flag of --kind eagle3" in out.err
    rc, out = _main(capsys, "train-drafter", "--out", "/tmp/never", "--prompts", "synthetic:2", "--intermediate", "8")
    assert rc == 2 and "--intermediate is a flag of --kind eagle3" in out.err


def test_cli_eagle3_trains_a_loadable_drafter(capsys, tmp_path):
    out = tmp_path / "d"
    rc, res = _main(
        capsys, "train-drafter", "--kind", "eagle3", "--out", str(out), "--prompts", "synthetic:3", "--steps", "3",
        "--batch", "2", "--new-tokens", "8", "--ttt-steps", "2", "--gen-batch", "3", "--max-len", "64",
        "--head", "trained", "--model", "tiny-llama", "--synthetic", "--device", "cpu",
    )  # fmt: skip
    assert rc == 0, res.err
    summary = json.loads(res.out.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["ttt_steps"] == 2 and summary["prompts"] == "synthetic:3"
    assert summary["sequences"] == 6 and summary["answers"] == ["greedy", "sampled"]
    marker = json.loads((out / "specpilot_drafter.json").read_text())
    assert marker["kind"] == "eagle3" and marker["head"] == "trained" and marker["training"]["head"] == "trained"
    assert "lm_head.weight" in load_file(str(out / "model.safetensors"))  # a trained head is stored


def test_a_wider_mlp_starts_as_the_target_layer_and_round_trips(capsys, tmp_path):
    target = tiny_model("tiny-llama")
    units = target.cfg.intermediate_size
    plain, wide = init_eagle3(target), init_eagle3(target, intermediate_size=3 * units)
    x = torch.randn(5, target.cfg.hidden_size)
    assert wide.layers[0].mlp.w2.weight.shape[1] == 3 * units
    assert torch.allclose(plain.layers[0].mlp(x), wide.layers[0].mlp(x), atol=1e-6)  # extra units add nothing yet
    with pytest.raises(ValueError, match="below the target's"):
        init_eagle3(target, intermediate_size=units - 1)
    out = tmp_path / "d"
    rc, res = _main(
        capsys, "train-drafter", "--kind", "eagle3", "--out", str(out), "--prompts", "synthetic:3", "--steps", "3",
        "--batch", "2", "--new-tokens", "8", "--ttt-steps", "2", "--gen-batch", "3", "--max-len", "64",
        "--intermediate", str(2 * units), "--model", "tiny-llama", "--synthetic", "--device", "cpu",
        "--capture-sampling",
    )  # fmt: skip
    assert rc == 0, res.err
    assert json.loads(res.out.strip().splitlines()[-1])["intermediate_size"] == 2 * units
    marker = json.loads((out / "specpilot_drafter.json").read_text())
    assert marker["layer"]["intermediate_size"] == 2 * units
    loaded = load_eagle3(out, tiny_model("tiny-llama"))
    assert loaded.cfg.intermediate_size == 2 * units and loaded.layers[0].mlp.w13.weight.shape[0] == 4 * units


def test_continuing_keeps_the_drafter_function_vocabulary_and_record(capsys, tmp_path):
    first, wide = tmp_path / "d1", tmp_path / "d2"
    rc, res = _main(capsys, *_cli_args("--out", str(first), "--head", "trained", "--draft-vocab", "40"))
    assert rc == 0, res.err
    target = tiny_model("tiny-llama", seed=0)
    base = load_eagle3(first, target)
    units = base.cfg.intermediate_size
    cont = continue_eagle3(target, base, 2 * units)
    assert cont.layers[0].mlp.w2.weight.shape[1] == 2 * units and torch.equal(cont.d2t, base.d2t)
    feats = torch.randn(2, 5, len(base.feature_layers) * target.cfg.hidden_size)
    h_base, h_cont = (d.layers[0].mlp(d.project(feats)) for d in (base, cont))
    assert torch.allclose(h_base, h_cont, atol=1e-6)  # the widened copy computes the trained function
    assert torch.equal(cont.lm_head.weight, base.lm_head.weight) and torch.equal(cont.fc.weight, base.fc.weight)
    with pytest.raises(ValueError, match="below the drafter's"):
        continue_eagle3(target, base, units - 1)
    frozen = init_eagle3(target)  # the default head: the target's rows, frozen
    h = torch.randn(3, target.cfg.hidden_size)
    assert torch.equal(continue_eagle3(target, frozen, 3 * units).logits(h), frozen.logits(h))
    rc, res = _main(capsys, *_cli_args("--out", str(wide), "--init", str(first), "--intermediate", str(2 * units)))
    assert rc == 0, res.err
    marker = json.loads((wide / "specpilot_drafter.json").read_text())
    assert marker["layer"]["intermediate_size"] == 2 * units and marker["draft_vocab"] == base.d2t.numel()
    before = marker["training"]["continued_from"]
    assert before["path"] == str(first) and before["steps"] == 3 and before["intermediate_size"] == units
    assert torch.equal(load_eagle3(wide, target).d2t, base.d2t)  # the vocabulary the head rows were trained for
    rc, out = _main(capsys, *_cli_args("--out", str(wide), "--init", str(tmp_path / "none")))
    assert rc == 2 and "not an EAGLE-3 drafter folder" in out.err and out.err.count("\n") == 1
    rc, out = _main(capsys, *_cli_args("--out", str(wide), "--init", str(first), "--head", "target"))
    assert rc == 2 and "has head 'trained'" in out.err and out.err.count("\n") == 1
    rc, res = _main(capsys, *_cli_args("--out", str(tmp_path / "d3"), "--init", str(wide)))  # its head, kept
    assert rc == 0 and json.loads((tmp_path / "d3" / "specpilot_drafter.json").read_text())["head"] == "trained"


def _cli_args(*extra):
    steps = () if "--train-seconds" in extra else ("--steps", "3")
    return (
        "train-drafter", "--kind", "eagle3", "--prompts", "synthetic:3", "--batch", "2",
        "--new-tokens", "8", "--ttt-steps", "2", "--gen-batch", "3", "--max-len", "64", "--model", "tiny-llama",
        "--synthetic", "--device", "cpu", *steps, *extra,
    )  # fmt: skip


def test_answers_written_once_train_again_and_merge_by_prompt(capsys, tmp_path):
    from sglang_specpilot.drafters.answers_file import load_answers

    both, sampled = tmp_path / "a.pt", tmp_path / "s.pt"
    rc, res = _main(capsys, *_cli_args("--answers-out", str(both), "--answers-only"))
    assert rc == 0 and both.is_file() and not (tmp_path / "d").exists(), res.err
    wrote = json.loads(res.out.strip().splitlines()[-1])
    assert wrote["sequences"] == 6 and wrote["prompts"] == 3 and wrote["meta"]["answers"] == ["greedy", "sampled"]
    rc, res = _main(capsys, *_cli_args("--answers", "sampled", "--seed", "5", "--answers-out", str(sampled),
                                       "--out", str(tmp_path / "d1")))  # fmt: skip
    assert rc == 0 and (tmp_path / "d1" / "specpilot_drafter.json").is_file(), res.err
    # The same three prompts in both files are three prompts, with three answers each.
    ident = {k: wrote[k] for k in ("target", "vocab_size", "tokenizer")}
    assert ident["target"] == tiny_model("tiny-llama").cfg.name and ident["tokenizer"]
    seqs, ps, described = load_answers([both, sampled], ident)
    assert len(ps) == 3 and len(seqs) == 9 and [d["file"] for d in described] == ["a.pt", "s.pt"]
    assert sorted(sum(s.prompt_index == i for s in seqs) for i in range(3)) == [3, 3, 3]
    first = load_answers([both], ident)[0]
    again = load_answers([both], ident)[0]
    assert first == again and {s.answer for s in first} == {"greedy", "sampled"}
    assert all(s.ids[: s.prompt_len] == tuple(ps[s.prompt_index]) for s in seqs)  # each answer under its prompt
    # Training on the files answers nothing and records where its data came from.
    rc, res = _main(capsys, *_cli_args("--answers-in", f"{both},{sampled}", "--out", str(tmp_path / "d2")))
    assert rc == 0, res.err
    summary = json.loads(res.out.strip().splitlines()[-1])
    assert summary["sequences"] == 9 and summary["prompt_count"] == 3 and summary["generate_seconds"] < 5
    assert [d["file"] for d in summary["answers_from"]] == ["a.pt", "s.pt"]
    assert summary["answers_from"][1]["seed"] == 5 and summary["answers"] == ["greedy", "sampled"]


def test_bad_answer_files_get_one_line(capsys, tmp_path):
    import torch as T

    from sglang_specpilot.drafters.answers_file import load_answers

    good = tmp_path / "a.pt"
    rc, res = _main(capsys, *_cli_args("--answers-out", str(good), "--answers-only"))
    assert rc == 0, res.err
    ident = {
        k: v
        for k, v in json.loads(res.out.strip().splitlines()[-1]).items()
        if k in ("target", "vocab_size", "tokenizer")
    }
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[:100])
    blob = T.load(good, weights_only=True)
    blob["lengths"][0] += 1
    damaged = tmp_path / "damaged.pt"
    T.save(blob, damaged)
    cases = [
        (["--answers-in", str(tmp_path / "none.pt"), "--out", "/tmp/never"], "no such file"),
        (["--answers-in", str(junk), "--out", "/tmp/never"], "not a readable answers file"),
        (["--answers-in", str(cut), "--out", "/tmp/never"], "not a readable answers file"),
        (["--answers-in", str(damaged), "--out", "/tmp/never"], "disagree"),
        (["--answers-only"], "--answers-only needs"),
        ([], "--out DIR is required"),
        (
            ["--answers-in", str(good), "--answers-out", str(tmp_path / "b.pt"), "--out", "/tmp/never"],
            "already written",
        ),
    ]
    for extra, needle in cases:
        rc, out = _main(capsys, *_cli_args(*extra))
        assert rc == 2 and needle in out.err and out.err.count("\n") == 1, (extra, out.err)
    other = {**ident, "target": "another model"}
    with pytest.raises(ValueError, match="answers of another target"):
        load_answers([good], other)
    # A file cannot smuggle evaluation text in: its prompts are checked again.
    blob = T.load(good, weights_only=True)
    from sglang_specpilot.drafters.train import evaluation_texts

    banned = sorted(evaluation_texts())  # MT-Bench and/or held-out HumanEval, whichever is installed
    if not banned:
        pytest.skip("neither evaluation package is installed here: nothing to refuse")
    blob["prompts"][0] = banned[0]
    evil = tmp_path / "evil.pt"
    T.save(blob, evil)
    with pytest.raises(ValueError, match="evaluation text"):
        load_answers([evil], ident)


def test_a_time_budget_without_steps_sets_the_step_count(capsys, tmp_path):
    from sglang_specpilot.drafters.train_eagle3 import fit_eagle3, make_answers

    target = tiny_model("tiny-llama")
    seqs = make_answers(_ar(target), prompts([5, 8, 6], target.cfg.vocab_size, seed=1), 16, False, ("greedy",))
    with pytest.raises(ValueError, match="needs train_seconds"):
        fit_eagle3(target, seqs, steps=None, progress=False, log=lambda m: None)
    _, summary = fit_eagle3(target, seqs, steps=None, train_seconds=1.0, batch=2, max_len=64, ttt_steps=2,
                            draft_vocab=128, eval_frac=0.0, progress=False, log=lambda m: None)  # fmt: skip
    # More steps than the 13 the probe times, as many as fit the second (not the 2,000 default's cap).
    assert 13 < summary["steps"] < 10**6 and 0.5 < summary["train_seconds"] < 3.0
    rc, res = _main(capsys, *_cli_args("--train-seconds", "0.5", "--out", str(tmp_path / "d")))
    assert rc == 0, res.err
    assert json.loads(res.out.strip().splitlines()[-1])["steps"] != 3


def test_cached_target_features_train_exactly_as_the_full_pass():
    # fp64 on the CPU: the cache (the target run once over the rows) gives the full pass's features and
    # teacher, so the same seed trains the same drafter, loss for loss.
    from sglang_specpilot.drafters import feature_cache
    from sglang_specpilot.drafters.train_eagle3 import fit_eagle3, make_answers

    target = tiny_model("tiny-llama", dtype=torch.float64)
    seqs = make_answers(_ar(target), prompts([5, 8, 6, 7, 9], target.cfg.vocab_size, seed=3), 20, False)
    kw = dict(steps=12, batch=2, max_len=48, ttt_steps=3, draft_vocab=96, eval_frac=0.0, progress=False,
              log=lambda m: None)  # fmt: skip
    d1, full = fit_eagle3(target, seqs, cache_features=False, **kw)
    d2, cached = fit_eagle3(target, seqs, cache_features=True, **kw)
    assert "feature_cache_gb" in cached and "feature_cache_gb" not in full
    assert cached["rows"] > 2  # several rows, padded differently per batch
    for key in ("first_loss", "last_loss", "first_acc", "last_acc"):
        assert cached[key] == pytest.approx(full[key], rel=1e-9, abs=1e-9), key
    for (n, a), (_, b) in zip(d1.state_dict().items(), d2.state_dict().items(), strict=True):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12), n
    # The automatic choice: never on the CPU (the full pass is cheap there next to the rest).
    rows = [[s] for s in seqs]
    assert not feature_cache.fits(target, rows, d1.feature_layers)
    tokens, H = sum(len(s.ids) for s in seqs), target.cfg.hidden_size
    assert feature_cache.cache_bytes(target, rows, (1, 2)) == tokens * 3 * H * 8  # two layers + the last, fp64
