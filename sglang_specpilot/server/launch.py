"""``specpilot serve``: build the engine, capture its graphs, and run the app under uvicorn."""

from __future__ import annotations

import logging

from ..config import EngineOptions

EMBEDDED_NAME = "SmolLM2-135M-Instruct"  # the name the embedded default model is served under


def served_name(options: EngineOptions, override: str | None) -> str:
    return override or options.model or EMBEDDED_NAME


def run_server(options: EngineOptions, host: str, port: int, model_name: str | None = None,
               log_level: str = "info") -> int:
    import uvicorn

    from ..engine import Engine
    from .app import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    engine = Engine.from_options(options)
    engine.warmup()  # capture CUDA graphs before the first request (no-op on the CPU)
    app = create_app(engine, served_name(options, model_name))
    uvicorn.run(app, host=host, port=port, log_level=log_level)
    return 0
