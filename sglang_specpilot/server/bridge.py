"""The asyncio side of a job: submit its requests to the scheduler thread and await their events.

Events come back on the scheduler thread; ``loop.call_soon_threadsafe`` moves each onto the handler's
event loop, into one asyncio queue per job (a job is one HTTP request: one engine request per prompt).
When the client goes away, ``cancel`` withdraws every request that has not finished, which frees its KV
row at the next round boundary.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest

from ..engine.request import Request, StreamEvent
from .errors import APIError
from .scheduler import Scheduler


class Job:
    def __init__(self, scheduler: Scheduler, requests: list[Request]):
        self.scheduler = scheduler
        self.requests = requests
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._open = set(range(len(requests)))
        self._ids: list[int] = []
        for i, r in enumerate(requests):  # one job: its prompts share a group for fair admission
            self._ids.append(scheduler.submit(r, self._sink(i), group=self._ids[0] if self._ids else None))

    def _sink(self, choice: int):
        def put(item) -> None:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (choice, item))

        return put

    async def events(self) -> AsyncIterator[tuple[int, StreamEvent]]:
        """(choice index, event) until every request has finished; an engine failure raises APIError."""
        while self._open:
            choice, item = await self._queue.get()
            if isinstance(item, Exception):
                self._open.discard(choice)
                self.cancel()
                raise APIError(500, f"the engine failed: {type(item).__name__}: {item}", type="server_error")
            if item.finished:
                self._open.discard(choice)
            yield choice, item

    def cancel(self) -> None:
        for choice in list(self._open):
            self.scheduler.cancel(self._ids[choice])
        self._open.clear()

    async def collect(self, http: HTTPRequest) -> list[StreamEvent]:
        """Every request's last event (with its result), in order; cancels all if the client disconnects."""
        last: dict[int, StreamEvent] = {}

        async def gather() -> None:
            async for choice, ev in self.events():
                if ev.finished:
                    last[choice] = ev

        work = asyncio.ensure_future(gather())
        watch = asyncio.ensure_future(_disconnected(http))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():  # the client left (or we are being cancelled): free the rows
                work.cancel()
                self.cancel()
        if not work.done() or work.cancelled():
            # The client left: ``work.cancel()`` only asks, so the task may not have finished yet. Nobody is
            # left to answer; ClientDisconnect is counted (499) rather than logged as a server error.
            raise ClientDisconnect()
        work.result()  # re-raise an engine failure
        return [last[i] for i in range(len(self.requests))]


async def _disconnected(http: HTTPRequest) -> None:
    """Return when the client disconnects (the body has already been read, so only that can arrive)."""
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return
