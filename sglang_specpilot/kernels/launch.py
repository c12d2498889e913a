"""Where a Triton kernel of this package runs: natively on a GPU tensor, or in the interpreter on a CPU tensor.

TRITON_INTERPRET=1 counts only if it was set before triton was imported, so the kernel object is asked
(``@triton.jit`` then makes an ``InterpretedFunction``), not the environment.
"""

from __future__ import annotations

import torch

try:
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # pragma: no cover - CPU-only installs without triton
    InterpretedFunction = None


def interpreted(kernel) -> bool:
    """Whether ``kernel`` (a ``@triton.jit`` function) runs in the Triton interpreter."""
    return InterpretedFunction is not None and isinstance(kernel, InterpretedFunction)


def runs_on(t: torch.Tensor, kernel) -> bool:
    """Whether ``kernel`` can take ``t``: a CUDA tensor with a compiled kernel, a CPU one in the interpreter
    (``kernel`` None: triton is missing, never)."""
    if kernel is None:
        return False
    return interpreted(kernel) if not t.is_cuda else not interpreted(kernel)
