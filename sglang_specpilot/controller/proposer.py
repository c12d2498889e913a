"""Proposers of joint-plan edits: the interface MCTS expands through, and the built-in edit enumerator.

A proposer gets the plan MCTS selected and what the search has learned so far (``ProposalContext``:
the round's operations, every evaluated plan with its reward, kernel verdicts and feedback codes) and
returns up to ``m`` new plans. The built-in ``EditProposer`` enumerates the four edits of Conjugate
Compilation (add, merge, split, remove) and a fifth of ours, the streams' priority (``plan.PRIORITIES``),
keeping only those the legality checker accepts; an LLM proposer
can implement the same interface and read the context to choose its edits.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, replace
from typing import Protocol

from ..colocate.legality import check_plan
from ..colocate.ops import OpInfo
from ..colocate.plan import FAMILIES, PRIORITIES, ConjugatedGroup, JointPlan


@dataclass
class ProposalContext:
    catalog: dict[str, OpInfo]
    history: list[dict] = field(default_factory=list)  # {"plan", "reward", "feedback", "verdicts"} records
    ancestors: list[JointPlan] = field(default_factory=list)  # the selected plan's parents, nearest first


class Proposer(Protocol):
    name: str

    def propose(self, plan: JointPlan, ctx: ProposalContext, m: int) -> list[JointPlan]:
        """Up to ``m`` distinct plans, each one edit away from ``plan``."""
        ...


class EditProposer:
    """Enumerates legal add / merge / split / remove edits, in a seeded random order."""

    name = "edits"

    def __init__(self, seed: int = 0, families: tuple[str, ...] = FAMILIES):
        self.rng = random.Random(seed)
        self.families = families

    def _free(self, plan: JointPlan, catalog: dict[str, OpInfo]) -> dict[str, tuple[list[str], list[str]]]:
        """Per family, the target and draft operations no group of ``plan`` uses yet."""
        used = set(plan.ops())
        return {
            f: (
                [o for o, i in catalog.items() if i.family == f and i.model == "target" and o not in used],
                [o for o, i in catalog.items() if i.family == f and i.model == "draft" and o not in used],
            )
            for f in self.families
        }

    def _structural(self, plan: JointPlan) -> list[tuple[str, JointPlan]]:
        """The merge, remove, split and priority edits of ``plan`` (unchecked; few: they act on its groups)."""
        groups = list(plan.groups)
        out: list[tuple[str, JointPlan]] = []
        for a, b in itertools.combinations(range(len(groups)), 2):
            ga, gb = groups[a], groups[b]
            if ga.family == gb.family:
                rest = [g for k, g in enumerate(groups) if k not in (a, b)]
                merged = ConjugatedGroup(ga.family, ga.members + gb.members, ga.config)
                out.append(("merge", plan.with_groups([*rest, merged])))
        for k, g in enumerate(groups):
            rest = groups[:k] + groups[k + 1 :]
            out.append(("remove", plan.with_groups(rest)))
            for r in range(2, len(g.members) - 1):
                for part in itertools.combinations(g.members, r):
                    other = tuple(m for m in g.members if m not in part)
                    if part < other:  # each split once
                        split = [ConjugatedGroup(g.family, part, g.config), ConjugatedGroup(g.family, other, g.config)]
                        out.append(("split", plan.with_groups([*rest, *split])))
        for prio in PRIORITIES:
            if prio != plan.priority:
                out.append(("priority", replace(plan, priority=prio, proportions={})))
        return out

    def edits(self, plan: JointPlan, catalog: dict[str, OpInfo]) -> list[tuple[str, JointPlan]]:
        """Every legal one-edit neighbour of ``plan`` as (edit kind, plan)."""
        groups = list(plan.groups)
        out: list[tuple[str, JointPlan]] = []
        for f, (targets, drafts) in self._free(plan, catalog).items():
            for t, d in itertools.product(targets, drafts):
                out.append(("add", plan.with_groups([*groups, ConjugatedGroup(f, (t, d))])))
        out += self._structural(plan)
        return [(kind, p) for kind, p in out if not check_plan(p, catalog)]

    def propose(self, plan: JointPlan, ctx: ProposalContext, m: int) -> list[JointPlan]:
        """Up to ``m`` new legal plans: the structural edits plus ``m`` sampled add edits, shuffled.

        Add edits are sampled rather than enumerated (``edits`` still lists them all): a Llama-8B / 1B round
        has 38,677 legal adds, and checking every one on each expansion cost 12-35 s of each H200 search
        step (7.6 s on the developer CPU); sampling m of them takes milliseconds.
        """
        seen = {r["plan"] for r in ctx.history}
        cands = [p for _, p in self._structural(plan) if p.key not in seen and not check_plan(p, ctx.catalog)]
        free = [(f, t, d) for f, (t, d) in self._free(plan, ctx.catalog).items() if t and d]
        weights = [len(t) * len(d) for _, t, d in free]
        keys = {p.key for p in cands}
        adds: list[JointPlan] = []
        for _ in range(50 * m if free else 0):  # bounded: illegal or repeated draws are retried
            if len(adds) == m:
                break
            f, targets, drafts = self.rng.choices(free, weights)[0]
            pair = (self.rng.choice(targets), self.rng.choice(drafts))
            p = plan.with_groups([*plan.groups, ConjugatedGroup(f, pair)])
            if p.key not in seen and p.key not in keys and not check_plan(p, ctx.catalog):
                keys.add(p.key)
                adds.append(p)
        cands += adds
        self.rng.shuffle(cands)
        return cands[:m]
