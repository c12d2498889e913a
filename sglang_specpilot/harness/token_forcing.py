"""Token forcing: score a system's generated tokens with the stock target and flag disagreements.

The system's tokens are fed back through the stock target (teacher forcing); wherever the system's
token is not the target's argmax, the position is a mismatch. After the first divergence the system's
continuation is still scored as it is, on the system's own prefix: every later position asks again
"would stock, given exactly this prefix, have chosen this token?".

Stock itself mismatches at a small rate (SpecPilot measured 0.72%), almost all near-ties that kernel
rounding tips one way or the other; so a system is judged against stock's own report on the same
prompts, not against zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .jsonable import JsonMixin
from .stats import rate_difference_interval, wilson_interval

ScoreFn = Callable[[list[int], list[int]], torch.Tensor]

# A mismatch whose token trails the argmax by more than this many logits is "large-margin": no
# rounding difference explains it. 0.5 is four bf16 ulps at logit magnitudes 16-32 (ulp 0.125), above
# the few-ulp differences that reordered reductions produce, and well below the gap of a confident
# prediction (several logits).
DEFAULT_MARGIN_EPS = 0.5
DEFAULT_MAX_EXCESS = 0.005  # SpecPilot: reject above stock's rate + 0.5 points at 95% confidence


@dataclass
class Mismatch(JsonMixin):
    """One position where the system's token is not the stock target's argmax.

    ``top_margin`` is the target's top-1 minus top-2 logit there; ``token_margin`` is the argmax's
    logit minus the system token's logit (>= ``top_margin``); ``large`` is ``token_margin > eps``;
    ``top_logit`` the argmax's logit (its magnitude sets the size of a rounding step, ``bf16_ulps``).
    """

    sequence: int
    position: int
    token: int
    argmax: int
    top_margin: float
    token_margin: float
    large: bool
    top_logit: float | None = None


def bf16_ulps(margin: float, logit: float) -> float:
    """``margin`` in bf16 rounding steps at the magnitude of ``logit`` (8 significant bits: a step of
    2^(e - 7) for |logit| in [2^e, 2^(e + 1)))."""
    mag = abs(logit)
    if mag == 0:
        return float("inf") if margin else 0.0
    return margin / 2.0 ** (math.floor(math.log2(mag)) - 7)


@dataclass
class ForcingReport(JsonMixin):
    """Mismatch statistics of one system over a set of generations.

    ``rate_low`` / ``rate_high`` are the Wilson interval of ``rate`` at ``confidence``;
    ``large_margin`` counts mismatches with ``token_margin > eps``.
    """

    tokens: int
    mismatches: int
    rate: float
    rate_low: float
    rate_high: float
    confidence: float
    large_margin: int
    eps: float
    details: list[Mismatch] = field(default_factory=list)


def token_forcing(
    score_fn: ScoreFn,
    generations: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    eps: float = DEFAULT_MARGIN_EPS,
    confidence: float = 0.95,
) -> ForcingReport:
    """Score generations with the stock target and flag every position that is not its argmax.

    Parameters
    ----------
    score_fn : callable ``(prompt_ids, generated_ids) -> Tensor [len(generated_ids), vocab]``
        The stock engine's teacher-forced logits: row t is the target's logits for the token at
        position t of ``generated_ids``, given the prompt and ``generated_ids[:t]``.
    generations : sequence of (prompt_ids, generated_ids)
        The system's outputs, one pair per request.
    eps : float
        Logit margin above which a mismatch counts as large.
    confidence : float
        Coverage of the Wilson interval of the mismatch rate.

    Returns
    -------
    ForcingReport
        An exact tie between the system's token and the maximum logit counts as a match, since which
        of two tied tokens an argmax returns is an implementation detail.
    """
    details: list[Mismatch] = []
    tokens = 0
    for seq, (prompt, generated) in enumerate(generations):
        prompt, generated = list(prompt), list(generated)
        if not generated:
            continue
        logits = score_fn(prompt, generated).detach().to(device="cpu", dtype=torch.float64)
        if logits.dim() != 2 or logits.shape[0] != len(generated) or logits.shape[1] < 2:
            raise ValueError(f"score_fn returned shape {tuple(logits.shape)} for {len(generated)} tokens")
        ids = torch.tensor(generated, dtype=torch.long)
        top = logits.topk(2, dim=-1)
        token_logit = logits.gather(1, ids[:, None])[:, 0]
        token_margin = top.values[:, 0] - token_logit
        for t in torch.nonzero(token_margin > 0).flatten().tolist():
            details.append(
                Mismatch(
                    sequence=seq,
                    position=t,
                    token=generated[t],
                    argmax=int(top.indices[t, 0]),
                    top_margin=float(top.values[t, 0] - top.values[t, 1]),
                    token_margin=float(token_margin[t]),
                    large=bool(token_margin[t] > eps),
                    top_logit=float(top.values[t, 0]),
                )
            )
        tokens += len(generated)
    low, high = wilson_interval(len(details), tokens, confidence)
    return ForcingReport(
        tokens=tokens,
        mismatches=len(details),
        rate=len(details) / tokens if tokens else 0.0,
        rate_low=low,
        rate_high=high,
        confidence=confidence,
        large_margin=sum(m.large for m in details),
        eps=eps,
        details=details,
    )


@dataclass
class ForcingVerdict(JsonMixin):
    """Outcome of ``compare_forcing``: a system's mismatches against stock's on the same prompts."""

    accepted: bool
    excess: float
    excess_low: float
    excess_high: float
    max_excess: float
    confidence: float
    system_rate: float
    stock_rate: float
    system_large_margin: int
    stock_large_margin: int
    reasons: list[str]


def compare_forcing(
    system: ForcingReport,
    stock: ForcingReport,
    *,
    max_excess: float = DEFAULT_MAX_EXCESS,
    confidence: float = 0.95,
) -> ForcingVerdict:
    """Reject a system whose token-forcing report is worse than stock's.

    Rejected if (a) its mismatch rate exceeds stock's by more than ``max_excess`` at ``confidence``:
    the lower end of Newcombe's interval for ``rate(system) - rate(stock)`` is above ``max_excess``;
    or (b) it has more large-margin (unexplained) mismatches than stock. Both reports must come from
    the same prompts and the same ``eps``.

    Parameters
    ----------
    system, stock : ForcingReport
        ``token_forcing`` of the system's and of stock's generations.
    max_excess : float
        Allowed excess mismatch rate, 0.005 = 0.5 points.
    confidence : float

    Returns
    -------
    ForcingVerdict
    """
    if system.eps != stock.eps:
        raise ValueError(f"reports use different eps: {system.eps} vs {stock.eps}")
    d, low, high = rate_difference_interval(
        system.mismatches, system.tokens, stock.mismatches, stock.tokens, confidence
    )
    reasons = []
    if low > max_excess:
        reasons.append(
            f"mismatch rate {system.rate:.4%} exceeds stock's {stock.rate:.4%} by {d:.4%} "
            f"(lower bound {low:.4%} > {max_excess:.2%})"
        )
    if system.large_margin > stock.large_margin:
        reasons.append(
            f"{system.large_margin} large-margin mismatches (margin > {system.eps}) vs stock's {stock.large_margin}"
        )
    return ForcingVerdict(
        accepted=not reasons,
        excess=d,
        excess_low=low,
        excess_high=high,
        max_excess=max_excess,
        confidence=confidence,
        system_rate=system.rate,
        stock_rate=stock.rate,
        system_large_margin=system.large_margin,
        stock_large_margin=stock.large_margin,
        reasons=reasons,
    )
