"""Prompt admission (issue 18): prompts that arrive while rows run are prefilled inside the next round's
verify pass; greedy output equals each request alone, and no running request is starved."""

import pytest
import torch
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.admission import FALLBACK, FULL, IDLE, LONG, RIDE, SLOWER, admission_path
from sglang_specpilot.models.llama import Transformer
from sglang_specpilot.models.mixed_forward import Group, mixed_forward

SHAPES = {
    "ar": {},
    "chain": {"num_speculative_tokens": 4},
    "tree": {"tree_budget": 8, "tree_depth": 4, "tree_top_k": 2},
}


def _engine(target, draft, shape, **kw):
    opts = EngineOptions(max_seq_len=256, max_batch_size=8, device="cpu", dtype="float32", **SHAPES[shape], **kw)
    return Engine(target, WordTokenizer(), opts, draft)


def _serve(eng, schedule, n_new, lookahead=False):
    """Drive the batch like the scheduler: ``schedule[t]`` = prompts arriving before step t. Returns each
    prompt's tokens, the step its first token came out at, and the tokens every request had per step.
    ``lookahead``: launch round t + 1 before reading round t back, as on CUDA."""
    batch, params = eng.batch, SamplingParams(max_new_tokens=n_new, ignore_eos=True)
    batch.lookahead = lookahead
    out, first_at, per_step, reqs = {}, {}, [], {}
    t = 0
    while t < len(schedule) or batch.busy:
        arriving = [eng.new_request(p, params) for p in (schedule[t] if t < len(schedule) else [])]
        for r in arriving:
            reqs[id(r)] = (len(reqs), r)
        events = batch.admit(arriving) if arriving else []
        events += batch.step() if batch.busy else []
        for ev in events:
            req = next(r for i, r in reqs.values() if r.index == ev.index and not (i in out and out[i][1]))
            i = reqs[id(req)][0]
            toks, _ = out.get(i, ([], False))
            out[i] = (toks + ev.token_ids, ev.finished)
            first_at.setdefault(i, t)
        per_step.append({i: len(out.get(i, ([], 0))[0]) for i, _ in reqs.values()})
        t += 1
    return [out[i][0] for i in range(len(reqs))], first_at, per_step


def _drafter(kind, target):
    if kind == "eagle3":
        from sglang_specpilot.drafters.eagle3 import init_eagle3

        torch.manual_seed(0)
        return init_eagle3(target)
    return None if kind == "none" else target.truncated(1)


@pytest.mark.parametrize(
    "shape,drafter,lookahead",
    [("ar", "none", False), ("chain", "layer", False), ("tree", "layer", True), ("tree", "eagle3", False),
     ("tree", "eagle3", True)],
)  # fmt: skip
def test_greedy_with_admission_equals_each_request_alone(shape, drafter, lookahead):
    V = 12 if drafter == "eagle3" else None
    target = tiny_model("tiny-llama", **({"vocab_size": V} if V else {}))
    draft = _drafter(drafter, target)
    lens = [7, 30, 3, 61, 12, 45]  # mixed lengths, one past the allowance below
    ps = prompts(lens, target.cfg.vocab_size, seed=3)
    alone_eng = _engine(target, draft, shape)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    alone = [alone_eng.generate([p], params)[0].token_ids for p in ps]
    eng = _engine(target, draft, shape, prompt_admission=64)
    schedule = [[ps[0]], [], [ps[1], ps[2]], [ps[3]], [], [ps[4], ps[5]]]
    got, _, _ = _serve(eng, schedule, 20, lookahead)
    assert got == alone
    a = eng.batch.admissions
    assert a[IDLE] == 1 and a[RIDE] >= 3 and FALLBACK not in a  # the first found nothing running


def test_running_requests_are_never_starved_and_riders_start_at_once():
    target = tiny_model("tiny-llama")
    eng = _engine(target, target.truncated(1), "chain", prompt_admission=32)
    ps = prompts([5] + [9] * 6, target.cfg.vocab_size, seed=5)
    schedule = [[ps[0]]] + [[p] for p in ps[1:]]  # a new prompt before every step
    got, first_at, per_step = _serve(eng, schedule, 16)
    for t in range(1, len(per_step)):
        for i, before in per_step[t - 1].items():
            if 0 < before < 16:  # running at step t - 1 and unfinished: it gained tokens in step t
                assert per_step[t][i] > before, (t, i)
    # A prompt admitted before step t (t >= 1) rides step t's round and has its first token from it.
    assert all(first_at[i] == i for i in range(1, len(ps)))
    assert eng.batch.admissions[RIDE] == len(ps) - 1
    ref = _engine(target, target.truncated(1), "chain")
    assert got == [ref.generate([p], SamplingParams(max_new_tokens=16, ignore_eos=True))[0].token_ids for p in ps]


def test_allowance_is_shared_by_a_round_and_long_prompts_take_the_prefill():
    target = tiny_model("tiny-llama")
    eng = _engine(target, target.truncated(1), "chain", prompt_admission=16)
    ps = prompts([4, 10, 10, 40], target.cfg.vocab_size, seed=6)
    _serve(eng, [[ps[0]], ps[1:]], 6)
    # 10 fits, the second 10 no longer fits the round's 16 tokens, 40 never does.
    assert eng.batch.admissions == {IDLE: 1, RIDE: 1, FULL: 1, LONG: 1}


def test_measured_costs_keep_a_prompt_out_of_a_slower_round():
    assert admission_path(10, 2, 64, 64, 1, (3.0, 4.0)) == RIDE
    assert admission_path(10, 2, 64, 64, 1, (5.0, 4.0)) == SLOWER  # its first token would come later
    assert admission_path(10, 2, 64, 64, 1, None) == RIDE  # not measured (CPU): ride
    target = tiny_model("tiny-llama")
    eng = _engine(target, target.truncated(1), "chain", prompt_admission=64)
    eng.admission_costs = {(b, 64): (2.0, 1.0) for b in (1, 2, 4, 8)}  # planted: carrying is slower
    ps = prompts([5, 9, 12], target.cfg.vocab_size, seed=7)
    got, _, _ = _serve(eng, [[ps[0]], [ps[1]], [ps[2]]], 8)
    assert eng.batch.admissions == {IDLE: 1, SLOWER: 2}
    ref = _engine(target, target.truncated(1), "chain")
    assert got == [ref.generate([p], SamplingParams(max_new_tokens=8, ignore_eos=True))[0].token_ids for p in ps]


def test_carry_kind_keeps_the_riders_ttft():
    from types import SimpleNamespace

    from sglang_specpilot.engine.admission import carry_kind

    eng = SimpleNamespace(carry_ms={(4, 64): {(6, 8): 9.0, "ar": 6.5}}, admission_costs={(4, 64): (6.5, 7.0)})
    assert carry_kind(eng, 4, 64, (6, 8)) == "ar"  # the speculative round alone outlasts the prefill
    assert carry_kind(eng, 4, 64, "ar") == "ar"
    eng.carry_ms[(4, 64)][(6, 8)] = 6.9
    assert carry_kind(eng, 4, 64, (6, 8)) == (6, 8)  # the policy's kind where it fits
    eng.carry_ms[(4, 64)] = {(6, 8): 9.0, "ar": 8.0}
    assert carry_kind(eng, 4, 64, (6, 8)) == (6, 8)  # none fits (the prompt would not have ridden)
    assert carry_kind(eng, 2, 64, None) is None  # not measured (CPU)


def test_riders_ride_the_kind_measured_to_carry_them():
    # Planted costs: the engine's own round carrying a prompt is slower than its separate prefill, the
    # keep-up AR round is not, so prompts ride AR rounds; output is each request's alone.
    target = tiny_model("tiny-llama")
    eng = _engine(target, target.truncated(1), "tree", prompt_admission=64, auto_off=True)
    eng.admission_costs = {(b, 64): (0.5, 1.0) for b in (1, 2, 4, 8)}
    eng.carry_ms = {(b, 64): {None: 5.0, "ar": 0.5} for b in (1, 2, 4, 8)}
    kinds, run = [], eng.run_carrying
    eng.run_carrying = lambda b, bs, ml, kind, rows, lens: kinds.append(kind) or run(b, bs, ml, kind, rows, lens)
    ps = prompts([5, 9, 12], target.cfg.vocab_size, seed=7)
    got, _, _ = _serve(eng, [[ps[0]], [ps[1]], [ps[2]]], 8)
    assert eng.batch.admissions == {IDLE: 1, RIDE: 2} and kinds == ["ar", "ar"]
    assert eng.batch.carrying_kinds == {"ar": 2}
    ref = _engine(target, target.truncated(1), "tree")
    assert got == [ref.generate([p], SamplingParams(max_new_tokens=8, ignore_eos=True))[0].token_ids for p in ps]


def test_mixed_forward_equals_separate_forwards():
    torch.manual_seed(0)
    model: Transformer = tiny_model("tiny-llama")
    from sglang_specpilot.engine.attn_meta import build_step_meta, causal_tree

    def group(tokens, seq, rows):
        anc, depth = causal_tree(tokens.shape[1])
        m = build_step_meta(seq, anc, depth, 128, model.cfg.num_heads // model.cfg.num_kv_heads)
        return Group(tokens, m.positions, m.slots, m.mask, rows, seq, anc)

    def kv():
        shape = (4, 192, model.cfg.num_kv_heads, model.cfg.head_dim)
        return [(torch.zeros(shape), torch.zeros(shape)) for _ in model.layers]

    a = group(torch.randint(0, 100, (2, 5)), torch.tensor([0, 0]), (0, 2))
    b = group(torch.randint(0, 100, (2, 9)), torch.tensor([0, 0]), (2, 4))
    cache = kv()
    both = mixed_forward(model, [a, b], cache)
    apart = [mixed_forward(model, [g], c)[0] for g, c in ((a, kv()), (b, kv()))]
    for x, y in zip(both, apart, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)  # float32 GEMMs of other row counts
    # b's rows packed (named by index, in another order): causal attention over the chunk itself, the same
    # logits and the same K/V in the same cache rows.
    perm = torch.tensor([1, 0])
    packed = group(b.tokens[perm], torch.tensor([0, 0]), (0, 2))
    packed.rows, packed.mask = torch.tensor([3, 2]), None
    c2 = kv()
    out = mixed_forward(model, [a, packed], c2)[1]
    torch.testing.assert_close(out, apart[1][perm], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c2[0][0][2:4, :9], cache[0][0][2:4, :9], atol=1e-5, rtol=1e-5)


def test_options_refuse_what_admission_cannot_ride():
    with pytest.raises(ValueError, match="prompt_admission"):
        EngineOptions(prompt_admission=600, prefill_chunk=512)
    with pytest.raises(ValueError, match="prompt_admission"):
        EngineOptions(prompt_admission=32, colocate=True, max_batch_size=4)


def test_scheduler_admits_into_the_verify_pass_and_reports_it():
    import threading

    from sglang_specpilot.server.scheduler import Scheduler

    target = tiny_model("tiny-llama")
    eng = _engine(target, target.truncated(1), "chain", prompt_admission=64)
    ps = prompts([6, 20, 9, 33], target.cfg.vocab_size, seed=9)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    alone = [eng.generate([p], params)[0].token_ids for p in ps]
    sched = Scheduler(eng, idle_wait_s=0.05)
    got = {i: [] for i in range(len(ps))}
    done = [threading.Event() for _ in ps]
    started = threading.Event()

    def sink(i):
        return lambda ev: (got[i].extend(ev.token_ids), started.set(), ev.finished and done[i].set())

    sched.start()
    try:
        sched.submit(eng.new_request(ps[0], params), sink(0))
        assert started.wait(30)
        for i, p in enumerate(ps[1:], 1):  # while the first one runs
            sched.submit(eng.new_request(p, params), sink(i))
        assert all(d.wait(60) for d in done)
    finally:
        sched.stop()
    assert [got[i] for i in range(len(ps))] == alone
    text = sched.metrics.render()
    counts = eng.batch.admissions  # the alone runs above found the batch idle too
    assert counts[IDLE] == len(ps) + 1 and counts.get(RIDE, 0) + counts.get(FULL, 0) == len(ps) - 1
    assert f'specpilot_prompt_admissions_total{{path="idle"}} {counts[IDLE]}' in text
    assert "prompt_admissions_total{path=" in text
    carried = eng.batch.carrying_kinds  # the chain's own round carried every rider (nothing measured: CPU)
    assert set(carried) <= {"spec"} and (carried.get("spec", 0) > 0) == (counts.get(RIDE, 0) > 0)
    assert f'specpilot_carrying_rounds_total{{kind="spec"}} {carried.get("spec", 0)}' in text
    assert "prompt_admissions_total" not in Scheduler(_engine(target, target.truncated(1), "chain")).metrics.render()


@pytest.mark.gpu
@pytest.mark.parametrize("shape,drafter", [("chain", "layer"), ("tree", "layer"), ("tree", "eagle3")])
def test_captured_carrying_rounds_equal_each_request_alone_gpu(shape, drafter):
    # On CUDA the carrying rounds replay graphs captured at warm-up (eager tree rounds cost several replays).
    V = 12 if drafter == "eagle3" else None
    target = tiny_model("tiny-llama", **({"vocab_size": V} if V else {})).cuda()
    draft = _drafter(drafter, target)
    ps = prompts([7, 30, 3, 61, 12, 45], target.cfg.vocab_size, seed=3)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    kw = dict(max_seq_len=256, max_batch_size=8, graph_batch_sizes=(1, 2, 4, 8), device="cuda", dtype="float32")
    opts = EngineOptions(**kw, compile=False, **SHAPES[shape])
    alone_eng = Engine(target, WordTokenizer(), opts, draft)
    alone_eng.warmup()
    alone = [alone_eng.generate([p], params)[0].token_ids for p in ps]
    eng = Engine(
        target, WordTokenizer(), EngineOptions(**kw, compile=False, **SHAPES[shape], prompt_admission=64), draft
    )
    eng.warmup()
    captured = len(eng.carrying._graphs)
    got, _, _ = _serve(eng, [[ps[0]], [], [ps[1], ps[2]], [ps[3]], [], [ps[4], ps[5]]], 20, lookahead=True)
    assert got == alone and eng.batch.admissions[RIDE] >= 3
    assert captured > 0 and len(eng.carrying._graphs) == captured  # every shape was captured at warm-up
