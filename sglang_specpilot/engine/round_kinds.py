"""The rounds an engine may run besides its own (``Engine.round``), by key, and the policy that picks
one per step.

    "ar"      the keep-up AR round (automatic off, ``keepup_round``)
    d (int)   the speculative round of draft depth d < the engine's depth (adaptive draft length); the
              engine's own round is the deepest, so the state, scratch slots and reserved positions it
              was sized for hold every kind
    (d, w)    the tree round of depth d with a verify block of w < its budget nodes (the shared node
              budget's width at wide batches: ``width_for``)
    "chainD"  a greedy chain of depth D a tree batch may run instead of its tree (``chain_kinds``)

None of them exists with default options: the engine then runs its one round, as before.

Why narrower rounds. The shared node budget chooses which nodes a batch verifies, but a captured round's
verify block keeps its static width, so padding costs what nodes cost: on the H200 (lifted 8B, 16
clients, 1ff0900) the server's N 32 tree round took 17.3 ms against AR's 5.2, automatic off ran most
rounds as AR, and the server served 0.86x AR. The e2e sweep at the same batch predicted N 8 (D 3) best
(S 1.52; N 32: 0.82) and measured it at 1.07x AR. So with a shared budget the round at bucket b verifies
``width_for(N, budget, b)`` nodes per row: the widest of N, N/2, N/4, ... (at least ``MIN_WIDTH``) whose
b rows fit the budget. Each (depth, width) is a round kind with its own graphs, captured at warm-up only
at the buckets that use it.
"""

from __future__ import annotations

from dataclasses import replace

from ..config import EngineOptions, tree_candidates
from .acceptance import Acceptance
from .adaptive_depth import DepthEstimates, batch_depth, best_depth, next_depth
from .adaptive_width import WidthEstimates, best_width
from .auto_off import AR, PROBE, AutoOff
from .chain_kinds import ChainEstimates, chain_depth, chain_key
from .estimates import known_mean, most_per_ms, switch_margin
from .keepup_round import KeepUpARRound
from .round import Round, RoundShape
from .step_curve import StepCurve


class Streak:
    """Rounds in a row a choice left the configured tree (a shallower depth, a narrower width, a chain): a
    left-out tree refreshes no estimate of its own, so after ``every`` of them it runs once (a probe)."""

    def __init__(self, every: int):
        self.every, self.n = every, 0

    def due(self) -> bool:
        return self.n >= self.every

    def note(self, away: bool) -> None:
        self.n = self.n + 1 if away else 0


def depth_shape(shape: RoundShape, depth: int) -> RoundShape:
    """``shape`` drafted to ``depth``: a chain of that length, or a tree of that depth whose budget is
    cut to what its lattice holds."""
    if shape.chain:
        return RoundShape(depth, depth, 1)
    return replace(shape, depth=depth, budget=min(shape.budget, tree_candidates(depth, shape.top_k)))


# The narrowest verify block a shared budget cuts a row's tree to. On the H200 (lifted 8B, 16 rows) N 4
# scored S 1.41 against N 8's 1.52 in the e2e sweep: below that a tree is a short chain with a sibling.
MIN_WIDTH = 4


def widths_below(budget: int) -> list[int]:
    """The widths a shared budget can cut ``budget`` to: budget / 2, budget / 4, ..., MIN_WIDTH last."""
    out, w = [], budget
    while w > MIN_WIDTH:
        w = max(MIN_WIDTH, w // 2)
        out.append(w)
    return out


def width_for(budget: int, shared: int | None, b: int) -> int:
    """Verify nodes per row of a tree round of ``budget`` nodes at bucket ``b`` under the shared budget
    ``shared``: the widest of budget and ``widths_below(budget)`` whose ``b`` rows fit ``shared`` (the
    narrowest where none does). Without a shared budget: ``budget``."""
    if shared is None:
        return budget
    ladder = [budget, *widths_below(budget)]
    return next((w for w in ladder if b * w <= shared), ladder[-1])


def width_shape(shape: RoundShape, w: int, clamp_top_k: bool = True) -> RoundShape:
    """``shape`` verifying ``w`` nodes: a tree of w nodes reaches at most depth w, and expands at most w
    children a node. The best w nodes by path score form a prefix-closed tree, so each of them is among
    its parent's w best children and among the w best of its depth: expanding top_k > w children per
    depth drafts only nodes the tree cannot keep (the same tree up to ties), at top_k / w times the
    drafter's rows per depth: at bucket 32 under a 128-node budget (width 4, top-k 8), 256 rows a depth
    where 128 hold the same tree. On the H200 (lifted 8B, 2bcb6d1) that round, (6, 4), took 8.4 ms against
    6.7 ms for stock's chain of 3. A prompt-lookup tree's top_k counts continuations, not children (one may
    add no node), so it is not clamped there (``clamp_top_k`` False)."""
    top_k = min(shape.top_k, w) if clamp_top_k else shape.top_k
    return replace(shape, budget=w, depth=min(shape.depth, w), top_k=top_k)


def alternate_rounds(engine) -> dict:
    opts: EngineOptions = engine.options
    main: Round = engine.round
    kinds = {}
    if not main.shape.depth:  # no drafter: AR already
        return kinds
    if opts.auto_off:
        kinds["ar"] = KeepUpARRound(main)
    shapes = {main.shape.depth: main.shape}
    for d in opts.adaptive_depths:
        if d < main.shape.depth:
            shapes[d] = depth_shape(main.shape, d)
            kinds[d] = Round(main.target, main.draft, main.ngram, shapes[d])
    if opts.shared_budget is not None and not main.shape.chain:
        for d, shape in shapes.items():
            for w in widths_below(shape.budget):
                shape_w = width_shape(shape, w, clamp_top_k=main.draft is not None)
                kinds[(d, w)] = Round(main.target, main.draft, main.ngram, shape_w)
    for d in opts.chain_depths:
        kinds[chain_key(d)] = Round(main.target, main.draft, main.ngram, RoundShape(d, d, 1))
    return kinds


def kind_key(engine, depth: int, b: int):
    """The round kind of ``depth`` at bucket ``b``: None (the engine's own round), d, or (d, w)."""
    key = None if depth == engine.round.shape.depth else depth
    narrowed = (depth, width_for(width_of(engine, key), engine.options.shared_budget, b))
    return narrowed if narrowed in engine.kinds else key  # only trees under a shared budget have them


def kinds_at(engine, b: int) -> list:
    """The kinds a batch of bucket ``b`` may run, None (the engine's own round) among them: what warm-up
    captures there. A tree kind too wide for the bucket under a shared budget runs narrowed there
    (``kind_key``), so only its narrowed kind is listed: capturing the unnarrowed ones as well ran the H200
    out of memory at 64 rows (lifted 8B, 2bcb6d1: 80 GB of graph pools for rounds no batch of 64 runs).
    The keep-up AR round and the chain kinds are listed at every bucket; with ``adaptive_width``, every width
    below a bucket's."""
    depths = {engine.round.shape.depth} | {k for k in engine.kinds if isinstance(k, int)}
    used = {kind_key(engine, d, b) for d in depths}
    if engine.options.adaptive_width:
        used |= {key for d in depths for _, key in width_keys(engine, d, b)}
    return [k for k in (None, *engine.kinds) if k in used or k == "ar" or chain_depth(k)]


def width_keys(engine, depth: int, b: int) -> list[tuple[int, object]]:
    """(width, kind key) of the tree kinds at ``depth`` that bucket ``b`` may run under ``adaptive_width``:
    the shared budget's width there (``width_for``), then the narrower ones, widest first."""
    base = None if depth == engine.round.shape.depth else depth
    budget = width_of(engine, base)
    w0 = width_for(budget, engine.options.shared_budget, b)
    out = []
    for w in [w0, *widths_below(w0)]:
        key = base if w == budget else (depth, w)
        if key is base or key in engine.kinds:
            out.append((w, key))
    return out


def width_of(engine, key) -> int:
    """Verify nodes per row of a speculative kind key (None: the engine's own round)."""
    return (engine.round if key is None else engine.kinds[key]).shape.budget


class SpecPolicy:
    """Per step: the round kind for the batch (None = the engine's own round), from the rows' recent
    acceptance. Decisions are made on the host between rounds from the tokens the loop already reads
    back; under the lookahead the round launched next is already in flight when round t is read, so a
    decision from round t's tokens applies to round t + 2."""

    def __init__(self, engine, curve: StepCurve | None):
        opts = engine.options
        self.engine = engine
        self.main_depth = engine.round.shape.depth
        self.depths = tuple(sorted({d for d in opts.adaptive_depths if d < self.main_depth} | {self.main_depth}))
        self.adaptive = len(self.depths) > 1
        self.acc = Acceptance(opts.max_batch_size)
        # Adaptive depth: counterfactual tokens per round by depth, and how each round's depth was chosen
        # (chosen: the most estimated tokens per ms; capped: lifted above that for a capped row; rule: the
        # step curve or an estimate was missing, ``batch_depth``'s headroom rule).
        self.depth_est = DepthEstimates(opts.max_batch_size, self.depths) if self.adaptive else None
        self.depth_choices: dict[str, int] = {}
        self.auto_off = AutoOff(curve, opts.auto_off_probe_every) if opts.auto_off else None
        self.decisions: dict[str, int] = {}  # automatic off: spec / ar / probe / unmeasured
        self.depth_rounds: dict[int, int] = {}  # adaptive length: rounds run at each depth
        self.shared = opts.shared_budget is not None
        self.shared_rounds = 0  # rounds run under the shared node budget (``shared_budget``)
        self.width_rounds: dict[int, int] = {}  # narrowed verify blocks: rounds run at each width
        self._depth: int | None = None
        # Rounds in a row a choice left the configured tree before its probe (``Streak``), for all three kinds.
        self.probe_every = opts.auto_off_probe_every
        self._shallow = Streak(self.probe_every)  # rounds in a row below the main depth
        # Adaptive width: tokens per round by (depth, width), and rounds since the widest last ran.
        self.widths = WidthEstimates(opts.max_batch_size) if opts.adaptive_width else None
        self._narrow = Streak(self.probe_every)  # rounds in a row narrower than the widest
        self.width_choices: dict[str, int] = {}  # adaptive width: chosen / widest (no estimate) / probe
        # Chain kinds (``chain_kinds``): what each chain would have emitted per row, the rounds run at each
        # chain depth, how each round chose between tree and chains (chain / tree / probe / unmeasured), and
        # the chain rounds in a row since the tree last ran.
        self.chains = ChainEstimates(opts.max_batch_size, opts.chain_depths) if opts.chain_depths else None
        self.chain_rounds: dict[int, int] = {}
        self.chain_choices: dict[str, int] = {}
        self._chains = Streak(self.probe_every)  # chain rounds in a row (where one runs)

    @property
    def active(self) -> bool:
        return self.adaptive or self.auto_off is not None

    def choose(self, rows: list[int], b: int):
        depth, depth_probe = self.main_depth, False
        if self.adaptive:
            depth, depth_probe = self._choose_depth(rows, b)
        key = tree_key = kind_key(self.engine, depth, b)
        taus = off_taus = [self.acc.off_tau(r) for r in rows]
        width_taus, width_probe = None, False
        if self.widths is not None:
            key, width_taus, width_probe = self._choose_width(rows, depth, b, key)
            taus = width_taus or taus
        if self.chains is not None and not (width_probe or depth_probe):  # a probe must run its tree
            chain = self._choose_chain(rows, b, key, depth, width_taus)
            if chain is not None:
                key, taus = chain
        if self.auto_off is not None:
            # A chain or a narrowed tree is chosen on fast estimates (``estimates.ALPHA``); switching off must
            # also beat the tree on the slow one (``Acceptance.off_tau``), as it must where the tree runs: a false
            # "off" lasts until a probe. (At one client on the H200, 1ed178a, 32 of 376 rounds still ran as AR,
            # in two stretches of 16: those came from the tree's own slow estimate, not from a chain's.)
            alts = [] if key == tree_key else [(off_taus, "spec" if tree_key is None else tree_key)]
            decision = self.auto_off.decide(taus, b, "spec" if key is None else key, alts)
            self.decisions[decision] = self.decisions.get(decision, 0) + 1
            if decision == AR:
                return "ar"
            if decision == PROBE:  # a probe measures at full depth: what the drafter can do now
                depth_probe = True
        if depth_probe:  # automatic off's probe or adaptive depth's: the main depth's tree
            depth = self.main_depth
            key = kind_key(self.engine, depth, b)
        self._depth = depth
        chain = chain_depth(key)
        if chain:
            self._chains.note(True)  # counted where a chain runs, not where automatic off ran AR
            self.chain_rounds[chain] = self.chain_rounds.get(chain, 0) + 1
            return key
        self._chains.note(False)
        if isinstance(key, tuple):
            self.width_rounds[key[1]] = self.width_rounds.get(key[1], 0) + 1
        self.depth_rounds[depth] = self.depth_rounds.get(depth, 0) + 1
        self.shared_rounds += self.shared
        return key

    def _choose_depth(self, rows: list[int], b: int) -> tuple[int, bool]:
        """(depth, probe): the draft depth with the most estimated tokens per ms at bucket ``b`` (``best_depth``),
        at least the depth above the last one where a row was capped; ``batch_depth``'s rule where any is
        unmeasured. ``probe``: the main depth's turn (below) is due; the depth is still the best one, on which
        automatic off decides."""
        order = [self.main_depth] + [d for d in self.depths if d != self.main_depth]  # the default first
        cands = [(d, kind_key(self.engine, d, b)) for d in order]
        depth = best = best_depth(
            cands, lambda d: self.depth_est.tau(rows, d), lambda k: self._ms(k, b), switch_margin(len(rows))
        )
        if depth is None:
            self._count(self.depth_choices, "rule")
            rule = batch_depth([(self.acc.tokens[r], self.acc.capped[r]) for r in rows], self.depths, self._depth)
            return rule, False
        how = "chosen"
        if self._depth is not None and any(self.acc.capped[r] for r in rows):
            depth = max(depth, next_depth(self.depths, self._depth))
            how = "capped" if depth != best else how
        # A shallower round refreshes no deeper estimate, so a batch that turned shallow in a bad stretch would
        # stay there until a row caps: after ``probe_every`` rounds in a row below the main depth, the main
        # depth runs once (as chain kinds and adaptive width probe their tree).
        probe = depth < self.main_depth and self._shallow.due()
        self._shallow.note(depth < self.main_depth and not probe)
        if probe:
            how = "probe"
        self._count(self.depth_choices, how)
        return depth, probe

    def _choose_width(self, rows: list[int], depth: int, b: int, default):
        """(kind key, its rows' estimated tokens or None, whether it is a probe) for the round at ``depth``: the
        width with the most estimated tokens per ms (``adaptive_width``), the widest every ``probe_every``
        narrower rounds (a probe, which must run its tree)."""
        cands = [(w, k) for w, k in width_keys(self.engine, depth, b) if self._captured(k, b)]
        if len(cands) < 2:
            return default, None, False
        if self._narrow.due():
            self._narrow.note(False)
            self._count(self.width_choices, "probe")
            return cands[0][1], None, True
        w = best_width(
            cands, lambda w: self.widths.tau(rows, depth, w), lambda k: self._ms(k, b), switch_margin(len(rows))
        )
        if w is None:
            self._count(self.width_choices, "widest")
            return cands[0][1], None, False
        self._count(self.width_choices, "chosen")
        self._narrow.note(w != cands[0][0])
        key = dict(cands)[w]
        return key, [self.widths.est[r].get((depth, w)) for r in rows], False

    def _choose_chain(self, rows: list[int], b: int, tree_key, depth: int, width_taus):
        """(chain kind key, its rows' estimated tokens) where a chain kind promises more tokens per ms at bucket
        ``b`` than the tree kind ``tree_key`` (at ``depth``; ``width_taus``: its rows' width estimates), else
        None: the tree runs. After ``probe_every`` chain rounds in a row the tree runs once (its estimates
        learn nothing from chains)."""
        if self._chains.due():
            self._count(self.chain_choices, "probe")
            return None
        if width_taus:
            tree_tau = known_mean(width_taus)
        elif self.depth_est is not None:
            tree_tau = self.depth_est.tau(rows, depth)
        else:
            tree_tau = known_mean([self.acc.tokens[r] for r in rows])
        depths = self.chains.depths
        keys = [tree_key] + [chain_key(d) for d in depths]
        taus = [tree_tau] + [self.chains.tau(rows, d) for d in depths]
        cands = [(i, k) for i, k in enumerate(keys) if i == 0 or self._captured(k, b)]
        best = most_per_ms(cands, lambda i: taus[i], lambda k: self._ms(k, b), switch_margin(len(rows)))
        if not best:  # the tree: chosen, or some estimate or curve point is missing
            self._count(self.chain_choices, "tree" if best == 0 else "unmeasured")
            return None
        self._count(self.chain_choices, "chain")
        d = depths[best - 1]
        return keys[best], [self.chains.est[r].get(d) for r in rows]

    def _captured(self, key, b: int) -> bool:
        eng = self.engine
        if eng.captured is None:  # no graphs (CPU): every kind runs eagerly
            return key is None or key in eng.kinds
        cap = eng.captured if key is None else eng.kinds_captured.get(key)
        return cap is not None and b in cap

    def _ms(self, key, b: int) -> float | None:
        """The step curve's ms for ``key`` measured at bucket ``b`` exactly (no interpolation across kinds)."""
        curve = self.auto_off.curve if self.auto_off is not None else None
        name = "spec" if key is None else key
        if curve is None or all(r != b for r, _ in curve.points.get(name, [])):
            return None
        return curve.ms(name, b)

    @staticmethod
    def _count(counts: dict[str, int], what: str) -> None:
        counts[what] = counts.get(what, 0) + 1

    def depth_of(self, key) -> int:
        if isinstance(key, tuple) or chain_depth(key):  # a narrowed round (its width may cap its depth), a chain
            return self.engine.kinds[key].shape.depth
        return self.main_depth if key is None else (0 if key == "ar" else key)

    def observe(self, row: int, tokens: int, key, out_row: list[int] | None = None) -> None:
        """A round of kind ``key`` emitted ``tokens`` for ``row``; ``out_row`` its ``RoundState.out`` row
        (with ``adaptive_width``: the accepted nodes' ranks, ``Round.rank_col``)."""
        d = self.depth_of(key)
        if not d:  # AR rounds say nothing about the drafter
            return
        if chain_depth(key):  # exact for chains up to its depth; nothing about the tree
            self.chains.observe_chain(row, tokens - 1, d)
            return
        col = self.engine.round.greedy_col
        if self.chains is not None and col is not None and out_row is not None and out_row[col] >= 0:
            self.chains.observe_tree(row, out_row[col], tokens - 1, d)
        self.acc.observe(row, tokens, d)
        # Estimates are keyed by the depth the policy chose: a narrowed kind's own depth may be capped by its
        # width, and the policy asks for the chosen depths' estimates. Keyed by the capped depth, a batch whose
        # main tree ran narrowed to depth 4 (the (6, 4) tree of 5 nodes a row at 32 and 64 rows under a budget of
        # 128) never had a depth-6 estimate: on the H100 (937d7ec, batched_h100.json) adaptive depth fell back to
        # its rule in all 397 rounds at 32 clients and 481 at 64, and the chain-or-tree choice was unmeasured in
        # 353 and 415, so the tree ran where stock's chain (8.0 against 9.0 ms at 32, 10.3 against 12.5 at 64)
        # would have served about as many tokens.
        nominal = key[0] if isinstance(key, tuple) else (self.main_depth if key is None else key)
        if self.depth_est is not None:
            self.depth_est.observe(row, tokens, nominal)
        if self.widths is not None and out_row is not None:
            # The ranks are the accepted path's, d entries.
            w = width_of(self.engine, key)
            col = self.engine.round.rank_col
            self.widths.observe(row, nominal, [w, *widths_below(w)], out_row[col : col + d], tokens)

    def forget(self, row: int) -> None:
        self.acc.forget(row)
        if self.depth_est is not None:
            self.depth_est.forget(row)
        if self.widths is not None:
            self.widths.forget(row)
        if self.chains is not None:
            self.chains.forget(row)
