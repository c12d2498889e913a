"""Foundation suite (one GPU): the embedded SmolLM2 against Hugging Face generate(), and the engine's
Llama-3.1-8B step against its weight-byte floor, plus chain speculative rounds with a Llama-3.2-1B draft.

8B / 1B numbers use synthetic weights at the published shapes (labelled so in every row).
"""

from __future__ import annotations

import argparse
import time

import torch

from ..harness.bench import register_suite
from .common import cuda_times_ms, decode_state, humaneval_prompts, median, weight_bytes_per_step


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--smollm2", default=None, help="SmolLM2 GGUF path (default: the embedded one)")
    p.add_argument("--parts", default="peaks,smollm2,hf,llama8b", help="comma list of parts to run")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--hf-new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--context", type=int, default=128, help="tokens in the cache for 8B step timing")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--draft-layers", type=int, default=None)


def _smollm2(args, out):
    from ..cli import DEFAULT_DRAFT_LAYERS
    from ..config import EngineOptions
    from ..engine import Engine, SamplingParams
    from ..engine.loading import load_engine_models

    opts = EngineOptions(model=args.smollm2, max_batch_size=8, graph_batch_sizes=(1, 8), max_seq_len=1024,
                         compile=True)
    t0 = time.perf_counter()
    target, _, tok = load_engine_models(opts)
    out["metrics"]["smollm2_load_s"] = round(time.perf_counter() - t0, 2)
    ar = Engine(target, tok, opts)
    t0 = time.perf_counter()
    ar.warmup()
    out["metrics"]["smollm2_ar_warmup_s"] = round(time.perf_counter() - t0, 1)
    prompts = humaneval_prompts(range(100, 104))
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    runs = []
    for _ in range(args.repeats):
        for p in prompts:
            r = ar.generate([p], params)[0]
            runs.append(r.tokens_per_s)
    out["rows"].append({"case": "smollm2.ar.bs1", "new_tokens": args.new_tokens, "prompts": "HumanEval/100-103",
                        "tokens_per_s": runs})
    out["metrics"]["smollm2_ar_tok_s_bs1"] = round(median(runs), 1)

    # Chain speculative decoding with the self-drafter, and the lossless check on the GPU (bf16).
    k = args.draft_layers or DEFAULT_DRAFT_LAYERS
    sopts = EngineOptions(**{**opts.__dict__, "draft_layers": k})
    spec = Engine(target, tok, sopts, target.truncated(k))
    spec.warmup()
    sruns, taus = [], []
    for _ in range(args.repeats):
        for p in prompts:
            r = spec.generate([p], params)[0]
            sruns.append(r.tokens_per_s)
            taus.append(r.mean_accepted)
    out["rows"].append({"case": "smollm2.spec.bs1", "draft": f"self, first {k} layers", "gamma": spec.gamma,
                        "tokens_per_s": sruns, "mean_accepted": taus})
    out["metrics"]["smollm2_spec_tok_s_bs1"] = round(median(sruns), 1)
    out["metrics"]["smollm2_spec_mean_accepted"] = round(median(taus), 3)
    check = humaneval_prompts(range(100, 108))
    p64 = SamplingParams(max_new_tokens=64, ignore_eos=True)
    a = [r.token_ids for r in ar.generate(check, p64)]
    s = [r.token_ids for r in spec.generate(check, p64)]
    mism = []
    for i, (x, y) in enumerate(zip(a, s)):
        if x != y:
            t = next(j for j, (u, v) in enumerate(zip(x, y)) if u != v)
            top2 = ar.teacher_force_logits(ar.encode(check[i]), y)[t].topk(2).values
            mism.append({"prompt": 100 + i, "position": t, "top2_margin": float(top2[0] - top2[1])})
    out["rows"].append({"case": "smollm2.lossless.bs8", "prompts": 8, "new_tokens": 64, "mismatched_prompts": mism})
    out["metrics"]["smollm2_spec_vs_ar_mismatched_prompts"] = len(mism)
    return target, tok, prompts


def _hf(args, out, target, tok, prompts):
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..config import EngineOptions
    from ..engine import Engine, SamplingParams

    cfg = target.cfg
    hf_cfg = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                         intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                         num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                         rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
                         max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True)
    with torch.device("cuda"):
        hf = LlamaForCausalLM(hf_cfg).to(torch.bfloat16).eval()
    missing, unexpected = hf.load_state_dict(target.hf_state_dict(), strict=False)
    assert not [m for m in missing if m != "lm_head.weight"] and not unexpected, (missing, unexpected)
    n = args.hf_new_tokens
    ours = Engine(target, tok, EngineOptions(max_batch_size=8, graph_batch_sizes=(1, 8), max_seq_len=1024,
                                             compile=True))
    ours.warmup()
    params = SamplingParams(max_new_tokens=n, ignore_eos=True)

    def run_hf(p):
        ids = torch.tensor([tok.encode(p)], device="cuda")
        torch.cuda.synchronize()
        t = time.perf_counter()
        gen = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        torch.cuda.synchronize()
        return n / (time.perf_counter() - t), gen[0, ids.shape[1]:].tolist()

    run_hf(prompts[0])  # warm-up
    hf_rates, our_rates, agree = [], [], []
    for p in prompts[:2]:  # ours, HF, HF, ours: side by side in one process
        r1 = ours.generate([p], params)[0]
        h1, hf_ids = run_hf(p)
        h2, _ = run_hf(p)
        r2 = ours.generate([p], params)[0]
        hf_rates += [h1, h2]
        our_rates += [r1.tokens_per_s, r2.tokens_per_s]
        same = next((i for i, (x, y) in enumerate(zip(hf_ids, r1.token_ids)) if x != y), len(hf_ids))
        agree.append(same)
    out["rows"].append({"case": "smollm2.hf_generate.bs1", "new_tokens": n, "hf_tokens_per_s": hf_rates,
                        "ours_tokens_per_s": our_rates, "greedy_tokens_equal_prefix": agree})
    out["metrics"]["hf_generate_tok_s_bs1"] = round(median(hf_rates), 1)
    out["metrics"]["ours_over_hf_generate_bs1"] = round(median(our_rates) / median(hf_rates), 1)
    del hf


def _llama8b(args, out, peaks):
    from ..config import EngineOptions
    from ..engine import Engine
    from ..engine.attn_meta import causal_tree
    from ..engine.loading import load_engine_models
    from ..engine.sampling import BatchSampling, SamplingParams

    opts = EngineOptions(model="llama-3.1-8b", draft="llama-3.2-1b", synthetic=True, max_batch_size=8,
                         graph_batch_sizes=(1, 8), max_seq_len=2048, compile=True, num_speculative_tokens=4)
    target, draft, tok = load_engine_models(opts)
    floor_s = weight_bytes_per_step(target) / (peaks["hbm_TBps"] * 1e12)
    out["metrics"]["llama8b_weight_floor_ms"] = round(floor_s * 1e3, 3)
    ar = Engine(target, tok, EngineOptions(**{**opts.__dict__, "draft": None}))
    spec = Engine(target, tok, opts, draft)
    anc, depth = causal_tree(1, "cuda")
    for B in (1, 8):
        history, seq_len, next_tok = decode_state(ar, B, args.context)
        step = lambda: ar.target_runner.step(next_tok[:, None], seq_len, anc, depth)  # noqa: E731
        ms = cuda_times_ms(step, args.iters)
        out["rows"].append({"case": f"llama8b.ar_step.bs{B}", "weights": "synthetic", "context": args.context,
                            "step_ms": ms, "floor_ms": floor_s * 1e3})
        out["metrics"][f"llama8b_ar_step_over_floor_bs{B}"] = round(median(ms) / (floor_s * 1e3), 3)
        out["metrics"][f"llama8b_ar_step_ms_bs{B}"] = round(median(ms), 3)

        bs = BatchSampling.from_params([SamplingParams()] * B, "cuda")
        hint = args.context
        drafted = {}

        def do_draft():
            drafted["d"] = spec._draft(history, seq_len, next_tok, bs, hint)

        def do_verify():
            d, qs = drafted["d"]
            spec._verify(history, seq_len, next_tok, d, qs, bs, hint)

        do_draft()
        d_ms = cuda_times_ms(do_draft, args.iters)
        v_ms = cuda_times_ms(do_verify, args.iters)
        r_ms = cuda_times_ms(lambda: (do_draft(), do_verify()), args.iters)
        out["rows"].append({"case": f"llama8b.chain_round.bs{B}", "weights": "synthetic", "draft": "llama-3.2-1b",
                            "gamma": 4, "context": args.context, "draft_ms": d_ms, "verify_ms": v_ms, "round_ms": r_ms})
        out["metrics"][f"llama8b_chain_round_ms_bs{B}"] = round(median(r_ms), 3)
        out["metrics"][f"llama8b_chain_draft_ms_bs{B}"] = round(median(d_ms), 3)
        out["metrics"][f"llama8b_chain_verify_ms_bs{B}"] = round(median(v_ms), 3)


@register_suite("foundation", add_args=_args)
def foundation(args: argparse.Namespace) -> dict:
    """SmolLM2 AR tokens/s (vs HF generate), Llama-3.1-8B step over floor, chain rounds (synthetic 8B/1B)."""
    from ..harness.roofline import measure_peaks

    if not torch.cuda.is_available():
        raise SystemExit("the foundation suite needs a CUDA GPU")
    parts = set(args.parts.split(","))
    out = {"metrics": {}, "rows": [], "peaks": {}}
    peaks = measure_peaks("cuda").to_dict()
    out["peaks"] = peaks
    if "smollm2" in parts:
        target, tok, prompts = _smollm2(args, out)
        if "hf" in parts:
            _hf(args, out, target, tok, prompts)
        del target
        torch.cuda.empty_cache()
    if "llama8b" in parts:
        _llama8b(args, out, peaks)
    return out
