"""200 malformed requests (raw httpx, seeded): each gets a 4xx OpenAI-style error, and the server stays healthy."""

import json
import random

import pytest
from live_server import MODEL

httpx = pytest.importorskip("httpx")

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TEXT = {"model": MODEL, "prompt": "hi", "max_tokens": 2}

# Each mutation alone makes a valid body invalid: (routes it applies to, key, value); value None = delete key.
BAD_VALUES = [
    ("both", "model", "no-such-model"), ("both", "model", 7), ("both", "model", None),
    ("both", "max_tokens", -1), ("both", "max_tokens", 0), ("both", "max_tokens", 1.5), ("both", "max_tokens", "many"),
    ("both", "max_tokens", 10**9), ("both", "temperature", -0.5), ("both", "temperature", 2.5),
    ("both", "temperature", "hot"), ("both", "top_p", 0), ("both", "top_p", 1.5), ("both", "top_k", -3),
    ("both", "n", 2), ("both", "n", 0), ("both", "stream", "maybe"),
    ("both", "stream_options", {"include_usage": True}),
    ("both", "stop", ["a", "b", "c", "d", "e"]), ("both", "stop", 12), ("both", "stop", [""]), ("both", "seed", "x"),
    ("both", "presence_penalty", 1.0), ("both", "frequency_penalty", -1.0), ("both", "logit_bias", {"50": 10}),
    ("both", "best_of_all", 3), ("both", "fancy_option", True), ("both", "user", ["not", "a", "string"]),
    ("chat", "messages", []), ("chat", "messages", "hi"), ("chat", "messages", [{"content": "no role"}]),
    ("chat", "messages", [{"role": "wizard", "content": "x"}]), ("chat", "messages", None),
    ("chat", "messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
    ("chat", "logprobs", True), ("chat", "top_logprobs", 3), ("chat", "tools", [{"type": "function"}]),
    ("chat", "tool_choice", "required"), ("chat", "response_format", {"type": "json_object"}),
    ("chat", "max_completion_tokens", -5), ("chat", "prompt", "hi"),
    ("text", "prompt", []), ("text", "prompt", {}), ("text", "prompt", [1.5]), ("text", "prompt", [-1]),
    ("text", "prompt", [10**9]), ("text", "prompt", [[]]), ("text", "prompt", None), ("text", "logprobs", 2),
    ("text", "echo", True), ("text", "best_of", 3), ("text", "suffix", "tail"), ("text", "messages", []),
]


def _case(rng: random.Random):
    """(method, path, content bytes, headers) of one malformed request."""
    path = rng.choice(["/v1/chat/completions", "/v1/completions"])
    base = CHAT if "chat" in path else TEXT
    kind = rng.random()
    if kind < 0.15:  # random bytes: not JSON, or JSON that is no object, or an object without the fields
        return "POST", path, bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))), {}
    if kind < 0.30:  # a valid body cut short: never a complete JSON object
        raw = json.dumps(base).encode()
        return "POST", path, raw[: rng.randrange(0, len(raw) - 1)], {"content-type": "application/json"}
    if kind < 0.35:  # JSON scalars and arrays, NaN, deep nesting
        raw = rng.choice([b"[]", b"null", b"42", b'"text"', b'{"model": NaN}', b"[" * 50 + b"]" * 50,
                          json.dumps({**base, "temperature": float("nan")}).encode()])
        return "POST", path, raw, {}
    if kind < 0.40:  # wrong method or unknown route
        return rng.choice([("GET", path, b"", {}), ("PUT", "/v1/models", b"{}", {}),
                           ("POST", "/v1/" + "".join(rng.choices("abcxyz", k=6)), b"{}", {})])
    route = "chat" if "chat" in path else "text"
    body = dict(base)
    for _ in range(rng.randrange(1, 3)):  # one or two mutations, each invalid on its own
        where, key, value = rng.choice([m for m in BAD_VALUES if m[0] in ("both", route)])
        if value is None:
            body.pop(key, None)
            if key in base:
                continue
        body[key] = value
    if all(body.get(k) == v for k, v in base.items()) and set(body) == set(base):
        body.pop("model")
    return "POST", path, json.dumps(body).encode(), {"content-type": "application/json"}


def test_two_hundred_malformed_requests_then_healthy(live_server):
    rng = random.Random(1234)
    before = live_server.metrics()
    statuses = []
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        for i in range(200):
            method, path, content, headers = _case(rng)
            r = http.request(method, path, content=content, headers=headers)
            assert 400 <= r.status_code < 500, (i, method, path, content[:200], r.status_code, r.text[:300])
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str), r.text
            statuses.append(r.status_code)
        assert http.get("/health").json() == {"status": "ok"}
        ok = http.post("/v1/completions", json={**TEXT, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    after = live_server.wait_idle()
    rejected = sum(v - before.get(k, 0) for k, v in after.items() if k.startswith("specpilot_rejected_requests_total"))
    assert rejected == 200
    assert {400, 404, 405} <= set(statuses)
