"""Speculative sampling is lossless in distribution; logit filters match a plain reference."""

import math

import pytest
import torch
from helpers import engine, tiny_model

from sglang_specpilot.engine import SamplingParams
from sglang_specpilot.engine.sampling import BatchSampling, probs_from_logits, sample_from_probs
from sglang_specpilot.engine.spec import chain_accept_sampling

# chi-square critical values at p = 0.001 (a fixed-seed test; the threshold only guards against a broken rule)
CHI2_999 = {7: 24.32, 11: 31.26}


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = counts.sum()
    expected = probs * n
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token of zero probability was emitted"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_chain_rule_emits_target_distribution():
    V, gamma, trials = 8, 3, 60000
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(gamma + 1, V, generator=g) * 1.5, -1)  # target, context-free
    q = torch.softmax(torch.randn(gamma, V, generator=g) * 1.5, -1)  # a different drafter
    p[0, 3] = 0.0  # a token the target never emits but the drafter proposes
    p[0] /= p[0].sum()
    draft = torch.stack([torch.multinomial(q[i], trials, replacement=True, generator=g) for i in range(gamma)], 1)
    n, bonus = chain_accept_sampling(draft, q.expand(trials, -1, -1), p.expand(trials, -1, -1), g)
    out = torch.cat([draft, bonus[:, None]], 1)
    out.scatter_(1, n[:, None], bonus[:, None])
    for pos in range(gamma + 1):
        # Token at output position pos exists when at least pos tokens were accepted before it.
        rows = n >= pos
        counts = torch.bincount(out[rows, pos], minlength=V).double()
        assert chi2(counts, p[pos].double()) < CHI2_999[V - 1], f"position {pos}"
    # A rule that ignores the ratio (always accept) must fail the same test.
    counts = torch.bincount(draft[:, 0], minlength=V).double()
    with pytest.raises(AssertionError):
        assert chi2(counts, p[0].double()) < CHI2_999[V - 1]


def test_greedy_rows_reduce_to_argmax():
    torch.manual_seed(1)
    logits = torch.randn(5, 3, 50)
    bs = BatchSampling.from_params([SamplingParams(temperature=0.0)] * 5, "cpu")
    probs = probs_from_logits(logits, bs)
    assert torch.equal(sample_from_probs(probs, bs.generator), logits.argmax(-1))


def _reference_filter(logits, temperature, top_k, top_p):
    x = logits.double() / temperature
    order = x.argsort(descending=True)
    keep = torch.zeros_like(x, dtype=torch.bool)
    mass = 0.0
    probs = x.softmax(-1)
    for rank, i in enumerate(order.tolist()):
        if top_k and rank >= top_k:
            break
        if mass >= top_p:
            break
        keep[i] = True
        mass += float(probs[i])
    out = torch.where(keep, x, torch.tensor(-math.inf, dtype=x.dtype))
    return out.softmax(-1)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.8), (0.9, 11, 0.5)])
def test_filters_match_reference(temperature, top_k, top_p):
    torch.manual_seed(2)
    logits = torch.randn(3, 97) * 2
    bs = BatchSampling.from_params([SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * 3, "cpu")
    got = probs_from_logits(logits, bs)
    for b in range(3):
        torch.testing.assert_close(
            got[b].double(), _reference_filter(logits[b], temperature, top_k, top_p), rtol=1e-5, atol=1e-6
        )


def test_engine_sampling_matches_target_distribution():
    # A model with a 12-token vocabulary: the second generated token comes from a speculative round, so
    # its marginal must equal sum_t1 p(t1) p(t2 | t1) computed from the target alone.
    V = 12
    target = tiny_model("tiny-llama", seed=7, std=0.3, vocab_size=V)
    draft = tiny_model("tiny-llama", seed=8, std=0.3, vocab_size=V)
    prompt = [3, 5, 7, 2]
    ar = engine(target, max_batch=1)
    p1 = ar.teacher_force_logits(prompt, [0])[0].softmax(-1).double()  # row 0 predicts token 1
    joint = torch.zeros(V, V, dtype=torch.float64)
    for t1 in range(V):
        joint[t1] = p1[t1] * ar.teacher_force_logits(prompt + [t1], [0])[0].softmax(-1).double()
    marginal = joint.sum(0)
    spec = engine(target, draft, gamma=3, max_batch=64)
    counts = torch.zeros(V, dtype=torch.float64)
    for seed in range(40):
        res = spec.generate(
            [prompt] * 64, SamplingParams(max_new_tokens=2, temperature=1.0, seed=seed, ignore_eos=True)
        )
        for r in res:
            counts[r.token_ids[1]] += 1
    assert chi2(counts, marginal) < CHI2_999[V - 1]
