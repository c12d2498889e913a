"""tree_verify: draft lattices, best-first draft trees, their masks and positions, and acceptance.

A library used by the engine, the SGLang plugin and the controller; pure torch, no engine imports.
"""

from tree_verify.accept import GreedyAccept, accept_greedy, accept_greedy_batched, accept_sampling
from tree_verify.accept_batched import accept_sampling_batched, children_table
from tree_verify.best_first import (
    DraftTree,
    ancestor_mask,
    best_first,
    best_first_per_depth,
    chain,
    positions,
)
from tree_verify.lattice import Lattice

__all__ = [
    "DraftTree",
    "GreedyAccept",
    "Lattice",
    "accept_greedy",
    "accept_greedy_batched",
    "accept_sampling",
    "accept_sampling_batched",
    "ancestor_mask",
    "best_first",
    "best_first_per_depth",
    "chain",
    "children_table",
    "positions",
]
