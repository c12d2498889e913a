"""The server's engine thread without HTTP: batching, cancellation, and surviving a failed round."""

import threading

from helpers import engine, prompts, tiny_model

from sglang_specpilot.engine import SamplingParams
from sglang_specpilot.server.scheduler import Scheduler


class Collector:
    def __init__(self):
        self.items, self.done = [], threading.Event()

    def __call__(self, item):
        self.items.append(item)
        if isinstance(item, Exception) or item.finished:
            self.done.set()

    def ids(self):
        return [t for ev in self.items for t in ev.token_ids]


def _setup(max_batch=2):
    target = tiny_model("tiny-llama")
    eng = engine(target, target.truncated(2), gamma=3, max_batch=max_batch)
    return eng, Scheduler(eng, idle_wait_s=0.05)


def test_requests_through_the_thread_equal_alone():
    eng, sched = _setup()
    ps = prompts([4, 11, 6, 9, 3], eng.target.cfg.vocab_size, seed=8)
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    alone = [eng.generate([p], params)[0].token_ids for p in ps]
    sched.start()
    try:
        sinks = [Collector() for _ in ps]
        for p, s in zip(ps, sinks, strict=True):
            sched.submit(eng.new_request(p, params), s)
        assert all(s.done.wait(60) for s in sinks)
    finally:
        sched.stop()
    assert [s.ids() for s in sinks] == alone
    m = sched.metrics
    assert m.requests["length"] == 5 and m.generation_tokens == 50 and m.queue_depth == 0
    assert sched.batch.free_rows == [0, 1]


def test_cancel_waiting_and_running_requests():
    eng, sched = _setup(max_batch=1)
    a, b = prompts([5, 7], eng.target.cfg.vocab_size, seed=1)
    long = SamplingParams(max_new_tokens=200, ignore_eos=True)
    first, second = Collector(), Collector()
    got_token, cancels_sent = threading.Event(), threading.Event()

    def first_sink(item):
        # Hold the engine thread on the first token until both cancels are queued, so the tiny model
        # cannot finish its 200 tokens first (sinks must not block; this one does so on purpose).
        first(item)
        got_token.set()
        cancels_sent.wait(60)

    sched.start()
    try:
        id_a = sched.submit(eng.new_request(a, long), first_sink)
        id_b = sched.submit(eng.new_request(b, long), second)  # waits: one row only
        assert got_token.wait(60)
        sched.cancel(id_b)
        sched.cancel(id_a)
        cancels_sent.set()
        pause = threading.Event()
        for _ in range(400):
            if sched.metrics.requests["cancelled"] == 2:
                break
            pause.wait(0.05)
    finally:
        sched.stop()
    assert sched.metrics.requests["cancelled"] == 2 and not first.done.is_set() and not second.items
    assert sched.batch.free_rows == [0] and sched.metrics.queue_depth == 0


def test_a_failed_round_fails_its_requests_only():
    eng, sched = _setup()
    (p,) = prompts([6], eng.target.cfg.vocab_size, seed=2)
    params = SamplingParams(max_new_tokens=5, ignore_eos=True)
    step, calls = sched.batch.step, []

    def broken_once(**kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("device fell over")
        return step(**kw)

    sched.batch.step = broken_once
    sched.start()
    try:
        failed, fine = Collector(), Collector()
        sched.submit(eng.new_request(p, params), failed)
        assert failed.done.wait(60)
        sched.submit(eng.new_request(p, params), fine)
        assert fine.done.wait(60)
    finally:
        sched.stop()
    assert isinstance(failed.items[-1], RuntimeError)
    assert fine.ids() == eng.generate([p], params)[0].token_ids
    assert sched.metrics.requests["error"] == 1 and sched.batch.free_rows == [0, 1] and sched.alive is False
