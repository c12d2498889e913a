"""TLV on the real SmolLM2-135M-Instruct (embedded default) with W12 weights and the shipped EAGLE-3
drafter: greedy output equals AR's (issue 16's test list), at batch 1 and 3."""

import pytest
from conftest import needs_smollm2

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.drafters import default_drafter_path
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.loading import load_engine_models
from sglang_specpilot.engine.tlv_round import TLVRound

pytestmark = needs_smollm2

PROMPTS = ["def fibonacci(n):", "The capital of France is", "1, 2, 3, 4,"]


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_tlv_equals_ar_on_smollm2_w12(batch):
    # On the CPU W12 decodes bit-exactly, so the BF16 model's AR text is the reference; the TLV engine
    # runs the W12 target (its Q pass on the 8-bit view) with the shipped drafter's trees.
    base = dict(max_seq_len=256, max_batch_size=3, device="cpu", dtype="bfloat16")
    target, _, tok, opts = load_engine_models(EngineOptions(**base))
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    ps = [tok.encode(p) for p in PROMPTS[:batch]]
    ar = [r.token_ids for r in Engine(target, tok, opts).generate(ps, params)]
    tlv = dict(tlv=True, tlv_chain_len=3, tree_budget=8, tree_depth=3, tree_top_k=4)
    w12_opts = EngineOptions(**base, weights="w12", draft=str(default_drafter_path()), **tlv)
    w12, draft, _, w12_opts = load_engine_models(w12_opts)
    eng = Engine(w12, tok, w12_opts, draft)
    assert isinstance(eng.round, TLVRound)
    assert [r.token_ids for r in eng.generate(ps, params)] == ar
    assert eng.batch.round_tokens > eng.batch.rounds  # drafts were accepted, not only bonus tokens
