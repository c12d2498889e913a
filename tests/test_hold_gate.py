"""The gates of a captured round (kernels/hold_gate.py, ``ModelRunner.hold``): a round waits at them while a
prefill that overtakes it holds the flag, and goes on, with the same logits, once the flag is released."""

import threading
import time

import pytest
import torch
from helpers import WordTokenizer, cuda_tiny_engine, kernel_cases, prompts, tiny_model

import sglang_specpilot.engine.rows as rows_mod
import sglang_specpilot.engine.runner as runner_mod
import sglang_specpilot.kernels.hold_gate as gate_mod
from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.kernels.hold_gate import hold, release, wait_while_held, wait_while_held_ref

INTERP, DEVICE, kernel_case, test_kernel_cases_in_interpreter = kernel_cases(__file__, gate_mod, "_wait_while_held")


def _waits(fn, flag) -> bool:
    """Whether ``fn(flag)`` is still waiting 0.3 s after it started with ``flag`` held, and returns once the
    flag is released."""
    hold(flag)
    th = threading.Thread(target=fn, args=(flag,), daemon=True)
    th.start()
    time.sleep(0.3)
    waiting = th.is_alive()
    release(flag)
    th.join(timeout=10)
    assert not th.is_alive(), "the gate did not go on after release"
    return waiting


def test_reference_waits_while_held_and_goes_on_when_released():
    flag = torch.zeros(1, dtype=torch.int32)
    wait_while_held_ref(flag)  # clear: returns at once
    assert _waits(wait_while_held_ref, flag)
    hold(flag)
    wait_while_held_ref(flag, spins=5)  # never released: goes on after its reads


@kernel_case
def test_kernel_gate_waits_while_held_and_goes_on_when_released():
    flag = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    wait_while_held(flag)  # clear: goes on at once
    if DEVICE == "cpu":  # the interpreter runs the kernel on the calling thread
        assert _waits(wait_while_held, flag)
        hold(flag)
        wait_while_held(flag, spins=50)  # never released: goes on after its reads
        return
    torch.cuda.synchronize()
    hold(flag)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        wait_while_held(flag)
        done = torch.cuda.Event()
        done.record(side)
    time.sleep(0.05)  # well inside what SPINS reads take (~160 ms on the H100: SPINS' comment)
    assert not done.query(), "the gate went on while held"
    release(flag)  # the default stream: another one than the gate's
    done.synchronize()
    # Never released: the gate goes on by itself after SPINS reads (what that takes is SPINS' comment).
    hold(flag)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.cuda.stream(side):
        wait_while_held(flag)
    side.synchronize()
    waited = time.perf_counter() - t0
    release(flag)
    print(f"a held gate went on by itself after {waited * 1e3:.0f} ms ({gate_mod.SPINS} reads)")
    assert 0.01 < waited < 10


def test_runner_gates_a_round_forward_at_evenly_spaced_layers(monkeypatch):
    """With ``hold`` a tensor a round's target forward calls the gate before layers 0, L/4, L/2, 3L/4 (L = 8:
    0, 2, 4, 6), and its logits are the gateless forward's; prefill forwards never wait."""
    target = tiny_model("tiny-llama", num_layers=8)
    opts = EngineOptions(max_seq_len=128, max_batch_size=2, device="cpu", dtype="float32")
    eng = Engine(target, WordTokenizer(), opts)
    runner = eng.target_runner
    assert runner.hold is None  # CPU: no graphs, no lookahead, no gates
    assert not runner.enable_gates() and runner.hold is None
    seen = []
    monkeypatch.setattr(runner_mod, "wait_while_held", lambda flag: seen.append((flag, len(seen))))
    toks = torch.tensor([[3], [5]])
    seq = torch.tensor([4, 7])
    pos = seq[:, None]
    anc = torch.ones(1, 1, dtype=torch.bool)
    plain = runner.forward(toks, pos, pos, seq, anc)
    assert seen == []
    runner.hold = torch.zeros(1, dtype=torch.int32)
    gated = runner.forward(toks, pos, pos, seq, anc)
    assert len(seen) == runner_mod.GATES and all(f is runner.hold for f, _ in seen)
    torch.testing.assert_close(gated, plain)
    # the gate's layers: count the calls between the blocks
    calls = []
    monkeypatch.setattr(runner_mod, "wait_while_held", lambda flag: calls.append(len(layer_runs)))
    layer_runs = []
    real = runner._layer_fn or runner_mod.run_block
    monkeypatch.setattr(runner, "_layer_fn", lambda *a: layer_runs.append(1) or real(*a))
    runner.forward(toks, pos, pos, seq, anc)
    assert calls == [0, 2, 4, 6]
    calls.clear()
    eng.generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=1))  # a prefill (and no round)
    assert calls == []


@pytest.mark.parametrize("drafter", ["layer", "eagle3"])
def test_a_drafters_runner_gates_each_draft_step_once(drafter, monkeypatch):
    """``share_gates``: every round forward of the drafter's runner (one a draft step) waits at the target's
    flag once, before its layers, whatever layers it has; its logits (or hidden states) are the gateless
    ones, and a round of the engine waits once a draft step."""
    from helpers import tiny_drafter

    V = 12 if drafter == "eagle3" else None
    target = tiny_model("tiny-llama", num_layers=8, **({"vocab_size": V} if V else {}))
    opts = EngineOptions(max_seq_len=128, max_batch_size=2, device="cpu", dtype="float32", tree_budget=6,
                         tree_depth=3, tree_top_k=2)  # fmt: skip
    eng = Engine(target, WordTokenizer(), opts, tiny_drafter(drafter, target))
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    (p,) = prompts([9], target.cfg.vocab_size, seed=4)
    plain = eng.generate([p], params)[0].token_ids
    seen = []
    monkeypatch.setattr(runner_mod, "wait_while_held", lambda flag: seen.append(flag))
    flag = torch.zeros(1, dtype=torch.int32)
    eng.draft_runner.share_gates(flag)
    assert eng.generate([p], params)[0].token_ids == plain
    assert seen and all(f is flag for f in seen)
    draft_forwards = []
    real = eng.draft_runner._round_forward
    monkeypatch.setattr(eng.draft_runner, "_round_forward", lambda *a, **k: draft_forwards.append(1) or real(*a, **k))
    seen.clear()
    eng.generate([p], params)
    assert len(seen) == len(draft_forwards) > 0  # one gate a draft forward, none inside its layers


def _cpu_overtaking_engine():
    target = tiny_model("tiny-llama")
    opts = EngineOptions(max_seq_len=512, max_batch_size=4, device="cpu", dtype="float32")
    eng = Engine(target, WordTokenizer(), opts)
    eng.target_runner.hold = torch.zeros(1, dtype=torch.int32)
    batch = eng.batch
    batch.lookahead, batch.overtake = True, True
    long_a, long_b, short_c = prompts([100, 90, 30], target.cfg.vocab_size, seed=5)
    a = eng.new_request(long_a, SamplingParams(max_new_tokens=20, ignore_eos=True))
    b = eng.new_request(long_b, SamplingParams(max_new_tokens=60, ignore_eos=True))
    batch.admit([a, b])
    while batch.rows[a.index] is not None or batch._inflight is None:  # a done and freed, b's round in flight
        batch.step()
    return eng, eng.new_request(short_c, SamplingParams(max_new_tokens=5, ignore_eos=True))


def test_overtaking_prefill_holds_the_rounds_while_it_runs_and_releases_them(monkeypatch):
    eng, c = _cpu_overtaking_engine()
    flag, seen = eng.target_runner.hold, []
    real = rows_mod.packed_prefill
    monkeypatch.setattr(rows_mod, "packed_prefill", lambda *a, **k: seen.append(int(flag[0])) or real(*a, **k))
    assert eng.batch.overtake_row(len(c.prompt)) is not None
    eng.batch.admit([c])
    assert eng.batch.overtaken == 1
    assert seen == [1]  # held while the prefill ran
    assert int(flag[0]) == 0  # released after it


def test_the_rounds_go_on_once_the_targets_half_is_done(monkeypatch):
    """The flag is released where the first tokens are read (``packed_prefill``'s ``between``), before the
    drafter's half: the rounds wait for the target's half alone."""
    eng, c = _cpu_overtaking_engine()
    flag, seen = eng.target_runner.hold, []
    real = rows_mod.packed_prefill

    def spy(*a, between=None, **k):
        def first(last):
            seen.append(int(flag[0]))
            between(last)
            seen.append(int(flag[0]))

        return real(*a, between=first, **k)

    monkeypatch.setattr(rows_mod, "packed_prefill", spy)
    eng.batch.admit([c])
    assert eng.batch.overtaken == 1 and seen == [1, 0]


def test_a_prefill_that_raises_still_releases_the_rounds(monkeypatch):
    eng, c = _cpu_overtaking_engine()

    def broken(*a, **k):
        raise RuntimeError("prefill failed")

    monkeypatch.setattr(rows_mod, "packed_prefill", broken)
    c.index = eng.batch.overtake_row(len(c.prompt))
    eng.batch.rows[c.index] = c
    with pytest.raises(RuntimeError, match="prefill failed"):
        eng.batch._overtake([c])
    assert int(eng.target_runner.hold[0]) == 0


@pytest.mark.gpu
def test_a_captured_round_waits_at_its_gates_while_held_gpu(monkeypatch):
    """On CUDA: a captured round launched while the flag is held does not finish until it is released; the
    requests then get the tokens they get alone."""
    monkeypatch.setattr(runner_mod, "GATE_MIN_HIDDEN", 0)  # a tiny model: gates as on a wide one
    eng = cuda_tiny_engine("layer", max_seq_len=512)
    flag = eng.target_runner.hold
    assert flag is not None
    V = eng.target.cfg.vocab_size
    work = prompts([40, 50], V, seed=3)
    params = SamplingParams(max_new_tokens=60, ignore_eos=True)
    alone = [eng.generate([p], params)[0].token_ids for p in work]
    reqs = [eng.new_request(p, params) for p in work]
    batch = eng.batch
    events = batch.admit(reqs)
    out = {r.index: [] for r in reqs}
    events += batch.step()  # round 1 launched
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        hold(flag)
    side.synchronize()
    events += batch.step()  # round 2 launched (held at its first gate), round 1 read
    time.sleep(0.2)
    assert not batch._inflight.done.query(), "the round ran through a held gate"
    with torch.cuda.stream(side):
        release(flag)
    while batch.busy:
        events += batch.step()
    for ev in events:
        out[ev.index] += ev.token_ids
    assert [out[r.index] for r in reqs] == alone
