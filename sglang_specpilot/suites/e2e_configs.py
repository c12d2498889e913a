"""The e2e suite's systems and configurations: what each system runs, how its setting is chosen.

A configuration is a small dict: ``{"kind": "ar"}``, ``chain(gamma)`` or ``tree(N, D, K)``; ``tree_search``
walks the tree grid (coordinates by default, see ``suites/e2e.py`` for why) through a callback that
measures one configuration, so the order and the stopping are testable without a GPU.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

SYSTEMS = ("ar", "stock", "trees", "w12", "tlv")
SPECPILOT = ("trees", "w12", "tlv")  # the project's systems: the best of them gives the headline
# Systems that exist only as a name in the table (none since TLV landed; the mechanism stays for the next).
NOT_BUILT: dict[str, str] = {}
LABELS = {
    "ar": "AR",
    "stock": "stock chain",
    "trees": "SpecPilot trees",
    "w12": "SpecPilot trees + W12",
    "tlv": "SpecPilot + TLV",
}


def parse_ints(spec: str) -> list[int]:
    """``"3-8"`` -> [3, .., 8]; ``"1,4,16"`` -> [1, 4, 16]; mixed: ``"1,3-4"``."""
    out: list[int] = []
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-", 1))
            out += list(range(lo, hi + 1))
        else:
            out.append(int(part))
    if not out:
        raise ValueError(f"no numbers in {spec!r}")
    return out


def parse_grid(spec: str) -> tuple[list[int], list[int], list[int]]:
    """``"16,32,64:5,6,7:4,8"`` -> (budgets, depths, top-ks)."""
    parts = spec.split(":")
    if len(parts) != 3:
        raise ValueError(f"--tree-grid is N values : D values : K values, got {spec!r}")
    return tuple(parse_ints(p) for p in parts)  # type: ignore[return-value]


def run_order(batches: list[int]) -> list[int]:
    """Batch sizes in the order they run: 1 and 16 first (the issue's named metrics), then the rest."""
    first = [b for b in (1, 16) if b in batches]
    return first + [b for b in batches if b not in first]


def batch_chunks(prompts: list, per_set: int, b: int) -> list[list]:
    """Batches of ``b`` distinct prompts: the first ``max(per_set, b)`` prompts of the set, in order, cut
    into whole batches (none when the set has fewer than ``b``)."""
    pool = prompts[: max(per_set, b)]
    return [pool[i : i + b] for i in range(0, len(pool) - b + 1, b)]


def chain(gamma: int) -> dict:
    return {"kind": "chain", "gamma": gamma}


def tree(n: int, d: int, k: int) -> dict:
    return {"kind": "tree", "budget": n, "depth": d, "top_k": k}


def fallback_ar(reason: str) -> dict:
    """AR standing in for a speculative system at a batch where nothing speculative is predicted to beat
    it (the system switches itself off there); the same engine as AR's (``config_key`` leaves ``reason`` out)."""
    return {"kind": "ar", "fallback": reason}


# Budgets tried below the batch-1 pick at larger batches. On the H200 the batch-1 sweep ran out of budget
# at N 32, so N 32 D 3 K 8 was batch 16's only tree: 16 rows x 33 nodes, 16.47 ms a round against AR's
# 5.04 ms step (0.54x AR; stock's gamma 5, 16 x 6 nodes, 7.22 ms: 0.88x). Two budgets keep the extra
# compiles (seconds each at 8B) to two.
SMALL_BUDGETS = (8, 4)


def smaller_trees(cfg: dict, budgets=SMALL_BUDGETS) -> list[dict]:
    """Trees of ``budgets`` below ``cfg``'s budget at its depth and top-k, the largest (nearest) first. D is
    capped to N (N nodes reach at most depth N); K needs no cap: a lattice holds (1 + (D-1) K) K >= N
    candidates when D = N, and when D < N it is ``cfg``'s own lattice, which held ``cfg``'s larger N."""
    n0, d, k = cfg["budget"], cfg["depth"], cfg["top_k"]
    return [tree(n, min(d, n), k) for n in sorted(set(budgets), reverse=True) if n < n0]


def with_tlv(cfg: dict, chain_len: int) -> dict:
    """``cfg`` (a tree) with two-level verification on: a Q chain of ``chain_len`` tokens from W12's 8-bit
    view, the tree hanging from its end (the exact pass verifies both)."""
    return {**cfg, "tlv": True, "tlv_chain_len": chain_len}


def config_label(cfg: dict) -> str:
    if cfg["kind"] == "ar":
        return f"AR (fallback: {cfg['fallback']})" if cfg.get("fallback") else "AR"
    if cfg["kind"] == "chain":
        return f"chain gamma={cfg['gamma']}"
    label = f"tree N={cfg['budget']} D={cfg['depth']} K={cfg['top_k']}"
    return label + (f" + TLV L={cfg['tlv_chain_len']}" if cfg.get("tlv") else "")


def config_options(cfg: dict) -> dict:
    """EngineOptions fields of a config."""
    if cfg["kind"] == "chain":
        return {"num_speculative_tokens": cfg["gamma"]}
    if cfg["kind"] == "tree":
        opts = {"tree_budget": cfg["budget"], "tree_depth": cfg["depth"], "tree_top_k": cfg["top_k"]}
        if cfg.get("tlv"):
            opts |= {"tlv": True, "tlv_chain_len": cfg["tlv_chain_len"]}
        return opts
    return {}


def config_key(cfg: dict) -> tuple:
    """What an engine is built from: a fallback's reason is not (it runs on AR's engine)."""
    return tuple(sorted((k, v) for k, v in cfg.items() if k != "fallback"))


def best(records: list[dict], key: str) -> dict | None:
    """The record with the largest ``key`` among those that have it (failed or skipped ones do not)."""
    ok = [r for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return max(ok, key=lambda r: r[key]) if ok else None


def tree_search(
    grid: tuple[list[int], list[int], list[int]], evaluate: Callable[[dict], dict], mode: str = "coordinate"
) -> list[dict]:
    """Evaluate tree configs of ``grid`` (``evaluate(cfg) -> record`` with ``"tokens_per_s"``, or with
    ``"skipped"`` / ``"error"``); returns every record in order. ``coordinate``: D at the middle N and the
    largest K, then K at the best D, then N at the best (D, K); ``full``: the whole grid."""
    Ns, Ds, Ks = grid
    seen: dict[tuple, dict] = {}

    def ev(cfg):
        if config_key(cfg) not in seen:
            seen[config_key(cfg)] = evaluate(cfg)
        return seen[config_key(cfg)]

    if mode == "full":
        for n, d, k in itertools.product(Ns, Ds, Ks):
            ev(tree(n, d, k))
        return list(seen.values())
    n0 = 32 if 32 in Ns else Ns[len(Ns) // 2]
    k0 = max(Ks)
    by_d = [ev(tree(n0, d, k0)) for d in Ds]
    d_best = (best(by_d, "tokens_per_s") or {"config": tree(n0, Ds[len(Ds) // 2], k0)})["config"]["depth"]
    by_k = [ev(tree(n0, d_best, k)) for k in Ks]
    k_best = (best(by_k, "tokens_per_s") or {"config": tree(n0, d_best, k0)})["config"]["top_k"]
    for n in Ns:
        ev(tree(n, d_best, k_best))
    return list(seen.values())
