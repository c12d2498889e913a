"""A gate in a captured round: one program that waits while a device flag is set (Triton).

Why: a prompt that arrives while the server's rounds run is prefilled beside them on a stream of higher
priority (``RowBatch._overtake``). Stream priority orders the blocks waiting for an SM, but between two of
the prefill's kernels the round's next kernel can take the SMs, so the two may alternate and share the weight
stream. On the H100 (lifted 8B, 16 closed-loop clients, 4103eb1, benchmarks/results/batched_4103eb1_h100.json)
45-47 of the 48 prompts that came while rounds ran overtook them, yet TTFT p50 was 18.0 ms for AR and 24.2
for the speculative rounds, much as without overtaking (18.1 and 24.9, d91641b), against a ~12.6 ms prefill.
With a few of these gates between a round's layers the round stops at the next one while the flag is set,
and the prefill runs alone until it clears the flag (``hold`` and ``release``, on its stream). Measured
(batched_gates_ab_h100.json, one run a side): TTFT p50 on / off AR 18.3 / 20.3 ms, the speculative rounds
27.2 / 27.7, throughput unchanged; the gap to AR's TTFT has other causes (README, "Round gates").

``wait_while_held(flag)`` costs one launch of one program (a few microseconds) when the flag is clear.
``wait_while_held_ref`` is the reference: the same wait, from the host.
"""

from __future__ import annotations

import time

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs without triton: the reference only
    triton = None

from .launch import runs_on

# Reads of the flag a gate makes at most before it goes on anyway: a bound, so that nothing (a prefill
# that raised before its release was enqueued, a host blocked on the device while the flag is set) can
# stop the rounds for good. Correctness never rests on the gate: the overtaking prefill and the rounds
# write different slots. Measured on the H100 (af7b241, a held flag, three runs each): 2**16 reads 10.0 ms,
# 2**18 39.6 ms, 2**20 158 ms, 2**22 632 ms (~150 ns a read). 2**20: a held gate waits at most ~160 ms,
# past the captured packed prefills the same H100's N = 16 server run measured (13-58 ms, one to four prompts).
SPINS = 1 << 20

_wait_while_held = None
if triton is not None:

    @triton.jit
    def _wait_while_held(flag_ptr, spins):
        # volatile: read L2 each time (another stream's kernel clears the flag), never a cached copy.
        held = tl.load(flag_ptr, volatile=True)
        n = 0
        while (held != 0) & (n < spins):
            held = tl.load(flag_ptr, volatile=True)
            n += 1


def wait_while_held(flag: torch.Tensor, spins: int = SPINS) -> None:
    """Enqueue, on the current stream, a wait until ``flag`` (int32 [1]) reads 0, or ``spins`` reads have
    passed; where the kernel cannot run (a CPU tensor outside the interpreter), the reference waits."""
    if runs_on(flag, _wait_while_held):
        _wait_while_held[(1,)](flag, spins)
    else:
        wait_while_held_ref(flag, spins)


def wait_while_held_ref(flag: torch.Tensor, spins: int = SPINS, poll_s: float = 1e-4) -> None:
    """The reference: the host reads ``flag`` until it is 0 or ``spins`` reads have passed (``poll_s``
    apart)."""
    n = 0
    while int(flag[0]) != 0 and n < spins:
        time.sleep(poll_s)
        n += 1


def hold(flag: torch.Tensor) -> None:
    """Set ``flag`` on the current stream: gates that run after this wait."""
    flag.fill_(1)


def release(flag: torch.Tensor) -> None:
    """Clear ``flag`` on the current stream: waiting gates go on."""
    flag.fill_(0)
