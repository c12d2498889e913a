"""Prompt-lookup (n-gram) drafting: propose the tokens that followed the last earlier occurrence of the
sequence's final n tokens. No model; batched tensor ops on the device, no host sync.

Draft quality never affects the output: verification accepts only what the target itself would emit.
As a proposal distribution the drafter is deterministic (one-hot), which the speculative sampling rule
handles exactly (accept with probability p(d); on rejection sample p with d removed).
"""

from __future__ import annotations

import torch


def ngram_draft(
    history: torch.Tensor, seq_len: torch.Tensor, next_tok: torch.Tensor, n_max: int, gamma: int
) -> torch.Tensor:
    """Draft ``gamma`` tokens per row [B, gamma].

    The row's sequence is ``history[b, :seq_len[b]]`` followed by ``next_tok[b]`` (length L). For n from
    ``n_max`` down to 1, the latest start p with ``seq[p : p + n] == seq[L - n : L]`` and p + n < L gives
    the draft ``seq[p + n : p + n + gamma]``; the longest n with a match wins. Slots past L - 1 hold stale
    tokens: such drafts are merely unlikely to be accepted. Rows without any match draft ``next_tok``.
    ``history`` is updated in place at ``seq_len`` with ``next_tok`` (verification writes it there too).
    """
    B, width = history.shape
    dev = history.device
    history.scatter_(1, seq_len[:, None], next_tok[:, None])
    L = seq_len + 1
    ar = torch.arange(gamma, device=dev)
    start = torch.full((B,), -1, dtype=torch.long, device=dev)
    for n in range(n_max, 0, -1):
        windows = history.unfold(1, n, 1)  # [B, width - n + 1, n]
        tail = history.gather(1, (L[:, None] - n + torch.arange(n, device=dev)).clamp_min(0))  # [B, n]
        pos = torch.arange(windows.shape[1], device=dev)
        hit = (windows == tail[:, None, :]).all(-1) & (pos[None, :] + n < L[:, None]) & (L[:, None] > n)
        best = torch.where(hit, pos[None, :], -1).amax(1)
        found = (start < 0) & (best >= 0)
        start = torch.where(found, best + n, start)
    idx = (start[:, None] + ar).clamp(0, width - 1)
    drafts = history.gather(1, idx)
    return torch.where((start >= 0)[:, None], drafts, next_tok[:, None].expand(B, gamma))
