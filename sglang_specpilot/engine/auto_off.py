"""Automatic off: per round, speculate only where the cost model predicts a gain over AR.

S = tau / c (``suites.e2e_results.cost_model``, the model ``controller.costmodel`` reuses), with tau the
mean of the batch's rows' recent tokens per speculative round (``acceptance.Acceptance``) and
c = T_spec(b) / T_AR(b) from the measured step curve at the round's batch bucket b. Where S falls short of 1
by more than the switch margin (``estimates.switch_margin``: 15% at one row, less over more rows) the batch
runs an AR round instead: both kinds are exact rounds, so the output is the same either way and only the
time changes.

The decision is for the whole batch. Switching single rows off would not save their share of a round:
rows are padded to a static bucket and a speculative round verifies every row's block anyway; and
running two rounds (AR for some rows, speculative for the others) reads the weights twice, the cost the
co-location measurement showed (0.625x at batch 8). A row's share of the verify pass is cut where the
shared node budget gives it no nodes instead.

Probes: once off, tau would never be measured again (AR rounds say nothing about the drafter), so an
off stretch is interrupted by speculative probes that refresh each row's estimate: the first after
``probe_every`` rounds, then at gaps that double, up to ``max_backoff`` times ``probe_every``. A probe
that finds speculation still losing is evidence that the batch stays where it is, and each costs a full
speculative round: on the H200 (lifted 8B, 16 clients) automatic off probed 7 times in 125 rounds, each a
16.5 ms tree round against the 5.0 ms AR step, about a tenth of the stretch's time. With doubling, the
same stretch probes 3 times. The rows with an estimate decide; where fewer than half have one (rows just
admitted), the batch speculates, which measures them, and the gaps start over.
"""

from __future__ import annotations

from ..suites.e2e_results import cost_model
from .estimates import known_mean, switch_margin
from .step_curve import StepCurve

SPEC, AR, PROBE, UNMEASURED = "spec", "ar", "probe", "unmeasured"
MAX_BACKOFF = 8  # probe gaps double up to 8 x probe_every (128 rounds at the default 16)


class AutoOff:
    def __init__(self, curve: StepCurve | None, probe_every: int, max_backoff: int = MAX_BACKOFF):
        self.curve, self.probe_every, self.max_backoff = curve, probe_every, max_backoff
        self.last_speedup: float | None = None  # the latest predicted S (a /metrics gauge)
        self._restart()

    def _restart(self) -> None:
        self._off = 0  # rounds since the batch last chose to speculate
        self._gap = self.probe_every  # the gap before the next probe after this one
        self._next = self.probe_every  # the off round that probes next

    def decide(self, taus: list[float | None], b: int, kind="spec", alts=()) -> str:
        """SPEC, AR or PROBE for the next round of bucket ``b`` whose rows in use have ``taus`` at ``kind``;
        UNMEASURED (speculate) when the curve lacks the kinds or too few rows have an estimate yet.
        ``alts``: more (taus, kind) candidates; the batch speculates where any of them predicts a gain. The
        policy passes its tree with the slow-EMA taus (``Acceptance.off_tau``) beside a chain or a narrowed
        tree chosen on fast estimates, so switching off always needs the slow evidence."""
        if self.curve is None or not (self.curve.has("ar") and self.curve.has(kind)):
            return UNMEASURED
        tau = known_mean(taus)
        if tau is None:  # too few rows measured yet (``estimates.KNOWN_SHARE``): speculate, which measures them
            self._restart()
            return UNMEASURED
        s = self._speedup(tau, kind, b)
        for alt_taus, alt_kind in alts:
            alt_tau = known_mean(alt_taus)
            if alt_tau is not None and self.curve.has(alt_kind):
                s = max(s, self._speedup(alt_tau, alt_kind, b))
        self.last_speedup = s
        # AR is a switch away from the configured kind like a shallower depth or a chain, so it must clear
        # the same margin (``estimates.switch_margin`` over the rows measured): at one client on the H100
        # (2ab09a6) one request of eight ran 110 of its ~128 tokens as AR (3 probes at doubling gaps) and
        # served 1.00x AR, where stock's chain served it at 1.25x in the same run.
        if s > 1.0 - switch_margin(sum(t is not None for t in taus)):
            self._restart()
            return SPEC
        self._off += 1
        if self._off < self._next:
            return AR
        self._gap = min(2 * self._gap, self.max_backoff * self.probe_every)
        self._next = self._off + self._gap
        return PROBE

    def _speedup(self, tau: float, kind, b: int) -> float:
        return cost_model(tau, self.curve.ms(kind, b), self.curve.ms("ar", b))["predicted_speedup"]
