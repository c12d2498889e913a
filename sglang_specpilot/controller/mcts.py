"""Monte Carlo tree search over joint plans (Conjugate Compilation, section 3.1).

Each node is a complete, executable plan; the root is the empty plan (co-scheduling only). Selection
follows UCT, ``Q(c) + beta * sqrt(ln(N(parent) + 1) / N(c))`` with Q the mean backed-up reward
normalized to [0, 1] over the rewards seen so far. Progressive widening lets a node gain a child only
while ``alpha * |children| < ceil(kappa * (N + 1))``, so a node must be visited more before it is widened
further. A new child is evaluated directly (no rollouts: every node can be executed and measured) and
its reward is backed up to the root. Plans that fail legality, a gate or the numerical check get the
lowest reward (0). Plans reached twice are evaluated once (the verdict is cached by plan key).

The whole state, the tree, every evaluation record (reward, feedback codes, kernel verdicts) and the
best plan, is a JSON document (``save`` / ``load``), so a run can stop and resume.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..colocate.plan import JointPlan
from ..harness.jsonable import write_json
from .proposer import ProposalContext, Proposer

FAILED_REWARD = 0.0


@dataclass
class Evaluation:
    """What evaluating one plan produced; ``reward`` None = failed (feedback says why)."""

    reward: float | None
    feedback: list[dict] = field(default_factory=list)
    verdicts: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)


@dataclass
class Node:
    plan: JointPlan
    parent: str | None
    children: list[str] = field(default_factory=list)
    visits: int = 0
    value: float = 0.0  # sum of backed-up rewards
    pending: list[JointPlan] = field(default_factory=list)  # proposals not yet expanded (not persisted)
    exhausted: bool = False  # the proposer has nothing more for this node


class MCTS:
    """Plan search; ``evaluate(plan) -> Evaluation`` measures a plan (through the harness on a GPU)."""

    def __init__(
        self,
        proposer: Proposer,
        evaluate: Callable[[JointPlan], Evaluation],
        ctx: ProposalContext,
        *,
        beta: float = 1.0,
        alpha: float = 1.0,
        kappa: float = 0.5,
        proposals: int = 4,
        root: JointPlan | None = None,
        state_path: str | Path | None = None,
    ):
        self.proposer, self.evaluate_fn, self.ctx = proposer, evaluate, ctx
        self.beta, self.alpha, self.kappa, self.m = beta, alpha, kappa, proposals
        self.state_path = Path(state_path) if state_path else None
        root = root or JointPlan()
        self.root = root.key
        self.nodes: dict[str, Node] = {root.key: Node(root, None)}
        self.records: dict[str, dict] = {}
        if self.state_path and self.state_path.exists():
            self._restore(json.loads(self.state_path.read_text()))
        if root.key not in self.records:
            self._backup(root.key, self._evaluate(root))

    # ---- evaluation and bookkeeping -----------------------------------------------------------------
    def _evaluate(self, plan: JointPlan) -> float:
        if plan.key not in self.records:
            ev = self.evaluate_fn(plan)
            self.records[plan.key] = {
                "plan": plan.key,
                "plan_json": plan.to_dict(),
                "reward": ev.reward,
                "feedback": ev.feedback,
                "verdicts": ev.verdicts,
                "info": ev.info,
            }
            self.ctx.history.append(self.records[plan.key])
        r = self.records[plan.key]["reward"]
        return FAILED_REWARD if r is None else float(r)

    def _backup(self, key: str | None, reward: float) -> None:
        while key is not None:
            node = self.nodes[key]
            node.visits += 1
            node.value += reward
            key = node.parent

    def _q(self, node: Node) -> float:
        rewards = [FAILED_REWARD if r["reward"] is None else r["reward"] for r in self.records.values()]
        lo, hi = min(rewards), max(rewards)
        mean = node.value / max(1, node.visits)
        return 0.5 if hi <= lo else (mean - lo) / (hi - lo)

    def _can_widen(self, node: Node) -> bool:
        return not node.exhausted and self.alpha * len(node.children) < math.ceil(self.kappa * (node.visits + 1))

    def _next_proposal(self, node: Node) -> JointPlan | None:
        while True:
            if not node.pending:
                ancestors, k = [], node.parent
                while k is not None:
                    ancestors.append(self.nodes[k].plan)
                    k = self.nodes[k].parent
                self.ctx.ancestors = ancestors
                fresh = self.proposer.propose(node.plan, self.ctx, self.m)
                node.pending = [p for p in fresh if p.key not in self.nodes]
                if not node.pending:
                    node.exhausted = True
                    return None
            plan = node.pending.pop(0)
            if plan.key not in self.nodes:
                return plan

    # ---- one iteration --------------------------------------------------------------------------------
    def step(self) -> str:
        """Select, expand one child (or revisit a leaf), evaluate, back up; returns the evaluated key."""
        key = self.root
        while True:
            node = self.nodes[key]
            if self._can_widen(node):
                plan = self._next_proposal(node)
                if plan is not None:
                    self.nodes[plan.key] = Node(plan, key)
                    node.children.append(plan.key)
                    self._backup(plan.key, self._evaluate(plan))
                    self.save()
                    return plan.key
            if not node.children:
                self._backup(key, self._evaluate(node.plan))
                self.save()
                return key
            ln = math.log(node.visits + 1)
            key = max(
                node.children,
                key=lambda c: self._q(self.nodes[c]) + self.beta * math.sqrt(ln / max(1, self.nodes[c].visits)),
            )

    def run(self, iterations: int) -> JointPlan:
        for _ in range(iterations):
            self.step()
        return self.best()

    def best(self) -> JointPlan:
        """The plan with the highest measured reward (the anchor when nothing beat it)."""
        ok = [r for r in self.records.values() if r["reward"] is not None]
        top = max(ok, key=lambda r: r["reward"])
        return JointPlan.from_dict(top["plan_json"])

    # ---- persistence -----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "root": self.root,
            "params": {"beta": self.beta, "alpha": self.alpha, "kappa": self.kappa, "proposals": self.m},
            "nodes": {
                k: {
                    "plan": n.plan.to_dict(),
                    "parent": n.parent,
                    "children": n.children,
                    "visits": n.visits,
                    "value": n.value,
                    "exhausted": n.exhausted,
                }
                for k, n in self.nodes.items()
            },
            "records": self.records,
        }

    def save(self) -> None:
        if self.state_path is not None:
            write_json(self.state_path, self.to_dict(), sort_keys=True)  # a crash never leaves half a state file

    def _restore(self, d: dict) -> None:
        self.root = d["root"]
        self.nodes = {
            k: Node(
                JointPlan.from_dict(n["plan"]),
                n["parent"],
                list(n["children"]),
                int(n["visits"]),
                float(n["value"]),
                exhausted=bool(n.get("exhausted", False)),
            )
            for k, n in d["nodes"].items()
        }
        self.records = dict(d["records"])
        self.ctx.history = list(self.records.values())
