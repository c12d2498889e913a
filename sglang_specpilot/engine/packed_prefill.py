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
[n, W] block in the rows a tensor names; causal attention over the chunk's own K/V, scattered into those
rows' slots), so it costs n rows, not hi. The drafter follows: a Transformer drafter packed the same way;
an EAGLE-3 drafter (its forward reads the target's features) over the padded rows as before, the new rows'
features scattered into place, its other rows in scratch slots. It is eager (the shapes are the prompts'),
which costs kernel launches a captured padded prefill does not pay, so it is taken only where padding would
at least double the rows run and the padded prefill would not replay a CUDA graph (more rows than
``PREFILL_GRAPH_MAX_BATCH``, or no graphs), and only for prompts of one chunk on plain targets
(``worth_packing``). Not yet timed on a GPU: the rule keeps the captured path wherever one exists, since a
launch-bound model (SmolLM2: ~450 eager kernels a forward) could lose there what the padding costs.
"""

from __future__ import annotations

import os

import torch

from ..models.llama import Transformer
from ..models.mixed_forward import Group, mixed_forward
from .runner import PREFILL_GRAPH_MAX_BATCH

# Packed where the padded prefill would run at least this many times the new rows. Not measured: a margin
# for the eager launches, well inside the 16x that one prompt admitted at bucket 16 paid (above).
MIN_PAD_FACTOR = 2


# An A/B switch for benchmarks run in separate processes (SPECPILOT_PACKED_PREFILL=0: always the padded batch
# prefill, as before); packing is the default.
PACKED = os.environ.get("SPECPILOT_PACKED_PREFILL", "1") != "0"


def worth_packing(engine, lens: list[int]) -> bool:
    """Whether ``Engine.prefill_rows`` packs these rows: some rows in range have nothing to prefill (at
    least half of them), the padded prefill would not replay a captured graph, every prompt fits one chunk,
    and the target is a plain attention model outside TLV and co-located rounds (their prefill keeps state
    this path does not write)."""
    new = sum(n > 0 for n in lens)
    o = engine.options
    graphed = engine.target_runner.use_graphs and len(lens) <= PREFILL_GRAPH_MAX_BATCH
    return (
        PACKED
        and 0 < new
        and new * MIN_PAD_FACTOR <= len(lens)
        and not graphed
        and max(lens) <= o.prefill_chunk
        and engine.target_runner.recurrent is None
        and not o.tlv
        and not o.colocate
        and isinstance(engine.target, Transformer)
        # A drafter is a Transformer (packed alike) or an EAGLE-3 one (padded, fed the target's features).
        and (engine.draft is None or engine.feature_layers is not None or isinstance(engine.draft, Transformer))
    )


def _group(history, rows, lens_new, width, slot0, feature_layers=None) -> Group:
    n = rows.shape[0]
    pos = torch.arange(width, device=history.device).expand(n, width)
    last = (lens_new - 1).clamp(min=0)[:, None]
    return Group(history[rows, :width], pos, slot0 + pos, None, rows, logit_rows=last, feature_layers=feature_layers)


@torch.inference_mode()
def packed_prefill(engine, history: torch.Tensor, lens: list[int], slot0: int = 0) -> torch.Tensor:
    """``Engine.prefill_rows`` for the rows with ``lens[b] > 0`` alone: last-position logits [B, V] (zeros in
    the other rows, which nothing is written for). ``slot0`` = max_seq_len writes only scratch slots (the
    warm-up's cost probe)."""
    from .engine import prefill_width

    dev, B = engine.device, len(lens)
    new = [i for i, n in enumerate(lens) if n > 0]
    rows = torch.tensor(new, device=dev)
    lens_new = torch.tensor([lens[i] for i in new], device=dev)
    width = prefill_width(max(lens), engine.options.prefill_chunk)
    fl = engine.feature_layers
    (out,) = mixed_forward(
        engine.target, [_group(history, rows, lens_new, width, slot0, fl)], engine.target_runner.kv.layers
    )
    logits, feats = out if fl is not None else (out, None)
    last = torch.zeros(B, logits.shape[-1], dtype=logits.dtype, device=dev).index_copy_(0, rows, logits[:, 0])
    if engine.draft_runner is not None:
        _draft(engine, history, lens, rows, lens_new, width, slot0, feats)
    return last


def _draft(engine, history, lens, rows, lens_new, width, slot0, feats) -> None:
    dev, st, B = engine.device, engine.state, len(lens)
    if feats is None:  # a Transformer drafter (``worth_packing``)
        mixed_forward(engine.draft, [_group(history, rows, lens_new, width, slot0)], engine.draft_runner.kv.layers)
        return
    lens_t = torch.tensor(lens, device=dev)
    seq = torch.where(lens_t > 0, slot0, engine.options.max_seq_len)  # the other rows write scratch slots
    # ``Engine._prefill_eagle`` for one chunk whose target half ran packed: the drafter reads each position's
    # feature one position earlier (zeros before position 0); the prompt's last feature waits in the round
    # state for the first round, which feeds it with the first emitted token (n_prev 0).
    F_ = feats.shape[-1]
    full = torch.zeros(B, width, F_, dtype=feats.dtype, device=dev).index_copy_(0, rows, feats)
    prev = torch.zeros(B, 1, F_, dtype=feats.dtype, device=dev)
    g = engine.draft.project(torch.cat([prev, full[:, :-1]], 1))
    engine.draft_runner.prefill(history[:, :width], seq, 0, g=g)
    if slot0:  # the cost probe: no row's state
        return
    last = feats.gather(1, (lens_new - 1)[:, None, None].expand(-1, 1, F_))[:, 0]
    st.feats[rows, 0] = last.to(st.feats.dtype)
    st.n_prev[rows] = 0
