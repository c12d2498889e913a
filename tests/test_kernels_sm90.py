"""The Triton kernels compile for the H100/H200 (sm_90) on this CPU machine, ahead of time, and fit in its shared
memory: the interpreter runs what the GPU compiler may refuse. Two launches failed on the H200 that the
interpreter had passed (a3703ad: a defaulted string constexpr; fad3c20: the SwiGLU tiles past the shared
memory at 17-32 rows); both are caught here. Skipped where Triton's CUDA backend cannot compile (no ptxas)."""

from __future__ import annotations

import functools

import pytest

triton = pytest.importorskip("triton")

from sglang_specpilot.kernels import (  # noqa: E402
    embed_rope,
    gemv,
    lattice_step,
    rms_norm,
    skinny_gemm,
    tree_accept,
    tree_build,
)
from sglang_specpilot.kernels.launch import interpreted  # noqa: E402

P, F32, BF16 = "*i64", "*fp32", "*bf16"


def _compile(fn, signature: dict, constexprs: dict, num_warps: int = 4, num_stages: int = 3, divisible=()):
    """``fn`` compiled for sm_90; ``divisible`` names the integer arguments a launch finds divisible by 16
    (pointers always are: torch allocates them so), as the launcher's specialisation tells the compiler."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {**signature, **{name: "constexpr" for name in constexprs}}
    names = list(sig)
    attrs = {
        (names.index(a),): [["tt.divisibility", 16]]
        for a, t in signature.items()
        if t.startswith("*") or a in divisible
    }
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


@functools.cache
def _why_not() -> str | None:
    if interpreted(rms_norm._rms_norm_kernel):
        return "TRITON_INTERPRET=1: the kernels are interpreted functions here"
    try:
        _compile(rms_norm._rms_norm_kernel, _NORM_SIG, {"BLOCK": 64})
    except Exception as e:  # noqa: BLE001 - any toolchain failure means this machine cannot compile for CUDA
        return f"Triton cannot compile for sm_90 here: {type(e).__name__}: {str(e)[:200]}"
    return None


def _needs_compiler():
    if _why_not():
        pytest.skip(_why_not())


_NORM_SIG = {"x_ptr": BF16, "w_ptr": BF16, "y_ptr": BF16, "H": "i32", "stride_x": "i32", "eps": "fp32"}
_SELECT_SIG = {
    **{n: P for n in ("tokens_ptr", "parents_ptr", "exp_ptr", "seq_ptr", "cand_ptr", "x_ptr", "pos_ptr")},
    **{n: P for n in ("slots_ptr", "pexp_ptr")},
    "scores_ptr": F32, "vis_ptr": "*u8", "base_ptr": F32,
    **{n: "i32" for n in ("C", "E", "d", "first_exp", "n")},
}  # fmt: skip


@pytest.mark.parametrize(
    "name",
    ["rms_norm", "lattice_select", "lattice_children", "best_first_tree", "tree_masks", "tree_accept", "embed_rope"],
)
def test_round_kernels_compile_for_sm90(name):
    # At the tree round's shapes (budget 32, depth 6, top-k 8: 41 expansions, 328 candidates).
    _needs_compiler()
    fn, sig, const = {
        "rms_norm": (rms_norm._rms_norm_kernel, _NORM_SIG, {"BLOCK": 1024}),
        "embed_rope": (
            embed_rope._embed_rope_kernel,
            {"tok_ptr": P, "pos_ptr": P, "emb_ptr": BF16, "g_ptr": BF16, "rope_ptr": F32, "x_ptr": BF16, "cs_ptr": BF16,
             **{n: "i32" for n in ("N", "H", "H2", "D2", "stride_tb", "stride_tn", "stride_pb", "stride_pn")}},
            {"HAS_G": True, "BH": 1024, "BG": 2048, "BR": 128},
        ),
        "lattice_select": (lattice_step._select_kernel, _SELECT_SIG, {"K": 8, "NP": 64, "KP": 16, "EP": 64}),
        "lattice_children": (
            lattice_step._children_kernel,
            {"scores_ptr": F32, "logprobs_ptr": F32, "tokens_ptr": P, "base_ptr": F32, "lp_ptr": F32,
             "tok_ptr": P, "d2t_ptr": P, "C": "i32", "lo": "i32"},
            {"KK": 64, "K": 8, "P": 64, "HAS_D2T": True},
        ),
        "best_first_tree": (
            tree_build._best_first_kernel,
            {"scores_ptr": F32, "depths_ptr": P, "tokens_ptr": P, "lpar_ptr": P, "rank_ptr": "*i32", "tok_ptr": P,
             "par_ptr": P, "dep_ptr": P, "score_ptr": F32, "cand_ptr": P, "C": "i32", "E": "i32", "N": "i32"},
            {"K": 8, "BLOCK": tree_build.BLOCK},
        ),
        "tree_masks": (tree_build._masks_kernel, {"par_ptr": P, "anc_ptr": "*u8", "depth_ptr": P, "N": "i32"},
                       {"STEPS": 6, "RP": 64}),
        "tree_accept": (
            tree_accept._accept_kernel,
            {"par_ptr": P, "tok_ptr": P, "arg_ptr": P, "anc_ptr": "*u8", "last_ptr": P, "n_ptr": P, "mask_ptr": "*u8",
             "path_ptr": P, "pad_ptr": P, "bonus_ptr": P, "N": "i32", "D": "i32"},
            {"RP": 64, "DP": 16},
        ),
    }[name]  # fmt: skip
    assert "cubin" in _compile(fn, sig, const).asm


_SKINNY_SIG = {
    "x_ptr": BF16, "w_ptr": BF16, "b_ptr": BF16, "y_ptr": BF16, "part_ptr": F32, "counter_ptr": "*i32", "res_ptr": BF16,
    **{n: "i32" for n in ("M", "N", "K", "stride_xm", "stride_wn", "stride_ym", "stride_rm", "split_k")},
}  # fmt: skip


def _skinny(M: int, N: int, K: int, swiglu: bool, residual: bool, cfg=None):
    cfg = cfg or skinny_gemm.fit_stages(skinny_gemm.pick_config(M, N, K), M, swiglu)
    const = {"BLOCK_M": skinny_gemm.block_m(M), "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
             "EVEN_K": K % cfg.block_k == 0, "HAS_BIAS": False, "UPCAST": False, "HAS_RES": residual,
             "SWIGLU": swiglu, "USE_PDL": True}  # fmt: skip
    dims = [n for n, v in (("N", N), ("K", K), ("stride_xm", K), ("stride_wn", K), ("stride_ym", N), ("stride_rm", N))
            if v % 16 == 0]  # fmt: skip
    return _compile(skinny_gemm._skinny_kernel, _SKINNY_SIG, const, cfg.num_warps, cfg.num_stages, dims), cfg


@pytest.mark.parametrize("M", [7, 20, 33])
@pytest.mark.parametrize("proj", ["qkv", "o", "gate_up", "down"])
def test_skinny_gemm_default_configs_fit_the_h200(M, proj):
    # SmolLM2's verify layer (the shapes skinny_wins gives the kernel), with the epilogue each projection runs.
    _needs_compiler()
    N, K = {"qkv": (960, 576), "o": (576, 576), "gate_up": (1536, 576), "down": (576, 1536)}[proj]
    k, cfg = _skinny(M, N, K, swiglu=proj == "gate_up", residual=proj in ("o", "down"))
    assert k.metadata.shared <= skinny_gemm.SMEM_BYTES
    # fit_stages' model of the kernel's appetite: at most num_stages + 1 copies of a step's tiles.
    assert k.metadata.shared <= (cfg.num_stages + 1) * skinny_gemm.stage_bytes(cfg, M, proj == "gate_up")


def test_the_unfitted_swiglu_config_is_the_one_the_h200_refused():
    # pick_config's 5 stages with the SwiGLU launch's two W tiles at 20 rows: what failed at a3703ad.
    _needs_compiler()
    raw = skinny_gemm.pick_config(20, 1536, 576)
    assert raw.num_stages == 5
    k, _ = _skinny(20, 1536, 576, swiglu=True, residual=False, cfg=raw)
    assert k.metadata.shared == 245760 > skinny_gemm.SMEM_BYTES


_GEMV_SIG = {
    "x_ptr": BF16, "w_ptr": BF16, "b_ptr": BF16, "y_ptr": BF16, "res_ptr": BF16, "nw_ptr": BF16,
    **{n: "i32" for n in ("N", "K", "stride_xm", "stride_wn", "stride_ym")}, "eps": "fp32",
}  # fmt: skip


@pytest.mark.parametrize(
    "fusion,N,K",
    [
        ("norm", 960, 576),  # SmolLM2's qkv with the rms_norm prologue
        ("residual", 576, 576),  # its o projection with the residual epilogue
        ("silu_residual", 576, 1536),  # its down projection: silu_mul prologue, residual epilogue
        ("plain", 6144, 4096),  # the 8B's qkv
    ],
)
def test_decode_gemv_variants_compile_for_sm90(fusion, N, K):
    # The one-row GEMV's fused variants the decode layer runs, with PDL, at the default tile.
    _needs_compiler()
    cfg = gemv.pick_config(1)
    const = {"ROWS": 1, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "HAS_BIAS": False,
             "EVEN_K": K % cfg.block_k == 0, "NUM_STAGES": cfg.num_stages, "SILU": "silu" in fusion,
             "HAS_RES": "residual" in fusion, "NORM": fusion == "norm", "USE_PDL": True}  # fmt: skip
    k = _compile(gemv._gemv_kernel, _GEMV_SIG, const, cfg.num_warps, 1, ("N", "K", "stride_xm", "stride_wn"))
    assert "cubin" in k.asm and k.metadata.shared <= skinny_gemm.SMEM_BYTES


_ATT_SIG = {
    "q_ptr": BF16, "k_ptr": BF16, "v_ptr": BF16, "seq_len_ptr": "*i64", "anc_ptr": "*i1", "o_ptr": BF16,
    "part_o_ptr": F32, "part_lse_ptr": F32, "ticket_ptr": "*i32",
    **{n: "i32" for n in ("stride_qb", "stride_qn", "stride_qh", "stride_kb", "stride_ks", "stride_kh", "stride_vb",
                          "stride_vs", "stride_vh", "stride_ob", "stride_on", "stride_oh", "stride_ab", "stride_ai",
                          "stride_aj", "stride_seq", "num_kv_heads", "num_q", "num_win", "group", "num_row_tiles",
                          "num_splits", "min_split_blocks")},
    "qk_scale": "fp32",
}  # fmt: skip


@pytest.mark.parametrize(
    "name,rows,kv_heads,head_dim,block_s,stages",
    [
        ("8b_decode", 4, 8, 128, None, None),  # the table's entries as they are
        ("8b_tree", 256, 8, 128, None, None),
        ("smollm2_tree", 99, 3, 64, None, None),
        ("smollm2_tree_128", 99, 3, 64, 128, 3),  # the tree_d64 entry the H200 A/B tries
    ],
)
def test_tree_attention_configs_fit_the_h200(name, rows, kv_heads, head_dim, block_s, stages):
    from sglang_specpilot.kernels import tree_attention as ta

    _needs_compiler()
    cfg = ta.pick_config(1, rows, kv_heads, 4224, 2, 132, head_dim=head_dim)
    cfg = cfg._replace(block_s=block_s or cfg.block_s, num_stages=stages or cfg.num_stages)
    merge_splits = triton.next_power_of_2(cfg.num_splits)
    const = {"HEAD_DIM": head_dim, "BLOCK_R": cfg.block_r, "BLOCK_S": cfg.block_s, "MERGE_SPLITS": merge_splits,
             "MERGE_ROWS": 16, "DOT_PRECISION": "tf32", "UPCAST": False, "USE_PDL": True, "ONE_LOOP": False,
             "BALANCED": False}  # fmt: skip
    dims = ("stride_qb", "stride_qn", "stride_qh", "stride_kb", "stride_ks", "stride_vb", "stride_vs", "stride_ob")
    k = _compile(ta._tree_attention_kernel, _ATT_SIG, const, cfg.num_warps, cfg.num_stages, dims)
    assert "cubin" in k.asm and k.metadata.shared <= skinny_gemm.SMEM_BYTES, k.metadata.shared


_TMA_SIG = {
    "b_ptr": BF16, "y_ptr": BF16, "part_ptr": F32, "counter_ptr": "*i32",
    **{n: "i32" for n in ("M", "N", "K", "stride_ym", "split_k")},
}  # fmt: skip


@pytest.mark.parametrize("M", [4, 33, 64])
@pytest.mark.parametrize("proj", ["qkv", "gate_up", "down"])
def test_skinny_tma_default_configs_fit_and_take_wgmma(M, proj):
    # The TMA verify GEMM at its default launch shape on the 8B's projections: it compiles for sm_90, fits the
    # shared memory, and its products run on wgmma (Hopper's warpgroup MMA) fed by TMA loads.
    from sglang_specpilot.kernels import skinny_tma

    _needs_compiler()
    N, K = {"qkv": (6144, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}[proj]
    cfg = skinny_tma.pick_config(M, N, K)
    bm = skinny_gemm.block_m(M)
    sig = {"w_desc": f"tensordesc<bf16[{cfg.block_n}, {cfg.block_k}]>",
           "x_desc": f"tensordesc<bf16[{bm}, {cfg.block_k}]>", **_TMA_SIG}  # fmt: skip
    const = {"BLOCK_M": bm, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "HAS_BIAS": False, "UPCAST": False}
    k = _compile(skinny_tma._tma_kernel, sig, const, cfg.num_warps, cfg.num_stages, ("N", "K", "stride_ym"))
    assert k.metadata.shared <= skinny_gemm.SMEM_BYTES
    assert k.metadata.shared <= cfg.num_stages * skinny_tma.stage_bytes(cfg.block_n, cfg.block_k, M) + 1024
    ttgir = k.asm["ttgir"]
    assert "warp_group_dot" in ttgir and "tma" in ttgir.lower()
