"""Joint optimization plans (Conjugate Compilation, section 2.2), as plain JSON-serializable data.

A plan holds four things:

- conjugated operation groups: 2..Kmax independent operations from both models that share a kernel
  family (``gemm``, ``rmsnorm``, ``add``); operations outside every group keep their separate kernels;
- interleaving proportions: each member's share of the group's work, derived from the members (never
  searched; see ``ops.OpInfo.work``), recorded here so a stored plan says what ran;
- kernel configurations: tile sizes and reduction split per group;
- the scheduling arrangement: joint nodes J(i, j) pairing target segment i with draft segment j. They
  follow from the groups (a group's target ops lie in one segment i, its draft ops in one segment j), and
  the map i -> j must be injective and strictly increasing along both chains (``legality.py``).

An operation is named ``"<model>/<segment>/<op>"``, e.g. ``"target/L3.attn/qkv"`` or
``"draft/s1.L0.mlp/gate_up"`` (draft step 1, layer 0); ``ops.py`` lists the names of a round.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

FAMILIES = ("gemm", "rmsnorm", "add")
# Which side stream gets the higher CUDA priority (the block scheduler then serves its pending kernels
# first); "equal" is plain co-scheduling.
PRIORITIES = ("equal", "draft", "target")
DEFAULT_KMAX = 4


def op_model(op: str) -> str:
    return op.split("/", 1)[0]


def op_segment(op: str) -> str:
    return op.split("/")[1]


@dataclass(frozen=True)
class KernelConfig:
    """How a group's interleaved kernel is tiled; ``split_k`` cuts each GEMM member's reduction."""

    block_m: int = 16
    block_n: int = 64
    block_k: int = 64
    split_k: int = 1
    block: int = 1024  # elements per unit of a residual add
    num_warps: int = 4
    num_stages: int = 3

    def problems(self) -> list[str]:
        out = []
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                out.append(f"{name}={v} is not a power of two >= 16")
        if self.block < 16 or self.block & (self.block - 1):
            out.append(f"block={self.block} is not a power of two >= 16")
        if self.split_k < 1:
            out.append(f"split_k={self.split_k} < 1")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            out.append(f"num_warps={self.num_warps} / num_stages={self.num_stages} cannot launch")
        return out


# Grouped-GEMM configurations the kernel-gain gate tries for each new group (the fastest is kept). Decode
# GEMMs here are 4-40 rows against 4k-28k-wide weights, so every candidate reads weights in long K
# slices split over many units: on the H200 (Llama-8B down + Llama-1B down, 20 + 4 rows) the untuned
# 16x64x64 tile without split-K took 306 us against 47 us for the two cuBLAS calls, 32x32x64 with
# split-K 8 took 149 us; larger K steps and deeper pipelines are the remaining candidates.
GEMM_CANDIDATES = (
    KernelConfig(block_m=32, block_n=32, block_k=64, split_k=8),
    KernelConfig(block_m=32, block_n=64, block_k=128, split_k=8, num_warps=4, num_stages=4),
    KernelConfig(block_m=32, block_n=32, block_k=256, split_k=16, num_warps=4, num_stages=3),
    KernelConfig(block_m=16, block_n=64, block_k=256, split_k=8, num_warps=8, num_stages=3),
    KernelConfig(block_m=32, block_n=128, block_k=128, split_k=16, num_warps=8, num_stages=4),
)


def kernel_candidates(family: str) -> tuple[KernelConfig, ...]:
    """Configurations the gate tunes over for a new group of ``family`` (row kernels have one)."""
    return GEMM_CANDIDATES if family == "gemm" else (KernelConfig(),)


@dataclass(frozen=True)
class ConjugatedGroup:
    """Operations that run as one interleaved kernel of ``family``; ``members`` are sorted op names."""

    family: str
    members: tuple[str, ...]
    config: KernelConfig = field(default_factory=KernelConfig)

    def __post_init__(self):
        object.__setattr__(self, "members", tuple(sorted(self.members)))

    @property
    def key(self) -> str:
        return f"{self.family}[{','.join(self.members)}]"

    def to_dict(self) -> dict:
        return {"family": self.family, "members": list(self.members), "config": asdict(self.config)}

    def with_config(self, config: KernelConfig) -> ConjugatedGroup:
        return replace(self, config=config)

    @classmethod
    def from_dict(cls, d: dict) -> ConjugatedGroup:
        return cls(d["family"], tuple(d["members"]), KernelConfig(**d.get("config", {})))


@dataclass(frozen=True)
class JointNode:
    """J(i, j): target segment ``target`` rendezvous with draft segment ``draft`` (indices in each chain)."""

    target: int
    draft: int


@dataclass(frozen=True)
class JointPlan:
    """A complete joint optimization plan; the empty plan is co-scheduling alone (the anchor).

    ``interleave`` False realizes every group with its members' separate kernels while keeping the
    joins and forks: the placement control of the timing protocol. ``priority`` is part of the scheduling
    arrangement: which model's stream the GPU serves first when both have work ready (``PRIORITIES``).
    """

    groups: tuple[ConjugatedGroup, ...] = ()
    interleave: bool = True
    kmax: int = DEFAULT_KMAX
    memory_budget_bytes: int = 64 << 20
    proportions: dict = field(default_factory=dict, compare=False, hash=False)
    priority: str = "equal"

    def __post_init__(self):
        object.__setattr__(self, "groups", tuple(sorted(self.groups, key=lambda g: g.key)))

    @property
    def key(self) -> str:
        """A canonical identity: equal plans have equal keys (used to dedupe search nodes)."""
        key = ";".join(g.key for g in self.groups) or "<empty>"
        return key if self.priority == "equal" else f"{key}|priority={self.priority}"

    def ops(self) -> list[str]:
        return [m for g in self.groups for m in g.members]

    def with_groups(self, groups) -> JointPlan:
        return replace(self, groups=tuple(groups), proportions={})

    def control(self) -> JointPlan:
        """The placement control of this plan: same joint nodes, separate kernels."""
        return replace(self, interleave=False, proportions=dict(self.proportions))

    def to_dict(self) -> dict:
        return {
            "groups": [g.to_dict() for g in self.groups],
            "interleave": self.interleave,
            "kmax": self.kmax,
            "memory_budget_bytes": self.memory_budget_bytes,
            "proportions": {k: dict(v) for k, v in self.proportions.items()},
            "priority": self.priority,
        }

    @classmethod
    def from_dict(cls, d: dict) -> JointPlan:
        return cls(
            tuple(ConjugatedGroup.from_dict(g) for g in d.get("groups", [])),
            bool(d.get("interleave", True)),
            int(d.get("kmax", DEFAULT_KMAX)),
            int(d.get("memory_budget_bytes", 64 << 20)),
            {k: dict(v) for k, v in d.get("proportions", {}).items()},
            str(d.get("priority", "equal")),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> JointPlan:
        return cls.from_dict(json.loads(s))
