"""An EAGLE-3-style feature drafter: one decoder layer that reads the target's own hidden states.

What it reads. At position p the drafter sees the embedding of token x_p and a feature g_{p-1} that
stands for "what the target knew one position earlier":

    g_{p-1} = fc(cat(f_low, f_mid, f_high)_{p-1})    on positions the target has verified
    g_{p-1} = h_{p-1}                                 on positions the drafter itself proposed

where f_* are the outputs of three target layers (``feature_layers``: low, middle, high, as EAGLE-3
picks them) and h is the drafter layer's own output. Its output h_p predicts x_{p+1} through its final
norm and a head over a reduced draft vocabulary (``d2t`` maps draft ids to target ids; EAGLE-3 keeps
the 32k most frequent tokens of the training answers).

The layer. The attention projections read cat(input_norm(emb), hidden_norm(g)) (2 x hidden wide), the
residual stream starts from g, and the MLP is the target's shape. Heads, rope and widths are the
target's, so the drafter's K/V cache is a one-layer cache of the target's layout and the fused
tree-attention kernel, the engine's runners and CUDA graphs serve it unchanged. The token embedding is
the target's own tensor (not stored, not trained).

In the engine (``engine/round.py``): the verify pass returns the target features at every verified node
at no extra forward; the accepted path's features wait in the round state, and the next round's first
draft forward re-runs the accepted tokens with those true features (a fixed window of depth + 1
positions), so the drafter's cache always holds true-feature K/V for verified positions. The tree's
deeper nodes use the drafter's own h, as training-time test (multi-step rollout) trained it to.

On disk: a folder with ``specpilot_drafter.json`` (``"kind": "eagle3"`` and the shape), and
``model.safetensors`` (fc, the layer, norm, d2t, and lm_head only when the head was trained: by default
it is the target's head rows of the draft vocabulary, frozen, which loading takes from the target).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..kernels import launch
from ..models.config import ModelConfig
from ..models.linear import Linear
from ..models.llama import MLP, Attention, RMSNorm, Transformer, eager_norm, run_block

MARKER = "specpilot_drafter.json"
WEIGHTS = "model.safetensors"
KIND = "eagle3"


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """Low, middle and high layer outputs, as EAGLE-3 picks them (layer 2, the middle one, the third
    from the top; 0-based output indices)."""
    pick = (2, num_layers // 2, num_layers - 3)
    if not 2 < num_layers // 2 < num_layers - 3:  # small (test) models: spread them, distinct
        pick = (0, num_layers // 2, num_layers - 1)
    return tuple(sorted(set(pick)))  # type: ignore[return-value]


@dataclass(frozen=True)
class Eagle3Spec:
    """The drafter's shape beyond the target's layer config."""

    target_name: str
    target_hidden: int
    target_vocab: int
    feature_layers: tuple[int, ...]
    draft_vocab: int
    # "target": the head is the target's LM-head rows of the draft vocabulary, frozen and not stored (a
    # trained 32k x 576 head would be 37 of a 47 MB folder for SmolLM2); "trained": its own, stored.
    head: str = "target"

    def to_json(self) -> dict:
        return {**asdict(self), "feature_layers": list(self.feature_layers)}


class Eagle3Layer(nn.Module):
    """The drafter's decoder layer. Input ``x2`` = cat(embedding, g) [B, N, 2H]; output h [B, N, H].

    Its forward has a target block's signature, so ``run_block`` (and the runner's compiled copy of it)
    runs it as is.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H = cfg.hidden_size
        self.input_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.attn.wqkv = Linear(2 * H, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias)
        self.mlp_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def mixed(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention input cat(input_norm(emb), hidden_norm(g)), residual g)."""
        e, g = x2.chunk(2, dim=-1)
        return torch.cat([self.input_norm(e), self.hidden_norm(g)], -1), g

    def forward(self, x2, cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc) -> torch.Tensor:
        a, g = self.mixed(x2)
        h = g + self.attn(a, cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc)
        return h + self.mlp(self.mlp_norm(h))

    def write_kv(self, x2, cos, sin, k_cache, v_cache, batch_idx, slots) -> None:
        """Only the K/V that ``forward`` writes at ``slots``: the one layer's K/V depend on its input
        alone, so attention, o_proj and the MLP (most of the layer's weights) are skipped."""
        a, _ = self.mixed(x2)
        attn, q_size = self.attn, self.attn.cfg.q_size
        if isinstance(attn.wqkv, nn.Linear):  # the K/V rows of the fused projection, not its q rows
            bias = None if attn.wqkv.bias is None else attn.wqkv.bias[q_size:]
            kv = nn.functional.linear(a, attn.wqkv.weight[q_size:], bias)
        else:  # another weight format (W12): the whole projection
            kv = attn.wqkv(a)[..., q_size:]
        k, v = attn.kv_heads(kv, cos, sin)
        k_cache[batch_idx, slots] = k
        v_cache[batch_idx, slots] = v


class FrozenHead(nn.Module):
    """The target's head rows of the draft vocabulary: a non-persistent buffer, so neither trained (no
    parameter) nor saved (not in the state dict); loading takes them from the target again."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight)


def _target_head(target: Transformer, d2t: torch.Tensor) -> FrozenHead:
    head = target.lm_head
    if hasattr(head, "weight_w12"):  # a W12 target (--weights w12, --tlv) keeps no BF16 head: decode it, exact
        from w12.format import decode_reference

        weight = decode_reference(head.weight_w12)
    else:
        weight = head.weight.detach()
    return FrozenHead(weight[d2t.to(weight.device)].clone())


class Eagle3Drafter(nn.Module):
    """See the module docstring. ``forward`` returns hidden states; ``logits`` applies norm and head."""

    def __init__(self, cfg: ModelConfig, spec: Eagle3Spec, embed: nn.Embedding, rope: torch.Tensor):
        super().__init__()
        self.cfg, self.spec = cfg, spec
        self.embed = embed  # the target's, shared
        self.fc = Linear(len(spec.feature_layers) * spec.target_hidden, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(cfg)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, spec.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.arange(spec.draft_vocab), persistent=False)
        self.register_buffer("rope", rope, persistent=False)

    @property
    def num_layers(self) -> int:
        return 1

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the norm's: the projections may hold FP8 codes, ``models.fp8_linear``)."""
        return self.norm.weight.dtype

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.spec.feature_layers

    def project(self, feats: torch.Tensor) -> torch.Tensor:
        """Target features [.., 3 * target_hidden] -> g [.., H]."""
        return self.fc(feats.to(self.dtype))

    def prefill_inputs(self, feats: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
        """g [B, N, H] for a prefill chunk whose target features are ``feats`` [B, N, F]: the drafter reads each
        position's feature one position earlier (it was trained so), ``prev`` [B, 1, F] before the chunk's
        first position (the previous chunk's last feature; zeros before a prompt's first)."""
        if prev is None:
            prev = feats.new_zeros(feats.shape[0], 1, feats.shape[-1])
        return self.project(torch.cat([prev, feats[:, :-1]], 1))

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        mask: torch.Tensor | None,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        logit_rows: torch.Tensor | None = None,
        layer_fn=None,
        seq_len: torch.Tensor | None = None,
        anc: torch.Tensor | None = None,
        *,
        g: torch.Tensor,
    ) -> torch.Tensor:
        """Hidden states h [B, N, H] (or [B, R, H] with ``logit_rows``) of tokens [B, N] with features
        g [B, N, H]; the cache arguments are a target forward's (``models.llama.Transformer.forward``)."""
        x2, cos, sin, batch_idx = self._layer_inputs(tokens, positions, g)
        k_cache, v_cache = kv[0]
        h = (layer_fn or run_block)(
            self.layers[0], x2, cos, sin, k_cache, v_cache, batch_idx, slots, mask, seq_len, anc
        )
        if logit_rows is not None:
            h = h.gather(1, logit_rows[..., None].expand(-1, -1, h.shape[-1]))
        return h

    def write_kv(self, tokens, positions, slots, kv, *, g: torch.Tensor) -> None:
        """The K/V ``forward`` would write for tokens [B, N] with features g at ``slots``, without the
        rest of the forward (an AR round keeping the drafter current needs only these)."""
        x2, cos, sin, batch_idx = self._layer_inputs(tokens, positions, g)
        self.layers[0].write_kv(x2, cos, sin, *kv[0], batch_idx, slots)

    def _layer_inputs(self, tokens, positions, g):
        """(x2 = cat(embedding, g), rope cos, sin, batch index) that the layer reads."""
        if launch.ROUND_KERNELS:  # the gathers, the concat and the casts in one launch (kernels/embed_rope.py)
            from ..kernels.embed_rope import embed_rope

            x2, cs = embed_rope(tokens, positions, self.embed.weight, self.rope, g, self.dtype)
        else:
            x2 = torch.cat([self.embed(tokens), g.to(self.dtype)], -1)
            cs = self.rope[positions].to(x2.dtype)
        batch_idx = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
        return x2, cs[:, :, 0, None], cs[:, :, 1, None], batch_idx

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [.., draft_vocab] of hidden states h (the norm outside the compiled blocks:
        one launch under SPECPILOT_ROUND_KERNELS=1, ``models.llama.eager_norm``)."""
        return self.lm_head(eager_norm(self.norm, h))

    def target_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the target vocabulary [.., V]: the draft vocabulary's, -inf elsewhere (so a top-k
        or a sample over them never picks a token the head cannot score)."""
        lg = self.logits(h)
        if self.spec.draft_vocab == self.spec.target_vocab:
            return lg
        full = lg.new_full((*lg.shape[:-1], self.spec.target_vocab), float("-inf"))
        return full.index_copy_(-1, self.d2t, lg)


def is_eagle3(path: str | Path | None) -> bool:
    if path is None or not (Path(path) / MARKER).is_file():
        return False
    try:
        return json.loads((Path(path) / MARKER).read_text()).get("kind") == KIND
    except (OSError, ValueError):
        return False


def layer_config(target: Transformer, intermediate_size: int | None = None) -> ModelConfig:
    """The drafter layer's config: the target's, one layer; ``intermediate_size`` widens its MLP (None:
    the target's)."""
    d = {**target.cfg.to_dict(), "num_layers": 1, "name": f"{target.cfg.name}-eagle3"}
    if intermediate_size is not None:
        if isinstance(intermediate_size, bool) or not isinstance(intermediate_size, int) or intermediate_size < 1:
            raise ValueError(f"intermediate_size must be a positive integer, got {intermediate_size!r}")
        d["intermediate_size"] = intermediate_size
    return ModelConfig(**d)


def init_eagle3(
    target: Transformer,
    d2t: torch.Tensor | None = None,
    feature_layers: tuple[int, ...] | None = None,
    head: str = "target",
    intermediate_size: int | None = None,
) -> Eagle3Drafter:
    """A fresh drafter for ``target``: the layer's MLP and attention output start from copies of the
    target's last layer (a warm start); the head is the target's head rows of the draft vocabulary,
    frozen (``head="target"``) or as the start of a trained one (``"trained"``).

    ``intermediate_size`` (default: the target's) widens the layer's MLP. A drafter of SmolLM2 lifted to
    Llama-3.1-8B shapes (``models.lift_eagle3``) has the 8B drafter's MLP of 14336 units whatever this is,
    its units past this width are dead filler; so up to that width the extra capacity costs the lifted
    drafter nothing. The units past the target's start with the target's gate/up scale and zero down
    rows: they add nothing until trained."""
    if head not in ("target", "trained"):
        raise ValueError(f"head must be 'target' or 'trained', got {head!r}")
    cfg = layer_config(target, intermediate_size)
    if cfg.intermediate_size < target.cfg.intermediate_size:
        raise ValueError(
            f"intermediate_size {cfg.intermediate_size} is below the target's {target.cfg.intermediate_size} "
            "(the warm start copies the target's MLP)"
        )
    V = target.cfg.vocab_size
    d2t = torch.arange(V) if d2t is None else d2t.to(torch.long).cpu()
    layers = tuple(sorted(set(feature_layers or default_feature_layers(target.num_layers))))
    spec = Eagle3Spec(target.cfg.name, target.cfg.hidden_size, V, layers, int(d2t.numel()), head)
    dev, dtype = target.embed.weight.device, target.embed.weight.dtype
    draft = Eagle3Drafter(cfg, spec, target.embed, target.rope).to(device=dev, dtype=dtype)
    draft.d2t, draft.rope = d2t.to(dev), target.rope  # .to(dtype) must not round the rope table
    last = target.layers[-1]
    with torch.no_grad():
        lay = draft.layers[0]
        _warm_mlp(lay.mlp, last.mlp)
        lay.attn.wo.load_state_dict(last.attn.wo.state_dict())
        lay.mlp_norm.load_state_dict(last.mlp_norm.state_dict())
        draft.norm.load_state_dict(target.norm.state_dict())
    if head == "target":
        draft.lm_head = _target_head(target, draft.d2t)
    else:
        with torch.no_grad():
            draft.lm_head.weight.copy_(target.lm_head.weight[draft.d2t])
    return draft


def continue_eagle3(target: Transformer, base: Eagle3Drafter, intermediate_size: int | None = None) -> Eagle3Drafter:
    """A drafter to train further from ``base`` (``load_eagle3``): its draft vocabulary, feature layers,
    head kind and weights, with the MLP widened to ``intermediate_size`` units (default: ``base``'s) the
    way ``init_eagle3`` widens the target's (extra units with zero down columns), so the result computes
    exactly ``base``'s function until it is trained. A session's device call has minutes, so a drafter
    worth verifying is trained over several calls: each continues the last one's folder."""
    have = base.cfg.intermediate_size
    units = have if intermediate_size is None else intermediate_size
    if units < have:
        raise ValueError(f"intermediate_size {units} is below the drafter's {have} (continuing never drops units)")
    draft = init_eagle3(target, base.d2t, base.spec.feature_layers, base.spec.head, units)
    own = {n: t for n, t in base.state_dict().items() if not n.startswith("embed.") and ".mlp.w" not in n}
    with torch.no_grad():
        missing = draft.load_state_dict(own, strict=False)
        _warm_mlp(draft.layers[0].mlp, base.layers[0].mlp)
    left = [n for n in missing.missing_keys if not n.startswith("embed.") and ".mlp.w" not in n]
    if left or missing.unexpected_keys:
        raise ValueError(f"cannot continue this drafter: tensors {left or missing.unexpected_keys} do not match")
    return draft


def _warm_mlp(mlp: MLP, src: MLP) -> None:
    """Copy ``src``'s MLP into the first units of ``mlp`` (as wide or wider): extra units get gate/up
    rows at the source's scale and zero down columns, so the copy computes ``src``'s function."""
    n, wide = src.w2.weight.shape[1], mlp.w2.weight.shape[1]
    w13, w2 = mlp.w13.weight, mlp.w2.weight
    if wide == n:
        w13.copy_(src.w13.weight)
        w2.copy_(src.w2.weight)
        return
    gate, up = src.w13.weight.chunk(2, 0)  # w13 is [gate; up], each [units, hidden]
    w13.normal_(0.0, float(src.w13.weight.float().std()))
    w13[:n].copy_(gate)
    w13[wide : wide + n].copy_(up)
    w2.zero_()
    w2[:, :n].copy_(src.w2.weight)


def save_eagle3(draft: Eagle3Drafter, path: str | Path, meta: dict | None = None) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    own = {n: t for n, t in draft.state_dict().items() if not n.startswith("embed.")}
    tensors = {n: t.to(torch.bfloat16).contiguous().clone() for n, t in own.items()}
    tensors["d2t"] = draft.d2t.to(torch.int64).cpu().contiguous()
    save_file({n: t.cpu() for n, t in tensors.items()}, str(path / WEIGHTS))
    marker = {"kind": KIND, **draft.spec.to_json(), "layer": draft.cfg.to_dict(), **(meta or {})}
    (path / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return path


def load_eagle3(path: str | Path, target: Transformer) -> Eagle3Drafter:
    """Load a drafter folder onto ``target`` (its embedding, rope, device and dtype); shape mismatches
    against the target raise ``ValueError`` naming the field."""
    path = Path(path)
    marker = json.loads((path / MARKER).read_text())
    if marker.get("kind") != KIND:
        raise ValueError(f"{path}: not an EAGLE-3 drafter folder (kind {marker.get('kind')!r})")
    for key, have in (("target_hidden", target.cfg.hidden_size), ("target_vocab", target.cfg.vocab_size)):
        if marker.get(key) != have:
            raise ValueError(
                f"{path}: drafter was trained for a target with {key} {marker.get(key)}, this target has {have}"
            )
    layers = tuple(int(i) for i in marker["feature_layers"])
    if max(layers) >= target.num_layers:
        raise ValueError(f"{path}: drafter reads layer {max(layers)}, the target has {target.num_layers} layers")
    try:
        tensors = load_file(str(path / WEIGHTS))
    except Exception as e:  # safetensors raises its own error types for truncated or corrupt files
        raise ValueError(f"{path / WEIGHTS}: cannot read the drafter weights ({e})") from None
    d2t = tensors.pop("d2t")
    head = marker.get("head", "target")
    if head not in ("target", "trained"):
        raise ValueError(f"{path}: unknown head {head!r} (expected 'target' or 'trained')")
    if int(d2t.min()) < 0 or int(d2t.max()) >= target.cfg.vocab_size:
        raise ValueError(f"{path / WEIGHTS}: d2t maps to ids outside the target vocabulary")
    spec = Eagle3Spec(
        marker["target_name"], marker["target_hidden"], marker["target_vocab"], layers, int(d2t.numel()), head
    )
    cfg = layer_config(target, (marker.get("layer") or {}).get("intermediate_size"))
    dev, dtype = target.embed.weight.device, target.embed.weight.dtype
    with torch.device("meta"):
        shell = Eagle3Drafter(cfg, spec, nn.Embedding(1, 1), torch.empty(0))
    draft = Eagle3Drafter.__new__(Eagle3Drafter)
    nn.Module.__init__(draft)
    draft.cfg, draft.spec, draft.embed = cfg, spec, target.embed
    for name in ("fc", "layers", "norm", "lm_head"):
        setattr(draft, name, getattr(shell, name).to_empty(device=dev).to(dtype))
    draft.register_buffer("d2t", d2t.to(dev), persistent=False)
    draft.register_buffer("rope", target.rope, persistent=False)
    if head == "target":
        draft.lm_head = _target_head(target, draft.d2t)
    own = {n for n in draft.state_dict() if not n.startswith("embed.")}
    if set(tensors) != own:
        missing, extra = sorted(own - set(tensors)), sorted(set(tensors) - own)
        raise ValueError(
            f"{path / WEIGHTS}: tensors do not match an EAGLE-3 drafter (missing {missing[:3]}, extra {extra[:3]})"
        )
    sd = draft.state_dict()
    for n, t in tensors.items():
        if tuple(t.shape) != tuple(sd[n].shape):
            raise ValueError(f"{path / WEIGHTS}: {n} has shape {tuple(t.shape)}, expected {tuple(sd[n].shape)}")
    draft.load_state_dict(
        {**{n: t.to(dev) for n, t in tensors.items()}, "embed.weight": target.embed.weight}, strict=True
    )
    return draft
