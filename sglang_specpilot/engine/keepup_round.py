"""An AR round that keeps the drafter current, so speculation can resume after it (automatic off).

A plain AR round advances only the target's cache. The drafter's cache must hold every position before
a speculative round's root (``expand_lattice`` feeds only the last two tokens), so after AR rounds it
would attend to stale slots: still lossless (verification is exact), but the drafts, and with them the
acceptance that decides whether to speculate again, would be wrong. This round writes the same token
into the drafter at the same position as the target, one extra draft forward of one token:

    plain drafter   the drafter runs ``[history[seq_len - 1], next_tok]`` at ``seq_len - 1, seq_len``, the
                    root step of ``expand_lattice``: slot seq_len - 1 is not valid yet after a round
                    that accepted every draft (its last draft token was never fed)
    EAGLE-3         the drafter's root window of the last round (its accepted tokens and the root, with
                    their true features) writes its K/V, as the next round's root step would have; only
                    the K/V (``Eagle3Layer.write_kv``: the one layer's K/V depend on its input alone), not
                    attention, o_proj or the MLP, whose output an AR round never uses. The AR step's target
                    feature becomes window entry 0 of the next round, which accepted nothing (n_prev 0)
    prompt lookup   nothing: it drafts from ``history``, which the AR round writes

The emitted token is the target's own next token, as in ``Round.run``'s AR branch. Tensor ops only:
captured per bucket like the other rounds.
"""

from __future__ import annotations

import torch

from .draft_tree import _tril, eagle_root_kv
from .round import Round, RoundShape, RoundState


class KeepUpARRound(Round):
    def __init__(self, spec: Round):
        super().__init__(spec.target, spec.draft, spec.ngram, RoundShape(0, 0, 1))
        self.feature_layers = spec.feature_layers
        self._reach = spec.shape.reach
        self._pair = torch.arange(2, device=spec.target.device)

    @property
    def capturable(self) -> bool:
        return True

    @property
    def _kv_reach(self) -> int:
        # Dense-mask (CPU) attention reads up to the speculative round's reach: the EAGLE-3 window is
        # depth + 1 wide.
        return self._reach

    def _ar_logits(self, st: RoundState, b: int, kv_len) -> torch.Tensor:
        """``Round``'s AR step, plus the drafter's step over the same position (see the module docstring)."""
        hist, seq, nxt, use = st.history[:b], st.seq_len[:b], st.next_tok[:b], st.in_use[:b]
        if self.feature_layers is None:
            logits = super()._ar_logits(st, b, kv_len)
            if self.draft is not None:
                two = torch.cat([hist.gather(1, (seq - 1)[:, None]), nxt[:, None]], 1)
                pos2 = (seq - 1)[:, None] + self._pair
                self.draft.forward(two, pos2, pos2, seq - 1, _tril(2, str(seq.device)), kv_len)
        else:
            pos = seq[:, None]
            logits, f = self.target.forward(
                nxt[:, None], pos, pos, seq, self._chain_anc, kv_len, feature_layers=self.feature_layers
            )
            logits = logits[:, 0]
            eagle_root_kv(self.draft, hist, seq, nxt, st.feats[:b], st.n_prev[:b] * use)
            st.feats[:b, 0] = torch.where(use[:, None], f[:, 0].to(st.feats.dtype), st.feats[:b, 0])
        if st.n_prev is not None:  # the next round's window starts at its root (TLV's catch-up too)
            st.n_prev[:b].zero_()
        return logits
