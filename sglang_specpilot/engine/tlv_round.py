"""The two-level verification round (issue 16): one more round kind of the one loop.

Per row, with ``seq_len`` = s tokens in the target cache and ``next_tok`` the root (in no cache yet):

    Q pass        the target on W12's 8-bit view (``models.w12_weights.view8_twin``), L greedy steps:
                  the root at slot s, then c_i at s + i -> c_1 .. c_L. Its K/V goes to slots s .. s + L - 1,
                  scratch past the row's length that the exact pass overwrites; it accepts nothing.
    second draft  the drafter brought up to c_L and its lattice expanded from there (``expand_lattice`` at
                  length s + L); optionally a lattice from the root too; best-first trees of each
    exact pass    ``Round.verify`` over the combined tree (``tlv.combine_tree``: the chain as a trunk, the
                  hanging tree from c_L, the root tree), one acceptance, the target commit of the path

The drafter's cache is not moved after acceptance: its window is re-run at the start of the next round
(the rule an EAGLE-3 drafter already follows, ``draft_tree._eagle_root``). A plain drafter's cache is
valid for slots 0 .. s - 2 - n_prev at a round's start (n_prev: tokens the last round accepted), and the
round first re-feeds the tokens at s - 1 - n_prev .. s + L - 2 (last round's accepted tokens, the root, the
chain) in one forward of fixed width. An EAGLE-3 drafter re-runs its window with the exact features of
the last round's path and the Q pass's features for the chain (``tlv.chain_window``).

Greedy and sampled rounds alike: the Q chain and the drafter's trees are deterministic drafts, so the
tree rule of ``accept_sampling_batched`` keeps the output distribution exact. Tensor ops, static shapes,
no host reads: ``CapturedRound`` records the whole round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tlv import TLVPlan, chain_window, combine_tree
from tree_verify import best_first

from .attn_meta import causal_tree
from .draft_tree import _tril, expand_lattice
from .round import Round, RoundShape, RoundState
from .runner import ModelRunner
from .sampling import BatchSampling


@dataclass(frozen=True)
class TLVShape(RoundShape):
    """The combined tree as a ``RoundShape`` (budget, depth, top_k = a bound on children) plus its plan."""

    plan: TLVPlan | None = None

    @classmethod
    def of(cls, plan: TLVPlan) -> TLVShape:
        return cls(plan.budget, plan.max_depth, plan.max_children, plan)

    @property
    def chain(self) -> bool:
        return False  # always a tree: the verify pass takes parents

    @property
    def expansions(self) -> int:
        return self.plan.expansions

    @property
    def reach(self) -> int:
        return self.plan.reach


class TLVRound(Round):
    def __init__(self, target: ModelRunner, draft: ModelRunner, q_runner: ModelRunner, plan: TLVPlan):
        if draft is None:
            raise ValueError("tlv needs a draft model (the second draft runs it from the Q chain's end)")
        super().__init__(target, draft, 0, TLVShape.of(plan))
        self.plan, self.q = plan, q_runner
        dev = target.device
        self._one = causal_tree(1, dev)[0]  # a Q step sees its prefix and itself
        self._root_chain = torch.arange(plan.chain_len + 1, device=dev)  # slots s .. s + L past the length
        # The plain drafter's catch-up window: up to max_depth accepted tokens, the root and the chain.
        self._catch = plan.max_depth + plan.chain_len
        self._catch_t = torch.arange(self._catch, device=dev)

    @property
    def capturable(self) -> bool:
        return True

    # ---- Q pass -----------------------------------------------------------------------------------
    def q_pass(self, seq, nxt, kv_len):
        """-> (chain [B, L], features [B, L, F] or None). Greedy on the 8-bit view; step i has prefix s + i."""
        x, toks, feats = nxt[:, None], [], []
        for i in range(self.plan.chain_len):
            pos = (seq + i)[:, None]
            if self.feature_layers is None:
                logits = self.q.forward(x, pos, pos, seq + i, self._one, kv_len)
            else:
                logits, f = self.q.forward(x, pos, pos, seq + i, self._one, kv_len, feature_layers=self.feature_layers)
                feats.append(f)
            x = logits[:, -1].argmax(-1, keepdim=True)
            toks.append(x)
        return torch.cat(toks, 1), (torch.cat(feats, 1) if feats else None)

    # ---- second draft -----------------------------------------------------------------------------
    def _catch_up(self, hist, start, width, kv_len):
        """Re-feed the plain drafter the tokens at slots start .. start + width - 1 (causal)."""
        idx = (start[:, None] + self._catch_t[:width]).clamp(max=hist.shape[1] - 1)
        self.draft.forward(hist.gather(1, idx), idx, idx, start, _tril(width, str(hist.device)), kv_len)

    def _tree(self, hist, seq, nxt, budget, kv_len, features=None):
        p = self.plan
        lattice, _, _ = expand_lattice(self.draft, hist, seq, nxt, p.depth, p.top_k, kv_len, None, features)
        tree = best_first(lattice, budget)
        return tree.tokens, tree.parents

    def second_draft(self, st: RoundState, b, hist, seq, nxt, chain, q_feats, n_prev, kv_len):
        """-> (tokens [B, N], parents [B, N]) of the combined tree."""
        p = self.plan
        L = p.chain_len
        # The chain after the root in ``history`` (past the row's length: scratch until the commit).
        hist.scatter_(1, seq[:, None] + self._root_chain, torch.cat([nxt[:, None], chain], 1))
        end_seq, end_tok = seq + L, chain[:, -1]
        root = None
        if self.feature_layers is None:
            start = seq - 1 - n_prev
            self._catch_up(hist, start, self._catch, kv_len)
            if p.root_budget:
                root = self._tree(hist, seq, nxt, p.root_budget, kv_len)
                if L > 1:  # the root lattice's expansions overwrote the chain's draft slots s + 1 ..
                    self._catch_up(hist, seq, L - 1, kv_len)
            hang = self._tree(hist, end_seq, end_tok, p.hang_budget, kv_len)
        else:
            feats = st.feats[:b]
            if p.root_budget:
                root = self._tree(hist, seq, nxt, p.root_budget, kv_len, (feats, n_prev))
            window = chain_window(feats, q_feats, n_prev)
            hang = self._tree(hist, end_seq, end_tok, p.hang_budget, kv_len, (window, n_prev + L))
        return combine_tree(chain, *hang, *(root or (None, None)))

    # ---- the round --------------------------------------------------------------------------------
    def run(self, st: RoundState, b: int, bs: BatchSampling, max_len: int | None = None) -> None:
        hist, seq, nxt, use = st.history[:b], st.seq_len[:b], st.next_tok[:b], st.in_use[:b]
        kv_len = None if max_len is None else max_len + self.shape.reach + 1
        n_prev = st.n_prev[:b] * use  # rows not in use start their window at their length
        chain, q_feats = self.q_pass(seq, nxt, kv_len)
        tokens, parents = self.second_draft(st, b, hist, seq, nxt, chain, q_feats, n_prev, kv_len)
        feats_out = None if self.feature_layers is None else (st.feats[:b], use)
        bonus, n = self.verify(
            hist,
            seq,
            nxt,
            tokens,
            parents,
            tokens,
            None,
            None,
            bs=bs,
            kv_len=kv_len,
            out=st.out[:b],
            feats_out=feats_out,
        )
        st.n_prev[:b] = n * use
        st.out[:b, -1] = n
        seq += (n + 1) * use
        nxt.copy_(torch.where(use, bonus, nxt))
