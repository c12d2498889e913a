"""Static facts about one operation of a round: what the legality checker and the proposers reason over.

Built from executable chains (``segments.Chain.catalog``) or written by hand for a synthetic search
problem; it holds no tensors, so a catalog is cheap to copy and to store as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpInfo:
    """model: "target" / "draft"; segment: index in its model's chain; position: index in the segment;
    deps: positions of earlier ops of the same segment it reads from; work: FLOPs (GEMM) or bytes moved
    (row ops), the base of interleaving proportions; shape: output shape; elem_bytes: element size."""

    model: str
    segment: int
    position: int
    family: str
    deps: tuple[int, ...] = ()
    work: float = 0.0
    shape: tuple[int, ...] = ()
    elem_bytes: int = 2

    def out_bytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.elem_bytes


def member_proportions(catalog: dict[str, OpInfo], members) -> dict[str, float]:
    """pi_k = F_k / sum_j F_j over a group's members (Conjugate Compilation, eq. 5)."""
    total = sum(catalog[m].work for m in members)
    if total <= 0:
        return {m: 1.0 / len(members) for m in members}
    return {m: catalog[m].work / total for m in members}
