"""The step profile: one round kind's time split by kernel category, against floors where they exist.

Categories (the issue's): GEMM, attention, norms and element-wise, sampling and accept, and host and launch
gaps (time in no operation). On CUDA the split is by CUDA kernel (CUPTI) and every category gets its floor
from the weight and K/V bytes at the peaks ``roofline.measure_peaks`` measures in the same run. On the CPU
the split is by the self time of aten operations on the wall clock, and there are no floors: a CPU's peaks
say nothing about the H200, so ``floor_ms`` is None and the ceiling's kernel factor is reported unavailable.
"""

from __future__ import annotations

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

CATEGORIES = ("gemm", "attention", "norm_elementwise", "sampling_accept", "other_ops", "host_launch")

# Substrings of aten op / CUDA kernel names, checked in this order (the first match wins).
_RULES = (
    ("attention", ("attention", "sdpa", "softmax", "flash", "baddbmm", "fmha")),
    ("gemm", ("::mm", "addmm", "bmm", "matmul", "linear", "gemm", "gemv", "cutlass", "sm90_xmma", "w12")),
    ("sampling_accept", ("argmax", "topk", "sort", "gather", "scatter", "cumsum", "cumprod", "multinomial", "::eq",
                         "::max", "where", "::any", "::all", "index_put", "masked")),
    ("norm_elementwise", ("norm", "rsqrt", "::mul", "::add", "::sub", "::div", "::pow", "::mean", "silu", "::neg",
                          "::cat", "::exp", "embedding", "elementwise", "vectorized", "reduce", "::copy_", "::to",
                          "rotary", "::cos", "::sin", "::index")),
)  # fmt: skip


def categorize(name: str) -> str:
    low = name.lower()
    for cat, keys in _RULES:
        if any(k in low for k in keys):
            return cat
    return "other_ops"


class _OpClock(TorchDispatchMode):
    """Wall time of every aten op dispatched, by category. Ops an op runs internally are not dispatched
    again (the mode is off inside ``func``), so nothing is counted twice. Chosen over torch.profiler on the
    CPU: its start-up took 11-13 s per profile on the 2-core developer machine, this mode milliseconds."""

    def __init__(self):
        super().__init__()
        self.split = dict.fromkeys(CATEGORIES, 0.0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.split[categorize("aten::" + func.__name__.split(".")[0])] += time.perf_counter() - t0
        return out


def _cpu_split(fn) -> tuple[float, dict[str, float]]:
    """Wall seconds of ``fn()`` and the seconds of its aten ops by category."""
    clock = _OpClock()
    with clock:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    return wall, clock.split


def measure(engine, prompt_ids: list[int], new_tokens: int, *, ar_ms: float | None, tau_best: float | None) -> dict:
    """Profile one greedy generation of ``prompt_ids`` on ``engine``; per-round milliseconds by category.

    ``ar_ms``: the AR step time of the same target (None when ``engine`` is the AR engine: its own step).
    ``tau_best``: the best replayed tau (``tau_replay``), None = this engine's own tau (no tree headroom known).
    """
    from ..engine import SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    engine.generate([prompt_ids], params)  # first use outside the profile (allocator, lazy init)
    box = {}
    if engine.device.type == "cuda":
        return _cuda_measure(engine, prompt_ids, params, ar_ms, tau_best)
    wall, split = _cpu_split(lambda: box.setdefault("r", engine.generate([prompt_ids], params)[0]))
    res = box["r"]
    rounds = max(res.rounds, 1)
    per_round = {k: v * 1e3 / rounds for k, v in split.items()}
    step_ms = wall * 1e3 / rounds
    per_round["host_launch"] = max(step_ms - sum(per_round.values()), 0.0)
    return _finish(
        engine, res, step_ms, per_round, None, ar_ms, tau_best, "cpu wall clock (aten ops, dispatch-mode timer)"
    )


def _finish(engine, res, step_ms, per_round, floors, ar_ms, tau_best, source) -> dict:
    tau = float(res.mean_accepted) or 1.0
    return {
        "round_kind": _kind(engine),
        "source": source,
        "step_ms": step_ms,
        "ar_ms": step_ms if ar_ms is None else ar_ms,
        "categories_ms": per_round,
        "host_ms": per_round["host_launch"],
        "floors_ms": floors,
        "floor_ms": sum(floors.values()) if floors else None,
        "floors_note": None
        if floors
        else "no floors: byte/FLOP floors need a GPU profile (CUDA kernels at "
        "measured peaks); this run has wall-time categories only",
        "tau": tau,
        "tau_best": max(tau_best or tau, tau),
        "rounds": res.rounds,
        "tokens": len(res.token_ids),
    }


def _kind(engine) -> str:
    o = engine.options
    if not o.speculative:
        return "ar"
    return "tree" if o.tree else "chain"


def _cuda_measure(engine, prompt_ids, params, ar_ms, tau_best) -> dict:
    # GPU path: CUDA kernels by category; floors from the measured peaks. Weight bytes are every GEMM's
    # floor (decode at small batch is weight-read bound); attention's floor is the K/V bytes of the context;
    # the small categories' floors are taken as 0 (their bytes are negligible next to the weights).
    from torch.profiler import ProfilerActivity, profile

    from ..harness.roofline import measure_peaks

    peaks = measure_peaks("cuda")
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = engine.generate([prompt_ids], params)[0]
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    rounds = max(res.rounds, 1)
    split = dict.fromkeys(CATEGORIES, 0.0)
    for ev in prof.events():
        if ev.device_type.name == "CUDA" and ev.device_time > 0:
            split[categorize(ev.name)] += ev.device_time * 1e-3 / rounds
    step_ms = wall * 1e3 / rounds
    split["host_launch"] = max(step_ms - sum(split.values()), 0.0)
    models = [m for m in (engine.target, engine.draft) if m is not None]
    weight_bytes = sum(p.numel() * p.element_size() for m in models for p in m.parameters())
    cfg = engine.target.cfg
    ctx = len(prompt_ids) + len(res.token_ids)
    kv_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * ctx * 2
    floors = {
        "gemm": weight_bytes / peaks.bytes_per_s * 1e3,
        "attention": kv_bytes / peaks.bytes_per_s * 1e3,
        "norm_elementwise": 0.0,
        "sampling_accept": 0.0,
        "other_ops": 0.0,
    }
    out = _finish(engine, res, step_ms, split, floors, ar_ms, tau_best, "cuda kernels (CUPTI)")
    out["peaks"] = peaks.to_dict()
    return out
