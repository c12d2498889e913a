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


def describe_engine(engine, load_s: float, warmup_s: float) -> str:
    """One line of what was loaded (the start-up log line, like vLLM's and SGLang's)."""
    o = engine.options
    if o.draft:
        drafter = f"draft model {o.draft}"
    elif o.draft_layers:
        drafter = f"self-draft (first {o.draft_layers} layers)"
    elif o.ngram_size:
        drafter = f"prompt lookup (n <= {o.ngram_size})"
    else:
        drafter = "none (AR)"
    mode = (
        "AR"
        if not engine.shape.depth
        else (
            f"tree (budget {o.tree_budget}, depth {o.tree_depth}, top-k {o.tree_top_k})"
            if not engine.shape.chain
            else f"chain (gamma {engine.shape.depth})"
        )
    )
    graphs = "on" if o.cuda_graphs and str(engine.device).startswith("cuda") else "off"
    return (
        f"model {o.model or EMBEDDED_NAME}{' (synthetic)' if o.synthetic else ''}, weights {o.weights}, "
        f"drafter {drafter}, mode {mode}, device {engine.device}, dtype {o.dtype}, KV rows {o.max_batch_size} x "
        f"{o.max_seq_len} tokens, CUDA graphs {graphs}, "
        f"compile {'on' if o.compile_on else 'off'}; loaded in {load_s:.1f} s, warm-up {warmup_s:.1f} s"
    )


def run_server(
    options: EngineOptions,
    host: str,
    port: int,
    model_name: str | None = None,
    log_level: str = "info",
    limits: ServerLimits | None = None,
) -> int:
    import uvicorn

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
