"""Turning logits into tokens: greedy, temperature, top-k, top-p; sampled without host syncs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .host_copy import to_device

try:  # Triton is optional on CPU-only installs: greedy rows then take torch's argmax.
    from ..kernels.greedy import greedy_pick
except ImportError:  # pragma: no cover - exercised only where triton is missing
    greedy_pick = None

# Temperatures below this are greedy (as the server and ``generate`` treat them, and vLLM): logits / 1e-40
# overflow float32 to inf and the probabilities to NaN.
GREEDY_BELOW = 1e-5
MAX_SEED = 2**63 - 1  # OpenAI's int64 seed; torch.Generator.manual_seed itself raises above 2**64 - 1


@dataclass
class SamplingParams:
    """Per-request decoding parameters (OpenAI / vLLM names). ``temperature == 0`` means greedy."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        # Ranges are checked here, where the request is made: a value that fails inside the engine (a seed
        # manual_seed cannot take, a top_k that overflows int64) would fail the prefill it was admitted in.
        t = self.temperature
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if 0 < t < GREEDY_BELOW:
            self.temperature = 0.0
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not _is_int(self.top_k) or not 0 <= self.top_k <= 2**63 - 1:
            raise ValueError(f"top_k must be an integer in 0..2**63-1 (0 disables it), got {self.top_k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed must be an integer in 0..2**63-1, got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass
class BatchSampling:
    """Sampling parameters of a batch as device tensors [B] (built once per batch, on the host)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    all_greedy: bool
    needs_filter: bool
    generator: torch.Generator | None

    @classmethod
    def from_params(
        cls, params: list[SamplingParams], device, generator: torch.Generator | None = None
    ) -> BatchSampling:
        """``generator``: the one to draw from (a ``RowBatch`` keeps one for its life); None makes one,
        seeded by the first seed in ``params`` (else at random)."""
        gen = generator
        if gen is None:
            seed = next((p.seed for p in params if p.seed is not None), None)
            gen = torch.Generator(device=device)
            gen.manual_seed(seed if seed is not None else torch.seed())
        return cls(
            temperature=to_device([p.temperature for p in params], device, torch.float32),
            top_k=to_device([p.top_k for p in params], device, torch.int64),
            top_p=to_device([p.top_p for p in params], device, torch.float32),
            all_greedy=all(p.greedy for p in params),
            needs_filter=any(p.top_k > 0 or p.top_p < 1 for p in params),
            generator=gen,
        )


def probs_from_logits(logits: torch.Tensor, bs: BatchSampling) -> torch.Tensor:
    """logits [B, ..., V] -> probabilities [B, ..., V] in float32 after temperature, top-k and top-p.

    Greedy rows (temperature 0) become one-hot at the argmax, so the speculative sampling rule applied to
    them reduces exactly to greedy acceptance.
    """
    B, V = logits.shape[0], logits.shape[-1]
    view = (B,) + (1,) * (logits.dim() - 1)
    x = logits.float()
    greedy = (bs.temperature == 0).view(view)
    x = x / torch.where(greedy, torch.ones_like(bs.temperature.view(view)), bs.temperature.view(view))
    if bs.needs_filter:
        sorted_x, order = x.sort(dim=-1, descending=True)
        rank = torch.arange(V, device=x.device)
        k = torch.where(bs.top_k > 0, bs.top_k, V).view(view)
        p = sorted_x.softmax(-1)
        # Not in place: ``rank >= k`` is [B, 1.., V] and cannot hold the [B, N, V] result of a verify block.
        drop = (rank >= k) | ((p.cumsum(-1) - p) > bs.top_p.view(view))  # smallest prefix reaching top_p
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.empty_like(x).scatter_(-1, order, sorted_x)
    probs = x.softmax(-1)
    one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.where(greedy, one_hot, probs)


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row [..., V] -> [...]: argmax of p / E with E ~ Exp(1) (no host sync)."""
    e = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / e).argmax(-1)


def next_tokens(logits: torch.Tensor, bs: BatchSampling) -> torch.Tensor:
    if bs.all_greedy:
        return logits.argmax(-1)
    return sample_from_probs(probs_from_logits(logits, bs), bs.generator)


def greedy_rows(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, ..., V] -> (argmax [B, ...], non-finite [B] bool): a greedy round's tokens and its per-row
    flag (``nonfinite_rows``). On CUDA one pass of ``kernels/greedy.py`` reads the logits once for both;
    elsewhere torch's argmax and ``nonfinite_rows``. Finite rows get torch's argmax exactly (ties to the
    smallest index); a flagged row's tokens are never used."""
    if greedy_pick is None or not logits.is_cuda:
        return logits.argmax(-1), nonfinite_rows(logits)
    tok, bad = greedy_pick(logits)
    return tok, bad.flatten(1).any(-1) if bad.dim() > 1 else bad


def nonfinite_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [B, ..., V] -> [B] bool: whether any of a row's logits is NaN or inf.

    Tensor ops only (no host read): a round computes it on the device and returns it in its packed result,
    which the host reads once per round anyway.
    """
    return ~torch.isfinite(logits).flatten(1).all(-1)
