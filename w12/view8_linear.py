"""``W12View8Linear``: the 8-bit view of a ``W12Linear``, sharing its buffers (no copy of the weights).

Two-level verification's Q pass runs the same model with every W12 projection read through the view8
GEMM (hi plane only). A second module per projection, holding the very same tensors, lets a twin of the
model (``models.w12_weights.view8_twin``) run that pass while the exact model stays as it is: no flag to
flip around a forward (which a captured graph or a compiled block would freeze at its first value).
The buffers are non-persistent, so the view adds nothing to any state dict. Rebinding ``hi`` on the view
(a test zeroing it, say) changes the view alone.
"""

from __future__ import annotations

from torch import nn

from w12.linear import W12Linear

# With the kernels' escape lists (``pad_escapes``): a view made after its exact module was padded reads the
# same padded lists, and ``align_w12_escapes`` on the view's own model pads the view alike.
_SHARED = ("hi", "lo", "base", "esc_idx", "esc_val", "bias", "esc_row_ptr", "counters", "kernel_esc_idx",
           "kernel_esc_val")  # fmt: skip


class W12View8Linear(W12Linear):
    """``forward`` is ``W12Linear.forward_view8`` over the exact module's own buffers."""

    def __init__(self, exact: W12Linear):
        nn.Module.__init__(self)  # not W12Linear.__init__: it would build new buffers from a record
        self.in_features, self.out_features = exact.in_features, exact.out_features
        for name in _SHARED:
            self.register_buffer(name, getattr(exact, name), persistent=False)
        self.backend = exact.backend

    def forward(self, x):
        return self.forward_view8(x)
