"""Small host values onto the device without waiting for the device.

Why. ``torch.tensor(values, device="cuda")`` copies from pageable memory, and a blocking host-to-device copy
synchronizes the current stream: the host waits for every kernel queued on it. In the serving loop that stream
holds the rounds in flight (the one-round lookahead keeps one queued behind the one running), so each such
call stalled the scheduler until they were done. Two places paid it:

- ``BatchSampling.from_params``, which the loop rebuilds after every admission and every finished request:
  the next round was launched only after the one in flight had finished, so the GPU idled for the host's
  launch path, once per membership change;
- ``RowBatch._start_rows`` after an overtaking prefill (``_overtake``): the first token went to the client
  only after the rounds in flight, though it was on the host already. Measured on an H100 (lifted 8B, 16
  closed-loop clients, d037458, 2026-12-07): admission to first token took 14.6 ms for AR at a 64-token
  prompt while its whole packed prefill of 5 prompts took 14.4, and 3-4 ms more for the speculative rounds,
  whose rounds are that much longer (9.4 against 6.2 ms).

What. The values go through pinned memory and a non-blocking copy on the current stream: the copy is ordered
after the queued kernels, as before, but the host goes on. The pinned buffer comes from torch's caching host
allocator, which keeps it until the copy has run. Off CUDA it is ``torch.tensor(values).to(device)``.
``SPECPILOT_BLOCKING_COPIES=1`` restores the blocking copies, for A/B runs in separate processes.
"""

from __future__ import annotations

import os

import torch

BLOCKING = os.environ.get("SPECPILOT_BLOCKING_COPIES", "0") == "1"


def to_device(values, device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype)`` on ``device``; on CUDA without a host sync (see above)."""
    t = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda" or BLOCKING:
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
