"""Acceptance rules of chain speculative decoding (batched, on the device, no host syncs).

Greedy: accept draft token d_i while it equals the target's argmax at the previous position; the bonus
is the target's argmax after the last accepted token. Sampling (Leviathan et al. / Chen et al.): accept
d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw from
norm(max(p_i - q_i, 0)); if all gamma are accepted draw the bonus from p_gamma. The emitted tokens are
then distributed exactly as the target's (filtered) distribution.
"""

from __future__ import annotations

import torch


def accepted_length(accept: torch.Tensor) -> torch.Tensor:
    """accept [B, gamma] bool -> number of leading True per row [B] int64."""
    return accept.long().cumprod(dim=1).sum(dim=1)


def chain_accept_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_tokens [B, gamma]; target_logits [B, gamma + 1, V] -> (n_accepted [B], bonus [B])."""
    target = target_logits.argmax(-1)
    n = accepted_length(target[:, :-1] == draft_tokens)
    return n, target.gather(1, n[:, None]).squeeze(1)


def chain_accept_sampling(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_tokens [B, gamma]; draft_probs [B, gamma, V]; target_probs [B, gamma + 1, V].

    Returns (n_accepted [B], bonus [B]).
    """
    B, gamma = draft_tokens.shape
    idx = draft_tokens[..., None]
    p = target_probs[:, :gamma].gather(2, idx).squeeze(2)
    q = draft_probs.gather(2, idx).squeeze(2)
    u = torch.rand(B, gamma, device=p.device, generator=generator)
    n = accepted_length(u * q < p)  # u < p / q without dividing by a zero q
    q_ext = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], dim=1)
    rows = n[:, None, None].expand(B, 1, target_probs.shape[-1])
    p_n = target_probs.gather(1, rows).squeeze(1)
    residual = (p_n - q_ext.gather(1, rows).squeeze(1)).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    # mass is 0 only when p_n == q_n, where rejection has probability 0; guard rounding anyway.
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_n)
    e = torch.empty_like(residual).exponential_(1, generator=generator)
    return n, (residual / e).argmax(-1)
