"""Static legality checks of a joint plan, each failure reported with a specific feedback code.

The checks run before anything is built or timed (Conjugate Compilation, section 3.2): a proposal that
fails one is rejected with its code, and the code goes back to the proposer so it can learn from it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .ops import OpInfo, member_proportions
from .plan import FAMILIES, PRIORITIES, JointNode, JointPlan

# Feedback codes (stable strings: stored in search state and shown to proposers).
UNKNOWN_OP = "UNKNOWN_OP"  # a member names no operation of the round
BAD_FAMILY = "BAD_FAMILY"  # the group's family is not an interleavable kernel family
FAMILY_MISMATCH = "FAMILY_MISMATCH"  # a member's kernel family differs from the group's
GROUP_SIZE = "GROUP_SIZE"  # fewer than 2 or more than Kmax members
NOT_CROSS_MODEL = "NOT_CROSS_MODEL"  # a group must hold operations of both models
DUPLICATE_OP = "DUPLICATE_OP"  # an operation in two groups
DEPENDENT_MEMBERS = "DEPENDENT_MEMBERS"  # one member reads another's output (directly or through others)
SPANS_SEGMENTS = "SPANS_SEGMENTS"  # a group's members of one model lie in more than one segment
NOT_INJECTIVE = "NOT_INJECTIVE"  # two joint nodes share a target segment or a draft segment
CYCLE = "CYCLE"  # the placement would need work to wait for work that waits for it
MEMORY_BUDGET = "MEMORY_BUDGET"  # the interleaved kernels' buffers and tables exceed the budget
BAD_CONFIG = "BAD_CONFIG"  # a kernel configuration the kernels cannot run
BAD_PRIORITY = "BAD_PRIORITY"  # a stream priority the co-scheduler does not know

DESC_BYTES_PER_UNIT = 16 * 8  # one grouped-GEMM descriptor row


@dataclass(frozen=True)
class Feedback:
    code: str
    group: str  # the group's key, or "" for plan-wide problems
    detail: str

    def to_dict(self) -> dict:
        return {"code": self.code, "group": self.group, "detail": self.detail}


def _reaches(deps_of: dict[int, tuple[int, ...]], src: int, dst: int) -> bool:
    # Does op dst depend (transitively) on op src within one segment?
    stack, seen = [dst], set()
    while stack:
        b = stack.pop()
        for a in deps_of.get(b, ()):
            if a == src:
                return True
            if a not in seen:
                seen.add(a)
                stack.append(a)
    return False


def joint_nodes(plan: JointPlan, catalog: dict[str, OpInfo]) -> dict[str, JointNode]:
    """The joint node each group is placed in: (its target segment, its draft segment)."""
    out = {}
    for g in plan.groups:
        segs = {catalog[m].model: catalog[m].segment for m in g.members if m in catalog}
        if "target" in segs and "draft" in segs:
            out[g.key] = JointNode(segs["target"], segs["draft"])
    return out


def memory_bytes(plan: JointPlan, catalog: dict[str, OpInfo]) -> int:
    """Extra device memory the interleaved kernels need: static operand buffers (inputs copied in, output
    written) and descriptor tables, estimated from output sizes (inputs of a GEMM are counted as the
    output's size: the activations of decode steps are of the same order)."""
    if not plan.interleave:
        return 0
    total = 0
    for g in plan.groups:
        for m in g.members:
            info = catalog[m]
            total += (3 if g.family == "add" else 2) * info.out_bytes()
            rows = max(1, info.out_bytes() // max(1, info.elem_bytes * (info.shape[-1] if info.shape else 1)))
            total += DESC_BYTES_PER_UNIT * max(1, rows)
    return total


def check_plan(plan: JointPlan, catalog: dict[str, OpInfo]) -> list[Feedback]:
    """Every legality problem of ``plan`` over the round described by ``catalog`` (empty = legal)."""
    out: list[Feedback] = []
    if plan.priority not in PRIORITIES:
        out.append(Feedback(BAD_PRIORITY, "", f"priority {plan.priority!r} is not one of {PRIORITIES}"))
    seen: dict[str, str] = {}
    deps_by_seg: dict[tuple[str, int], dict[int, tuple[int, ...]]] = {}
    for info in catalog.values():
        deps_by_seg.setdefault((info.model, info.segment), {})[info.position] = info.deps

    for g in plan.groups:
        key = g.key
        if g.family not in FAMILIES:
            out.append(Feedback(BAD_FAMILY, key, f"family {g.family!r} is not one of {FAMILIES}"))
        if not 2 <= len(g.members) <= plan.kmax:
            out.append(Feedback(GROUP_SIZE, key, f"{len(g.members)} members, allowed 2..{plan.kmax}"))
        for p in g.config.problems():
            out.append(Feedback(BAD_CONFIG, key, p))
        unknown = [m for m in g.members if m not in catalog]
        for m in unknown:
            out.append(Feedback(UNKNOWN_OP, key, f"no operation {m!r} in this round"))
        known = [m for m in g.members if m in catalog]
        for m in known:
            if catalog[m].family != g.family:
                out.append(Feedback(FAMILY_MISMATCH, key, f"{m} is {catalog[m].family}, group is {g.family}"))
            if m in seen:
                out.append(Feedback(DUPLICATE_OP, key, f"{m} is also in {seen[m]}"))
            seen.setdefault(m, key)
        models = {catalog[m].model for m in known}
        if known and models != {"target", "draft"}:
            out.append(Feedback(NOT_CROSS_MODEL, key, f"members come only from {sorted(models)}"))
        for model in ("target", "draft"):
            segs = {catalog[m].segment for m in known if catalog[m].model == model}
            if len(segs) > 1:
                out.append(Feedback(SPANS_SEGMENTS, key, f"{model} members lie in segments {sorted(segs)}"))
        for a in known:
            for b in known:
                ia, ib = catalog[a], catalog[b]
                if a != b and (ia.model, ia.segment) == (ib.model, ib.segment):
                    if _reaches(deps_by_seg[(ia.model, ia.segment)], ia.position, ib.position):
                        out.append(Feedback(DEPENDENT_MEMBERS, key, f"{b} depends on {a}"))
    if out:
        return out  # placement checks assume well-formed groups

    out += _placement_problems(plan, catalog)
    need = memory_bytes(plan, catalog)
    if need > plan.memory_budget_bytes:
        out.append(Feedback(MEMORY_BUDGET, "", f"needs {need} bytes, budget {plan.memory_budget_bytes}"))
    return out


def _placement_problems(plan: JointPlan, catalog: dict[str, OpInfo]) -> list[Feedback]:
    out = []
    nodes = joint_nodes(plan, catalog)
    by_target: dict[int, set[int]] = {}
    by_draft: dict[int, set[int]] = {}
    for n in nodes.values():
        by_target.setdefault(n.target, set()).add(n.draft)
        by_draft.setdefault(n.draft, set()).add(n.target)
    for i, js in by_target.items():
        if len(js) > 1:
            out.append(Feedback(NOT_INJECTIVE, "", f"target segment {i} joins draft segments {sorted(js)}"))
    for j, is_ in by_draft.items():
        if len(is_) > 1:
            out.append(Feedback(NOT_INJECTIVE, "", f"draft segment {j} joins target segments {sorted(is_)}"))
    distinct = sorted({(n.target, n.draft) for n in nodes.values()})
    for (i1, j1), (i2, j2) in zip(distinct, distinct[1:], strict=False):
        if i1 < i2 and j1 >= j2:
            out.append(
                Feedback(
                    CYCLE,
                    "",
                    f"J({i1},{j1}) then J({i2},{j2}): the map is not increasing in the "
                    "draft chain, so each node would wait for the other",
                )
            )
    # Inside one joint node, groups run in one order; every member's segment must agree with it.
    for node in set(nodes.values()):
        keys = [g for g in plan.groups if nodes.get(g.key) == node]
        before = {(a.key, b.key) for a in keys for b in keys if a is not b and _precedes(a, b, catalog)}
        for a, b in before:
            if (b, a) in before:
                out.append(Feedback(CYCLE, a, f"groups {a} and {b} are ordered oppositely in the two models"))
                return out
    return out


def _precedes(a, b, catalog) -> bool:
    # Some member of a comes before some member of b in the same segment: a must run first.
    for ma in a.members:
        for mb in b.members:
            ia, ib = catalog[ma], catalog[mb]
            if (ia.model, ia.segment) == (ib.model, ib.segment) and ia.position < ib.position:
                return True
    return False


def annotate_proportions(plan: JointPlan, catalog: dict[str, OpInfo]) -> JointPlan:
    """The plan with each group's interleaving proportions filled in (derived, never searched)."""
    props = {g.key: member_proportions(catalog, g.members) for g in plan.groups}
    return replace(plan, proportions=props)
