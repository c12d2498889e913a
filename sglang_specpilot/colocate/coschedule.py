"""The co-scheduled round: the target's chain and the draft's chain on two CUDA streams.

Host issue order walks the joint nodes J(i, j) of the plan in increasing i (and so increasing j):

    target stream:  segments < i ........ wait(draft reached j) J(i, j) record ...
    draft stream:   segments < j  record ............................. wait(J done) segments > j ...

Both side streams first wait on the caller's stream (fork) and the caller waits on both at the end
(join); besides that, events exist only where a joint node needs them: the target stream joins the draft
before J(i, j), and the draft resumes after it. With no joint nodes (the anchor) the two chains share
nothing but the fork and the join. The whole round is capturable as one CUDA graph (``capture``).

Inside J(i, j) both segments run on the target stream; ops not in a group run their own kernels, in
segment order, and each group runs as one interleaved kernel (or, for the placement control, as its
members' separate kernels at the same place). On the CPU there are no streams: the same issue order runs
sequentially, which computes the same values.
"""

from __future__ import annotations

import contextlib

import torch

from .legality import check_plan, joint_nodes
from .plan import JointPlan
from .realize import RealizedGroup
from .segments import Chain


class PlanError(ValueError):
    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("; ".join(f"{p.code}: {p.detail}" for p in self.problems))


class _Streams:
    """Two side streams and the events between them; every method is a no-op off CUDA."""

    def __init__(self, device: torch.device, priority: str = "equal"):
        self.cuda = device.type == "cuda"
        if self.cuda:
            # CUDA stream priorities: lower is higher; -1 is the highest torch exposes on every GPU. Kernel
            # nodes captured from a stream keep its priority in the graph.
            prio = {"target": -1 if priority == "target" else 0, "draft": -1 if priority == "draft" else 0}
            self.target = torch.cuda.Stream(device, priority=prio["target"])
            self.draft = torch.cuda.Stream(device, priority=prio["draft"])

    def on(self, which: str):
        if not self.cuda:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.target if which == "target" else self.draft)

    def fork(self) -> None:
        if self.cuda:
            cur = torch.cuda.current_stream()
            self.target.wait_stream(cur)
            self.draft.wait_stream(cur)

    def signal(self, src: str, dst: str) -> None:
        """``dst`` waits for the work issued on ``src`` so far (one event)."""
        if self.cuda:
            s, d = (self.target, self.draft) if src == "target" else (self.draft, self.target)
            ev = torch.cuda.Event()
            ev.record(s)
            d.wait_event(ev)

    def join(self) -> None:
        if self.cuda:
            cur = torch.cuda.current_stream()
            cur.wait_stream(self.target)
            cur.wait_stream(self.draft)


class CoScheduledRound:
    """Run ``target`` and ``draft`` chains co-scheduled under ``plan`` (None or empty: the anchor).

    Parameters
    ----------
    target, draft : Chain
        The verification forward of one request group and the gamma draft steps of the other.
    plan : JointPlan, optional
        Checked with ``check_plan``; an illegal plan raises ``PlanError`` carrying its feedback codes.
    streams : bool
        False runs both chains on the caller's stream (the conventional round: draft, then target).
    """

    def __init__(
        self, target: Chain, draft: Chain, plan: JointPlan | None = None, *, device=None, streams: bool = True
    ):
        self.target, self.draft = target, draft
        self.plan = plan or JointPlan()
        self.catalog = {**target.catalog(), **draft.catalog()}
        problems = check_plan(self.plan, self.catalog)
        if problems:
            raise PlanError(problems)
        device = torch.device(device or "cpu")
        self.streams = _Streams(device, self.plan.priority) if streams else _Streams(torch.device("cpu"))
        self.nodes = self._nodes(device)
        self.graph = None

    def _nodes(self, device):
        placed = joint_nodes(self.plan, self.catalog)
        chains = {"target": self.target, "draft": self.draft}
        by_node: dict[tuple[int, int], list] = {}
        for g in self.plan.groups:
            n = placed[g.key]
            by_node.setdefault((n.target, n.draft), []).append(g)
        nodes = []
        for (i, j), groups in sorted(by_node.items()):
            # Order groups by their target position (legality guarantees the draft order agrees).
            groups.sort(key=lambda g: min(self.catalog[m].position for m in g.members if m.startswith("target/")))
            units = []
            for g in groups:
                ops = []
                for m in g.members:
                    info = self.catalog[m]
                    ch = chains[info.model]
                    ops.append((info.model, info.position, ch.segments[info.segment].ops[info.position], ch.state))
                per_model = [o[0] for o in ops]
                if len(set(per_model)) != len(per_model):
                    # Our segments are dependency chains, so two ops of one segment are never independent.
                    raise NotImplementedError("groups with two members from one segment")
                realized = None
                if self.plan.interleave:
                    realized = RealizedGroup(g, [(op, st) for _, _, op, st in ops], device)
                units.append((g, {mo: pos for mo, pos, _, _ in ops}, realized))
            nodes.append((i, j, units))
        return nodes

    def _run_joint(self, i: int, j: int, units) -> None:
        segs = {"target": self.target.segments[i], "draft": self.draft.segments[j]}
        states = {"target": self.target.state, "draft": self.draft.state}
        nxt = {"target": 0, "draft": 0}
        for _g, positions, realized in units:
            for model, pos in positions.items():
                for op in segs[model].ops[nxt[model] : pos]:
                    op.run(states[model])
            if realized is not None:
                realized.run()
            else:  # placement control: the members' own kernels, at the group's place
                for model, pos in positions.items():
                    segs[model].ops[pos].run(states[model])
            for model, pos in positions.items():
                nxt[model] = pos + 1
        for model in ("target", "draft"):
            for op in segs[model].ops[nxt[model] :]:
                op.run(states[model])

    def run(self) -> None:
        """Issue the whole round (eagerly, or into a capture)."""
        S, T, D = self.streams, self.target, self.draft
        S.fork()
        ti = dj = 0
        for i, j, units in self.nodes:
            with S.on("target"):
                for seg in T.segments[ti:i]:
                    seg.run(T.state)
            with S.on("draft"):
                for seg in D.segments[dj:j]:
                    seg.run(D.state)
            S.signal("draft", "target")
            with S.on("target"):
                self._run_joint(i, j, units)
            S.signal("target", "draft")
            ti, dj = i + 1, j + 1
        if not S.cuda:
            # Off CUDA, or the conventional round: the draft first, as the engine runs it.
            for seg in D.segments[dj:]:
                seg.run(D.state)
            for seg in T.segments[ti:]:
                seg.run(T.state)
        else:
            with S.on("target"):
                for seg in T.segments[ti:]:
                    seg.run(T.state)
            with S.on("draft"):
                for seg in D.segments[dj:]:
                    seg.run(D.state)
        S.join()

    def capture(self, warmup: int = 2) -> None:
        """Capture the round into one CUDA graph (inputs must live in the chains' static buffers)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self.run()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.run()

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.run()
