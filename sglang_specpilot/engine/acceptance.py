"""Each row's recent acceptance: an exponential moving average of the tokens its speculative rounds
emitted (accepted drafts + the bonus), the tau the automatic switch and the adaptive draft length read.

Only speculative rounds update it (an AR round emits one token whatever the drafter would have done),
so a row that runs AR keeps the estimate its last speculative round left; probes re-measure it. A row
with no speculative round yet has no estimate (None): the policies speculate to measure it.
"""

from __future__ import annotations

ALPHA = 0.3  # weight of the newest round: about the last 3 rounds dominate, so a request that turns
# hard (or easy) moves the estimate within a few rounds, while one unlucky round does not flip it.


class Acceptance:
    def __init__(self, rows: int, alpha: float = ALPHA):
        self.alpha = alpha
        self.tokens: list[float | None] = [None] * rows  # EMA of tokens per speculative round
        self.capped: list[bool] = [False] * rows  # the last round accepted every drafted token

    def observe(self, row: int, tokens: int, depth: int) -> None:
        old = self.tokens[row]
        self.tokens[row] = float(tokens) if old is None else old + self.alpha * (tokens - old)
        self.capped[row] = tokens >= depth + 1

    def forget(self, row: int) -> None:
        self.tokens[row] = None
        self.capped[row] = False
