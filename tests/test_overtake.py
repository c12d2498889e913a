"""Overtaking prefill (``RowBatch._overtake``): a prompt admitted while rounds are in flight is prefilled
into a free row whose kept length lies past every slot it writes, beside those rounds (on CUDA, on a stream
of higher priority). On the CPU the same bookkeeping runs in order, with the lookahead turned on: which row
it takes, what it writes where, and greedy output equal to each request alone."""

import pytest
import torch
from helpers import WordTokenizer, cuda_tiny_engine, prompts, tiny_drafter, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.rows import OVERTAKE_MARGIN
from sglang_specpilot.server.scheduler import Scheduler

SHAPES = {
    "ar": {},
    "tree": {"tree_budget": 8, "tree_depth": 4, "tree_top_k": 2},
}


def _engine(target, draft, shape):
    opts = EngineOptions(max_seq_len=512, max_batch_size=4, device="cpu", dtype="float32", **SHAPES[shape])
    return Engine(target, WordTokenizer(), opts, draft)


def _row_state(st, row: int) -> list[torch.Tensor]:
    """A row's round state: history, length, next token, in use, and an EAGLE-3 drafter's feature and n_prev."""
    out = [st.history[row], st.seq_len[row], st.next_tok[row], st.in_use[row]]
    out += [st.feats[row, 0], st.n_prev[row]] if st.feats is not None else []
    return [t.clone() for t in out]


def _serve(eng, schedule, overtake=True, snaps=None):
    """Drive the batch with the lookahead on: ``schedule[t]`` = (prompt, new tokens) arriving before step t.
    Returns each request's tokens, its row and its rounds; ``snaps`` (a list) gets, at each admission, the
    new rows' round state."""
    batch = eng.batch
    batch.lookahead, batch.overtake = True, overtake
    reqs, out, in_row, t = [], {}, {}, 0
    while t < len(schedule) or batch.busy:
        work = schedule[t] if t < len(schedule) else []
        arriving = [eng.new_request(p, SamplingParams(max_new_tokens=n, ignore_eos=True)) for p, n in work]
        reqs += arriving
        events = batch.admit(arriving) if arriving else []
        in_row |= {r.index: r for r in arriving}
        if snaps is not None:
            snaps += [_row_state(eng.state, r.index) for r in arriving]
        events += batch.step() if batch.busy else []
        for ev in events:
            out.setdefault(id(in_row[ev.index]), []).extend(ev.token_ids)
        t += 1
    return [out[id(r)] for r in reqs], [r.index for r in reqs], [r.rounds for r in reqs]


@pytest.mark.parametrize("shape,drafter", [("ar", "none"), ("tree", "layer"), ("tree", "eagle3")])
def test_overtaking_prefill_equals_each_request_alone(shape, drafter):
    V = 12 if drafter == "eagle3" else None
    target = tiny_model("tiny-llama", **({"vocab_size": V} if V else {}))
    draft = tiny_drafter(drafter, target)
    long_a, long_b, short_c, short_d = prompts([100, 90, 30, 50], target.cfg.vocab_size, seed=5)
    alone_eng = _engine(target, draft, shape)
    work = [(long_a, 40), (long_b, 90), (short_c, 20), (short_d, 25)]
    alone = [alone_eng.generate([p], SamplingParams(max_new_tokens=n, ignore_eos=True))[0].token_ids for p, n in work]
    eng = _engine(target, draft, shape)
    # a and b start together; c and d arrive once a has finished (its row keeps length >= 140), one by one.
    schedule = [[work[0], work[1]]] + [[]] * 45 + [[work[2]], [], [work[3]]]
    snaps, snaps_off = [], []
    got, rows, rounds = _serve(eng, schedule, snaps=snaps)
    assert got == alone
    assert eng.batch.overtaken >= 1
    assert rows[2] == rows[0]  # the row a left, the lowest whose kept length clears c's 30 slots + margin
    # The drafter's state (an EAGLE-3 drafter's last prompt feature) is what the prefill after the rounds
    # leaves: the same drafts, so the same rounds, as with overtaking off.
    off = _engine(target, draft, shape)
    got_off, rows_off, rounds_off = _serve(off, schedule, overtake=False, snaps=snaps_off)
    assert (got_off, rows_off, off.batch.overtaken) == (alone, rows, 0)
    assert rounds == rounds_off
    for new, old in zip(snaps, snaps_off, strict=True):  # history, length, next token, in use, features, n_prev
        for a, b in zip(new, old, strict=True):
            torch.testing.assert_close(a, b)


def _batch_with_free_row(kept: int):
    target = tiny_model("tiny-llama")
    eng = _engine(target, None, "ar")
    batch = eng.batch
    batch.lookahead = batch.overtake = True
    (p,) = prompts([5], target.cfg.vocab_size, seed=1)
    batch.admit([eng.new_request(p, SamplingParams(max_new_tokens=50, ignore_eos=True))])
    batch.step()
    batch.host_len[0] = kept  # as if the request had reached this length when it left
    return batch


MARGIN = OVERTAKE_MARGIN * 2  # an AR round emits at most one token


def test_overtake_row_needs_the_kept_length_past_the_prompt_and_margin():
    batch = _batch_with_free_row(100 + MARGIN)
    batch.release(0)
    assert batch.overtake_row(100) == 0
    assert batch.overtake_row(101) is None  # its last slot within the margin below the kept length
    batch._inflight = None
    assert batch.overtake_row(10) is None  # nothing in flight: the separate prefill runs at once


def test_no_overtake_into_rows_never_used_short_or_cleared():
    batch = _batch_with_free_row(10 + MARGIN - 1)
    assert batch.overtake_row(10) is None  # rows 1..3 never held a request; row 0 is in use
    batch.release(0)
    assert batch.overtake_row(10) is None  # row 0 kept one slot too few
    batch.host_len[1] = 1000
    batch.rows[1] = object()
    batch.release(1, clear_kv=True)  # its K/V is zeroed after the rounds in flight: nothing may overtake that
    assert batch.overtake_row(10) is None


def test_off_keeps_the_old_path():
    batch = _batch_with_free_row(1000)
    batch.release(0)
    batch.overtake = False
    assert batch.overtake_row(10) is None


class _FakeBatch:
    """What ``Scheduler._poll`` reads: how many of the waiting prompts, in order, may overtake (each at most
    ``limit`` tokens, at most ``rows`` of them)."""

    def __init__(self, limit, rows=3):
        self.limit, self.rows = limit, rows

    @property
    def free_rows(self):
        return list(range(self.rows))

    def overtake_count(self, lens):
        n = next((i for i, k in enumerate(lens) if k > self.limit), len(lens))
        return min(n, self.rows)


def test_poll_admits_the_prompts_that_can_overtake_together(monkeypatch):
    target = tiny_model("tiny-llama")
    eng = _engine(target, None, "ar")
    sched = Scheduler(eng)
    sched.batch = _FakeBatch(limit=10)
    calls = []
    monkeypatch.setattr(sched, "_admit", lambda limit=None: calls.append(sched._take_fair(limit)))
    short, long_ = prompts([5, 20], target.cfg.vocab_size, seed=2)
    params = SamplingParams(max_new_tokens=3)
    sched.submit(eng.new_request(short, params), lambda ev: None)
    sched._poll()
    assert [[len(s.request.prompt) for s in c] for c in calls] == [[5]]
    for _ in range(2):  # two that arrived during the last prefill: one admission, one packed prefill
        sched.submit(eng.new_request(short, params), lambda ev: None)
    sched.submit(eng.new_request(long_, params), lambda ev: None)
    sched.submit(eng.new_request(short, params), lambda ev: None)
    sched._poll()  # the long one cannot overtake: it and the one behind it wait for the round boundary
    assert [[len(s.request.prompt) for s in c] for c in calls] == [[5], [5, 5]]
    assert [len(s.request.prompt) for s in sched._waiting] == [20, 5]


def test_poll_admits_no_more_than_the_rows_that_can_take_them(monkeypatch):
    target = tiny_model("tiny-llama")
    eng = _engine(target, None, "ar")
    sched = Scheduler(eng)
    fake = sched.batch = _FakeBatch(limit=10, rows=2)
    calls = []

    def admit(limit=None):
        calls.append(sched._take_fair(limit))
        fake.rows -= limit

    monkeypatch.setattr(sched, "_admit", admit)
    (short,) = prompts([5], target.cfg.vocab_size, seed=2)
    for _ in range(3):
        sched.submit(eng.new_request(short, SamplingParams(max_new_tokens=3)), lambda ev: None)
    sched._poll()
    assert [len(c) for c in calls] == [2] and len(sched._waiting) == 1


def test_overtake_count_gives_each_prompt_its_own_row_in_order():
    batch = _batch_with_free_row(100 + MARGIN)
    batch.release(0)
    assert batch.overtake_count([10, 10]) == 1  # one free row keeps a length: one prompt overtakes
    assert batch.overtake_count([101, 10]) == 0  # the first in line cannot: none goes ahead of it
    batch._free_len[1] = 100 + MARGIN
    assert batch.overtake_count([10, 100, 5]) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["none", "layer", "eagle3"])
def test_overtaking_prefill_on_cuda_equals_each_request_alone_gpu(kind):
    """On CUDA the prefill replays a captured packed graph on a stream of higher priority while the rounds
    in flight run on their own: prompts that take it get the tokens they get alone, and so do the rows
    whose rounds ran beside it."""
    eng = cuda_tiny_engine(kind, max_seq_len=512)
    assert (8, 1, 64) in eng.packed_graphs
    V = eng.target.cfg.vocab_size
    longs = prompts([100, 90, 95, 110, 105, 98], V, seed=7)
    shorts = prompts([30, 50, 12, 60], V, seed=8)
    work = [(p, n) for p, n in zip(longs, [40, 120, 45, 120, 50, 120], strict=True)]
    work += [(p, 30) for p in shorts]
    alone = [eng.generate([p], SamplingParams(max_new_tokens=n, ignore_eos=True))[0].token_ids for p, n in work]
    schedule = [work[:6]] + [[]] * 60 + [[w] for w in work[6:]]
    got, _, _ = _serve(eng, schedule)
    assert got == alone
    assert eng.batch.overtaken >= 2


def test_own_counters_swaps_each_layer_once_and_restores():
    from sglang_specpilot.models.linear import Linear, own_counters

    target = tiny_model("tiny-llama")
    layers = [m for m in target.modules() if isinstance(m, Linear)][:3]
    shared = [torch.zeros(8, dtype=torch.int32) for _ in layers]
    for m, c in zip(layers, shared, strict=True):
        m.counters = c
    kept = {}
    with own_counters((target, target), kept):  # a model given twice (a drafter sharing the target's head)
        inside = [m.counters for m in layers]
    assert all(a is kept[m] and a is not c for a, m, c in zip(inside, layers, shared, strict=True))
    assert all(m.counters is c for m, c in zip(layers, shared, strict=True))
    with own_counters((target,), kept):  # the same private buffers the next capture: graphs keep their address
        assert all(m.counters is a for m, a in zip(layers, inside, strict=True))


def test_commit_pending_writes_a_captured_buckets_rows():
    """A captured prefill's pending state is bucket-sized (8 rows here) while fewer rows are in use: rows
    it kept take its features and n_prev 0, the others keep theirs (the GPU's first failure: B-sized)."""
    from types import SimpleNamespace

    from sglang_specpilot.engine.packed_prefill import commit_pending

    st = SimpleNamespace(feats=torch.ones(8, 3, 4), n_prev=torch.full((8,), 5))
    kept = torch.tensor([False, True] + [False] * 6)
    commit_pending(st, 2, [(kept, torch.full((8, 4), 7.0))])
    assert st.feats[1, 0].tolist() == [7.0] * 4 and st.n_prev[1] == 0
    assert st.feats[0, 0].tolist() == [1.0] * 4 and st.n_prev.tolist() == [5, 0] + [5] * 6


def test_gather_window_holds_overtaking_prompts_until_the_finished_requests_clients_return(monkeypatch):
    """With a gather window (``scheduler.GATHER_S``), after a dispatch that finished two requests the first
    prompt to come back waits for the second, then both are admitted in one prefill; a window that passes
    admits what came. Off (the default), the first is admitted at once."""
    import sglang_specpilot.server.scheduler as sched_mod
    from sglang_specpilot.engine.request import StreamEvent

    target = tiny_model("tiny-llama")
    eng = _engine(target, None, "ar")
    sched = Scheduler(eng)
    sched.batch = _FakeBatch(limit=10, rows=4)
    calls = []
    monkeypatch.setattr(sched, "_admit", lambda limit=None: calls.append(len(sched._take_fair(limit))))
    (short,) = prompts([5], target.cfg.vocab_size, seed=2)

    def finish_two():
        sched._dispatch([StreamEvent(index=i, token_ids=[], text="", finished=True) for i in (0, 1)])

    def arrive():
        sched.submit(eng.new_request(short, SamplingParams(max_new_tokens=3)), lambda ev: None)

    monkeypatch.setattr(sched_mod, "GATHER_S", 0.0)  # off: as before
    finish_two()
    arrive()
    sched._poll()
    assert calls == [1]
    monkeypatch.setattr(sched_mod, "GATHER_S", 60.0)  # a window no test outlasts
    calls.clear()
    finish_two()
    arrive()
    sched._poll()
    assert calls == [] and len(sched._waiting) == 1  # one of two clients back: wait for the other
    arrive()
    sched._poll()
    assert calls == [2]  # both back: one admission
    finish_two()
    arrive()
    sched._owed_since -= 61.0  # the window passed
    sched._poll()
    assert calls == [2, 1]
