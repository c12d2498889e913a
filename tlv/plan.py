"""The shape of one TLV round: how the exact pass's node budget splits, and what the round touches.

Nodes of the exact pass (after the root, the last emitted token):

    trunk     the Q chain c_1 .. c_L                                   L nodes, depths 1 .. L
    hanging   the drafter's best-first tree drafted from c_L           N_h nodes, depths L + 1 .. L + D
    root      optionally the drafter's own tree drafted from the root  N_r nodes, depths 1 .. D

The drafter expands one lattice of depth D and top-k K per tree (a chain is K = 1, N = D).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TLVPlan:
    chain_len: int
    depth: int
    top_k: int
    hang_budget: int
    root_budget: int = 0

    def __post_init__(self) -> None:
        if self.chain_len < 1:
            raise ValueError(f"tlv_chain_len must be >= 1, got {self.chain_len}")
        if self.depth < 1 or self.top_k < 1:
            raise ValueError(f"the drafter's lattice needs depth >= 1 and top_k >= 1, got {self.depth}, {self.top_k}")
        c = self.candidates
        if not 1 <= self.hang_budget <= c:
            raise ValueError(f"tlv_hang_budget must be in 1..{c} (the drafter's lattice), got {self.hang_budget}")
        if not 0 <= self.root_budget <= c:
            raise ValueError(f"tlv_root_budget must be in 0..{c} (the drafter's lattice), got {self.root_budget}")

    @property
    def expansions(self) -> int:
        """Draft forwards' nodes of one lattice: the root, then top_k frontier nodes per depth 1..D-1."""
        return 1 + (self.depth - 1) * self.top_k

    @property
    def candidates(self) -> int:
        return self.expansions * self.top_k

    @property
    def budget(self) -> int:
        """Nodes the exact pass verifies (the root not counted)."""
        return self.chain_len + self.hang_budget + self.root_budget

    @property
    def max_depth(self) -> int:
        """Deepest node of the combined tree: the longest path acceptance can walk."""
        hang = min(self.depth, self.hang_budget)  # a best-first tree of N nodes is at most N deep
        root = min(self.depth, self.root_budget)
        return max(self.chain_len + hang, root)

    @property
    def max_children(self) -> int:
        """A bound on any node's children (a static loop bound of sampled acceptance): the root has the
        trunk's first node plus the root tree's children; every other node at most top_k."""
        return max(self.top_k, 1 + (self.top_k if self.root_budget else 0))

    @property
    def reach(self) -> int:
        """Cache slots past a row's length that one round may write, +1 like ``RoundShape.reach``.

        The exact block (root + budget); the Q chain (slots 0 .. L - 1 past the length); the drafter's
        window over the last round's accepted tokens and the chain (up to max_depth + L + 1); the
        hanging lattice's expansions (past the chain's end); the root lattice's expansions.
        """
        L, E = self.chain_len, self.expansions
        return max(self.budget + 1, self.max_depth + L + 1, L + E + 1, E) + 1
