"""Where a Triton kernel of this package runs: natively on a GPU tensor, or in the interpreter on a CPU tensor.

TRITON_INTERPRET=1 counts only if it was set before triton was imported, so the kernel object is asked
(``@triton.jit`` then makes an ``InterpretedFunction``), not the environment.
"""

from __future__ import annotations

import os

import torch

try:
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # pragma: no cover - CPU-only installs without triton
    InterpretedFunction = None


# The round's small-op kernels, on by default: on the H200 (benchmarks/results/round_kernels_ab_h200.json,
# real SmolLM2, separate processes, alternated, medians) they cut a captured tree-32 round from 2.533 to
# 1.947 ms (672 -> 420 kernels), a chain-6 round from 1.711 to 1.582 ms and an AR step from 0.563 to 0.543 ms.
# They run a lattice depth's selection and its children's writes as one launch each (lattice_step.py), the
# best-first tree and its verify masks as one each (tree_build.py), greedy tree acceptance as one
# (tree_accept.py), the EAGLE-3 head's and the target's final RMSNorm as one each (rms_norm.py), and a
# forward's embedding, feature concat and rope rows as one (embed_rope.py), where PyTorch runs ~30 kernels a
# draft depth, ~65 for the tree, 8 a norm and 4-5 a forward's inputs. SPECPILOT_ROUND_KERNELS=0 is the
# PyTorch path (the references). Read at call time (tests switch it).
ROUND_KERNELS = os.environ.get("SPECPILOT_ROUND_KERNELS", "1") == "1"


def interpreted(kernel) -> bool:
    """Whether ``kernel`` (a ``@triton.jit`` function) runs in the Triton interpreter."""
    return InterpretedFunction is not None and isinstance(kernel, InterpretedFunction)


def runs_on(t: torch.Tensor, kernel) -> bool:
    """Whether ``kernel`` can take ``t``: a CUDA tensor with a compiled kernel, a CPU one in the interpreter
    (``kernel`` None: triton is missing, never)."""
    if kernel is None:
        return False
    return interpreted(kernel) if not t.is_cuda else not interpreted(kernel)
