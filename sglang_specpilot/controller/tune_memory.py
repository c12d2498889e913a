"""The loop and the memory: promoted mechanisms become entries; a new deployment starts from them.

After a confirmed sealed final, each round's promotion becomes an entry whose delta is what that round changed
and whose requirements are the earlier rounds' entries, so stock + the chain reproduces the source system
exactly (``memory_store.entry``). A new deployment (another model or drafter) gets every entry whose composed
delta its own ``EngineOptions`` accepts as first-round candidates, re-timed under the same gates.
"""

from __future__ import annotations

from dataclasses import asdict

from memory_store import RefusedEntry, Store, make_entry

from .option_space import apply, normalize

CONTRACT = (
    "lossless: greedy output equals stock's token for token on the same engine and precision, except near-ties; "
    "token forcing vs stock accepted (mismatch <= stock + 0.5 points at 95%, no more large-margin mismatches)"
)


def stock_dict(stock) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(stock).items()}


def remember(folder, res: dict, doc: dict, stock) -> list:
    """Write an entry per promoted round of a confirmed run; returns the paths written."""
    if not doc["evidence"]["sealed_final"].get("confirmed"):
        return []
    store, sd, paths, chain, prev = Store(folder), stock_dict(stock), [], [], {}
    by_id = {h["id"]: h for h in res["history"]}
    for rnd in res["rounds"]:
        if not rnd.get("promoted"):
            continue
        after = rnd["best_after"]
        step = {k: v for k, v in after.items() if prev.get(k) != v}
        step |= {k: sd[k] for k in prev if k not in after}  # an option the round set back to stock
        h = by_id.get(rnd["promoted"], {})
        evidence = {
            "deployment": doc["deployment"],
            "stock_options": sd,
            "round": rnd["round"],
            "gain": h.get("timing", {}).get("gain"),
            "gain_low": h.get("timing", {}).get("gain_low"),
            "noise": res["stock_noise"],
            "forcing": h.get("forcing"),
            "sealed_final_gain": doc["evidence"]["sealed_final"].get("gain"),
            "commit": doc.get("commit"),
        }
        entry = make_entry(rnd["promoted"], step, chain, sd, CONTRACT, evidence)
        paths.append(store.add(entry, sd))
        chain, prev = [*chain, entry], after
    return paths


def seeds(folder, stock) -> list[tuple[str, dict]]:
    """(name, delta over this stock) of every kept entry that applies here, its requirements composed in."""
    store, out = Store(folder), []
    entries = store.raw()
    for e in entries.values():
        try:
            src = e.get("evidence", {}).get("stock_options")
            store.check(e, src, entries)
            req = store.requirements(e, src, entries)
        except (RefusedEntry, KeyError, TypeError):
            continue  # a refused entry is never reused (``specpilot memory verify`` says why)
        delta: dict = {}
        for d in [*(r["delta"] for r in req), e["delta"]]:
            delta |= d
        delta = {k: v for k, v in delta.items() if k in stock_dict(stock)}
        try:
            apply(stock, delta)
        except ValueError:
            continue  # not legal on this deployment (e.g. W12 on a float32 run)
        out.append((e["name"], normalize(stock, delta)))
    return out
