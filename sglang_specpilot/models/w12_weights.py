"""Swap a decoder's BF16 projections for W12 ones (lossless 12-bit weights, decoded inside the GEMM)."""

from __future__ import annotations

import torch
from torch import nn

from .llama import Transformer


def to_w12(model: Transformer) -> Transformer:
    """Replace every projection (qkv, o, gate/up, down) and the LM head with ``w12.linear.W12Linear``.

    The weights must be BF16; decode(encode(w)) is bit-exact, so on the CPU reference path the model's
    outputs are bit-identical to the BF16 model's. A tied LM head gets its own W12 copy of the embedding
    (the embedding lookup keeps the BF16 table). Returns the same model, modified in place.
    """
    from w12.linear import W12Linear

    if model.embed.weight.dtype != torch.bfloat16:
        raise ValueError(f"W12 weights need a bfloat16 model, got {model.embed.weight.dtype}")

    def swap(parent: nn.Module, name: str) -> None:
        setattr(parent, name, W12Linear.from_linear(getattr(parent, name)))

    for layer in model.layers:
        swap(layer.attn, "wqkv")
        swap(layer.attn, "wo")
        swap(layer.mlp, "w13")
        swap(layer.mlp, "w2")
    head = model.lm_head
    if model.cfg.tie_word_embeddings:
        head = nn.Linear(
            model.cfg.hidden_size, model.cfg.vocab_size, bias=False, device=head.weight.device, dtype=head.weight.dtype
        )
        head.weight = nn.Parameter(model.embed.weight.detach(), requires_grad=False)
    model.lm_head = W12Linear.from_linear(head)
    return model


def w12_twin(model: Transformer) -> Transformer:
    """A W12 copy of ``model`` that leaves ``model`` as it is: the twin's projections and LM head are W12
    (``to_w12``), everything else (embedding, norms, rope table) is ``model``'s own tensors, shared, not
    copied. So a BF16 model and its W12 twin cost the BF16 bytes plus the W12 bytes, and a drafter bound
    to ``model``'s embedding (an EAGLE-3 drafter) drafts for both."""
    import copy
    import itertools

    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    twin = copy.deepcopy(model, memo=shared)
    return to_w12(twin)


def align_w12_escapes(model: nn.Module) -> None:
    """Pad the kernel escapes of each projection to one length across the layers (``w12.linear.
    pad_escapes_alike``: the same projection of every layer of one kind, e.g. every ``attn.wqkv``), so the
    one compiled block (``run_block``) serves every layer of a W12 model without recompiling on escape
    counts. A no-op for a model without W12 layers."""
    from w12.linear import W12Linear, pad_escapes_alike

    groups: dict[tuple[type, str], list] = {}
    for layer in getattr(model, "layers", ()):
        for name, m in layer.named_modules():
            if isinstance(m, W12Linear):
                groups.setdefault((type(layer), name), []).append(m)
    for mods in groups.values():
        pad_escapes_alike(mods)


def has_w12(model: Transformer) -> bool:
    """Whether ``model``'s projections are W12 (what two-level verification's 8-bit view needs)."""
    from w12.linear import W12Linear

    return isinstance(model.lm_head, W12Linear) and all(isinstance(m.attn.wqkv, W12Linear) for m in model.layers)


def view8_twin(model: Transformer) -> Transformer:
    """The 8-bit view of a W12 ``model``: a twin whose every W12 projection and LM head reads the hi plane
    alone (``w12.view8_linear.W12View8Linear``), every tensor shared with ``model``, none copied. It runs
    on ``model``'s KV cache (the Q pass of two-level verification, ``engine.tlv_round``)."""
    import copy
    import itertools

    from w12.linear import W12Linear
    from w12.view8_linear import W12View8Linear

    if not has_w12(model):
        raise ValueError("the 8-bit view needs W12 weights (--weights w12)")
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    twin = copy.deepcopy(model, memo=shared)
    for parent in list(twin.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, W12Linear):
                setattr(parent, name, W12View8Linear(child))
    return twin
