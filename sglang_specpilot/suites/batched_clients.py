"""Closed-loop clients against the server's scheduler: what ``specpilot bench batched`` times.

N client threads share one ``server.scheduler.Scheduler`` (the thread that owns the engine and runs the
continuous-batching loop behind ``specpilot serve``). Client c sends prompts c, c + N, c + 2N, ... one at a
time, each as soon as its previous one finished, so N requests are in flight at once (the usual
"concurrency N" of vLLM's and SGLang's serving benchmarks). HTTP is left out: the parsing and SSE framing
cost the same for every system and would only add noise to the comparison of the engines' rounds.

Per request the sink records the submit time, the time of each event and the tokens it brought:
TTFT = first event - submit (queueing and prefill included), inter-token latency = (last event - first
event) / (tokens - 1), and tokens/s of the request = tokens / (last event - submit).
"""

from __future__ import annotations

import threading
import time

from ..engine.sampling import SamplingParams


def run_clients(sched, engine, prompts: list[list[int]], n_clients: int, new_tokens, timeout_s: float):
    """Run the closed loop; returns (records, wall seconds from the first submit to the last finish).
    ``new_tokens``: tokens every request generates, or a list with prompt i's count at i.

    A record: prompt (index), n_prompt, tokens, token_ids, ttft_s, itl_s, request_s, error (None if it
    finished; a request that failed or timed out keeps its error and counts no tokens)."""
    counts = new_tokens if isinstance(new_tokens, list) else [new_tokens] * len(prompts)
    records: list[dict] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + timeout_s

    def one(i: int) -> dict:
        events: list[tuple[float, int]] = []
        ids: list[int] = []
        failure: list[str] = []
        done = threading.Event()

        def sink(ev) -> None:  # the scheduler thread
            now = time.perf_counter()
            if isinstance(ev, Exception):
                failure.append(f"{type(ev).__name__}: {ev}")
                done.set()
                return
            if ev.token_ids:
                events.append((now, len(ev.token_ids)))
                ids.extend(ev.token_ids)
            if ev.finished:
                if ev.finish_reason == "error":
                    failure.append(str(getattr(ev.result, "error", "error")))
                done.set()

        rec = {"prompt": i, "n_prompt": len(prompts[i])}
        t0 = time.perf_counter()
        try:
            params = SamplingParams(max_new_tokens=counts[i], ignore_eos=True)
            req = engine.new_request(prompts[i], params)
            sched.submit(req, sink)
        except Exception as e:
            return rec | {"error": f"{type(e).__name__}: {e}", "tokens": 0}
        if not done.wait(max(0.0, deadline - t0)):
            failure.append("timeout")
        if failure or not events:
            return rec | {"error": failure[0] if failure else "no tokens", "tokens": 0, "submit": t0}
        first, last = events[0][0], events[-1][0]
        n = len(ids)
        return rec | {
            "error": None,
            "tokens": n,
            "token_ids": ids,
            "submit": t0,
            "end": last,
            "ttft_s": first - t0,
            "itl_s": (last - first) / (n - 1) if n > 1 else None,
            "request_s": last - t0,
            **_ttft_parts(req, t0),
        }

    def client(c: int) -> None:
        for i in range(c, len(prompts), n_clients):
            rec = one(i)
            with lock:
                records.append(rec)
            if rec["error"] == "timeout":
                return

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(n_clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.perf_counter()) + 1.0)
    for r in records:  # arrival times on the run's clock: which prompts came together
        if r.get("submit") is not None:
            r["submit_s"] = r["submit"] - start
    ends = [r["end"] for r in records if r.get("end") is not None]
    wall = (max(ends) if ends else time.perf_counter()) - start
    return sorted(records, key=lambda r: r["prompt"]), wall


def _ttft_parts(req, t0: float) -> dict:
    """Where a request's time to first token went, from the engine's stamps (``Request.admitted_at``,
    ``first_at``): waiting for admission, then admission to its first token on the host (the prefill, and
    whatever it waited for on the device); plus how many prompts its prefill held and whether it overtook
    the rounds in flight. Empty where the engine stamped nothing (a prompt that rode in a round)."""
    if req.admitted_at is None or req.first_at is None:
        return {}
    return {
        "admit_wait_s": req.admitted_at - t0,
        "prefill_s": req.first_at - req.admitted_at,
        "prefill_group": req.prefill_group,
        "overtook": req.overtook,
    }
