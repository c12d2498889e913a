"""The TLV replay of ``specpilot tau --tlv``: tokens per exact pass of two-level verification (issue 16).

A TLV round at root s (after t emitted tokens, greedy continuation g) proposes the Q chain c_1 .. c_L
(the target's 8-bit view, L greedy steps from the root over the exact prefix's K/V, as
``engine.tlv_round.TLVRound.q_pass`` runs it), a best-first tree the drafter grows from c_L, and
optionally one from the root. Greedy acceptance takes the deepest path that spells g[t:], so:

    trunk = j, the leading run of c_1 .. c_L that equals g[t:]
    hang  = the hanging tree's accepted depth against g[t + L:], counted only when j = L (every hanging
            node descends from c_L); the drafter then drafts from the true text, so its lattice is the
            plain replay's lattice of round start t + L (a plain drafter), or for an EAGLE-3 drafter that
            lattice regrown with the Q pass's features for the chain (``tlv.chain_window``)
    root  = the root tree's accepted depth (the plain replay's lattice at t)
    accepted = max(trunk + hang, root), and the round emits accepted + 1 tokens

Each round runs one exact pass, so tokens per exact pass and tokens per round are one number here
(``tlv_tokens_per_round`` is reported beside it under its own name, for the issue's wording). The Q-chain
agreement counts j per round over min(L, tokens left): the Q chain's tokens that the exact pass's output
holds, whichever copy of them (trunk or root tree) the acceptance walked, so it measures the Q pass alone.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from tlv import chain_window
from tree_verify import best_first
from tree_verify.tau import accepted_on_truth

from ..engine.attn_meta import causal_tree
from ..engine.draft_tree import expand_lattice
from ..engine.runner import ModelRunner


@dataclass(frozen=True)
class TLVReplay:
    """What ``tau_report`` replays for TLV: the Q chain's length and the root tree's nodes; the hanging
    tree gets the rest of each tree budget N (N - chain_len - root_budget), so TLV is replayed at every
    budget the trees are, at the same exact-pass node count."""

    chain_len: int = 4
    root_budget: int = 0

    def hang_budget(self, budget: int) -> int:
        return budget - self.chain_len - self.root_budget

    def budgets(self, budgets, candidates: int) -> list[int]:
        return [n for n in budgets if 1 <= self.hang_budget(n) <= candidates and self.root_budget <= candidates]


class QChains:
    """The Q pass over one recorded text: the exact target's K/V of the whole text, and per round start
    L greedy steps of the 8-bit view (``models.w12_weights.view8_twin``) from the root. The steps write
    the slots s .. s + L - 1 past the root's prefix, which are restored afterwards from a copy, so every
    round start sees the exact prefix K/V that the engine's exact passes commit."""

    def __init__(self, target, seq: list[int], prompt_len: int, chain_len: int, feature_layers=None):
        from ..models.w12_weights import view8_twin

        self.dev = target.embed.weight.device
        self.P, self.L, self.feature_layers = prompt_len, chain_len, feature_layers
        self.width = len(seq) + chain_len + 2
        self.runner = ModelRunner(target, 1, self.width, cuda_graphs=False, scratch_slots=chain_len + 64)
        x = torch.tensor([seq], device=self.dev)
        self.runner.step(x, torch.zeros(1, dtype=torch.long, device=self.dev), *causal_tree(len(seq), self.dev))
        self.q = copy.copy(self.runner)  # the same KV cache, the 8-bit view's weights (as the engine's Q runner)
        self.q.model = view8_twin(target)
        self.seq = seq
        self._one = causal_tree(1, self.dev)[0]
        self._chains: dict[int, tuple[list[int], torch.Tensor | None]] = {}

    @torch.inference_mode()
    def chain(self, t: int) -> tuple[list[int], torch.Tensor | None]:
        """-> (c_1 .. c_L, the Q pass's features [1, L, F] or None) of the round after t emitted tokens."""
        if t in self._chains:
            return self._chains[t]
        s = self.P + t - 1
        kv = self.runner.kv.storage
        saved = kv[:, :, :, s : s + self.L].clone()
        x = torch.tensor([[self.seq[s]]], device=self.dev)
        toks, feats = [], []
        for i in range(self.L):
            pos = torch.tensor([[s + i]], device=self.dev)
            sl = torch.tensor([s + i], device=self.dev)
            if self.feature_layers is None:
                logits = self.q.forward(x, pos, pos, sl, self._one, s + i + 1)
            else:
                logits, f = self.q.forward(x, pos, pos, sl, self._one, s + i + 1, feature_layers=self.feature_layers)
                feats.append(f)
            x = logits[:, -1].argmax(-1, keepdim=True)
            toks.append(int(x))
        kv[:, :, :, s : s + self.L] = saved
        self._chains[t] = (toks, torch.cat(feats, 1) if feats else None)
        return self._chains[t]


def eagle_hang_lattice(rep, t: int, L: int, q_feats: torch.Tensor):
    """The lattice an EAGLE-3 drafter grows from c_L when the Q chain spelled the truth (``rep`` an
    ``_EagleReplay``): the window re-runs the root with its exact feature and c_1 .. c_L with the Q pass's
    features (``TLVRound.second_draft``); the drafter's cache gets its true-feature K/V back afterwards."""
    s = rep.L + t - 1
    zero = torch.zeros(1, dtype=torch.long, device=rep.dev)
    window = chain_window(rep.feats[:, s - 1 : s], q_feats, zero)  # [1, 1 + L, F]
    end = torch.tensor([s + L], device=rep.dev)
    lat, _, _ = expand_lattice(
        rep.runner,
        rep.history,
        end,
        rep.history[:, s + L],
        rep.depth,
        rep.top_k,
        kv_len=s + L + rep.E + 1,
        features=(window, zero + L),
    )
    rep._fill(s, min(s + L + rep.E + 1, rep.feats.shape[1]))
    return lat


def tlv_accept(spec: TLVReplay, budget: int, g: list[int], t: int, chain: list[int], hang, root, tally):
    """Tokens the exact pass of the round after t emitted tokens accepts (``hang()`` / ``root()`` give the
    two lattices, computed only when they can matter). Adds (j, min(L, tokens left)) to ``tally``."""
    truth = g[t:]
    L = spec.chain_len
    j = 0
    while j < min(L, len(truth)) and chain[j] == truth[j]:
        j += 1
    tally[0] += j
    tally[1] += min(L, len(truth))
    acc = j
    if j == L and len(truth) > L:
        acc += accepted_on_truth(_single(best_first(hang(), spec.hang_budget(budget))), truth[L:])
    if spec.root_budget:
        acc = max(acc, accepted_on_truth(_single(best_first(root(), spec.root_budget)), truth))
    return acc


def tlv_summary(out: dict, spec: TLVReplay, budgets) -> None:
    """The issue's replay metrics at the best single-draft tree's budget N* (the highest tau_treeN):
    TLV's exact pass verifies N* nodes too (L + hanging + root), so the ratio compares equal passes."""
    have = [n for n in budgets if f"tau_tree{n}" in out and f"tau_tlv{n}" in out]
    if not have:
        return
    n = max(have, key=lambda b: (out[f"tau_tree{b}"], -b))
    out["tlv_budget"] = n
    out["tlv_chain_len"] = spec.chain_len
    out["tlv_hang_budget"] = spec.hang_budget(n)
    out["tlv_root_budget"] = spec.root_budget
    out["tlv_tokens_per_exact_pass"] = out[f"tau_tlv{n}"]
    out["tlv_tokens_per_round"] = out[f"tau_tlv{n}"]
    out["tlv_tokens_per_exact_pass_ratio"] = round(out[f"tau_tlv{n}"] / out[f"tau_tree{n}"], 4)
    out["tlv_q_chain_agreement"] = out[f"tlv{n}_q_chain_agreement"]


def _single(tree):
    from .tau_replay import _single as single

    return single(tree)
