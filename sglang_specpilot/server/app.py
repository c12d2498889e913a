"""The FastAPI application: OpenAI-compatible routes over one engine and its scheduler thread.

    POST /v1/completions        text (or token-id) prompts; a list of prompts gives one choice each
    POST /v1/chat/completions   messages rendered with the tokenizer's chat template
    GET  /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text)

Both POST routes stream with ``"stream": true`` (server-sent events, ``data: [DONE]`` at the end, a usage
chunk with ``stream_options.include_usage``). Bodies are parsed by hand (protocol.py) rather than by
FastAPI's body binding so that every malformed request gets OpenAI's error shape and status.

A body is read under the size and time limits of ``ServerLimits`` (413, 408; a client gone mid-upload is
counted as 499), must be JSON (415), and is parsed and tokenized in a worker thread, so a large prompt
never stalls the event loop (/health and the streams of others). A full queue is answered 429 with
``Retry-After``.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..engine import Engine
from .bridge import Job
from .errors import APIError, install_error_handlers
from .limits import ServerLimits, check_content_type, install_log_rate_limit, read_body
from .metrics import Metrics
from .prompts import COMPLETION_DEFAULT_MAX_TOKENS, build_request, chat_prompt, completion_prompts
from .protocol import ChatCompletionRequest, CompletionRequest, parse_body
from .responses import Reply, sse
from .scheduler import Scheduler


def create_app(
    engine: Engine, model_name: str, scheduler: Scheduler | None = None, limits: ServerLimits | None = None
) -> FastAPI:
    """An app serving ``engine`` as ``model_name``; it starts (and on shutdown stops) the scheduler thread."""
    scheduler = scheduler or Scheduler(engine)
    metrics: Metrics = scheduler.metrics
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        install_log_rate_limit()
        scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="SpecPilot", lifespan=lifespan)
    app.state.scheduler = scheduler
    app.state.limits = limits or ServerLimits()  # read per request: a test may swap it
    install_error_handlers(app, on_error=metrics.reject)

    def model_card() -> dict:
        return {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "specpilot",
            "max_model_len": engine.options.max_seq_len,
        }

    def check_model(name: str) -> None:
        if name != model_name:
            raise APIError(
                404,
                f"The model `{name}` does not exist. This server serves `{model_name}`.",
                param="model",
                code="model_not_found",
            )

    @app.get("/health")
    async def health():
        if not scheduler.alive:
            raise APIError(503, "the engine thread is not running", type="server_error")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        check_model(name)
        return model_card()

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    def check_room(n: int) -> None:
        limits: ServerLimits = app.state.limits
        if scheduler.queued + n > limits.max_queued:
            raise APIError(
                429,
                f"the server is busy: {scheduler.queued} requests are waiting (at most "
                f"{limits.max_queued}); retry in {limits.retry_after_s} s",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(limits.retry_after_s)},
            )

    async def parse(request: Request, schema):
        check_content_type(request)
        check_room(1)  # refuse before reading a body the queue has no room for
        raw = await read_body(request, app.state.limits)
        return await run_in_threadpool(parse_body, raw, schema)

    def completion_requests(body: CompletionRequest):
        check_model(body.model)
        return [
            build_request(engine, body, p, COMPLETION_DEFAULT_MAX_TOKENS)
            for p in completion_prompts(body, engine, app.state.limits.max_prompts)
        ]

    def chat_requests(body: ChatCompletionRequest):
        check_model(body.model)
        return [build_request(engine, body, chat_prompt(body, engine), None)]

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse(request, CompletionRequest)
        reqs = await run_in_threadpool(completion_requests, body)  # tokenization: off the event loop
        return await _respond(request, body, Reply("text", model_name, reqs))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse(request, ChatCompletionRequest)
        reqs = await run_in_threadpool(chat_requests, body)
        return await _respond(request, body, Reply("chat", model_name, reqs))

    async def _respond(request: Request, body, reply: Reply):
        check_room(len(reply.requests))
        job = Job(scheduler, reply.requests)
        if body.stream:
            return StreamingResponse(
                _stream(job, reply, body.include_usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        last = await job.collect(request)
        return JSONResponse(reply.full([r.text for r in reply.requests], [ev.finish_reason for ev in last]))

    return app


async def _stream(job: Job, reply: Reply, include_usage: bool):
    """SSE chunks as the scheduler produces text. If the client disconnects, Starlette cancels this
    generator; ``finally`` withdraws the unfinished requests so their KV rows are freed."""
    try:
        if reply.chat:  # OpenAI opens each choice with the assistant role and empty content
            for i in range(len(job.requests)):
                yield sse(reply.chunk(i, None, role=True, include_usage=include_usage))
        async for choice, ev in job.events():
            if ev.text:
                yield sse(reply.chunk(choice, ev.text, include_usage=include_usage))
            if ev.finished:
                yield sse(reply.chunk(choice, None, ev.finish_reason, include_usage=include_usage))
        if include_usage:
            yield sse(reply.usage_chunk())
        yield sse("[DONE]")
    except APIError as e:  # headers are already sent: report the failure in-band, as OpenAI does
        yield sse(e.body())
        yield sse("[DONE]")
    finally:
        job.cancel()
