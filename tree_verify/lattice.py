"""The drafter's candidates: a lattice of parent-aware expansions, from which a draft tree is chosen.

An EAGLE-2-like drafter grows candidates step by step: it picks a node already in the lattice (or the root,
the last committed token), runs the draft model on it and records the top-k children with their
log-probs *given that node*. Each such step is one **expansion**. Candidate nodes are numbered by the
expansion that produced them: child ``j`` of expansion ``e`` is candidate ``c = e * k + j``. An expansion's
parent is a candidate id, or -1 for the root, and must come from an earlier expansion, so the numbering is
already topological.

All tensors may carry a leading batch dimension B (one lattice per request, same E and k for all); the
functions in this package keep it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Lattice:
    """Candidate children per expanded node.

    Attributes
    ----------
    parents : [E] or [B, E] int64
        Candidate id of the node each expansion expands (``e' * k + j``, ``e' < e``), -1 for the root.
    tokens : [E, k] or [B, E, k] int64
        The k child tokens of each expansion.
    logprobs : [E, k] or [B, E, k] float
        Draft log-prob of each child given its parent; each must be <= 0 (a probability), which makes path
        scores non-increasing along a path and the best-first selection prefix-closed.
    """

    parents: torch.Tensor
    tokens: torch.Tensor
    logprobs: torch.Tensor
    check: bool = True
    # Path scores and depths of every candidate ([B, E * k] each), when the drafter already has them
    # (the engine's expansion sums them as it goes): ``candidate_scores`` then costs no kernels, instead
    # of a pass over the E expansions (about 330 small kernels per round at depth 6, top-k 8).
    scores: torch.Tensor | None = None
    depths: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # The value checks cost a host sync, so the engine's rounds, which build lattices by
        # construction (top-k log-probs, earlier parents), pass ``check=False``; the shapes are always
        # checked. The checks guard the prefix-closure argument in best_first.
        if self.tokens.shape != self.logprobs.shape or self.tokens.shape[:-1] != self.parents.shape:
            raise ValueError(
                f"shape mismatch: parents {tuple(self.parents.shape)}, tokens {tuple(self.tokens.shape)}, "
                f"logprobs {tuple(self.logprobs.shape)}"
            )
        if self.tokens.dim() not in (2, 3):
            raise ValueError(f"tokens must be [E, k] or [B, E, k], got {tuple(self.tokens.shape)}")
        if not self.check:
            return
        k = self.tokens.shape[-1]
        first_child_of_e = torch.arange(self.parents.shape[-1], device=self.parents.device) * k
        if bool(((self.parents < -1) | (self.parents >= first_child_of_e)).any()):
            raise ValueError("each expansion's parent must be -1 or a candidate of an earlier expansion")
        if bool((torch.isnan(self.logprobs) | (self.logprobs > 0)).any()):
            raise ValueError("logprobs must be <= 0 and not NaN")

    @property
    def batched(self) -> bool:
        return self.tokens.dim() == 3

    @property
    def num_expansions(self) -> int:
        return self.tokens.shape[-2]

    @property
    def topk(self) -> int:
        return self.tokens.shape[-1]

    @classmethod
    def from_expansions(cls, expansions: list[tuple[int, torch.Tensor, torch.Tensor]]) -> Lattice:
        """One request's lattice from a list of ``(parent candidate id, tokens [k], logprobs [k])``."""
        if not expansions:
            raise ValueError("a lattice needs at least one expansion (the root's)")
        parents = torch.tensor([p for p, _, _ in expansions], dtype=torch.long)
        tokens = torch.stack([torch.as_tensor(t, dtype=torch.long) for _, t, _ in expansions])
        logprobs = torch.stack([torch.as_tensor(lp) for _, _, lp in expansions])
        return cls(parents, tokens, logprobs)

    def candidate_parents(self) -> torch.Tensor:
        """Parent candidate id of every candidate: [E * k] or [B, E * k] int64, -1 for the root's children."""
        return self.parents.repeat_interleave(self.topk, dim=-1)

    def candidate_scores(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Path score and depth of every candidate.

        Returns
        -------
        scores : [E * k] or [B, E * k] float, sum of the edge log-probs from the root to the candidate
        depths : [E * k] or [B, E * k] int64, 1 for the root's children
        """
        if self.scores is not None and self.depths is not None:
            return self.scores, self.depths
        lp = self.logprobs if self.batched else self.logprobs[None]
        par = self.parents if self.batched else self.parents[None]
        B, E, k = lp.shape
        scores = torch.zeros(B, E * k, dtype=lp.dtype, device=lp.device)
        depths = torch.zeros(B, E * k, dtype=torch.long, device=lp.device)
        # Expansions are topological, so one pass in order sees each parent's score before its children.
        for e in range(E):
            p = par[:, e]
            is_root = p < 0
            pidx = p.clamp(min=0)[:, None]
            base = torch.where(is_root, 0.0, scores.gather(1, pidx)[:, 0])
            base_depth = torch.where(is_root, 0, depths.gather(1, pidx)[:, 0])
            scores[:, e * k : (e + 1) * k] = base[:, None] + lp[:, e]
            depths[:, e * k : (e + 1) * k] = base_depth[:, None] + 1
        if not self.batched:
            return scores[0], depths[0]
        return scores, depths
