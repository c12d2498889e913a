"""FP8 drafter weights (``draft_weights="fp8"``, models/fp8_linear.py): the projection against its fp32
reference, the converted copy leaves the original and the target alone, and greedy output still equals AR's."""

import pytest
import torch
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.drafters.eagle3 import FrozenHead, init_eagle3
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.models.fp8_linear import E4M3_MAX, Fp8Linear, fp8_drafter, fp8_linear_reference, quantize_rows

V = 12


def test_quantize_rows_round_trip_and_zero_rows():
    torch.manual_seed(0)
    t = torch.randn(7, 48) * torch.logspace(-3, 2, 7)[:, None]  # rows of very different magnitudes
    t[3] = 0
    codes, scale = quantize_rows(t)
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (7, 1)
    back = codes.float() * scale
    assert torch.equal(back[3], torch.zeros(48))  # an all-zero row (lifted padding) stays exactly zero
    # Each row's largest magnitude maps to e4m3's largest finite value; the rest within e4m3's half-ulp
    # (3 mantissa bits: 2^-4 relative), plus subnormal steps for tiny entries.
    assert torch.allclose(codes.float().abs().amax(1)[[0, 1, 2, 4, 5, 6]], torch.full((6,), E4M3_MAX))
    err = (back - t).abs()
    assert (err <= t.abs() * 2**-4 + scale * 2**-9 + 1e-30).all()


@pytest.mark.parametrize("shape", [(1, 32, 48), (5, 80, 16), (3, 4, 96, 32)])  # odd row counts, 3-d input
def test_fp8_linear_matches_its_reference_and_tracks_the_linear(shape):
    torch.manual_seed(1)
    *lead, k, n = shape
    lin = torch.nn.Linear(k, n, bias=len(lead) == 2)
    x = torch.randn(*lead, k)
    f = Fp8Linear(lin)
    y = f(x)
    assert y.shape == (*lead, n) and y.dtype == lin.weight.dtype
    x8, xs = quantize_rows(x.reshape(-1, k))
    ref = fp8_linear_reference(x8, xs, f.weight8, f.weight_scale, f.bias, torch.float32).reshape(*lead, n)
    assert torch.equal(y, ref)
    exact = lin(x)
    # FP8 on both operands: a few percent of the output's scale, far from bf16 exactness but a drafter's
    # proposals only need the ranking roughly right.
    rel = (y - exact).norm() / exact.norm()
    assert rel < 0.06, rel


def test_fp8_drafter_copies_and_leaves_target_and_original_alone():
    target = tiny_model("tiny-llama", vocab_size=V)
    torch.manual_seed(0)
    d = init_eagle3(target)
    before = {k: v.clone() for k, v in d.state_dict().items()}
    q = fp8_drafter(d, target)
    assert q is not d and q.embed is target.embed  # the target's embedding stays shared, not copied
    linears = [n for n, m in q.named_modules() if isinstance(m, torch.nn.Linear)]
    assert linears == ["fc"]  # KEEP_BF16: the feature projection stays bf16; every other projection converts
    assert isinstance(q.lm_head, Fp8Linear) and isinstance(q.layers[0].mlp.w2, Fp8Linear)
    assert not any(isinstance(m, Fp8Linear) for m in d.modules())  # the original is untouched
    assert all(torch.equal(before[k], v) for k, v in d.state_dict().items())
    assert not any(isinstance(m, Fp8Linear) for m in target.modules())
    # A drafter made of the target's own layers has nothing of its own to convert: refused, not faked.
    with pytest.raises(ValueError, match="no projections of its own"):
        fp8_drafter(target.truncated(1), target)


def test_a_frozen_target_head_converts_too():
    target = tiny_model("tiny-llama", vocab_size=V)
    torch.manual_seed(0)
    d = init_eagle3(target, d2t=torch.arange(0, V, 2))  # a reduced draft vocabulary: the target's head rows
    d.lm_head = FrozenHead(target.lm_head.weight.detach()[d.d2t].clone())
    q = fp8_drafter(d, target)
    assert isinstance(q.lm_head, Fp8Linear) and q.lm_head.out_features == V // 2
    h = torch.randn(3, target.cfg.hidden_size)
    rel = (q.lm_head(h) - d.lm_head(h)).norm() / d.lm_head(h).norm()
    assert rel < 0.06, rel


def _engine(target, draft, **kw):
    opts = EngineOptions(device="cpu", dtype="float32", max_seq_len=256, max_batch_size=8,
                         graph_batch_sizes=(1, 2, 4, 8), **kw)  # fmt: skip
    return Engine(target, WordTokenizer(), opts, draft)


CHAIN, TREE = {"num_speculative_tokens": 4}, {"tree_budget": 10, "tree_depth": 4, "tree_top_k": 3}


@pytest.mark.parametrize("shape", [CHAIN, TREE])
def test_greedy_with_fp8_drafter_equals_ar(shape):
    target = tiny_model("tiny-llama", vocab_size=V)
    torch.manual_seed(0)
    d = init_eagle3(target)
    ps = prompts([5, 11, 3, 8], V, seed=3)
    sp = SamplingParams(max_new_tokens=20, ignore_eos=True)
    ar = [r.token_ids for r in _engine(target, None).generate(ps, sp)]
    eng = _engine(target, d, draft_weights="fp8", **shape)
    assert any(isinstance(m, Fp8Linear) for m in eng.draft.modules())
    assert not any(isinstance(m, Fp8Linear) for m in d.modules())
    assert [r.token_ids for r in eng.generate(ps, sp)] == ar
    assert eng.batch.round_tokens > eng.batch.rounds  # drafts were accepted: the FP8 drafter drafted


def test_fp8_refusals():
    target = tiny_model("tiny-llama", vocab_size=V)
    with pytest.raises(ValueError, match="has no drafter"):
        _engine(target, None, draft_weights="fp8")
    with pytest.raises(ValueError, match="unknown weights 'fp8'"):
        EngineOptions(device="cpu", weights="fp8")  # the target's weights stay exact: no FP8 target
    with pytest.raises(ValueError, match="unknown draft_weights"):
        EngineOptions(device="cpu", draft_weights="int4")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FP8 GEMMs need a CUDA GPU")
@pytest.mark.parametrize("rows", [1, 5, 16, 80, 144])
def test_scaled_mm_matches_the_reference_on_gpu(rows):
    torch.manual_seed(2)
    lin = torch.nn.Linear(4096, 1536, bias=False).cuda().to(torch.bfloat16)
    f = Fp8Linear(lin)
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    y = f(x)
    x8, xs = quantize_rows(x)
    ref = fp8_linear_reference(x8, xs, f.weight8, f.weight_scale, None, torch.float32)
    # The same products; the tensor cores' FP8 accumulation order and precision and the bf16 output rounding
    # differ from the fp32 reference: within a bf16 step of each output plus a bf16 step of the largest.
    err = (y.float() - ref).abs()
    assert (err <= ref.abs() * 2**-8 + ref.abs().max() * 2**-8).all(), (err.max(), ref.abs().max())
