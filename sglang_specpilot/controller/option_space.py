"""Candidates: option deltas over ``EngineOptions``, and the enumeration of the legal one-edit neighbours.

A candidate is a delta ``{option: value}`` over the deployment's stock options (every option at its default
reproduces stock, config.py). Each round the controller lists every legal edit of the current best; the
proposers (built-in and LLM) may only choose among these. An edit is legal when ``EngineOptions`` accepts
the result and it can change something on this device: ``compile`` and the CUDA-graph ladder do nothing off
CUDA, so a CPU run does not offer them; W12 needs bfloat16, so a float32 run is refused by the options.

Each edit is tagged with the ceiling factor it works on (trees / kernels / outside), so the round's largest
factor orders the proposals; switching compile or the CUDA graphs off works on none ("fallback").
Co-location needs two KV rows (``max_batch_size >= 2``) and chain rounds.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from ..config import EngineOptions, tree_candidates

GAMMAS = (2, 3, 4, 5, 6, 8)
TREE_DEPTHS = (3, 4, 5, 6, 8)
TREE_TOP_KS = (4, 8)
TREE_BUDGETS = (8, 16, 32, 64)
LADDERS = ((1,), (1, 2, 4, 8), (1, 2, 4, 8, 16, 32, 64))
TLV_CHAINS = (2, 4, 6)
TREE_KEYS = ("tree_budget", "tree_depth", "tree_top_k")
FALLBACK = "fallback"  # the factor tag of edits that switch a speed mechanism off
# The budget a chain's first tree edits centre on: the e2e suite's coordinate search picked N 32 at batch 1
# on both the lifted 8B and the real SmolLM2 (benchmarks/results/e2e_h200.json, trees_h200.json).
TREE_CENTRE_BUDGET = 32


@dataclass(frozen=True)
class Edit:
    id: str
    delta: tuple  # sorted (option, value) pairs
    factor: str

    @property
    def changes(self) -> dict:
        return dict(self.delta)


def delta_key(delta: dict) -> str:
    """Canonical text of a delta (its identity in state files, caches and memory entries)."""
    return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in sorted(delta.items())}, sort_keys=True)


def apply(stock: EngineOptions, delta: dict) -> EngineOptions:
    """``stock`` with ``delta`` applied; raises ValueError when the result is illegal."""
    fields = {k: (tuple(v) if k == "graph_batch_sizes" else v) for k, v in delta.items()}
    unknown = set(fields) - set(asdict(stock))
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)}")
    opts = replace(stock, **fields)
    # replace() re-runs __post_init__ on the resolved stock fields; trees resolve their unset members.
    return opts


def normalize(stock: EngineOptions, delta: dict) -> dict:
    """The delta without entries equal to stock's own value (so equal systems have equal keys)."""
    base = asdict(stock)
    out = {}
    for k, v in delta.items():
        vv = list(v) if isinstance(v, tuple) else v
        bv = list(base[k]) if isinstance(base[k], tuple) else base[k]
        if vv != bv:
            out[k] = vv
    return out


def _with(best: dict, changes: dict) -> dict:
    out = dict(best)
    for k, v in changes.items():
        out[k] = v
    return out


def _raw_edits(stock: EngineOptions, best: dict) -> list[tuple[str, dict, str]]:
    cur = apply(stock, best)
    out: list[tuple[str, dict, str]] = []
    if not cur.speculative:
        return out
    model_drafter = cur.draft is not None or cur.draft_layers > 0
    if not cur.tree:
        for g in GAMMAS:
            if g != cur.num_speculative_tokens:
                out.append((f"gamma={g}", {"num_speculative_tokens": g}, "trees"))
    if model_drafter:
        for n, d, k in _trees_near(cur):
            out.append((f"tree={n}/{d}/{k}", {"tree_budget": n, "tree_depth": d, "tree_top_k": k}, "trees"))
        if cur.tree:
            out.append(("chain", dict.fromkeys(TREE_KEYS), "trees"))
    if model_drafter:
        # Two-level verification (issue 16): a Q pass on W12's 8-bit view; EngineOptions refuses it without
        # W12 weights or a draft model, so on other deployments these edits are dropped as illegal.
        out.append((f"tlv={'off' if cur.tlv else 'on'}", {"tlv": not cur.tlv}, "trees"))
        if cur.tlv:
            for n in TLV_CHAINS:
                if n != cur.tlv_chain_len:
                    out.append((f"tlv_chain={n}", {"tlv_chain_len": n}, "trees"))
    for key, label in (("weights", "w12"), ("draft_weights", "draft_w12")):
        if key == "draft_weights" and cur.draft is None:
            continue
        other = "bf16" if getattr(cur, key) == "w12" else "w12"
        out.append((f"{label}={'on' if other == 'w12' else 'off'}", {key: other}, "kernels"))
    if cur.device.startswith("cuda"):
        # Turning compile or the graphs off works on no factor (it adds kernel time or launch gaps): a fallback
        # for a deployment where they misbehave, screened after every edit that could close a gap.
        out.append(
            (f"compile={'off' if cur.compile_on else 'on'}", {"compile": not cur.compile_on},
             FALLBACK if cur.compile_on else "kernels")
        )  # fmt: skip
        out.append(
            (f"cuda_graphs={'off' if cur.cuda_graphs else 'on'}", {"cuda_graphs": not cur.cuda_graphs},
             FALLBACK if cur.cuda_graphs else "outside")
        )  # fmt: skip
        for lad in LADDERS:
            if tuple(lad) != tuple(cur.graph_batch_sizes):
                out.append((f"ladder={'-'.join(map(str, lad))}", {"graph_batch_sizes": list(lad)}, "outside"))
        if not cur.tree and cur.max_batch_size >= 2 and cur.draft is not None:
            out.append((f"colocate={'off' if cur.colocate else 'on'}", {"colocate": not cur.colocate}, "outside"))
    return out


def _trees_near(cur: EngineOptions) -> list[tuple[int, int, int]]:
    """Every tree of the grid except the current one, nearest first to the current configuration (its tree,
    or for a chain a tree of its depth at ``TREE_CENTRE_BUDGET`` and the widest top-k): one coordinate away
    before two. A round screens only its first few candidates, so the order is the search: the neighbours of
    the current best, as a coordinate search would try them, not the grid's corners."""
    if cur.tree:
        n0, d0, k0 = cur.tree_budget, cur.tree_depth, cur.tree_top_k
    else:
        n0, d0, k0 = TREE_CENTRE_BUDGET, cur.num_speculative_tokens, max(TREE_TOP_KS)
    grid = [
        (n, d, k)
        for d in TREE_DEPTHS
        for k in TREE_TOP_KS
        for n in TREE_BUDGETS
        if n <= tree_candidates(d, k) and (n, d, k) != (cur.tree_budget, cur.tree_depth, cur.tree_top_k)
    ]

    def distance(t):
        n, d, k = t
        steps = (abs(TREE_BUDGETS.index(n) - TREE_BUDGETS.index(n0)) if n0 in TREE_BUDGETS else 1, abs(d - d0), k != k0)
        return (sum(1 for x in steps if x), sum(steps), -n, d, -k)

    return sorted(grid, key=distance)


def legal_edits(stock: EngineOptions, best: dict) -> list[Edit]:
    """Every legal one-edit neighbour of ``best`` (a normalized delta), in a fixed order."""
    edits, seen = [], {delta_key(best)}
    for eid, changes, factor in _raw_edits(stock, best):
        new = _with(best, changes)
        try:
            apply(stock, new)
        except ValueError:
            continue
        key = delta_key(normalize(stock, new))
        if key in seen:
            continue
        seen.add(key)
        edits.append(Edit(eid, tuple(sorted(changes.items(), key=lambda kv: kv[0])), factor))
    return edits


def applied(stock: EngineOptions, best: dict, edit: Edit) -> dict:
    """The normalized delta of ``best`` with ``edit`` applied."""
    return normalize(stock, _with(best, edit.changes))
