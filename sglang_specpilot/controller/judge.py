"""Judging one candidate against the current best: paired ABBA timing, the promotion gate, token forcing.

Timing runs whole greedy generations (``ignore_eos``, fixed length), one prompt per slot: both variants of a
block generate the same prompts, so the per-block ratio is a ratio of time per token, and a candidate that
raises tau and one that lowers the step cost are measured on the same footing.
"""

from __future__ import annotations

from ..harness.gates import promotion_gate
from ..harness.noise import noise_from_ratio
from ..harness.timing import paired_timing
from ..harness.token_forcing import compare_forcing, token_forcing


def _counted(fn, bar):
    def run():
        fn()
        if bar is not None:
            bar.update(1)

    return run


def time_variants(backend, deltas: dict[str, dict], prompts, blocks: int, bar=None):
    """``paired_timing`` of the named deltas over ``prompts`` on the backend's clock."""
    return _time_runners(backend, {name: backend.runner(d, prompts) for name, d in deltas.items()}, blocks, bar)


def _time_runners(backend, runners: dict, blocks: int, bar=None):
    variants = {name: _counted(fn, bar) for name, fn in runners.items()}
    if bar is not None:
        bar.reset(total=(blocks + 1) * 2 * len(variants))
    return paired_timing(variants, blocks=blocks, warmup=1, clock=backend.clock)


def timing_record(times, base: str, cand: str) -> dict:
    r = times.ratio(base, cand)
    return {
        "gain": r.gain,
        "gain_low": r.gain_low,
        "gain_high": r.gain_high,
        "blocks": r.blocks,
        "block_ratios": (times.block_times(base) / times.block_times(cand)).tolist(),
        "base_ms": (times.block_times(base) * 1e3).tolist(),
        "cand_ms": (times.block_times(cand) * 1e3).tolist(),
        "ratio": r.to_dict(),
    }


def measure_noise(backend, stock: dict, prompts, blocks: int, bar=None) -> float:
    """Stock against a second stock instance, with the same blocks and prompts as every comparison.

    The second instance is built apart (``backend.replica_runner``: its own engine, warm-up and captured
    graphs) where the backend can, because every candidate is timed on an engine of its own: the noise a
    gate subtracts must hold what differs between two builds of one configuration, not only the spread of
    one engine timed against itself. On the H100 (tune_h100.json) stock of the real SmolLM2 timed 1.5-2x
    apart in the tuning parts' separate builds, while one engine against itself measured 0.16% noise."""
    second = getattr(backend, "replica_runner", backend.runner)
    runners = {"stock_a": backend.runner(stock, prompts), "stock_b": second(dict(stock), prompts)}
    times = _time_runners(backend, runners, blocks, bar)
    return noise_from_ratio(times.ratio("stock_a", "stock_b"))


def forcing(backend, delta: dict, prompts):
    """Token forcing of ``delta``'s generations, scored by the stock target."""
    return token_forcing(backend.score_fn, backend.generate(delta, prompts))


def gate(timing: dict, noise: float, forcing_verdict: dict, min_gain: float) -> dict:
    """Both gates on a full-length timing record; the verdict carries every number and a feedback code."""
    from ..harness.stats import RatioCI

    promo = promotion_gate(RatioCI(**timing["ratio"]), noise, min_gain=min_gain)
    codes = []
    if not promo.promoted:
        codes.append("below_gate" if timing["gain"] > 0 else "slower")
    if not forcing_verdict["accepted"]:
        codes.append("forcing_rejected")
    return {
        "promoted": promo.promoted and forcing_verdict["accepted"],
        "promotion": promo.to_dict(),
        "forcing": forcing_verdict,
        "feedback": codes,
    }


def compare_to_stock(report, stock_report):
    return compare_forcing(report, stock_report)
