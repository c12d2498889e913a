"""The memory folder: one JSON file per entry, named by its id; refusals say which rule an entry broke."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .entry import content_ok, reproduces


def default_dir() -> Path:
    """The user's data folder: ``$SPECPILOT_MEMORY``, else ``$XDG_DATA_HOME/specpilot/memory``
    (``~/.local/share/specpilot/memory``)."""
    if os.environ.get("SPECPILOT_MEMORY"):
        return Path(os.environ["SPECPILOT_MEMORY"])
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "specpilot" / "memory"


class RefusedEntry(ValueError):
    pass


class Store:
    def __init__(self, folder: str | Path | None = None):
        self.dir = Path(folder) if folder else default_dir()

    def _files(self):
        return sorted(self.dir.glob("*.json")) if self.dir.exists() else []

    def raw(self) -> dict[str, dict]:
        out = {}
        for f in self._files():
            e = json.loads(f.read_text())
            out[f.stem] = e
        return out

    def get(self, key: str, stock: dict) -> dict:
        """The entry whose id starts with ``key`` (or whose name is ``key``), checked; RefusedEntry if broken."""
        entries = self.raw()
        hits = [i for i, e in entries.items() if i.startswith(key) or e.get("name") == key]
        if len(hits) != 1:
            raise KeyError(f"memory {self.dir}: {len(hits)} entries match {key!r}")
        return self.check(entries[hits[0]], stock, entries)

    def check(self, entry: dict, stock: dict, entries: dict | None = None, _seen=()) -> dict:
        entries = self.raw() if entries is None else entries
        if not content_ok(entry):
            raise RefusedEntry(f"entry {entry.get('name')!r} ({str(entry.get('id'))[:12]}): content does not match "
                               "its id (edited after it was written): refused")  # fmt: skip
        required = self.requirements(entry, stock, entries, _seen)
        if not reproduces(entry, stock, required):
            raise RefusedEntry(f"entry {entry['name']!r}: applying it to this stock does not reproduce its source "
                               "options (hash differs): refused")  # fmt: skip
        return entry

    def requirements(self, entry: dict, stock: dict, entries: dict, _seen=()) -> list[dict]:
        """The required entries in application order (each checked)."""
        out = []
        for rid in entry["requires"]:
            if rid in _seen or rid not in entries:
                raise RefusedEntry(f"entry {entry['name']!r} requires {rid[:12]}, which the memory lacks")
            r = self.check(entries[rid], stock, entries, (*_seen, entry["id"]))
            out += [*self.requirements(r, stock, entries, (*_seen, entry["id"])), r]
        return out

    def add(self, entry: dict, stock: dict) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.check(entry, stock, self.raw() | {entry["id"]: entry})
        path = self.dir / f"{entry['id']}.json"
        path.write_text(json.dumps(entry, indent=1, sort_keys=True))
        return path

    def verify(self, stock_of) -> list[tuple[str, str | None]]:
        """(id, None if kept else why refused) for every entry; ``stock_of(entry)`` gives its source stock."""
        entries, out = self.raw(), []
        for i, e in entries.items():
            try:
                self.check(e, stock_of(e), entries)
                out.append((i, None))
            except (RefusedEntry, KeyError, TypeError) as err:
                out.append((i, str(err)))
        return out
