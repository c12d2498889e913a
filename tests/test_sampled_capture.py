"""Sampled rounds replayed from CUDA graphs (``EngineOptions.capture_sampling``): the same tokens as the
eager round from the same seed, fresh numbers every round, and a capture that fails leaves the rows as
they were and the round eager."""

import pytest
import torch
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.cli import build_parser, engine_options
from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.round import CapturedRound
from sglang_specpilot.engine.sampling import BatchSampling

SHAPES = {
    "ar": {},
    "chain": dict(num_speculative_tokens=4),
    "tree": dict(tree_budget=8, tree_depth=4, tree_top_k=2),
}


def _engine(target, draft, shape, device="cuda", **kw):
    opts = EngineOptions(
        max_seq_len=256, max_batch_size=4, graph_batch_sizes=(1, 2, 4), device=device, dtype="float32",
        compile=False, **SHAPES[shape], **kw,
    )  # fmt: skip
    return Engine(target, WordTokenizer(), opts, draft if shape != "ar" else None)


def test_option_defaults_on_and_the_flag_turns_it_off():
    assert EngineOptions(device="cpu").capture_sampling is True
    args = build_parser().parse_args(["generate", "--prompt", "x", "--device", "cpu"])
    assert engine_options(args).capture_sampling is True
    args = build_parser().parse_args(["generate", "--prompt", "x", "--no-capture-sampling", "--device", "cpu"])
    assert engine_options(args).capture_sampling is False


class _Refusing:
    """A captured round whose sampled capture fails, as a capture with an unsupported op would."""

    def __init__(self):
        self.attempts = 0

    def takes_sampled(self, b, bs):
        return False

    def capture_sampled(self, b, bs):
        self.attempts += 1
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_failed_sampled_capture_is_recorded_and_not_retried():
    target = tiny_model("tiny-llama")
    eng = _engine(target, target.truncated(1), "chain", device="cpu", capture_sampling=True)
    bs = BatchSampling.from_params([SamplingParams(temperature=1.0)] * 2, "cpu", eng.batch.generator)
    cap = _Refusing()
    assert not eng._sampled_graph(cap, 2, bs) and not eng._sampled_graph(cap, 2, bs)
    assert cap.attempts == 1 and "stream is capturing" in next(iter(eng.sampled_refused.values()))
    off = _engine(target, target.truncated(1), "chain", device="cpu", capture_sampling=False)
    assert not off._sampled_graph(cap, 2, bs) and cap.attempts == 1  # the option off: never tried


def test_a_failed_capture_restores_the_parked_rows():
    # CapturedRound parks the bucket's rows while it warms up and captures; off CUDA the capture fails at
    # once, which is the failure path a live batch must survive.
    target = tiny_model("tiny-llama")
    eng = _engine(target, target.truncated(1), "chain", device="cpu")
    st = eng.state
    st.seq_len[:2] = torch.tensor([7, 11])
    st.in_use[:2] = True
    before = [t.clone() for t in st.row_tensors()]
    cap = CapturedRound(eng.round, st, park_at=eng.options.max_seq_len)
    bs = BatchSampling.from_params([SamplingParams(temperature=1.0)] * 2, "cpu", eng.batch.generator)
    with pytest.raises((RuntimeError, AssertionError)):
        cap.capture_sampled(2, bs)
    assert all(torch.equal(a, b) for a, b in zip(st.row_tensors(), before, strict=True))
    assert not cap.takes_sampled(2, bs)


def test_sampling_runs_on_the_cpu_with_the_option():
    target = tiny_model("tiny-llama")
    ps = prompts([5, 9], target.cfg.vocab_size, seed=2)
    p = SamplingParams(max_new_tokens=12, temperature=0.8, seed=3, ignore_eos=True)
    on = _engine(target, target.truncated(2), "tree", device="cpu", capture_sampling=True)
    off = _engine(target, target.truncated(2), "tree", device="cpu", capture_sampling=False)
    assert [r.token_ids for r in on.generate(ps, p)] == [r.token_ids for r in off.generate(ps, p)]


def _ids(eng, ps, p):
    return [r.token_ids for r in eng.generate(ps, p)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["ar", "chain", "tree"])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_captured_sampled_rounds_equal_eager_from_the_same_seed_gpu(shape, top_p):
    # The graph draws from the generator's state with the offsets the eager ops would take, so one seed
    # gives the same tokens both ways; top_p < 1 takes the filtered graph, captured on first use.
    target = tiny_model("tiny-llama").cuda()
    draft = target.truncated(2)
    ps = prompts([5, 17, 9], target.cfg.vocab_size, seed=1)
    p = SamplingParams(max_new_tokens=24, temperature=0.9, top_p=top_p, seed=7, ignore_eos=True)
    eager = _engine(target, draft, shape, capture_sampling=False)
    eager.warmup(progress=False)
    graphed = _engine(target, draft, shape, capture_sampling=True)
    graphed.warmup(progress=False)
    want = [_ids(eager, [q], p)[0] for q in ps]  # one request at a time: a seed reproduces alone
    got = [_ids(graphed, [q], p)[0] for q in ps]
    assert got == want
    assert graphed.captured.sampled_replays > 0 and not graphed.sampled_refused
    assert eager.captured.sampled_replays == 0


@pytest.mark.gpu
def test_captured_sampled_rounds_draw_fresh_numbers_gpu():
    target = tiny_model("tiny-llama").cuda()
    ps = prompts([6], target.cfg.vocab_size, seed=4)
    eng = _engine(target, target.truncated(2), "tree", capture_sampling=True)
    eng.warmup(progress=False)
    p = SamplingParams(max_new_tokens=32, temperature=1.5, ignore_eos=True)
    runs = {tuple(_ids(eng, ps, p)[0]) for _ in range(4)}
    assert len(runs) > 1  # a replay that reused its random numbers would repeat the same text
    seeded = SamplingParams(max_new_tokens=32, temperature=1.5, seed=11, ignore_eos=True)
    assert _ids(eng, ps, seeded) == _ids(eng, ps, seeded)
