"""``specpilot serve``: build the engine, capture its graphs, and run the app under uvicorn."""

from __future__ import annotations

import logging
import time

from ..config import EngineOptions
from .limits import ServerLimits, uvicorn_config

EMBEDDED_NAME = "SmolLM2-135M-Instruct"  # the name the embedded default model is served under

log = logging.getLogger("specpilot.server")


def served_name(options: EngineOptions, override: str | None) -> str:
    return override or options.model or EMBEDDED_NAME


def run_server(
    options: EngineOptions,
    host: str,
    port: int,
    model_name: str | None = None,
    log_level: str = "info",
    limits: ServerLimits | None = None,
) -> int:
    import uvicorn

    from ..cli import describe_engine
    from ..engine import Engine
    from .app import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    limits = limits or ServerLimits()
    t0 = time.perf_counter()
    engine = Engine.from_options(options)
    t1 = time.perf_counter()
    engine.warmup()  # capture CUDA graphs before the first request (no-op on the CPU)
    name = served_name(options, model_name)
    log.info("serving %s: %s", name, describe_engine(engine, t1 - t0, time.perf_counter() - t1))
    log.info(
        "limits: body %d bytes, %d prompts per request, %d queued requests, timeouts header %g s, body %g s, "
        "keep-alive %g s",
        limits.max_body_bytes,
        limits.max_prompts,
        limits.max_queued,
        limits.header_timeout_s,
        limits.body_timeout_s,
        limits.keep_alive_s,
    )
    app = create_app(engine, name, limits=limits)
    uvicorn.Server(uvicorn_config(app, host=host, port=port, log_level=log_level)).run()
    return 0
