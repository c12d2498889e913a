"""``specpilot tau``: record a drafter's candidates and the target's greedy output, replay tau per scheme.

Per prompt: the target's greedy continuation g (AR engine), the drafter's teacher-forced rank of every
g[j] (chain and oracle), and, at each round start the replays visit, the drafter's EAGLE-2 lattice grown
exactly as the engine grows it (``engine.draft_tree.expand_lattice``). Schemes, all at depth D:

- chain: accept while the drafter's argmax is the target's token (top-1), at most D
- tree(N): best-first tree of N nodes from the lattice (top_k K per depth), longest matching path
- oracle top-k: accept while the target's token is in the drafter's top-k, at most D (no budget limit)
  (not for EAGLE-3 drafters, whose deeper steps read their own features: chain and trees only)
- tlv(N) (``tlv=TLVReplay(..)``, a W12 target): two-level verification at the exact-pass budget N of
  tree(N), replayed by ``harness.tlv_replay`` (its Q chain from the target's 8-bit view)

tau = emitted tokens / rounds (accepted + bonus per round), pooled over the prompts.
"""

from __future__ import annotations

import torch

from tree_verify import best_first
from tree_verify.tau import accepted_on_truth, leading_run, replay

from ..engine.attn_meta import causal_tree
from ..engine.draft_tree import expand_lattice
from ..engine.runner import ModelRunner
from .tlv_replay import QChains, TLVReplay, eagle_hang_lattice, tlv_accept, tlv_summary

TREE_BUDGETS = (8, 16, 32, 64)
ORACLE_KS = (4, 16)


class _DraftReplay:
    """The drafter over one prompt + greedy continuation: teacher-forced ranks and per-round lattices."""

    def __init__(self, draft, seq: list[int], prompt_len: int, depth: int, top_k: int):
        self.dev = draft.embed.weight.device
        self.L, self.depth, self.top_k = prompt_len, depth, top_k
        self.E = 1 + (depth - 1) * top_k
        width = len(seq) + self.E + 2
        self.runner = ModelRunner(draft, 1, width, cuda_graphs=False, scratch_slots=self.E + 64)
        self.history = torch.zeros(1, width + self.runner.scratch, dtype=torch.long, device=self.dev)
        self.history[0, : len(seq)] = torch.tensor(seq, device=self.dev)
        x = self.history[:, : len(seq)]
        logits = self.runner.step(
            x, torch.zeros(1, dtype=torch.long, device=self.dev), *causal_tree(len(seq), self.dev)
        )
        logits = logits[0].float()
        # rank[j] of greedy token g[j] (at sequence index L + j), predicted at index L + j - 1.
        pred = logits[prompt_len - 1 : len(seq) - 1]
        truth = x[0, prompt_len:]
        self.ranks = (pred > pred.gather(1, truth[:, None])).sum(-1).tolist()
        self.greedy = truth.tolist()
        self._lattices: dict[int, object] = {}

    def lattice(self, t: int):
        if t not in self._lattices:
            seq_len = torch.tensor([self.L + t - 1], device=self.dev)
            next_tok = self.history[:, self.L + t - 1]
            lat, _, _ = expand_lattice(
                self.runner, self.history, seq_len, next_tok, self.depth, self.top_k, kv_len=self.L + t + self.E
            )
            # The expansion overwrote draft K/V past the root; rewrite the true tokens' K/V there.
            start = self.L + t
            x = self.history[:, start : start + self.E]
            self.runner.step(x, seq_len + 1, *causal_tree(x.shape[1], self.dev), max_len_hint=start)
            self._lattices[t] = lat
        return self._lattices[t]


class _EagleReplay:
    """The same replay for an EAGLE-3 feature drafter (``drafters.eagle3``).

    The target runs once over the prompt + greedy continuation for its features; the drafter's cache is
    then filled over the whole text with the true features one position earlier, which is what the
    engine's rounds leave in it at every round start (each round re-runs its accepted tokens with their
    verify-pass features). A round starting at root s grows its lattice from that cache with a window of
    one position (the root with feature s - 1, ``n_prev`` 0), as the engine does; afterwards the
    expansion slots get their true-feature K/V back.
    """

    def __init__(self, target, draft, seq: list[int], prompt_len: int, depth: int, top_k: int, feats=None):
        """``feats``: the target features of ``seq`` from another replay of the same text (else computed)."""
        self.dev = draft.embed.weight.device
        self.draft, self.L, self.depth, self.top_k = draft, prompt_len, depth, top_k
        self.E = 1 + (depth - 1) * top_k
        width = len(seq) + self.E + 2
        scratch = self.E + 64
        zero = torch.zeros(1, dtype=torch.long, device=self.dev)
        self.history = torch.zeros(1, width + scratch, dtype=torch.long, device=self.dev)
        self.history[0, : len(seq)] = torch.tensor(seq, device=self.dev)
        x = self.history[:, : len(seq)]
        if feats is None:
            tgt = ModelRunner(target, 1, width, cuda_graphs=False, scratch_slots=scratch)
            anc, depth_ = causal_tree(len(seq), self.dev)
            _, feats = tgt.step(x, zero, anc, depth_, eager=True, feature_layers=draft.feature_layers)
            del tgt
        self.feats = feats  # [1, S, F]: target features at every position of the text
        self.runner = ModelRunner(draft, 1, width, cuda_graphs=False, scratch_slots=scratch)
        self._fill(0, len(seq))
        self._lattices: dict[int, object] = {}

    def _fill(self, start: int, stop: int) -> None:
        # True-feature draft K/V for positions start .. stop - 1 (feature of position p - 1; zeros at 0).
        f = self.feats[:, max(start - 1, 0) : stop - 1]
        if start == 0:
            f = torch.cat([torch.zeros_like(self.feats[:, :1]), f], 1)
        x = self.history[:, start:stop]
        seq_len = torch.tensor([start], device=self.dev)
        self.runner.step(x, seq_len, *causal_tree(stop - start, self.dev), eager=True, g=self.draft.project(f))

    def lattice(self, t: int):
        if t not in self._lattices:
            s = self.L + t - 1
            seq_len = torch.tensor([s], device=self.dev)
            features = (self.feats[:, s - 1 : s], torch.zeros(1, dtype=torch.long, device=self.dev))
            lat, _, _ = expand_lattice(
                self.runner,
                self.history,
                seq_len,
                self.history[:, s],
                self.depth,
                self.top_k,
                kv_len=s + self.E + 1,
                features=features,
            )
            self._fill(s + 1, min(s + self.E, self.feats.shape[1]))
            self._lattices[t] = lat
        return self._lattices[t]


@torch.inference_mode()
def _eagle_tau(target, draft, prompt, g, depth, top_k, budgets, add, tlv=None, tallies=None) -> None:
    # Chain: the lattice of top_k 1 (the drafter's own features feed its deeper steps, so teacher-forced
    # ranks would overstate it); trees: best-first from the top_k lattice.
    seq = list(prompt) + g
    chain = _EagleReplay(target, draft, seq, len(prompt), depth, 1)
    T = len(g)
    add("chain", replay(T, lambda t: accepted_on_truth(_single(best_first(chain.lattice(t), depth)), g[t:])))
    rep = _EagleReplay(target, draft, seq, len(prompt), depth, top_k, feats=chain.feats)  # one target pass
    for n in budgets:
        add(f"tree{n}", replay(T, lambda t, n=n: accepted_on_truth(_single(best_first(rep.lattice(t), n)), g[t:])))
    if tlv is None:
        return
    q = QChains(target, seq, len(prompt), tlv.chain_len, draft.feature_layers)
    hangs: dict[int, object] = {}  # round start -> the hanging lattice (one per t, every budget reads it)

    def hang(t):
        if t not in hangs:
            hangs[t] = eagle_hang_lattice(rep, t, tlv.chain_len, q.chain(t)[1])
        return hangs[t]

    for n in tlv.budgets(budgets, rep.E * top_k):
        tally = tallies.setdefault(n, [0, 0])
        add(f"tlv{n}", replay(T, lambda t, n=n, tally=tally: _tlv_round(tlv, n, g, t, q, hang, rep.lattice, tally)))


def _plain_tau(target, draft, prompt, g, depth, top_k, budgets, oracle_ks, add, tlv=None, tallies=None) -> None:
    # A drafter of its own (no target features): chain and oracle runs from its teacher-forced ranks, trees
    # best-first from its lattice.
    rep = _DraftReplay(draft, list(prompt) + g, len(prompt), depth, top_k)
    T = len(g)
    add("chain", replay(T, lambda t: leading_run(rep.ranks, t, 1, depth)))
    for k in oracle_ks:
        add(f"oracle_top{k}", replay(T, lambda t, k=k: leading_run(rep.ranks, t, k, depth)))
    for n in budgets:
        add(f"tree{n}", replay(T, lambda t, n=n: accepted_on_truth(_single(best_first(rep.lattice(t), n)), g[t:])))
    if tlv is None:
        return
    q = QChains(target, list(prompt) + g, len(prompt), tlv.chain_len)
    # A Q chain that spells the truth leaves the drafter drafting from the true text: the hanging lattice is
    # the plain replay's lattice at round start t + L.
    for n in tlv.budgets(budgets, rep.E * top_k):
        tally = tallies.setdefault(n, [0, 0])

        def tlv_acc(t, n=n, tally=tally):
            return _tlv_round(tlv, n, g, t, q, lambda t: rep.lattice(t + tlv.chain_len), rep.lattice, tally)

        add(f"tlv{n}", replay(T, tlv_acc))


def _tlv_round(tlv, n, g, t, q, hang, root, tally) -> int:
    return tlv_accept(tlv, n, g, t, q.chain(t)[0], lambda: hang(t), lambda: root(t), tally)


def tau_report(
    target_engine,
    draft,
    prompts: list[list[int]],
    new_tokens: int,
    depth: int = 6,
    top_k: int = 8,
    budgets=TREE_BUDGETS,
    oracle_ks=ORACLE_KS,
    tlv: TLVReplay | None = None,
    progress=None,
) -> dict:
    """tau of chain / tree(N) / oracle top-k (and with ``tlv`` TLV at every budget N it fits, with its Q-chain
    agreement and the issue's ratio, ``tlv_replay.tlv_summary``) for ``draft`` against ``target_engine``'s
    greedy output.

    ``progress(done, total, prompt_tallies, totals)``, if given, is called after each prompt with that prompt's
    ``{name: [tokens, rounds]}`` (empty for a prompt whose answer is under two tokens) and the running sums
    over the prompts so far, so a caller can show progress and keep results that outlive a cut run."""
    from ..engine import SamplingParams

    cands = (1 + (depth - 1) * top_k) * top_k
    if max(budgets) > cands:
        raise ValueError(f"tree budget {max(budgets)} exceeds the {cands} candidates of depth {depth}, top_k {top_k}")
    if tlv is not None:
        from ..models.w12_weights import has_w12

        if not has_w12(target_engine.target):
            raise ValueError("the TLV replay needs W12 weights (--weights w12): its Q pass reads their 8-bit view")
        if not tlv.budgets(budgets, cands):
            raise ValueError(
                f"no tree budget leaves the TLV hanging tree a node: budgets {tuple(budgets)}, chain "
                f"{tlv.chain_len} + root {tlv.root_budget} (at most {cands} candidates)"
            )
    params = SamplingParams(max_new_tokens=new_tokens)
    totals: dict[str, list[int]] = {}
    tallies: dict[int, list[int]] = {}  # TLV budget -> [Q-chain tokens accepted, Q-chain tokens proposed]

    mine: dict[str, list[int]] = {}  # this prompt's tallies

    def add(name, tr):
        for d in (totals, mine):
            acc = d.setdefault(name, [0, 0])
            acc[0] += tr[0]
            acc[1] += tr[1]

    for i, prompt in enumerate(prompts, 1):
        mine = {}
        g = target_engine.generate([prompt], params)[0].token_ids
        if len(g) < 2:
            pass
        elif hasattr(draft, "feature_layers"):  # an EAGLE-3 drafter reads the target's features
            _eagle_tau(target_engine.target, draft, prompt, g, depth, top_k, budgets, add, tlv, tallies)
        else:
            _plain_tau(target_engine.target, draft, prompt, g, depth, top_k, budgets, oracle_ks, add, tlv, tallies)
        if progress is not None:
            progress(i, len(prompts), mine, totals)
    out = {f"tau_{k}": round(v[0] / v[1], 4) for k, v in totals.items() if v[1]}
    if "tau_chain" in out and "tau_tree32" in out:
        out["tau_ratio_tree32_chain"] = round(out["tau_tree32"] / out["tau_chain"], 4)
    out.update({f"rounds_{k}": v[1] for k, v in totals.items()})
    out.update({f"tlv{n}_q_chain_agreement": round(a / p, 4) for n, (a, p) in tallies.items() if p})
    if tlv is not None:
        tlv_summary(out, tlv, budgets)
    return out


def _single(tree):
    from tree_verify import DraftTree

    if tree.tokens.dim() == 1:
        return tree
    return DraftTree(tree.tokens[0], tree.parents[0], tree.depths[0], tree.scores[0])
