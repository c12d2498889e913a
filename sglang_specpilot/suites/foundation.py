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
    p.add_argument("--parts", default="smollm2,hf,llama8b", help="comma list of parts to run")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--hf-new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--context", type=int, default=128, help="tokens in the cache for 8B step timing")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--draft-layers", type=int, default=None)


def _smollm2(args, out):
    """AR tokens/s at batch 1, self-drafter acceptance, spec tokens/s, spec-vs-AR equality on the GPU."""
    from ..cli import DEFAULT_DRAFT_LAYERS
    from ..config import EngineOptions
    from ..engine import Engine, SamplingParams
    from ..engine.loading import load_engine_models

    opts = EngineOptions(model=args.smollm2, max_batch_size=8, graph_batch_sizes=(1, 8), max_seq_len=1024, compile=True)
    t0 = time.perf_counter()
    target, _, tok, opts = load_engine_models(opts)
    out["metrics"]["smollm2_load_s"] = round(time.perf_counter() - t0, 2)
    ar = Engine(target, tok, opts)
    t0 = time.perf_counter()
    ar.warmup()
    out["metrics"]["smollm2_ar_warmup_s"] = round(time.perf_counter() - t0, 1)
    prompts = humaneval_prompts(range(100, 104))
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    runs = [ar.generate([p], params)[0].tokens_per_s for _ in range(args.repeats) for p in prompts]
    out["rows"].append(
        {"case": "smollm2.ar.bs1", "new_tokens": args.new_tokens, "prompts": "HumanEval/100-103", "tokens_per_s": runs}
    )
    out["metrics"]["smollm2_ar_tok_s_bs1"] = round(median(runs), 1)

    # Acceptance of self-drafters of several depths (eager, batch 8, HumanEval/100-107, 64 tokens).
    check = humaneval_prompts(range(100, 108))
    p64 = SamplingParams(max_new_tokens=64, ignore_eos=True)
    for k in (2, 4, 6, 8, 12, 16):
        o = EngineOptions(**{**opts.__dict__, "draft_layers": k, "cuda_graphs": False, "compile": False})
        taus = [r.mean_accepted for r in Engine(target, tok, o, target.truncated(k)).generate(check, p64)]
        out["rows"].append({"case": "smollm2.self_draft_sweep", "draft_layers": k, "gamma": 4, "mean_accepted": taus})
        out["metrics"][f"smollm2_self_draft{k}_mean_accepted"] = round(median(taus), 3)

    # Chain speculative decoding with a self-drafter and with prompt lookup (the CLI's default): tokens/s at
    # batch 1, acceptance, and equality with AR on the GPU (bf16).
    k = args.draft_layers or DEFAULT_DRAFT_LAYERS
    spec = Engine(target, tok, EngineOptions(**{**opts.__dict__, "draft_layers": k}), target.truncated(k))
    ng = Engine(target, tok, EngineOptions(**{**opts.__dict__, "ngram_size": 3}))
    a = [r.token_ids for r in ar.generate(check, p64)]
    outputs = {}
    for name, eng, draft in (("spec", spec, f"self, first {k} layers"), ("ngram", ng, "prompt lookup, n <= 3")):
        eng.warmup()
        res = [eng.generate([p], params)[0] for _ in range(args.repeats) for p in prompts]
        rates, taus = [r.tokens_per_s for r in res], [r.mean_accepted for r in res]
        out["rows"].append(
            {
                "case": f"smollm2.{name}.bs1",
                "draft": draft,
                "gamma": eng.shape.depth,
                "tokens_per_s": rates,
                "mean_accepted": taus,
            }
        )
        out["metrics"][f"smollm2_{name}_tok_s_bs1"] = round(median(rates), 1)
        out["metrics"][f"smollm2_{name}_mean_accepted"] = round(median(taus), 3)
        outputs[name] = [r.token_ids for r in eng.generate(check, p64)]
        mism = sum(x != y for x, y in zip(a, outputs[name], strict=True))
        out["metrics"][f"smollm2_{name}_vs_ar_mismatched_prompts"] = mism
    s = outputs["spec"]
    # Token forcing (teacher-forced stock target, prefill kernels): stock AR's own graph-decoded tokens
    # against spec's, judged by the harness's rule.
    from ..harness.token_forcing import compare_forcing, token_forcing

    ids = [ar.encode(p) for p in check]
    stock = token_forcing(ar.teacher_force_logits, list(zip(ids, a, strict=True)))
    system = token_forcing(ar.teacher_force_logits, list(zip(ids, s, strict=True)))
    verdict = compare_forcing(system, stock)
    out["rows"].append(
        {
            "case": "smollm2.token_forcing.bs8",
            "prompts": "HumanEval/100-107",
            "new_tokens": 64,
            "stock": stock.to_dict(),
            "spec": system.to_dict(),
            "verdict": verdict.to_dict(),
        }
    )
    out["metrics"]["smollm2_forcing_mismatch_rate_ar"] = round(stock.rate, 5)
    out["metrics"]["smollm2_forcing_mismatch_rate_spec"] = round(system.rate, 5)
    out["metrics"]["smollm2_forcing_large_margin_spec"] = system.large_margin
    out["metrics"]["smollm2_forcing_accepted"] = int(verdict.accepted)
    return ar, prompts


def _hf_model(target):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = target.cfg
    hf_cfg = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
    )
    with torch.device("cuda"):
        hf = LlamaForCausalLM(hf_cfg).to(torch.bfloat16).eval()
    missing, unexpected = hf.load_state_dict(target.hf_state_dict(), strict=False)
    if [m for m in missing if m != "lm_head.weight"] or unexpected:
        raise RuntimeError(f"HF model does not take our weights: missing {missing}, unexpected {unexpected}")
    return hf


def _hf(args, out, ar, prompts):
    """Hugging Face generate() on the same weights and GPU, interleaved with ours (ours, HF, HF, ours)."""
    from ..engine import SamplingParams

    hf = _hf_model(ar.target)
    n = args.hf_new_tokens
    params = SamplingParams(max_new_tokens=n, ignore_eos=True)

    def run_hf(p):
        ids = torch.tensor([ar.encode(p)], device="cuda")
        torch.cuda.synchronize()
        t = time.perf_counter()
        gen = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        torch.cuda.synchronize()
        return n / (time.perf_counter() - t), gen[0, ids.shape[1] :].tolist()

    run_hf(prompts[0])  # warm-up
    hf_rates, our_rates, agree = [], [], []
    for p in prompts[:2]:
        r1 = ar.generate([p], params)[0]
        h1, hf_ids = run_hf(p)
        h2, _ = run_hf(p)
        r2 = ar.generate([p], params)[0]
        hf_rates += [h1, h2]
        our_rates += [r1.tokens_per_s, r2.tokens_per_s]
        pairs = list(zip(hf_ids, r1.token_ids, strict=True))
        agree.append(next((i for i, (x, y) in enumerate(pairs) if x != y), len(pairs)))
    out["rows"].append(
        {
            "case": "smollm2.hf_generate.bs1",
            "new_tokens": n,
            "hf_tokens_per_s": hf_rates,
            "ours_tokens_per_s": our_rates,
            "greedy_tokens_equal_prefix": agree,
        }
    )
    out["metrics"]["hf_generate_tok_s_bs1"] = round(median(hf_rates), 1)
    out["metrics"]["ours_over_hf_generate_bs1"] = round(median(our_rates) / median(hf_rates), 1)


def _time_8b_batch(ar, spec, batch, args, out, floor_ms):
    from ..engine.attn_meta import causal_tree
    from ..engine.sampling import BatchSampling, SamplingParams

    history, seq_len, next_tok = decode_state(ar, batch, args.context)
    anc, depth = causal_tree(1, "cuda")
    ms = cuda_times_ms(lambda: ar.target_runner.step(next_tok[:, None], seq_len, anc, depth), args.iters)
    out["rows"].append(
        {
            "case": f"llama8b.ar_step.bs{batch}",
            "weights": "synthetic",
            "context": args.context,
            "step_ms": ms,
            "floor_ms": floor_ms,
        }
    )
    out["metrics"][f"llama8b_ar_step_over_floor_bs{batch}"] = round(median(ms) / floor_ms, 3)
    out["metrics"][f"llama8b_ar_step_ms_bs{batch}"] = round(median(ms), 3)

    bs = BatchSampling.from_params([SamplingParams()] * batch, "cuda")
    st = spec.state
    st.history[:batch].copy_(history[:, : st.history.shape[1]])
    st.seq_len[:batch], st.next_tok[:batch] = seq_len, next_tok
    st.in_use[:batch] = False  # every replay does the round's work and advances nothing
    # The round is one captured graph (draft, verify, accept, commit): drafting and verification are no
    # longer separately launched, so only the whole round is timed.
    r_ms = cuda_times_ms(lambda: spec.run_round(batch, bs, None), args.iters)
    out["rows"].append(
        {
            "case": f"llama8b.chain_round.bs{batch}",
            "weights": "synthetic",
            "draft": "llama-3.2-1b",
            "gamma": spec.shape.depth,
            "context": args.context,
            "round_ms": r_ms,
        }
    )
    out["metrics"][f"llama8b_chain_round_ms_bs{batch}"] = round(median(r_ms), 3)


def _llama8b(args, out, peaks):
    """Llama-3.1-8B AR step over its weight-byte floor; chain rounds with Llama-3.2-1B (synthetic)."""
    from ..config import EngineOptions
    from ..engine import Engine
    from ..engine.loading import load_engine_models

    opts = EngineOptions(
        model="llama-3.1-8b",
        draft="llama-3.2-1b",
        synthetic=True,
        max_batch_size=8,
        graph_batch_sizes=(1, 8),
        max_seq_len=2048,
        compile=True,
        num_speculative_tokens=4,
    )
    target, draft, tok, opts = load_engine_models(opts)
    floor_ms = weight_bytes_per_step(target) / (peaks["hbm_TBps"] * 1e12) * 1e3
    out["metrics"]["llama8b_weight_floor_ms"] = round(floor_ms, 3)
    ar = Engine(target, tok, EngineOptions(**{**opts.__dict__, "draft": None}))
    spec = Engine(target, tok, opts, draft)
    for batch in (1, 8):
        _time_8b_batch(ar, spec, batch, args, out, floor_ms)


@register_suite("foundation", add_args=_args)
def foundation(args: argparse.Namespace) -> dict:
    """SmolLM2 AR tokens/s (vs HF generate), Llama-3.1-8B step over floor, chain rounds (synthetic 8B/1B)."""
    from ..harness.roofline import measure_peaks

    if not torch.cuda.is_available():
        raise SystemExit("the foundation suite needs a CUDA GPU")
    parts = set(args.parts.split(","))
    out = {"metrics": {}, "rows": [], "peaks": measure_peaks("cuda").to_dict()}
    # The 8B part runs first: timed after the SmolLM2 and HF parts in the same process, its step measured
    # 6.49 ms against 4.78 ms in a fresh process (H200, same commit); the cause is not yet understood.
    if "llama8b" in parts:
        _llama8b(args, out, out["peaks"])
        torch.cuda.empty_cache()
    if "smollm2" in parts:
        ar, prompts = _smollm2(args, out)
        if "hf" in parts:
            _hf(args, out, ar, prompts)
    return out
