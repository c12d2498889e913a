"""Lift an EAGLE-3 drafter (``drafters.eagle3``) along with its target: the same drafts at the big shapes.

``lift_eagle3(drafter, lifted_target, "llama-3.1-8b")`` takes a drafter trained for SmolLM2-135M (hidden
``h`` 576) and the target lifted by ``models.lift.lift_model`` (hidden ``H`` 4096, 32/8 heads of 128,
intermediate 14336) and returns a drafter of Llama-3.1-8B's EAGLE-3 shapes (fc 3H -> H, one decoder layer
whose q/k/v read 2H inputs, the 8B MLP, a head of the same draft vocabulary over H) that, on the lifted
target, drafts what the small drafter drafts on SmolLM2: its live dims compute the small drafter's
function, every GEMM has the 8B drafter's shape and nothing in it is zero, so it costs what EAGLE-3 costs
at 8B. Notation and "tiny" (``2^-64 * N(0, 1)``) are ``models.lift``'s; read that docstring first.

What the drafter reads from the lifted target
    The feature layers keep their indices (the lifted layers ``0..L-1`` are SmolLM2's): each feature
    ``f_k`` holds SmolLM2's residual in dims ``0..h-1``, the constant ``d0 = 2^dead_exp`` in dim ``h``, and
    the embedding's dead values (``+-2^dead_exp * m``, a different sign pattern and shift per token) in
    ``h+1..H-1``, all plus ~1e-17 of the near-identity writes. Dead feature dims are *not* normalised
    before ``fc`` (``fc`` reads the raw residual), so ``fc`` must not read them with weights of normal size.

``fc`` [H, 3H]
    Live rows ``0..h-1``, live columns ``k*H + j`` (feature ``k``, ``j < h``): the small fc's
    ``[:, k*h + j]``. Every other entry is tiny (dead columns multiply values ~3e-5, so their sum is
    ~1e-24), except one per dead row: row ``h`` reads feature 0's ``d0`` with weight 1 and row ``h + 1 + i``
    with weight ``m_i`` (the ``i``-th dead value over ``d0``, exact in bf16). So ``g`` holds SmolLM2's
    ``g`` in its live dims and, in its dead dims, exactly the multiset of an embedding row's dead values:
    its dead sum of squares is the lift's constant ``S``, for every token, like the residual stream's.

Norms
    The layer normalises the embedding (dead sum ``S``), ``g`` (``S``, by the ``fc`` rows above), its
    residual ``h = g + attn + mlp`` (``g``'s dead dims plus tiny writes: ``S``) and, before the head, ``h``
    again. Each has the dead sum ``S`` that the lifted config's ``eps' = (h*eps - S)/H`` absorbs, so every
    norm is exact with the lifted config's eps and weights ``sqrt(h/H) * w`` on live dims, tiny on dead
    ones (``_Lifter.norm``). The tree's deeper nodes feed ``h`` back as their children's ``g``: it carries
    ``S`` too. (Tiny dead ``fc`` rows would leave ``g``'s dead sum at ~0 and need a different eps for
    three of the four norms: a drafter that no longer matches its own config, which ``save_eagle3`` /
    ``load_eagle3`` would not round-trip.) The one ``g`` without ``S`` is the prefill's zero feature before
    position 0: ``hidden_norm(0) = 0`` in both drafters, and the K/V written there come from the attention
    input alone, so they are exact; only that position's unused output is off by ``S/H`` in one norm.

The decoder layer
    Its q/k/v read ``cat(input_norm(emb), hidden_norm(g))``, 2H wide: the small weight's ``2h`` columns go
    to ``[0, h)`` and ``[H, H + h)`` and the other columns are random at the row's scale (their inputs are
    normalised dead dims times tiny norm weights, ~1e-20). Rows, heads and scale are the target lift's,
    built by the same code (``_Lifter.block``): rope pairs on every other frequency of head_dim 128 with
    SmolLM2's base (the lifted rope table, shared with the target), q rows times ``sqrt(128/64)`` for the
    attention scale, 9 query heads over 3 K/V heads as power-of-two copies inside 32 over 8, dead heads
    random with tiny v rows, tiny o_proj dead rows; the MLP is a lifted SmolLM2 MLP (dead units: random
    gate, tiny up; tiny down dead rows).

Draft vocabulary and head
    ``d2t`` is unchanged: the lifted vocabulary keeps ids ``0..v-1``, so every draft id (< 49152) names
    the same token, and the extra target ids are never drafted (``target_logits`` fills them with -inf).
    ``lm_head`` [draft_vocab, H] is the small head in columns ``0..h-1`` and random at each row's scale in
    the dead columns (they read the final norm's dead outputs, ~1e-20). A frozen target head
    (``FrozenHead``: the small target's rows of the draft vocabulary) is lifted the same way and stays
    frozen; it is then the lifted target's rows in their live columns.

Precision: as for the target lift, fp32 runs agree to rounding (the ``sqrt`` factors are one rounding
each); bf16 runs can part at near-ties. The small drafter's embedding is its target's, so the plan (dead
values, ``S``, eps) is recomputed from it and checked against the lifted target's config.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ..drafters.eagle3 import Eagle3Drafter, FrozenHead, layer_config
from .lift import _SHAPE_KEYS, SHAPES, LiftPlan, _Lifter, _widen, plan_lift
from .llama import Transformer


def eagle3_plan(drafter: Eagle3Drafter, shape: str | dict) -> LiftPlan:
    """The lift plan of ``drafter``'s target into ``shape``: the one ``lift_model`` used for the target
    (same hidden size, heads, eps and embedding, hence the same dead values and eps')."""
    absmax = float(drafter.embed.weight.detach().abs().max())
    return plan_lift(drafter.cfg, shape, embed_absmax=absmax)


def _check_target(plan: LiftPlan, target: Transformer, drafter: Eagle3Drafter) -> None:
    big, have = plan.big, target.cfg
    for key in _SHAPE_KEYS:
        if getattr(big, key) != getattr(have, key):
            raise ValueError(
                f"the lifted target has {key} {getattr(have, key)}, the lift plan {getattr(big, key)}: "
                "lift the drafter to the shape its target was lifted to"
            )
    if not math.isclose(big.rms_norm_eps, have.rms_norm_eps, rel_tol=1e-9):
        raise ValueError(
            f"the lifted target's eps {have.rms_norm_eps} is not the plan's {big.rms_norm_eps}: it was lifted from "
            "another model (its embedding sets the dead values) than the drafter's target"
        )
    if drafter.spec.target_hidden != plan.h:
        raise ValueError(f"the drafter reads features of hidden {drafter.spec.target_hidden}, its target has {plan.h}")
    if max(drafter.feature_layers) >= target.num_layers:
        raise ValueError(f"the drafter reads layer {max(drafter.feature_layers)} of {target.num_layers}")


@torch.no_grad()
def lifted_eagle3_tensors(drafter: Eagle3Drafter, plan: LiftPlan, seed: int = 0, device="cpu") -> dict:
    """The lifted drafter's own parameters (its state-dict names, fp32 on ``device``)."""
    h, H = plan.h, plan.H
    sd = {n: t.detach() for n, t in drafter.state_dict().items() if not n.startswith("embed.")}
    lifter = _Lifter(plan, sd, seed, device)
    rnd, dev = lifter.rnd, lifter.device
    n_feat = len(drafter.feature_layers)
    q_s, kv_s = drafter.cfg.q_size, drafter.cfg.kv_size
    out: dict[str, torch.Tensor] = {}

    fc_s = lifter.w("fc.weight")  # [h, n_feat * h]
    fc = rnd.tiny((H, n_feat * H), "eagle3.fc")
    for k in range(n_feat):
        fc[:h, k * H : k * H + h] = fc_s[:, k * h : (k + 1) * h]
    fc[h, h] = 1.0  # g[h] = d0 of feature 0
    fc[h + 1 :, h] = (plan.dead_values / plan.d0_value).to(dev, torch.float32)  # g's dead dims: m_i * d0
    out["fc.weight"] = fc

    p = "layers.0."
    qkv_s = lifter.w(p + "attn.wqkv.weight")  # [q + 2 kv, 2h]
    gate_s, up_s = lifter.w(p + "mlp.w13.weight").chunk(2)
    small = dict(zip("qkv", qkv_s.split([q_s, kv_s, kv_s]), strict=True))
    small |= {"o": lifter.w(p + "attn.wo.weight"), "gate": gate_s, "up": up_s, "down": lifter.w(p + "mlp.w2.weight")}
    live = torch.arange(h, device=dev)
    big = lifter.block(small, "eagle3.layer.", width=2 * H, cols=torch.cat([live, H + live]))
    out[p + "attn.wqkv.weight"] = torch.cat([big["q"], big["k"], big["v"]])
    out[p + "attn.wo.weight"] = big["o"]
    out[p + "mlp.w13.weight"] = torch.cat([big["gate"], big["up"]])
    out[p + "mlp.w2.weight"] = big["down"]
    for name in ("input_norm", "hidden_norm", "mlp_norm"):
        out[p + f"{name}.weight"] = lifter.norm(lifter.w(p + f"{name}.weight"), f"eagle3.{name}")
    out["norm.weight"] = lifter.norm(lifter.w("norm.weight"), "eagle3.norm")
    # A trained head is a parameter; a frozen target head (``FrozenHead``) a buffer outside the state dict.
    head_s = drafter.lm_head.weight.detach().to(dev, torch.float32)
    head = torch.empty((head_s.shape[0], H), device=dev)
    for lo in range(0, head_s.shape[0], 8192):
        head[lo : lo + 8192] = _widen(head_s[lo : lo + 8192], H, rnd, f"eagle3.head.{lo}")
    out["lm_head.weight"] = head
    return out


@torch.no_grad()
def lift_eagle3(
    drafter: Eagle3Drafter,
    lifted_target: Transformer,
    shape: str | dict | LiftPlan = "llama-3.1-8b",
    seed: int = 0,
    *,
    dtype: torch.dtype | None = None,
) -> Eagle3Drafter:
    """``drafter`` (an EAGLE-3 drafter of a small target) lifted onto ``lifted_target`` (that target lifted
    by ``lift_model`` into ``shape``, a key of ``models.lift.SHAPES``, a shape dict or the ``LiftPlan``).

    The result shares the lifted target's embedding and rope table, lives on its device, in ``dtype``
    (default: the lifted target's); weights are computed in fp32 there, then cast. Same feature layers,
    same draft vocabulary (``d2t``). See the module docstring for why it drafts what ``drafter`` drafts.
    """
    if isinstance(shape, str) and shape not in SHAPES:
        raise ValueError(f"unknown lift shape {shape!r}; shapes: {', '.join(SHAPES)}")
    plan = shape if isinstance(shape, LiftPlan) else eagle3_plan(drafter, shape)
    _check_target(plan, lifted_target, drafter)
    dev = lifted_target.embed.weight.device
    dtype = dtype or lifted_target.embed.weight.dtype
    tensors = lifted_eagle3_tensors(drafter, plan, seed, dev)
    cfg = layer_config(lifted_target)
    spec = replace(
        drafter.spec, target_name=lifted_target.cfg.name, target_hidden=cfg.hidden_size, target_vocab=cfg.vocab_size
    )
    with torch.device("meta"):  # no init of 8B-sized weights that are overwritten at once
        big = Eagle3Drafter(cfg, spec, lifted_target.embed, lifted_target.rope)
    for name in ("fc", "layers", "norm", "lm_head"):
        getattr(big, name).to_empty(device=dev).to(dtype)
    big.d2t = drafter.d2t.to(dev)
    big.rope = lifted_target.rope  # the lifted table, in its own dtype (never rounded to the weights')
    if isinstance(drafter.lm_head, FrozenHead):  # frozen stays frozen: a buffer, not trained, not saved
        big.lm_head = FrozenHead(tensors.pop("lm_head.weight").to(dtype))
    params = dict(big.named_parameters())
    own = {n for n in params if not n.startswith("embed.")}
    if set(tensors) != own:
        raise RuntimeError(f"lift_eagle3 built {sorted(set(tensors) ^ own)[:4]} that the drafter does not have")
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(params[name].shape):
            raise RuntimeError(f"lift_eagle3: {name} is {tuple(t.shape)}, the drafter's {tuple(params[name].shape)}")
        params[name].copy_(t)
    return big.eval().requires_grad_(False)


__all__ = ["eagle3_plan", "lift_eagle3", "lifted_eagle3_tensors"]
