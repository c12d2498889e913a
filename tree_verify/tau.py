"""tau replay: tokens per round of a drafting scheme, replayed against the target's recorded greedy output.

At temperature 0 a round that starts after ``t`` emitted tokens accepts the longest draft path that spells
the target's own continuation ``g[t], g[t+1], ...`` (the target's argmax at an accepted node is the next
greedy token), then adds the bonus. So given the target's greedy tokens once, any drafter can be scored
without running the target again: only the drafter's proposals at each round start are needed.

The first token comes from prefill, not from a round, as in the engine's ``mean_accepted``.
"""

from __future__ import annotations

from collections.abc import Callable

from tree_verify.best_first import DraftTree


def accepted_on_truth(tree: DraftTree, truth: list[int]) -> int:
    """Depth of the deepest node (one tree, [N] fields) whose path spells ``truth[:depth]``."""
    ok: list[bool] = []
    best = 0
    for tok, par, dep in zip(tree.tokens.tolist(), tree.parents.tolist(), tree.depths.tolist(), strict=True):
        good = (par < 0 or ok[par]) and dep <= len(truth) and tok == truth[dep - 1]
        ok.append(good)
        if good:
            best = max(best, dep)
    return best


def leading_run(ranks: list[int], start: int, k: int, cap: int) -> int:
    """How many consecutive ``ranks[start:]`` are < k, at most ``cap`` (chain: k = 1)."""
    n = 0
    while n < cap and start + n < len(ranks) and ranks[start + n] < k:
        n += 1
    return n


def replay(num_tokens: int, accept: Callable[[int], int]) -> tuple[int, int]:
    """Run rounds over ``num_tokens`` greedy tokens; ``accept(t)`` = drafts accepted by the round after t
    emitted tokens. Returns (tokens emitted by rounds, rounds)."""
    t, rounds, tokens = 1, 0, 0
    while t < num_tokens:
        step = min(accept(t) + 1, num_tokens - t)
        t += step
        tokens += step
        rounds += 1
    return tokens, rounds
