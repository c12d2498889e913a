"""The engine's thread: continuous batching of everything the HTTP handlers submit.

One background thread owns the engine and a ``RowBatch``. Between rounds it drains an inbox (new
submissions, cancellations), admits waiting requests into free KV rows (all in one prefill), runs one
round for every row in use and hands each new piece of text to its submission's ``sink``. A finished,
cancelled or failed request leaves its row at once, so the next round boundary can give it away.

Handlers never touch the engine: they talk to this thread only through ``submit`` / ``cancel`` (a
thread-safe queue in) and their sinks (called from this thread; the asyncio side hops back onto its
event loop, see bridge.py).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..engine import Engine
from ..engine.request import Request, StreamEvent
from ..engine.rows import RowBatch
from .metrics import Metrics

log = logging.getLogger("specpilot.server")

# A sink receives the request's StreamEvents (the last one has ``finished``) or, if the engine failed,
# one Exception. It runs on the scheduler thread and must not block.
Sink = Callable[[StreamEvent | Exception], None]


@dataclass
class Submission:
    id: int
    request: Request
    sink: Sink


class Scheduler:
    def __init__(self, engine: Engine, metrics: Metrics | None = None, idle_wait_s: float = 0.5):
        self.engine = engine
        self.batch = RowBatch(engine)
        self.metrics = metrics or Metrics()
        self.metrics.gauges(self.batch)
        self.idle_wait_s = idle_wait_s
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._waiting: deque[Submission] = deque()
        self._by_row: dict[int, Submission] = {}
        self._cancelled: set[int] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ---- called from any thread --------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="specpilot-scheduler", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(None)  # wake the loop
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, request: Request, sink: Sink) -> int:
        sub = Submission(next(self._ids), request, sink)
        self.metrics.queued(+1)
        self._inbox.put(("submit", sub))
        return sub.id

    def cancel(self, sub_id: int) -> None:
        """Drop a submission (its client went away); a no-op once it has finished."""
        self._inbox.put(("cancel", sub_id))

    # ---- the engine thread -------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            idle = not self._waiting and self.batch.active == 0
            self._drain(block=idle)
            if self._stop.is_set():
                break
            try:
                self._admit()
                if self.batch.active:
                    self._dispatch(self.batch.step())
                    self.metrics.round(self.batch)
            except Exception as e:  # a failed round must not take the server down: fail its requests only
                log.exception("engine round failed; failing the requests in it")
                self._fail_all(e)
            self.metrics.gauges(self.batch)

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=self.idle_wait_s) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            kind, arg = item
            if kind == "submit":
                self._waiting.append(arg)
            else:
                self._cancel(arg)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _cancel(self, sub_id: int) -> None:
        for sub in self._waiting:
            if sub.id == sub_id:
                self._waiting.remove(sub)
                self.metrics.queued(-1)
                self.metrics.finished("cancelled", sub.request)
                return
        for row, sub in list(self._by_row.items()):
            if sub.id == sub_id:
                self.batch.release(row)
                del self._by_row[row]
                self.metrics.finished("cancelled", sub.request)
                return

    def _admit(self) -> None:
        n = min(len(self._waiting), len(self.batch.free_rows))
        if not n:
            return
        subs = [self._waiting.popleft() for _ in range(n)]
        self.metrics.queued(-n)
        try:
            events = self.batch.admit([s.request for s in subs])
        except Exception as e:  # e.g. out of memory in the prefill: fail these requests, keep the others
            log.exception("prefill failed; failing the requests it admitted")
            for sub in subs:
                row = sub.request.index
                if 0 <= row < self.batch.capacity and self.batch.rows[row] is sub.request:
                    self.batch.release(row)
                self.metrics.finished("error", sub.request)
                self._send(sub, e)
            return
        for sub in subs:
            self._by_row[sub.request.index] = sub
            self.metrics.admitted(sub.request)
        self._dispatch(events)

    def _dispatch(self, events: list[StreamEvent]) -> None:
        for ev in events:
            sub = self._by_row.get(ev.index)
            if sub is None:
                continue
            self.metrics.tokens(len(ev.token_ids))
            if ev.finished:
                del self._by_row[ev.index]  # RowBatch already freed the row
                self.metrics.finished(ev.finish_reason or "length", sub.request)
            self._send(sub, ev)

    def _fail_all(self, error: Exception) -> None:
        for row, sub in list(self._by_row.items()):
            self.batch.release(row)
            self.metrics.finished("error", sub.request)
            self._send(sub, error)
        self._by_row.clear()

    @staticmethod
    def _send(sub: Submission, item) -> None:
        try:
            sub.sink(item)
        except Exception:  # a sink whose event loop has gone (server shutting down) must not stop the loop
            log.debug("dropping an event for submission %d", sub.id, exc_info=True)
