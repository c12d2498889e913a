import json

import numpy as np
import pytest
import torch

from sglang_specpilot.harness.token_forcing import compare_forcing, token_forcing

VOCAB = 97
TIE_GAP = 0.05  # logit gap of the planted near-ties, far below the default eps of 0.5


def _table(seed: int = 0) -> torch.Tensor:
    """Fixed logits indexed by the previous token; one row in ten is a near-tie of its top two."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(VOCAB, VOCAB, generator=gen, dtype=torch.float64) * 3
    top = table.topk(2, dim=-1)
    for row in range(0, VOCAB, 10):
        table[row, top.indices[row, 1]] = top.values[row, 0] - TIE_GAP
    return table


TABLE = _table()


def score_fn(prompt_ids: list[int], generated_ids: list[int]) -> torch.Tensor:
    # Row t predicts generated_ids[t] from the token before it (a bigram "model").
    prev = torch.tensor([prompt_ids[-1], *generated_ids[:-1]])
    return TABLE[prev]


def generate(prompt, steps, *, rounding=0.0, flip=None, seed=0):
    """Greedy decoding over the table; ``rounding`` perturbs logits like kernel rounding does, and
    ``flip(t, logits)`` may replace the argmax at step t by another token (a lossy system)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        logits = TABLE[(prompt + out)[-1]].numpy() + rng.normal(0, rounding, VOCAB)
        token = int(np.argmax(logits))
        if flip is not None:
            token = flip(t, logits, token)
        out.append(token)
    return out


PROMPTS = [[p] for p in range(40)]
STEPS = 100


def _report(**kwargs):
    gens = [(p, generate(p, STEPS, seed=i, **kwargs)) for i, p in enumerate(PROMPTS)]
    return token_forcing(score_fn, gens), gens


@pytest.fixture(scope="module")
def stock_run():
    return _report(rounding=0.02)


def test_stock_against_itself_passes(stock_run):
    stock, _ = stock_run
    # Rounding tips a few near-ties, exactly as stock's own 0.72% in SpecPilot; none is large.
    assert 0 < stock.mismatches and stock.large_margin == 0
    assert all(m.token_margin <= TIE_GAP + 1e-9 for m in stock.details)
    again, _ = _report(rounding=0.02)
    verdict = compare_forcing(again, stock)
    assert verdict.accepted, verdict.reasons


def test_flags_a_system_that_changes_two_percent_of_tokens(stock_run):
    stock, _ = stock_run
    rng = np.random.default_rng(1)
    total = len(PROMPTS) * STEPS
    changed = {divmod(c, STEPS) for c in rng.choice(total, size=total // 50, replace=False).tolist()}
    gens = []
    for i, p in enumerate(PROMPTS):

        def third_best(t, logits, token, i=i):
            return int(np.argsort(logits)[-3]) if (i, t) in changed else token

        gens.append((p, generate(p, STEPS, rounding=0.02, flip=third_best, seed=i)))
    system = token_forcing(score_fn, gens)
    # Every planted change is flagged at its position (teacher forcing keeps scoring after it), on top
    # of the near-tie flips that stock makes too.
    assert changed <= {(m.sequence, m.position) for m in system.details}
    assert system.rate == pytest.approx(stock.rate + 0.02, abs=0.005)
    assert system.rate_low < system.rate < system.rate_high
    verdict = compare_forcing(system, stock)
    assert not verdict.accepted
    assert verdict.excess_low > 0.005 and len(verdict.reasons) == 2
    doc = json.loads(verdict.to_json())
    assert doc["accepted"] is False and doc["system_large_margin"] > doc["stock_large_margin"]


def test_near_tie_flips_are_explained_but_a_high_rate_is_not(stock_run):
    stock, _ = stock_run
    # Always take the runner-up at the planted near-ties: many mismatches, none with a large margin.
    gens = []
    for p in PROMPTS:
        out = []
        for _ in range(STEPS):
            top = TABLE[(p + out)[-1]].topk(2)
            gap = float(top.values[0] - top.values[1])
            out.append(int(top.indices[1] if gap <= TIE_GAP + 1e-9 else top.indices[0]))
        gens.append((p, out))
    system = token_forcing(score_fn, gens)
    assert system.large_margin == 0 and system.rate > 0.05
    verdict = compare_forcing(system, stock)
    assert not verdict.accepted and len(verdict.reasons) == 1 and "mismatch rate" in verdict.reasons[0]


def test_a_few_large_margin_mismatches_reject_even_at_a_low_rate(stock_run):
    stock, gens = stock_run
    prompt, out = gens[0]
    out = list(out)
    out[10] = int(TABLE[out[9]].argmin())  # one wildly wrong token
    system = token_forcing(score_fn, [(prompt, out), *gens[1:]])
    verdict = compare_forcing(system, stock)
    assert verdict.excess_low < 0.005  # the rate alone would pass
    assert not verdict.accepted and "large-margin" in verdict.reasons[0]
    mismatch = next(m for m in system.details if (m.sequence, m.position) == (0, 10))
    assert mismatch.large and mismatch.token_margin > mismatch.top_margin > 0


def test_score_fn_shape_is_checked():
    with pytest.raises(ValueError):
        token_forcing(lambda p, g: torch.zeros(len(g) + 1, VOCAB), [([1], [2, 3])])


def test_bf16_ulps_counts_rounding_steps_at_the_logit_magnitude():
    from sglang_specpilot.harness.token_forcing import bf16_ulps

    assert bf16_ulps(0.125, 16.0) == 1.0 and bf16_ulps(0.125, 31.9) == 1.0  # [16, 32): step 0.125
    assert bf16_ulps(0.625, 20.0) == 5.0 and bf16_ulps(0.625, 40.0) == 2.5  # [32, 64): step 0.25
    assert bf16_ulps(0.625, -20.0) == 5.0 and bf16_ulps(0.0, 0.0) == 0.0
