"""The drafter's head and its distillation loss in one pass: KL(teacher || softmax(x W^T)) and top-1 hits,
with the gradient taken in the forward, chunk by chunk, so no logits outlive their chunk.

Why. The head is the big tensor of EAGLE-3 training: 32k draft-vocabulary logits for every answer token,
seven times a step (one per TTT step). The plain autograd form (``head_stats_reference``, which
training ran under activation checkpointing) writes the logits, casts them to fp32, runs log-softmax, multiplies by the
teacher, sums, takes the argmax, and in the backward recomputes the logits and runs each op's backward:
on the H200 (SmolLM2, 16 rows of 1,024 tokens, 62be095) "head_loss" took 44 ms and "backward" 80 ms of a
199 ms step, about 100 bytes of memory traffic per logit for work that needs a few. With this pass
(4fb4ff5, same data, a drafter MLP three times wider) they took 29 and 38 ms of a 107 ms step.

How. Per chunk of rows: logits = x W^T (the compute dtype: bf16 under autocast), then one elementwise
pass (``kl_chunk``, compiled on CUDA) gives the rows' KL sum, the hits, and dKL/dlogits = q - p (q the
drafter's softmax, p the teacher's distribution over the draft vocabulary, which sums to one). That
gradient goes straight through the GEMMs: dx = g W (and dW += g^T x when the head trains), so the
backward only scales the saved dx by the loss's incoming gradient. Memory: dx [M, H] and, for a trained
head, dW in fp32; a chunk's logits and g are freed before the next.

``head_stats`` is the one entry point (training and evaluation); ``head_stats_reference`` is the plain
autograd form it replaces, kept beside it for the tests.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

CHUNK = 8192  # rows of logits alive at once (8192 x 32000 fp32 = 1 GiB, and as much for g)


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))  # at least fp32 (fp64 tests keep fp64)


def kl_chunk(lg: torch.Tensor, probs, neg_entropy, top, d2t):
    """(KL sum, hits, dKL/dlg) of logits lg [m, V] against the teacher's probs [m, V] (rows summing to 1),
    neg_entropy [m] (sum p log p) and argmax ``top`` [m] (target vocabulary; d2t maps draft ids)."""
    lgf = _f32(lg)
    logq = lgf - torch.logsumexp(lgf, -1, keepdim=True)
    kl = (neg_entropy - (probs * logq).sum(-1)).sum()
    hits = (d2t[lgf.argmax(-1)] == top).sum()
    return kl, hits, (logq.exp() - probs).to(lg.dtype)


_compiled = None
_compile_failed: str | None = None  # why the compiled pass was given up (then every chunk runs eagerly)


def _kl_chunk_for(lg: torch.Tensor):
    """``kl_chunk``, compiled (dynamic row count: the last chunk is shorter) where the logits are on CUDA;
    a compile that fails falls back to the eager pass for the rest of the process, so a training run
    never dies of it."""
    global _compiled
    if not lg.is_cuda or _compile_failed is not None:
        return kl_chunk
    if _compiled is None:
        _compiled = torch.compile(kl_chunk, dynamic=True)
    return _guarded


def _guarded(*args):
    global _compile_failed
    try:
        return _compiled(*args)
    except Exception as e:  # noqa: BLE001 - any compile or codegen failure: the eager pass is exact too
        _compile_failed = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        warnings.warn(f"drafter head loss: compiled pass failed, running eagerly ({_compile_failed})", stacklevel=2)
        return kl_chunk(*args)


class _HeadKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, probs, neg_entropy, top, d2t, chunk):
        on = torch.is_autocast_enabled(x.device.type)
        cdt = torch.get_autocast_dtype(x.device.type) if on else x.dtype
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        wc = w.to(cdt)
        dx = torch.empty_like(x) if need_x else None
        dw = torch.zeros(w.shape, dtype=_f32(w).dtype, device=w.device) if need_w else None
        kl = torch.zeros((), dtype=_f32(probs).dtype, device=x.device)
        hits = torch.zeros((), dtype=torch.long, device=x.device)
        with torch.autocast(x.device.type, enabled=False):  # the dtypes are chosen here, once
            for a in range(0, x.shape[0], chunk):
                xc = x[a : a + chunk].to(cdt)
                lg = xc @ wc.t()
                s, c, g = _kl_chunk_for(lg)(
                    lg, probs[a : a + chunk], neg_entropy[a : a + chunk], top[a : a + chunk], d2t
                )
                kl, hits = kl + s, hits + c
                if need_x:
                    dx[a : a + chunk] = (g @ wc).to(x.dtype)
                if need_w:
                    dw += _f32(g.t() @ xc)  # in the compute dtype, summed in fp32
                del lg, g
        ctx.w_dtype = w.dtype
        ctx.save_for_backward(*(t for t in (dx, dw) if t is not None))
        ctx.has = (need_x, need_w)
        ctx.mark_non_differentiable(hits)
        return kl, hits

    @staticmethod
    def backward(ctx, g_kl, _g_hits):
        saved = iter(ctx.saved_tensors)
        dx = next(saved) * g_kl.to(ctx.saved_tensors[0].dtype) if ctx.has[0] else None
        dw = (next(saved) * g_kl).to(ctx.w_dtype) if ctx.has[1] else None
        return dx, dw, None, None, None, None, None


def head_stats(drafter, h: torch.Tensor, probs, neg_entropy, top, chunk: int = CHUNK):
    """(sum of KL(teacher || drafter), number of top-1 agreements) over rows of h [M, H]; differentiable
    in h (and in the head's weight when it trains). The hits are a tensor (no host sync here)."""
    x = drafter.norm(h)
    return _HeadKL.apply(x, drafter.lm_head.weight, probs, neg_entropy, top, drafter.d2t, chunk)


def head_stats_reference(drafter, h, probs, neg_entropy, top) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain autograd form of ``head_stats`` (the logits kept for the backward)."""
    lg = _f32(drafter.logits(h))
    kl = neg_entropy - (probs * F.log_softmax(lg, -1)).sum(-1)
    hits = (drafter.d2t[lg.argmax(-1)] == top).sum()
    return kl.sum(), hits
