"""The ``specpilot`` command."""

from __future__ import annotations

import argparse
import json
import sys
import time

# Drafting in spec mode without --draft, until a trained drafter ships. Prompt lookup (n-grams up to 3):
# median 1.58 tokens per round on HumanEval/100-107 (64 greedy tokens, gamma 4, SmolLM2, CPU; acceptance
# does not depend on the hardware), and it costs no model. The self-drafter (the target's first layers +
# its head, --draft-layers K) measured 1.06 / 1.05 / 1.08 / 1.03 / 1.11 / 1.14 for K = 2 / 4 / 6 / 8 / 12
# / 16 on the H200 on the same prompts. See README "Default drafter".
DEFAULT_NGRAM = 3
DEFAULT_DRAFT_LAYERS = 4  # the cheapest self-drafter with the acceptance of 8 layers


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="GGUF file, safetensors folder, or preset (with --synthetic); default: the embedded SmolLM2-135M-Instruct",
    )
    p.add_argument(
        "--draft",
        default=None,
        help="draft model (same forms as --model); default in spec mode: prompt lookup (--ngram)",
    )
    p.add_argument("--draft-layers", type=int, default=None,
                   help="draft with the target's first K layers and its head instead of prompt lookup")
    p.add_argument("--ngram", type=int, default=DEFAULT_NGRAM, help="prompt-lookup n-gram size (spec mode, "
                   "no --draft / --draft-layers)")
    p.add_argument("--synthetic", action="store_true", help="presets with synthetic weights (timing only)")
    p.add_argument("--mode", choices=["ar", "spec"], default="spec")
    p.add_argument("--gamma", type=int, default=4, help="draft tokens per speculative round")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-seq-len", type=int, default=None, help="KV capacity; default: the model's context, "
                   "at most 4096")
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile the captured steps (GPU)")
    p.add_argument("--weights", choices=["bf16", "w12"], default="bf16", help="target weights")
    p.add_argument("--draft-weights", choices=["bf16", "w12"], default="bf16", help="standalone draft weights")


def engine_options(args: argparse.Namespace):
    from .config import EngineOptions

    draft_layers = ngram = 0
    if args.mode == "spec" and args.draft is None:
        if args.draft_layers:
            draft_layers = args.draft_layers
        else:
            ngram = args.ngram
    return EngineOptions(
        ngram_size=ngram,
        model=args.model,
        draft=args.draft if args.mode == "spec" else None,
        draft_layers=draft_layers,
        synthetic=args.synthetic,
        num_speculative_tokens=args.gamma,
        device=args.device,
        dtype=args.dtype,
        max_seq_len=args.max_seq_len,
        max_batch_size=1,
        cuda_graphs=not args.no_cuda_graphs,
        compile=args.compile,
        weights=args.weights,
        draft_weights=args.draft_weights,
    )


def cmd_generate(args: argparse.Namespace) -> int:
    from .engine import Engine, SamplingParams

    t0 = time.perf_counter()
    engine = Engine.from_options(engine_options(args))
    load_s = time.perf_counter() - t0
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop or [],
        ignore_eos=args.ignore_eos,
    )
    chat = not args.no_chat and hasattr(engine.tokenizer, "apply_chat_template") and not args.synthetic
    res = None
    for ev in engine.stream([args.prompt], params, chat=chat):
        if not args.json:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        res = ev.result or res
    out = {
        "text": res.text,
        "token_ids": res.token_ids,
        "tokens_per_s": round(res.tokens_per_s, 2),
        "mean_accepted": round(res.mean_accepted, 3),
        "finish_reason": res.finish_reason,
        "prompt_tokens": res.prompt_tokens,
        "mode": args.mode,
        "device": str(engine.device),
        "load_s": round(load_s, 2),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"\n\n[{len(res.token_ids)} tokens, {res.tokens_per_s:.1f} tokens/s, "
            f"mean accepted {res.mean_accepted:.2f} tokens/step, {args.mode}, {engine.device}]"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specpilot", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate text for one prompt")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--no-chat", action="store_true", help="send the prompt raw, without the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    _add_engine_args(g)
    sub.add_parser("bench", help="run a benchmark suite (specpilot bench SUITE --help)", add_help=False)
    sub.add_parser("w12", help="W12 checkpoints: convert SRC DST [--verify] | verify DST", add_help=False)
    sub.add_parser("sglang-hook", help="SGLang 0.5 start-up hook: install | uninstall | status", add_help=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from .harness.bench import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["w12"]:
        from w12.cli import main as w12_main

        return w12_main(argv[1:])
    if argv[:1] == ["sglang-hook"]:
        from .sglang_plugin.hook_install import main as hook_main

        return hook_main(argv[1:])
    args = parser.parse_args(argv)
    try:
        return cmd_generate(args)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"specpilot: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
