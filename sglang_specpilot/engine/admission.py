"""Prompt admission (issue 18, mechanism 3): a new prompt's prefill rides in the next round's verify pass.

When.  A prompt that arrives while rows are running would, without admission, wait for the round in
flight and then hold every running row back for its own prefill, a second pass over the target's
weights. With ``EngineOptions.prompt_admission`` = A > 0 it is parked in its row instead and its prefill
joins the target forward of the next round (``models.mixed_forward``): the projections and the MLP read
each weight once for the round's verify block and the prompt's chunk together. With no row running there
is no round to ride on and nothing to wait for: the prompt is prefilled at once, as without admission.

TTFT.  Only prompts whose tokens fit in one pass ride (at most A prompt tokens per round in all, A at
most one prefill chunk), so a riding prompt's first token comes out of the very round that carries it:
the round the separate prefill would have waited for. Longer prompts take the separate prefill.

Starvation.  A rider never replaces a round: every step still runs one round for every running row,
and A bounds what a round carries besides its own work. A parked prompt rides the next round, so no
prompt waits behind another either.

Layout.  The rider covers rows 0 .. hi - 1 like the separate prefill (pad, not pack); rows that are not
riding get seq_len ``max_seq_len`` there and write only scratch slots, and a riding row sits parked at
``max_seq_len`` (in_use False) in the round's own group, so neither group touches the other's slots. The
drafter's prefill of the new rows (a small model) runs after the round; an EAGLE-3 drafter reads the
target features the rider returns, as ``Engine._prefill_eagle`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.mixed_forward import Group
from .attn_meta import build_step_meta, causal_tree
from .request import Request

# /metrics labels of the decisions: rode in the verify pass; took the separate prefill because nothing was
# running, the prompt is longer than the allowance, the round's allowance was taken by earlier prompts, or
# the carrying round failed.
RIDE, IDLE, LONG, FULL, FALLBACK = "verify", "idle", "long", "full", "fallback"


def admission_path(n_prompt: int, running: int, room: int, allowance: int) -> str:
    """RIDE when a round will run anyway (``running`` rows) and the prompt fits the ``room`` left of the
    next round's ``allowance``; else why it takes the separate prefill (IDLE, LONG, FULL). A prompt that
    does not fit is not held for a later round: its separate prefill now gives it the earlier first token."""
    if running == 0:
        return IDLE
    if n_prompt > allowance:
        return LONG
    return RIDE if n_prompt <= room else FULL


@dataclass
class PrefillRider:
    """What one round carries: ``reqs`` (their rows are parked), their ``lens`` over rows 0 .. hi - 1
    (0 for rows not riding), the target group, and after the round ``out`` (the group's result)."""

    reqs: list[Request]
    lens: torch.Tensor
    group: Group
    out: object = None


def build_rider(engine, reqs: list[Request], hi: int) -> PrefillRider:
    from .engine import prefill_width

    dev, st, max_seq = engine.device, engine.state, engine.options.max_seq_len
    lens = [0] * hi
    for r in reqs:
        lens[r.index] = len(r.prompt)
    lens_t = torch.tensor(lens, device=dev)
    width = prefill_width(max(lens), engine.options.prefill_chunk)
    seq = torch.where(lens_t > 0, 0, max_seq)
    anc, depth = causal_tree(width, dev)
    runner = engine.target_runner
    kv_len = min(runner.kv.max_seq, -(-width // 64) * 64)
    meta = build_step_meta(seq, anc, depth, kv_len, runner.group)
    group = Group(
        st.history[:hi, :width],
        meta.positions,
        meta.slots,
        meta.mask,
        (0, hi),
        seq,
        anc,
        logit_rows=(lens_t - 1).clamp(min=0)[:, None],
        feature_layers=engine.feature_layers,
    )
    return PrefillRider(list(reqs), lens_t, group)


@torch.inference_mode()
def finish_rider(engine, rider: PrefillRider) -> torch.Tensor:
    """After the round: the drafter's prefill of the riding rows; returns their last-position logits [hi, V]."""
    if rider.out is None:
        raise RuntimeError("the round ran no target forward to carry the prompts' prefill")
    if engine.feature_layers is None:
        logits = rider.out
        if engine.draft_runner is not None:
            engine._prefill(engine.draft_runner, engine.state.history[: len(rider.lens)], rider.lens.tolist(), False)
        return logits[:, 0]
    logits, feats = rider.out
    _eagle_draft_prefill(engine, rider, feats)
    return logits[:, 0]


def _eagle_draft_prefill(engine, rider: PrefillRider, feats: torch.Tensor) -> None:
    # ``Engine._prefill_eagle`` for one chunk whose target half already ran: the drafter reads each
    # position's feature one position earlier (zeros before position 0), and the prompt's last feature
    # waits in the round state for the first round.
    st, g, lens = engine.state, rider.group, rider.lens
    B, F = feats.shape[0], feats.shape[-1]
    prev = torch.zeros(B, 1, F, device=feats.device, dtype=feats.dtype)
    depth = torch.arange(g.tokens.shape[1], device=feats.device)
    proj = engine.draft.project(torch.cat([prev, feats[:, :-1]], 1))
    engine.draft_runner.step(g.tokens, g.seq_len, g.anc, depth, max_len_hint=0, eager=True, g=proj)
    last = feats.gather(1, g.logit_rows[:, :, None].expand(B, 1, F))[:, 0]
    rows = lens > 0
    st.feats[:B, 0] = torch.where(rows[:, None], last.to(st.feats.dtype), st.feats[:B, 0])
    st.n_prev[:B] = torch.where(rows, 0, st.n_prev[:B])
