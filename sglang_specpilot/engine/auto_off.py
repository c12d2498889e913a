"""Automatic off: per round, speculate only where the cost model predicts a gain over AR.

S = tau / c (``suites.e2e_results.cost_model``, the model ``controller.costmodel`` reuses), with tau the
mean of the batch's rows' recent tokens per speculative round (``acceptance.Acceptance``) and
c = T_spec(b) / T_AR(b) from the measured step curve at the round's batch bucket b. Where S <= 1 the
batch runs an AR round instead: both kinds are exact rounds, so the output is the same either way and
only the time changes.

The decision is for the whole batch. Switching single rows off would not save their share of a round:
rows are padded to a static bucket and a speculative round verifies every row's block anyway; and
running two rounds (AR for some rows, speculative for the others) reads the weights twice, the cost the
co-location measurement showed (0.625x at batch 8). A row's share of the verify pass is cut where the
shared node budget gives it no nodes instead.

Probes: once off, tau would never be measured again (AR rounds say nothing about the drafter), so every
``probe_every``-th round of an off stretch is a speculative probe that refreshes each row's estimate.
A row with no estimate yet (just admitted) makes the batch speculate, which measures it.
"""

from __future__ import annotations

from ..suites.e2e_results import cost_model
from .step_curve import StepCurve

SPEC, AR, PROBE, UNMEASURED = "spec", "ar", "probe", "unmeasured"


class AutoOff:
    def __init__(self, curve: StepCurve | None, probe_every: int):
        self.curve, self.probe_every = curve, probe_every
        self._off = 0  # rounds since the batch last chose to speculate
        self.last_speedup: float | None = None  # the latest predicted S (a /metrics gauge)

    def decide(self, taus: list[float | None], b: int, kind="spec") -> str:
        """SPEC, AR or PROBE for the next round of bucket ``b`` whose rows in use have ``taus``;
        UNMEASURED (speculate) when the curve lacks the kinds or a row has no estimate yet."""
        if self.curve is None or not (self.curve.has("ar") and self.curve.has(kind)):
            return UNMEASURED
        if not taus or any(t is None for t in taus):
            self._off = 0
            return UNMEASURED
        tau = sum(taus) / len(taus)
        s = cost_model(tau, self.curve.ms(kind, b), self.curve.ms("ar", b))["predicted_speedup"]
        self.last_speedup = s
        if s > 1.0:
            self._off = 0
            return SPEC
        self._off += 1
        return PROBE if self._off % self.probe_every == 0 else AR
