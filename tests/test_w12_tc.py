"""The tensor-core W12 GEMM (``w12/kernels/gemm_tc.py``) for verify-sized M, its configs and its routing.

Kernel cases run on the GPU, or on a CPU in a child pytest with TRITON_INTERPRET=1 (as in
``test_w12_kernels.py``). They hold the kernel to the exact GEMM's contract: within ``gemm_tolerance`` of
decode-then-matmul in fp32 on odd shapes (M = 1, 3, 8, 17, 33, 64; N and K not multiples of 128), bit-exact
weights through a one-hot x, non-finite escapes confined to their rows, deterministic split-K that leaves its
counters at 0. The sm_90 build (CPU: Triton and its ptxas) checks what the design rests on: wgmma with the
decoded weights as a register operand, the planes staged by cp.async, no spills.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from helpers import assert_within, bits16, check_nonfinite_escapes, run_kernel_cases_in_interpreter
from test_w12_kernels import compile_sm90, emulate_ptx, every_code_record, expected_pairs, make_weight, quads_of

from w12.codec import encode
from w12.format import decode_reference
from w12.kernels import (
    INTERPRETED,
    gemm_tolerance,
    w12_gemm,
    w12_gemm_ref,
    w12_view8_gemm,
    w12_view8_gemm_ref,
)
from w12.kernels import config as config_module
from w12.kernels.config import (
    TcConfig,
    default_tc_config,
    nearest_tc,
    pick_tc_config,
    tc_candidates,
    tc_split_for,
    tc_table_key,
)
from w12.kernels.decode import EXACT_QUAD_PTX
from w12.kernels.gemm import kernel_for
from w12.kernels.gemm_tc import split_x
from w12.linear import W12Linear

pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_HERE = torch.cuda.is_available() or INTERPRETED
kernel_case = pytest.mark.skipif(
    not KERNEL_HERE, reason="on a CPU the kernel cases run in test_kernel_cases_in_interpreter's child"
)


# ---------------------------------------------------------------------------------------------------------
# Host side: routing, formula, tuned table with the nearest-shape rule
# ---------------------------------------------------------------------------------------------------------


def test_kernel_for_routes_by_m_bucket():
    assert kernel_for(1, 4096) == "quad"  # AR: the quad kernel's FMAs
    for M in (2, 8, 16, 33, 64, 100):
        assert kernel_for(M, 4096) == "tc"
    assert kernel_for(16, 4095) == "quad"  # odd K: no uint16 view of hi
    assert kernel_for(16, 4096, view8=True) == "tc" and kernel_for(1, 4096, view8=True) == "quad"
    assert kernel_for(16, 4096, config=config_module.GemmConfig(64, 128, use_dot=True)) == "quad"
    assert kernel_for(1, 4096, tc_config=TcConfig()) == "tc"
    assert kernel_for(16, 4096, backend="triton") == "quad"
    with pytest.raises(ValueError):
        kernel_for(16, 4095, backend="tc")


def test_tc_config_validation_and_block_m():
    with pytest.raises(ValueError):
        TcConfig(48, 256)
    with pytest.raises(ValueError):
        TcConfig(8, 256)
    with pytest.raises(ValueError):
        TcConfig(64, 16)
    assert [TcConfig().block_m(M) for M in (1, 8, 16, 17, 33, 64, 65)] == [16, 16, 16, 32, 64, 64, 64]


def test_default_tc_config_formula():
    # Llama-3.1-8B, 132 SMs: qkv (96 tiles of 64 rows) splits 4 ways (384 programs, 0.75 of a tile's K per
    # SM); o and down (64 tiles) 4 ways (256 programs, two per SM); gate_up (448 tiles, 1.7 waves) 2 ways;
    # Qwen3-8B's gate_up (384 tiles: 2.9 waves) and the LM head (2004 tiles) not at all.
    assert tc_split_for(TcConfig(), 16, 6144, 4096) == 4
    assert default_tc_config(16, 4096, 4096).split_k == 4
    assert default_tc_config(32, 4096, 14336).split_k == 4
    assert default_tc_config(64, 28672, 4096).split_k == 2
    assert default_tc_config(64, 24576, 4096).split_k == 1
    assert default_tc_config(16, 128256, 4096) == TcConfig(64, 256, 1, 4, 3)
    # Two programs an SM at every M (the H100 sweep's best tiles): 64 x 256 x 3 stages up to M = 32; at 64 it
    # would take 144 KB (one program), so 64 x 128 x 4.
    assert default_tc_config(32, 6144, 4096) == TcConfig(64, 256, 4, 4, 3)
    assert default_tc_config(64, 6144, 4096) == TcConfig(64, 128, 4, 4, 4)
    # Llama-3.2-1B qkv: K = 2048 is 8 steps of 256, too short to split 4 ways: 128-weight steps instead.
    assert default_tc_config(16, 3072, 2048).block_k == 128
    for M in (2, 8, 16, 32, 64):
        for N, K in ((2048, 2048), (6144, 4096), (65536, 65536), (70, 200)):
            cfg = default_tc_config(M, N, K)
            assert cfg.num_stages >= 3
            assert 2 * cfg.smem_bytes(M) <= config_module.TC_SMEM_BYTES
            steps = -(-K // cfg.block_k)
            assert cfg.split_k == 1 or steps >= 2 * cfg.split_k
            assert cfg.block_k <= max(32, 1 << (K - 1).bit_length())  # no step past a tiny K
    assert all(c.smem_bytes(64) <= config_module.TC_SMEM_BYTES for c in tc_candidates(64))


def test_tuned_table_nearest_shape(tmp_path, monkeypatch):
    monkeypatch.setattr(config_module, "TUNED_DIR", tmp_path)
    config_module.clear_caches()
    tuned = TcConfig(128, 128, 3, 8, 4)
    config_module.save_tuned("cpu", {tc_table_key(16, 4096, 4096): tuned}, section="tc")
    assert json.loads((tmp_path / "cpu.json").read_text())["tc"]
    dev = torch.device("cpu")
    try:
        assert pick_tc_config(16, 4096, 4096, dev) == tuned  # exact hit: as tuned, split included
        assert pick_tc_config(9, 4096, 4096, dev) == tuned  # M 9..16 share the bucket
        assert tc_table_key(3, 10, 20) == tc_table_key(8, 10, 20)  # M 2..8: one bucket (both pad to 16 rows)
        near = pick_tc_config(16, 6144, 4096, dev)  # 1.5x away in N: the tile shape, the split re-derived
        assert (near.block_n, near.block_k, near.num_warps, near.num_stages) == (128, 128, 8, 4)
        assert near.split_k == tc_split_for(near, 16, 6144, 4096)
        assert nearest_tc(config_module.tuned_table("cpu", "tc"), 16, 16384, 4096) is None  # 4x away
        assert pick_tc_config(16, 16384, 4096, dev) == default_tc_config(16, 16384, 4096)
        assert pick_tc_config(32, 4096, 4096, dev) == default_tc_config(32, 4096, 4096)  # other bucket
        # M = 1 goes to the tensor-core kernel only where the sweep found it faster (an m1 entry, or near one).
        assert kernel_for(1, 4096, N=4096, device=dev) == "quad"
        config_module.save_tuned("cpu", {tc_table_key(1, 4096, 4096): TcConfig(64, 256, 2)}, section="tc")
        assert kernel_for(1, 4096, N=4096, device=dev) == "tc" and kernel_for(1, 4096, N=6144, device=dev) == "tc"
        assert kernel_for(1, 4096, N=28672, device=dev) == "quad"
        assert pick_tc_config(1, 4096, 4096, dev) == TcConfig(64, 256, 2)
    finally:
        config_module.clear_caches()


# ---------------------------------------------------------------------------------------------------------
# The one-quad PTX, emulated (test_w12_kernels.py's emulator), and sm_90 builds on the CPU
# ---------------------------------------------------------------------------------------------------------


def test_quad_ptx_decodes_every_code():
    # The 16-bit lo operand is zero-extended by its cvt: for the emulator (32-bit values) that is an and.
    w = every_code_record(256)
    H, L, base2 = quads_of(w)
    assert "cvt.u32.u16 l, $3;" in EXACT_QUAD_PTX
    out = emulate_ptx(EXACT_QUAD_PTX.replace("cvt.u32.u16 l, $3;", "and.b32 l, $3, 0xFFFF;"), {2: H, 3: L, 4: base2})
    want_e, want_o = expected_pairs(decode_reference(w))
    bad = np.nonzero((out[0] != want_e) | (out[1] != want_o))[0]
    assert bad.size == 0, f"{bad.size} quads wrong, first {bad[0]}: {out[0][bad[0]]:#x} vs {want_e[bad[0]]:#x}"
    # Only instructions the emulator knows, besides the cvt.
    ops = {m.group(1) for m in re.finditer(r"^\s*([a-z0-9]+\.[a-z0-9.]+)\s", EXACT_QUAD_PTX, re.M)}
    assert ops <= {"mov.b32", "shl.b32", "shr.u32", "add.u32", "prmt.b32", "lop3.b32", "cvt.u32.u16"}, ops


TC_ARG_TYPES = {
    "x_ptr": "*bf16",
    "xs_ptr": "*bf16",
    "hi_ptr": "*u8",
    "lo_ptr": "*u8",
    "base_ptr": "*u8",
    "esc_idx_ptr": "*i64",
    "esc_val_ptr": "*bf16",
    "esc_row_ptr": "*i32",
    "bias_ptr": "*bf16",
    "y_ptr": "*bf16",
    "part_ptr": "*fp32",
    "counter_ptr": "*i32",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "C": "i32",
    "stride_xm": "i32",
    "stride_ym": "i32",
    "split_k": "i32",
}


@pytest.mark.parametrize("M", [16, 32, 64])
@pytest.mark.parametrize("cfg", tc_candidates(16)[:4])
@pytest.mark.parametrize("view8,x_split", [(False, False), (True, False), (False, True)])
def test_tc_kernel_compiles_for_sm90(M, cfg, view8, x_split):
    if INTERPRETED:
        pytest.skip("the interpreter's kernels are not compiled")
    pytest.importorskip("triton.backends.nvidia")
    from w12.kernels.gemm_tc import _w12_tc_kernel

    if cfg not in tc_candidates(M):
        pytest.skip("does not fit in shared memory at this M")
    consts = dict(
        BLOCK_M=cfg.block_m(M),
        BLOCK_N=cfg.block_n,
        BLOCK_C=cfg.block_k // 2,
        EVEN_N=True,
        EVEN_C=True,
        HAS_BIAS=M == 32,
        VIEW8=view8,
        USE_ASM=True,
        UPCAST=False,
        UPCAST_OUT=False,
        ESC_PRECISION="tf32x3",
        X_SPLIT=x_split,
    )
    k, usage = compile_sm90(
        _w12_tc_kernel, TC_ARG_TYPES, consts, {"N", "K", "C", "stride_xm", "stride_ym"}, cfg.num_warps, cfg.num_stages
    )
    ttgir = k.asm["ttgir"]
    # The weights reach wgmma as a register operand (decoded in the operand's layout), not through shared memory.
    assert "ttng.warp_group_dot" in ttgir
    assert f"tensor<{cfg.block_n}x{cfg.block_k // 2}xbf16, #ttg.dot_op<{{opIdx = 0" in ttgir
    assert "async_copy_global_to_local" in ttgir  # cp.async pipeline of the planes
    assert ("0x07F007F0" if view8 else "cvt.u32.u16 l,") in k.asm["ptx"]  # VIEW8_PTX / EXACT_QUAD_PTX
    if usage:
        assert "LOCAL:0" in usage, f"register spills: {usage}"


def _k_loop(ttgir: str) -> str:
    """The body of the kernel's first scf.for (the K loop) in a TTGIR dump."""
    start = ttgir.index("scf.for")
    depth, i = 0, ttgir.index("{", start)
    for j in range(i, len(ttgir)):
        depth += {"{": 1, "}": -1}.get(ttgir[j], 0)
        if depth == 0:
            return ttgir[i:j]
    raise AssertionError("unterminated loop")


@pytest.mark.parametrize("M", [16, 64])
def test_tc_x_split_feeds_wgmma_from_the_pipeline(M):
    # X_SPLIT's point, in the sm_90 build: inside the K loop x's operands are never stored to shared memory by
    # the threads (no local_alloc); they arrive by cp.async into the buffers wgmma reads. Without it, two
    # local_allocs a step (the split x pairs) and more registers.
    if INTERPRETED:
        pytest.skip("the interpreter's kernels are not compiled")
    pytest.importorskip("triton.backends.nvidia")
    from w12.kernels.gemm_tc import _w12_tc_kernel

    loops, regs = {}, {}
    for x_split in (False, True):
        consts = dict(
            BLOCK_M=M, BLOCK_N=64, BLOCK_C=64, EVEN_N=True, EVEN_C=True, HAS_BIAS=False, VIEW8=False, USE_ASM=True,
            UPCAST=False, UPCAST_OUT=False, ESC_PRECISION="tf32x3", X_SPLIT=x_split,
        )  # fmt: skip
        k, usage = compile_sm90(_w12_tc_kernel, TC_ARG_TYPES, consts, {"N", "K", "C", "stride_xm", "stride_ym"}, 4, 4)
        loops[x_split] = _k_loop(k.asm["ttgir"])
        found = re.search(r"REG:(\d+)", usage)
        regs[x_split] = int(found.group(1)) if found else None
        if usage:
            assert "LOCAL:0" in usage, f"register spills: {usage}"
    assert loops[False].count("ttg.local_alloc") == 2
    assert "ttg.local_alloc" not in loops[True]
    assert loops[True].count("async_copy_global_to_local") == 4  # hi, lo, x even, x odd
    # Two accumulators (even and odd columns): no wgmma waits for the one before it inside the loop, where the
    # single accumulator of the default path waits for every one (pendings = 0).
    assert "pendings = 0" in loops[False] and "pendings = 0" not in loops[True]
    assert "ttng.warp_group_dot " in loops[True]
    if regs[True] is not None and regs[False] is not None:  # the second accumulator costs at most its own size
        assert regs[True] <= regs[False] + M * 64 // 128


# ---------------------------------------------------------------------------------------------------------
# The kernel against the reference (GPU, or the interpreter's child)
# ---------------------------------------------------------------------------------------------------------

# (M, N, K, config, bias): N and K off every block size; K = 202 has rows that are not 4-byte aligned.
TC_CASES = [
    (1, 70, 200, TcConfig(64, 128), False),
    (3, 70, 202, TcConfig(32, 64, split_k=2), True),
    (8, 200, 320, TcConfig(64, 128, split_k=3, num_stages=3), False),  # 3 splits of 3 steps: one is short
    (17, 70, 200, TcConfig(64, 256), True),
    (33, 130, 202, TcConfig(128, 64, split_k=2, num_warps=8), False),
    (64, 33, 198, TcConfig(16, 64), True),
    (64, 128, 256, TcConfig(64, 128, split_k=2), False),  # N, K multiples of the blocks: unmasked loads
    (16, 70, 200, None, False),  # the formula's own choice
    (5, 70, 200, TcConfig(64, 256, split_k=4), True),  # more splits than steps: empty splits add nothing
]


def _case(M, N, K, seed=0):
    w = encode(make_weight(N, K, seed=M + seed).to(DEVICE))
    gen = torch.Generator().manual_seed(M + K)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).to(DEVICE)
    return w, x, gen


# The X_SPLIT path (pre-split activations) on the cases whose shapes it changes most: masked K tails, rows past
# M, split-K, the formula's config.
X_SPLIT_CASES = [TC_CASES[i] for i in (1, 2, 4, 5, 6, 7)]


@kernel_case
@pytest.mark.parametrize(
    "M,N,K,cfg,with_bias,x_split", [(*c, False) for c in TC_CASES] + [(*c, True) for c in X_SPLIT_CASES]
)
def test_kernel_tc_matches_reference(M, N, K, cfg, with_bias, x_split):
    w, x, gen = _case(M, N, K)
    assert w.esc_idx.numel() >= 5
    bias = torch.randn(N, generator=gen).to(torch.bfloat16).to(DEVICE) if with_bias else None
    counters = torch.zeros(256, dtype=torch.int32, device=DEVICE)
    y = w12_gemm(x, w, bias, counters=counters, backend="tc", tc_config=cfg, x_split=x_split)
    assert y.shape == (M, N) and y.dtype == torch.bfloat16
    ref = w12_gemm_ref(x, w, bias, out_dtype=torch.float32)
    assert_within(y, ref, gemm_tolerance(x, w, ref), f"tc M={M} N={N} K={K} {cfg} x_split={x_split}")
    assert int(counters.abs().sum()) == 0


@kernel_case
@pytest.mark.parametrize("x_split", [False, True])
@pytest.mark.parametrize("M,N,K,cfg,with_bias", [TC_CASES[i] for i in (1, 2, 4, 5, 7)])
def test_kernel_tc_view8_matches_reference(M, N, K, cfg, with_bias, x_split):
    w, x, gen = _case(M, N, K)
    bias = torch.randn(N, generator=gen).to(torch.bfloat16).to(DEVICE) if with_bias else None
    if cfg is None:
        y = w12_view8_gemm(x, w, bias, backend="tc", x_split=x_split)
    else:
        y = w12_view8_gemm(x, w, bias, tc_config=cfg, x_split=x_split)
    ref = w12_view8_gemm_ref(x, w, bias, out_dtype=torch.float32)
    assert_within(y, ref, gemm_tolerance(x, w, ref, view8=True), f"tc view8 M={M} N={N} K={K} {cfg} {x_split}")


def test_split_x_layout():
    x = torch.arange(3 * 10, dtype=torch.float32).reshape(3, 10).to(torch.bfloat16)
    xs = split_x(x)
    assert xs.shape == (2, 3, 5) and xs.is_contiguous()
    assert torch.equal(xs[0], x[:, 0::2]) and torch.equal(xs[1], x[:, 1::2])


@kernel_case
def test_kernel_tc_one_hot_x_reproduces_weights():
    # y[m] = W[:, k_m] bit for bit for every non-escape weight: the elementwise decode of both parities.
    N, K = 70, 200
    w_bf16 = make_weight(N, K, seed=4).to(DEVICE)
    w = encode(w_bf16)
    ks = torch.tensor([0, 1, 2, 3, K // 2, K - 1, 77, 150, 151, 152, 5, 9, 64, 65, 66, 100, 127, 128], device=DEVICE)
    M = len(ks)
    x = torch.zeros(M, K, dtype=torch.bfloat16, device=DEVICE)
    x[torch.arange(M, device=DEVICE), ks] = 1.0
    want = w_bf16[:, ks].T
    escape = torch.zeros(N * K, dtype=torch.bool, device=DEVICE)
    escape[w.esc_idx] = True
    escape = escape.view(N, K)[:, ks].T
    assert escape.any()
    for x_split in (False, True):
        y = w12_gemm(x, w, tc_config=TcConfig(32, 64, split_k=2), x_split=x_split)
        assert torch.equal(bits16(y)[~escape], bits16(want)[~escape]), x_split


@kernel_case
@pytest.mark.parametrize("M", [3, 17])
def test_kernel_tc_nonfinite_escapes_stay_in_their_rows(M):
    x = torch.randn(M, 200, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).to(DEVICE)
    cfg = TcConfig(32, 64, split_k=2)
    check_nonfinite_escapes(
        lambda x, w: w12_gemm(x, w, tc_config=cfg), make_weight(70, 200, specials=False).to(DEVICE), x
    )


@kernel_case
def test_kernel_tc_split_k_is_deterministic():
    w, x, _ = _case(9, 70, 400)
    counters = torch.zeros(64, dtype=torch.int32, device=DEVICE)
    cfg = TcConfig(16, 64, split_k=3)
    first = w12_gemm(x, w, counters=counters, tc_config=cfg)
    for _ in range(2):
        assert torch.equal(bits16(w12_gemm(x, w, counters=counters, tc_config=cfg)), bits16(first))
    assert int(counters.abs().sum()) == 0


@kernel_case
def test_kernel_tc_strided_and_misaligned_x():
    w, _, _ = _case(6, 40, 128)
    big = torch.randn(2, 3, 161).to(torch.bfloat16).to(DEVICE)
    x = big[..., 1:129]  # odd row stride and an odd element offset: the launcher copies x to aligned rows
    y = w12_gemm(x, w, tc_config=TcConfig(32, 64))
    ref = w12_gemm_ref(x.reshape(6, 128), w, out_dtype=torch.float32)
    assert_within(y.reshape(6, 40), ref, gemm_tolerance(x.reshape(6, 128), w, ref), "strided")


@kernel_case
def test_kernel_w12linear_uses_tc_for_verify_rows():
    lin = torch.nn.Linear(202, 70, bias=True).to(torch.bfloat16)
    mod = W12Linear.from_linear(lin).to(DEVICE)
    for M in (1, 8, 33):
        x = torch.randn(M, 202).to(torch.bfloat16).to(DEVICE)
        ref = w12_gemm_ref(x, mod.weight_w12, mod.bias, out_dtype=torch.float32)
        assert_within(mod(x), ref, gemm_tolerance(x, mod.weight_w12, ref), f"W12Linear M={M}")
        if M > 1:  # the route W12Linear takes at verify sizes is the tensor-core kernel, bit for bit
            want = w12_gemm(x, mod.weight_w12, mod.bias, backend="tc")
            assert torch.equal(bits16(mod(x)), bits16(want))


def test_kernel_cases_in_interpreter():
    if KERNEL_HERE:
        pytest.skip("the kernel cases ran in this process")
    run_kernel_cases_in_interpreter(__file__, "test_kernel_ and not interpreter")


# ---------------------------------------------------------------------------------------------------------
# The benchmark's sweep (its bookkeeping, dry-run on the CPU; the timing needs the GPU)
# ---------------------------------------------------------------------------------------------------------


def test_sweep_configs_are_distinct_and_launchable():
    from sglang_specpilot.suites.w12_gemm import sweep_configs

    for M, N, K in ((8, 4096, 4096), (32, 6144, 4096), (64, 128256, 4096), (16, 3072, 2048), (64, 4096, 14336)):
        cfgs = sweep_configs(M, N, K, 132)
        assert len(cfgs) == len(set(cfgs)) >= 4
        assert default_tc_config(M, N, K) in cfgs
        for c in cfgs:
            tiles = -(-N // c.block_n) * -(-M // c.block_m(M))
            assert c.split_k == 1 or (tiles <= 1024 and -(-K // c.block_k) >= 2 * c.split_k)
            assert c.smem_bytes(M) <= config_module.TC_SMEM_BYTES


def test_sweep_dry_run_on_cpu(monkeypatch, tmp_path):
    import argparse

    from sglang_specpilot.suites import w12_gemm as suite

    if INTERPRETED:
        pytest.skip("a dry run of the bookkeeping, not of the kernels")
    monkeypatch.setattr(suite, "DEVICE", "cpu")
    p = argparse.ArgumentParser()
    suite._args(p)
    args = p.parse_args(["--blocks", "2", "--inner", "1", "--rotate-mb", "1", "--sweep-ms", "8"])
    rows = suite._time_shape("llama-3.1-8b", "o", 128, 48, [1, 8], args)
    assert "best_config" not in rows[0] and rows[0]["w12_kernel"] == "quad"
    r = rows[1]
    assert r["w12_kernel"] == "tc" and r["sweep_outside_tolerance"] == 0 and r["sweep"]
    assert r["speedup_best"] > 0 and TcConfig(**r["best_config"]) in suite.sweep_configs(8, 48, 128, 132)
    table = suite.chosen_table(rows)
    assert list(table) == [tc_table_key(8, 48, 128)]
    # An M = 1 row enters the table only if the swept tensor-core kernel beat the quad kernel by > 2%.
    m1 = {"M": 1, "N": 48, "K": 128, "w12_kernel": "quad", "speedup": 1.0, "best_config": TcConfig().to_dict()}
    assert tc_table_key(1, 48, 128) not in suite.chosen_table([{**m1, "speedup_best": 1.01}])
    assert tc_table_key(1, 48, 128) in suite.chosen_table([{**m1, "speedup_best": 1.05}])
    assert any(k.endswith(":xs") for k in r["sweep"]) and not any(k.endswith(":xs") for k in rows[0].get("sweep", {}))
    assert r["w12_xs0_us"] > 0 and r["w12_xs1_us"] > 0 and "x_split_gain" in r and "w12_xs0_us" not in rows[0]
    metrics = suite.summarize(rows)
    assert {"gemm_speedup_best_geomean_m8_llama8b", "achieved_TBps_o_m8_llama8b"} <= set(metrics)
    assert {"gemm_speedup_xsplit0_geomean_m8_llama8b", "gemm_speedup_xsplit1_geomean_m8_llama8b"} <= set(metrics)
    args.results_dir = tmp_path
    suite._write_partial(args, rows, 1.5)
    partial = json.loads((tmp_path / "w12_gemm_partial.json").read_text())
    assert partial["tuned_tc"] == table and len(partial["rows"]) == 2
    text = suite.summary_table(metrics, ["llama-3.1-8b"], [1, 8])
    assert text.splitlines()[0].split()[:3] == ["model", "M", "geomean"] and len(text.splitlines()) == 3


# ---------------------------------------------------------------------------------------------------------
# GPU: the inline-PTX decode (packs of 4) against the plain-tl one, bit for bit, on a real shape
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("M", [8, 33, 64])
def test_gpu_tc_asm_and_tl_decodes_agree(M):
    from test_w12_kernels import gpu_weight

    w = encode(gpu_weight(4096, 6144, seed=M))
    x = torch.randn(M, 4096, device="cuda").to(torch.bfloat16)
    for cfg in sweep_configs_for_test(M):
        a = w12_gemm(x, w, tc_config=cfg, use_asm=True)
        b = w12_gemm(x, w, tc_config=cfg, use_asm=False)
        assert torch.equal(bits16(a), bits16(b)), cfg
    ref = w12_gemm_ref(x, w, out_dtype=torch.float32)
    assert_within(w12_gemm(x, w), ref, gemm_tolerance(x, w, ref), f"default M={M}")
    # One-hot rows: the decoded weights themselves, bit for bit, through the asm path.
    ks = torch.arange(M, device="cuda") * 61 % 4096
    onehot = torch.zeros(M, 4096, dtype=torch.bfloat16, device="cuda")
    onehot[torch.arange(M, device="cuda"), ks] = 1.0
    want = decode_reference(w)[:, ks].T
    escape = torch.zeros(6144 * 4096, dtype=torch.bool, device="cuda")
    escape[w.esc_idx] = True
    escape = escape.view(6144, 4096)[:, ks].T
    y = w12_gemm(onehot, w)
    assert torch.equal(bits16(y)[~escape], bits16(want)[~escape])


def sweep_configs_for_test(M: int) -> list[TcConfig]:
    return [c.with_split(s) for c in tc_candidates(M)[:3] for s in (1, 3)]


@pytest.mark.gpu
def test_gpu_tc_cuda_graph_and_compile():
    from test_w12_kernels import gpu_weight

    w = encode(gpu_weight(4096, 4096, seed=3))
    layer = W12Linear(w).cuda()
    x = torch.randn(16, 4096, device="cuda").to(torch.bfloat16)
    eager = layer(x)  # the tensor-core kernel, split-K (counters and partials)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x)
    for _ in range(3):
        graph.replay()
        assert torch.equal(bits16(out), bits16(eager))
    compiled = torch.compile(layer, fullgraph=True)
    assert torch.equal(bits16(compiled(x)), bits16(eager))
    assert int(layer.counters.abs().sum()) == 0
