"""Co-located speculative rounds: the batch split in two groups whose rounds are pipelined.

``ColocatedRound`` (bottom) is how the engine runs them: a strategy of the one loop (``rows.RowBatch``),
chosen by ``EngineOptions.colocate``. ``ColocatedDecoder`` is the self-contained driver the colocate
suite and its tests use.

Round r verifies group A's drafts while drafting for group B, round r + 1 the other way round
(``colocate.CoScheduledRound``), so the draft of one group overlaps the verification of the other on one
GPU. Per request the work is exactly the engine's chain round (``Engine._draft`` / ``_verify``, greedy):
the same draft steps at the same positions, the same verification block and acceptance rule, so every
request's output is the conventional round's.

``RoundBuffers`` holds one group's static inputs (the tensors a captured round reads), so the same
objects serve eager CPU runs and CUDA-graph replays; ``ColocatedDecoder`` drives whole generations (CPU
tests, examples) and ``build_round`` gives the suites one round to time.
"""

from __future__ import annotations

import torch

from ..colocate.coschedule import CoScheduledRound
from ..colocate.plan import JointPlan
from ..colocate.segments import StepInputs, draft_chain, verify_chain
from ..models.llama import Transformer, fused_attention_supported
from .attn_meta import StepMeta, build_step_meta, causal_tree
from .kv_cache import KVCache
from .sampling import nonfinite_rows
from .spec import chain_accept_greedy


def _static_meta(seq_len, anc, depth, kv_len, group, with_mask) -> StepMeta:
    # Own, dense copies: ``load`` rewrites them in place (the expanded mask of build_step_meta cannot be).
    m = build_step_meta(seq_len, anc, depth, kv_len, group, with_mask)
    return StepMeta(m.positions.clone(), m.slots.clone(), None if m.mask is None else m.mask.contiguous().clone())


def fused_attention_ok(model: Transformer) -> bool:
    """Whether the fused tree-attention kernel serves this model here (CUDA, a head size it has)."""
    return model.embed.weight.device.type == "cuda" and fused_attention_supported(model.cfg)


def _rows(kv: KVCache, lo: int, hi: int):
    # A group's rows of the cache as views: writes land in the shared cache.
    return [(k[lo:hi], v[lo:hi]) for k, v in kv.layers]


class RoundBuffers:
    """Static inputs of one group's draft steps and verification block, refreshed by ``load``.

    ``fused`` (default: where the kernel serves both models) attends with the fused tree-attention kernel,
    which reads each row's live slots and needs no dense mask, as the engine's captured steps do;
    otherwise SDPA with a dense [B, 1, N * G, kv_len] mask.
    """

    def __init__(
        self,
        target: Transformer,
        draft: Transformer,
        t_kv,
        d_kv,
        lo: int,
        hi: int,
        gamma: int,
        kv_len: int,
        fused: bool | None = None,
    ):
        dev = target.embed.weight.device
        self.lo, self.hi, self.gamma, self.kv_len = lo, hi, gamma, kv_len
        self.fused = fused_attention_ok(target) and fused_attention_ok(draft) if fused is None else fused
        B = hi - lo
        self.seq_len = torch.zeros(B, dtype=torch.long, device=dev)
        self.draft_block = torch.zeros(B, 2, dtype=torch.long, device=dev)  # [prev, next_tok]
        self.verify_block = torch.zeros(B, gamma + 1, dtype=torch.long, device=dev)  # [next_tok, drafts]
        t_group = target.cfg.num_heads // target.cfg.num_kv_heads
        d_group = draft.cfg.num_heads // draft.cfg.num_kv_heads
        # Draft step 0 is two tokens at seq_len - 1; step s >= 1 one token at seq_len + s. Each step's start
        # is a static tensor of its own (``load`` rewrites it) because the fused kernel reads it.
        self.draft_steps = []
        for s in range(gamma):
            anc, depth = causal_tree(2 if s == 0 else 1, dev)
            start = torch.zeros(B, dtype=torch.long, device=dev)
            meta = _static_meta(start, anc, depth, kv_len, d_group, not self.fused)
            self.draft_steps.append((s - 1 if s == 0 else s, start, anc, depth, meta, d_group))
        anc, depth = causal_tree(gamma + 1, dev)
        self.verify_meta = (
            0,
            self.seq_len,
            anc,
            depth,
            _static_meta(self.seq_len, anc, depth, kv_len, t_group, not self.fused),
            t_group,
        )

        def inputs(step, tokens, kv, width):
            _, start, anc, _, meta, _ = step
            return StepInputs(
                tokens,
                meta.positions,
                meta.slots,
                meta.mask,
                kv,
                start if self.fused else None,
                anc if self.fused else None,
                width=width,
                batch=B,
            )

        self.d_inputs = [
            inputs(st, self.draft_block if s == 0 else None, _rows(d_kv, lo, hi), 2 if s == 0 else 1)
            for s, st in enumerate(self.draft_steps)
        ]
        self.t_inputs = inputs(self.verify_meta, self.verify_block, _rows(t_kv, lo, hi), gamma + 1)

    def load(self, seq_len: torch.Tensor) -> None:
        """Recompute starts, positions, slots and masks in place for new lengths (no new tensors)."""
        self.seq_len.copy_(seq_len)
        for offset, start, anc, depth, meta, group in (*self.draft_steps, self.verify_meta):
            if start is not self.seq_len:
                start.copy_(self.seq_len + offset)
            fresh = build_step_meta(start, anc, depth, self.kv_len, group, not self.fused)
            meta.positions.copy_(fresh.positions)
            meta.slots.copy_(fresh.slots)
            if meta.mask is not None:
                meta.mask.copy_(fresh.mask)


def build_round(
    target,
    draft,
    verify_bufs: RoundBuffers,
    draft_bufs: RoundBuffers,
    plan: JointPlan | None = None,
    *,
    streams: bool = True,
    compiled: bool = False,
) -> CoScheduledRound:
    """One co-scheduled round: verify ``verify_bufs``' group while drafting for ``draft_bufs``' group
    (``compiled``: the operations between GEMMs compiled, see ``colocate.segments``)."""
    t = verify_chain(target, verify_bufs.t_inputs, compiled)
    d = draft_chain(draft, draft_bufs.d_inputs, compiled)
    return CoScheduledRound(t, d, plan, device=target.embed.weight.device, streams=streams)


class ColocatedDecoder:
    """Greedy chain speculative decoding with co-located rounds over two request groups.

    Parameters
    ----------
    target, draft : Transformer
    gamma : int, draft tokens per round
    max_batch, max_seq : cache shape (rows, slots per row; plus ``scratch`` slots past max_seq)
    plan : JointPlan, optional; the joint plan every round runs under (default: co-scheduling only)
    fused : bool, optional; attention through the fused tree kernel (default where it serves, see
        ``RoundBuffers``)
    graphs : bool, optional; capture each of the two rounds in one CUDA graph on first use and replay it
        (default: on CUDA). Capture runs a round three times on the loaded inputs; every slot those runs
        write is written again, identically, by the replay that follows.
    compiled : bool; compile the operations between GEMMs (``colocate.segments``), as the suites do
    """

    def __init__(
        self,
        target: Transformer,
        draft: Transformer,
        gamma: int,
        max_batch: int,
        max_seq: int,
        plan: JointPlan | None = None,
        scratch: int = 64,
        fused: bool | None = None,
        graphs: bool | None = None,
        compiled: bool = False,
    ):
        self.target, self.draft, self.gamma, self.plan, self.fused = target, draft, gamma, plan, fused
        on_cuda = target.embed.weight.device.type == "cuda"
        self.graphs = on_cuda if graphs is None else graphs and on_cuda
        self.compiled = compiled
        dev, dt = target.embed.weight.device, target.embed.weight.dtype
        self.max_batch, self.kv_len = max_batch, max_seq + scratch
        self.t_kv = KVCache(target.cfg, max_batch, self.kv_len, dev, dt)
        self.d_kv = KVCache(draft.cfg, max_batch, self.kv_len, dev, dt)

    def _prefill(self, model: Transformer, kv: KVCache, prompts: list[list[int]]) -> torch.Tensor:
        dev = model.embed.weight.device
        group = model.cfg.num_heads // model.cfg.num_kv_heads
        last = []
        for r, p in enumerate(prompts):
            toks = torch.tensor([p], device=dev)
            anc, depth = causal_tree(len(p), dev)
            meta = build_step_meta(torch.zeros(1, dtype=torch.long, device=dev), anc, depth, self.kv_len, group)
            logits = model(toks, meta.positions, meta.slots, meta.mask, _rows(kv, r, r + 1))
            last.append(logits[0, -1])
        return torch.stack(last)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy tokens for each prompt (the first ``max_new_tokens`` of what the rounds emit)."""
        B, g = len(prompts), self.gamma
        if not 2 <= B <= self.max_batch:
            raise ValueError(f"co-located rounds need 2..{self.max_batch} requests, got {B}")
        if max(map(len, prompts)) + max_new_tokens + 2 * (g + 1) > self.kv_len:
            raise ValueError("prompts and new tokens exceed the cache")
        dev = self.target.embed.weight.device
        next_tok = self._prefill(self.target, self.t_kv, prompts).argmax(-1)
        self._prefill(self.draft, self.d_kv, prompts)
        prev = torch.tensor([p[-1] for p in prompts], device=dev)
        seq_len = torch.tensor([len(p) for p in prompts], device=dev)
        out = [[int(t)] for t in next_tok.tolist()]
        h = B // 2
        groups = [(0, h), (h, B)]
        bufs = [
            RoundBuffers(self.target, self.draft, self.t_kv, self.d_kv, lo, hi, g, self.kv_len, self.fused)
            for lo, hi in groups
        ]
        # rounds[x] verifies group x and drafts for group 1 - x; built once, re-run every round.
        rounds = [
            build_round(self.target, self.draft, bufs[x], bufs[1 - x], self.plan, compiled=self.compiled)
            for x in (0, 1)
        ]
        drafts: list[torch.Tensor | None] = [None, None]

        def load_draft(x):
            lo, hi = groups[x]
            bufs[x].load(seq_len[lo:hi])
            bufs[x].draft_block.copy_(torch.stack([prev[lo:hi], next_tok[lo:hi]], 1))

        # Prologue: group 0 drafts alone (a conventional draft of one group).
        load_draft(0)
        solo = draft_chain(self.draft, bufs[0].d_inputs, self.compiled)
        solo.run()
        drafts[0] = torch.stack(solo.state["drafts"], 1)
        x = 0
        while min(len(o) for o in out) < max_new_tokens:
            lo, hi = groups[x]
            bufs[x].verify_block.copy_(torch.cat([next_tok[lo:hi, None], drafts[x]], 1))
            load_draft(1 - x)
            rnd = rounds[x]
            if self.graphs and rnd.graph is None:
                rnd.capture()  # both groups' inputs are loaded by now
            rnd()
            drafts[1 - x] = torch.stack(rnd.draft.state["drafts"], 1)
            n, bonus = chain_accept_greedy(drafts[x], rnd.target.state["logits"])
            # Rows that have all their tokens stop advancing: they re-run the same round in place.
            active = torch.tensor([len(o) < max_new_tokens for o in out[lo:hi]], device=dev)
            emitted = torch.cat([drafts[x], bonus[:, None]], 1)
            emitted.scatter_(1, n[:, None], bonus[:, None])
            for r, (row, k) in enumerate(zip(emitted.tolist(), n.tolist(), strict=True)):
                if active[r]:
                    out[lo + r] += row[: k + 1]
            # The token now at seq_len - 1 is the last accepted draft, or next_tok when none was accepted.
            last = torch.where(n > 0, drafts[x].gather(1, (n - 1).clamp_min(0)[:, None])[:, 0], next_tok[lo:hi])
            prev[lo:hi] = torch.where(active, last, prev[lo:hi])
            seq_len[lo:hi] += (n + 1) * active
            next_tok[lo:hi] = torch.where(active, bonus, next_tok[lo:hi])
            x = 1 - x
        return [o[:max_new_tokens] for o in out]


class ColocatedRound:
    """Co-located rounds as a strategy of the engine's one loop (``EngineOptions.colocate``).

    The KV rows are split in two fixed halves, A = rows ``0 .. R/2 - 1`` and B = the rest (R = KV rows).
    Step t verifies one half's drafts (drafted in step t - 1) while drafting for the other half, on two
    streams (``colocate.CoScheduledRound``, captured as one CUDA graph per direction on CUDA); the next
    step swaps the halves. Only the verified half emits tokens in a step: the other half's rows get
    ``n = -1`` in ``state.out`` (``RowBatch`` emits nothing for them). Per request the work is the
    engine's chain round (same draft steps, verify block and acceptance), so greedy output is AR's.

    A row admitted into a half after that half was drafted carries drafts made for its previous owner:
    the verify pass rejects what does not match (n = 0: the bonus alone, the target's own token), so the
    output stays exact and only that one step's acceptance suffers. Sampled batches and batches that do not
    fill both halves' capacity run the conventional round (``fallback``).
    """

    def __init__(self, target_runner, draft_runner, gamma: int, fallback, plan: JointPlan | None = None):
        self.fallback = fallback
        self.target, self.draft = target_runner.model, draft_runner.model
        self.gamma = gamma
        R = target_runner.kv.max_batch
        if R < 2:
            raise ValueError("co-located rounds need at least 2 KV rows (max_batch_size >= 2)")
        dev = target_runner.device
        h = R // 2
        self.groups = [(0, h), (h, R)]
        self.kv_len = target_runner.kv.max_seq
        self.bufs = [
            RoundBuffers(
                self.target,
                self.draft,
                target_runner.kv,
                draft_runner.kv,
                lo,
                hi,
                gamma,
                self.kv_len,
                fused=target_runner.round_fused and draft_runner.round_fused,
            )
            for lo, hi in self.groups
        ]
        compiled = target_runner._layer_fn is not None
        self.rounds = [
            build_round(self.target, self.draft, self.bufs[x], self.bufs[1 - x], plan, compiled=compiled)
            for x in (0, 1)
        ]
        self.graphs = target_runner.use_graphs
        self.drafts = torch.zeros(R, gamma, dtype=torch.long, device=dev)
        self.turn = 0  # the half verified next
        self._ar = torch.arange(gamma + 1, device=dev)

    def run(self, st, b: int, bs, max_len: int | None = None) -> None:
        if not bs.all_greedy:
            return self.fallback.run(st, b, bs, max_len)
        x = self.turn
        (lo, hi), (dlo, dhi) = self.groups[x], self.groups[1 - x]
        g = self.gamma
        nxt, seq, use = st.next_tok[lo:hi], st.seq_len[lo:hi], st.in_use[lo:hi]
        self.bufs[x].load(seq)
        self.bufs[x].verify_block.copy_(torch.cat([nxt[:, None], self.drafts[lo:hi]], 1))
        dseq = st.seq_len[dlo:dhi]
        self.bufs[1 - x].load(dseq)
        prev = st.history[dlo:dhi].gather(1, (dseq - 1)[:, None])[:, 0]
        self.bufs[1 - x].draft_block.copy_(torch.stack([prev, st.next_tok[dlo:dhi]], 1))
        rnd = self.rounds[x]
        if self.graphs and rnd.graph is None:
            rnd.capture()  # both halves' inputs are loaded; the warm-up writes what the replay rewrites
        rnd()
        self.drafts[dlo:dhi] = torch.stack(rnd.draft.state["drafts"], 1)
        drafts = self.drafts[lo:hi]
        logits = rnd.target.state["logits"]
        n, bonus = chain_accept_greedy(drafts, logits)
        block = self.bufs[x].verify_block
        st.history[lo:hi].scatter_(1, seq[:, None] + self._ar, block)
        out = st.out[lo:hi]
        out[:, :g] = drafts
        out[:, g] = bonus
        out.scatter_(1, n[:, None], bonus[:, None])
        out[:, -2] = nonfinite_rows(logits)
        out[:, -1] = n
        st.out[dlo:dhi, -1] = -1  # the drafted half emits nothing this step
        seq += (n + 1) * use
        nxt.copy_(torch.where(use, bonus, nxt))
        self.turn = 1 - x
