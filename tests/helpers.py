"""Small synthetic models and a stand-in tokenizer for engine tests."""

from __future__ import annotations

import torch

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine
from sglang_specpilot.models.build import build_model
from sglang_specpilot.models.config import ModelConfig
from sglang_specpilot.models.presets import preset_config


class WordTokenizer:
    """Token i decodes to "w{i} "; enough for stop-string and streaming tests."""

    eos_token_ids: list[int] = []
    fingerprint = "words"

    def decode(self, ids):
        return "".join(f"w{i} " for i in ids)

    def encode(self, text):
        return [int(w[1:]) for w in text.split()]


# std 0.15 spreads the logits of these small random models, so greedy argmaxes are rarely near-ties.
def tiny_model(name: str = "tiny-llama", seed: int = 0, std: float = 0.15, dtype=torch.float32, **overrides):
    cfg = preset_config(name) if not overrides else ModelConfig(**{**preset_config(name).to_dict(), **overrides})
    return build_model(cfg, synthetic_seed=seed, synthetic_std=std, dtype=dtype, max_positions=1024)


def stand_in_folders(root, vocab: int, perturb: float = 0.0):
    """A tiny target (a safetensors folder with a synthetic tokenizer) at ``root / "target"`` and an
    EAGLE-3 drafter folder for it at ``root / "draft"``, as the stand-in suites load them; ``perturb``
    adds that much noise to the drafter's own weights (an untrained one drafts the same token every step)."""
    from sglang_specpilot.drafters.eagle3 import init_eagle3, save_eagle3
    from sglang_specpilot.models.safetensors_loader import save_safetensors_folder
    from sglang_specpilot.models.tokenizer import Tokenizer

    target = tiny_model("tiny-llama", vocab_size=vocab, rope_scaling=None)
    save_safetensors_folder(root / "target", target.cfg, target.hf_state_dict(), Tokenizer.synthetic(vocab))
    torch.manual_seed(0)
    draft = init_eagle3(target, d2t=torch.tensor([0, 2, 3, 5, 7, 8, 11]))
    if perturb:
        with torch.no_grad():
            for name, p in draft.named_parameters():
                if not name.startswith("embed."):
                    p.add_(torch.randn_like(p) * perturb)
    save_eagle3(draft, root / "draft")
    return root


def engine(target, draft=None, gamma: int = 4, max_batch: int = 8, max_seq: int = 256, device: str = "cpu") -> Engine:
    opts = EngineOptions(
        max_seq_len=max_seq,
        max_batch_size=max_batch,
        num_speculative_tokens=gamma,
        draft_layers=0,
        device=device,
        dtype="float32",
    )
    return Engine(target, WordTokenizer(), opts, draft)


def serve_one_at_a_time(eng, ps, params) -> list[list[int]]:
    """Each prompt's tokens when ``eng``'s batch admits them one at a time as rows free up, stepping between
    admissions, the order a server admits them in (beside running rows)."""
    batch = eng.batch
    reqs = [eng.new_request(p, sp) for p, sp in zip(ps, params, strict=True)]
    pending = list(reqs)
    while pending or batch.active:
        if pending and batch.free_rows:
            batch.admit([pending.pop(0)])
        batch.step()
    return [r.ids for r in reqs]


def prompts(lengths, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lengths]


def run_kernel_cases_in_interpreter(test_file: str, keyword: str) -> None:
    """Run ``test_file``'s kernel cases in a child pytest with TRITON_INTERPRET=1.

    The interpreter must be switched on before triton is first imported, and by the time a kernel test
    module runs, other modules have imported it; a child process starts clean. Fails if any case fails
    or is skipped there.
    """
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", keyword, test_file]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert "skipped" not in res.stdout.splitlines()[-1], res.stdout[-2000:]


def kernel_cases(test_file: str, module, kernel: str):
    """A Triton kernel test file's set-up: (interpreted, device, the ``kernel_case`` mark, and the test that
    runs the file's ``kernel_`` cases in a child interpreter process where this one cannot run them).

    ``module`` is the kernel module (its ``triton`` None where Triton is missing), ``kernel`` the name of one
    of its ``@triton.jit`` functions: whether that is an interpreted function says whether TRITON_INTERPRET=1
    was set before triton's import here."""
    import pytest

    from sglang_specpilot.kernels.launch import interpreted

    has_triton = getattr(module, "triton", None) is not None
    interp = has_triton and interpreted(getattr(module, kernel))
    here = interp or torch.cuda.is_available()
    case = pytest.mark.skipif(not here, reason="needs a GPU or TRITON_INTERPRET=1 before triton's import")

    def test_kernel_cases_in_interpreter():
        # The kernel cases, in a child process with TRITON_INTERPRET=1 (set before triton's import).
        if here or not has_triton:
            pytest.skip("the kernel cases run in this process")
        run_kernel_cases_in_interpreter(test_file, "kernel_ and not interpreter")

    return interp, "cuda" if torch.cuda.is_available() else "cpu", case, test_kernel_cases_in_interpreter


def gemm_inputs(M: int, N: int, K: int, bias: bool, seed: int = 0, device: str = "cpu"):
    """bf16 (x [M, K], weight [N, K] scaled by 1/sqrt(K), bias [N] or None) for the verify-rows GEMM tests."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(torch.bfloat16).to(device)
    w = (torch.randn(N, K, generator=g) / K**0.5).to(torch.bfloat16).to(device)
    b = torch.randn(N, generator=g).to(torch.bfloat16).to(device) if bias else None
    return x, w, b


def within_bf16_ulp(y, ref, ulps: int = 1) -> bool:
    """One bf16 rounding of an fp32 sum taken in another order: within ``ulps`` bf16 ulps of the reference."""
    return bool(((y.float() - ref.float()).abs() <= ref.float().abs().clamp_min(1e-3) * ulps * 2**-7).all())


def check_split_k(run, ref, counters) -> torch.Tensor:
    """A split-K launch ``run(counters)``: within one bf16 ulp of ``ref``, its counters left zero, and the same
    bits when run again (the partials are summed in split order). Returns its result."""
    y = run(counters)
    assert within_bf16_ulp(y, ref)
    assert int(counters.abs().sum()) == 0
    assert torch.equal(run(counters), y)
    return y


# ---------------------------------------------------------------------------------------------------------
# W12 kernels (test_w12_kernels.py, test_w12_mma.py)
# ---------------------------------------------------------------------------------------------------------


def bits16(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def assert_within(y, y_ref, tol, what=""):
    err = (y.float() - y_ref.float()).abs()
    bad = ~(err <= tol)
    if bad.any():
        m, n = (int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {y.numel()} outside the tolerance, max err/tol "
            f"{(err / tol).max().item():.3g}; first at [m={m}, n={n}]: {y[m, n].item()} vs "
            f"{y_ref[m, n].item()} (tol {tol[m, n].item():.3g})"
        )


def check_nonfinite_escapes(gemm, w_bf16: torch.Tensor, x: torch.Tensor) -> None:
    """Plant inf (row 4), -inf and inf (row 9: inf - inf = NaN) and NaN (row 20) in ``w_bf16`` [N >= 21, K >= 14]
    and check ``gemm(x, w12)``: the non-finite outputs are exactly the reference's and only in those rows (no
    0 * inf leaks into another row), every other output within ``gemm_tolerance``."""
    from w12.codec import encode
    from w12.kernels import gemm_tolerance, w12_gemm_ref

    w_bf16[4, 10] = float("inf")
    w_bf16[9, 11], w_bf16[9, 12] = float("-inf"), float("inf")
    w_bf16[20, 13] = float("nan")
    w = encode(w_bf16)
    y = gemm(x, w)
    ref = w12_gemm_ref(x, w, out_dtype=torch.float32)
    finite = ref.isfinite()
    assert set((~finite).any(0).nonzero().flatten().tolist()) == {4, 9, 20}
    assert torch.equal(y.float()[~finite].nan_to_num(nan=7.0), ref[~finite].nan_to_num(nan=7.0))
    zero = torch.zeros_like(ref)
    tol = torch.where(finite, gemm_tolerance(x, w, ref), zero)
    assert_within(torch.where(finite, y.float(), zero), torch.where(finite, ref, zero), tol, "finite rows")


def assert_equal_or_near_tie(ar_engine: Engine, prompts, ar, got) -> None:
    """Greedy lossless in low precision: each output equals AR's, or token forcing explains it. The first
    divergence must sit where AR's own top-2 logits are within ``DEFAULT_MARGIN_EPS`` (a near-tie that a
    reordered reduction can tip), and no position of the output may trail AR's argmax by more than that."""
    from sglang_specpilot.harness.token_forcing import DEFAULT_MARGIN_EPS, token_forcing

    for p, a, s in zip(prompts, ar, got, strict=True):
        assert len(a) == len(s), f"lengths differ: AR {len(a)}, system {len(s)}"
        if a == s:
            continue
        t = next(i for i, (x, y) in enumerate(zip(a, s, strict=True)) if x != y)
        top2 = ar_engine.teacher_force_logits(p, a)[t].float().topk(2).values
        margin = float(top2[0] - top2[1])
        assert margin <= DEFAULT_MARGIN_EPS, f"divergence at {t} where AR's margin is {margin:.3f}: not a near-tie"
        report = token_forcing(ar_engine.teacher_force_logits, [(p, s)])
        assert report.large_margin == 0, f"large-margin mismatches: {report.details}"


def captured_case():
    """The captured mechanism tests' case (CUDA): a tiny target, its two-layer drafter, six prompts, the engine
    options they share, and each prompt's greedy tokens alone under AR (20 new tokens)."""
    from sglang_specpilot.engine import SamplingParams

    target = tiny_model("tiny-llama").cuda()
    ps = prompts([7, 30, 3, 61, 12, 45], target.cfg.vocab_size, seed=3)
    kw = dict(max_seq_len=256, max_batch_size=8, graph_batch_sizes=(1, 2, 4, 8), device="cuda", dtype="float32")
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    ar_eng = Engine(target, WordTokenizer(), EngineOptions(**kw, compile=False))
    alone = [ar_eng.generate([p], params)[0].token_ids for p in ps]
    return target, target.truncated(2), ps, kw, alone


def tiny_drafter(kind: str, target):
    """A drafter for ``target``: "none", "layer" (its first layer) or "eagle3" (a seeded random EAGLE-3)."""
    if kind == "eagle3":
        from sglang_specpilot.drafters.eagle3 import init_eagle3

        torch.manual_seed(0)
        return init_eagle3(target)
    return None if kind == "none" else target.truncated(1)


def cuda_tiny_engine(kind: str, max_seq_len: int) -> Engine:
    """The packed prefill's GPU tests' engine: a tiny fp32 target on CUDA with the ``kind`` drafter (a small
    tree with one), 8 rows, the graph bucket 8 (which captures packed prefills), warmed up."""
    target = tiny_model("tiny-llama", **({"vocab_size": 12} if kind == "eagle3" else {})).cuda()
    shape = {} if kind == "none" else {"tree_budget": 6, "tree_depth": 3, "tree_top_k": 2}
    opts = EngineOptions(
        max_seq_len=max_seq_len, max_batch_size=8, graph_batch_sizes=(8,), device="cuda", dtype="float32",
        compile=False, **shape,
    )  # fmt: skip
    drafter = tiny_drafter(kind, target)
    eng = Engine(target, WordTokenizer(), opts, drafter.cuda() if drafter is not None else None)
    eng.warmup()
    return eng
