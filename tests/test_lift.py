"""The lift (models/lift.py): SmolLM2-135M inside bigger tensor shapes computes the same function.

CPU, fp32. The 8B shapes themselves (32 GB in fp32) are too big for this machine, so the end-to-end checks
run on the "tiny" shape, which has Llama-3.1-8B's attention geometry (32 query / 8 K/V heads of 128, so
the sqrt(2) scale, the rope pair mapping and the 3-in-4 GQA copies are the real ones, untied head with
the d0 offset) at hidden 640 / intermediate 1600 / vocab 50000, and on "tiny-1b" (Llama-3.2-1B's 32/8
heads of 64, tied) for the shipped drafter. The Llama-3.1-8B shapes are checked on one lifted layer.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import needs_smollm2

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.models.errors import expected_shapes
from sglang_specpilot.models.lift import (
    SHAPES,
    _Lifter,
    lift_model,
    load_small,
    plan_lift,
    save_lifted,
    sequence_logits,
)
from sglang_specpilot.models.presets import preset_config
from sglang_specpilot.models.rope import rope_inv_freq

pytestmark = needs_smollm2

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    'def is_prime(n):\n    """Return True if n is prime."""\n',
    "Translate 'good morning' into Spanish and German.",
    "Give me a short poem about the sea.",
    "What is 17 times 23? Show your steps.",
]
NEW = 64
V_SMALL = 49152


@pytest.fixture(scope="module")
def smollm2():
    return load_small(None, max_positions=1024)


def _greedy(model, tok, prompts, new=NEW):
    opts = EngineOptions(max_seq_len=256, max_batch_size=8, device="cpu", dtype="float32", cuda_graphs=False)
    res = Engine(model, tok, opts).generate(prompts, SamplingParams(max_new_tokens=new, ignore_eos=True), chat=True)
    return [r.token_ids for r in res]


def _logits(model, seqs: list[list[int]]) -> list[torch.Tensor]:
    return [sequence_logits(model, ids) for ids in seqs]


@pytest.fixture(scope="module")
def tiny(smollm2):
    return lift_model(smollm2[0], "tiny", seed=0)


@pytest.fixture(scope="module")
def runs(smollm2, tiny):
    small, tok = smollm2
    ref = _greedy(small, tok, PROMPTS)
    got = _greedy(tiny, tok, PROMPTS)
    chat = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]
    seqs = [c + r for c, r in zip(chat, ref, strict=True)]
    return ref, got, seqs


def test_plan_math():
    """Rope pairs land on pairs with SmolLM2's frequencies, the GQA copies are powers of two summing to the
    group, and eps' absorbs the dead dims exactly: H * eps' + S == h * eps."""
    from sglang_specpilot.models.config import ModelConfig

    small, _ = load_small(None)
    for shape in SHAPES:
        s = small.cfg
        if SHAPES[shape]["num_layers"] < s.num_layers:  # the 1B shapes: a drafter of SmolLM2's shape
            s = ModelConfig(**{**s.to_dict(), "num_layers": 2, "name": "SmolLM2-drafter"})
        plan = plan_lift(s, shape)
        b = plan.big
        f_s, f_b = rope_inv_freq(s.head_dim, s.rope_theta), rope_inv_freq(b.head_dim, b.rope_theta)
        half_s, half_b = s.head_dim // 2, b.head_dim // 2
        for j in range(s.head_dim):
            k = int(plan.dmap[j])
            assert f_b[k % half_b] == pytest.approx(float(f_s[j % half_s]), rel=1e-6)
            assert (k >= half_b) == (j >= half_s)
        assert b.rope_scaling is None and b.rope_theta == s.rope_theta
        G = b.num_heads // b.num_kv_heads
        assert sum(plan.copies) == G and all(c & (c - 1) == 0 for c in plan.copies)
        assert sorted(h for h in plan.q_src if h >= 0) == sorted(
            h for h in range(s.num_heads) for _ in range(plan.copies[h % len(plan.copies)])
        )
        for bh, sh in enumerate(plan.q_src):  # a big q head reads the K/V head of its small head
            assert sh < 0 or bh // G == sh // (s.num_heads // s.num_kv_heads)
        assert b.hidden_size * b.rms_norm_eps + plan.dead_sq == pytest.approx(s.hidden_size * s.rms_norm_eps, rel=1e-12)
        assert "stand-in" in b.name and "SmolLM2-135M" in b.name and " lifted to " in b.name
    s = small.cfg
    assert plan_lift(s, "llama-3.1-8b").big.name == "SmolLM2-135M lifted to Llama-3.1-8B shapes (stand-in, timing)"
    assert plan_lift(s, "llama-3.1-8b").q_scale == pytest.approx(2**0.5)


def test_llama31_8b_shapes_and_w12_bits():
    """At the real Llama-3.1-8B shapes: the config has exactly the preset's tensors; lifted layers (two of
    SmolLM2's, one appended), the embedding and the untied head have those shapes, add no zeros, and W12
    encodes them losslessly. Bits per weight of the whole 8B, estimated from these tensors (layers 0 and
    29 each stand for 15 of the 30 lifted layers, layer 31 for the 2 appended), must meet the issue's
    12.1 (measured: 12.0227; the whole folder written by ``specpilot lift`` converts at 12.0225)."""
    from w12.codec import decode, encode

    small, _ = load_small(None)
    plan = plan_lift(small.cfg, "llama-3.1-8b")
    want = expected_shapes(preset_config("llama-3.1-8b"))
    assert expected_shapes(plan.big) == want
    sd = small.hf_state_dict()
    lifter = _Lifter(plan, sd, seed=0, device="cpu")
    weights = bits = 0

    def add(name, t, times):
        nonlocal weights, bits
        assert tuple(t.shape) == want[name], name
        b = t.to(torch.bfloat16)
        w = encode(b)
        assert torch.equal(decode(w).view(torch.int16), b.view(torch.int16)), name
        weights += times * t.numel()
        bits += times * 8 * w.nbytes()

    for n, times in ((0, 15), (29, 15), (31, 2)):  # lifted SmolLM2 layers and an appended near-identity one
        for name, t in lifter.layer(n).items():
            copies = max(plan.copies) if ("q_proj" in name or "o_proj" in name) else 1  # copied heads
            assert int((t == 0).sum()) <= (copies * int((sd[name] == 0).sum()) if n < 30 else 0), name
            if t.dim() == 2:
                add(name, t, times)
    h = small.cfg.hidden_size
    for name, t in (("model.embed_tokens.weight", lifter.embedding()), ("lm_head.weight", lifter.head())):
        assert not (t[:, h:] == 0).any(), name  # dead columns: never zeros
        add(name, t, 1)
    assert weights == sum(math.prod(s) for n, s in want.items() if len(s) == 2)
    print(f"W12 bits per weight, Llama-3.1-8B lift (estimate): {bits / weights:.4f}")
    assert bits / weights <= 12.1


def test_greedy_equals_smollm2(runs):
    ref, got, _ = runs
    assert all(len(r) == NEW for r in ref)
    bad = [i for i, (a, b) in enumerate(zip(ref, got, strict=True)) if a != b]
    assert not bad, f"prompts {bad} differ; first: {ref[bad[0]]} vs {got[bad[0]]}"


def test_logits_close_and_extra_vocab_never_wins(smollm2, tiny, runs):
    _, _, seqs = runs
    for a, b in zip(_logits(smollm2[0], seqs), _logits(tiny, seqs), strict=True):
        real, extra = b[:, :V_SMALL], b[:, V_SMALL:]
        scale = a.abs().max()
        assert (real - a).abs().max() <= 2e-5 * scale, float((real - a).abs().max())
        assert torch.equal(real.argmax(-1), a.argmax(-1))
        assert (extra.max(-1).values < real.max(-1).values).all()
        # and sampling cannot reach them either: their probability mass, at temperature 1
        assert float((extra.logsumexp(-1) - b.logsumexp(-1)).exp().max()) < 1e-12


def test_no_zeros_added(smollm2, tiny):
    """Every lifted entry that is not one of SmolLM2's own (Q4/Q8 grid) zeros is nonzero."""
    small_zeros = sum(int((t == 0).sum()) for t in smollm2[0].hf_state_dict().values())
    big_zeros = sum(int((t == 0).sum()) for t in tiny.hf_state_dict().values())
    assert big_zeros <= 2 * small_zeros  # the tied small head counts once; the lift holds it twice


@pytest.fixture(scope="module")
def drafter(smollm2):
    # A shared-head drafter made of SmolLM2's first 2 layers (the shipped drafter is an EAGLE-3 one, which
    # models/lift_eagle3.py lifts): it drafts well enough that the lifted pair accepts drafts.
    from sglang_specpilot.drafters import init_shared_drafter

    return init_shared_drafter(smollm2[0], 2)


def test_drafter_lift_1b_heads(smollm2, drafter):
    """The 2-layer drafter with SmolLM2's (tied) embedding, lifted to Llama-3.2-1B's heads: same greedy."""
    tok = smollm2[1]
    big = lift_model(drafter, "tiny-1b", seed=1)
    assert big.cfg.tie_word_embeddings and big.cfg.head_dim == 64 and big.cfg.num_layers == 16
    assert "SmolLM2-135M drafter lifted to" in big.cfg.name
    assert _greedy(big, tok, PROMPTS[:4], 32) == _greedy(drafter, tok, PROMPTS[:4], 32)


def test_lifted_pair_speculates_like_the_small_pair(smollm2, drafter):
    """A lifted target (8B heads) with a lifted drafter (1B heads) in spec mode: the engine takes the pair
    (same vocabulary, same tokenizer) and it runs round for round like the small pair: same tokens, same
    acceptance. The target is SmolLM2's first 6 layers in 8 (a full 30-layer pair costs minutes here)."""
    small, tok = smollm2
    target = small.truncated(6)
    big_target = lift_model(target, {**SHAPES["tiny"], "num_layers": 8}, seed=0)
    big_draft = lift_model(drafter, {**SHAPES["tiny-1b"], "num_layers": 3}, seed=1)
    opts = EngineOptions(
        max_seq_len=256, max_batch_size=4, device="cpu", dtype="float32", cuda_graphs=False, num_speculative_tokens=4
    )
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    prompts = PROMPTS[:4]
    got = Engine(big_target, tok, opts, big_draft).generate(prompts, params, chat=True)
    ref = Engine(target, tok, opts, drafter).generate(prompts, params, chat=True)
    assert [r.token_ids for r in got] == [r.token_ids for r in ref]
    assert [r.mean_accepted for r in got] == [r.mean_accepted for r in ref]
    assert max(r.mean_accepted for r in ref) > 1.0  # drafts were accepted, so the pair really speculated


def test_folder_roundtrip_and_w12(smollm2, drafter, tmp_path):
    """``save_lifted`` writes a sharded bf16 folder that the loader, the engine and ``w12 convert`` accept:
    tensors bit-equal to the in-memory lift, SmolLM2's tokenizer (same ids for the same text), and a
    lossless W12 encoding whose bits per weight are reported."""
    from sglang_specpilot.models.loader import load_model_files
    from w12.convert import convert
    from w12.format import ESCAPE_BITS

    small, tok = smollm2
    out = tmp_path / "lifted"
    cfg = save_lifted(out, drafter, tok, "tiny-1b", seed=1, shard_bytes=100 << 20)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2
    hf = json.loads((out / "config.json").read_text())
    assert hf["_name_or_path"] == cfg.name and "stand-in" in hf["specpilot_lift"]["label"]
    lcfg, sd, ltok = load_model_files(out)
    assert lcfg == cfg
    ref = lift_model(drafter, "tiny-1b", seed=1, max_positions=1024)
    with torch.no_grad():
        for p in ref.parameters():  # the folder's bf16 weights, computed in fp32 like the engine's model
            p.copy_(p.to(torch.bfloat16).float())
    mem = ref.hf_state_dict()
    mem.pop("lm_head.weight", None)
    assert set(sd) == set(mem) and all(torch.equal(sd[n], mem[n].to(torch.bfloat16)) for n in sd)
    assert ltok.fingerprint == tok.fingerprint
    text = "Lifted models keep SmolLM2's ids: héllo wörld 123 <|im_start|>"
    assert ltok.encode(text) == tok.encode(text) and ltok.decode(ltok.encode(text)) == tok.decode(tok.encode(text))
    engine = Engine.from_options(
        EngineOptions(model=str(out), device="cpu", dtype="float32", max_seq_len=128, cuda_graphs=False)
    )
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    assert engine.generate([PROMPTS[0]], params)[0].token_ids == _greedy_raw(ref, tok, PROMPTS[0], 8)

    report = convert(out, tmp_path / "w12")
    w12_cfg, w12_sd, _ = load_model_files(tmp_path / "w12")  # checks every hash, decodes every W12 tensor
    assert w12_cfg == cfg and report.w12_tensors > 0 and all(torch.equal(w12_sd[n], sd[n]) for n in sd)
    # A fifth of this small lift is the embedding, whose SmolLM2 rows carry the Q8_0 grid's exact zeros
    # (1 %; copied into the extra vocab rows), each an 80-bit escape: measured 12.19 bits/weight in all.
    # Apart from those zeros, SmolLM2's and not the lift's, the lift must cost no more than the issue's 12.1
    # (measured 12.01); the 8B composition itself is checked in test_llama31_8b_shapes_and_w12_bits.
    zeros = sum(int((t == 0).sum()) for t in sd.values() if t.dim() == 2)
    zeros_free = (report.w12_bits - ESCAPE_BITS * zeros) / report.w12_weights
    print(
        f"W12, SmolLM2 drafter lifted to tiny 1B heads: {report.bits_per_weight:.4f} bits/weight, "
        f"{zeros_free:.4f} without SmolLM2's zeros"
    )
    assert zeros_free <= 12.1


def _greedy_raw(model, tok, prompt, new):
    opts = EngineOptions(max_seq_len=128, max_batch_size=1, device="cpu", dtype="float32", cuda_graphs=False)
    return Engine(model, tok, opts).generate([prompt], SamplingParams(max_new_tokens=new, ignore_eos=True))[0].token_ids


def test_refuses_shapes_that_cannot_hold_the_model(smollm2):
    small = smollm2[0]
    with pytest.raises(ValueError, match="hidden"):
        plan_lift(small.cfg, {**SHAPES["tiny"], "hidden_size": 512})
    with pytest.raises(ValueError, match="layers"):
        plan_lift(small.cfg, {**SHAPES["llama-3.2-1b"]})  # 30 layers do not fit in 16
