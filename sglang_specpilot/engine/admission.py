"""Prompt admission (issue 18, mechanism 3): a new prompt's prefill rides in the next round's verify pass.

When.  A prompt that arrives while rows are running would, without admission, wait for the round in
flight and then hold every running row back for its own prefill, a second pass over the target's
weights. With ``EngineOptions.prompt_admission`` = A > 0 it is parked in its row instead and its prefill
joins the target forward of the next round (``models.mixed_forward``): the projections and the MLP read
each weight once for the round's verify block and the prompt's chunk together. With no row running there
is no round to ride on and nothing to wait for: the prompt is prefilled at once, as without admission.

TTFT.  Only prompts that fit in one pass ride (at most A prompt tokens and ``RIDER_SLOTS`` prompts per
round, A at most one prefill chunk), so a riding prompt's first token comes out of the very round that
carries it: the round its separate prefill would have waited for. Other prompts take the separate prefill
at once rather than wait for a later round. Where it was measured (CUDA warm-up, ``measure_costs``), a
prompt rides only if a carrying round of its bucket and width took no longer than the separate prefill
of that shape, so its first token comes no later than without admission. Two rounds may carry
(``carry_kinds``): the one the policy runs at the bucket, and the keep-up AR round where automatic off
has one. On the H200 (lifted 8B, bucket 16, 2bcb6d1) a 64-token prompt's separate prefill took 7.0 ms,
less than the speculative round alone (7.9 ms), so no speculative round can carry it within that bound;
the AR round (4.9 ms alone) may, and then the running rows get a token in the time the prefill alone
would have taken. The separate prefill is packed where the engine packs it (``packed_prefill``: the
prompt's row alone), else it pads every row up to the highest one in use.

Starvation.  A rider never replaces a round: every step still runs one round for every running row, and
A bounds what a round carries besides its own work. A parked prompt rides the next round.

Layout. The riders are packed (one row of ``width`` tokens each, ``RIDER_SHAPES``; unused slots write
scratch slots of row 0), so a round carries only their tokens; a riding row sits parked at ``max_seq_len``
(in_use False) in the round's own group, so neither group touches the other's slots. The drafter's prefill
of the new rows follows in the same step, packed as the separate prefill packs it
(``packed_prefill.draft_prefill``: the riders' rows alone); an EAGLE-3 drafter reads the target features the
rider returns. ``carry`` is tensor work with shapes fixed by (bucket, width, riders): on CUDA each (round
kind, bucket, width, riders) is captured as a CUDA graph (``CarryingGraphs``), since an eager tree round
costs many times its graph replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.mixed_forward import Group
from .host_copy import to_device
from .packed_prefill import draft_prefill
from .runner import side_stream_warmup
from .sampling import next_tokens, nonfinite_rows

# /metrics labels of the decisions: rode in the verify pass; took the separate prefill because nothing was
# running, the prompt is longer than the allowance, the round's allowance or slots were taken by earlier
# prompts, the carrying round was measured slower than the separate prefill, or the carrying round failed.
RIDE, IDLE, LONG, FULL, SLOWER, FALLBACK = "verify", "idle", "long", "full", "slower", "fallback"
RIDER_SLOTS = 2  # prompts one round carries at most
# Packed rider rows a carrying round's shape holds: one per rider, so a lone rider (most admissions) carries
# no second slot of the width's tokens: at bucket 16 the verify block is 16 to 144 rows, and a second
# 256-token slot doubled what the prompts added to GEMMs already past the H200's ridge (~200 rows).
RIDER_SHAPES = tuple(range(1, RIDER_SLOTS + 1))


def admission_path(
    n_prompt: int, running: int, room: int, allowance: int, slots_free: int = 1, cost: tuple | None = None
) -> str:
    """RIDE when a round will run anyway (``running`` rows), a rider slot is free, the prompt fits the
    ``room`` left of the next round's ``allowance`` and, where ``cost`` = (carrying round ms, separate
    prefill ms) was measured, carrying is no slower; else why it takes the separate prefill."""
    if running == 0:
        return IDLE
    if n_prompt > allowance:
        return LONG
    if n_prompt > room or slots_free <= 0:
        return FULL
    return SLOWER if cost is not None and cost[0] > cost[1] else RIDE


def rider_width(n: int, cap: int) -> int:
    """The rider's padded width for a longest prompt of ``n`` tokens: 64, 128, 256, ... (few captured
    shapes), at most ``cap`` (the cache's scratch slots, which unused slots write)."""
    w = 64
    while w < n:
        w *= 2
    return min(w, cap)


def rider_widths(allowance: int, cap: int) -> list[int]:
    return sorted({rider_width(n, cap) for n in range(1, allowance + 1)})


@dataclass
class Riders:
    """Static inputs of a carrying step: ``rows`` [S] the riders' rows (unused: 0), ``lens`` [S] their prompt
    lengths (unused: 0), and the padded ``width``; S one of ``RIDER_SHAPES``."""

    rows: torch.Tensor
    lens: torch.Tensor
    width: int

    @classmethod
    def empty(cls, width: int, device, slots: int) -> Riders:
        z = torch.zeros(slots, dtype=torch.long, device=device)
        return cls(z, z.clone(), width)

    def fill(self, rows: list[int], lens: list[int]) -> None:
        pad = self.rows.shape[0] - len(rows)
        self.rows.copy_(to_device(rows + [0] * pad, self.rows.device))
        self.lens.copy_(to_device(lens + [0] * pad, self.lens.device))


class _Rider:
    # What ``ModelRunner._ride`` reads: the target group, and where the group's result lands.
    def __init__(self, group: Group):
        self.group, self.out = group, None


def carry(engine, rnd, st, b: int, bs, riders: Riders, max_len: int | None) -> torch.Tensor:
    """Round ``rnd`` over rows 0 .. b - 1 with the riders' prefill in its target forward, then the drafter's
    prefill of their rows, their first tokens and their rows' state. Tensor ops only (no host read): on CUDA
    this runs inside a CUDA graph. Returns [b, 2]: each row's first token and non-finite flag (riders' rows)."""
    dev, max_seq, W = engine.device, engine.options.max_seq_len, riders.width
    rows, lens, used = riders.rows, riders.lens, riders.lens > 0
    seq = torch.where(used, 0, max_seq)  # unused slots write past max_seq: scratch
    slots = seq[:, None] + torch.arange(W, device=dev)
    pos = torch.arange(W, device=dev).expand(rows.shape[0], W)
    last_row = (lens - 1).clamp(min=0)[:, None]
    group = Group(
        st.history[rows, :W], pos, slots, None, rows, logit_rows=last_row, feature_layers=engine.feature_layers
    )
    rider = _Rider(group)
    engine.target_runner.rider = rider
    rnd.run(st, b, bs, max_len)
    if engine.target_runner.rider is not None or rider.out is None:
        engine.target_runner.rider = None
        raise RuntimeError("the round ran no target forward to carry the prompts' prefill")
    logits, feats = rider.out if engine.feature_layers is not None else (rider.out, None)
    # Per row of the bucket (index_add: unused slots add zeros, so they never clobber a rider's row).
    lens_b = torch.zeros(b, dtype=torch.long, device=dev).index_add_(0, rows, lens)
    riding = lens_b > 0
    logits = torch.where(used[:, None], logits[:, 0], 0)  # where, not a product: 0 * inf would be NaN
    last = torch.zeros(b, logits.shape[-1], dtype=logits.dtype, device=dev).index_add_(0, rows, logits)
    draft_prefill(engine, b, group, used, feats)  # packed: the riders' rows alone
    first = next_tokens(last, bs)
    bad = nonfinite_rows(last) & riding
    st.next_tok[:b] = torch.where(riding, first, st.next_tok[:b])
    st.seq_len[:b] = torch.where(riding, lens_b, st.seq_len[:b])
    st.in_use[:b] = torch.where(riding, ~bad, st.in_use[:b])  # a row with bad logits fails when read back
    return torch.stack([first, bad.long()], 1)


def carry_kinds(engine, b: int) -> list:
    """The round kinds that may carry prompts at bucket ``b``, captured and timed at warm-up: the kind the
    policy's full depth runs there (``round_kinds.kind_key``; None: the engine's own round), the chain kinds
    (``chain_kinds``), then the keep-up AR round where automatic off has one."""
    from .chain_kinds import chain_depth
    from .round_kinds import kind_key

    main = kind_key(engine, engine.round.shape.depth, b) if engine.kinds else None
    chains = [k for k in engine.kinds if chain_depth(k)]
    return [main, *chains] + (["ar"] if "ar" in engine.kinds else [])


def carry_kind(engine, b: int, width: int, preferred):
    """The kind the round carrying prompts of ``width`` at bucket ``b`` runs: ``preferred`` (the policy's
    choice) where its carrying round was measured no slower than the separate prefill, else the fastest
    measured one that is (``measure_costs``), else ``preferred``."""
    ms, cost = engine.carry_ms.get((b, width)), engine.admission_costs.get((b, width))
    if not ms or cost is None or (preferred in ms and ms[preferred] <= cost[1]):
        return preferred
    fastest = min(ms, key=ms.get)
    return fastest if ms[fastest] <= cost[1] else preferred


@torch.inference_mode()
def measure_costs(engine, ladder: tuple[int, ...]) -> tuple[dict, dict]:
    """On CUDA, at warm-up with no row in use (every write lands in scratch slots): per (bucket, width),
    the separate prefill one prompt of ``width`` tokens would take at that bucket (packed, the prompt's row
    alone, where the engine packs it; else the padded prefill of ``bucket`` rows, graphs where captured)
    and each ``carry_kinds`` round carrying it (its captured graph). Returns (``admission_costs``: (bucket,
    width) -> (the fastest carrying kind's ms, the prefill ms), and ``carry_ms``: (bucket, width) -> {kind:
    carrying ms}, from which ``carry_kind`` picks the kind that runs)."""
    from .packed_prefill import packed_prefill, worth_packing
    from .step_curve import measure

    costs, by_kind = {}, {}
    scratch = engine.options.max_seq_len  # the probe writes scratch slots only
    for b in ladder:
        for w in rider_widths(engine.options.prompt_admission, engine.target_runner.scratch):
            lens = [w] + [0] * (b - 1)
            if worth_packing(engine, lens):
                prefill_ms = measure(lambda b=b, lens=lens: packed_prefill(engine, lens, scratch), reps=5)
            else:
                prefill_ms = measure(lambda b=b, w=w: engine._prefill_probe(b, w), reps=5)
            ms = {  # one rider: most admissions bring one prompt, and the separate prefill timed is of one
                k: measure(lambda k=k, b=b, w=w: engine.carrying.replay((k, b, w, 1), [], []))
                for k in carry_kinds(engine, b)
            }
            by_kind[(b, w)] = ms
            costs[(b, w)] = (min(ms.values()), prefill_ms)  # a prompt rides where some kind fits
    return costs, by_kind


class CarryingGraphs:
    """``carry`` captured per (round kind, bucket, width, rider slots) on CUDA (greedy rounds), as ``CapturedRound``
    does for plain rounds: the warm-up runs park the bucket's rows past ``max_seq`` with no riders, so nothing
    lands in any request's slots, and the rows' state is restored afterwards. One memory pool for all: they are
    replayed one at a time."""

    def __init__(self, engine):
        self.engine = engine
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, Riders, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle()

    def __contains__(self, key) -> bool:
        return key in self._graphs

    @torch.inference_mode()
    def capture(self, key, rnd, bs) -> None:
        if key in self._graphs:
            return
        eng, st = self.engine, self.engine.state
        _, b, width, slots = key
        riders = Riders.empty(width, eng.device, slots)
        saved = [t[:b].clone() for t in st.row_tensors()]
        st.seq_len[:b] = eng.options.max_seq_len
        st.in_use[:b] = False
        side_stream_warmup(lambda: carry(eng, rnd, st, b, bs, riders, None))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = carry(eng, rnd, st, b, bs, riders, None)
        for t, v in zip(st.row_tensors(), saved, strict=True):
            t[:b].copy_(v)
        self._graphs[key] = (graph, riders, out)

    def replay(self, key, rows: list[int], lens: list[int]) -> torch.Tensor:
        graph, riders, out = self._graphs[key]
        riders.fill(rows, lens)
        graph.replay()
        return out
