"""A local stand-in for the Anthropic Messages API on 127.0.0.1: replays recorded responses in order and
keeps every request body, so tests drive the real ``anthropic`` client without a key or network."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def tool_answer(edits, rationale="recorded") -> dict:
    return _message([{"type": "tool_use", "id": "toolu_1", "name": "propose_edits",
                      "input": {"edits": edits, "rationale": rationale}}], "tool_use")  # fmt: skip


def text_answer(text: str) -> dict:
    return _message([{"type": "text", "text": text}], "end_turn")


def _message(content, stop) -> dict:
    return {"id": "msg_standin", "type": "message", "role": "assistant", "model": "standin", "content": content,
            "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip


class MessagesStandIn:
    def __init__(self, responses: list[dict]):
        self.responses, self.requests = list(responses), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.requests.append({"path": self.path, "body": body})
                if not outer.responses:
                    self.send_response(500)
                    self.end_headers()
                    return
                data = json.dumps(outer.responses.pop(0)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
