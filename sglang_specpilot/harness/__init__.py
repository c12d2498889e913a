"""Measurement harness: paired timing, gates, token forcing, benchmark runner and reports.

Every "faster" claim comes from ``paired_timing`` (interleaved palindromic blocks in one process), is
judged by a gate against the stock-vs-stock noise floor, and is published through ``run_suite`` as a
results file that ``report`` turns into the README's tables. ``token_forcing`` checks that a faster
system still produces stock's tokens.
"""

from .bench import main as bench_main
from .bench import register_suite, run_suite
from .gates import KernelGainVerdict, PromotionVerdict, kernel_gain_gate, promotion_gate
from .graphs import graph_replay
from .leave_one_out import AcceptanceVerdict, leave_one_out
from .noise import noise_from_ratio, stock_vs_stock_noise
from .roofline import Floor, Peaks, attention_floor, decode_step_floor, gemm_floor, measure_peaks
from .stats import RatioCI, log_ratio_ci, rate_difference_interval, wilson_interval
from .synthetic import SimulatedClock
from .timing import PairedTimes, abba_order, anchor_candidate_control_order, paired_timing
from .token_forcing import ForcingReport, ForcingVerdict, Mismatch, compare_forcing, token_forcing

__all__ = [
    "AcceptanceVerdict",
    "Floor",
    "ForcingReport",
    "ForcingVerdict",
    "KernelGainVerdict",
    "Mismatch",
    "PairedTimes",
    "Peaks",
    "PromotionVerdict",
    "RatioCI",
    "SimulatedClock",
    "abba_order",
    "anchor_candidate_control_order",
    "attention_floor",
    "bench_main",
    "compare_forcing",
    "decode_step_floor",
    "gemm_floor",
    "graph_replay",
    "kernel_gain_gate",
    "leave_one_out",
    "log_ratio_ci",
    "measure_peaks",
    "noise_from_ratio",
    "paired_timing",
    "promotion_gate",
    "rate_difference_interval",
    "register_suite",
    "run_suite",
    "stock_vs_stock_noise",
    "token_forcing",
    "wilson_interval",
]
