"""The built-in proposer's search: successive halving over the round's legal edits.

Why successive halving and not MCTS: each round's candidates are one-edit neighbours of the current best
(tens of them), every one directly runnable, and the scarce resource is timing blocks. Successive halving is
the budgeted best-arm rule for exactly that: a short paired screen of every candidate, then the better half
again with twice the blocks, until the survivors get the full-length run the gate decides on. Depth (edit
after edit) comes from the rounds, each starting from the promoted best, so there is no tree to search;
MCTS stays where the space is deep, the co-location plan search (``mcts.py``).
The screen rungs only rank; only the full-length run (20+ blocks, where the interval has its coverage,
harness/stats.py) is judged by the gate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .option_space import FALLBACK, Edit


def order_edits(edits: list[Edit], largest: str | None, limit: int, tried: set[str]) -> list[Edit]:
    """Edits of the largest ceiling factor first (in enumeration order), then the other factors', fallbacks
    (switching a mechanism off) last; untried ones only, at most ``limit``."""
    fresh = [e for e in edits if e.id not in tried]
    first = [e for e in fresh if e.factor == largest]
    rest = [e for e in fresh if e.factor not in (largest, FALLBACK)]
    last = [e for e in fresh if e.factor == FALLBACK and largest != FALLBACK]
    return (_spread(first) + _spread(rest) + _spread(last))[:limit]


def largest_workable(factors: dict, edits: list[Edit], tried: set[str]) -> str | None:
    """The largest ceiling factor that some untried edit works on. A factor with headroom but no edit to
    close it (kernels over their floors when the only kernel edit is switching compile off) would spend the
    round's candidates on edits that cannot gain; on the H200 the lifted 8B's first round did that (3 of 6
    candidates: compile off, graphs off, a ladder; benchmarks/results/tune_h200.json)."""
    have = {e.factor for e in edits if e.id not in tried}
    ranked = sorted(((v, k) for k, v in factors.items() if v is not None), reverse=True)
    return next((k for _, k in ranked if k in have), ranked[0][1] if ranked else None)


# Edit kinds whose enumeration is already nearest-first (option_space._trees_near): taken in order.
NEAREST_FIRST = ("tree",)


def _spread(edits: list[Edit]) -> list[Edit]:
    # Interleave the edit kinds (gamma=, tree=, w12=...) so a short limit still sees each kind.
    kinds: dict[str, list[Edit]] = {}
    for e in edits:
        kinds.setdefault(e.id.split("=")[0], []).append(e)
    out, queues = [], [(kind, list(reversed(q))) for kind, q in kinds.items()]
    while any(q for _, q in queues):
        for kind, q in queues:
            if q:
                # From each kind alternately its last and first (e.g. the largest and smallest gamma); a
                # nearest-first kind from its front.
                out.append(q.pop() if kind in NEAREST_FIRST else q.pop(0 if len(out) % 2 else -1))
    return out


def rungs(full_blocks: int, screen_blocks: int, n: int) -> list[int]:
    """Blocks per rung: the screen, doubled while candidates halve, ending at the full length."""
    out, b = [], screen_blocks
    while b < full_blocks and n > 1:
        out.append(b)
        b, n = b * 2, math.ceil(n / 2)
    return [*out, full_blocks]


def successive_halving(cands: list, measure: Callable[[object, int], dict], blocks: list[int]) -> list[tuple]:
    """Measure ``cands`` on each rung of ``blocks``, keeping the better half (by point gain, and only those
    with a positive gain) for the next; returns ``(cand, record)`` of the last rung."""
    alive = list(cands)
    results: list[tuple] = []
    for i, b in enumerate(blocks):
        results = [(c, measure(c, b)) for c in alive]
        if i == len(blocks) - 1:
            break
        ranked = sorted(results, key=lambda cr: -cr[1]["gain"])
        keep = max(1, math.ceil(len(ranked) / 2))
        alive = [c for c, r in ranked[:keep] if r["gain"] > 0]
        if not alive:
            return []
    return results
