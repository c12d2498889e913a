"""Training of the EAGLE-3 feature drafter (``drafters.eagle3``) with training-time test (TTT).

Data. Prompts only, from the training sources of ``drafters.train`` (HumanEval 0-99, the committed offline
set; ``synthetic`` for tests): ``check_training_prompts`` refuses evaluation text (MT-Bench is never a
training source) before anything runs. The target answers every prompt itself through the engine, with
its chat template: greedily and/or sampled (temperature 0.8 by default, fixed seeds), so the drafter
sees the target's own distribution, including the branches a sampled request takes. A few prompts (both
of their answers) are held out to measure agreement on text the drafter never trained on.

What the drafter learns, step by step (this is what the engine feeds it, ``engine/draft_tree.py``):

    step 0    input at p: emb(x_p) and g = fc(F_{p-1}) (F = the target's features; zeros at p = 0)
              attends: step-0 K/V at j <= p                         (the prefix with true features)
    step k    input at p: emb(x_p) and g = h^{k-1}_{p-1} (its own step k-1 output, no fc)
              attends: step-0 K/V at j <= p - k, and step-i K/V at j = p - k + i for i = 1..k

i.e. step k at p is the depth-k node of a chain rooted at r = p - k: the prefix up to the root carries
true features, the nodes after it carry the drafter's own hidden states, every node sits at rope position
p. Tokens are the true ones (teacher forcing), so the step-k loss is conditioned on the previous k
drafts having been accepted, exactly the situation in which a depth-k draft matters. The loss at step k,
position p is KL(teacher || drafter), the teacher being the target's distribution at p restricted to
the draft vocabulary and renormalised, over answer positions with p - k >= 0, weighted 0.8**k (EAGLE-3).
Top-1 agreement per step (drafter argmax == target argmax) is the conditional acceptance of a greedy
chain at that depth, so 1 + sum_d prod_{k<d} acc_k estimates its tokens per round.

Shapes. Sequences are packed into rows of ``max_len`` tokens (a block-diagonal mask keeps them apart,
positions restart at 0 per sequence); step k attends over the concatenated K/V of steps 0..k with a
dense mask (SDPA; grouped-query heads folded into the query axis as ``models.llama.Attention.core``
does). The head's logits over 32k tokens are the big tensor: the head and the KL run fused per chunk of
rows with the gradient taken in the forward (``drafters.head_loss``), so only hidden states stay alive.

Optimisation: AdamW on fp32 master copies of the drafter's own weights (fc, the layer, norm, and lm_head
with ``head="trained"``; by default the head is the target's rows of the draft vocabulary, frozen, see
``drafters.eagle3``; the embedding is the target's and stays frozen), bf16 autocast where the target runs
in bf16, linear warm-up then cosine decay, gradient clipping. The summary's ``step_ms_by_phase`` splits five
steps' time into batch, target pass, TTT forward, head and loss, backward and optimizer (synced, after the
steps ``train_seconds`` times). ``train_seconds`` fits the number of steps to
a time budget from the speed of the first steps.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..models.rope import apply_rope
from .eagle3 import MARKER, Eagle3Drafter, continue_eagle3, init_eagle3, load_eagle3, save_eagle3
from .head_loss import head_stats
from .train import check_training_prompts

ANSWER_KINDS = ("greedy", "sampled")
TTT_DECAY = 0.8  # step k's loss weight is TTT_DECAY ** k (EAGLE-3's schedule)
DRAFT_VOCAB = 32000


# ---- data ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sequence:
    """One training sequence: prompt + the target's answer (token ids), and where the answer starts."""

    ids: tuple[int, ...]
    prompt_len: int
    prompt_index: int  # which prompt (held-out prompts keep both of their answers out of training)
    answer: str  # "greedy" or "sampled"


def parse_answers(spec: str) -> tuple[str, ...]:
    """``greedy,sampled`` -> ("greedy", "sampled"); refuses unknown or empty lists."""
    kinds = tuple(dict.fromkeys(s.strip() for s in spec.split(",") if s.strip()))
    if not kinds or any(k not in ANSWER_KINDS for k in kinds):
        raise ValueError(f"--answers {spec!r}: a comma list of {', '.join(ANSWER_KINDS)}")
    return kinds


def make_answers(
    engine,
    prompts: list,
    new_tokens: int,
    chat: bool,
    answers: tuple[str, ...] = ANSWER_KINDS,
    temperature: float = 0.8,
    seed: int = 0,
    batch: int | None = None,
    log=None,
) -> list[Sequence]:
    """The target's own answers to ``prompts``, one per prompt and answer kind, through ``engine``.

    Sampled answers seed every chunk of ``batch`` prompts with ``seed`` + the chunk's index, so a rerun
    with the same prompts, batch and seed gives the same data. A prompt with no room left in the engine's
    context for even one token is skipped; a long one gets a shorter answer."""
    from ..engine import SamplingParams

    batch = batch or engine.options.max_batch_size
    encoded = [(i, engine.encode(p, chat)) for i, p in enumerate(prompts)]
    room = [(i, ids, min(new_tokens, engine.max_new_tokens_for(len(ids)))) for i, ids in encoded]
    room = [(i, ids, n) for i, ids, n in room if n >= 1]
    out: list[Sequence] = []
    t0 = time.perf_counter()
    for kind in answers:
        for c, start in enumerate(range(0, len(room), batch)):
            chunk = room[start : start + batch]
            params = [
                SamplingParams(max_new_tokens=n)
                if kind == "greedy"
                else SamplingParams(max_new_tokens=n, temperature=temperature, seed=seed + c)
                for _, _, n in chunk
            ]
            results = engine.generate([ids for _, ids, _ in chunk], params)
            for (i, ids, _), r in zip(chunk, results, strict=True):
                out.append(Sequence(tuple(ids) + tuple(r.token_ids), len(ids), i, kind))
            if log is not None and (c % 8 == 7 or start + batch >= len(room)):
                done = min(start + batch, len(room))
                log(f"{kind} answers: {done}/{len(room)} prompts, {time.perf_counter() - t0:.0f}s")
    return out


def draft_vocabulary(seqs: list[Sequence], vocab_size: int, size: int = DRAFT_VOCAB) -> torch.Tensor:
    """d2t: the ``min(size, vocab_size)`` most frequent token ids of the sequences (prompts and answers),
    ties (unseen tokens too) by id, sorted ascending."""
    size = min(size, vocab_size)
    counts = torch.zeros(vocab_size, dtype=torch.long)
    if seqs:
        counts = torch.bincount(torch.tensor([t for s in seqs for t in s.ids]), minlength=vocab_size)
    order = torch.sort(-counts, stable=True).indices  # descending count; stable keeps ids ascending in ties
    return order[:size].sort().values


def pack(seqs: list[Sequence], max_len: int) -> list[list[Sequence]]:
    """Rows of at most ``max_len`` tokens, first-fit decreasing (longest first, into the first row with
    room). Longer sequences are cut to ``max_len``; one with no answer position left is dropped."""
    fit = []
    for s in seqs:
        if s.prompt_len < min(len(s.ids), max_len):  # at least one answer token stays
            fit.append(Sequence(s.ids[:max_len], s.prompt_len, s.prompt_index, s.answer))
    fit.sort(key=lambda s: -len(s.ids))  # stable: equal lengths keep their order
    rows: list[list[Sequence]] = []
    room: list[int] = []
    for s in fit:
        n = len(s.ids)
        j = next((j for j, r in enumerate(room) if r >= n), None)
        if j is None:
            rows.append([s])
            room.append(max_len - n)
        else:
            rows[j].append(s)
            room[j] -= n
    return rows


@dataclass
class Batch:
    """Packed rows [B, S]: token ids, rope positions (0 at each sequence start), segment ids (which
    sequence of the row; the padding tail is a segment of its own) and answer positions (those that
    predict an answer token: p in prompt_len - 1 .. len - 2 of their sequence)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    segments: torch.Tensor
    answer: torch.Tensor

    def to(self, device) -> Batch:
        return Batch(
            *(t.to(device, non_blocking=True) for t in (self.tokens, self.positions, self.segments, self.answer))
        )


def make_batch(rows: list[list[Sequence]], align: int = 16) -> Batch:
    """Stack packed rows, padded to the longest (rounded up to ``align``, a friendlier attention shape)."""
    S = max(sum(len(s.ids) for s in r) for r in rows)
    S = -(-S // align) * align
    B = len(rows)
    tokens = torch.zeros(B, S, dtype=torch.long)
    positions = torch.zeros(B, S, dtype=torch.long)
    segments = torch.zeros(B, S, dtype=torch.long)
    answer = torch.zeros(B, S, dtype=torch.bool)
    for b, row in enumerate(rows):
        at = 0
        for i, s in enumerate(row):
            n = len(s.ids)
            tokens[b, at : at + n] = torch.tensor(s.ids)
            positions[b, at : at + n] = torch.arange(n)
            segments[b, at : at + n] = i
            answer[b, at + s.prompt_len - 1 : at + n - 1] = True
            at += n
        positions[b, at:] = torch.arange(S - at)  # padding: one more (dummy) sequence, token 0
        segments[b, at:] = len(row)
    return Batch(tokens, positions, segments, answer)


# ---- forward passes -----------------------------------------------------------------------------------
def ttt_mask(segments: torch.Tensor, k: int) -> torch.Tensor:
    """Visibility of TTT step ``k``'s queries over the keys of steps 0..k, concatenated [B, S, (k+1) S]:
    step-0 keys at j <= p - k and step-i keys at j = p - k + i (i = 1..k), within the query's sequence.
    Step 0 is the causal mask. Every query sees at least itself (i = k, j = p), so no row is empty."""
    S = segments.shape[1]
    idx = torch.arange(S, device=segments.device)
    rel = idx[None, :] - idx[:, None]  # j - p
    same = segments[:, :, None] == segments[:, None, :]
    return torch.cat([same & (rel <= -k)] + [same & (rel == i - k) for i in range(1, k + 1)], -1)


def _gqa_attention(cfg, q, k, v, visible) -> torch.Tensor:
    """SDPA with the G query heads of a KV head folded into the query axis (row n * G + g), the layout of
    ``models.llama.Attention.core``. q [B, N, Hq, D]; k, v [B, L, Hkv, D]; visible [B, N, L] bool."""
    B, N = q.shape[:2]
    L = k.shape[1]
    G = cfg.num_heads // cfg.num_kv_heads
    qf = q.reshape(B, N, cfg.num_kv_heads, G, cfg.head_dim).transpose(1, 2).reshape(B, cfg.num_kv_heads, N * G, -1)
    mask = visible[:, :, None, :].expand(B, N, G, L).reshape(B, 1, N * G, L)
    o = F.scaled_dot_product_attention(qf, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return o.view(B, cfg.num_kv_heads, N, G, cfg.head_dim).transpose(1, 2).reshape(B, N, cfg.q_size)


@torch.no_grad()
def target_pass(target, batch: Batch, feature_layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target over packed rows: (logits [B, S, V], features [B, S, len(feature_layers) * hidden]).

    A fresh cache per call (every slot is written before it is read); slots are the row's columns, rope
    positions restart per sequence and the mask is causal within each sequence."""
    B, S = batch.tokens.shape
    cfg, dev, dtype = target.cfg, batch.tokens.device, target.embed.weight.dtype
    kv = [
        (
            torch.empty(B, S, cfg.num_kv_heads, cfg.head_dim, device=dev, dtype=dtype),
            torch.empty(B, S, cfg.num_kv_heads, cfg.head_dim, device=dev, dtype=dtype),
        )
        for _ in range(cfg.num_layers)
    ]
    G = cfg.num_heads // cfg.num_kv_heads
    visible = ttt_mask(batch.segments, 0)
    mask = visible[:, :, None, :].expand(B, S, G, S).reshape(B, 1, S * G, S)
    slots = torch.arange(S, device=dev).expand(B, S)
    return target(batch.tokens, batch.positions, slots, mask, kv, feature_layers=feature_layers)


def ttt_forward(
    drafter: Eagle3Drafter,
    tokens: torch.Tensor,
    feats: torch.Tensor,
    steps: int,
    positions: torch.Tensor | None = None,
    segments: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """The drafter's hidden states h^k [B, S, H] of TTT steps k = 0..steps-1 (see the module docstring).

    tokens [B, S]; feats [B, S, 3 * target_hidden]: the target's features at every position (F_p; the
    drafter reads F_{p-1}); positions / segments: per packed sequence (default: one sequence per row).
    Runs the drafter layer's own submodules, so the weights and the arithmetic are the inference path's;
    h^k at positions p < k (of their sequence) has no chain behind it and is not meaningful."""
    B, S = tokens.shape
    dev = tokens.device
    positions = torch.arange(S, device=dev).expand(B, S) if positions is None else positions
    segments = torch.zeros(B, S, dtype=torch.long, device=dev) if segments is None else segments
    layer, cfg = drafter.layers[0], drafter.cfg
    attn = layer.attn
    first = (positions == 0)[..., None]  # a sequence's first token reads project(zeros), as in prefill
    prev = torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], 1).masked_fill(first, 0)
    g = drafter.project(prev)
    emb = drafter.embed(tokens)
    ks, vs, hs = [], [], []
    for k in range(steps):
        x2 = torch.cat([emb.to(g.dtype), g], -1)
        cs = drafter.rope[positions].to(x2.dtype)
        cos, sin = cs[:, :, 0, None], cs[:, :, 1, None]
        a, resid = layer.mixed(x2)
        q, kk, v = attn.wqkv(a).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.view(B, S, cfg.num_heads, cfg.head_dim)
        kk = kk.view(B, S, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(B, S, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, kk = attn.q_norm(q), attn.k_norm(kk)
        q, kk = apply_rope(q, cos, sin), apply_rope(kk, cos, sin)
        ks.append(kk)
        vs.append(v)
        o = _gqa_attention(cfg, q, torch.cat(ks, 1), torch.cat(vs, 1), ttt_mask(segments, k))
        h = resid + attn.wo(o)
        h = h + layer.mlp(layer.mlp_norm(h))
        hs.append(h)
        # Step k+1 at p reads h^k_{p-1}; at a sequence start there is no p - 1 (and no chain: masked out).
        g = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1).masked_fill(first, 0)
    return hs


# ---- loss ---------------------------------------------------------------------------------------------
@dataclass
class Teacher:
    """The target at the batch's answer positions (M of them, row-major order)."""

    rows: torch.Tensor  # [M] flat indices into [B * S]
    local: torch.Tensor  # [M] position of each within its sequence (step k counts those with local >= k)
    probs: torch.Tensor  # [M, Vd] float32, the target's distribution restricted to the draft vocabulary
    neg_entropy: torch.Tensor  # [M] sum p log p, so KL = neg_entropy - sum p log q
    top: torch.Tensor  # [M] the target's argmax (target vocabulary): what a greedy round accepts


@torch.no_grad()
def make_teacher(logits: torch.Tensor, batch: Batch, d2t: torch.Tensor) -> Teacher:
    rows = batch.answer.flatten().nonzero()[:, 0]
    return teacher_from_rows(logits.flatten(0, 1)[rows], rows, batch, d2t)


@torch.no_grad()
def teacher_from_rows(lg: torch.Tensor, rows: torch.Tensor, batch: Batch, d2t: torch.Tensor) -> Teacher:
    """The teacher from the target's logits lg [M, V] at the batch's answer positions ``rows``."""
    logp = F.log_softmax(lg[:, d2t].to(torch.promote_types(lg.dtype, torch.float32)), -1)
    probs = logp.exp()
    return Teacher(rows, batch.positions.flatten()[rows], probs, (probs * logp).sum(-1), lg.argmax(-1))


def step_stats(drafter, h: torch.Tensor, teacher: Teacher, k: int, grad: bool = True):
    """(KL sum, agreements, count) of TTT step k over its weighted positions (answer positions with
    p - k >= 0). The head and the loss run fused, chunk by chunk (``head_loss``): no logits are kept for
    the backward. ``grad``: whether the loss is differentiated (evaluation passes False)."""
    keep = (teacher.local >= k).nonzero()[:, 0]
    n = int(keep.numel())
    if n == 0:
        return teacher.probs.new_zeros(()), 0, 0
    hk = h.flatten(0, 1)[teacher.rows[keep]]
    probs, neg, top = teacher.probs[keep], teacher.neg_entropy[keep], teacher.top[keep]
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        kl, hits = head_stats(drafter, hk, probs, neg, top)
    return kl, int(hits), n


def ttt_weights(steps: int) -> list[float]:
    return [TTT_DECAY**k for k in range(steps)]


def chain_tau(acc: list[float]) -> float:
    """Tokens per round of a greedy chain as deep as ``acc`` if step k's agreement is the acceptance
    of depth k given depths < k accepted: 1 + sum_d prod_{k<d} acc_k."""
    tau, run = 1.0, 1.0
    for a in acc:
        run *= a
        tau += run
    return tau


# ---- training -----------------------------------------------------------------------------------------
def _autocast(target):
    # bf16 autocast where the target runs in a 16-bit type (the master weights are fp32); full precision
    # targets (CPU tests: fp32, fp64) run as they are.
    dev = target.embed.weight.device
    low = target.embed.weight.dtype in (torch.bfloat16, torch.float16)
    return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=low)


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="eagle3", unit="step", file=sys.stderr, dynamic_ncols=True)


class PhaseTimer:
    """Milliseconds per phase of the training step, summed over the steps ``start(True)`` opens: each
    ``mark(name)`` syncs the device and books the time since the previous mark to ``name``."""

    def __init__(self, dev: torch.device):
        self.dev, self.on, self.steps, self.ms = dev, False, 0, {}
        self._t = 0.0

    def start(self, on: bool) -> None:
        self.on = on
        if on:
            _sync(self.dev)
            self.steps += 1
            self._t = time.perf_counter()

    def mark(self, name: str) -> None:
        if not self.on:
            return
        _sync(self.dev)
        now = time.perf_counter()
        self.ms[name] = self.ms.get(name, 0.0) + (now - self._t) * 1000
        self._t = now

    def summary(self) -> dict:
        """Mean milliseconds per timed step, per phase ({} when no step was timed)."""
        return {k: round(v / self.steps, 2) for k, v in self.ms.items()} if self.steps else {}


def _lr_at(step: int, steps: int, warmup: int, lr: float) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup))))


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def evaluate(target, drafter, rows: list[list[Sequence]], ttt_steps: int, batch: int) -> dict:
    """Mean KL and top-1 agreement per TTT step over ``rows`` (no gradient)."""
    dev = target.embed.weight.device
    kl = [0.0] * ttt_steps
    hits = [0] * ttt_steps
    count = [0] * ttt_steps
    with torch.no_grad(), _autocast(target):
        for i in range(0, len(rows), batch):
            b = make_batch(rows[i : i + batch]).to(dev)
            logits, feats = target_pass(target, b, drafter.feature_layers)
            teacher = make_teacher(logits, b, drafter.d2t)
            del logits
            hs = ttt_forward(drafter, b.tokens, feats, ttt_steps, b.positions, b.segments)
            for k, h in enumerate(hs):
                s, c, n = step_stats(drafter, h, teacher, k, grad=False)
                kl[k] += float(s)
                hits[k] += c
                count[k] += n
    acc = [h / max(n, 1) for h, n in zip(hits, count, strict=True)]
    return {
        "kl": [round(s / max(n, 1), 4) for s, n in zip(kl, count, strict=True)],
        "acc": [round(a, 4) for a in acc],
        "chain_tau": round(chain_tau(acc), 3),
        "positions": count[0],
    }


def fit_eagle3(
    target,
    seqs: list[Sequence],
    *,
    ttt_steps: int = 7,
    steps: int | None = 2000,
    batch: int = 16,
    lr: float = 3e-4,
    max_len: int = 1024,
    draft_vocab: int = DRAFT_VOCAB,
    warmup: int | None = None,
    train_seconds: float | None = None,
    eval_frac: float = 0.02,
    seed: int = 0,
    clip: float = 0.5,
    head: str = "target",
    intermediate_size: int | None = None,
    cache_features: bool | None = None,
    init: Eagle3Drafter | None = None,
    progress: bool = True,
    log_every: int = 50,
    log=print,
) -> tuple[Eagle3Drafter, dict]:
    """Train a fresh EAGLE-3 drafter for ``target`` on ``seqs``; returns (drafter, summary).

    ``batch``: packed rows of up to ``max_len`` tokens per optimizer step. ``warmup``: linear warm-up steps
    (default 3% of the steps, at most 100). ``train_seconds``: after ten timed steps, lower ``steps`` to
    what fits this many seconds of training (the cosine schedule then spans the new count); with
    ``steps=None`` the count is what fits, however many (on the H200 a 430 s budget stopped at the
    2,000-step default after 398 s).
    ``eval_frac``: share of the prompts held out (with all their answers) for the final evaluation.
    ``head``: "target" (the target's head rows, frozen and not stored) or "trained" (``init_eagle3``).
    ``intermediate_size``: the drafter layer's MLP units (default: the target's; ``init_eagle3``).
    ``cache_features``: run the target over the training rows once and keep its outputs on the device
    (``drafters.feature_cache``); None: where the cache fits in half the free device memory (CUDA).
    ``init``: a drafter (``load_eagle3``) to train further instead of a fresh one (``continue_eagle3``: its
    draft vocabulary, feature layers and head; ``intermediate_size`` may widen its MLP); the schedule
    restarts (warm-up, then cosine decay over this run's steps)."""
    if ttt_steps < 1:
        raise ValueError(f"ttt_steps must be >= 1, got {ttt_steps}")
    if steps is None:
        if train_seconds is None:
            raise ValueError("steps=None needs train_seconds (the budget that sets the step count)")
        steps = 10**9  # provisional: the timed probe steps fit it to train_seconds
    dev = target.embed.weight.device
    # Held-out prompts, drawn by the seed: both answers of a prompt stay on the same side.
    prompt_ids = sorted({s.prompt_index for s in seqs})
    n_eval = int(len(prompt_ids) * eval_frac)
    held = set(random.Random(seed).sample(prompt_ids, n_eval)) if n_eval else set()
    train_seqs = [s for s in seqs if s.prompt_index not in held]
    eval_seqs = [s for s in seqs if s.prompt_index in held]
    if init is not None and init.spec.head != head:
        raise ValueError(f"the drafter to continue has head {init.spec.head!r}, not {head!r}")
    # Continuing keeps the drafter's vocabulary: its head rows and d2t map were trained for it.
    d2t = init.d2t.cpu() if init is not None else draft_vocabulary(train_seqs, target.cfg.vocab_size, draft_vocab)
    rows = pack(train_seqs, max_len)
    eval_rows = pack(eval_seqs, max_len)
    if not rows:
        raise ValueError("no training sequence has an answer token within max_len")
    n_tokens = sum(len(s.ids) for r in rows for s in r)
    answer_ids = torch.tensor([t for r in rows for s in r for t in s.ids[s.prompt_len :]])
    in_vocab = torch.zeros(target.cfg.vocab_size, dtype=torch.bool)
    in_vocab[d2t] = True
    data = {
        "sequences": sum(len(r) for r in rows),
        "tokens": n_tokens,
        "answer_tokens": int(answer_ids.numel()),
        "rows": len(rows),
        "row_fill": round(n_tokens / (len(rows) * max_len), 3),
        "eval_sequences": len(eval_seqs),
        "draft_vocab": int(d2t.numel()),
        "draft_vocab_coverage": round(float(in_vocab[answer_ids].float().mean()), 4),
    }
    log(
        f"data: {data['sequences']} sequences, {n_tokens} tokens ({data['answer_tokens']} answer) in "
        f"{len(rows)} rows of {max_len} ({data['row_fill']:.0%} full); draft vocabulary {data['draft_vocab']} "
        f"covers {data['draft_vocab_coverage']:.1%} of answer tokens; {len(eval_seqs)} held out"
    )

    torch.manual_seed(seed)
    # head "target": frozen, not a parameter
    if init is not None:
        drafter = continue_eagle3(target, init, intermediate_size)
    else:
        drafter = init_eagle3(target, d2t=d2t, head=head, intermediate_size=intermediate_size)
    params = [p for n, p in drafter.named_parameters() if not n.startswith("embed.")]
    shared = {t.data_ptr() for t in target.parameters()}
    assert not any(p.data_ptr() in shared for p in params), "a trained tensor is the target's"
    frozen = [(p, p.requires_grad) for p in target.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    dtype = target.embed.weight.dtype
    for p in params:  # fp32 master weights; the forward runs under bf16 autocast for a bf16 target
        p.data = p.data.to(torch.promote_types(dtype, torch.float32))
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    weights = ttt_weights(ttt_steps)
    batch = min(batch, len(rows))
    from . import feature_cache

    cache = None
    if cache_features or (cache_features is None and feature_cache.fits(target, rows, drafter.feature_layers)):
        t_cache = time.perf_counter()
        try:
            with _autocast(target):
                cache = feature_cache.FeatureCache(target, rows, drafter.feature_layers, batch)
            _sync(dev)
            data["feature_cache_gb"] = round(cache.bytes / 2**30, 2)
            log(f"target features cached: {data['feature_cache_gb']} GiB")
        except torch.OutOfMemoryError:  # the estimate was short: train with the full pass instead
            cache = None
            torch.cuda.empty_cache()
            data["feature_cache_gb"] = None
            log("target features did not fit the device: training runs the target every step")
        data["feature_cache_seconds"] = round(time.perf_counter() - t_cache, 1)
        if train_seconds is not None:  # the budget is the whole fit's, so a device call's time stays known
            train_seconds = max(1.0, train_seconds - data["feature_cache_seconds"])
    warm = warmup if warmup is not None else max(1, min(100, steps * 3 // 100))
    rng = random.Random(seed)
    order: list[int] = []
    history: list[dict] = []
    bar = _progress(steps, progress)
    t0 = time.perf_counter()
    probe = (3, 13)  # steps timed for train_seconds (the first ones warm up kernels and the allocator)
    t_probe = 0.0
    # Where a step's time goes, over five steps after the probe (each phase ends in a device sync there,
    # which would slow the probe's estimate and which the other steps do not pay): what to speed up next.
    phases, phase_steps = PhaseTimer(dev), (probe[1], probe[1] + 5)
    step = 0
    try:
        while step < steps:
            if len(order) < batch:  # a new epoch: the rows in a fresh order
                more = list(range(len(rows)))
                rng.shuffle(more)
                order += more
            picked, order = order[:batch], order[batch:]
            phases.start(phase_steps[0] <= step < phase_steps[1])
            b = make_batch([rows[i] for i in picked]).to(dev)
            lr_now = _lr_at(step, steps, warm, lr)
            for group in opt.param_groups:
                group["lr"] = lr_now
            phases.mark("batch")
            with _autocast(target):
                if cache is not None:
                    feats, teacher = cache.lookup(picked, b, drafter.d2t)
                else:
                    logits, feats = target_pass(target, b, drafter.feature_layers)
                    teacher = make_teacher(logits, b, drafter.d2t)
                    del logits
                phases.mark("target_pass")
                hs = ttt_forward(drafter, b.tokens, feats, ttt_steps, b.positions, b.segments)
                phases.mark("ttt_forward")
                loss = torch.zeros((), device=dev)
                wsum, kls, accs = 0.0, [], []
                for k, h in enumerate(hs):
                    s, c, n = step_stats(drafter, h, teacher, k)
                    if n:
                        loss = loss + weights[k] * s / n
                        wsum += weights[k]
                    kls.append(float(s.detach()) / max(n, 1))
                    accs.append(c / max(n, 1))
                loss = loss / max(wsum, 1e-9)  # a weighted mean of the steps' mean KL
            phases.mark("head_loss")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            phases.mark("backward")
            gnorm = torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
            phases.mark("optimizer")
            history.append({"loss": float(loss.detach()), "kl": kls, "acc": accs, "gnorm": float(gnorm)})
            step += 1
            if train_seconds is not None and step in probe:
                _sync(dev)
                if step == probe[0]:
                    t_probe = time.perf_counter()
                else:
                    per_step = (time.perf_counter() - t_probe) / (probe[1] - probe[0])
                    left = train_seconds - (time.perf_counter() - t0)
                    fitted = max(step, step + int(left / per_step))
                    if fitted < steps:
                        log(f"{per_step * 1000:.0f} ms/step: {fitted} steps fit {train_seconds:g}s (of {steps})")
                        steps = fitted
                        warm = warmup if warmup is not None else max(1, min(100, steps * 3 // 100))
                        if bar is not None:
                            bar.total = steps
            acc_txt = " ".join(f"{a:.2f}" for a in accs)
            if bar is not None:
                bar.set_postfix_str(f"loss {history[-1]['loss']:.3f} acc {acc_txt} lr {lr_now:.1e}", refresh=False)
                bar.update(1)
            elif log_every and (step % log_every == 1 or step == steps):
                log(f"step {step}/{steps} loss {history[-1]['loss']:.4f} acc {acc_txt} lr {lr_now:.2e}")
    finally:
        if bar is not None:
            bar.close()
    _sync(dev)
    train_s = time.perf_counter() - t0
    for p in params:
        p.requires_grad_(False)
        p.data = p.data.to(dtype)
    for p, flag in frozen:
        p.requires_grad_(flag)

    def mean_of(part: list[dict], key: str) -> list[float]:
        return [round(sum(h[key][k] for h in part) / len(part), 4) for k in range(ttt_steps)]

    tail = history[-max(1, len(history) // 10) :]  # the last tenth of the steps
    start = history[: max(1, len(history) // 10)]  # the first tenth
    summary = {
        **data,
        "ttt_steps": ttt_steps,
        "head": head,
        "intermediate_size": drafter.cfg.intermediate_size,
        "steps": len(history),
        "batch_rows": batch,
        "max_len": max_len,
        "lr": lr,
        "warmup": warm,
        "seed": seed,
        "first_loss": round(history[0]["loss"], 4),
        "last_loss": round(sum(h["loss"] for h in tail) / len(tail), 4),
        "first_acc": mean_of(start, "acc"),
        "last_acc": mean_of(tail, "acc"),
        "train_seconds": round(train_s, 1),
        "step_ms_by_phase": phases.summary(),
        "tokens_per_s": round(len(history) * batch * max_len * data["row_fill"] / max(train_s, 1e-9)),
    }
    summary["last_chain_tau"] = round(chain_tau(summary["last_acc"]), 3)
    if eval_rows:
        summary["eval"] = evaluate(target, drafter, eval_rows, ttt_steps, batch)
        log(f"held out: acc {summary['eval']['acc']} (chain tau ~{summary['eval']['chain_tau']})")
    return drafter, summary


def train_eagle3(
    engine,
    prompts: list,
    out_dir: str | Path,
    *,
    new_tokens: int = 256,
    chat: bool = True,
    answers: tuple[str, ...] = ANSWER_KINDS,
    temperature: float = 0.8,
    seed: int = 0,
    gen_batch: int | None = None,
    sources: str | None = None,
    answers_in: list | None = None,
    answers_out: str | Path | None = None,
    answers_only: bool = False,
    init_from: str | Path | None = None,
    log=print,
    **fit,
) -> dict:
    """Generate the target's answers with ``engine`` (AR), train an EAGLE-3 drafter on them
    (``fit_eagle3``'s keyword arguments), save it to ``out_dir``. Returns the summary that the folder's
    marker also carries (under ``"training"``), plus ``out``.

    ``answers_in``: answer files (``drafters.answers_file``) to train on instead of answering ``prompts``;
    ``answers_out``: write the answers made here to that file; ``answers_only``: stop after writing it
    (returns the file's description); ``init_from``: a drafter folder to train further (``fit_eagle3``'s
    ``init``), whose training record the new marker keeps under ``continued_from``."""
    from .answers_file import load_answers, save_answers, target_identity

    identity = target_identity(engine)
    base, before = None, None
    if init_from is not None and not answers_only:  # before the answers: a bad folder fails in seconds
        base = load_eagle3(init_from, engine.target)
        old = json.loads((Path(init_from) / MARKER).read_text()).get("training", {})
        keep = ("steps", "train_seconds", "prompt_count", "answers", "intermediate_size", "eval", "continued_from")
        before = {"path": str(init_from), **{k: old[k] for k in keep if k in old}}
    t0 = time.perf_counter()
    answered_by: list[dict] | None = None
    if answers_in:
        seqs, prompts, answered_by = load_answers(answers_in, identity)
        answers = tuple(k for k in ANSWER_KINDS if any(s.answer == k for s in seqs))
        temps = {d.get("answer_temperature") for d in answered_by} - {None}
        temperature = temps.pop() if len(temps) == 1 else None
        new_tokens = max(int(d.get("new_tokens", new_tokens)) for d in answered_by)
        chat = all(d.get("chat", chat) for d in answered_by)
        sources = " + ".join(f"{d['file']} ({d.get('prompts', '?')})" for d in answered_by)
        log(f"{len(seqs)} target answers to {len(prompts)} prompts from {len(answers_in)} file(s)")
    else:
        check_training_prompts(prompts)  # before anything runs: never evaluation text
        seqs = make_answers(engine, prompts, new_tokens, chat, answers, temperature, seed, gen_batch, log)
        log(f"{len(seqs)} target answers to {len(prompts)} prompts in {time.perf_counter() - t0:.1f}s")
    gen_s = time.perf_counter() - t0
    made = {
        "prompts": sources if sources is not None else f"{len(prompts)} given",
        "prompt_count": len(prompts),
        "answers": list(answers),
        "answer_temperature": temperature if "sampled" in answers else None,
        "new_tokens": new_tokens,
        "chat": chat,
        "seed": seed,
        "generate_seconds": round(gen_s, 1),
    }
    if answers_out is not None:
        wrote = save_answers(answers_out, seqs, prompts, identity, made)
        log(f"answers written to {answers_out}")
        if answers_only:
            return wrote
    drafter, summary = fit_eagle3(engine.target, seqs, seed=seed, init=base, log=log, **fit)
    if before is not None:
        summary["continued_from"] = before
    dev = engine.target.embed.weight.device
    meta = {
        "trainer": "train_eagle3",
        "target": engine.target.cfg.name,
        **made,
        **({"answers_from": answered_by} if answered_by is not None else {}),
        **summary,
        "total_seconds": round(time.perf_counter() - t0, 1),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev),
    }
    save_eagle3(drafter, out_dir, meta={"training": meta})
    return {**meta, "out": str(out_dir)}
