"""Prompt-lookup drafting: matches a brute-force search, and spec decoding with it stays lossless."""

import random

import pytest
import torch
from helpers import WordTokenizer, engine, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.ngram import ngram_draft


def brute_force(seq: list[int], n_max: int, gamma: int) -> list[int] | None:
    L = len(seq)
    for n in range(n_max, 0, -1):
        if L <= n:
            continue
        for p in range(L - n - 1, -1, -1):
            if seq[p : p + n] == seq[L - n :]:
                return seq[p + n : p + n + gamma]
    return None


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force(seed):
    rng = random.Random(seed)
    B, width, gamma, n_max = 5, 40, 4, 3
    history = torch.tensor([[rng.randrange(4) for _ in range(width)] for _ in range(B)])
    seq_len = torch.tensor([rng.randrange(0, width - 8) for _ in range(B)])
    next_tok = torch.tensor([rng.randrange(4) for _ in range(B)])
    drafts = ngram_draft(history.clone(), seq_len, next_tok, n_max, gamma)
    for b in range(B):
        seq = history[b, : seq_len[b]].tolist() + [int(next_tok[b])]
        want = brute_force(seq, n_max, gamma)
        if want is None:
            assert drafts[b].tolist() == [int(next_tok[b])] * gamma
        else:  # the in-sequence part must agree; slots past the sequence end are stale by design
            assert drafts[b, : len(want)].tolist() == want


def test_ngram_spec_is_lossless_greedy_and_accepts_repeats():
    target = tiny_model("tiny-llama")
    # Repetitive prompts give the lookup something to find.
    ps = [p * 4 for p in prompts([5, 3, 7], target.cfg.vocab_size, seed=11)]
    p = SamplingParams(max_new_tokens=40, ignore_eos=True)
    ar = [r.token_ids for r in engine(target).generate(ps, p)]
    opts = EngineOptions(
        max_seq_len=256, max_batch_size=8, num_speculative_tokens=4, ngram_size=3, device="cpu", dtype="float32"
    )
    res = Engine(target, WordTokenizer(), opts).generate(ps, p)
    assert [r.token_ids for r in res] == ar
    assert all(r.mean_accepted >= 1.0 for r in res)


def test_ngram_spec_sampling_distribution():
    from test_spec_sampling import CHI2_999, chi2

    V = 12
    target = tiny_model("tiny-llama", seed=7, std=0.3, vocab_size=V)
    prompt = [3, 5, 7, 3, 5]  # ends in "3 5": the lookup proposes 7, so drafts are exercised
    ar = engine(target, max_batch=1)
    p1 = ar.teacher_force_logits(prompt, [0])[0].softmax(-1).double()
    marginal = sum(p1[t] * ar.teacher_force_logits(prompt + [t], [0])[0].softmax(-1).double() for t in range(V))
    opts = EngineOptions(
        max_seq_len=64, max_batch_size=64, num_speculative_tokens=3, ngram_size=2, device="cpu", dtype="float32"
    )
    spec = Engine(target, WordTokenizer(), opts)
    counts = torch.zeros(V, dtype=torch.float64)
    for seed in range(40):
        for r in spec.generate(
            [prompt] * 64, SamplingParams(max_new_tokens=2, temperature=1.0, seed=seed, ignore_eos=True)
        ):
            counts[r.token_ids[1]] += 1
    assert chi2(counts, marginal) < CHI2_999[V - 1]
