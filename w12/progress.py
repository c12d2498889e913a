"""A minimal progress bar on stderr (no dependency): redrawn in place on a terminal, one line otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts ``done`` out of ``total`` units; ``update`` adds to it, ``close`` prints the final line.

    On a terminal the bar is redrawn at most every 0.1 s; when stderr is a file or a pipe only the final
    line is written, so logs hold one line per task instead of thousands.
    """

    def __init__(self, total: float, label: str, *, unit: str = "", stream: TextIO | None = None, enabled=True):
        self.total, self.label, self.unit = max(float(total), 1e-9), label, unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.live = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done = 0.0
        self.start = self._last = time.perf_counter()

    def _line(self, note: str) -> str:
        frac = min(1.0, self.done / self.total)
        bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
        elapsed = time.perf_counter() - self.start
        return f"{self.label} [{bar}] {100 * frac:5.1f}% {elapsed:6.1f}s {note}"[:160]

    def update(self, amount: float = 1, note: str = "") -> None:
        self.done += amount
        now = time.perf_counter()
        if self.live and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            self.stream.write("\r\033[K" + self._line(note))
            self.stream.flush()

    def close(self, note: str = "done") -> None:
        if self.enabled:
            self.stream.write(("\r\033[K" if self.live else "") + self._line(note) + "\n")
            self.stream.flush()
