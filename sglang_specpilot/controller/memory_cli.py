"""``specpilot memory list | show ID | apply ID --out DIR | verify [--memory DIR]``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from memory_store import RefusedEntry, Store, default_dir


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specpilot memory", description=__doc__)
    p.add_argument("--memory", default=None, help=f"memory folder (default: {default_dir()})")
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="every entry: id, name, options, gain, kept or refused")
    sub.add_parser("show", help="one entry as JSON").add_argument("id")
    a = sub.add_parser("apply", help="write a profile of stock + the entry (and its requirements) for --profile")
    a.add_argument("id")
    a.add_argument("--out", required=True, help="folder for profile.json")
    sub.add_parser("verify", help="check every entry's hash and the reproduce rule; exit 1 if any is refused")
    return p


def _src(e: dict) -> dict | None:
    return e.get("evidence", {}).get("stock_options")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    store = Store(args.memory)
    if args.action in ("list", "verify"):
        status = dict(store.verify(_src))
        for i, e in store.raw().items():
            why = status.get(i)
            gain = e.get("evidence", {}).get("gain")
            g = f"{gain:+.3f}" if isinstance(gain, int | float) else "?"
            print(f"{i[:12]}  {e.get('name', '?'):<24} {','.join(e.get('options', [])):<36} gain {g}  "
                  f"{'kept' if why is None else 'REFUSED: ' + why}")  # fmt: skip
        if args.action == "verify":
            bad = [i for i, w in status.items() if w is not None]
            print(f"{len(status) - len(bad)} kept, {len(bad)} refused", file=sys.stderr)
            return 1 if bad else 0
        return 0
    entries = store.raw()
    hits = [i for i, e in entries.items() if i.startswith(args.id) or e.get("name") == args.id]
    if len(hits) != 1:
        raise ValueError(f"memory {store.dir}: {len(hits)} entries match {args.id!r}")
    e = entries[hits[0]]
    try:
        store.check(e, _src(e), entries)
    except RefusedEntry as err:
        print(f"specpilot: error: {err}", file=sys.stderr)
        return 1
    if args.action == "show":
        print(json.dumps(e, indent=1, sort_keys=True))
        return 0
    delta: dict = {}
    for d in [*(r["delta"] for r in store.requirements(e, _src(e), entries)), e["delta"]]:
        delta |= d
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"format": "specpilot-profile/1", "deployment": e["evidence"].get("deployment", {}), "delta": delta,
           "applied_reason": f"memory entry {e['name']} ({e['id'][:12]}) and its requirements"}  # fmt: skip
    (out / "profile.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps({"profile": str(out / "profile.json"), "delta": delta}))
    return 0
