"""One model's work in a round as an ordered chain of segments, each an ordered list of operations.

A segment is the unit the co-scheduler places on a stream: the embedding, each layer's attention half
and MLP half, the head. Inside a segment every operation is named and typed by kernel family, so a plan
can take one out of its separate kernel and run it inside a cross-model interleaved kernel (``plan.py``).

The operations call the model's own modules in ``Block.forward``'s order (``rms_norm``, the fused
``wqkv``, ``Attention.core``, ``wo``, the residual adds, ``w13``, ``silu_mul``, ``w2``), so a chain run
with every operation on its separate kernel is bit-identical to ``Transformer.forward``.

With ``compiled=True`` (the suites on CUDA) the operations between the GEMMs (norms, the attention core,
SwiGLU) are ``torch.compile``d one by one, the way the engine compiles its captured steps, so a chain's
kernels are what a compiled model launches while every operation stays a unit a plan can place; the
GEMMs stay cuBLAS in both cases.

Operations pass tensors through named slots of one state dict per chain. Slot names are reused
(``x`` is read and rewritten by each residual add), so dependencies are found by position: an operation
depends on the last earlier writer of each slot it reads (``Segment.deps``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..models.llama import Transformer, rms_norm, silu_mul
from .ops import OpInfo


@dataclass
class StepInputs:
    """The per-step arguments of ``Transformer.forward`` (see its docstring); tokens None = the previous
    draft step's argmax, read from the chain's ``token`` slot."""

    tokens: torch.Tensor | None
    positions: torch.Tensor
    slots: torch.Tensor
    mask: torch.Tensor | None
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    seq_len: torch.Tensor | None = None
    anc: torch.Tensor | None = None
    width: int = 1  # N, tokens per request in this step
    batch: int = 1


@dataclass
class Op:
    """One operation. ``run(state)`` writes ``state[writes]``; groupable ops also describe their operands
    (``operand``) so an interleaved kernel can run them."""

    name: str
    family: str  # "gemm" | "rmsnorm" | "add" | "other"
    reads: tuple[str, ...]
    writes: str
    run: Callable[[dict], None]
    work: float = 0.0  # FLOPs of a GEMM, bytes moved of a row operation
    operand: dict = field(default_factory=dict)  # gemm: module; rmsnorm: norm weight + eps; add: -
    shape: tuple[int, ...] = ()  # output shape [B, N, D]
    dtype: torch.dtype = torch.float32


@dataclass
class Segment:
    name: str
    ops: list[Op]

    def deps(self) -> list[set[int]]:
        """deps[b] = positions of earlier ops of this segment that op b reads from (direct)."""
        last: dict[str, int] = {}
        out = []
        for b, op in enumerate(self.ops):
            out.append({last[r] for r in op.reads if r in last})
            last[op.writes] = b
        return out

    def run(self, state: dict) -> None:
        for op in self.ops:
            op.run(state)


@dataclass
class Chain:
    """One model's round: ``segments`` run in order over ``state``; ``model`` is "target" or "draft"."""

    model: str
    segments: list[Segment]
    state: dict

    def op_id(self, seg: int, pos: int) -> str:
        return f"{self.model}/{self.segments[seg].name}/{self.segments[seg].ops[pos].name}"

    def catalog(self) -> dict[str, OpInfo]:
        out = {}
        for si, seg in enumerate(self.segments):
            deps = seg.deps()
            for pos, op in enumerate(seg.ops):
                out[self.op_id(si, pos)] = OpInfo(
                    model=self.model,
                    segment=si,
                    position=pos,
                    family=op.family,
                    deps=tuple(sorted(deps[pos])),
                    work=float(op.work),
                    shape=tuple(op.shape),
                    elem_bytes=op.dtype.itemsize,
                )
        return out

    def run(self) -> None:
        for seg in self.segments:
            seg.run(self.state)


# ---- building the operations of one step ----------------------------------------------------------------


def _core(attn, qkv, cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc):
    # A free function of the module, so one compile serves every layer of every model of one shape.
    return attn.core(qkv, cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc)


class _Fns:
    """The non-GEMM operations' functions, plain or compiled (compiled: fullgraph, static shapes)."""

    def __init__(self, compiled: bool):
        fns = {"norm": rms_norm, "core": _core, "act": silu_mul}
        if compiled:
            # Each (function, shapes) pair is one cache entry; a round has a handful per model.
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            torch._dynamo.config.accumulated_cache_size_limit = max(
                torch._dynamo.config.accumulated_cache_size_limit, 512
            )
            fns = {k: torch.compile(f, fullgraph=True, dynamic=False) for k, f in fns.items()}
        self.norm, self.core, self.act = fns["norm"], fns["core"], fns["act"]


def _linear_op(name: str, lin: torch.nn.Linear, src: str, dst: str, rows: int, shape, dtype) -> Op:
    def run(state, lin=lin):
        state[dst] = lin(state[src])

    k, n = lin.weight.shape[1], lin.weight.shape[0]
    return Op(name, "gemm", (src,), dst, run, 2.0 * rows * k * n, {"linear": lin}, (*shape, n), dtype)


def _norm_op(name: str, norm, src: str, dst: str, rows: int, shape, dtype, fns: _Fns) -> Op:
    def run(state, norm=norm):
        state[dst] = fns.norm(state[src], norm.weight, norm.eps)

    h = norm.weight.shape[0]
    return Op(name, "rmsnorm", (src,), dst, run, 2.0 * rows * h * dtype.itemsize, {"norm": norm}, (*shape, h), dtype)


def _add_op(name: str, a: str, b: str, dst: str, rows: int, shape, dtype) -> Op:
    def run(state):
        state[dst] = state[a] + state[b]

    return Op(name, "add", (a, b), dst, run, 3.0 * rows * shape[-1] * dtype.itemsize, {}, tuple(shape), dtype)


def step_segments(
    model: Transformer, step: StepInputs, prefix: str, head: str, compiled: bool = False
) -> list[Segment]:
    """Segments of one forward step of ``model``: embed, (attn, mlp) per layer, head.

    ``head`` is ``"logits"`` (write ``state["logits"]`` [B, N, V]) or ``"argmax"`` (draft: append the last
    row's argmax [B] to ``state["drafts"]`` and put it, [B, 1], in ``state["token"]`` for the next step).
    ``compiled`` compiles the operations between the GEMMs (see the module docstring).
    """
    fns = _Fns(compiled)
    cfg, dtype = model.cfg, model.embed.weight.dtype
    B, N, H = step.batch, step.width, cfg.hidden_size
    rows, shape = B * N, (B, N)

    def embed(state):
        tokens = step.tokens if step.tokens is not None else state["token"]
        x = model.embed(tokens)
        cs = model.rope[step.positions].to(x.dtype)
        state["cos"], state["sin"] = cs[:, :, 0, None], cs[:, :, 1, None]
        state["batch_idx"] = torch.arange(B, device=x.device)[:, None]
        state["x"] = x

    segs = [Segment(f"{prefix}embed", [Op("embed", "other", ("token",), "x", embed, shape=(B, N, H), dtype=dtype)])]
    for li, layer in enumerate(model.layers):
        k_cache, v_cache = step.kv[li]

        def core(state, attn=layer.attn, k_cache=k_cache, v_cache=v_cache):
            state["o_in"] = fns.core(
                attn,
                state["qkv"],
                state["cos"],
                state["sin"],
                k_cache,
                v_cache,
                state["batch_idx"],
                step.slots,
                step.mask,
                step.seq_len,
                step.anc,
            )

        def act(state):
            state["act"] = fns.act(state["gu"])

        attn_ops = [
            _norm_op("attn_norm", layer.attn_norm, "x", "xn", rows, shape, dtype, fns),
            _linear_op("qkv", layer.attn.wqkv, "xn", "qkv", rows, shape, dtype),
            Op("attn", "other", ("qkv",), "o_in", core, shape=(B, N, cfg.q_size), dtype=dtype),
            _linear_op("o", layer.attn.wo, "o_in", "ao", rows, shape, dtype),
            _add_op("attn_add", "x", "ao", "x", rows, (B, N, H), dtype),
        ]
        mlp_ops = [
            _norm_op("mlp_norm", layer.mlp_norm, "x", "xn", rows, shape, dtype, fns),
            _linear_op("gate_up", layer.mlp.w13, "xn", "gu", rows, shape, dtype),
            Op("act", "other", ("gu",), "act", act, shape=(B, N, cfg.intermediate_size), dtype=dtype),
            _linear_op("down", layer.mlp.w2, "act", "mo", rows, shape, dtype),
            _add_op("mlp_add", "x", "mo", "x", rows, (B, N, H), dtype),
        ]
        segs += [Segment(f"{prefix}L{li}.attn", attn_ops), Segment(f"{prefix}L{li}.mlp", mlp_ops)]

    if head == "logits":

        def logits(state):
            state["logits"] = model.lm_head(state["xf"])

        head_ops = [
            _norm_op("norm", model.norm, "x", "xf", rows, shape, dtype, fns),
            Op("lm_head", "other", ("xf",), "logits", logits, shape=(B, N, cfg.vocab_size), dtype=dtype),
        ]
    else:

        def argmax(state):
            # Same as the engine's draft: full logits of the step, the last row's argmax.
            logits = model.lm_head(state["xf"])[:, -1]
            d = logits.argmax(-1)
            state.setdefault("drafts", []).append(d)
            state.setdefault("draft_logits", []).append(logits)  # kept for the numerical check of plans
            state["token"] = d[:, None]

        head_ops = [
            _norm_op("norm", model.norm, "x", "xf", rows, shape, dtype, fns),
            Op("argmax", "other", ("xf",), "token", argmax, shape=(B, 1), dtype=dtype),
        ]
    segs.append(Segment(f"{prefix}head", head_ops))
    return segs


def verify_chain(model: Transformer, step: StepInputs, compiled: bool = False) -> Chain:
    """The target's verification forward as a chain; ``state["logits"]`` [B, N, V] after a run."""
    return Chain("target", step_segments(model, step, "", "logits", compiled), {})


def draft_chain(model: Transformer, steps: list[StepInputs], compiled: bool = False) -> Chain:
    """gamma draft steps as one chain; ``state["drafts"]`` holds the gamma argmax tokens [B] after a run.

    ``steps[0].tokens`` is given; later steps take the previous step's argmax (``tokens=None``).
    """
    segs = []
    for s, st in enumerate(steps):
        segs += step_segments(model, st, f"s{s}.", "argmax", compiled)
    chain = Chain("draft", segs, {})
    first = chain.segments[0].ops[0].run

    def reset_then_embed(state):
        # A new round starts with no drafts (a chain runs once per round).
        state["drafts"], state["draft_logits"] = [], []
        first(state)

    chain.segments[0].ops[0].run = reset_then_embed
    return chain
