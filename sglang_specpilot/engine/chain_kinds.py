"""Chain kinds: greedy chains a tree engine's batch may run instead of its tree, where they promise more
tokens per millisecond (``EngineOptions.chain_depths``).

Why. At wide batches a tree's extra verify rows and its drafter's top-k frontier cost more than the tokens
they add. On the H200 (lifted 8B, 2bcb6d1, batched_h200.json) the batch's tree at 16 rows took 8.06 ms and
emitted 2.81 tokens a row, stock's chain of 3 took 5.99 ms for 2.22: 0.349 against 0.371 tokens a row per
ms, and at 32 rows 0.292 against 0.321; the mechanisms served 0.94x stock at both. A chain is a tree of
top-k 1 (the same ``Round`` with another ``RoundShape``), so it is one more round kind, keyed ``"chainD"``,
captured at every bucket and timed in the step curve like the others.

Counterfactuals. A tree round tells what a chain of depth d would have accepted: the chain drafts the
drafter's top-1 child at every depth, which in the lattice is child rank 0 (``candidate % top_k``). If the
tree's accepted path left the top-1 line after g nodes (its node g + 1 is a lower-ranked child, so the
target's token there is not the drafter's argmax), the chain accepts exactly min(g, d). If every accepted
node was a top-1 child (g = n), the chain accepts at least min(n, d): exact where the tree held the top-1
child the target rejected, a lower bound where the budget left it out. The round writes g beside its
tokens (``Round.greedy_col``); a chain round of depth D gives min(a, d) exactly for every d <= D.

Choice. The policy's tree kind (after adaptive depth and width) against each chain kind: the most estimated
tokens over the step curve's ms at the bucket (``estimates.most_per_ms``; means over the rows that have
estimates, ``estimates.known_mean``), where every candidate has an estimate and a curve point; else the
tree. Chain rounds say nothing about the tree, so after ``probe_every`` chain rounds in a row the tree runs
once and refreshes its estimates.
"""

from __future__ import annotations

from .acceptance import ALPHA
from .estimates import RowEstimates

PREFIX = "chain"


def chain_key(depth: int) -> str:
    return f"{PREFIX}{depth}"


def chain_depth(key) -> int | None:
    """The depth of a chain kind's key, None for any other key."""
    if isinstance(key, str) and key.startswith(PREFIX):
        return int(key[len(PREFIX) :])
    return None


def greedy_run(child_ranks: list[int], n: int) -> int:
    """Leading accepted nodes that were their parent's top-1 child (rank 0), of the first ``n``: the
    reference of what a tree round computes on the device (``Round.verify``)."""
    g = 0
    for r in child_ranks[:n]:
        if r != 0:
            break
        g += 1
    return g


class ChainEstimates(RowEstimates):
    """Per row and chain depth d, an EMA of the tokens a chain of depth d would have emitted."""

    def __init__(self, rows: int, depths: tuple[int, ...], alpha: float = ALPHA):
        super().__init__(rows, alpha)
        self.depths = depths

    def observe_tree(self, row: int, greedy: int, accepted: int, depth: int) -> None:
        """A tree round of ``depth`` that accepted ``accepted`` drafts, the first ``greedy`` of them top-1
        children (``Round.greedy_col``). Where the path left the top-1 line (greedy < accepted) a chain of any
        depth d accepts min(greedy, d); where it did not, that is a lower bound, kept only for d up to the
        tree's depth (a deeper chain would draft past everything the tree could show)."""
        for d in self.depths:
            if greedy < accepted or d <= depth:
                self.update(row, d, min(greedy, d) + 1)

    def observe_chain(self, row: int, accepted: int, depth: int) -> None:
        """A chain round of ``depth`` accepted ``accepted`` drafts: exact for every chain up to ``depth``."""
        for d in self.depths:
            if d <= depth:
                self.update(row, d, min(accepted, d) + 1)

    def tau(self, rows: list[int], depth: int) -> float | None:
        return self.mean(rows, depth)
