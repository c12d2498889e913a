"""One process, many compiled engines: ``run_block``'s dynamo cache is shared by all of them.

Every ``ModelRunner(compile=True)`` compiles the same function, ``models.llama.run_block``, and dynamo keeps
its cache entries on that one code object for the whole process, whatever runner or model made them. Its
guards hold no model instance, only shapes and dtypes, so every (batch bucket, width, cache shape, dtype,
block kind) any engine of the process ever ran stays an entry. With ``fullgraph=True`` the compile that
would add an entry past ``recompile_limit`` raises ``FailOnRecompileLimitHit`` instead of falling back to
eager. The H200 run of ``-m gpu test_prefill_graphs test_gpu test_round test_eagle3 ...`` in one process
failed so at ``test_eagle3::test_captured_spec_equals_ar_fp32`` (alone, that test needs 24 entries; after
the compiled tests before it, ``run_block`` already held 64, the runner's limit).

This test stands in for those earlier tests with 64 entries of other shapes, then builds one more
compiled engine: a new engine must compile its own shapes, however many the process compiled before.
"""

import functools

import torch
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.attn_meta import causal_tree
from sglang_specpilot.engine.runner import ModelRunner
from sglang_specpilot.models.llama import run_block


def _entries() -> int:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(run_block))


def test_a_new_compiled_engine_compiles_after_earlier_ones_filled_the_cache(monkeypatch):
    # dynamo's "eager" backend: traces and guards like inductor, without generating code.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    cfg = torch._dynamo.config
    limits = cfg.recompile_limit, cfg.accumulated_recompile_limit  # the runner raises them: restored after
    torch._dynamo.reset()
    try:
        target = tiny_model("tiny-llama")
        # What earlier engines of the process left: a runner whose compiled blocks ran 64 (batch, width) shapes.
        earlier = ModelRunner(target, 8, 128, cuda_graphs=False, compile=True, scratch_slots=64)
        for b in range(1, 9):
            for n in range(1, 9):
                anc, _ = causal_tree(n)
                idx = torch.arange(n).expand(b, n)
                earlier.forward(torch.zeros(b, n, dtype=torch.long), idx, idx, torch.zeros(b, dtype=torch.long), anc)
        assert _entries() >= 64
        del earlier

        opts = EngineOptions(
            device="cpu", dtype="float32", max_seq_len=256, max_batch_size=4, num_speculative_tokens=4, compile=True
        )
        eng = Engine(target, WordTokenizer(), opts, target.truncated(1))
        ps = prompts([5, 9, 3], target.cfg.vocab_size, seed=1)
        greedy = SamplingParams(max_new_tokens=6, ignore_eos=True)
        got = [r.token_ids for r in eng.generate(ps, greedy)]  # FailOnRecompileLimitHit before the fix
        ref = Engine(target, WordTokenizer(), EngineOptions(**{**opts.__dict__, "compile": False}), target.truncated(1))
        assert got == [r.token_ids for r in ref.generate(ps, greedy)]
    finally:
        torch._dynamo.reset()  # leave no entries of this test's shapes to the tests after it
        cfg.recompile_limit, cfg.accumulated_recompile_limit = limits
