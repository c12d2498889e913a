"""Trees suite (one GPU): tau and tokens/s of AR / chain / best-first tree on the real pair at batch 1, and
the verify step time against the number of verified rows on Llama-3.1-8B / Llama-3.2-1B (synthetic).

Real pair: the embedded SmolLM2-135M-Instruct and its shipped drafter (``drafters/smollm2_drafter``), or the
self-drafter of its first layers while none is shipped (the row names which). tau is replayed on held-out
HumanEval/100-163 (``harness.tau_replay``); tokens/s come from engine.generate on HumanEval/100-103.
A CPU dry run (``--device cpu`` with tiny presets) exercises the bookkeeping; its numbers mean nothing.
"""

from __future__ import annotations

import argparse

import torch

from ..harness.bench import register_suite
from ..harness.timing import times_ms
from .common import median

VERIFY_ROWS = (1, 8, 16, 32, 64)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cuda")
    p.add_argument("--parts", default="real,verify")
    p.add_argument("--model", default=None, help="target (default: the embedded SmolLM2); a preset with --synthetic")
    p.add_argument("--synthetic", action="store_true")
    p.add_argument("--draft", default=None, help="drafter folder (default: shipped drafter, else --draft-layers)")
    p.add_argument("--draft-layers", type=int, default=4)
    p.add_argument("--tau-prompts", default="humaneval:100-163")
    p.add_argument("--speed-prompts", default="humaneval:100-103")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--budget", type=int, default=32, help="tree budget of the tokens/s run")
    p.add_argument("--verify-models", default="llama-3.1-8b,llama-3.2-1b")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--iters", type=int, default=30)


def _times_ms(fn, iters: int, device: str) -> list[float]:
    return times_ms(fn, iters, device.startswith("cuda"))


def _real(args, out) -> None:
    from ..cli import _prompt_set
    from ..config import EngineOptions
    from ..drafters import default_drafter_path
    from ..engine import Engine, SamplingParams
    from ..engine.loading import load_engine_models
    from ..harness.tau_replay import tau_report

    draft = args.draft or (str(default_drafter_path()) if args.model is None and default_drafter_path() else None)
    base = EngineOptions(
        model=args.model,
        synthetic=args.synthetic,
        device=args.device,
        max_batch_size=1,
        max_seq_len=1024,
        draft=draft,
        draft_layers=0 if draft else args.draft_layers,
        graph_batch_sizes=(1,),
    )
    target, drafter, tok, base = load_engine_models(base)
    label = draft or f"self, first {args.draft_layers} layers"
    ar = Engine(target, tok, EngineOptions(**{**base.__dict__, "draft": None, "draft_layers": 0}))
    chat = not args.synthetic

    def encode(spec):
        return [ar.encode(p, chat) for p in _prompt_set(spec, target.cfg.vocab_size)]

    tau = tau_report(ar, drafter, encode(args.tau_prompts), args.new_tokens, args.depth, args.top_k)
    out["rows"].append(
        {
            "case": "real.tau",
            "draft": label,
            "prompts": args.tau_prompts,
            "depth": args.depth,
            "top_k": args.top_k,
            **tau,
        }
    )
    out["metrics"].update({k: tau[k] for k in ("tau_chain", "tau_tree32", "tau_ratio_tree32_chain") if k in tau})
    engines = {
        "ar": ar,
        "chain": Engine(target, tok, EngineOptions(**{**base.__dict__, "num_speculative_tokens": args.depth}), drafter),
        "tree": Engine(
            target,
            tok,
            EngineOptions(
                **{**base.__dict__, "tree_budget": args.budget, "tree_depth": args.depth, "tree_top_k": args.top_k}
            ),
            drafter,
        ),
    }
    speed = encode(args.speed_prompts)
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    ref = None
    for name, eng in engines.items():
        eng.warmup()
        eng.generate([speed[0]], SamplingParams(max_new_tokens=8))
        res = [eng.generate([p], params)[0] for p in speed]
        ids = [r.token_ids for r in res]
        ref = ref or ids
        out["rows"].append(
            {
                "case": f"real.{name}.bs1",
                "draft": label,
                "tokens_per_s": [r.tokens_per_s for r in res],
                "mean_accepted": [r.mean_accepted for r in res],
                "mismatched_prompts_vs_ar": sum(a != b for a, b in zip(ids, ref, strict=True)),
            }
        )
        out["metrics"][f"tok_s_{name}_real"] = round(median([r.tokens_per_s for r in res]), 2)


def _verify(args, out) -> None:
    from tree_verify import ancestor_mask

    from ..engine.runner import ModelRunner
    from ..models.build import build_model
    from ..models.presets import preset_config

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    for name in args.verify_models.split(","):
        cfg = preset_config(name)
        model = build_model(
            cfg,
            device=args.device,
            dtype=dtype,
            synthetic_seed=0,
            max_positions=args.context + 2 * max(VERIFY_ROWS) + 64,
        )
        runner = ModelRunner(
            model,
            1,
            args.context + max(VERIFY_ROWS) + 64,
            cuda_graphs=args.device.startswith("cuda"),
            graph_batch_sizes=(1,),
            scratch_slots=max(64, max(VERIFY_ROWS)),
        )
        seq_len = torch.tensor([args.context], device=args.device)
        g = torch.Generator().manual_seed(0)
        times = {}
        for n in VERIFY_ROWS:
            # A random tree of n rows (parent before child): the mask's shape, not its content, sets the cost.
            # Node i - 1 is block row i; its parent is block row p, node p - 1 (-1: the root).
            parents = torch.tensor([int(torch.randint(0, i, (), generator=g)) - 1 for i in range(1, n)])
            anc = ancestor_mask(parents.long())
            depth = anc.sum(-1) - 1
            anc, depth = anc.to(args.device), depth.to(args.device)
            toks = torch.randint(0, cfg.vocab_size, (1, n), device=args.device)
            ms = _times_ms(
                lambda t=toks, a=anc, d=depth, r=runner, s=seq_len: r.step(t, s, a, d, max_len_hint=args.context),
                args.iters,
                args.device,
            )
            times[n] = median(ms)
            out["rows"].append(
                {"case": f"verify.{name}", "weights": "synthetic", "rows": n, "context": args.context, "step_ms": ms}
            )
        short = {"llama-3.1-8b": "llama8b", "llama-3.2-1b": "llama1b"}.get(name, name.replace("-", "_"))
        for n in VERIFY_ROWS:
            out["metrics"][f"verify_ms_{n}_{short}"] = round(times[n], 3)
        out["metrics"][f"verify_ms_ratio_64_vs_1_{short}"] = round(times[64] / times[1], 3)
        del runner, model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


@register_suite("trees", add_args=_args)
def trees(args: argparse.Namespace) -> dict:
    """tau and tokens/s of AR / chain / tree(N) on the real pair; verify ms vs rows on 8B/1B (synthetic)."""
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("the trees suite needs a CUDA GPU (or --device cpu for a dry run)")
    parts = set(args.parts.split(","))
    out: dict = {"metrics": {}, "rows": []}
    if args.device.startswith("cuda"):
        from ..harness.roofline import measure_peaks

        out["peaks"] = measure_peaks("cuda").to_dict()
    if "verify" in parts:
        _verify(args, out)
    if "real" in parts:
        _real(args, out)
    return out
