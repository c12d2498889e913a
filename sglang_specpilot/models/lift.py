"""Lift a small Llama-family model into bigger tensor shapes without changing what it computes.

``lift_model(smollm2, "llama-3.1-8b")`` is the timing stand-in of issue 13: a model with exactly
Llama-3.1-8B's tensor shapes (32 layers, hidden 4096, 32 query / 8 K/V heads of 128, intermediate 14336,
vocab 128256, untied head) whose greedy text is SmolLM2-135M-Instruct's. It costs an 8B model's time per
step, because every GEMM has the 8B shape and nothing is zero, and it writes SmolLM2's text. It is
labelled ``"SmolLM2-135M lifted to Llama-3.1-8B shapes (stand-in, timing)"`` in its config name, in
``config.json`` and in the safetensors metadata, so it is never taken for a real 8B. ``"llama-3.2-1b"``
lifts any small Llama model of at most 16 layers (e.g. the shipped 2-layer SmolLM2 drafter, with the
target's embedding and head) into Llama-3.2-1B's shapes, a drafter with a realistic cost. ``"tiny"``
(Llama-3.1-8B's heads: 32/8 of 128, untied) and ``"tiny-1b"`` (Llama-3.2-1B's heads: 32/8 of 64, tied)
keep those geometries with hidden 640, intermediate 1600 and vocab 50000, for CPU tests. An EAGLE-3
drafter of the small model lifts along with it (``models.lift_eagle3``: same drafts, the 8B drafter's cost).

Notation: the small model has hidden ``h`` (576), head size ``d`` (64), ``n_q`` / ``n_kv`` heads (9 / 3,
group ``g = 3``), intermediate ``i`` (1536), vocab ``v`` (49152), ``L`` layers (30); the big one ``H``
(4096), ``D`` (128), ``N_q`` / ``N_kv`` (32 / 8, group ``G = 4``), ``I`` (14336), ``V`` (128256), ``L'``
(32). Everything below is exact in real arithmetic unless it says otherwise; "tiny" means ``2^-64 * N(0, 1)``
(about 5e-20, a normal number in bf16 and fp32, never zero).

Residual stream
    SmolLM2's residual lives in dims ``0..h-1`` of the ``H``; dims ``h..H-1`` are *dead*. Nothing reads a
    dead dim: every RMSNorm weight on a dead dim is tiny, so the normalized value there is ~1e-20 of the
    live ones, and the weights that read it (q/k/v, gate/up, LM-head columns) are random normal at the
    scale of their row (realistic GEMM and W12 statistics, and they multiply ~0). Writers into dead dims
    are the o_proj and down_proj dead output rows (tiny) and the embedding's dead columns.

RMSNorm over ``H`` instead of ``h``
    ``mean_H(x^2) = (sum_live x^2 + S_dead) / H``. The embedding's dead columns are fixed values that fit in
    each row's W12 exponent window (not tiny: tiny values there would be W12 escapes, 80 bits each, on
    every row): ``2^-15 * m`` with random signs, where the multiset of ``m`` in ``[1, 2)`` is *the same for
    every token* (cyclically shifted per row). So ``S_dead`` is one constant ``S`` (about 7.5e-6; the tiny
    writes of later layers change it by ~1e-19), the same at every norm of every layer. With
    ``eps' = (h * eps - S) / H`` in the config, ``mean_H(x^2) + eps' = (h / H) * (mean_h(x^2) + eps)``
    exactly, so ``x / rms_H = sqrt(H / h) * x / rms_h`` and every norm weight becomes ``sqrt(h / H) * w``
    (0.375 for 576 -> 4096). In fp32 that product is one rounding (2^-24); in bf16 it is a rounding of
    the norm weights (sqrt(h / H) is not a power of two), a difference of bf16-rounding size. No
    construction makes bf16 runs bit-equal: the normalized activations are ``sqrt(H / h)`` (8/3) times
    SmolLM2's before bf16 rounds them, and making that factor a power of two would need dyadic scales
    ``a_k`` of copies of the live block with ``sum a_k^2 = (H / h) / 4^n = 64 / (9 * 4^n)``, which no
    dyadic sum of squares is.

Rope (rotate-half layout, ``models/rope.py``: dim ``k`` pairs with ``k + D/2`` at frequency
``theta^(-2k/D)``)
    The config keeps SmolLM2's ``rope_theta`` and no rope scaling. With ``r = D / d`` (2), small dim
    ``j < d/2`` goes to big dim ``r*j`` and ``j + d/2`` to ``r*j + D/2``: a pair goes to a pair, at
    frequency ``theta^(-2rj/D) = theta^(-2j/d)``, SmolLM2's. The other big pairs (odd ``k``) are dead
    dims of the head: their q rows are tiny, their k rows random, so they add ~1e-17 to every score.

Attention scale ``1/sqrt(D)`` instead of ``1/sqrt(d)``
    The live q rows are multiplied by ``sqrt(D / d)`` (sqrt 2). No exact construction exists: every
    weight is a dyadic rational and RMSNorm's square root is shared by q, k and v (a factor there is
    squared in the scores, and also scales v), so the irrational sqrt(2) can only enter by rounding. In
    fp32 that is one rounding of each q weight (2^-24 relative, below the GEMM's own rounding); in bf16
    it is a re-rounding of the q weights (at most 2^-9 relative), the size of bf16 storage itself, so
    bf16 runs of the lift and of SmolLM2 can part only at near-ties (token forcing tells them apart).
    For ``D == d`` (the 1B shapes) the factor is 1.

GQA
    Small K/V head ``k`` is big K/V head ``k``; big K/V heads ``n_kv..N_kv-1`` are dead (q and k random,
    v tiny, so their output is tiny and the o_proj columns that read it are random). A live group has
    ``G`` big query heads for ``g`` small ones; the leftover heads *duplicate* live ones: small head
    ``g*k + t`` gets ``c_t`` copies (powers of two summing to ``G``; for 3 in 4: 2, 1, 1), identical q
    rows, so identical outputs, and each copy's o_proj columns are the small ones divided by ``c_t``
    (exact: a power of two). The sum over copies is exactly SmolLM2's o_proj. (Tiny o_proj columns for
    the leftover heads would also work, but each would be a W12 escape in every live o_proj row.) The
    dead dims of a live v head are tiny rows.

MLP
    Small unit ``u`` is big unit ``u``. Dead units have random gate rows and tiny up rows, so
    ``silu(gate) * up`` is ~1e-20 there and down_proj's columns for them are random; down_proj's dead
    output rows are tiny.

Layers ``L..L'-1``
    Appended after SmolLM2's layers: random q/k/v and gate/up, tiny o_proj and down_proj (the whole
    matrix), so each adds ~1e-17 to the residual: near-identity, below fp32 rounding.

Vocabulary ``v`` -> ``V`` and why the extra ids never win the argmax
    Real token rows are SmolLM2's (live columns) plus the columns above. Each extra row ``e`` of the LM
    head is *half* of a real row ``a(e)`` (random ``a``): halving is exact in every float format, so
    ``logit_e = logit_a / 2`` exactly (up to the GEMM's accumulation order, ~1e-7 relative). Then
    ``logit_e < max_real`` whenever ``max_real > 0``: if ``logit_a >= 0``, ``logit_a / 2 <= max_real / 2``;
    if ``logit_a < 0``, ``logit_e < 0``. With an untied head a constant dim makes it strict and keeps the
    extra ids out of sampling too: dead dim ``h`` (``d0``) holds the embedding value ``+2^-15`` for every
    real token (part of ``S``), the final norm's weight there is ``2^31``, the real LM-head rows' weight
    there is tiny, and each extra row's weight there is ``-B_e`` (``B_e`` = the top power of two of the
    row, inside its W12 window), so ``logit_e = logit_a / 2 - Delta``, ``Delta = B_e * 2^16 / rms_H > 0``.
    An extra id can win only if the best real logit is below ``-2 * Delta``. Measured on SmolLM2 (400
    positions of README text and 400 random-token positions): the best real logit is never below 9.6 (so
    the halving alone already decides), and the final ``rms_h`` is at most 254 (the first position), so
    ``rms_H <= 0.375 * 254 = 95``; SmolLM2's head rows peak at >= 0.25, so ``B_e >= 2^-3`` and
    ``Delta >= 2^-3 * 2^16 / 95 > 80``: the extra ids hold less than ``1e-30`` of the probability at
    temperature 1. ``tests/test_lift.py`` checks the argmax and that mass (< 1e-12) at every position of
    its 8 x 64 greedy runs. With a tied head (the 1B shapes) the same rows are the embedding, ``d0`` is not used, and
    the guarantee is the ``max_real > 0`` one (extra ids are only a drafter's, and the target verifies).
    The extra embedding rows are never looked up (no text maps to those ids).

Tokenizer / ids
    The id map is the identity on ``0..v-1``; ids ``v..V-1`` have no token (like a checkpoint whose vocab
    is padded). The lifted folder carries SmolLM2's tokenizer (``tokenizer.json`` etc., written by
    ``Tokenizer.save`` from the GGUF's vocabulary), so text round-trips to the same ids, and a lifted
    target and a lifted drafter have the same fingerprint.

W12
    Random normal entries sit at their row's scale and the embedding's dead values inside each row's
    16-binade window, so the only escapes are SmolLM2's own exact zeros (its Q4_1 / Q8_0 grid; copied
    into the duplicated heads and the extra vocab rows) and one tiny ``d0`` entry per real LM-head row.
    ``specpilot lift --shape llama-3.1-8b`` followed by ``specpilot w12 convert`` measured 12.0225 bits
    per weight (escape rate 2.6e-4) over the 8.03 B weights.

Random values are drawn where the model is built (``device``), from generators seeded by ``seed`` and the
tensor's name, so a lift is reproducible on one device type. ``lift_model`` builds in memory (the GPU
benchmark lifts on the device, no 16 GB written); ``specpilot lift`` writes a sharded bf16 safetensors
folder that ``specpilot generate --model DIR`` and ``specpilot w12 convert DIR`` read.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch

from .config import ModelConfig
from .llama import Transformer
from .presets import PRESETS
from .rope import rope_table

TINY = 2.0**-64
DEAD_EXP = -15  # dead embedding columns: +-2^-15 * m, m in [1, 2) (for SmolLM2; see LiftPlan.dead_exp)
OFFSET_GAIN = 2.0**31  # final-norm weight on d0 (untied heads)
SHAPES: dict[str, dict] = {
    "llama-3.1-8b": PRESETS["llama-3.1-8b"],
    "llama-3.2-1b": PRESETS["llama-3.2-1b"],
    "tiny": dict(
        vocab_size=50000,
        hidden_size=640,
        intermediate_size=1600,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
    ),
    "tiny-1b": dict(
        vocab_size=50000,
        hidden_size=640,
        intermediate_size=1600,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        tie_word_embeddings=True,
    ),
}
_SHAPE_LABELS = {
    "llama-3.1-8b": "Llama-3.1-8B",
    "llama-3.2-1b": "Llama-3.2-1B",
    "tiny": "tiny (Llama-3.1-8B heads)",
    "tiny-1b": "tiny (Llama-3.2-1B heads)",
}
_SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "tie_word_embeddings",
)


def source_label(cfg: ModelConfig) -> str:
    name = cfg.name or "model"
    if "smollm2" in name.lower().replace("-", "").replace(" ", ""):
        return "SmolLM2-135M drafter" if "drafter" in name.lower() else "SmolLM2-135M"
    return name


def lift_label(small: ModelConfig, shape: str) -> str:
    return f"{source_label(small)} lifted to {_SHAPE_LABELS.get(shape, shape)} shapes (stand-in, timing)"


def _copies(g: int, G: int) -> list[int]:
    """Powers of two, one per small head of a group, summing to ``G`` (copies of each in the big group)."""
    c = [1] * g
    rem = G - g
    while rem > 0:
        grew = False
        for t in range(g):
            if c[t] <= rem:
                rem -= c[t]
                c[t] *= 2
                grew = True
                if rem == 0:
                    break
        if not grew:
            raise ValueError(f"cannot spread {g} query heads over {G} as power-of-two copies")
    return c


class LiftPlan:
    """Index maps and constants of one lift (see the module docstring)."""

    def __init__(self, small: ModelConfig, big_shape: dict, label: str, embed_absmax: float | None = None):
        s = small
        known = {f for f in ModelConfig.__dataclass_fields__}
        ref = ModelConfig(**{k: v for k, v in big_shape.items() if k in known and k != "name"})
        shape = {k: getattr(ref, k) for k in _SHAPE_KEYS}
        if s.arch != "llama" or s.attention_bias or s.qk_norm:
            raise ValueError(f"only Llama-architecture models lift (got {s.arch})")
        if s.rope_scaling not in (None, {}) and (s.rope_scaling or {}).get("rope_type", "default") != "default":
            raise ValueError("the small model's rope scaling is not supported by the lift")
        H, D = shape["hidden_size"], shape["head_dim"]
        checks = [
            (H > s.hidden_size, f"hidden {H} must exceed the small model's {s.hidden_size}"),
            (shape["intermediate_size"] >= s.intermediate_size, "intermediate size too small"),
            (shape["num_layers"] >= s.num_layers, f"{shape['num_layers']} layers < the small model's {s.num_layers}"),
            (shape["vocab_size"] >= s.vocab_size, "vocabulary too small"),
            (D % s.head_dim == 0 and D >= s.head_dim, f"head_dim {D} is not a multiple of {s.head_dim}"),
            (shape["num_kv_heads"] >= s.num_kv_heads, "too few K/V heads"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"cannot lift {s.name or 'the model'}: {msg}")
        g, G = s.num_heads // s.num_kv_heads, shape["num_heads"] // shape["num_kv_heads"]
        if G < g:
            raise ValueError(f"query group {G} is smaller than the small model's {g}")
        r = D // s.head_dim
        half, Half = s.head_dim // 2, D // 2
        j = torch.arange(s.head_dim)
        self.dmap = r * (j % half) + Half * (j // half)  # small head dim -> big head dim
        self.q_scale = math.sqrt(r)
        self.copies = _copies(g, G)
        self.q_src: list[int] = []  # big q head -> small q head (-1: dead)
        self.q_div: list[int] = []  # big q head -> copies of its small head
        for kvh in range(shape["num_kv_heads"]):
            if kvh < s.num_kv_heads:
                for t, c in enumerate(self.copies):
                    self.q_src += [g * kvh + t] * c
                    self.q_div += [c] * c
            else:
                self.q_src += [-1] * G
                self.q_div += [1] * G
        self.h, self.H = s.hidden_size, H
        n_dead = H - s.hidden_size - 1  # dims h+1..H-1; dim h is d0
        m = 1.0 + (torch.arange(n_dead, dtype=torch.float64) % 128) / 128
        # The dead values' binade: 15 below the largest embedding row's top binade (SmolLM2: 2^-15), so it is
        # inside every row's window (no row peaks higher); the lower, the smaller S.
        self.dead_exp = DEAD_EXP if embed_absmax is None else math.floor(math.log2(embed_absmax)) - 15
        self.dead_values = m * 2.0**self.dead_exp  # exact in bf16
        self.d0_value = 2.0**self.dead_exp
        self.dead_sq = float((self.dead_values**2).sum()) + self.d0_value**2
        eps = (s.hidden_size * s.rms_norm_eps - self.dead_sq) / H
        if eps <= 0:
            raise ValueError("the small model's rms_norm_eps is too small to absorb the dead dims")
        self.norm_scale = math.sqrt(s.hidden_size / H)
        self.small = s
        self.big = ModelConfig(
            arch="llama",
            **shape,
            rms_norm_eps=eps,
            rope_theta=s.rope_theta,
            rope_scaling=None,
            max_position_embeddings=s.max_position_embeddings,
            bos_token_id=s.bos_token_id,
            eos_token_ids=list(s.eos_token_ids),
            name=label,
        )
        self.offset = not self.big.tie_word_embeddings


class _Draw:
    """Random tensors on one device, each from a generator seeded by (seed, name): reproducible per tensor."""

    def __init__(self, seed: int, device: torch.device):
        self.seed, self.device = seed, device

    def gen(self, key: str) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(zlib.crc32(f"{self.seed}:{key}".encode()))

    def normal(self, shape, key: str, std: float | torch.Tensor = 1.0) -> torch.Tensor:
        out = torch.empty(shape, device=self.device, dtype=torch.float32).normal_(generator=self.gen(key))
        out.masked_fill_(out == 0, 1.0)  # the generator can return an exact 0.0; the lift adds no zeros
        return out.mul_(std if isinstance(std, torch.Tensor) else float(std))

    def tiny(self, shape, key: str) -> torch.Tensor:
        return self.normal(shape, key, TINY)


def _std(w: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    # (x - mean)^2 by hand: torch's CPU std is ~10x slower, and this runs for every small matrix
    w = w.float()
    if dim is None:
        return (w - w.mean()).square().mean().sqrt()
    return (w - w.mean(dim, keepdim=True)).square().mean(dim, keepdim=True).sqrt()


def _row_std(w: torch.Tensor) -> torch.Tensor:
    std = _std(w, 1)
    if bool((std > 0).all()):
        return std
    return torch.where(std > 0, std, _std(w).clamp_min(1e-3))


def _widen(small: torch.Tensor, K: int, rnd: _Draw, key: str, cols: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of ``small`` [n, k] as rows of K columns: its values in columns 0..k-1 (the live dims; or in
    ``cols``, k column indices), random normal at the row's scale in the others (columns whose input is
    always ~0)."""
    out = rnd.normal((small.shape[0], K), key, _row_std(small))
    if cols is None:
        out[:, : small.shape[1]] = small.float()
    else:
        out[:, cols] = small.float()
    return out


class _Lifter:
    def __init__(self, plan: LiftPlan, sd: dict[str, torch.Tensor], seed: int, device):
        self.p, self.sd = plan, sd
        self.device = torch.device(device)
        self.rnd = _Draw(seed, self.device)
        self.live = torch.arange(plan.h, device=self.device)
        self.dmap = plan.dmap.to(self.device)

    def w(self, name: str) -> torch.Tensor:
        return self.sd[name].to(self.device, torch.float32)

    def norm(self, g: torch.Tensor, key: str, d0: float | None = None) -> torch.Tensor:
        out = self.rnd.tiny((self.p.H,), key)
        out[: self.p.h] = g * self.p.norm_scale
        if d0 is not None:
            out[self.p.h] = d0
        return out

    def head_rows(self, i: int) -> torch.Tensor:  # big head-dim rows of small head i
        return i * self.p.big.head_dim + self.dmap

    def small_rows(self, i: int) -> slice:
        d = self.p.small.head_dim
        return slice(i * d, (i + 1) * d)

    def layer(self, n: int) -> dict[str, torch.Tensor]:
        p, s, b, rnd = self.p, self.p.small, self.p.big, self.rnd
        H, key = p.H, f"layers.{n}."
        extra = n >= s.num_layers
        src = f"model.layers.{min(n, s.num_layers - 1)}."
        small = {x: self.w(src + f"self_attn.{x}_proj.weight") for x in "qkvo"}
        small |= {x: self.w(src + f"mlp.{x}_proj.weight") for x in ("gate", "up", "down")}
        qn, kvn = b.num_heads * b.head_dim, b.num_kv_heads * b.head_dim
        pre = f"model.layers.{n}."
        if extra:  # near-identity block: random readers, tiny writers
            sq, sk, sv, sg, su = (float(_std(small[x])) for x in ("q", "k", "v", "gate", "up"))
            big = {
                "q": rnd.normal((qn, H), key + "q", sq),
                "k": rnd.normal((kvn, H), key + "k", sk),
                "v": rnd.normal((kvn, H), key + "v", sv),
                "o": rnd.tiny((H, qn), key + "o"),
                "gate": rnd.normal((b.intermediate_size, H), key + "gate", sg),
                "up": rnd.normal((b.intermediate_size, H), key + "up", su),
                "down": rnd.tiny((H, b.intermediate_size), key + "down"),
            }
        else:
            big = self.block(small, key)
        out = {pre + f"self_attn.{x}_proj.weight": big[x] for x in "qkvo"}
        out |= {pre + f"mlp.{x}_proj.weight": big[x] for x in ("gate", "up", "down")}
        out[pre + "input_layernorm.weight"] = self.norm(self.w(src + "input_layernorm.weight"), key + "n1")
        out[pre + "post_attention_layernorm.weight"] = self.norm(
            self.w(src + "post_attention_layernorm.weight"), key + "n2"
        )
        return out

    def block(
        self, small: dict[str, torch.Tensor], key: str, width: int | None = None, cols: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """A lifted SmolLM2 block's projections (keys q, k, v, o, gate, up, down) from the small ones.

        q/k/v read ``width`` inputs (default H) with the small model's input columns at ``cols`` (default
        the live dims 0..h-1); an EAGLE-3 layer's q/k/v read cat(embedding, feature), 2H wide, so its
        live columns are two blocks (``models.lift_eagle3``). Everything else is the module docstring's.
        """
        p, s, b, rnd = self.p, self.p.small, self.p.big, self.rnd
        H = p.H
        W = H if width is None else width
        q_s, k_s, v_s, o_s = (small[x] for x in "qkvo")
        gate_s, up_s, down_s = small["gate"], small["up"], small["down"]
        qn, kvn = b.num_heads * b.head_dim, b.num_kv_heads * b.head_dim
        sq, sk = (float(_std(x)) for x in (q_s, k_s))
        sg = float(_std(gate_s))
        q = rnd.tiny((qn, W), key + "q")  # dead dims of live heads
        small_q = [_widen(q_s[self.small_rows(i)], W, rnd, key + f"q{i}", cols) * p.q_scale for i in range(s.num_heads)]
        for bh, sh in enumerate(p.q_src):
            if sh < 0:
                q[bh * b.head_dim : (bh + 1) * b.head_dim] = rnd.normal((b.head_dim, W), key + f"qd{bh}", sq)
            else:
                q[self.head_rows(bh)] = small_q[sh]  # copies are identical
        k = rnd.normal((kvn, W), key + "k", sk)
        v = rnd.tiny((kvn, W), key + "v")
        for h in range(s.num_kv_heads):
            k[self.head_rows(h)] = _widen(k_s[self.small_rows(h)], W, rnd, key + f"k{h}", cols)
            v[self.head_rows(h)] = _widen(v_s[self.small_rows(h)], W, rnd, key + f"v{h}", cols)
        o = rnd.tiny((H, qn), key + "o")
        o_live = rnd.normal((s.hidden_size, qn), key + "ol", _row_std(o_s))
        for bh, sh in enumerate(p.q_src):
            if sh >= 0:
                o_live[:, self.head_rows(bh)] = o_s[:, self.small_rows(sh)] / p.q_div[bh]
        o[: s.hidden_size] = o_live
        I_s = s.intermediate_size
        gate = rnd.normal((b.intermediate_size, H), key + "gate", sg)
        gate[:I_s] = _widen(gate_s, H, rnd, key + "gl")
        up = rnd.tiny((b.intermediate_size, H), key + "up")
        up[:I_s] = _widen(up_s, H, rnd, key + "ul")
        down = rnd.tiny((H, b.intermediate_size), key + "down")
        down[: s.hidden_size] = _widen(down_s, b.intermediate_size, rnd, key + "dl")
        return {"q": q, "k": k, "v": v, "o": o, "gate": gate, "up": up, "down": down}

    def embedding(self) -> torch.Tensor:
        p, s, b = self.p, self.p.small, self.p.big
        e_s = self.w("model.embed_tokens.weight")
        out = torch.empty((b.vocab_size, p.H), device=self.device)
        out[: s.vocab_size, : p.h] = e_s
        out[: s.vocab_size, p.h] = p.d0_value
        vals = p.dead_values.to(self.device, torch.float32)
        n_dead = vals.numel()
        g = self.rnd.gen("embed.dead")
        for lo in range(0, s.vocab_size, 8192):
            hi = min(lo + 8192, s.vocab_size)
            shift = torch.randint(0, n_dead, (hi - lo, 1), generator=g, device=self.device)
            idx = (torch.arange(n_dead, device=self.device) + shift) % n_dead
            sign = torch.randint(0, 2, (hi - lo, n_dead), generator=g, device=self.device).float().mul_(2).sub_(1)
            out[lo:hi, p.h + 1 :] = vals[idx] * sign
        self._extra_rows(out, "embed")
        return out

    def _extra_rows(self, out: torch.Tensor, key: str) -> torch.Tensor:
        s, b = self.p.small, self.p.big
        n = b.vocab_size - s.vocab_size
        a = torch.randint(0, s.vocab_size, (n,), generator=self.rnd.gen(key + ".extra"), device=self.device)
        for lo in range(0, n, 8192):  # row by chunk: no second copy of the table
            out[s.vocab_size + lo : s.vocab_size + min(lo + 8192, n)] = out[a[lo : lo + 8192]] * 0.5
        return a

    def head(self) -> torch.Tensor:
        p, s, b = self.p, self.p.small, self.p.big
        name = "model.embed_tokens.weight" if s.tie_word_embeddings else "lm_head.weight"
        w_s = self.w(name)
        out = torch.empty((b.vocab_size, p.H), device=self.device)
        for lo in range(0, s.vocab_size, 8192):
            hi = min(lo + 8192, s.vocab_size)
            out[lo:hi] = _widen(w_s[lo:hi], p.H, self.rnd, f"head.{lo}")
        out[: s.vocab_size, p.h] = self.rnd.tiny((s.vocab_size,), "head.d0")
        self._extra_rows(out, "head")
        extra = out[s.vocab_size :]
        top = torch.exp2(torch.floor(torch.log2(extra.abs().amax(1))))
        extra[:, p.h] = -top  # the offset: logit_e = logit_a / 2 - top * x_d0
        return out

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every Hugging Face tensor of the lifted model, in fp32 on the device, one at a time."""
        yield "model.embed_tokens.weight", self.embedding()
        for n in range(self.p.big.num_layers):
            yield from self.layer(n).items()
        gain = OFFSET_GAIN if self.p.offset else None
        yield "model.norm.weight", self.norm(self.w("model.norm.weight"), "norm", gain)
        if not self.p.big.tie_word_embeddings:
            yield "lm_head.weight", self.head()


def plan_lift(
    small: ModelConfig, shape: str | dict, label: str | None = None, embed_absmax: float | None = None
) -> LiftPlan:
    """The lift of ``small`` into ``shape`` (a key of ``SHAPES`` or a dict with its keys); ``embed_absmax``
    (the small embedding's largest magnitude) places the dead embedding values (default: SmolLM2's)."""
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ValueError(f"unknown lift shape {shape!r}; shapes: {', '.join(SHAPES)}")
        return LiftPlan(small, SHAPES[shape], label or lift_label(small, shape), embed_absmax)
    return LiftPlan(small, shape, label or lift_label(small, "custom"), embed_absmax)


def lifted_tensors(
    small_cfg: ModelConfig,
    small_sd: dict[str, torch.Tensor],
    shape: str | dict,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> tuple[ModelConfig, Iterator[tuple[str, torch.Tensor]]]:
    """(lifted config, iterator of its HF-named fp32 tensors on ``device``); nothing is held but one layer."""
    absmax = float(small_sd["model.embed_tokens.weight"].abs().max())
    plan = plan_lift(small_cfg, shape, embed_absmax=absmax)
    return plan.big, _Lifter(plan, small_sd, seed, device).tensors()


def _small_state_dict(small: Transformer) -> dict[str, torch.Tensor]:
    sd = small.hf_state_dict()
    if small.cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    elif "lm_head.weight" not in sd:
        sd["lm_head.weight"] = small.lm_head.weight.detach()
    return sd


@torch.no_grad()
def lift_model(
    small: Transformer,
    shape: str | dict = "llama-3.1-8b",
    seed: int = 0,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    max_positions: int | None = None,
) -> Transformer:
    """The lifted model, built in memory on ``device`` (default: the small model's) in ``dtype`` (default:
    the small model's). Weights are computed in fp32 on the device one layer at a time, then cast."""
    device = torch.device(device or small.embed.weight.device)
    dtype = dtype or small.embed.weight.dtype
    n_pos = max_positions or small.rope.shape[0]
    cfg, it = lifted_tensors(small.cfg, _small_state_dict(small), shape, seed, device)
    with torch.device("meta"):
        model = Transformer(cfg, n_pos)
    model = model.to_empty(device=device).to(dtype)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.rope = rope_table(n_pos, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling).to(device)
    pending: dict[str, torch.Tensor] = {}
    for name, t in it:
        pending[name] = t
        _fill(model, pending)
    if pending:
        raise RuntimeError(f"lift left tensors unplaced: {sorted(pending)[:4]}")
    return model.eval().requires_grad_(False)


def _fill(model: Transformer, pending: dict[str, torch.Tensor]) -> None:
    """Copy the tensors of ``pending`` that complete a model parameter into it (fusing q/k/v, gate/up)."""
    cfg = model.cfg
    simple = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.norm.weight}
    if not cfg.tie_word_embeddings:
        simple["lm_head.weight"] = model.lm_head.weight
    for name in list(pending):
        if name in simple:
            simple[name].copy_(pending.pop(name))
            continue
        i = int(name.split(".")[2])
        layer, p = model.layers[i], f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        groups = {
            layer.attn.wqkv.weight: [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"],
            layer.mlp.w13.weight: [m + "gate_proj.weight", m + "up_proj.weight"],
            layer.attn.wo.weight: [a + "o_proj.weight"],
            layer.mlp.w2.weight: [m + "down_proj.weight"],
            layer.attn_norm.weight: [p + "input_layernorm.weight"],
            layer.mlp_norm.weight: [p + "post_attention_layernorm.weight"],
        }
        for param, names in groups.items():
            if name in names and all(n in pending for n in names):
                param.copy_(torch.cat([pending.pop(n) for n in names]))


@torch.no_grad()
def sequence_logits(model: Transformer, ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), vocab] of one causal prefill of ``ids`` (fresh caches, SDPA, any device): the
    teacher-forced scores the tests and ``benchmarks/lift_check.py`` compare lifted and small models by."""
    c, dev = model.cfg, model.embed.weight.device
    n, G = len(ids), c.num_heads // c.num_kv_heads
    shape = (1, n, c.num_kv_heads, c.head_dim)
    kv = [(model.embed.weight.new_zeros(shape), model.embed.weight.new_zeros(shape)) for _ in range(c.num_layers)]
    mask = torch.ones(n, n, dtype=torch.bool, device=dev).tril().repeat_interleave(G, 0)[None, None]
    pos = torch.arange(n, device=dev)[None]
    return model(torch.tensor([ids], device=dev), pos, pos, mask, kv)[0]


# ---- folders and the command -----------------------------------------------------------------------------


def load_small(
    model: str | None, target: str | None = None, device="cpu", max_positions: int = 1
) -> tuple[Transformer, object]:
    """(small model in fp32, tokenizer) from a GGUF / folder (default: the embedded SmolLM2), or from a
    shared-head drafter folder, which takes its embedding and head from ``target`` (default: SmolLM2)."""
    from ..drafters import is_shared_drafter, load_shared_drafter
    from .build import build_model
    from .loader import default_model_path, load_model_files

    def read(path):
        cfg, sd, tok = load_model_files(path or default_model_path())
        return build_model(cfg, state_dict=sd, device=device, max_positions=max_positions), tok

    if is_shared_drafter(model):
        tgt, tok = read(target)
        return load_shared_drafter(model, tgt), tok
    return read(model)


def save_lifted(
    out: str | Path,
    small: Transformer,
    tokenizer,
    shape: str | dict,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    shard_bytes: int = 4 << 30,
    device: str = "cpu",
    log=None,
) -> ModelConfig:
    """Write the lift of ``small`` as a sharded safetensors folder (config.json with HF Llama names and the
    lift's record, model-*.safetensors + index, tokenizer files), one tensor in memory at a time."""
    from safetensors.torch import save_file

    from .errors import expected_shapes
    from .safetensors_loader import config_to_hf

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg, it = lifted_tensors(small.cfg, _small_state_dict(small), shape, seed, device)
    shapes = expected_shapes(cfg)
    nbytes = {n: math.prod(s) * dtype.itemsize for n, s in shapes.items()}
    order = ["model.embed_tokens.weight"] + [n for n in shapes if n.startswith("model.layers.")]
    order += ["model.norm.weight"] + (["lm_head.weight"] if not cfg.tie_word_embeddings else [])
    shard_of, k, used = {}, 0, 0
    for n in order:
        if used and used + nbytes[n] > shard_bytes:
            k, used = k + 1, 0
        shard_of[n], used = k, used + nbytes[n]
    total = k + 1
    fname = [f"model-{i + 1:05d}-of-{total:05d}.safetensors" for i in range(total)]
    meta = {"format": "pt", "specpilot": cfg.name}
    bufs: list[dict[str, torch.Tensor]] = [{} for _ in range(total)]
    left = [sum(1 for n in order if shard_of[n] == i) for i in range(total)]
    for name, t in it:
        i = shard_of[name]
        bufs[i][name] = t.to(dtype).cpu().contiguous()
        left[i] -= 1
        if left[i] == 0:  # a shard is written as soon as its last tensor is made
            save_file(bufs[i], str(out / fname[i]), metadata=meta)
            bufs[i] = {}
            if log:
                log(f"wrote {fname[i]}")
    if any(left):
        raise RuntimeError(f"lift did not produce every tensor ({sum(left)} missing)")
    index = {
        "metadata": {"total_size": sum(nbytes.values()), "specpilot": cfg.name},
        "weight_map": {n: fname[shard_of[n]] for n in order},
    }
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    hf = config_to_hf(cfg, dtype)
    hf["specpilot_lift"] = {
        "label": cfg.name,
        "source": small.cfg.name,
        "shape": shape if isinstance(shape, str) else "custom",
        "seed": seed,
        "note": "stand-in for timing: SmolLM2's function at the shapes above, not a real model",
    }
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(out)
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="specpilot lift",
        description="Lift a small Llama model (default: the embedded SmolLM2-135M-Instruct) into bigger tensor "
        "shapes with the same greedy output; writes a safetensors folder (a timing stand-in).",
    )
    ap.add_argument(
        "--model",
        default=None,
        help="GGUF file, safetensors folder or shared-head drafter folder "
        "(default: the embedded SmolLM2-135M-Instruct)",
    )
    ap.add_argument(
        "--target",
        default=None,
        help="for a shared-head drafter: the model whose embedding and head it borrows (default: the embedded SmolLM2)",
    )
    ap.add_argument("--shape", default="llama-3.1-8b", choices=list(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--shard-size", type=float, default=4.0, help="GiB per shard")
    ap.add_argument("--device", default="cpu", help="where the weights are computed")
    args = ap.parse_args(argv)
    try:
        small, tok = load_small(args.model, args.target)
        cfg = save_lifted(
            args.out,
            small,
            tok,
            args.shape,
            args.seed,
            getattr(torch, args.dtype),
            int(args.shard_size * 2**30),
            args.device,
            log=lambda m: print(m, file=sys.stderr),
        )
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"specpilot lift: error: {e}", file=sys.stderr)
        return 2
    print(f"{cfg.name}: {cfg.num_params() / 1e9:.2f} B parameters -> {args.out}")
    return 0


__all__ = [
    "SHAPES",
    "LiftPlan",
    "lift_model",
    "lifted_tensors",
    "plan_lift",
    "save_lifted",
    "load_small",
    "sequence_logits",
    "main",
]
