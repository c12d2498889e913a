"""``engine.host_copy.to_device``, and the serving loop's steps without a host sync besides the round's one."""

import warnings

import pytest
import torch
from helpers import cuda_tiny_engine, prompts

from sglang_specpilot.engine import SamplingParams
from sglang_specpilot.engine.host_copy import to_device


def test_to_device_keeps_values_and_dtype():
    t = to_device([3, 1, 2], "cpu")
    assert t.dtype == torch.int64 and t.tolist() == [3, 1, 2]
    f = to_device([0.5, 2.0], torch.device("cpu"), torch.float32)
    assert f.dtype == torch.float32 and f.tolist() == [0.5, 2.0]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["none", "eagle3"])
def test_steps_and_overtaking_admissions_do_not_sync_the_host_gpu(kind):
    """Once rounds run, ``step()`` (which rebuilds the sampling tensors after every admission and finished
    request) and the admission of a prompt that overtakes them wait for nothing on the device but the round
    they read back (an event, which torch's sync debug mode does not count). Before ``host_copy`` each of
    them made a blocking copy on the rounds' stream, which waited for every round in flight."""
    eng = cuda_tiny_engine(kind, max_seq_len=512)
    batch = eng.batch
    batch.lookahead = batch.overtake = True
    V = eng.target.cfg.vocab_size
    lens, news = [100, 90, 95, 110, 105, 98], [40, 120, 45, 120, 50, 120]
    work = zip(prompts(lens, V, seed=7), news, strict=True)
    first = [eng.new_request(p, SamplingParams(max_new_tokens=n, ignore_eos=True)) for p, n in work]
    later = [eng.new_request(p, SamplingParams(max_new_tokens=30)) for p in prompts([30, 50, 12, 60], V, seed=8)]
    batch.admit(first)  # a prefill with no rounds in flight reads its first tokens back: not checked
    steps, synced_admissions = 0, []
    while batch.busy:
        if steps >= 60 and later:
            req = later.pop(0)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    batch.admit([req])
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            if req.overtook:
                synced_admissions += [str(w.message) for w in caught if "synchroniz" in str(w.message)]
        torch.cuda.set_sync_debug_mode("error")
        try:
            batch.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        steps += 1
    assert steps > 60 and batch.overtaken >= 2
    assert synced_admissions == []
