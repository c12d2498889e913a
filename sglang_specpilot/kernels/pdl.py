"""Programmatic dependent launch (PDL, sm_90+): where the decode kernels launch with it.

A kernel launched with PDL may start while the kernel before it on the stream is still running; it calls
``gdc_wait`` before touching anything that kernel (or any earlier one) wrote, and every store of its own
comes after that wait too (its outputs may reuse memory the earlier kernel still reads). What it may do
before the wait is read what no kernel of the step writes, such as weights. A kernel that calls
``gdc_launch_dependents`` early lets the next PDL kernel start during its own run. A launch-bound decode
step (the real SmolLM2: ~200 kernels of 1.5-6 us a step) so overlaps each kernel's launch and weight fetch
with the kernel before it.

Inductor launches its own and ``wrap_triton`` kernels without the launch attribute (torch 2.11), so the
kernels that use PDL launch through opaque custom ops instead. ``SPECPILOT_PDL=0`` turns PDL off for A/B
runs in separate processes (the choice is baked into captured graphs); the kernels then launch as before.
"""

from __future__ import annotations

import functools
import os

import torch
import triton.language as tl

PDL = os.environ.get("SPECPILOT_PDL", "1") != "0"
# ``launch_pdl`` and ``tl.extra.cuda.gdc_wait`` are recent Triton features (the H200's 3.6 has both); an older
# Triton launches the kernels plainly.
TRITON_HAS_PDL = hasattr(getattr(getattr(tl, "extra", None), "cuda", None), "gdc_wait")


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def uses_pdl(x: torch.Tensor, interpreted: bool = False) -> bool:
    """Whether a kernel on ``x``'s device launches with PDL (never in the Triton interpreter)."""
    return PDL and TRITON_HAS_PDL and not interpreted and x.is_cuda and _capable(x.device.index or 0)
