"""The tuning run's state in its folder: every measurement, written after each one, so a killed run continues.

The loop is a deterministic function of its measurements (the built-in proposer is seeded, the LLM's answers
are recorded). A resumed run replays the loop and takes every measurement it already has from ``state.json``
instead of timing it again; the first missing one is where it goes on measuring.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..harness.jsonable import write_json

STATE = "state.json"
VERSION = 1


class TuneState:
    def __init__(self, out: str | Path, config: dict):
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / STATE
        config = json.loads(json.dumps(config))  # as the file holds it (tuples become lists)
        self.data = {"version": VERSION, "config": config, "records": {}, "elapsed_s": 0.0}
        self.resumed = 0  # measurements taken from the file in this run
        if self.path.exists():
            old = json.loads(self.path.read_text())
            if old.get("config") != config:
                raise ValueError(
                    f"{self.path} belongs to a run with other settings ({_diff(old.get('config', {}), config)}); "
                    "use another --out folder, or the same flags to resume it"
                )
            self.data = old

    def get(self, key: str):
        rec = self.data["records"].get(key)
        if rec is not None:
            self.resumed += 1
        return rec

    def put(self, key: str, record) -> None:
        self.data["records"][key] = record
        self.save()

    def add_elapsed(self, seconds: float) -> None:
        self.data["elapsed_s"] += seconds
        self.save()

    def save(self) -> None:
        write_json(self.path, self.data, sort_keys=True)  # a kill mid-write leaves the previous state whole


def _diff(a: dict, b: dict) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys)
