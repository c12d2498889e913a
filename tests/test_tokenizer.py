"""Tokenizer: synthetic vocabularies, GGUF-built and folder-built tokenizers, chat templates, and agreement
with transformers' own GGUF tokenizer on the real SmolLM2 file."""

from __future__ import annotations

import importlib.util
import json

import pytest
from jinja2 import TemplateError

from sglang_specpilot.models.errors import CheckpointError
from sglang_specpilot.models.gguf_loader import read_gguf_metadata
from sglang_specpilot.models.loader import default_model_path
from sglang_specpilot.models.tokenizer import Tokenizer

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "Why?"},
]


# ----------------------------------------------------------------------------- synthetic


@pytest.mark.parametrize("vocab_size", [4, 97, 258, 259, 300, 1000, 32000])
def test_synthetic_has_exact_size_and_decodes_every_id(vocab_size):
    tok = Tokenizer.synthetic(vocab_size)
    assert tok.vocab_size == vocab_size
    assert (tok.bos_token_id, tok.eos_token_ids) == (1, [2])
    text = tok.decode(list(range(vocab_size)), skip_special_tokens=False)
    assert isinstance(text, str) and text.startswith("<|endoftext|><|im_start|><|im_end|>")
    assert all(0 <= i < vocab_size for i in tok.encode("any text at all: 123 ü 😀"))


@pytest.mark.parametrize("vocab_size", [259, 300, 1000, 32000])
def test_synthetic_round_trips_any_text(vocab_size):
    tok = Tokenizer.synthetic(vocab_size)
    for text in ["hello world", "  indented\n\tcode()", "ünïcödé 😀 日本", "<|im_start|>user\nhi<|im_end|>"]:
        assert tok.decode(tok.encode(text), skip_special_tokens=False) == text
    assert tok.encode("<|im_start|>") == [1]
    assert tok.decode(tok.encode("<|im_start|>hi<|im_end|>")) == "hi"


def test_synthetic_merges_shorten_text_and_fingerprint_is_deterministic():
    small, big = Tokenizer.synthetic(259), Tokenizer.synthetic(5000)
    assert len(big.encode("the cat sat on the mat")) < len(small.encode("the cat sat on the mat"))
    assert Tokenizer.synthetic(5000).fingerprint == big.fingerprint
    assert small.fingerprint != big.fingerprint


def test_synthetic_rejects_tiny_vocab():
    with pytest.raises(ValueError, match="at least 4"):
        Tokenizer.synthetic(3)


# ----------------------------------------------------------------------------- chat template


def test_chatml_template():
    tok = Tokenizer.synthetic(300)
    text = tok.apply_chat_template(CHAT[:2])
    expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    assert text == expected + "<|im_start|>assistant\n"
    assert not tok.apply_chat_template(CHAT[:2], add_generation_prompt=False).endswith("assistant\n")


def test_template_helpers_like_hf():
    tok = Tokenizer.synthetic(300)
    tok.chat_template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"
    with pytest.raises(TemplateError, match="first must be user"):
        tok.apply_chat_template(CHAT)
    tok = Tokenizer.synthetic(300)
    tok.chat_template = "{{ bos_token }}{{ messages[0] | tojson }}{% if flag %}!{% endif %}"
    assert tok.apply_chat_template([{"role": "user", "content": "<a&b>"}], flag=True) == (
        '<|im_start|>{"role": "user", "content": "<a&b>"}!'
    )


def test_no_template_is_an_error():
    tok = Tokenizer.synthetic(300)
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template(CHAT)


# ----------------------------------------------------------------------------- from GGUF metadata


def _byte_alphabet() -> set[str]:
    return Tokenizer.synthetic(259).backend.get_vocab().keys() - {
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
    }


def _meta(pre: str, **extra) -> dict:
    tokens = ["<|end|>", *sorted(_byte_alphabet()), "12", "Ġ1", "ab"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": ["1 2", "Ġ 1", "a b"],
        "tokenizer.ggml.token_type": [3] + [1] * (len(tokens) - 1),
        "tokenizer.ggml.eos_token_id": 0,
        **extra,
    }


def test_gguf_pre_tokenizer_decides_digit_splitting():
    def pieces(pre: str, text: str) -> list[str]:
        tok = Tokenizer.from_gguf_metadata(_meta(pre))
        return [tok.id_to_token(i) for i in tok.encode(text)]

    assert pieces("gpt-2", "12 ab") == ["12", "Ġ", "ab"]  # " ab" is one word; "Ġab" is no token
    assert pieces("smollm", "12") == ["1", "2"]  # llama.cpp / SmolLM: every digit alone
    assert pieces("qwen2", "12") == ["1", "2"]  # \p{N} one at a time
    assert pieces("llama-bpe", "12") == ["12"]  # \p{N}{1,3}
    assert pieces("gpt-2", " 1") == ["Ġ1"]
    assert pieces("smollm", " 1") == ["Ġ", "1"]


def test_gguf_control_tokens_are_special_and_flags_add_bos():
    tok = Tokenizer.from_gguf_metadata(_meta("gpt-2"))
    assert tok.encode("ab<|end|>") == [tok.token_to_id("ab"), 0]
    assert tok.decode(tok.encode("ab<|end|>")) == "ab"
    assert tok.eos_token_ids == [0]
    flagged = Tokenizer.from_gguf_metadata(
        _meta("gpt-2", **{"tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.add_bos_token": True})
    )
    assert flagged.encode("ab", add_special_tokens=True) == [0, tok.token_to_id("ab")]
    assert flagged.encode("ab") == [tok.token_to_id("ab")]


def test_gguf_unsupported_tokenizers():
    with pytest.raises(CheckpointError, match="tokenizer model 'llama' is not supported"):
        Tokenizer.from_gguf_metadata(_meta("gpt-2", **{"tokenizer.ggml.model": "llama"}))
    with pytest.raises(CheckpointError, match="pre-tokenizer 'made-up' is not supported"):
        Tokenizer.from_gguf_metadata(_meta("made-up"))


# ----------------------------------------------------------------------------- from a folder


def _save(tok: Tokenizer, folder, **config) -> None:
    folder.mkdir(exist_ok=True)
    tok.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def test_from_folder_round_trip(tmp_path):
    tok = Tokenizer.synthetic(1000)
    _save(
        tok,
        tmp_path,
        bos_token="<|im_start|>",
        eos_token={"content": "<|im_end|>"},
        chat_template=tok.chat_template,
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    back = Tokenizer.from_folder(tmp_path)
    assert back.fingerprint == tok.fingerprint
    assert (back.bos_token_id, back.eos_token_ids) == (1, [2, 0])
    assert back.apply_chat_template(CHAT) == tok.apply_chat_template(CHAT)
    assert back.encode("the tea is hot") == tok.encode("the tea is hot")


def test_from_folder_template_sources(tmp_path):
    tok = Tokenizer.synthetic(300)
    _save(
        tok,
        tmp_path,
        chat_template=[{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
    )
    assert Tokenizer.from_folder(tmp_path).chat_template == "D"
    (tmp_path / "chat_template.jinja").write_text("J")
    assert Tokenizer.from_folder(tmp_path).chat_template == "J"


def test_from_folder_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        Tokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="tokenizer.json: cannot be parsed"):
        Tokenizer.from_folder(tmp_path)


# ----------------------------------------------------------------------------- the real SmolLM2 tokenizer


@pytest.fixture(scope="module")
def smollm2_tok():
    try:
        path = default_model_path()
    except CheckpointError as e:
        pytest.skip(f"SmolLM2 GGUF not installed ({e})")
    return path, Tokenizer.from_gguf_metadata(read_gguf_metadata(path))


def test_smollm2_known_ids(smollm2_tok):
    _, tok = smollm2_tok
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_ids) == (49152, 1, [2])
    assert tok.encode("Hello world! 123") == [19556, 905, 17, 216, 33, 34, 35]
    assert tok.encode("<|im_start|>user\nHi<|im_end|>\n") == [1, 4093, 198, 26843, 2, 198]
    assert tok.apply_chat_template([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


# Varied strings: code, digits, whitespace runs, unicode, emoji, chat markers, control tokens.
AGREEMENT_STRINGS = [
    "Hello world! 123",
    "12345",
    "3.14159 and 2,718",
    "  multiple   spaces",
    "def f(x):\n    return x*2\n\n\tpass",
    "<|im_start|>user\nHi<|im_end|>\n",
    "Café déjà vu.",
    "日本語のテキスト",
    "emoji 😀👍🏽 family 👨‍👩‍👧",
    "I'm you're we've they'll he'd",
    "UPPER lower MiXeD",
    "\n\n\n",
    " leading space",
    "trailing space ",
    "tab\tsep",
    "a" * 50,
    "0x1F 0b1010 1e-5",
    "https://example.com/path?q=1&r=2",
    "<|endoftext|>",
    "<repo_name>foo<file_sep>",
    "price: $1,234.56",
    "x = [1, 2, 3]; y = {'a': 1}",
    "Привет, мир!",
    "مرحبا بالعالم",
    "عربي 123",
    "naïve coöperate",
    "\u200b zero width",
    "line1\r\nline2\r\n",
    "   \n  \n",
    "SELECT * FROM t WHERE id=42;",
    "for (int i = 0; i < 10; ++i) { sum += i; }",
    "#include <stdio.h>",
    "'quoted' \"double\"",
    "a-b_c.d/e\\f",
    "100% sure!!!",
    "😀",
    "ß ẞ ſ",
    "1st 2nd 3rd 4th",
    "2024-01-01T12:34:56Z",
    "The quick brown fox jumps over the lazy dog.",
    "<|im_start|>assistant\n",
    "<|im_end|><|im_end|>",
    "   leading   ",
    "\t\t\tindent",
    "ünïcödé",
    "中文 English mixed 混合",
    "1,000,000",
    "a\n\nb",
    "don't",
    "SmolLM2 is a 135M model.",
    "",
]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_smollm2_agrees_with_transformers(smollm2_tok):
    from transformers import AutoTokenizer

    path, tok = smollm2_tok
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert tok.vocab_size == len(hf)
    for text in AGREEMENT_STRINGS:
        ids = tok.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False), text
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
        assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False) == text
    for messages in (CHAT[1:2], CHAT):
        for gen in (True, False):
            assert tok.apply_chat_template(messages, gen) == hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=gen
            )
    # Known, deliberate difference: transformers ignores tokenizer.ggml.pre = "smollm" and uses plain GPT-2
    # splitting; we isolate every digit first, as llama.cpp and SmolLM2's own tokenizer.json do. It shows
    # only where a digit follows whitespace that GPT-2 would glue elsewhere, or on non-ASCII digits.
    assert tok.encode("a\n 5") == [81, 3805, 37]  # "a", "\n ", "5"
    assert hf.encode("a\n 5", add_special_tokens=False) == [81, 198, 216, 37]  # "a", "\n", " ", "5"
