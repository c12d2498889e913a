"""A conjugated group made executable: its members' operands copied into static buffers, one kernel.

The interleaved kernels bind operand addresses when their descriptor table is built (so a launch needs
no host work and can be captured). Activations are produced afresh by the ops before the group, so each
member's inputs are first copied into the group's static buffers; the outputs stay in static buffers that
the following ops read. The copies are real work that the timing of the whole round includes (a later
step can let the producing ops write into the buffers directly).
"""

from __future__ import annotations

import math

import torch

from .grouped_gemm import GemmMember, GroupedGemm
from .interleaved_rows import AddMember, InterleavedAdd, InterleavedRMSNorm, RMSNormMember
from .plan import ConjugatedGroup
from .segments import Op


class RealizedGroup:
    """Runs ``ops`` (one per member, any model) as one interleaved kernel over ``state`` dicts."""

    def __init__(self, group: ConjugatedGroup, members: list[tuple[Op, dict]], device):
        self.group, self.members = group, members
        cfg = group.config
        self.copies: list[tuple[torch.Tensor, str, dict]] = []  # (static buffer, slot, state)
        self.outputs: list[tuple[torch.Tensor, str, tuple, dict]] = []  # (buffer, slot, shape, state)
        kernel_members, outs = [], []
        for op, state in members:
            rows = math.prod(op.shape[:-1])
            out = torch.empty(rows, op.shape[-1], dtype=op.dtype, device=device)
            if group.family == "gemm":
                lin = op.operand["linear"]
                x = torch.empty(rows, lin.weight.shape[1], dtype=op.dtype, device=device)
                kernel_members.append(GemmMember(x, lin.weight, lin.bias, cfg.split_k))
                self.copies.append((x, op.reads[0], state))
            elif group.family == "rmsnorm":
                norm = op.operand["norm"]
                x = torch.empty(rows, norm.weight.shape[0], dtype=op.dtype, device=device)
                kernel_members.append(RMSNormMember(x, norm.weight, norm.eps))
                self.copies.append((x, op.reads[0], state))
            elif group.family == "add":
                a = torch.empty_like(out)
                b = torch.empty_like(out)
                kernel_members.append(AddMember(a, b))
                self.copies += [(a, op.reads[0], state), (b, op.reads[1], state)]
            else:
                raise ValueError(f"no interleaved kernel for family {group.family!r}")
            outs.append(out)
            self.outputs.append((out, op.writes, tuple(op.shape), state))
        if group.family == "gemm":
            self.kernel = GroupedGemm(
                kernel_members,
                outs,
                block_m=cfg.block_m,
                block_n=cfg.block_n,
                block_k=cfg.block_k,
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
            )
        elif group.family == "rmsnorm":
            self.kernel = InterleavedRMSNorm(kernel_members, outs)
        else:
            self.kernel = InterleavedAdd(kernel_members, outs, block=cfg.block)

    def run(self) -> None:
        for buf, slot, state in self.copies:
            buf.copy_(state[slot].reshape(buf.shape))
        self.kernel()
        for buf, slot, shape, state in self.outputs:
            state[slot] = buf.view(shape)
