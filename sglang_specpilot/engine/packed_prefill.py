"""Packed prefill: a prompt admitted beside running rows is prefilled alone, not with every row of the batch.

Why. The batch prefill (``Engine._prefill``) pads, it does not pack: it runs rows 0 .. hi - 1 of the cache
at the chunk's width, and rows with nothing to prefill write their share into scratch slots. That costs
nothing extra when every row is new (``generate``, a wave of requests), but a server admits a request into
a running batch one or two at a time. On an H100 (lifted 8B, 16 closed-loop clients, deb4aa8,
batched_mechanisms_h100.json) the separate prefill of one prompt at bucket 16 measured 34 / 65 / 129 ms at
64 / 128 / 256 tokens (the step curve's admission costs) against 6.4 ms for a whole AR round, and the
mechanisms served 0.81x AR's tokens/s while their rounds alone (250 at the step curve's 9.6 ms) would have
served more than AR.

What. The new rows' first chunk goes through the target as one packed group (``models.mixed_forward``: a
[S, W] block in the rows a tensor names; causal attention over the chunk's own K/V, scattered into those
rows' slots), so it costs the new rows, not every row. The drafter follows, packed too: a Transformer
drafter through ``mixed_forward`` the same way; an EAGLE-3 drafter's one layer needs only its K/V
(``Eagle3Layer.write_kv``, fed the target's features one position earlier), written into the new rows.

Captured. Eager, the packed prefill of one 64-token prompt took 25.9 ms of wall time for 10.5 ms of GPU
work (1,518 kernels; H100, lifted 8B, 47ae92f, admit_profile.json), so where rounds are captured it is a
pair of CUDA graphs per (bucket, slots, width) (``PackedGraphs``: the target's half, then the drafter's):
the new rows fill ``SLOT_BUCKETS`` slots (unused slots prefill row 0's scratch slots and keep nothing), the
width is rounded up to a power of two (64, 128, ..., the chunk), and the batch to its bucket. Those are
captured at warm-up for buckets above ``PREFILL_GRAPH_MAX_BATCH`` (up to that the padded prefill replays
its own graphs). Elsewhere (the CPU, more new rows than a slot bucket holds) it runs eagerly with one slot per
new row, where padding would at least double the rows run and the padded prefill replays no graph.

Waves. Prompts that arrive together (``generate``, or a closed loop's clients whose requests ended in one
round) fill every row, so the padded prefill pads only in width, to the longest prompt. Where that would run
at least twice the slots, the eager pass packs the new rows in width tiers instead (``width_tiers``: each
tier at its own longest prompt's width, all tiers in one ``mixed_forward``, so the weights are still read
once), which ``worth_tiering`` decides from the lengths alone.
"""

from __future__ import annotations

import logging
import os

import torch

from ..models.linear import own_counters
from ..models.llama import Transformer
from ..models.mixed_forward import Group, mixed_forward
from .host_copy import to_device
from .runner import PREFILL_GRAPH_MAX_BATCH, side_stream_warmup

log = logging.getLogger("specpilot.engine")

# Packed where the padded prefill would run at least this many times the new rows. Not measured: a margin
# for the eager launches, well inside the 16x that one prompt admitted at bucket 16 paid (above).
MIN_PAD_FACTOR = 2

# New rows a captured packed prefill holds (the fewest that fit); more new rows than the largest run eagerly.
# A server admits one or two at a time (batched suite, 16 clients: 64 requests in 40 admissions).
SLOT_BUCKETS = (1, 2, 4, 8)

# An A/B switch for benchmarks run in separate processes (SPECPILOT_PACKED_PREFILL=0: always the padded batch
# prefill, as before); packing is the default.
PACKED = os.environ.get("SPECPILOT_PACKED_PREFILL", "1") != "0"


def packable(engine) -> bool:
    """Whether this engine's prefill may pack at all: a plain attention target outside TLV and co-located
    rounds (their prefill keeps state this path does not write), with no drafter, a Transformer drafter or
    an EAGLE-3 one (the two kinds ``_core`` writes)."""
    o = engine.options
    return (
        PACKED
        and engine.target_runner.recurrent is None
        and not o.tlv
        and not o.colocate
        and isinstance(engine.target, Transformer)
        and (engine.draft is None or engine.feature_layers is not None or isinstance(engine.draft, Transformer))
    )


def worth_packing(engine, lens: list[int]) -> bool:
    """Whether ``Engine.prefill_rows`` packs these rows: a packable engine, some rows in range have nothing
    to prefill (at least half of them), every prompt fits one chunk, and either a captured packed prefill
    holds them or the padded prefill would not replay a captured graph."""
    new = sum(n > 0 for n in lens)
    if not (packable(engine) and 0 < new and new * MIN_PAD_FACTOR <= len(lens)):
        return False
    if max(lens) > engine.options.prefill_chunk:
        return False
    graphs = engine.packed_graphs
    if graphs is not None and graphs.key(len(lens), new, max(lens)) in graphs:
        return True
    return not (engine.target_runner.use_graphs and len(lens) <= PREFILL_GRAPH_MAX_BATCH)


def width_tiers(lens: list[int], chunk: int) -> list[list[int]]:
    """The rows with ``lens[b] > 0`` grouped by the power-of-two width their prompt rounds up to (64, 128,
    256, ..., the chunk: ``graph_width``), narrowest first. Each tier runs at its own longest prompt's
    width, so a prompt is padded to at most about twice its length (up to 64 tokens for short ones), and a
    pass holds at most log2(chunk / 64) + 1 tiers, each one more attention call a layer."""
    tiers: dict[int, list[int]] = {}
    for i, n in enumerate(lens):
        if n > 0:
            tiers.setdefault(graph_width(n, chunk), []).append(i)
    return [tiers[w] for w in sorted(tiers)]


def worth_tiering(engine, lens: list[int]) -> bool:
    """Whether ``Engine.prefill_rows`` packs a wave (several new rows, each prompt one chunk) in width tiers
    (``width_tiers``): where the padded prefill, which runs every row in range at the longest prompt's
    width, would run at least ``MIN_PAD_FACTOR`` times the tiers' slots, and replays no graph of its own.

    Why: a closed-loop server's clients whose requests end together send their next prompts together. On the
    H100 (lifted 8B, 64 clients x 128 tokens, 2ab09a6, batched_742b745_h100.json's serve_loop_probe_n64) AR's four
    waves of 63 prompts (median ~100 tokens, longest 414) each took 848 ms padded to 64 x 414 slots, 3.4 s
    of its 7.1 s wall; one packed prompt took 10.4 ms. As tiers (937d7ec, H100, 64 clients x 128-256 tokens,
    batched_h100.json's serve_loop_probe_n64_n32_call4) AR's one wave of 62 (longest 425) took 332 ms, and
    its admissions 2.7 s of an 8.9 s wall (another session: not a paired A/B)."""
    new = [n for n in lens if n > 0]
    chunk = engine.options.prefill_chunk
    if not (packable(engine) and len(new) >= 2 and max(new) <= chunk):
        return False
    if engine.target_runner.use_graphs and len(lens) <= PREFILL_GRAPH_MAX_BATCH:
        return False
    from .engine import prefill_width

    padded = len(lens) * prefill_width(max(new), chunk)
    tiered = sum(len(t) * prefill_width(max(lens[i] for i in t), chunk) for t in width_tiers(lens, chunk))
    return padded >= MIN_PAD_FACTOR * tiered


def slot_bucket(n: int) -> int | None:
    return next((s for s in SLOT_BUCKETS if s >= n), None)


def graph_width(n: int, chunk: int) -> int:
    """A captured prefill's width for a longest prompt of ``n`` tokens: 64, 128, 256, ..., at most ``chunk``."""
    w = 64
    while w < n:
        w *= 2
    return min(w, chunk)


class PackedRows:
    """The inputs of one packed prefill, [S] each: ``rows`` the cache rows, ``lens`` the prompt lengths
    (0: an unused slot), ``base`` the first slot written (0; ``max_seq_len`` for an unused slot or the
    warm-up's cost probe, whose writes land in scratch slots and whose rows keep nothing)."""

    def __init__(self, rows: torch.Tensor, lens: torch.Tensor, base: torch.Tensor):
        self.rows, self.lens, self.base = rows, lens, base

    @classmethod
    def unused(cls, slots: int, max_seq: int, device) -> PackedRows:
        z = torch.zeros(slots, dtype=torch.long, device=device)
        return cls(z, z.clone(), torch.full_like(z, max_seq))

    def fill(self, rows: list[int], lens: list[int], base: int, max_seq: int) -> None:
        pad = self.rows.shape[0] - len(rows)
        dev = self.rows.device
        self.rows.copy_(to_device(rows + [0] * pad, dev))
        self.lens.copy_(to_device(lens + [0] * pad, dev))
        self.base.copy_(to_device([base] * len(rows) + [max_seq] * pad, dev))


def _core(engine, B: int, ins: PackedRows, W: int, commit: bool = True):
    """The packed prefill of ``ins`` in a batch of ``B`` rows at width ``W``: last-position logits [B, V]
    (zeros in rows not prefilled). Tensor work only, with shapes fixed by (B, S, W): capturable. With
    ``commit`` False it writes only the prompts' own K/V and returns (logits, ``Pending``): the round
    state they leave (``commit_pending``) is written apart, where the caller orders it."""
    return _core_parts(engine, B, [(ins, W)], commit)


def _core_parts(engine, B: int, parts: list[tuple[PackedRows, int]], commit: bool = True):
    """``_core`` for several groups of slots, each at its own width, in one target pass: the projections and
    the MLP read every weight once for all of them (``mixed_forward``), attention runs per group."""
    last, drafts = _target_parts(engine, B, parts)
    pending = _draft_parts(engine, B, drafts, commit)
    return last if commit else (last, pending)


def _target_parts(engine, B: int, parts: list[tuple[PackedRows, int]]):
    """The target's half of ``_core_parts``: (last-position logits [B, V], what the drafter's half reads:
    (group, keep, features) per group of slots). Tensor work only (capturable)."""
    st, dev, max_seq = engine.state, engine.device, engine.options.max_seq_len
    fl = engine.feature_layers
    groups, keeps = [], []
    for ins, W in parts:
        rows, lens, base = ins.rows, ins.lens, ins.base
        S = rows.shape[0]
        keeps.append((lens > 0, (lens > 0) & (base < max_seq)))  # admitted rows: probes keep no state
        pos = torch.arange(W, device=dev).expand(S, W)
        last_row = (lens - 1).clamp(min=0)[:, None]
        # Only the prompt's own slots: the padding past it (to W) writes the row's scratch slots, where no
        # round reads, so a prefill beside the rounds in flight (``RowBatch._overtake``) needs only the
        # prompt to end below what they write. Causal: the prompt's logits never see the padding.
        slots = torch.where(pos < lens[:, None], base[:, None] + pos, max_seq + pos)
        groups.append(Group(st.history[rows, :W], pos, slots, None, rows, logit_rows=last_row,
                            feature_layers=fl))  # fmt: skip
    outs = mixed_forward(engine.target, groups, engine.target_runner.kv.layers)
    last, drafts = None, []
    for group, out, (used, keep) in zip(groups, outs, keeps, strict=True):
        logits, feats = out if fl is not None else (out, None)
        # Per row of the batch. index_add, not index_copy: unused slots name row 0 and add zeros, so they never
        # clobber a new row 0's logits; where, not a product: 0 * inf would be NaN.
        logits = torch.where(used[:, None], logits[:, 0], 0)
        if last is None:
            last = torch.zeros(B, logits.shape[-1], dtype=logits.dtype, device=dev)
        last.index_add_(0, group.rows, logits)
        drafts.append((group, keep, feats))
    return last, drafts


def _draft_parts(engine, B: int, drafts: list, commit: bool = True) -> list:
    """The drafter's half of ``_core_parts`` (``draft_prefill`` per group): the round state left pending."""
    pending = []
    for group, keep, feats in drafts:
        pending += draft_prefill(engine, B, group, keep, feats, commit)
    return pending


def commit_pending(st, B: int, pending: list) -> None:
    """Write the round state a packed prefill run with ``commit`` False left pending (an EAGLE-3 drafter's
    last features, ``last_features``) into rows 0 .. B - 1; a few small kernels on the current stream."""
    for kept, feat_b in pending:
        n = kept.shape[0]  # a captured prefill's bucket (>= B): its rows past B are kept by none
        st.feats[:n, 0] = torch.where(kept[:, None], feat_b, st.feats[:n, 0])
        st.n_prev[:n] = torch.where(kept, 0, st.n_prev[:n])


def draft_prefill(engine, B: int, group: Group, keep: torch.Tensor, feats: torch.Tensor | None, commit: bool = True):
    """The drafter's half of a packed prefill whose target half already ran (``group``: the prompts' packed
    rows, [S, W]; ``feats``: the target's features where the drafter is EAGLE-3), written into the same rows
    and slots; ``keep`` [S]: the slots whose rows keep state. Shared by this prefill and the carrying round
    (``admission.carry``), whose drafter prefill ran padded over every row of the bucket before: 16 x 64
    tokens through the drafter's eager step for one 64-token prompt at bucket 16. Tensor work only. Returns
    the round state left to write (``commit_pending``): none with ``commit``, which writes it here."""
    if engine.draft_runner is None:
        return []
    toks, pos, slots, rows = group.tokens, group.positions, group.slots, group.rows
    draft_kv = engine.draft_runner.kv.layers
    if feats is None:  # a Transformer drafter: packed alike (its logits are not read)
        mixed_forward(engine.draft, [Group(toks, pos, slots, None, rows, logit_rows=group.logit_rows)], draft_kv)
        return []
    # An EAGLE-3 drafter, as ``Engine._prefill_eagle`` for one chunk: its layer's K/V (``prefill_inputs``).
    g = engine.draft.prefill_inputs(feats)
    x2, cos, sin, _ = engine.draft._layer_inputs(toks, pos, g)
    engine.draft.layers[0].write_kv(x2, cos, sin, *draft_kv[0], rows[:, None], slots)
    pending = [last_features(engine.state, B, rows, keep, feats, group.logit_rows)]
    if commit:
        commit_pending(engine.state, B, pending)
        return []
    return pending


def last_features(st, B: int, rows, keep, feats, last_row) -> tuple[torch.Tensor, torch.Tensor]:
    """An EAGLE-3 drafter's round state for prompts just prefilled in packed slots (``rows``, ``keep`` [S]):
    each kept slot's last target feature (``feats`` [S, W, F] at ``last_row`` [S, 1]) is to wait in its row's
    ``st.feats[row, 0]`` for the first round, which feeds it with the first emitted token (n_prev 0).
    Returns (kept [B] bool, feat_b [B, F]) for ``commit_pending``: rows 0 .. B - 1 of no kept slot keep their
    state; unused slots name row 0 and add zeros (index_add). Tensor work only (capturable)."""
    F_, dev = feats.shape[-1], feats.device
    last = feats.gather(1, last_row[:, :, None].expand(-1, 1, F_))[:, 0]
    last = torch.where(keep[:, None], last, 0).to(st.feats.dtype)
    kept = torch.zeros(B, dtype=torch.long, device=dev).index_add_(0, rows, keep.long()) > 0
    feat_b = torch.zeros(B, F_, dtype=st.feats.dtype, device=dev).index_add_(0, rows, last)
    return kept, feat_b


@torch.inference_mode()
def packed_prefill(engine, lens: list[int], slot0: int = 0, commit: bool = True, between=None):
    """``Engine.prefill_rows`` for the rows with ``lens[b] > 0`` alone: last-position logits [B, V] (zeros in
    the other rows, which nothing is written for). ``slot0`` = max_seq_len writes only scratch slots and
    keeps no row state (the warm-up's cost probe). The prompts are in rows 0 .. B - 1 of the engine's state.
    With ``commit`` False, (logits, pending) as ``_core`` returns them: the caller writes the round state.
    ``between(logits)`` runs after the target's half and before the drafter's (``RowBatch._overtake`` reads
    the first tokens there: they need the target alone)."""
    B = len(lens)
    new = [i for i, n in enumerate(lens) if n > 0]
    lens_new = [lens[i] for i in new]
    graphs = engine.packed_graphs
    key = graphs.key(B, len(new), max(lens_new)) if graphs is not None else None
    if key in (graphs or ()):
        last = graphs.replay_target(key, new, lens_new, slot0)[:B]
        if between is not None:
            between(last)
        pending = graphs.replay_draft(key)
    else:
        from .engine import prefill_width

        dev, chunk = engine.device, engine.options.prefill_chunk
        parts = []
        for tier in width_tiers(lens, chunk):
            rows = to_device(tier, dev)
            ins = PackedRows(rows, to_device([lens[i] for i in tier], dev), torch.full_like(rows, slot0))
            parts.append((ins, prefill_width(max(lens[i] for i in tier), chunk)))
        last, drafts = _target_parts(engine, B, parts)
        if between is not None:
            between(last)
        pending = _draft_parts(engine, B, drafts, commit=False)
    if not commit:
        return last, pending
    commit_pending(engine.state, B, pending)
    return last


def packed_width(engine, B: int, lens: list[int]) -> int:
    """The slots 0 .. W - 1 of each of their rows that ``packed_prefill`` writes for prompts of ``lens``
    tokens among ``B`` rows: the captured prefill's width where one holds them, else the widest tier's."""
    from .engine import prefill_width

    chunk, graphs = engine.options.prefill_chunk, engine.packed_graphs
    key = graphs.key(B, len(lens), max(lens)) if graphs is not None else None
    return key[2] if key in (graphs or ()) else prefill_width(max(lens), chunk)


class PackedGraphs:
    """``_core`` captured per (bucket, slots, width) on CUDA, as ``admission.CarryingGraphs`` does for
    carrying rounds. Captured with every slot unused, so the captures write only scratch slots and keep no
    row state. One memory pool for all: they are replayed one at a time.

    A prefill that overtakes the rounds in flight (``RowBatch._overtake``, on a stream of higher priority)
    replays beside a round's graph, so the two share no scratch memory: they are captured on a capture
    stream of their own, not torch's default one that every other capture shares (cuBLAS keeps a workspace
    per (handle, stream), and a graph bakes in the one of the stream it was captured on), and with split-K
    counters of their own for the projections that take the verify-rows GEMMs (``linear.own_counters``: a
    1 x 64-token prefill is 64 rows, and the head sees one row a slot). The round state the prefill leaves
    (``commit_pending``) stays out of the graph for the same reason: the caller writes it where the rounds in
    flight are done with it."""

    def __init__(self, engine):
        self.engine = engine
        self._graphs: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, PackedRows, tuple]] = {}
        self._pool = None  # made at the first capture (CUDA)
        self._stream = None  # the capture stream (CUDA)
        self._counters: dict = {}  # Linear -> the split-K counters its captures use (``own_counters``)
        self.refused: dict[tuple[int, int, int], str] = {}  # key -> why its capture failed

    def __contains__(self, key) -> bool:
        return key in self._graphs

    def key(self, B: int, new: int, longest: int) -> tuple[int, int, int] | None:
        """(bucket, slots, width) for ``new`` prompts of at most ``longest`` tokens among ``B`` rows."""
        ladder = self.engine.target_runner.ladder
        bucket = next((b for b in ladder if b >= B), None)
        slots = slot_bucket(new)
        if bucket is None or slots is None:
            return None
        return bucket, slots, graph_width(longest, self.engine.options.prefill_chunk)

    def keys_at(self, bucket: int) -> list[tuple[int, int, int]]:
        """Every key a batch of ``bucket`` rows may replay: slot buckets up to half the rows, every width."""
        if bucket <= PREFILL_GRAPH_MAX_BATCH:
            return []
        chunk = self.engine.options.prefill_chunk
        widths = sorted({graph_width(n, chunk) for n in range(1, chunk + 1)})
        return [(bucket, s, w) for s in SLOT_BUCKETS if s * MIN_PAD_FACTOR <= bucket for w in widths]

    @torch.inference_mode()
    def capture(self, key: tuple[int, int, int]) -> None:
        """Two graphs per key, the target's half and the drafter's (``_target_parts``, ``_draft_parts``), so
        that the first tokens can be read between them (``packed_prefill``'s ``between``)."""
        if key in self._graphs:
            return
        if key in self.refused:
            return
        eng = self.engine
        B, S, W = key
        ins = PackedRows.unused(S, eng.options.max_seq_len, eng.device)
        try:
            side_stream_warmup(lambda: _core(eng, B, ins, W, commit=False))
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
                self._stream = torch.cuda.Stream()
            target, draft = torch.cuda.CUDAGraph(), None
            with own_counters((eng.target, eng.draft), self._counters):
                with torch.cuda.graph(target, pool=self._pool, stream=self._stream):
                    last, drafts = _target_parts(eng, B, [(ins, W)])
                pending = []
                if eng.draft_runner is not None:
                    draft = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(draft, pool=self._pool, stream=self._stream):
                        pending = _draft_parts(eng, B, drafts, commit=False)
        except Exception as e:  # noqa: BLE001 - a key that cannot be captured is not packed in a graph
            self.refused[key] = f"{type(e).__name__}: {e}"
            log.warning("packed prefill %s not captured (the padded or eager prefill serves it): %s", key, e)
            return
        self._graphs[key] = (target, draft, ins, last, pending)

    def replay_target(self, key, rows: list[int], lens: list[int], slot0: int = 0) -> torch.Tensor:
        """Logits [bucket, V] of the prompts ``lens`` in ``rows``: the target's half."""
        target, _, ins, last, _ = self._graphs[key]
        ins.fill(rows, lens, slot0, self.engine.options.max_seq_len)
        target.replay()
        return last

    def replay_draft(self, key) -> list:
        """The drafter's half of the prefill ``replay_target`` just ran: the round state left pending."""
        _, draft, _, _, pending = self._graphs[key]
        if draft is not None:
            draft.replay()
        return pending
