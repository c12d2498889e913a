"""Small host values onto the device without waiting for the device.

Why. ``torch.tensor(values, device="cuda")`` copies from pageable memory, and ATen makes a blocking
host-to-device copy with ``cudaMemcpyAsync`` then ``cudaStreamSynchronize`` of the current stream
(``memcpy_and_sync``): the host waits for every kernel queued on it. In the serving loop that stream holds the
rounds in flight (under the one-round lookahead, round t running and t + 1 queued behind it), so each such call
stalled the scheduler until both were done. Two places paid it:

- ``BatchSampling.from_params``, which the loop rebuilds after every admission and every finished request: the
  next round could be launched only after the queued one had finished, so the GPU idled for the host's launch
  path once per membership change;
- ``RowBatch._start_rows`` after an overtaking prefill (``_overtake``): the first token, already on the host,
  was stamped and emitted only after rounds t and t + 1.

The measurement that points there (H100, lifted 8B, 16 closed-loop clients, d037458, 2026-12-07, the batched
suite's per-request parts): admission to first token took 14.6-15.1 ms for AR at prompts of up to 64 tokens and
15.0-16.4 ms up to 128, in a narrow band, while the captured prefill of about 5 prompts of up to 316 tokens took
14.4 ms on the stream; the speculative rounds took 18.0-19.2 ms at the same widths (one of 15 at 27.9), about what
their longer rounds (9.4 against 6.2 ms) add if the first token waits for round t + 1. Clients submit right after
their last token, so they arrive early in round t, which explains the narrow band. Not measured yet: the A/B of
this module (``benchmarks/device/host_copy_check.sh``); no device time was left in the session that wrote it.

What. The values go through pinned memory and a non-blocking copy on the current stream: the copy is ordered
after the queued kernels, as before, but the host goes on. The pinned buffer comes from torch's caching host
allocator, which keeps it until the copy has run. Off CUDA it is ``torch.tensor(values).to(device)``. None of
the callers runs inside a graph capture (a blocking copy there would have raised). ``SPECPILOT_BLOCKING_COPIES=1``
restores the blocking copies, for A/B runs in separate processes.
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
