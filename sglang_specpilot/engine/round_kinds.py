"""The rounds an engine may run besides its own (``Engine.round``), by key, and the policy that picks
one per step.

    "ar"      the keep-up AR round (automatic off, ``keepup_round``)
    d (int)   the speculative round of draft depth d < the engine's depth (adaptive draft length); the
              engine's own round is the deepest, so the state, scratch slots and reserved positions it
              was sized for hold every kind

None of them exists with default options: the engine then runs its one round, as before.
"""

from __future__ import annotations

from dataclasses import replace

from ..config import EngineOptions, tree_candidates
from .acceptance import Acceptance
from .adaptive_depth import batch_depth
from .auto_off import AR, PROBE, AutoOff
from .keepup_round import KeepUpARRound
from .round import Round, RoundShape
from .step_curve import StepCurve


def depth_shape(shape: RoundShape, depth: int) -> RoundShape:
    """``shape`` drafted to ``depth``: a chain of that length, or a tree of that depth whose budget is
    cut to what its lattice holds."""
    if shape.chain:
        return RoundShape(depth, depth, 1)
    return replace(shape, depth=depth, budget=min(shape.budget, tree_candidates(depth, shape.top_k)))


def alternate_rounds(engine) -> dict:
    opts: EngineOptions = engine.options
    main: Round = engine.round
    kinds = {}
    if not main.shape.depth:  # no drafter: AR already
        return kinds
    if opts.auto_off:
        kinds["ar"] = KeepUpARRound(main)
    for d in opts.adaptive_depths:
        if d < main.shape.depth:
            kinds[d] = Round(main.target, main.draft, main.ngram, depth_shape(main.shape, d))
    return kinds


class SpecPolicy:
    """Per step: the round kind for the batch (None = the engine's own round), from the rows' recent
    acceptance. Decisions are made on the host between rounds from the tokens the loop already reads
    back; under the lookahead the round launched next is already in flight when round t is read, so a
    decision from round t's tokens applies to round t + 2."""

    def __init__(self, engine, curve: StepCurve | None):
        opts = engine.options
        self.main_depth = engine.round.shape.depth
        self.depths = tuple(sorted({d for d in opts.adaptive_depths if d < self.main_depth} | {self.main_depth}))
        self.adaptive = len(self.depths) > 1
        self.acc = Acceptance(opts.max_batch_size)
        self.auto_off = AutoOff(curve, opts.auto_off_probe_every) if opts.auto_off else None
        self.decisions: dict[str, int] = {}  # automatic off: spec / ar / probe / unmeasured
        self.depth_rounds: dict[int, int] = {}  # adaptive length: rounds run at each depth
        self.shared = opts.shared_budget is not None
        self.shared_rounds = 0  # rounds run under the shared node budget (``shared_budget``)
        self._depth: int | None = None

    @property
    def active(self) -> bool:
        return self.adaptive or self.auto_off is not None

    def choose(self, rows: list[int], b: int):
        depth = self.main_depth
        if self.adaptive:
            depth = batch_depth([(self.acc.tokens[r], self.acc.capped[r]) for r in rows], self.depths, self._depth)
        key = None if depth == self.main_depth else depth
        if self.auto_off is not None:
            kind = "spec" if key is None else key
            decision = self.auto_off.decide([self.acc.tokens[r] for r in rows], b, kind)
            self.decisions[decision] = self.decisions.get(decision, 0) + 1
            if decision == AR:
                return "ar"
            if decision == PROBE:  # a probe measures at full depth: what the drafter can do now
                depth, key = self.main_depth, None
        self._depth = depth
        self.depth_rounds[depth] = self.depth_rounds.get(depth, 0) + 1
        self.shared_rounds += self.shared
        return key

    def depth_of(self, key) -> int:
        return self.main_depth if key is None else (0 if key == "ar" else key)

    def observe(self, row: int, tokens: int, key) -> None:
        d = self.depth_of(key)
        if d:  # AR rounds say nothing about the drafter
            self.acc.observe(row, tokens, d)

    def forget(self, row: int) -> None:
        self.acc.forget(row)
