"""Prefill chunks replay CUDA graphs captured at warm-up (ModelRunner.prefill): the eager chunk's bits."""

import pytest
import torch
from helpers import tiny_model

from sglang_specpilot.engine.attn_meta import causal_tree
from sglang_specpilot.engine.runner import PREFILL_GRAPH_MAX_BATCH, ModelRunner


def _case(runner, batch: int, width: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    dev = runner.device
    toks = torch.randint(0, runner.model.cfg.vocab_size, (batch, width), generator=g).to(dev)
    rows = torch.randint(0, width, (batch, 1), generator=g).to(dev)
    return toks, torch.zeros(batch, dtype=torch.long, device=dev), rows


def _eager(runner, toks, seq, rows):
    anc, depth = causal_tree(toks.shape[1], runner.device)
    out = runner.step(toks, seq, anc, depth, max_len_hint=0, logit_rows=rows, eager=True)
    k, v = runner.kv.layers[-1]
    return out, k[: toks.shape[0], : toks.shape[1]].clone(), v[: toks.shape[0], : toks.shape[1]].clone()


def test_prefill_off_cuda_is_the_eager_step():
    runner = ModelRunner(tiny_model("tiny-llama"), max_batch=2, max_seq=128, scratch_slots=64)
    runner.capture_prefill = True  # nothing to capture on the CPU
    toks, seq, rows = _case(runner, 2, 64, 0)
    out = runner.prefill(toks, seq, 0, rows)
    assert not runner._prefill_graphs
    assert torch.equal(out, _eager(runner, toks, seq, rows)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("batch,width", [(1, 64), (3, 128), (PREFILL_GRAPH_MAX_BATCH, 192)])
def test_prefill_graph_equals_eager_bf16(batch, width):
    runner = ModelRunner(tiny_model("tiny-llama", dtype=torch.bfloat16).cuda(), 8, 256, scratch_slots=256)
    toks, seq, rows = _case(runner, batch, width, 1)
    runner.capture_prefill = True
    runner.prefill(toks, seq, 0, rows)  # captures
    runner.capture_prefill = False
    assert len(runner._prefill_graphs) == 1
    for seed in (2, 3):  # new inputs through the same graph
        toks, seq, rows = _case(runner, batch, width, seed)
        out, k, v = _eager(runner, toks, seq, rows)
        again = runner.prefill(toks, seq, 0, rows)
        assert torch.equal(again, out)
        assert torch.equal(runner.kv.layers[-1][0][:batch, :width], k)
        assert torch.equal(runner.kv.layers[-1][1][:batch, :width], v)
    # Shapes that were not captured (a later chunk, more rows) run eagerly: no capture while serving.
    toks, seq, rows = _case(runner, batch, width, 4)
    runner.prefill(toks, seq + width, width, rows)
    assert len(runner._prefill_graphs) == 1


def test_prefill_capture_failure_falls_back_to_eager(monkeypatch):
    # A shape whose capture raises runs eagerly (and is not tried again), as prefill did before graphs. The
    # capture is stood in for, so this runs on the CPU with the runner told it has graphs.
    import sglang_specpilot.engine.runner as runner_module

    runner = ModelRunner(tiny_model("tiny-llama"), 4, 128, scratch_slots=128)
    runner.use_graphs = True
    calls = []

    def refuse(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("not capturable")

    monkeypatch.setattr(runner_module, "_PrefillGraph", refuse)
    toks, seq, rows = _case(runner, 2, 64, 5)
    runner.capture_prefill = True
    for _ in range(2):
        assert torch.equal(runner.prefill(toks, seq, 0, rows), _eager(runner, toks, seq, rows)[0])
    assert len(calls) == 1 and not runner._prefill_graphs and len(runner.prefill_refused) == 1
