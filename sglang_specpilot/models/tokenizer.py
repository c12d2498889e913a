"""Text <-> token ids, and chat-template rendering, on top of the Rust ``tokenizers`` library.

Three sources build the same :class:`Tokenizer`:

* ``from_folder``: a Hugging Face folder (``tokenizer.json`` + ``tokenizer_config.json``).
* ``from_gguf_metadata``: the vocabulary llama.cpp stores in a GGUF file. Only byte-level BPE
  (``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen2/3, SmolLM) is supported. GGUF has no
  ``tokenizer.json``, so the pre-tokenizer is rebuilt from ``tokenizer.ggml.pre`` the way llama.cpp's
  ``llm_tokenizer_bpe`` does (see ``_PRE_TOKENIZERS``).
* ``synthetic``: a deterministic byte-level vocabulary of any size, for randomly initialised test models.

Special (control) tokens written in the text, e.g. ``<|im_start|>``, are matched whole, as both
Hugging Face and llama.cpp (with ``parse_special``) do.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend

from sglang_specpilot.models.errors import CheckpointError

# GGUF token types (llama.cpp ``llama_token_type``).
_CONTROL, _USER_DEFINED = 3, 4

# Split regexes as in the models' own tokenizer.json (llama.cpp spells (?i:...) out as [sS] classes).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2() -> pre_tokenizers.PreTokenizer:
    # ByteLevel's built-in regex is GPT-2's: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|...
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    # llama.cpp runs "\p{N}" then the GPT-2 regex: every digit is its own word (SmolLM, StarCoder).
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _split_then_bytes(pattern: str):
    def build() -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    return build


# tokenizer.ggml.pre -> (pre-tokenizer builder, ignore_merges). Groups follow llama-vocab.cpp.
_PRE_TOKENIZERS: dict[str, tuple[Any, bool]] = {
    **{k: (_gpt2, False) for k in ("default", "gpt-2", "gpt2", "mpt", "olmo", "jais", "phi-2", "exaone4")},
    **{
        k: (_digits_then_gpt2, False)
        for k in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b")
    },
    **{
        k: (_split_then_bytes(_LLAMA3_SPLIT), True)
        for k in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2")
    },
    **{k: (_split_then_bytes(_LLAMA3_SPLIT), False) for k in ("dbrx", "smaug-bpe")},
    **{
        k: (_split_then_bytes(_QWEN2_SPLIT), False)
        for k in ("qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2")
    },
}

_CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map: printable Latin-1 bytes stand for themselves, the rest
    (control characters, space, ...) are moved to U+0100 onwards in byte order (space -> 'Ġ')."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    moved = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(moved)}}


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


_LONG_TEXT = 4096  # characters; longer texts are encoded through encode_batch (see Tokenizer.encode)


def _lone_surrogate(text: str) -> int | None:
    """Index of the first lone UTF-16 surrogate in ``text`` (which no UTF-8 tokenizer can encode), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
    # Like HF: jinja's own tojson HTML-escapes <, >, & and ', which chat templates must not do.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class Tokenizer:
    """A tokenizer plus the ids and chat template the engine needs.

    Parameters
    ----------
    backend : tokenizers.Tokenizer
        Does the actual encoding and decoding; special tokens must be registered on it.
    bos_token_id : int or None
    eos_token_ids : list[int]
        Every id that ends generation (e.g. ``<|im_end|>`` and ``<|endoftext|>``).
    chat_template : str or None
        A Hugging Face Jinja chat template.
    """

    def __init__(
        self,
        backend: _Backend,
        *,
        bos_token_id: int | None,
        eos_token_ids: list[int],
        chat_template: str | None = None,
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = list(dict.fromkeys(eos_token_ids))
        self.chat_template = chat_template
        self._compiled_template = None
        self._fingerprint: str | None = None

    # ------------------------------------------------------------------ basic use

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_token_id is None else self.backend.id_to_token(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return self.backend.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds BOS/EOS where the tokenizer's post-processor
        says to (Llama 3 adds ``<|begin_of_text|>``; SmolLM2 and Qwen add nothing)."""
        try:
            if isinstance(text, str) and len(text) > _LONG_TEXT:
                # The same ids; encode_batch releases the GIL while it works, so a long prompt tokenized in a
                # worker thread does not stall the server's event loop (encode holds the GIL throughout).
                return self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
            return self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        except TypeError:
            at = _lone_surrogate(text) if isinstance(text, str) else None
            if at is None:
                raise
            raise ValueError(
                f"the text holds {text[at]!r} at index {at}, a lone surrogate, which is not valid Unicode (invalid "
                "UTF-8 bytes in a command-line argument arrive as these)"
            ) from None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``. No "clean up tokenization spaces" pass: transformers 5 refuses it for BPE."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render ``messages`` (``[{"role": ..., "content": ...}]``) with the model's Jinja chat template.

        The environment matches Hugging Face's: sandboxed, ``trim_blocks``/``lstrip_blocks``, loop
        controls, ``raise_exception``, ``strftime_now`` and a non-escaping ``tojson``. ``kwargs`` (e.g.
        ``enable_thinking=False`` for Qwen3, ``tools=[...]``) are passed to the template.
        """
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        if self._compiled_template is None:
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
            )
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = _raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._compiled_template = env.from_string(self.chat_template)
        context = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or "", **kwargs}
        return self._compiled_template.render(messages=messages, add_generation_prompt=add_generation_prompt, **context)

    @property
    def fingerprint(self) -> str:
        """sha256 over the vocabulary (token, id), the merges and the added tokens.

        Two tokenizers with equal fingerprints map every text to the same ids, pre-tokenizer aside: the
        check a draft/target pair must pass before drafts can be verified token by token.
        """
        if self._fingerprint is None:
            model = json.loads(self.backend.to_str())["model"]
            vocab = model.get("vocab", {})
            vocab = sorted(vocab.items(), key=lambda kv: kv[1]) if isinstance(vocab, dict) else vocab
            # tokenizer.json stores merges as "a b" (older) or ["a", "b"] (newer); hash one spelling.
            merges = [m.split(" ", 1) if isinstance(m, str) else list(m) for m in model.get("merges", [])]
            added = sorted((i, t.content, t.special) for i, t in self.backend.get_added_tokens_decoder().items())
            blob = json.dumps([model.get("type"), vocab, merges, added], ensure_ascii=False)
            self._fingerprint = hashlib.sha256(blob.encode("utf-8")).hexdigest()
        return self._fingerprint

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token_id}, eos={self.eos_token_ids})"

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_gguf_metadata(cls, source: Any) -> Tokenizer:
        """Build from GGUF metadata: a ``gguf.GGUFReader``, its ``fields`` dict, or the plain metadata dict
        ``load_gguf`` returns (``tokenizer.ggml.tokens``, ``.merges``, ``.token_type``, ``.pre``, ...)."""
        meta = _plain_metadata(source)
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise CheckpointError(f"GGUF tokenizer model {kind!r} is not supported; only byte-level BPE ('gpt2') is")
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in _PRE_TOKENIZERS:
            known = ", ".join(sorted(_PRE_TOKENIZERS))
            raise CheckpointError(f"GGUF pre-tokenizer {pre!r} is not supported; supported: {known}")
        tokens = meta.get("tokenizer.ggml.tokens")
        merges = meta.get("tokenizer.ggml.merges")
        if not tokens or merges is None:
            raise CheckpointError("GGUF metadata has no tokenizer.ggml.tokens / tokenizer.ggml.merges")
        vocab = {t: i for i, t in enumerate(tokens)}
        if len(vocab) != len(tokens):
            raise CheckpointError("GGUF vocabulary has duplicate tokens")
        build_pre, ignore_merges = _PRE_TOKENIZERS[pre]
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        bad = next((m for m in pairs if len(m) != 2 or m[0] not in vocab or m[1] not in vocab), None)
        if bad is not None:
            raise CheckpointError(f"GGUF tokenizer merge {' '.join(bad)!r} names a token not in the vocabulary")
        try:
            backend = _Backend(models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges))
        except Exception as e:  # the tokenizers library raises a bare Exception ("Error while initializing BPE")
            raise CheckpointError(f"GGUF tokenizer could not be built: {e}") from None
        backend.pre_tokenizer = build_pre()
        backend.decoder = decoders.ByteLevel()
        types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        if len(types) != len(tokens):
            raise CheckpointError(f"GGUF has {len(tokens)} tokens but {len(types)} token types")
        backend.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types, strict=True)
                if ty == _CONTROL
            ]
        )
        backend.add_tokens(
            [
                AddedToken(t, special=False, normalized=False)
                for t, ty in zip(tokens, types, strict=True)
                if ty == _USER_DEFINED
            ]
        )
        bos = meta.get("tokenizer.ggml.bos_token_id")
        eos = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in meta]
        # llama.cpp adds BOS by default for the Llama 3 group, the one group with ignore_merges; the
        # file's add_bos_token flag overrides.
        add_bos = meta.get("tokenizer.ggml.add_bos_token", ignore_merges)
        add_eos = meta.get("tokenizer.ggml.add_eos_token", False)
        _set_bos_eos_template(backend, tokens, bos if add_bos else None, eos[0] if add_eos and eos else None)
        return cls(
            backend,
            bos_token_id=bos,
            eos_token_ids=[int(e) for e in eos],
            chat_template=meta.get("tokenizer.chat_template"),
        )

    def save(self, folder: str | Path) -> list[str]:
        """Write tokenizer.json, tokenizer_config.json and generation_config.json into ``folder`` so that
        ``Tokenizer.from_folder`` reads back an equal tokenizer; returns the file names written."""
        folder = Path(folder)
        self.backend.save(str(folder / "tokenizer.json"))
        tcfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "chat_template": self.chat_template,
            "clean_up_tokenization_spaces": False,
        }
        gcfg = {"bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_ids}
        (folder / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2) + "\n", encoding="utf-8")
        (folder / "generation_config.json").write_text(json.dumps(gcfg, indent=2) + "\n", encoding="utf-8")
        return ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]

    @classmethod
    def from_folder(cls, path: str | Path) -> Tokenizer:
        """Build from a Hugging Face folder: ``tokenizer.json`` (required), ``tokenizer_config.json``
        (special tokens, ``chat_template``), ``chat_template.jinja`` and ``generation_config.json``
        (extra eos ids), where present."""
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise CheckpointError(f"{path}: no tokenizer.json")
        try:
            backend = _Backend.from_file(str(path / "tokenizer.json"))
        except Exception as e:
            raise CheckpointError(f"{path / 'tokenizer.json'}: cannot be parsed: {e}") from e
        tcfg = _read_json(path / "tokenizer_config.json")
        gcfg = _read_json(path / "generation_config.json")

        def token_id(entry: Any) -> int | None:
            text = entry.get("content") if isinstance(entry, dict) else entry
            return None if text is None else backend.token_to_id(text)

        eos = [token_id(tcfg.get("eos_token"))]
        gen_eos = gcfg.get("eos_token_id")
        eos += gen_eos if isinstance(gen_eos, list) else [gen_eos]
        template = tcfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
            template = {t["name"]: t["template"] for t in template}.get("default")
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        elif template is None:
            template = _read_json(path / "chat_template.json").get("chat_template")
        return cls(
            backend,
            bos_token_id=token_id(tcfg.get("bos_token")),
            eos_token_ids=[e for e in eos if e is not None],
            chat_template=template,
        )

    @classmethod
    def synthetic(cls, vocab_size: int) -> Tokenizer:
        """A deterministic byte-level BPE vocabulary of exactly ``vocab_size`` tokens, for random models.

        Ids 0-2 are ``<|endoftext|>``, ``<|im_start|>`` (BOS), ``<|im_end|>`` (EOS); then the 256 byte
        symbols, printable ASCII first; then merges that spell lower-case words, optionally after a space
        (``Ġe``, ``Ġt``, ..., ``ee``, ``et``, ...). Below 259 tokens only the first bytes exist and encode
        drops the rest; every id decodes to text. The chat template is ChatML.
        """
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        if vocab_size < len(specials) + 1:
            raise ValueError(f"synthetic vocabulary needs at least {len(specials) + 1} tokens, got {vocab_size}")
        spell = _bytes_to_unicode()
        order = [
            *range(0x20, 0x7F),
            0x0A,
            0x09,
            *(b for b in range(256) if not (0x20 <= b < 0x7F or b in (9, 10))),
        ]
        tokens = specials + [spell[b] for b in order][: vocab_size - len(specials)]
        merges: list[tuple[str, str]] = []
        letters = "etaoinshrdlucmfwypvbgkjqxz"
        frontier = ["Ġ", *letters]
        while len(tokens) < vocab_size:
            grown = []
            for prefix in frontier:
                for c in letters:
                    if len(tokens) == vocab_size:
                        break
                    merges.append((prefix, c))
                    tokens.append(prefix + c)
                    grown.append(prefix + c)
            frontier = grown
        backend = _Backend(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
        backend.pre_tokenizer = _gpt2()
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
        return cls(backend, bos_token_id=1, eos_token_ids=[2], chat_template=_CHATML_TEMPLATE)


def _plain_metadata(source: Any) -> dict:
    fields = getattr(source, "fields", source)
    if not isinstance(fields, Mapping):
        raise TypeError(f"expected a GGUFReader or a metadata mapping, got {type(source).__name__}")
    return {k: (v.contents() if hasattr(v, "contents") else v) for k, v in fields.items() if k.startswith("tokenizer.")}


def _set_bos_eos_template(backend: _Backend, tokens: list[str], bos: int | None, eos: int | None) -> None:
    """Make ``encode(add_special_tokens=True)`` add BOS and/or EOS, as the GGUF's flags ask."""
    if bos is None and eos is None:
        return
    pre = [f"{tokens[bos]}:0"] if bos is not None else []
    post = [f"{tokens[eos]}:0"] if eos is not None else []
    special = [(tokens[i], i) for i in dict.fromkeys(x for x in (bos, eos) if x is not None)]
    backend.post_processor = processors.TemplateProcessing(
        single=[*pre, "$A:0", *post], pair=[*pre, "$A:0", *post, *pre, "$B:1", *post], special_tokens=special
    )


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot be parsed as JSON: {e}") from e
