"""A real server on 127.0.0.1 (a free port) in a background thread, for end-to-end tests."""

from __future__ import annotations

import socket
import threading
import time

SERVE_ARGS = ["serve", "--max-seq-len", "512"]  # the tests' engine: `specpilot serve` defaults, small KV
MODEL = "SmolLM2-135M-Instruct"


class LiveServer:
    def __init__(self, argv: list[str] = SERVE_ARGS):
        import uvicorn

        from sglang_specpilot.cli import build_parser, serve_options
        from sglang_specpilot.engine import Engine
        from sglang_specpilot.server.app import create_app
        from sglang_specpilot.server.limits import uvicorn_config

        self.argv = argv
        self.engine = Engine.from_options(serve_options(build_parser().parse_args(argv)))
        self.app = create_app(self.engine, MODEL)
        self.scheduler = self.app.state.scheduler
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))  # the OS picks a free port; uvicorn serves on this very socket
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(self.app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {name{labels}: value}."""
        import httpx

        text = httpx.get(self.url + "/metrics", timeout=30).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_idle(self, timeout: float = 60) -> dict[str, float]:
        """Wait until no request holds a KV row and none is queued; return the metrics then."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = m["specpilot_running_requests"] == 0 and m["specpilot_queue_depth"] == 0
            if idle and m["specpilot_kv_rows_free"] == m["specpilot_kv_rows_total"]:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"server not idle after {timeout}s: {m}")
            time.sleep(0.1)
