"""W12 kernels: register decode, exact GEMM and 8-bit-view GEMM against their PyTorch references.

Where the kernels run: on the GPU when there is one, else on the CPU in the Triton interpreter. The
interpreter works only if TRITON_INTERPRET=1 is set before triton is imported, and other test modules
import it first, so on a CPU the kernel cases (``test_kernel_*``) run in a child pytest
(``test_kernel_cases_in_interpreter``); ``TRITON_INTERPRET=1 pytest tests/test_w12_kernels.py`` shows them
case by case. The interpreter cannot run inline asm, so the PTX decode is checked here by a small
emulator of the instructions it uses (``test_*_ptx_*``), under Triton's packing rule (element j of a pack
sits in bits 16j.. of a 16-bit operand's register).

Tolerance (the GEMMs' stated contract, ``gemm_tolerance``): ``|y - y_ref| <= 2^-8 |y_ref| + K 2^-22
|x| @ |W_hat|^T`` against decode-then-matmul in fp32; 2^-8 is the BF16 output's unit roundoff, so a
truncating output conversion fails it (``test_tolerance_rejects_truncation``). Decoding itself is exact:
``torch.equal`` on bit patterns, and a one-hot x must reproduce weights bit for bit.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import numpy as np
import pytest
import torch
import triton
from helpers import assert_within, bits16, check_nonfinite_escapes, run_kernel_cases_in_interpreter

from w12.codec import encode
from w12.format import W12Tensor, decode_reference, decode_view8_reference
from w12.kernels import (
    INTERPRETED,
    GemmConfig,
    default_config,
    escape_correction_ref,
    escape_row_ptr,
    gemm_tolerance,
    placeholder_values,
    w12_decode,
    w12_gemm,
    w12_gemm_ref,
    w12_view8_gemm,
    w12_view8_gemm_ref,
)
from w12.kernels import config as config_module
from w12.kernels.decode import EXACT_PTX, VIEW8_PTX
from w12.kernels.gemm import shared_counters

pytestmark = [
    # The interpreter's range() over a run-time bound converts a 1-element array to int: deprecated in numpy.
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
    # inf / NaN escapes make numpy warn inside the interpreter; the results are checked.
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_HERE = torch.cuda.is_available() or INTERPRETED
kernel_case = pytest.mark.skipif(
    not KERNEL_HERE, reason="on a CPU the kernel cases run in test_kernel_cases_in_interpreter's child"
)


def make_weight(N: int, K: int, seed: int = 0, specials: bool = True) -> torch.Tensor:
    """N(0, 0.02) BF16 weights; with ``specials``, escapes of every kind: zeros, far below and far above
    the window (1e-30, -3e-12, 1e4)."""
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(N, K, generator=gen) * 0.02).to(torch.bfloat16)
    if specials:
        w[0, : min(5, K)] = 0.0
        w[min(3, N - 1), min(1, K - 1)] = 1e-30
        w[min(3, N - 1), min(2, K - 1)] = 1e4
        w[min(5, N - 1), K - 1] = -3e-12
        w[N - 1, K // 2] = -2e3
    return w


def every_code_record(K: int, bases: tuple[int, ...] = (0, 1, 127, 240)) -> W12Tensor:
    """Every 12-bit code at every position of a quad, rows cycling through ``bases``; no escapes."""
    codes = torch.arange(4096, dtype=torch.int32)
    gen = torch.Generator().manual_seed(1)
    n_rows = max(1, 4096 * 4 // K + 1)
    flat = torch.randint(0, 4096, (n_rows * K,), generator=gen, dtype=torch.int32)
    for pos in range(4):  # code c at position pos of quad c (k = 4c + pos, wrapping over rows)
        flat[(codes * 4 + pos) % flat.numel()] = codes
    code = flat.view(n_rows, K)
    hi = (code >> 4).to(torch.uint8)
    nib = (code & 0xF).to(torch.uint8)
    lo = torch.zeros(n_rows, (K + 1) // 2, dtype=torch.uint8)
    lo[:, : K // 2] = nib[:, 0 : K - 1 : 2] | (nib[:, 1::2] << 4)
    if K % 2:
        lo[:, -1] = nib[:, -1]
    base = torch.tensor([bases[i % len(bases)] for i in range(n_rows)], dtype=torch.uint8)
    empty = torch.zeros(0, dtype=torch.int64)
    return W12Tensor(hi, lo, base, empty, torch.zeros(0, dtype=torch.bfloat16), (n_rows, K))


def to_device(w: W12Tensor, device) -> W12Tensor:
    return W12Tensor(*(t.to(device) for t in (w.hi, w.lo, w.base, w.esc_idx, w.esc_val)), w.shape)


# ---------------------------------------------------------------------------------------------------------
# The inline PTX, emulated (CPU, fast)
# ---------------------------------------------------------------------------------------------------------

U32 = np.uint64(0xFFFFFFFF)


def _lop3(a, b, c, lut):
    out = np.zeros_like(a)
    for i in range(8):
        if lut >> i & 1:
            term = (a if i & 4 else ~a & U32) & (b if i & 2 else ~b & U32) & (c if i & 1 else ~c & U32)
            out |= term
    return out


def _prmt(a, b, sel):
    src = [(a >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)] + [
        (b >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)
    ]
    out = np.zeros_like(a)
    for j in range(4):
        nib = (sel >> (4 * j)) & 0xF
        byte = src[nib & 7]
        if nib & 8:  # replicate the selected byte's sign
            byte = np.where(byte & np.uint64(0x80), np.uint64(0xFF), np.uint64(0))
        out |= byte << np.uint64(8 * j)
    return out


def emulate_ptx(asm: str, operands: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Run the straight-line PTX of the decode on uint32 values (held in uint64 arrays)."""
    regs: dict[str, np.ndarray] = {}
    like = next(iter(operands.values()))

    def val(tok: str):
        tok = tok.strip()
        if tok.startswith("$"):
            return operands[int(tok[1:])]
        if tok in regs:
            return regs[tok]
        return np.full_like(like, int(tok, 0))

    for line in asm.strip().splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        args = [a.strip() for a in rest.split(",")]
        dst, src = args[0], args[1:]
        if op == "mov.b32":
            res = val(src[0])
        elif op == "shl.b32":
            res = (val(src[0]) << np.uint64(int(src[1], 0))) & U32
        elif op == "shr.u32":
            res = val(src[0]) >> np.uint64(int(src[1], 0))
        elif op == "and.b32":
            res = val(src[0]) & val(src[1])
        elif op == "add.u32":
            res = (val(src[0]) + val(src[1])) & U32
        elif op == "prmt.b32":
            res = _prmt(val(src[0]), val(src[1]), int(src[2], 0))
        elif op == "lop3.b32":
            res = _lop3(val(src[0]), val(src[1]), val(src[2]), int(src[3], 0))
        else:
            raise ValueError(f"the emulator does not know {op!r}")
        if dst.startswith("$"):
            operands[int(dst[1:])] = res
        else:
            regs[dst] = res
    return operands


def quads_of(w: W12Tensor):
    """(H, L, base2) per quad of a record with K % 4 == 0, as uint64 arrays [N * K / 4]."""
    N, K = w.shape
    h = w.hi.numpy().astype(np.uint64).reshape(N, K // 4, 4)
    H = h[..., 0] | h[..., 1] << np.uint64(8) | h[..., 2] << np.uint64(16) | h[..., 3] << np.uint64(24)
    lo = w.lo.numpy().astype(np.uint64).reshape(N, K // 4, 2)
    L = lo[..., 0] | lo[..., 1] << np.uint64(8)
    b = w.base.numpy().astype(np.uint64)[:, None]
    base2 = np.broadcast_to(b << np.uint64(7) | b << np.uint64(23), H.shape)
    return H.reshape(-1), L.reshape(-1), base2.reshape(-1).copy()


def expected_pairs(decoded: torch.Tensor):
    """(we, wo) per quad from a decoded [N, K] bf16 matrix: (k=4q | k=4q+2 << 16), (4q+1 | 4q+3 << 16)."""
    b = bits16(decoded).numpy().astype(np.uint16).astype(np.uint64).reshape(-1, 4)
    return b[:, 0] | b[:, 2] << np.uint64(16), b[:, 1] | b[:, 3] << np.uint64(16)


@pytest.mark.parametrize("view8", [False, True])
def test_ptx_decodes_every_code(view8):
    w = every_code_record(256)
    H, L, base2 = quads_of(w)
    # Two quads per asm block (pack=2): even and odd quads go in as element 0 and 1.
    ops = {4: H[0::2], 5: H[1::2]}
    if view8:
        ops.update({6: base2[0::2] + np.uint64(0x00080008), 7: base2[1::2] + np.uint64(0x00080008)})
        out = emulate_ptx(VIEW8_PTX, ops)
        want_e, want_o = expected_pairs(decode_view8_reference(w))
    else:
        ops.update({6: L[0::2] | L[1::2] << np.uint64(16), 7: base2[0::2], 8: base2[1::2]})
        out = emulate_ptx(EXACT_PTX, ops)
        want_e, want_o = expected_pairs(decode_reference(w))
    got_e = np.empty_like(want_e)
    got_o = np.empty_like(want_o)
    got_e[0::2], got_e[1::2], got_o[0::2], got_o[1::2] = out[0], out[1], out[2], out[3]
    bad = np.nonzero((got_e != want_e) | (got_o != want_o))[0]
    assert bad.size == 0, f"{bad.size} quads wrong, first {bad[0]}: {got_e[bad[0]]:#x} vs {want_e[bad[0]]:#x}"


def test_emulator_knows_its_instructions():
    a = np.array([0x11223344], dtype=np.uint64)
    assert _prmt(a, np.zeros_like(a), 0x4140)[0] == 0x00330044  # [byte0, 0, byte1, 0]
    assert _prmt(a, np.zeros_like(a), 0x4342)[0] == 0x00110022  # [byte2, 0, byte3, 0]
    # lop3 LUTs: 0xD8 = c ? b : a, 0xF8 = a | (b & c)
    x, y, z = (np.array([v], dtype=np.uint64) for v in (0xF0F0F0F0, 0xCCCCCCCC, 0xAAAAAAAA))
    assert _lop3(x, y, z, 0xD8)[0] == (0xCCCCCCCC & 0xAAAAAAAA) | (0xF0F0F0F0 & ~0xAAAAAAAA & 0xFFFFFFFF)
    assert _lop3(x, y, z, 0xF8)[0] == 0xF0F0F0F0 | (0xCCCCCCCC & 0xAAAAAAAA)


def test_ptx_uses_only_emulated_instructions():
    # A new instruction in the asm must come with an emulator for it, or this file stops checking the asm.
    known = {"mov.b32", "shl.b32", "shr.u32", "and.b32", "add.u32", "prmt.b32", "lop3.b32"}
    for asm in (EXACT_PTX, VIEW8_PTX):
        ops = {m.group(1) for m in re.finditer(r"^\s*([a-z0-9]+\.[a-z0-9]+)\s", asm, re.M)}
        assert ops <= known, ops - known


# ---------------------------------------------------------------------------------------------------------
# Host-side pieces (CPU, fast)
# ---------------------------------------------------------------------------------------------------------


def test_default_config():
    # M = 1 on Llama-3.1-8B o_proj: 128 tiles of 32 rows < 2 per SM, so K is split in 3 (8 K-steps of 512).
    cfg = default_config(1, 4096, 4096)
    assert (cfg.block_n, cfg.block_k, cfg.split_k, cfg.use_dot) == (32, 512, 3, False)
    # gate_up (896 tiles): no split. lm_head neither.
    assert default_config(1, 28672, 4096).split_k == 1
    assert default_config(4, 128256, 4096).split_k == 1
    # From 2 rows on: tensor cores, 128 weight rows per tile, activations padded to 16.
    cfg = default_config(32, 4096, 4096)
    assert cfg.use_dot and cfg.block_n == 128 and cfg.block_m(32) == 32 and cfg.split_k == 8
    assert default_config(2, 6144, 4096).block_m(2) == 16  # tl.dot needs 16 rows
    assert default_config(64, 128256, 4096).split_k == 1
    # A tiny K never gets a block past it.
    assert default_config(1, 70, 200).block_k == 256


def test_config_validation():
    with pytest.raises(ValueError):
        GemmConfig(48, 128)
    with pytest.raises(ValueError):
        GemmConfig(64, 32)
    with pytest.raises(ValueError):
        GemmConfig(8, 128, use_dot=True)


def test_tuned_table_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setattr(config_module, "TUNED_DIR", tmp_path)
    config_module.tuned_table.cache_clear()
    cfg = GemmConfig(16, 512, 4, False, 4, 2)
    key = config_module.table_key(1, 4096, 4096, False)
    path = config_module.save_tuned("NVIDIA H200", {key: cfg})
    assert path.name == "h200.json"
    assert config_module.tuned_table("NVIDIA H200")[key] == cfg
    assert config_module.table_key(3, 4096, 4096, True) == "view8_m4_n4096_k4096"
    # The CUDA kernel's section shares the file and leaves the Triton configs in place.
    from w12.kernels.mma import MmaConfig

    mcfg = MmaConfig(32, 4, 2)
    config_module.save_tuned("NVIDIA H200", {key: mcfg}, section="mma")
    assert config_module.tuned_table("NVIDIA H200", "mma")[key] == mcfg
    assert config_module.tuned_table("NVIDIA H200")[key] == cfg
    config_module.tuned_table.cache_clear()


def test_escape_row_ptr_and_placeholder():
    w = encode(make_weight(9, 13))
    ptr = escape_row_ptr(w)
    assert ptr.dtype == torch.int32 and ptr.shape == (10,) and ptr[0] == 0 and ptr[-1] == w.esc_idx.numel()
    for n in range(9):
        rows = w.esc_idx[ptr[n] : ptr[n + 1]] // 13
        assert (rows == n).all()
    # Code 0 decodes to the placeholder: check against the format's decoder on a record of zeros.
    zeros = W12Tensor(
        torch.zeros(3, 4, dtype=torch.uint8),
        torch.zeros(3, 2, dtype=torch.uint8),
        torch.tensor([0, 127, 240], dtype=torch.uint8),
        torch.zeros(0, dtype=torch.int64),
        torch.zeros(0, dtype=torch.bfloat16),
        (3, 4),
    )
    assert torch.equal(decode_reference(zeros).float()[:, 0], placeholder_values(zeros.base))


def test_escape_correction_restores_the_product():
    # x @ W_hat^T (placeholders in the escape slots) plus the correction is x @ W^T, up to fp32 rounding.
    w_bf16 = make_weight(20, 40)
    w = encode(w_bf16)
    assert w.esc_idx.numel() >= 5
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    w_hat = decode_reference(w).double()
    w_hat.view(-1)[w.esc_idx] = placeholder_values(w.base)[w.esc_idx // 40].double()
    got = x.double() @ w_hat.T + escape_correction_ref(x, w).double()
    want = x.double() @ w_bf16.double().T
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6 * float(want.abs().max()))


def test_cpu_falls_back_to_reference():
    if INTERPRETED:
        pytest.skip("under the interpreter CPU tensors go to the kernel")
    w = encode(make_weight(30, 64))
    x = torch.randn(2, 64).to(torch.bfloat16)
    assert torch.equal(w12_gemm(x, w), w12_gemm_ref(x, w))
    assert torch.equal(w12_view8_gemm(x, w), w12_view8_gemm_ref(x, w))


def test_tolerance_rejects_truncation():
    # The bound is tight enough to catch an fp32 -> bf16 conversion that truncates instead of rounding.
    w = encode(make_weight(64, 256, specials=False))
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    ref = w12_gemm_ref(x, w, out_dtype=torch.float32)
    tol = gemm_tolerance(x, w, ref)
    rounded = ref.to(torch.bfloat16).float()
    truncated = ((ref.view(torch.int32) >> 16) << 16).view(torch.float32)
    assert ((rounded - ref).abs() <= tol).all()
    # Truncation errs by [0, 1) ulp against a bound of 1/2 .. 1 ulp: it must fail a good share of elements.
    assert ((truncated - ref).abs() > tol).float().mean() > 0.05


def test_bench_suite_helpers():
    # The benchmark suite's shape table and metric summary (its timing needs a GPU).
    from sglang_specpilot.suites import w12_gemm as suite

    shapes = suite.projection_shapes("llama-3.1-8b")
    assert shapes == {
        "qkv": (4096, 6144),
        "o": (4096, 4096),
        "gate_up": (4096, 28672),
        "down": (14336, 4096),
        "lm_head": (4096, 128256),
    }
    assert suite.projection_shapes("llama-3.2-1b")["qkv"] == (2048, 3072)
    assert suite.copies_for(6 << 20, 120 << 20) == 20 and suite.copies_for(800 << 20, 120 << 20) == 1
    rows = [
        {"model": "llama-3.1-8b", "proj": p, "M": m, "speedup": s}
        for p, s in (("qkv", 1.2), ("o", 1.5), ("down", 1.35))
        for m in (1, 32)
    ]
    metrics = suite.summarize(rows)
    assert metrics["gemm_speedup_min_m1_llama8b"] == 1.2
    assert abs(metrics["gemm_speedup_geomean_m1_llama8b"] - (1.2 * 1.5 * 1.35) ** (1 / 3)) < 1e-3
    assert "gemm_speedup_geomean_m32_llama8b" in metrics
    # The tuner's launches: distinct configs only, each with the kwargs that select it.
    for backend, key in (("triton", "config"), ("cuda", "mma_config")):
        trials = suite._trials(backend, 1, 4096, 4096, 132)
        assert trials and all(kw[key] is cfg for cfg, kw, _ in trials)
        launched = [(c.rows_per_warp, c.warps, f["splits"]) if backend == "cuda" else c for c, _, f in trials]
        assert len(set(launched)) == len(launched)


def test_bench_suite_dry_run_on_cpu(monkeypatch):
    # _time_shape's bookkeeping on the CPU: wall clock, no graphs, the reference GEMMs; the numbers mean
    # nothing, the rows' fields and the tolerance check are what is tested.
    import argparse

    from sglang_specpilot.suites import w12_gemm as suite

    if INTERPRETED:
        pytest.skip("a dry run of the bookkeeping, not of the kernels")
    monkeypatch.setattr(suite, "DEVICE", "cpu")
    p = argparse.ArgumentParser()
    suite._args(p)
    args = p.parse_args(["--blocks", "2", "--inner", "1", "--rotate-mb", "1"])
    rows = suite._time_shape("llama-3.1-8b", "o", 64, 48, [1, 3], args)
    assert [r["M"] for r in rows] == [1, 3] and rows[0]["copies"] > 1
    for r in rows:
        assert r["w12_outside_tolerance"] == 0 and r["view8_outside_tolerance"] == 0
        assert r["speedup"] > 0 and r["w12_TBps"] > 0 and "view8_speedup" in r
    metrics = suite.summarize(rows)
    assert {
        "gemm_speedup_geomean_m1_llama8b",
        "gemm_speedup_min_m1_llama8b",
        "gemm_speedup_geomean_m3_llama8b",
    } <= set(metrics)


# ---------------------------------------------------------------------------------------------------------
# sm_90 builds on the CPU: Triton lowers the kernels and its bundled ptxas assembles them (inline PTX too)
# ---------------------------------------------------------------------------------------------------------

GEMM_ARG_TYPES = {
    "x_ptr": "*bf16",
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
    "K2": "i32",
    "Q": "i32",
    "stride_xm": "i32",
    "stride_ym": "i32",
}


def compile_sm90(kernel, types: dict, constexprs: dict, divisible: set, num_warps: int, num_stages: int):
    """triton.compile for an H100/H200 without a GPU; returns (compiled kernel, cuobjdump resource line)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = kernel.arg_names
    sig = {n: "constexpr" if n in constexprs else types[n] for n in names}
    const = {(names.index(n),): v for n, v in constexprs.items()}
    # As the launcher would specialize: 16-byte aligned pointers, the given ints divisible by 16.
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(names)
        if n in types and (types[n].startswith("*") or n in divisible)
    }
    src = ASTSource(kernel, sig, const, attrs)
    k = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages}
    )
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    usage = ""
    if os.path.exists(cuobjdump):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            usage = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    return k, usage


SM90_CASES = [  # (M, N, K, view8, bias): Llama-3.1-8B shapes and the default configs, plus a ragged one
    (1, 4096, 4096, False, False),  # fp32 FMA path, split-K
    (1, 28672, 4096, True, False),
    (16, 6144, 4096, False, True),  # tensor cores, split-K, bias
    (64, 28672, 4096, False, False),
    (32, 4096, 14336, True, False),
    (3, 70, 202, False, True),  # unaligned rows, masked loads
]


@pytest.mark.parametrize("M,N,K,view8,with_bias", SM90_CASES)
def test_kernels_compile_for_sm90(M, N, K, view8, with_bias):
    if INTERPRETED:
        pytest.skip("the interpreter's kernels are not compiled")
    pytest.importorskip("triton.backends.nvidia")
    from w12.kernels.gemm import _w12_gemm_kernel

    cfg = default_config(M, N, K, view8=view8)
    aligned = K % 4 == 0
    consts = dict(
        BLOCK_M=cfg.block_m(M),
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT_K=cfg.split_k,
        USE_DOT=cfg.use_dot,
        VIEW8=view8,
        ALIGNED=aligned,
        EVEN=N % cfg.block_n == 0 and K % cfg.block_k == 0,
        HAS_BIAS=with_bias,
        USE_ASM=True,
        UPCAST=False,
        UPCAST_OUT=False,
        DOT_PRECISION="tf32",
        ESC_PRECISION="tf32x3",
    )
    divisible = {n for n, v in (("N", N), ("K", K), ("Q", K // 4), ("stride_xm", K), ("stride_ym", N)) if v % 16 == 0}
    k, usage = compile_sm90(_w12_gemm_kernel, GEMM_ARG_TYPES, consts, divisible, cfg.num_warps, cfg.num_stages)
    ptx = k.asm["ptx"]
    assert ("0x07F007F0" if view8 else "0x4342") in ptx  # our inline decode (its constants) is in
    assert ("wgmma" in ptx) == cfg.use_dot  # Hopper tensor cores when asked for
    if usage:
        assert "LOCAL:0" in usage, f"register spills: {usage}"


def test_decode_kernel_compiles_for_sm90():
    if INTERPRETED:
        pytest.skip("the interpreter's kernels are not compiled")
    pytest.importorskip("triton.backends.nvidia")
    from w12.kernels.decode import _w12_decode_kernel

    types = {"hi_ptr": "*u8", "lo_ptr": "*u8", "base_ptr": "*u8", "out_ptr": "*bf16"}
    types.update({n: "i32" for n in ("N", "K", "K2", "Q")})
    for view8 in (False, True):
        consts = dict(BLOCK_N=16, BLOCK_Q=64, ALIGNED=True, VIEW8=view8, USE_ASM=True)
        k, usage = compile_sm90(_w12_decode_kernel, types, consts, {"K", "Q"}, 4, 1)
        assert "lop3.b32" in k.asm["ptx"]
        if usage:
            assert "LOCAL:0" in usage, usage


# ---------------------------------------------------------------------------------------------------------
# The kernels against the references (GPU, or the interpreter's child)
# ---------------------------------------------------------------------------------------------------------


@kernel_case
@pytest.mark.parametrize("K", [256, 202, 199])
def test_kernel_decode_every_code(K):
    # K = 202 and 199: rows not 4-byte aligned, the byte-assembled quad path.
    w = to_device(every_code_record(K), DEVICE)
    assert torch.equal(bits16(w12_decode(w)), bits16(decode_reference(w)))
    assert torch.equal(bits16(w12_decode(w, view8=True)), bits16(decode_view8_reference(w)))


@kernel_case
def test_kernel_decode_codec_roundtrip():
    w_bf16 = make_weight(37, 120).to(DEVICE)
    w_bf16[7, 3] = float("nan")
    w_bf16[8, 4] = float("-inf")
    assert torch.equal(bits16(w12_decode(encode(w_bf16))), bits16(w_bf16))


# (M, N, K, config, bias); N = 70 and K = 200 are not multiples of any block, K = 202 / 199 are unaligned.
GEMM_CASES = [
    (1, 70, 200, GemmConfig(64, 128), False),
    (1, 70, 200, GemmConfig(64, 256, split_k=3), True),  # more splits than K-steps: empty splits add nothing
    (3, 70, 202, GemmConfig(32, 64, split_k=2), False),
    (4, 33, 199, GemmConfig(64, 64), True),
    (5, 70, 200, GemmConfig(32, 64, split_k=2, use_dot=True), True),
    (17, 70, 202, GemmConfig(64, 128, use_dot=True), False),
    (64, 33, 199, GemmConfig(128, 256, use_dot=True), False),
    (64, 70, 200, GemmConfig(16, 64, split_k=4, use_dot=True), True),
    (2, 70, 200, None, False),  # the launcher's own choice
    (2, 64, 256, GemmConfig(32, 128, split_k=2), True),  # N, K multiples of the blocks: the unmasked loads
    (16, 64, 256, GemmConfig(64, 128, use_dot=True), False),
]


@kernel_case
@pytest.mark.parametrize("M,N,K,cfg,with_bias", GEMM_CASES)
def test_kernel_gemm_matches_reference(M, N, K, cfg, with_bias):
    w = encode(make_weight(N, K, seed=M).to(DEVICE))
    assert w.esc_idx.numel() >= 5
    gen = torch.Generator().manual_seed(M + K)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).to(DEVICE)
    bias = torch.randn(N, generator=gen).to(torch.bfloat16).to(DEVICE) if with_bias else None
    y = w12_gemm(x, w, bias, config=cfg)
    assert y.shape == (M, N) and y.dtype == torch.bfloat16
    ref = w12_gemm_ref(x, w, bias, out_dtype=torch.float32)
    assert_within(y, ref, gemm_tolerance(x, w, ref), f"exact M={M} N={N} K={K} {cfg}")


@kernel_case
@pytest.mark.parametrize("M,N,K,cfg,with_bias", [GEMM_CASES[i] for i in (0, 2, 3, 4, 6)])
def test_kernel_view8_gemm_matches_reference(M, N, K, cfg, with_bias):
    w = encode(make_weight(N, K, seed=M).to(DEVICE))
    gen = torch.Generator().manual_seed(M)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).to(DEVICE)
    bias = torch.randn(N, generator=gen).to(torch.bfloat16).to(DEVICE) if with_bias else None
    y = w12_view8_gemm(x, w, bias, config=cfg)
    ref = w12_view8_gemm_ref(x, w, bias, out_dtype=torch.float32)
    assert_within(y, ref, gemm_tolerance(x, w, ref, view8=True), f"view8 M={M} {cfg}")


@kernel_case
@pytest.mark.parametrize("cfg", [GemmConfig(32, 64, split_k=2), GemmConfig(16, 64, split_k=3, use_dot=True)])
def test_kernel_one_hot_x_reproduces_weights(cfg):
    # y[m] = W[:, k_m] exactly: every decoded weight is checked bit for bit through the GEMM. An escape
    # slot gives p + fl(v - p), which is v unless v sits ~2^17 below the window (then within 2^-23 p).
    N, K = 70, 200
    w_bf16 = make_weight(N, K, seed=4).to(DEVICE)
    w = encode(w_bf16)
    ks = torch.tensor([0, 1, 2, 3, K // 2, K - 1, 77, 150, 151, 152, 5, 9, 64, 65, 66, 100], device=DEVICE)
    M = 4 if not cfg.use_dot else len(ks)
    x = torch.zeros(M, K, dtype=torch.bfloat16, device=DEVICE)
    x[torch.arange(M, device=DEVICE), ks[:M]] = 1.0
    y = w12_gemm(x, w, config=cfg)
    want = w_bf16[:, ks[:M]].T
    escape = torch.zeros(N * K, dtype=torch.bool, device=DEVICE)
    escape[w.esc_idx] = True
    escape = escape.view(N, K)[:, ks[:M]].T
    assert escape.any(), "the case should cross some escapes"
    assert torch.equal(bits16(y)[~escape], bits16(want)[~escape])
    p = placeholder_values(w.base).to(DEVICE)[None, :].expand(M, N)
    assert ((y.float() - want.float()).abs()[escape] <= 2.0**-23 * p[escape]).all()


@kernel_case
@pytest.mark.parametrize("cfg,M", [(GemmConfig(64, 128, split_k=2), 3), (GemmConfig(32, 64, use_dot=True), 17)])
def test_kernel_nonfinite_escapes_stay_in_their_rows(cfg, M):
    x = torch.randn(M, 200, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).to(DEVICE)
    check_nonfinite_escapes(lambda x, w: w12_gemm(x, w, config=cfg), make_weight(70, 200, specials=False).to(DEVICE), x)


@kernel_case
def test_kernel_split_k_is_deterministic_and_resets_counters():
    w = encode(make_weight(70, 200).to(DEVICE))
    x = torch.randn(2, 200).to(torch.bfloat16).to(DEVICE)
    counters = torch.zeros(64, dtype=torch.int32, device=DEVICE)
    cfg = GemmConfig(16, 64, split_k=4)
    first = w12_gemm(x, w, config=cfg, counters=counters)
    assert int(counters.abs().sum()) == 0
    for _ in range(2):
        assert torch.equal(bits16(w12_gemm(x, w, config=cfg, counters=counters)), bits16(first))
    assert int(shared_counters(x.device).abs().sum()) == 0


@kernel_case
def test_kernel_no_escapes_leading_dims_strided_x():
    # Magnitudes within 4 binades: nothing leaves its row's window, so the record has no escapes.
    gen = torch.Generator().manual_seed(6)
    mag = torch.rand(40, 128, generator=gen) * 0.03 + 0.002
    sign = torch.randint(0, 2, (40, 128), generator=gen) * 2 - 1
    w = encode((mag * sign).to(torch.bfloat16).to(DEVICE))
    assert w.esc_idx.numel() == 0
    big = torch.randn(2, 3, 160).to(torch.bfloat16).to(DEVICE)
    x = big[..., 16:144]  # stride 160 along the rows
    y = w12_gemm(x, w, config=GemmConfig(32, 64))
    assert y.shape == (2, 3, 40)
    ref = w12_gemm_ref(x.reshape(6, 128), w, out_dtype=torch.float32)
    assert_within(y.reshape(6, 40), ref, gemm_tolerance(x.reshape(6, 128), w, ref), "strided")


# ---------------------------------------------------------------------------------------------------------
# On a CPU: the kernel cases in a child process with the interpreter
# ---------------------------------------------------------------------------------------------------------


def test_kernel_cases_in_interpreter():
    if KERNEL_HERE:
        pytest.skip("the kernel cases ran in this process")
    run_kernel_cases_in_interpreter(__file__, "test_kernel_ and not interpreter")


# ---------------------------------------------------------------------------------------------------------
# GPU: Llama-3.1-8B shapes, the PTX against the tl decode, graphs and compile
# ---------------------------------------------------------------------------------------------------------

LLAMA8B = {
    "qkv": (4096, 6144),
    "o": (4096, 4096),
    "gate_up": (4096, 28672),
    "down": (14336, 4096),
    "lm_head": (4096, 128256),
}


def gpu_weight(K: int, N: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(N, K, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
    flat = w.view(-1)
    pick = torch.randint(0, N * K, (max(8, N * K // 5000),), generator=gen, device="cuda")
    flat[pick[0::2]] = 0.0  # ~0.01% exact zeros: escapes
    flat[pick[1::2]] = 1e3  # and outliers far above the window
    return w


@pytest.mark.gpu
@pytest.mark.parametrize("proj", list(LLAMA8B))
def test_gpu_llama8b_projections(proj):
    K, N = LLAMA8B[proj]
    w = encode(gpu_weight(K, N, seed=len(proj)))
    for M in (1, 8, 32, 64):
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        ref = w12_gemm_ref(x, w, out_dtype=torch.float32)
        assert_within(w12_gemm(x, w), ref, gemm_tolerance(x, w, ref), f"{proj} M={M}")
        ref8 = w12_view8_gemm_ref(x, w, out_dtype=torch.float32)
        assert_within(w12_view8_gemm(x, w), ref8, gemm_tolerance(x, w, ref8, view8=True), f"{proj} view8 M={M}")
    del w
    torch.cuda.empty_cache()


@pytest.mark.gpu
def test_gpu_asm_and_tl_decodes_agree():
    for K in (4096, 202):
        w = to_device(every_code_record(K), "cuda")
        ref = bits16(decode_reference(w))
        assert torch.equal(bits16(w12_decode(w, use_asm=True)), ref)
        assert torch.equal(bits16(w12_decode(w, use_asm=False)), ref)
        ref8 = bits16(decode_view8_reference(w))
        assert torch.equal(bits16(w12_decode(w, view8=True, use_asm=True)), ref8)
    w = encode(gpu_weight(4096, 6144, seed=1))
    x = torch.randn(3, 4096, device="cuda").to(torch.bfloat16)
    for cfg in (default_config(3, 6144, 4096), default_config(32, 6144, 4096)):
        xm = x if not cfg.use_dot else torch.randn(32, 4096, device="cuda").to(torch.bfloat16)
        a = w12_gemm(xm, w, config=cfg, use_asm=True)
        b = w12_gemm(xm, w, config=cfg, use_asm=False)
        assert torch.equal(bits16(a), bits16(b)), cfg


@pytest.mark.gpu
def test_gpu_cuda_graph_and_compile():
    w = encode(gpu_weight(4096, 4096, seed=3))
    row_ptr = escape_row_ptr(w)
    x = torch.randn(1, 4096, device="cuda").to(torch.bfloat16)
    eager = w12_gemm(x, w, esc_row_ptr=row_ptr)  # split-K at M = 1: counters and partials
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = w12_gemm(x, w, esc_row_ptr=row_ptr)
    for _ in range(3):
        graph.replay()
        assert torch.equal(bits16(out), bits16(eager))
    compiled = torch.compile(lambda a: w12_gemm(a, w, esc_row_ptr=row_ptr), fullgraph=True)
    assert torch.equal(bits16(compiled(x)), bits16(eager))
