"""600 malformed requests (raw httpx, seeded): each gets a 4xx OpenAI-style error (never a 5xx), the server
stays healthy, and the same greedy request gives the same answer before and after."""

import json
import random

import pytest
from live_server import MODEL

httpx = pytest.importorskip("httpx")

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TEXT = {"model": MODEL, "prompt": "hi", "max_tokens": 2}

# Each mutation alone makes a valid body invalid: (routes it applies to, key, value); value None = delete key.
BAD_VALUES = [
    ("both", "model", "no-such-model"),
    ("both", "model", 7),
    ("both", "model", None),
    ("both", "max_tokens", -1),
    ("both", "max_tokens", 0),
    ("both", "max_tokens", 1.5),
    ("both", "max_tokens", "many"),
    ("both", "max_tokens", 10**9),
    ("both", "temperature", -0.5),
    ("both", "temperature", 2.5),
    ("both", "temperature", "hot"),
    ("both", "top_p", 0),
    ("both", "top_p", 1.5),
    ("both", "top_k", -3),
    ("both", "n", 2),
    ("both", "n", 0),
    ("both", "stream", "maybe"),
    ("both", "stream_options", {"include_usage": True}),
    ("both", "stop", ["a", "b", "c", "d", "e"]),
    ("both", "stop", 12),
    ("both", "stop", [""]),
    ("both", "seed", "x"),
    ("both", "presence_penalty", 1.0),
    ("both", "frequency_penalty", -1.0),
    ("both", "logit_bias", {"50": 10}),
    ("both", "best_of_all", 3),
    ("both", "fancy_option", True),
    ("both", "user", ["not", "a", "string"]),
    ("chat", "messages", []),
    ("chat", "messages", "hi"),
    ("chat", "messages", [{"content": "no role"}]),
    ("chat", "messages", [{"role": "wizard", "content": "x"}]),
    ("chat", "messages", None),
    ("chat", "messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
    ("chat", "logprobs", True),
    ("chat", "top_logprobs", 3),
    ("chat", "tools", [{"type": "function"}]),
    ("chat", "tool_choice", "required"),
    ("chat", "response_format", {"type": "json_object"}),
    ("chat", "max_completion_tokens", -5),
    ("chat", "prompt", "hi"),
    ("text", "prompt", []),
    ("text", "prompt", {}),
    ("text", "prompt", [1.5]),
    ("text", "prompt", [-1]),
    ("text", "prompt", [10**9]),
    ("text", "prompt", [[]]),
    ("text", "prompt", None),
    ("text", "logprobs", 2),
    ("text", "echo", True),
    ("text", "best_of", 3),
    ("text", "suffix", "tail"),
    ("text", "messages", []),
    # loose types (OpenAI refuses them rather than coercing) and values that would poison the engine
    ("both", "max_tokens", True),
    ("both", "max_tokens", "3"),
    ("both", "max_tokens", 3.0),
    ("both", "stream", "yes"),
    ("both", "stream", 1),
    ("both", "temperature", "0"),
    ("both", "n", True),
    ("both", "top_k", "5"),
    ("both", "seed", 2**64),
    ("both", "seed", -1),
    ("both", "seed", 1.5),
    ("both", "top_k", 2**63),
    ("both", "top_k", 10**7),
    ("both", "ignore_eos", "no"),
    ("both", "stop", [None]),
    ("chat", "messages", [{"role": "user", "content": 5}]),
    ("chat", "messages", [{"role": "user", "content": "\ud800"}]),
    ("text", "prompt", "bad \udfff"),
    ("text", "prompt", [1, True]),
    ("text", "prompt", ["a", 1]),
    ("text", "prompt", [[1], "a"]),
    ("text", "prompt", ["x"] * 100),
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
        raw = rng.choice(
            [
                b"[]",
                b"null",
                b"42",
                b'"text"',
                b'{"model": NaN}',
                b"[" * 50 + b"]" * 50,
                json.dumps({**base, "temperature": float("nan")}).encode(),
            ]
        )
        return "POST", path, raw, {}
    if kind < 0.40:  # wrong method or unknown route
        return rng.choice(
            [
                ("GET", path, b"", {}),
                ("PUT", "/v1/models", b"{}", {}),
                ("POST", "/v1/" + "".join(rng.choices("abcxyz", k=6)), b"{}", {}),
            ]
        )
    if kind < 0.50:  # hostile bodies: deep nesting, lone surrogates, non-JSON content types, oversize
        depth = rng.choice([40, 1000, 30_000])
        deep = json.dumps({**base, "user": "u"}).encode()[:-1] + b', "metadata": ' + b"[" * depth + b"]" * depth + b"}"
        lone = json.dumps(base).replace('"hi"', '"h\\ud800i"').encode()
        ctype = rng.choice(
            ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b", "application/xml"]
        )
        return rng.choice(
            [
                ("POST", path, deep, {"content-type": "application/json"}),
                ("POST", path, lone, {}),
                ("POST", path, json.dumps(base).encode(), {"content-type": ctype}),
                ("POST", path, b"{" + b" " * (5 << 20) + b"}", {}),
            ]
        )
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


N = 600


def test_six_hundred_malformed_requests_then_healthy(live_server):
    rng = random.Random(1234)
    statuses = []
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        greedy = http.post("/v1/completions", json={**TEXT, "temperature": 0, "max_tokens": 8})
        assert greedy.status_code == 200
        before = live_server.wait_idle()
        for i in range(N):
            method, path, content, headers = _case(rng)
            r = http.request(method, path, content=content, headers=headers)
            assert 400 <= r.status_code < 500, (i, method, path, content[:200], r.status_code, r.text[:300])
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str), r.text
            statuses.append(r.status_code)
        assert http.get("/health").json() == {"status": "ok"}
        after = live_server.wait_idle()
        ok = http.post("/v1/completions", json={**TEXT, "temperature": 0, "max_tokens": 8})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
    rejected = sum(v - before.get(k, 0) for k, v in after.items() if k.startswith("specpilot_rejected_requests_total"))
    assert rejected == N
    errors_5xx = {
        k: v - before.get(k, 0) for k, v in after.items() if k.startswith('specpilot_rejected_requests_total{status="5')
    }
    assert not any(errors_5xx.values()), errors_5xx
    assert {400, 404, 405, 413, 415} <= set(statuses)
