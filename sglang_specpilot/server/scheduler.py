"""The engine's thread: continuous batching of everything the HTTP handlers submit.

One background thread owns the engine and a ``RowBatch``. Between rounds it drains an inbox (new
submissions, cancellations), admits waiting requests into free KV rows (all in one prefill), runs one
round for every row in use and hands each new piece of text to its submission's ``sink``. A finished,
cancelled or failed request leaves its row at once, so the next round boundary can give it away.

Admission is fair across jobs (one HTTP request = one job, possibly of many prompts): free rows go
round-robin to the jobs that are waiting, oldest first, so a call with 64 prompts does not hold back the
single prompts that arrive after it. A request the engine cannot run (parameters it cannot use, a prefill
that fails only with it, non-finite logits) fails alone inside ``RowBatch``: its sink gets the error and
the requests admitted with it go on.

Handlers never touch the engine: they talk to this thread only through ``submit`` / ``cancel`` (a
thread-safe queue in) and their sinks (called from this thread; the asyncio side hops back onto its
event loop, see bridge.py).
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..engine import Engine
from ..engine.request import Request, RequestFailed, StreamEvent
from ..engine.rows import RowBatch
from .metrics import Metrics

log = logging.getLogger("specpilot.server")

# Gather window for prompts that overtake the rounds in flight (``Scheduler._poll``), in seconds; 0 (the
# default): off, each prompt is admitted as soon as the batch can take it. SPECPILOT_GATHER_MS sets it for A/Bs
# run in separate processes. Not measured yet, so off: closed-loop clients whose requests ended in one round
# send their next prompts within about a millisecond of each other, and the first one's prefill (13-15 ms on
# the H100's lifted 8B) is under way when the others come, so they wait for it (batched_h100.json, af7b241:
# 13 of the mechanisms' 48 steady requests took 31-39 ms against a ~21 ms median; whether those came together
# is what the suite's per-request stamps and probes/ttft_parts.py tell next).
GATHER_S = float(os.environ.get("SPECPILOT_GATHER_MS", "0")) / 1e3

# A sink receives the request's StreamEvents (the last one has ``finished``) or, if the engine failed,
# one Exception. It runs on the scheduler thread and must not block.
Sink = Callable[[StreamEvent | Exception], None]


@dataclass
class Submission:
    id: int
    request: Request
    sink: Sink
    group: int = 0  # the job it belongs to (fair admission across jobs)
    submitted: float = 0.0  # time.monotonic() at submit
    last_event: float | None = None  # time of its latest event (TTFT, then inter-token latency)


class Scheduler:
    def __init__(self, engine: Engine, metrics: Metrics | None = None, idle_wait_s: float = 0.5):
        self.engine = engine
        self.batch = getattr(engine, "batch", None) or RowBatch(engine)  # the engine's own rows, where it has them
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
        # The gather window (``GATHER_S``): requests that finished in the latest dispatch that had any, less
        # the submissions since, and when that dispatch was.
        self._owed, self._owed_since = 0, 0.0

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

    def submit(self, request: Request, sink: Sink, group: int | None = None) -> int:
        """Queue ``request``; ``group`` ties the prompts of one job together (default: a job of its own)."""
        sub_id = next(self._ids)
        sub = Submission(sub_id, request, sink, sub_id if group is None else group, time.monotonic())
        self.metrics.queued(+1)
        self._inbox.put(("submit", sub))
        return sub.id

    def cancel(self, sub_id: int) -> None:
        """Drop a submission (its client went away); a no-op once it has finished."""
        self._inbox.put(("cancel", sub_id))

    # ---- the engine thread -------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            idle = not self._waiting and not self._busy()
            self._drain(block=idle)
            if self._stop.is_set():
                break
            try:
                self._admit()
                if self._busy():
                    self._dispatch(self.batch.step(between=self._poll))
                    self.metrics.round(self.batch)
            except Exception as e:  # a failed round must not take the server down: fail its requests only
                log.exception("engine round failed; failing the requests in it")
                self._fail_all(e)
            self.metrics.gauges(self.batch)

    def _busy(self) -> bool:
        """Rows in use, or (with lookahead on CUDA) a launched round still to be read."""
        busy = getattr(self.batch, "busy", None)
        return self.batch.active > 0 if busy is None else busy

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=self.idle_wait_s) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            kind, arg = item
            if kind == "submit":
                self._waiting.append(arg)
                self._owed = max(0, self._owed - 1)
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

    def _fair_order(self, n: int) -> list[Submission]:
        """The first ``n`` waiting submissions in the order admission takes them: round-robin over their jobs
        (oldest job first), so a call with 64 prompts does not hold back the single prompts behind it."""
        by_group: dict[int, deque[Submission]] = {}
        for sub in self._waiting:
            by_group.setdefault(sub.group, deque()).append(sub)
        order: list[Submission] = []
        while len(order) < n and by_group:
            for group in list(by_group):
                order.append(by_group[group].popleft())
                if not by_group[group]:
                    del by_group[group]
                if len(order) == n:
                    break
        return order

    def _take_fair(self, n: int) -> list[Submission]:
        """The first ``n`` waiting submissions in ``_fair_order``, taken off the queue."""
        picked = self._fair_order(n)
        chosen = {id(s) for s in picked}
        self._waiting = deque(s for s in self._waiting if id(s) not in chosen)
        return picked

    def _poll(self) -> None:
        """Called while a round runs (``RowBatch.step``): take in new submissions and admit those the batch
        can prefill beside the rounds in flight (``RowBatch.overtake_count``), all that are waiting in one
        packed prefill; the first in ``_fair_order`` that cannot, and those behind it, wait for the round
        boundary as before.

        Together, not one at a time: the host waits for an overtaking prefill's first tokens, so prompts that
        arrive meanwhile (a closed loop's clients whose requests ended in one round) used to be prefilled one
        after another, each behind the last. On the H100 (lifted 8B, 16 clients, 3c17dd9,
        batched_gates_ab_h100.json) 13 of the 48 prompts after the first wave took 32-63 ms to their first
        token against a median of 22 ms, and that was the suspected cause. One prefill of two to eight prompts
        reads the weights once (``packed_prefill.SLOT_BUCKETS``). With this (af7b241, batched_h100.json) 13
        still took 31-39 ms: not all of that tail, or not this cause (``probes/ttft_parts.py`` tells next).
        The lengths asked about stop at the free rows: none past them can be admitted."""
        count = getattr(self.batch, "overtake_count", None)
        while count is not None:
            self._drain(block=False)
            order = self._fair_order(len(self.batch.free_rows)) if self._waiting else []
            n = count([len(s.request.prompt) for s in order]) if order else 0
            if not n or self._gathering():
                return
            self._admit(limit=n)

    def _gathering(self) -> bool:
        """Whether to hold the waiting prompts back a little (``GATHER_S``): the latest dispatch finished
        requests whose clients have not all sent their next prompt yet, and the window since has not passed.
        Off by default; the next poll (``RowBatch.POLL_S`` later) asks again."""
        return GATHER_S > 0 and self._owed > 0 and time.monotonic() - self._owed_since < GATHER_S

    def _admit(self, limit: int | None = None) -> None:
        n = min(len(self._waiting), len(self.batch.free_rows), limit or len(self._waiting))
        if not n:
            return
        subs = self._take_fair(n)
        self.metrics.queued(-n)
        try:
            # RowBatch isolates failures: a request it cannot run comes back as its own "error" event.
            events = self.batch.admit([s.request for s in subs])
        except Exception as e:  # nothing one request explains (the rows, the engine): fail these
            log.warning("admission of %d requests failed: %s: %s", len(subs), type(e).__name__, e)
            self._undo_admission(subs)
            for sub in subs:
                self.metrics.finished("error", sub.request)
                self._send(sub, e)
            return
        for sub in subs:
            self._by_row[sub.request.index] = sub
            self.metrics.admitted(sub.request)
        self._dispatch(events)

    def _undo_admission(self, subs: list[Submission]) -> None:
        """Free the rows a failed ``admit`` had already given these requests."""
        for sub in subs:
            row = sub.request.index
            if 0 <= row < self.batch.capacity and self.batch.rows[row] is sub.request:
                self.batch.release(row)
            sub.request.index = -1

    def _dispatch(self, events: list[StreamEvent]) -> None:
        finished = sum(ev.finished for ev in events)
        if finished:  # closed-loop clients answer these with their next prompts (``_gathering``)
            self._owed, self._owed_since = finished, time.monotonic()
        for ev in events:
            sub = self._by_row.get(ev.index)
            if sub is None:
                continue
            if ev.finish_reason == "error":  # the engine failed this request alone: its sink gets the error
                del self._by_row[ev.index]  # RowBatch already freed the row
                self.metrics.finished("error", sub.request)
                self._send(sub, RequestFailed(ev.result.error))
                continue
            self.metrics.tokens(len(ev.token_ids))
            now = time.monotonic()
            if sub.last_event is None:
                self.metrics.first_token(now - sub.submitted)
            elif ev.token_ids:
                self.metrics.inter_token((now - sub.last_event) / len(ev.token_ids), len(ev.token_ids))
            sub.last_event = now
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

    @property
    def queued(self) -> int:
        """Requests submitted and not yet admitted (the queue a new job would join)."""
        return self.metrics.queue_depth

    @staticmethod
    def _send(sub: Submission, item) -> None:
        try:
            sub.sink(item)
        except Exception:  # a sink whose event loop has gone (server shutting down) must not stop the loop
            log.debug("dropping an event for submission %d", sub.id, exc_info=True)
