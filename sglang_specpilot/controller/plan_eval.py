"""Evaluating one joint plan: legality, the kernel-gain gate, the numerical check, paired round timing.

The order follows Conjugate Compilation section 3.2. A plan is rejected, with feedback, at the first
check it fails: static legality (``colocate.legality`` codes), then each new group's kernel-gain gate
(``harness.kernel_gain_gate``; verdicts are cached per group and kept whether they pass or not), then the
numerical check of the whole round against the reference (relative agreement within 1e-2, argmax
differences only at near-ties). Only then is it timed, in blocks of anchor, candidate, placement control,
candidate, anchor; its reward is the median paired anchor / candidate ratio times the anchor's speedup
over the faster conventional baseline (a constant per configuration, so it does not change rankings).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from ..colocate.legality import annotate_proportions, check_plan
from ..colocate.ops import OpInfo
from ..colocate.plan import ConjugatedGroup, JointPlan, KernelConfig, kernel_candidates
from ..harness.gates import kernel_gain_gate
from ..harness.timing import PairedTimes, anchor_candidate_control_order, paired_timing
from .mcts import Evaluation

REL_TOL = 1e-2
KERNEL_GATE = "KERNEL_GATE"
NUMERICS = "NUMERICS"


@dataclass
class NumericVerdict:
    ok: bool
    max_rel_err: float
    argmax_mismatches: int
    near_tie_mismatches: int
    detail: str


def numerical_check(
    ref: torch.Tensor, cand: torch.Tensor, *, rel_tol: float = REL_TOL, tie_eps: float | None = None
) -> NumericVerdict:
    """Compare candidate logits with the reference's, both [..., V].

    Relative agreement: ``max |cand - ref| <= rel_tol * max |ref|`` per row. An argmax may differ only where
    the reference's top-2 margin is below ``tie_eps`` (default ``rel_tol * max |ref|`` of the row: a gap
    the allowed error could close).
    """
    r, c = ref.float().reshape(-1, ref.shape[-1]), cand.float().reshape(-1, ref.shape[-1])
    scale = r.abs().amax(-1).clamp_min(1e-30)
    rel = (c - r).abs().amax(-1) / scale
    top2 = r.topk(2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]
    eps = rel_tol * scale if tie_eps is None else torch.full_like(scale, tie_eps)
    diff = r.argmax(-1) != c.argmax(-1)
    ties = diff & (margin < eps)
    bad = int((diff & ~ties).sum())
    worst = float(rel.max()) if rel.numel() else 0.0
    ok = worst <= rel_tol and bad == 0
    detail = (
        f"max relative error {worst:.2e} (limit {rel_tol:.0e}); argmax mismatches {int(diff.sum())}, "
        f"{int(ties.sum())} at near-ties"
    )
    return NumericVerdict(ok, worst, int(diff.sum()), int(ties.sum()), detail)


def paired_ratio_median(times: PairedTimes, base: str, new: str) -> float:
    """Median over blocks of ``time(base) / time(new)`` (each block's mean per variant)."""
    return float(np.median(times.block_times(base) / times.block_times(new)))


def anchor_speedup(times: PairedTimes, anchor: str, baselines: list[str]) -> tuple[float, str]:
    """The anchor's speedup over the faster (lower median) conventional baseline: (ratio, baseline name)."""
    fastest = min(baselines, key=times.median)
    return paired_ratio_median(times, fastest, anchor), fastest


def round_reward(times: PairedTimes, speedup_of_anchor: float) -> float:
    """Median paired anchor / candidate ratio, scaled by the anchor's speedup over conventional."""
    return paired_ratio_median(times, "anchor", "candidate") * speedup_of_anchor


class PlanEvaluator:
    """Runs the checks and the timing for plans of one configuration.

    Parameters
    ----------
    catalog : the round's operations
    build : ``build(plan) -> callable`` running one round under ``plan`` (a graph replay on CUDA)
    outputs : ``outputs(plan) -> dict of name -> logits tensor`` from one round under ``plan`` (numerics)
    group_times : ``group_times(group) -> PairedTimes`` with the members timed separately (variants named
        after the members) and the interleaved kernel, built with ``group.config``, as variant ``"group"``
    candidates : ``candidates(family) -> kernel configurations`` the gate tunes each new group over (the
        fastest one's verdict decides, and plans run with it); default ``plan.kernel_candidates``
    speedup_of_anchor : the anchor's speedup over the faster conventional baseline (``anchor_speedup``)
    """

    def __init__(
        self,
        catalog: dict[str, OpInfo],
        build: Callable[[JointPlan], Callable[[], object]],
        outputs: Callable[[JointPlan], dict],
        group_times: Callable[[ConjugatedGroup], PairedTimes],
        speedup_of_anchor: float,
        *,
        device: str = "cpu",
        blocks: int = 20,
        inner: int = 1,
        warmup: int = 2,
        candidates: Callable[[str], tuple[KernelConfig, ...]] = kernel_candidates,
    ):
        self.catalog, self.build, self.outputs, self.group_times = catalog, build, outputs, group_times
        self.speedup_of_anchor = speedup_of_anchor
        self.device, self.blocks, self.inner, self.warmup = device, blocks, inner, warmup
        self.candidates = candidates
        self.verdicts: dict[str, dict] = {}  # kernel-gain verdicts by group key (persisted by the search)
        self.reference = outputs(JointPlan())
        self.anchor = build(JointPlan())

    def gate(self, group: ConjugatedGroup) -> dict:
        """Tune the group's kernel over the candidate configurations, gate the fastest (cached by members)."""
        if group.key not in self.verdicts:
            tried, errors = [], []
            for cfg in self.candidates(group.family):
                try:
                    times = self.group_times(group.with_config(cfg))
                except Exception as e:  # a configuration the compiler cannot build (e.g. out of shared memory)
                    errors.append({"config": asdict(cfg), "error": f"{type(e).__name__}: {e}"[:300]})
                    continue
                tried.append((kernel_gain_gate(times, list(group.members), "group").to_dict(), cfg))
            if not tried:
                self.verdicts[group.key] = {
                    "admitted": False,
                    "reason": "no candidate configuration ran",
                    "v": 0.0,
                    "tuning": errors,
                }
                return self.verdicts[group.key]
            best, cfg = max(tried, key=lambda t: t[0]["v"])
            self.verdicts[group.key] = {
                **best,
                "config": asdict(cfg),
                "tuning": [{"config": asdict(c), "v": t["v"]} for t, c in tried] + errors,
            }
        return self.verdicts[group.key]

    def restore(self, records) -> None:
        """Take the kernel verdicts (and tuned configurations) of earlier evaluations, e.g. a resumed
        search's records, so their groups are not gated and tuned again."""
        for r in records:
            for key, verdict in (r.get("verdicts") or {}).items():
                self.verdicts.setdefault(key, verdict)

    def tuned(self, plan: JointPlan) -> JointPlan:
        """``plan`` with each gated group's kernel configuration replaced by its tuned one."""
        groups = [
            g.with_config(KernelConfig(**self.verdicts[g.key]["config"]))
            if "config" in self.verdicts.get(g.key, {})
            else g
            for g in plan.groups
        ]
        return replace(plan, groups=tuple(groups))

    def __call__(self, plan: JointPlan) -> Evaluation:
        problems = check_plan(plan, self.catalog)
        if problems:
            return Evaluation(None, [p.to_dict() for p in problems])
        plan = annotate_proportions(plan, self.catalog)
        info = {"proportions": plan.proportions}
        if not plan.groups and plan.priority == "equal":
            return Evaluation(self.speedup_of_anchor, [], {}, {**info, "note": "the anchor itself"})
        verdicts = {g.key: self.gate(g) for g in plan.groups} if plan.interleave else {}
        failed = [k for k, v in verdicts.items() if not v["admitted"]]
        if failed:
            fb = [{"code": KERNEL_GATE, "group": k, "detail": verdicts[k]["reason"]} for k in failed]
            return Evaluation(None, fb, verdicts, info)
        plan = self.tuned(plan)
        info["plan_run"] = plan.to_dict()
        outs = self.outputs(plan)
        checks = {k: numerical_check(self.reference[k], outs[k]) for k in self.reference}
        bad = {k: v for k, v in checks.items() if not v.ok}
        info["numerics"] = {k: v.detail for k, v in checks.items()}
        if bad:
            fb = [{"code": NUMERICS, "group": "", "detail": f"{k}: {v.detail}"} for k, v in bad.items()]
            return Evaluation(None, fb, verdicts, info)
        variants = {"anchor": self.anchor, "candidate": self.build(plan), "control": self.build(plan.control())}
        times = paired_timing(
            variants,
            order=anchor_candidate_control_order(),
            blocks=self.blocks,
            warmup=self.warmup,
            inner=self.inner,
            device=self.device,
        )
        info["anchor_over_candidate"] = paired_ratio_median(times, "anchor", "candidate")
        info["anchor_over_control"] = paired_ratio_median(times, "anchor", "control")
        info["control_over_candidate"] = paired_ratio_median(times, "control", "candidate")
        info["median_s"] = {n: times.median(n) for n in times.names}
        return Evaluation(round_reward(times, self.speedup_of_anchor), [], verdicts, info)
