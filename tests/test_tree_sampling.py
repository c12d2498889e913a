"""Lossless tree sampling (temperature > 0): batched recursive rejection and the engine's tree rounds.

Statistical with fixed seeds: Pearson chi-square of the emitted tokens against the target distribution,
rejected at p < 1e-4. A negative control (rejection without the residual update) must fail the same test.
"""

import pytest
import torch
from helpers import WordTokenizer, tiny_model
from test_tree_verify import chi2_pvalue

import tree_verify.accept_batched as ab
from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.attn_meta import causal_tree
from sglang_specpilot.engine.runner import ModelRunner
from tree_verify import accept_sampling_batched, children_table

V = 6
ROWS = 40000


def setup(seed):
    """A tree [a, b, c | children of a: d, e | padding]; per-entry target distributions."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(7, V, generator=g) * 1.5, -1)  # block entries: root + 6 nodes
    tokens = torch.tensor([2, 0, 4, 1, 3, -1])  # the root's children 2, 0, 4; node 0's children 1, 3
    parents = torch.tensor([-1, -1, -1, 0, 0, -1])
    return probs, tokens, parents


def emitted(res, tokens):
    """First and second emitted token per row (-1 when the round emitted one token)."""
    B = res.path.shape[0]
    tok_of_block = torch.cat([torch.tensor([-1]), tokens])
    first = torch.where(res.accept_length >= 1, tok_of_block[res.path[:, 1].clamp(min=0)], res.bonus)
    second = torch.where(
        res.accept_length >= 2,
        tok_of_block[res.path[:, 2].clamp(min=0)],
        torch.where(res.accept_length == 1, res.bonus, torch.full((B,), -1)),
    )
    return first, second


def run(seed):
    probs, tokens, parents = setup(seed)
    g = torch.Generator().manual_seed(seed + 1)
    res = accept_sampling_batched(parents.expand(ROWS, 6), tokens.expand(ROWS, 6), probs.expand(ROWS, 7, V), g)
    return probs, tokens, res


def test_children_table():
    t = children_table(torch.tensor([[-1, -1, 0, 1, 0, -1]]))
    assert t[0].tolist() == [[1, 2, 6], [3, 5, -1], [4, -1, -1], [-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [-1, -1, -1]]


@pytest.mark.parametrize("seed", [0, 1])
def test_batched_tree_sampling_is_lossless(seed):
    probs, tokens, res = run(seed)
    first, second = emitted(res, tokens)
    assert chi2_pvalue(torch.bincount(first, minlength=V), probs[0]) > 1e-4
    # After the first token x, the second follows the target at x's node (node 0 = token 2, entry 1).
    after = second[(first == 2)]
    assert after.numel() > 1000 and bool((after >= 0).all())
    assert chi2_pvalue(torch.bincount(after, minlength=V), probs[1]) > 1e-4
    # A padding node (token -1) is never accepted.
    assert not bool((res.path == 6).any())


def test_batched_tree_sampling_matches_greedy_on_one_hot():
    # One-hot targets make sampling deterministic: it must then agree with greedy acceptance exactly.
    _, tokens, parents = setup(0)
    from tree_verify import accept_greedy_batched

    for argmax in ([2, 3, 1, 2, 5, 5, 5], [0, 3, 1, 2, 5, 5, 5], [5, 3, 1, 2, 5, 5, 5]):
        argmax = torch.tensor(argmax)
        one_hot = torch.nn.functional.one_hot(argmax, V)[None].double()
        res = accept_sampling_batched(parents[None], tokens[None], one_hot)
        ref = accept_greedy_batched(parents[None], tokens[None], argmax[None])
        assert torch.equal(res.path, ref.path) and torch.equal(res.bonus, ref.bonus)
        assert torch.equal(res.accept_length, ref.accept_length)


def test_batched_tree_sampling_negative_control(monkeypatch):
    # Wrong rule: after a rejection keep sampling from the unchanged target (no residual update).
    real = torch.Tensor.scatter

    def no_zeroing(self, dim, index, value, *a, **k):
        if isinstance(value, float) and value == 0.0:
            return self.clone()
        return real(self, dim, index, value, *a, **k)

    monkeypatch.setattr(ab.torch.Tensor, "scatter", no_zeroing)
    probs, tokens, res = run(0)
    first, _ = emitted(res, tokens)
    assert chi2_pvalue(torch.bincount(first, minlength=V), probs[0]) < 1e-4


# ---------------------------------------------------------------------------- engine, temperature 1


def _exact_marginals(model, prompt):
    """P(t2) and P(t3) of the target at temperature 1, summing over the earlier tokens exactly."""
    Vm = model.cfg.vocab_size

    def next_probs(seqs):
        r = ModelRunner(model, len(seqs), 64, cuda_graphs=False)
        x = torch.tensor(seqs)
        return torch.softmax(r.step(x, torch.zeros(len(seqs), dtype=torch.long), *causal_tree(x.shape[1]))[:, -1], -1)

    p1 = next_probs([prompt])[0]
    p2_given = next_probs([prompt + [a] for a in range(Vm)])  # [V, V]
    p2 = p1 @ p2_given
    pairs = [prompt + [a, b] for a in range(Vm) for b in range(Vm)]
    p3_given = next_probs(pairs).view(Vm, Vm, Vm)
    p3 = torch.einsum("a,ab,abc->c", p1, p2_given, p3_given)
    return p2.double(), p3.double()


def test_engine_tree_sampling_is_lossless():
    torch.manual_seed(0)
    target = tiny_model("tiny-llama", vocab_size=12, std=0.3, dtype=torch.float64)
    draft = target.truncated(1)
    prompt = [3, 7, 5, 9]
    p2, p3 = _exact_marginals(target, prompt)
    opts = EngineOptions(
        max_seq_len=64, max_batch_size=16, device="cpu", dtype="float32", tree_budget=6, tree_depth=3, tree_top_k=2
    )
    eng = Engine(target, WordTokenizer(), opts, draft)
    c2, c3 = torch.zeros(12, dtype=torch.long), torch.zeros(12, dtype=torch.long)
    deep = 0
    for call in range(100):
        sp = SamplingParams(max_new_tokens=3, temperature=1.0, seed=call, ignore_eos=True)
        for r in eng.generate([prompt] * 16, sp):
            c2[r.token_ids[1]] += 1
            c3[r.token_ids[2]] += 1
            deep += r.rounds == 1  # tokens 2 and 3 both came from one tree round
    assert chi2_pvalue(c2, p2) > 1e-4 and chi2_pvalue(c3, p3) > 1e-4
    assert deep > 200  # the depth-2 acceptance path was exercised
