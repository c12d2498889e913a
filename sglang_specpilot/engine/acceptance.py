"""Each row's recent acceptance: an exponential moving average of the tokens its speculative rounds
emitted (accepted drafts + the bonus), the tau the automatic switch and the adaptive draft length read.

Only speculative rounds update it (an AR round emits one token whatever the drafter would have done),
so a row that runs AR keeps the estimate its last speculative round left; probes re-measure it. A row
with no speculative round yet has no estimate (None): the policies speculate to measure it.
"""

from __future__ import annotations

ALPHA = 0.3  # weight of the newest round: about the last 3 rounds dominate, so a request that turns
# hard (or easy) moves the estimate within a few rounds, while one unlucky round does not flip it.
ALPHA_OFF = 0.125  # the slower EMA automatic off decides on. A false "off" runs AR until the next probe
# (``probe_every``, 16 rounds by default), so the decision should predict the mean tau over the next ~16
# rounds: an EMA of weight 2 / (16 + 1). On the H200 (lifted 8B, one client, 2bcb6d1) the fast EMA
# switched off on transient dips: 65 of 385 rounds ran AR (4.22 ms, 1 token), and with adaptive depth the
# batch served 432 tok/s against plain trees' 468 (3.24 tokens a round in 6.56 ms, never off).


class Acceptance:
    def __init__(self, rows: int, alpha: float = ALPHA, alpha_off: float = ALPHA_OFF):
        self.alpha, self.alpha_off = alpha, alpha_off
        self.tokens: list[float | None] = [None] * rows  # EMA of tokens per speculative round
        self.slow: list[float | None] = [None] * rows  # the same at ``alpha_off``: automatic off's
        self.capped: list[bool] = [False] * rows  # the last round accepted every drafted token

    def observe(self, row: int, tokens: int, depth: int) -> None:
        old = self.tokens[row]
        self.tokens[row] = float(tokens) if old is None else old + self.alpha * (tokens - old)
        old = self.slow[row]
        self.slow[row] = float(tokens) if old is None else old + self.alpha_off * (tokens - old)
        self.capped[row] = tokens >= depth + 1

    def off_tau(self, row: int) -> float | None:
        """The tau automatic off decides on: the larger of the slow and the fast EMA. Switching off needs
        the slow one to lose (a dip of a few rounds does not); switching back on needs only the fast one to
        win, so a probe that finds the drafter recovered turns speculation on at once, where the slow EMA
        alone would take several probes at doubling gaps. A wrong "on" lasts until the next decision (each
        round decides again); a wrong "off" lasts until the next probe."""
        fast, slow = self.tokens[row], self.slow[row]
        return None if fast is None else max(fast, slow)

    def forget(self, row: int) -> None:
        self.tokens[row] = self.slow[row] = None
        self.capped[row] = False
