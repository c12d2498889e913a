"""A memory entry: one promoted mechanism as an option delta, what it requires, its contract and evidence.

Two hashes keep an entry honest:

- ``source_hash``: the options of the system the mechanism was promoted in (stock, then the deltas of the
  entries it requires, then its own). The reproduce rule: an entry is kept only if applying it (with its
  requirements) to stock gives options whose hash is exactly this one.
- ``id``: the hash of the entry's whole content. An edited file (a changed delta, gain or contract) no
  longer matches its id and is refused.

Options are plain JSON dicts here (``dataclasses.asdict(EngineOptions)``): this library imports no engine.
"""

from __future__ import annotations

import hashlib
import json

FORMAT = "specpilot-memory/1"


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=list)


def sha(obj) -> str:
    return hashlib.sha256(canonical(obj).encode()).hexdigest()


def compose(stock: dict, deltas: list[dict]) -> dict:
    """``stock`` with each delta applied in order."""
    out = json.loads(canonical(stock))
    for d in deltas:
        out.update(json.loads(canonical(d)))
    return out


def make_entry(name: str, delta: dict, requires: list[dict], stock: dict, contract: str, evidence: dict) -> dict:
    """A new entry; ``requires`` are the entries (dicts) whose deltas the source system had under this one."""
    body = {
        "format": FORMAT,
        "name": name,
        "delta": delta,
        "requires": [r["id"] for r in requires],
        "options": sorted(delta),
        "contract": contract,
        "evidence": evidence,
        "source_hash": sha(compose(stock, [*(r["delta"] for r in requires), delta])),
    }
    return body | {"id": sha(body)}


def content_ok(entry: dict) -> bool:
    body = {k: v for k, v in entry.items() if k != "id"}
    return entry.get("format") == FORMAT and entry.get("id") == sha(body)


def reproduces(entry: dict, stock: dict, required: list[dict]) -> bool:
    """The reproduce rule: stock + the required entries' deltas + this delta hash to ``source_hash``."""
    return sha(compose(stock, [*(r["delta"] for r in required), entry["delta"]])) == entry["source_hash"]
