"""`specpilot serve` end to end: the real openai client against the embedded SmolLM2 on 127.0.0.1."""

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from live_server import MODEL, SERVE_ARGS

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def client(live_server):
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(client, text, **kw):
    kw = {"max_tokens": 8, "temperature": 0, **kw}
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], **kw)


def test_models_health_and_metrics(client, live_server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(live_server.url + "/health").json() == {"status": "ok"}
    m = live_server.metrics()
    assert m["specpilot_kv_rows_total"] == 8 and "specpilot_mean_accepted_tokens_per_step" in m


def test_non_streaming_chat_and_completion(client):
    r = chat(client, "Name a color.")
    assert r.object == "chat.completion" and r.model == MODEL and r.choices[0].message.role == "assistant"
    u = r.usage
    assert u.completion_tokens <= 8 and u.prompt_tokens > 5 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content
    c = client.completions.create(model=MODEL, prompt=["def add(a, b):", "import os\n"], max_tokens=6, temperature=0)
    assert [ch.index for ch in c.choices] == [0, 1] and all(ch.text for ch in c.choices)
    assert c.usage.completion_tokens <= 12


def test_streaming_equals_non_streaming(client):
    full = chat(client, "Write one word about the sea.", max_tokens=10)
    stream = chat(
        client, "Write one word about the sea.", max_tokens=10, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stop_strings_and_seeded_sampling(client):
    base = chat(client, "Count from 1 to 9 with commas.", max_tokens=16).choices[0].message.content
    cut = base.find("3")
    assert cut > 0, base
    stopped = chat(client, "Count from 1 to 9 with commas.", max_tokens=16, stop=["3"])
    assert stopped.choices[0].message.content == base[:cut] and stopped.choices[0].finish_reason == "stop"
    a, b = (chat(client, "Tell me a story.", temperature=1.0, top_p=0.9, seed=5, max_tokens=8) for _ in range(2))
    assert a.choices[0].message.content == b.choices[0].message.content


@pytest.mark.slow
def test_sixteen_concurrent_clients(client, live_server):
    prompts = [f"Give me a fact about the number {i}." for i in range(16)]
    solo = {i: chat(client, prompts[i]).choices[0].message.content for i in (0, 7, 15)}
    batch = live_server.scheduler.batch
    sizes, step = [], batch.step

    def spy(**kw):
        sizes.append(batch.active)
        return step(**kw)

    batch.step = spy
    try:
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda p: chat(client, p), prompts))
    finally:
        del batch.step
    assert all(r.choices[0].message.content and r.usage.completion_tokens >= 1 for r in results)
    # Requests were batched (8 KV rows, so half of them queued), and each got its own prompt's answer.
    assert max(sizes) == 8
    assert {i: results[i].choices[0].message.content for i in solo} == solo
    live_server.wait_idle()


def test_disconnect_mid_stream_frees_every_row(live_server):
    before = live_server.metrics()
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 400,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(timeout=60) as http, http.stream("POST", live_server.url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        got = []
        for line in r.iter_lines():
            if line.startswith("data: {"):
                got.append(json.loads(line[6:]))
            if len(got) >= 3:
                break
    # A non-streaming client that gives up (timeout) is withdrawn the same way.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(live_server.url + "/v1/completions", json={**body, "stream": False}, timeout=2.0)
    after = live_server.wait_idle(timeout=30)
    assert (
        after['specpilot_requests_total{outcome="cancelled"}']
        - before.get('specpilot_requests_total{outcome="cancelled"}', 0)
        == 2
    )
    # Neither request ran to its 400 tokens.
    assert after["specpilot_generation_tokens_total"] - before["specpilot_generation_tokens_total"] < 400
    # A client that left is counted (499), never a server error.
    key = 'specpilot_rejected_requests_total{status="500"}'
    assert after.get(key, 0) == before.get(key, 0)


def test_prompt_too_long_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "word " * 600)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "hi", max_tokens=500)
    assert e.value.code == "context_length_exceeded"


@pytest.mark.slow
@pytest.mark.parametrize("chat_mode", [True, False])
def test_greedy_equals_specpilot_generate(client, chat_mode):
    prompt = "Write a Python function that reverses a string." if chat_mode else "def fibonacci(n):"
    engine_args = SERVE_ARGS[1:]  # the same engine options as the server (minus the batch size)
    cmd = [
        sys.executable,
        "-m",
        "sglang_specpilot.cli",
        "generate",
        "--prompt",
        prompt,
        "--max-new-tokens",
        "16",
        "--json",
        *engine_args,
    ] + ([] if chat_mode else ["--no-chat"])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    ref = json.loads(p.stdout.strip().splitlines()[-1])
    if chat_mode:
        got = chat(client, prompt, max_tokens=16)
        text, n = got.choices[0].message.content, got.usage.completion_tokens
    else:
        got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
        text, n = got.choices[0].text, got.usage.completion_tokens
    assert text == ref["text"] and n == len(ref["token_ids"])
    assert got.choices[0].finish_reason == ref["finish_reason"]


def test_slow_readers_do_not_block_the_server(live_server):
    """Streams that are read slowly still complete; the scheduler never blocks on a client."""
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 6, "temperature": 0, "stream": True}
    out = []

    def slow():
        with httpx.stream("POST", live_server.url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                time.sleep(0.05)
                out.append(line)

    threads = [threading.Thread(target=slow) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert out.count("data: [DONE]") == 3
