"""The rope + cache-write kernel (kernels/rope_cache.py) against its reference and against the model's own
rope, on odd shapes (the 8B's and SmolLM2's head layouts, several tokens, scattered slots, a strided cache
view), in the Triton interpreter on the CPU (natively on the GPU); bad shapes refused in one line."""

from __future__ import annotations

import importlib

import pytest
import torch
from helpers import run_kernel_cases_in_interpreter

R = importlib.import_module("sglang_specpilot.kernels.rope_cache")

HERE = R.INTERPRETED or torch.cuda.is_available()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
kernel_case = pytest.mark.skipif(not HERE, reason="needs a GPU or TRITON_INTERPRET=1 before triton's import")


def _case(B, N, H, Hkv, D, S=40, seed=0):
    from sglang_specpilot.models.rope import rope_table

    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, N, (H + 2 * Hkv) * D, generator=g).to(torch.bfloat16).to(DEVICE)
    table = rope_table(64, D, 10000.0).to(DEVICE)
    positions = torch.randint(0, 64, (B, N), generator=g).to(DEVICE)
    cs = table[positions].to(torch.bfloat16)
    slots = torch.stack([torch.randperm(S, generator=g)[:N] for _ in range(B)]).to(DEVICE)
    cache = torch.randn(B + 1, S, Hkv, D, generator=g).to(torch.bfloat16).to(DEVICE)
    return qkv, cs[:, :, 0, None], cs[:, :, 1, None], slots, cache


@kernel_case
@pytest.mark.parametrize("B,N,H,Hkv,D", [(1, 1, 32, 8, 128), (2, 3, 9, 3, 64), (3, 5, 4, 2, 32)])
def test_kernel_rope_cache_write_matches_the_reference_and_the_model(B, N, H, Hkv, D):
    from sglang_specpilot.models.rope import apply_rope

    qkv, cos, sin, slots, cache = _case(B, N, H, Hkv, D)
    k1, v1, k2, v2 = cache.clone(), cache.clone() + 1, cache.clone(), cache.clone() + 1
    q, tickets = R.rope_cache_write(qkv, cos, sin, k1, v1, slots, H, Hkv, D, 1500)
    q_ref = R.rope_cache_write_ref(qkv, cos, sin, k2, v2, slots, H, Hkv, D)
    assert q.shape == (B, N, H, D) and q.is_contiguous()
    assert tickets.dtype == torch.int32 and tickets.shape == (1500,) and not bool(tickets.any())
    # fp32 rope rounded once on both sides; the interpreter truncates its casts (one ulp at most).
    ulp = q_ref.float().abs().clamp_min(1e-3) * 2**-7
    assert bool(((q.float() - q_ref.float()).abs() <= ulp).all())
    assert bool(((k1.float() - k2.float()).abs() <= k2.float().abs().clamp_min(1e-3) * 2**-7).all())
    assert torch.equal(v1, v2)  # v is copied, untouched slots and the spare cache row too
    untouched = torch.ones(cache.shape[:2], dtype=torch.bool, device=cache.device)
    untouched[torch.arange(B, device=cache.device)[:, None], slots] = False
    assert torch.equal(k1[untouched], cache[untouched])
    # Against the model's own rope (eager: each product rounds to bf16 before the sum, so within two ulps of
    # the terms' magnitudes).
    x = qkv[..., : H * D].reshape(B, N, H, D)
    qm = apply_rope(x, cos, sin)
    terms = (x.float() * cos.float()).abs() + (x.float().roll(D // 2, -1) * sin.float()).abs()
    assert bool(((q.float() - qm.float()).abs() <= 3 * terms * 2**-7 + 1e-6).all())
    assert not torch.equal(q, qkv[..., : H * D].reshape(B, N, H, D))  # rope did something


@kernel_case
def test_kernel_rope_cache_write_into_a_cache_view():
    qkv, cos, sin, slots, cache = _case(2, 2, 4, 2, 32)
    view_k, view_v = cache[1:3], cache[1:3].clone()  # rows 1.. of a shared cache, as mixed_forward passes
    ref_k, ref_v = view_k.clone(), view_v.clone()
    R.rope_cache_write(qkv, cos, sin, view_k, view_v, slots, 4, 2, 32)
    R.rope_cache_write_ref(qkv, cos, sin, ref_k, ref_v, slots, 4, 2, 32)
    assert torch.equal(view_v, ref_v)
    assert bool(((cache[1:3].float() - ref_k.float()).abs() <= ref_k.float().abs().clamp_min(1e-3) * 2**-7).all())


def test_compiled_op_writes_the_cache_views_of_one_storage_without_copies():
    # The op's cache writes are undeclared (the module docstring says why): under torch.compile they must
    # still land in the caller's views of one storage, the attention after it must see them, and the
    # compiled code must not clone the caches. On the CPU the op runs its reference; the GPU test runs the
    # kernel inside the engine's compiled block.
    from torch._inductor.utils import run_and_get_code

    from sglang_specpilot.kernels.tree_attention import num_tickets, tree_attention, tree_attention_ref

    B, N, H, Hkv, D, S = 2, 3, 4, 2, 32, 40
    qkv, cos, sin, slots, _ = _case(B, N, H, Hkv, D, S)
    seq = slots.min(1).values.clamp_max(S - N)
    slots = seq[:, None] + torch.arange(N, device=slots.device)  # the window after each prefix
    anc = torch.tril(torch.ones(N, N, dtype=torch.bool, device=slots.device))
    storage = torch.randn(2, B, S, Hkv, D, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(DEVICE)

    def step(qkv, cos, sin, k, v, slots, seq, anc):
        q, t = R.rope_cache_write(qkv, cos, sin, k, v, slots, H, Hkv, D, num_tickets(B, N, H, Hkv))
        return tree_attention(q, k, v, seq, anc, tickets=t)

    ref_storage = storage.clone()
    q_ref = R.rope_cache_write_ref(qkv, cos, sin, ref_storage[0], ref_storage[1], slots, H, Hkv, D)
    o_ref = tree_attention_ref(q_ref, ref_storage[0], ref_storage[1], seq, anc)
    compiled = torch.compile(step, fullgraph=True)
    o, code = run_and_get_code(compiled, qkv, cos, sin, storage[0], storage[1], slots, seq, anc)
    assert torch.equal(storage, ref_storage)  # k and v written where the reference writes them, nothing else
    assert (o.float() - o_ref.float()).abs().max().item() <= 2e-2
    text = "\n".join(code)
    assert "rope_cache_write" in text and ".clone(" not in text and "copy_(" not in text


def test_rope_cache_write_refuses_bad_shapes():
    qkv, cos, sin, slots, cache = _case(1, 2, 4, 2, 32)
    with pytest.raises(ValueError, match="heads of"):
        R.rope_cache_write(qkv, cos, sin, cache, cache.clone(), slots, 4, 1, 32)
    with pytest.raises(ValueError, match="cos/sin"):
        R.rope_cache_write(qkv, cos.float(), sin, cache, cache.clone(), slots, 4, 2, 32)
    with pytest.raises(ValueError, match="slots"):
        R.rope_cache_write(qkv, cos, sin, cache, cache.clone(), slots[:, :1], 4, 2, 32)


def test_kernel_cases_in_interpreter():
    if HERE:
        pytest.skip("the kernel cases ran in this process")
    run_kernel_cases_in_interpreter(__file__, "kernel_ and not interpreter")
