"""Two-level verification in the engine (issue 16): lossless greedy and sampled rounds, a Q pass that
emits nothing and whose 8-bit view changes acceptance only, the options, and (GPU) the captured round."""

import pytest
import torch
from helpers import WordTokenizer, prompts, tiny_model
from test_eagle3 import _drafter
from test_tree_verify import chi2_pvalue

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine import round as round_mod
from sglang_specpilot.engine.tlv_round import TLVRound
from sglang_specpilot.models.w12_weights import to_w12
from w12.view8_linear import W12View8Linear

V = 12  # small, so untrained drafters and the Q chain get tokens accepted
SHAPES = {
    "chain": {"tlv_chain_len": 3},
    "tree": {"tlv_chain_len": 2, "tree_budget": 6, "tree_depth": 3, "tree_top_k": 2},
    "tree+root": {"tlv_chain_len": 1, "tree_budget": 5, "tree_depth": 3, "tree_top_k": 2, "tlv_root_budget": 4},
}


def _models(eagle: bool, seed: int = 0):
    base = tiny_model("tiny-llama", vocab_size=V, dtype=torch.bfloat16, seed=seed)
    draft = _drafter(base) if eagle else None
    target = to_w12(base)  # W12 in place: an EAGLE-3 drafter keeps reading its embedding
    return target, draft if eagle else target.truncated(1)


def _engine(target, draft, device="cpu", **kw):
    opts = EngineOptions(
        device=device,
        dtype="bfloat16",
        weights="w12",
        max_seq_len=256,
        max_batch_size=8,
        graph_batch_sizes=(1, 2, 4, 8),
        **kw,
    )
    return Engine(target, WordTokenizer(), opts, draft)


def _ids(eng, ps, n=16):
    return [r.token_ids for r in eng.generate(ps, SamplingParams(max_new_tokens=n, ignore_eos=True))]


@pytest.mark.parametrize("eagle", [False, True], ids=["plain", "eagle3"])
@pytest.mark.parametrize("kind", list(SHAPES))
@pytest.mark.parametrize("lengths", [[7], [5, 11, 3], [4, 9, 2, 13, 6, 8, 3, 10]])
def test_greedy_tlv_equals_ar(eagle, kind, lengths):
    target, draft = _models(eagle)
    ps = prompts(lengths, V, seed=len(lengths))
    ref = _ids(_engine(target, None), ps)
    eng = _engine(target, draft, tlv=True, **SHAPES[kind])
    assert isinstance(eng.round, TLVRound)
    assert _ids(eng, ps) == ref
    assert eng.batch.round_tokens > eng.batch.rounds  # drafts were accepted, not only bonus tokens


def test_q_pass_never_emits_and_leaves_the_prefix(monkeypatch):
    # With an exact pass that accepts nothing and emits a marker, the output holds markers only: every
    # token the Q pass proposed (none of them the marker) stayed a candidate.
    target, draft = _models(False)
    eng = _engine(target, draft, tlv=True, **SHAPES["chain"])
    marker, chains, prefixes = V - 1, [], []
    q_pass = TLVRound.q_pass

    def spy(self, seq, nxt, kv_len):
        kv = self.target.kv.storage
        before = [kv[:, :, b, : int(seq[b])].clone() for b in range(seq.shape[0])]
        chain, feats = q_pass(self, seq, nxt, kv_len)
        # The Q pass writes only past each row's length: the committed prefix is untouched.
        prefixes.append(all(torch.equal(kv[:, :, b, : int(seq[b])], before[b]) for b in range(seq.shape[0])))
        chains.append(chain.clone())
        return torch.where(chain == marker, 0, chain), feats

    def nothing(self, hist, seq, nxt, *a, out, **k):
        bonus = torch.full_like(seq, marker)
        out[:, 0] = bonus
        out[:, -2] = 0
        return bonus, torch.zeros_like(seq)

    monkeypatch.setattr(TLVRound, "q_pass", spy)
    monkeypatch.setattr(TLVRound, "verify", nothing)
    out = _ids(eng, prompts([5, 8], V, seed=3), n=6)
    assert chains and all(prefixes)
    assert all(t == marker for row in out for t in row[1:])  # token 0 is the prefill's


def test_corrupt_8bit_view_changes_acceptance_only():
    target, draft = _models(False)
    ps = prompts([5, 11, 3], V, seed=4)
    ref = _ids(_engine(target, None), ps, n=24)
    good = _engine(target, draft, tlv=True, **SHAPES["tree"])
    assert _ids(good, ps, n=24) == ref
    bad = _engine(target, draft, tlv=True, **SHAPES["tree"])
    views = [m for m in bad.round.q.model.modules() if isinstance(m, W12View8Linear)]
    assert views
    for m in views:  # the Q pass's hi planes only: the exact model keeps its own
        m.hi = torch.zeros_like(m.hi)
    assert int(target.lm_head.hi.abs().sum()) > 0
    assert _ids(bad, ps, n=24) == ref
    assert bad.batch.round_tokens / bad.batch.rounds < good.batch.round_tokens / good.batch.rounds


def test_tlv_options_refuse_what_they_cannot_run():
    with pytest.raises(ValueError, match=r"--weights w12"):
        EngineOptions(tlv=True, device="cpu")
    with pytest.raises(ValueError, match="tlv_hang_budget"):
        EngineOptions(tlv=True, weights="w12", device="cpu", tlv_hang_budget=99)
    with pytest.raises(ValueError, match="tlv_chain_len"):
        EngineOptions(tlv=True, weights="w12", device="cpu", tlv_chain_len=0)
    bf16 = tiny_model("tiny-llama", vocab_size=V, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"--weights w12"):  # options say w12, the model is not
        _engine(bf16, bf16.truncated(1), tlv=True)
    target, _ = _models(False)
    with pytest.raises(ValueError, match="draft model"):
        _engine(target, None, tlv=True)
    # Off: the stock round, nothing of TLV allocated.
    eng = _engine(target, target.truncated(1))
    assert not isinstance(eng.round, TLVRound) and eng.state.n_prev is None


# ---------------------------------------------------------------------------- temperature 1


def _exact_marginals(model, prompt):
    """P(t2) and P(t3) of the target at temperature 1, summing over the earlier tokens exactly."""
    from sglang_specpilot.engine.attn_meta import causal_tree
    from sglang_specpilot.engine.runner import ModelRunner

    def next_probs(seqs):
        r = ModelRunner(model, len(seqs), 64, cuda_graphs=False)
        x = torch.tensor(seqs)
        logits = r.step(x, torch.zeros(len(seqs), dtype=torch.long), *causal_tree(x.shape[1]))[:, -1]
        return torch.softmax(logits.double(), -1)

    p1 = next_probs([prompt])[0]
    p2_given = next_probs([prompt + [a] for a in range(V)])
    p3_given = next_probs([prompt + [a, b] for a in range(V) for b in range(V)]).view(V, V, V)
    return p1 @ p2_given, torch.einsum("a,ab,abc->c", p1, p2_given, p3_given)


def _sampled_counts(eng, prompt, calls):
    c2, c3 = torch.zeros(V, dtype=torch.long), torch.zeros(V, dtype=torch.long)
    deep = 0
    for call in range(calls):
        sp = SamplingParams(max_new_tokens=3, temperature=1.0, seed=call, ignore_eos=True)
        for r in eng.generate([prompt] * 8, sp):
            c2[r.token_ids[1]] += 1
            c3[r.token_ids[2]] += 1
            deep += r.rounds == 1  # tokens 2 and 3 both came from one TLV round
    return c2, c3, deep


def _sampling_setup():
    torch.manual_seed(0)
    base = tiny_model("tiny-llama", vocab_size=V, std=0.3, dtype=torch.bfloat16)
    target = to_w12(base)
    prompt = [3, 7, 5, 9]
    eng = _engine(target, target.truncated(1), tlv=True, **SHAPES["tree"])
    return eng, prompt, _exact_marginals(target, prompt)


def test_sampled_tlv_is_lossless():
    eng, prompt, (p2, p3) = _sampling_setup()
    c2, c3, deep = _sampled_counts(eng, prompt, 150)
    assert chi2_pvalue(c2, p2) > 1e-4 and chi2_pvalue(c3, p3) > 1e-4
    assert deep > 100  # the multi-token acceptance path was exercised


def test_sampled_tlv_negative_control(monkeypatch):
    # A TLV whose Q chain emits its first token without the exact test (the target's distribution at the
    # root replaced by a point mass on c_1) must fail the same chi-square.
    real = round_mod.accept_sampling_batched

    def q_emits(parents, tokens, probs, *a, **k):
        probs = probs.clone()
        probs[:, 0] = torch.nn.functional.one_hot(tokens[:, 0], probs.shape[-1]).to(probs.dtype)
        return real(parents, tokens, probs, *a, **k)

    monkeypatch.setattr(round_mod, "accept_sampling_batched", q_emits)
    eng, prompt, (p2, _) = _sampling_setup()
    c2, _, _ = _sampled_counts(eng, prompt, 150)
    assert chi2_pvalue(c2, p2) < 1e-4


# ---------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("eagle", [False, True], ids=["plain", "eagle3"])
def test_captured_tlv_round_equals_eager(eagle):
    target, draft = _models(eagle)
    target, draft = target.cuda(), draft.cuda()
    ps = prompts([5, 11, 3, 9], V, seed=7)
    kw = dict(tlv=True, **SHAPES["tree+root"])
    captured = _engine(target, draft, device="cuda", **kw)
    eager = _engine(target, draft, device="cuda", cuda_graphs=False, **kw)
    assert captured.captured is not None and eager.captured is None
    assert _ids(captured, ps, n=32) == _ids(eager, ps, n=32) == _ids(_engine(target, None, device="cuda"), ps, n=32)


def test_cli_tlv_flags_reach_the_options():
    from sglang_specpilot.cli import build_parser, engine_options

    args = build_parser().parse_args(
        ["generate", "--prompt", "x", "--device", "cpu", "--weights", "w12", "--draft", "d", "--tlv"]
        + ["--tlv-chain-len", "3", "--tlv-hang-budget", "2", "--tlv-root-budget", "1"]
    )
    o = engine_options(args)
    assert (o.tlv, o.tlv_chain_len, o.tlv_hang_budget, o.tlv_root_budget) == (True, 3, 2, 1)
    assert not engine_options(build_parser().parse_args(["generate", "--prompt", "x", "--device", "cpu"])).tlv


@pytest.mark.gpu
def test_second_w12_engine_keeps_the_first_engines_graphs():
    # Layers with different escape counts (zeros are escapes), so a compiling runner pads them; a second
    # engine on the same model pads again, which must leave the tensors the first engine captured in place
    # (on the H200 a copy freed them under the first engine's graphs: an illegal memory access).
    base = tiny_model("tiny-llama", vocab_size=V, dtype=torch.bfloat16)
    with torch.no_grad():
        for i, layer in enumerate(base.layers):
            layer.attn.wqkv.weight[1, : 3 + 5 * i] = 0.0
    target = to_w12(base).cuda()
    counts = {int(layer.attn.wqkv.esc_idx.numel()) for layer in target.layers}
    assert len(counts) > 1
    ps = prompts([5, 11, 3], V, seed=3)
    first = _engine(target, target.truncated(1), device="cuda", num_speculative_tokens=3)
    ref = _ids(first, ps, n=24)
    second = _engine(target, target.truncated(1), device="cuda", tlv=True, **SHAPES["chain"])
    assert _ids(first, ps, n=24) == ref
    assert _ids(second, ps, n=24) == ref
