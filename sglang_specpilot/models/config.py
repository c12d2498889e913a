"""Model architecture description shared by every loader, the decoder and the presets."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

ARCHS = ("llama", "qwen2", "qwen3", "qwen3_next")


# The Hugging Face config.json keys of a Qwen3-Next hybrid, named as our fields.
_HYBRID_KEYS = (
    "full_attention_interval",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


@dataclass
class ModelConfig:
    """Shapes and numerics of a Llama-family decoder.

    ``arch`` selects the small differences: ``qwen2`` has q/k/v biases, ``qwen3`` has per-head
    RMSNorm on q and k. SmolLM2 is ``llama`` with tied embeddings.
    ``qwen3_next`` is a hybrid (``models/hybrid.py``): Gated DeltaNet layers (``models/gdn.py``, the
    ``linear_*`` shapes) with a Qwen3 full-attention layer every ``full_attention_interval`` layers.
    ``rope_scaling`` holds the Hugging Face ``rope_scaling`` dict (Llama 3.1 "llama3" type) or None.
    """

    arch: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 32
    head_dim: int = 0  # 0 -> hidden_size // num_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = ""
    # Hybrid (qwen3_next) only: 0 = every layer is full attention (every other architecture).
    full_attention_interval: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown architecture {self.arch!r}; supported: {', '.join(ARCHS)}")
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // self.num_heads
        if self.arch == "qwen2":
            self.attention_bias = True
        if self.arch in ("qwen3", "qwen3_next"):
            self.qk_norm = True
        if self.arch == "qwen3_next" and self.full_attention_interval < 1:
            raise ValueError("qwen3_next needs full_attention_interval >= 1 (one attention layer per interval)")
        if self.full_attention_interval and self.linear_num_value_heads % max(self.linear_num_key_heads, 1):
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    @property
    def is_hybrid(self) -> bool:
        """Whether some layers are Gated DeltaNet (recurrent state) rather than attention."""
        return self.full_attention_interval > 0

    def is_gdn_layer(self, i: int) -> bool:
        # Qwen3-Next's layout: layers i with (i + 1) % interval == 0 are full attention, the rest GDN.
        return self.is_hybrid and (i + 1) % self.full_attention_interval != 0

    @property
    def gdn_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.is_gdn_layer(i)]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_params(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.qk_norm:
            attn += 2 * self.head_dim
        layer = attn + 3 * h * i + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + h

    @classmethod
    def from_hf(cls, cfg: dict) -> ModelConfig:
        """Build from a Hugging Face ``config.json`` dict (LlamaForCausalLM, Qwen2/Qwen3ForCausalLM)."""
        mt = cfg.get("model_type", "llama")
        arch = {
            "llama": "llama",
            "mistral": "llama",
            "qwen2": "qwen2",
            "qwen3": "qwen3",
            "qwen3_next": "qwen3_next",
        }.get(mt)
        if arch is None:
            raise ValueError(
                f"unsupported model_type {mt!r} in config.json; supported: llama, qwen2, qwen3, qwen3_next"
            )
        hybrid = {}
        if arch == "qwen3_next":
            hybrid = {k: cfg[k] for k in _HYBRID_KEYS if k in cfg}
        eos = cfg.get("eos_token_id")
        eos_ids = [] if eos is None else (list(eos) if isinstance(eos, list) else [eos])
        return cls(
            arch=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"],
            num_kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
            head_dim=cfg.get("head_dim") or 0,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=cfg.get("rope_theta", 10000.0),
            rope_scaling=cfg.get("rope_scaling"),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", arch == "qwen2"),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            name=cfg.get("_name_or_path", ""),
            **hybrid,
        )

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
