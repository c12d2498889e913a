"""What one client may cost the server: body size and read time, prompts, queue room, connection timeouts.

``ServerLimits`` holds the numbers (``specpilot serve`` flags). ``read_body`` reads a request body under
the size and time limits, ``TimedH11Protocol`` closes connections that never finish their headers (and
idle keep-alive ones, through uvicorn's own timer), and ``RateLimitFilter`` keeps a storm of identical
log records (``accept()`` failing when file descriptors run out) down to one line per interval.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from starlette.requests import ClientDisconnect, Request

from .errors import APIError

MiB = 1 << 20


@dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 4 * MiB  # a bigger body is answered 413 before it is read
    max_prompts: int = 64  # prompts in one /v1/completions call (a list of prompts)
    max_queued: int = 256  # requests waiting for a KV row; more are answered 429 with Retry-After
    retry_after_s: int = 1  # the Retry-After a 429 carries
    header_timeout_s: float = 10.0  # a connection must finish its request line and headers within this
    body_timeout_s: float = 30.0  # and its body within this (408)
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_prompts", "max_queued", "retry_after_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


JSON_TYPES = ("application/json",)


def check_content_type(request: Request) -> None:
    """Bodies must be JSON: a Content-Type that says otherwise is a 415 (a missing one is allowed)."""
    ctype = request.headers.get("content-type")
    if ctype is None:
        return
    media = ctype.split(";", 1)[0].strip().lower()
    if media not in JSON_TYPES and not (media.startswith("application/") and media.endswith("+json")):
        raise APIError(
            415, f"Unsupported Content-Type {ctype!r}: send the body as application/json", code="unsupported_media_type"
        )


async def read_body(request: Request, limits: ServerLimits) -> bytes:
    """The body, refused with 413 past ``max_body_bytes`` (by Content-Length, or while reading) and 408
    past ``body_timeout_s``. A client that disconnects mid-upload is answered 499 (nobody reads it; the
    status only counts it) instead of a traceback."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise APIError(400, f"invalid Content-Length header {declared!r}")
        if int(declared) > limits.max_body_bytes:
            raise _too_large(limits)
    chunks: list[bytes] = []
    size = 0

    async def read() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise _too_large(limits)
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        raise APIError(
            408, f"the request body did not arrive within {limits.body_timeout_s:g} s", code="request_timeout"
        ) from None
    except ClientDisconnect:
        raise APIError(
            499, "the client disconnected before sending the whole body", code="client_disconnected"
        ) from None
    return b"".join(chunks)


def _too_large(limits: ServerLimits) -> APIError:
    return APIError(
        413,
        f"the request body is larger than the server's limit of {limits.max_body_bytes} bytes "
        "(specpilot serve --max-body-bytes)",
        code="request_too_large",
    )


# ---- connections ------------------------------------------------------------------------------------
def timed_h11_protocol(header_timeout_s):
    """uvicorn's h11 protocol, plus a deadline for a request's line and headers (a slowloris connection,
    or one that never sends anything, is closed after ``header_timeout_s``: seconds, or a function
    returning them, read at each connection)."""
    timeout = header_timeout_s if callable(header_timeout_s) else (lambda: header_timeout_s)
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def _waiting_for_headers(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(timeout(), self._header_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self._waiting_for_headers() and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                self._disarm()
            elif self._waiting_for_headers():  # the first bytes of a request: its headers are due
                self._arm()
            else:
                self._disarm()

        def on_response_complete(self) -> None:
            self._disarm()  # uvicorn's keep-alive timer takes over until the next request's first bytes
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return TimedH11Protocol


# ---- logging ----------------------------------------------------------------------------------------
class RateLimitFilter(logging.Filter):
    """Pass the first record of each (logger, message template) per ``interval_s``; count the rest and
    report the count on the next record that passes. The traceback of a suppressed record is dropped too."""

    def __init__(self, interval_s: float = 10.0, clock=time.monotonic):
        super().__init__()
        self.interval_s, self.clock = interval_s, clock
        self._last: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            self._last[key] = now
            dropped = self._suppressed.pop(key, 0)
        if dropped:
            record.msg = f"{record.msg} ({dropped} similar messages suppressed in the last {self.interval_s:g} s)"
        return True


NOISY_LOGGERS = ("asyncio", "uvicorn.error")  # accept() failures and per-connection errors land here


def install_log_rate_limit(interval_s: float = 10.0) -> RateLimitFilter:
    """Rate-limit the loggers an accept storm floods (idempotent: one filter per logger)."""
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        for f in logger.filters:
            if isinstance(f, RateLimitFilter):
                return f
    f = RateLimitFilter(interval_s)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).addFilter(f)
    return f


def uvicorn_config(app, **kw):
    """A ``uvicorn.Config`` with the timeouts of ``app.state.limits`` (the one ``serve`` and the tests use)."""
    limits: ServerLimits = app.state.limits
    import uvicorn

    install_log_rate_limit()
    return uvicorn.Config(
        app,
        http=timed_h11_protocol(lambda: app.state.limits.header_timeout_s),
        timeout_keep_alive=limits.keep_alive_s,
        h11_max_incomplete_event_size=64 * 1024,
        **kw,
    )
