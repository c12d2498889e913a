"""The EAGLE-3 feature drafter in the engine: lossless rounds, true-feature draft K/V, its folder format."""

import json
import os

import pytest
import torch
from helpers import WordTokenizer, prompts, run_kernel_cases_in_interpreter, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.drafters.eagle3 import init_eagle3, is_eagle3, load_eagle3, save_eagle3
from sglang_specpilot.drafters.shared_head import is_shared_drafter
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.attn_meta import causal_tree
from sglang_specpilot.engine.runner import ModelRunner

V = 12  # a small vocabulary, so an untrained drafter still gets drafts accepted (n > 0 windows)
SHAPES = {
    "ar": {},
    "chain": {"num_speculative_tokens": 4},
    "tree": {"tree_budget": 10, "tree_depth": 4, "tree_top_k": 3},
}


def _drafter(target, seed=0, vocab=None):
    torch.manual_seed(seed)
    d2t = None if vocab is None else torch.tensor(vocab)
    d = init_eagle3(target, d2t=d2t)
    with torch.no_grad():  # move it off the warm start so its features matter
        for name, p in d.named_parameters():
            if not name.startswith("embed."):
                p.add_(torch.randn_like(p) * 0.2)
    return d


def _engine(target, draft, kind, **kw):
    kw = {"device": "cpu", "dtype": "float32", "max_seq_len": 256, "max_batch_size": 8, **kw}
    opts = EngineOptions(graph_batch_sizes=(1, 2, 4, 8), **SHAPES[kind], **kw)
    return Engine(target, WordTokenizer(), opts, draft if kind != "ar" else None)


def _ids(eng, ps, n=20):
    return [r.token_ids for r in eng.generate(ps, SamplingParams(max_new_tokens=n, ignore_eos=True))]


@pytest.mark.parametrize("kind", ["chain", "tree"])
@pytest.mark.parametrize("lengths", [[7], [5, 11, 3], [4, 9, 2, 13, 6, 8, 3, 10]])
def test_greedy_equals_ar(kind, lengths):
    target = tiny_model("tiny-llama", vocab_size=V)
    ps = prompts(lengths, V, seed=len(lengths))
    ar = _ids(_engine(target, None, "ar"), ps)
    eng = _engine(target, _drafter(target), kind)
    assert _ids(eng, ps) == ar
    assert eng.batch.round_tokens > eng.batch.rounds  # some drafts were accepted: windows with n > 0 ran


@pytest.mark.skipif(
    not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"), reason="the kernels run in Triton"
)
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_kernel_greedy_with_the_tree_kernels_equals_ar(monkeypatch, kind):
    # SPECPILOT_ROUND_KERNELS=1: the lattice, tree, mask and acceptance kernels and the head's fused norm (which
    # may move the drafter's numbers by an ulp: the drafts, never the output); a reduced draft vocabulary.
    from sglang_specpilot.kernels import launch

    monkeypatch.setattr(launch, "ROUND_KERNELS", True)
    target = tiny_model("tiny-llama", vocab_size=V)
    ps = prompts([5, 11, 3], V, seed=3)
    eng = _engine(target, _drafter(target, vocab=[0, 2, 3, 5, 7, 8, 11]), kind)
    assert _ids(eng, ps) == _ids(_engine(target, None, "ar"), ps)
    assert eng.batch.round_tokens > eng.batch.rounds


def test_kernel_cases_in_interpreter():
    # The kernel cases above, in a child process with TRITON_INTERPRET=1 (set before triton's import).
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the kernel cases run in this process")
    run_kernel_cases_in_interpreter(__file__, "kernel_ and not interpreter")


def test_reduced_draft_vocabulary_equals_ar():
    target = tiny_model("tiny-qwen3", vocab_size=V)
    ps = prompts([6, 10], V, seed=5)
    eng = _engine(target, _drafter(target, vocab=[0, 2, 3, 5, 7, 8, 11]), "tree")
    assert _ids(eng, ps) == _ids(_engine(target, None, "ar"), ps)


@torch.inference_mode()
def test_draft_cache_holds_true_feature_kv():
    # After generation, every verified position's draft K/V must be what a fresh drafter pass over the
    # final text computes with the target's true features one position earlier: the round's depth-0
    # window re-ran each accepted token with its verify-pass features, never the drafter's own guesses.
    target = tiny_model("tiny-llama", vocab_size=V, dtype=torch.float64)
    draft = _drafter(target).to(torch.float64)
    eng = _engine(target, draft, "tree")  # the cache takes the models dtype
    prompt = prompts([9], V, seed=2)[0]
    out = _ids(eng, [prompt], n=30)[0]
    assert eng.batch.round_tokens > eng.batch.rounds
    seq = torch.tensor([prompt + out])
    S = seq.shape[1]
    fresh = ModelRunner(draft, 1, 256, cuda_graphs=False, scratch_slots=64)
    tgt = ModelRunner(target, 1, 256, cuda_graphs=False, scratch_slots=64)
    anc, depth = causal_tree(S)
    zero = torch.zeros(1, dtype=torch.long)
    _, feats = tgt.step(seq, zero, anc, depth, eager=True, feature_layers=draft.feature_layers)
    g = draft.project(torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], 1))
    fresh.step(seq, zero, anc, depth, eager=True, g=g)
    # Positions up to the last round's root are final; the round after the last one never ran.
    verified = S - 1 - eng.shape.max_emitted
    got = eng.draft_runner.kv.storage[:, :, 0, :verified]
    want = fresh.kv.storage[:, :, 0, :verified]
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_sampled_rounds_run():
    target = tiny_model("tiny-llama", vocab_size=V)
    ps = prompts([5, 8], V, seed=1)
    for kind in ("chain", "tree"):
        eng = _engine(target, _drafter(target), kind)
        res = eng.generate(ps, SamplingParams(max_new_tokens=12, temperature=0.9, seed=3, ignore_eos=True))
        assert all(len(r.token_ids) == 12 and all(0 <= t < V for t in r.token_ids) for r in res)


def test_folder_round_trip_and_refusals(tmp_path):
    target = tiny_model("tiny-llama", vocab_size=V)
    draft = _drafter(target, vocab=[0, 1, 4, 5, 9])
    path = save_eagle3(draft, tmp_path / "d", meta={"note": "test"})
    assert is_eagle3(path) and not is_shared_drafter(path)
    loaded = load_eagle3(path, target)
    assert loaded.embed is target.embed and loaded.d2t.tolist() == [0, 1, 4, 5, 9]
    x = torch.randn(2, 3, draft.cfg.hidden_size)
    # The default head is the target's rows of the draft vocabulary, not stored: the loaded one is exact.
    assert "lm_head.weight" not in draft.state_dict()
    torch.testing.assert_close(loaded.lm_head.weight, target.lm_head.weight[[0, 1, 4, 5, 9]], rtol=0, atol=0)
    torch.testing.assert_close(loaded.fc.weight, draft.fc.weight.to(torch.bfloat16).float())
    trained = save_eagle3(init_eagle3(target, head="trained"), tmp_path / "t")
    assert load_eagle3(trained, target).spec.head == "trained"
    assert "lm_head.weight" in init_eagle3(target, head="trained").state_dict()
    assert loaded.target_logits(x).shape == (2, 3, V)
    assert torch.isinf(loaded.target_logits(x)[..., 2]).all()

    other = tiny_model("tiny-llama", vocab_size=V + 1)
    with pytest.raises(ValueError, match="target_vocab"):
        load_eagle3(path, other)
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="cannot read the drafter weights"):
        load_eagle3(path, target)
    marker = json.loads((path / "specpilot_drafter.json").read_text())
    marker["feature_layers"] = [0, 1, 99]
    (path / "specpilot_drafter.json").write_text(json.dumps(marker))
    with pytest.raises(ValueError, match="reads layer 99"):
        load_eagle3(path, target)


def test_colocate_refuses_a_feature_drafter():
    target = tiny_model("tiny-llama", vocab_size=V)
    opts = EngineOptions(device="cpu", dtype="float32", max_seq_len=128, max_batch_size=4, colocate=True)
    with pytest.raises(ValueError, match="EAGLE-3"):
        Engine(target, WordTokenizer(), opts, _drafter(target))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_captured_round_equals_eager_round_bitwise(kind):
    # The EAGLE-3 round (window re-run, feature hand-over, compiled drafter layer) recorded in the CUDA
    # graph replays exactly what the eager round computes.
    target = tiny_model("tiny-llama", vocab_size=V, dtype=torch.bfloat16).cuda()
    draft = _drafter(target).to(torch.bfloat16)
    ps = prompts([5, 17, 9], V, seed=1)
    p = SamplingParams(max_new_tokens=40, ignore_eos=True)
    cap = _engine(target, draft, kind, device="cuda", dtype="bfloat16", compile=True)
    eag = _engine(target, draft, kind, device="cuda", dtype="bfloat16", compile=True, cuda_graphs=False)
    assert cap.captured is not None and eag.captured is None
    cap.warmup()
    for batch in ([ps[0]], ps):
        a, b = cap.generate(batch, p), eag.generate(batch, p)
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
        assert [r.rounds for r in a] == [r.rounds for r in b]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_captured_spec_equals_ar_fp32(kind):
    target = tiny_model("tiny-llama", vocab_size=V).cuda()
    ps = prompts([5, 17, 9, 30, 3, 12, 8, 21], V, seed=2)
    p = SamplingParams(max_new_tokens=32, ignore_eos=True)
    ar = _engine(target, None, "ar", device="cuda")
    spec = _engine(target, _drafter(target), kind, device="cuda")
    spec.warmup()
    for batch in (ps[:1], ps[:3], ps):
        assert [r.token_ids for r in spec.generate(batch, p)] == [r.token_ids for r in ar.generate(batch, p)]


@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_tau_replay_agrees_with_the_engine(kind):
    # The replay (harness/tau_replay.py) grows each round's lattice from a cache filled with true
    # features, as the engine's rounds leave it; so the rounds it counts are the engine's rounds.
    from sglang_specpilot.harness.tau_replay import tau_report

    # No EOS: the replay stops its text at EOS, where the engine spends one more round emitting it.
    target = tiny_model("tiny-llama", vocab_size=V, dtype=torch.float64, eos_token_ids=[])
    draft = _drafter(target).to(torch.float64)
    ps = prompts([6, 11, 4], V, seed=4)
    n = 40
    ar = _engine(target, None, "ar")
    rep = tau_report(ar, draft, ps, n, depth=4, top_k=3, budgets=(10,))
    eng = _engine(target, draft, kind)
    rounds = 0
    for p in ps:
        (res,) = eng.generate([p], SamplingParams(max_new_tokens=n))
        rounds += res.rounds
    want = rep["rounds_chain" if kind == "chain" else "rounds_tree10"]
    assert rounds == want, (rounds, rep)
