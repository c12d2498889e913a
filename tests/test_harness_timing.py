import json

import numpy as np
import pytest

from sglang_specpilot.harness.noise import noise_from_ratio, stock_vs_stock_noise
from sglang_specpilot.harness.stats import RatioCI
from sglang_specpilot.harness.synthetic import SimulatedClock
from sglang_specpilot.harness.timing import (
    PairedTimes,
    abba_order,
    anchor_candidate_control_order,
    paired_timing,
)


def test_orders_are_palindromes():
    assert abba_order(2) == [0, 1, 1, 0]
    assert abba_order(3) == [0, 1, 2, 2, 1, 0]
    assert anchor_candidate_control_order() == [0, 1, 2, 1, 0]


def test_block_runs_variants_in_the_given_order():
    log = []
    variants = {n: (lambda n=n: log.append(n)) for n in ("anchor", "cand", "ctrl")}
    times = paired_timing(variants, order=anchor_candidate_control_order(), blocks=2, warmup=0)
    assert log == ["anchor", "cand", "ctrl", "cand", "anchor"] * 2
    assert times.samples["anchor"].shape == (2, 2) and times.samples["ctrl"].shape == (2, 1)
    log.clear()
    paired_timing(variants, order=["anchor", "ctrl", "cand", "ctrl", "anchor"], blocks=1, warmup=0)
    assert log == ["anchor", "ctrl", "cand", "ctrl", "anchor"]


@pytest.mark.parametrize("order", [[0, 1, 0, 1], [0, 0], ["a", "b", "c", "b"]])
def test_bad_orders_are_refused(order):
    with pytest.raises(ValueError):
        paired_timing({"a": lambda: None, "b": lambda: None}, order=order, blocks=1)


def test_weight_copies_rotate_across_warmup_and_samples():
    used = []
    copies = [lambda i=i: used.append(i) for i in range(3)]
    paired_timing({"a": copies, "b": lambda: None}, blocks=2, warmup=1, inner=2)
    # warmup: one round (3 calls); then 2 blocks x 2 slots x 2 inner calls = 8 calls, still cycling.
    assert used == [0, 1, 2] + [0, 1, 2, 0, 1, 2, 0, 1]


def test_abba_cancels_linear_drift():
    # No jitter, no outliers, a strong trend (+50% per simulated second): the per-block ratio stays at
    # the true 1.05 to within 0.1%, while the two variants' raw medians are skewed by the trend.
    clock = SimulatedClock(0, jitter_sigma=0.0, outlier_rate=0.0, drift_per_s=0.5, wobble=0.0)
    times = paired_timing({"a": clock.work(1.05e-3), "b": clock.work(1e-3)}, blocks=40, clock=clock)
    ci = times.ratio("a", "b")
    assert ci.ratio == pytest.approx(1.05, rel=1e-3)
    assert times.median("a") > 1.05e-3 * 1.01  # drift is really there


def test_noise_of_stock_against_itself_is_small_and_covers_one():
    clock = SimulatedClock(1)
    noise = stock_vs_stock_noise(clock.work(1e-3), blocks=60, clock=clock)
    assert 0 < noise < 0.015
    assert noise_from_ratio(RatioCI(1.0, 0.99, 1.02, 1.0, 0.01, 30, 0.95)) == pytest.approx(0.02)
    assert noise_from_ratio(RatioCI(1.0, 0.97, 1.02, 1.0, 0.01, 30, 0.95)) == pytest.approx(0.03)


def test_wall_clock_timing_on_cpu_is_positive_and_json_able():
    import torch

    a = torch.randn(64, 64)
    times = paired_timing({"mm": lambda: a @ a, "add": lambda: a + a}, blocks=3, warmup=1, inner=2)
    assert times.device == "cpu" and times.inner == 2
    assert all(np.all(times.samples[n] > 0) for n in times.names)
    doc = json.loads(times.to_json())
    assert doc["names"] == ["mm", "add"] and len(doc["samples"]["mm"]) == 3
    assert times.rows()[0]["variant"] == "mm"


def test_from_block_times_round_trips():
    times = PairedTimes.from_block_times({"a": [2.0, 2.2], "b": [1.0, 1.1]})
    assert times.blocks == 2
    np.testing.assert_allclose(times.block_times("a"), [2.0, 2.2])
    assert times.ratio("a", "b").ratio == pytest.approx(2.0)
