"""``specpilot tune``: tune a deployment's engine options; writes DIR/profile.json, report.md and report.html.

    specpilot tune --model M [--draft D] [--prompts SET] [--final-prompts SET] [--budget-minutes T] --out DIR

The tuning prompts default to HumanEval 0-15 (the drafters' training split, never an evaluation set) and the
sealed final's to HumanEval 100-115, which no proposer sees. MT-Bench is an evaluation set and is refused
here. Rerunning the same command on the same DIR resumes a killed run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from ..cli import _add_engine_args, _Formatter

    p = argparse.ArgumentParser(prog="specpilot tune", description=__doc__, formatter_class=_Formatter)
    p.add_argument("--out", required=True, help="folder of the run: state.json, profile.json, report.md/html")
    p.add_argument("--prompts", default="humaneval:0-15", help="tuning prompts (humaneval:A-B, offline[:N], "
                   "synthetic:N); never mtbench")  # fmt: skip
    p.add_argument("--final-prompts", default="humaneval:100-115", help="held-out prompts of the sealed final")
    p.add_argument("--budget-minutes", type=float, default=None, help="stop starting rounds after this long")
    p.add_argument("--rounds", type=int, default=3, help="tuning rounds at most")
    p.add_argument("--candidates", type=int, default=8, help="candidates per round")
    p.add_argument("--blocks", type=int, default=20, help="paired ABBA blocks of a gated comparison (>= 20)")
    p.add_argument("--screen-blocks", type=int, default=6, help="blocks of the successive-halving screen")
    p.add_argument("--new-tokens", type=int, default=64, help="greedy tokens per timed generation")
    p.add_argument("--edits", default=None, help="edit kinds to search, comma list (gamma,tree,tlv,w12,compile,...)")
    p.add_argument("--llm", action="store_true", help="add the LLM proposer (anthropic; needs ANTHROPIC_API_KEY)")
    p.add_argument("--llm-model", default="claude-sonnet-4-5", help="model the LLM proposer asks")
    p.add_argument("--no-cost-model", action="store_true",
                   help="ablation: edits by the most visible gap (tau), not the largest factor")  # fmt: skip
    p.add_argument("--memory", default=None, help="mechanism memory folder (default: the user's data folder)")
    p.add_argument("--no-memory", action="store_true", help="neither start from nor write to the memory")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_engine_args(p, ("model", "draft", "draft_layers", "ngram", "synthetic", "gamma", "device", "dtype",
                         "max_seq_len", "weights", "draft_weights"))  # fmt: skip
    return p


def _prompt_ids(spec: str, engine_vocab: int, tok, chat: bool, seed: int = 0) -> list[list[int]]:
    from ..cli import _prompt_set, check_prompt_set

    check_prompt_set(spec)
    out = []
    for p in _prompt_set(spec, engine_vocab, seed):
        if isinstance(p, str):
            if chat and hasattr(tok, "apply_chat_template"):
                p = tok.apply_chat_template([{"role": "user", "content": p}])
            p = tok.encode(p)
        out.append(list(p))
    return out


def check_sets(tune: str, final: str) -> None:
    """MT-Bench is an evaluation set, and the sealed final must be prompts the tuning never saw."""
    for spec, flag in ((tune, "--prompts"), (final, "--final-prompts")):
        if any(part.partition(":")[0] == "mtbench" for part in spec.split(",")):
            raise ValueError(f"{flag}: mtbench is an evaluation set; tune on humaneval:0-99 or offline, seal on "
                             "held-out humaneval (100-163)")  # fmt: skip
    if set(tune.split(",")) & set(final.split(",")):
        raise ValueError("--final-prompts must differ from --prompts (the sealed final uses unseen prompts)")


def main(argv: list[str] | None = None) -> int:
    from dataclasses import replace

    from ..cli import check_options, engine_options
    from .tune_backend import EngineBackend
    from .tune_loop import TuneConfig, Tuner
    from .tune_profile import write

    args = build_parser().parse_args(argv)
    args.mode = "spec"
    for k, v in {"cuda_graphs": True, "compile": None, "tree_budget": None, "tree_depth": None,
                 "tree_top_k": None, "tlv": False, "tlv_chain_len": 4, "tlv_hang_budget": None,
                 "tlv_root_budget": 0}.items():  # fmt: skip
        setattr(args, k, getattr(args, k, v))
    check_sets(args.prompts, args.final_prompts)
    if args.blocks < 20:
        raise ValueError("--blocks must be >= 20: the 95% interval reaches its coverage from 20 blocks")
    stock = replace(engine_options(args), max_batch_size=1)
    check_options(stock)
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if not args.no_progress else (lambda m: None)
    log(f"specpilot tune: loading {stock.model or 'the embedded SmolLM2-135M-Instruct'}")
    backend = EngineBackend(stock, new_tokens=args.new_tokens, log=log)
    target, _, tok = backend._models[("bf16", "bf16")]
    chat = not args.synthetic
    tp = _prompt_ids(args.prompts, target.cfg.vocab_size, tok, chat)
    fp = _prompt_ids(args.final_prompts, target.cfg.vocab_size, tok, chat, seed=1)  # synthetic: other ids
    llm = None
    if args.llm:
        from .llm_proposer import LLMProposer

        llm = LLMProposer(model=args.llm_model)
    cfg = TuneConfig(
        rounds=args.rounds,
        candidates=args.candidates,
        blocks=args.blocks,
        screen_blocks=args.screen_blocks,
        budget_s=None if args.budget_minutes is None else args.budget_minutes * 60,
        kinds=tuple(args.edits.split(",")) if args.edits else None,
        use_cost_model=not args.no_cost_model,
        progress=not args.no_progress and sys.stderr.isatty(),
        extra={
            "deployment": backend.describe(),
            "prompts": args.prompts,
            "final_prompts": args.final_prompts,
            "new_tokens": args.new_tokens,
        },  # fmt: skip
    )
    seeds = []
    if not args.no_memory:
        from .tune_memory import seeds as memory_seeds

        seeds = memory_seeds(args.memory, backend.stock)
        log(f"memory: {len(seeds)} applicable entries ({', '.join(n for n, _ in seeds) or 'none'})")
    res = Tuner(backend, tp, fp, args.out, cfg, llm=llm, seeds=seeds).run()
    doc = write(args.out, res, backend.describe(), backend.stock)
    Path(args.out, "result.json").write_text(json.dumps(res, indent=1, default=str))
    _report(args.out, res, doc, log)
    if not args.no_memory:
        _remember(args, res, doc, backend, log)
    print(json.dumps({"out": args.out, "delta": doc["delta"], "applied": doc["applied_reason"],
                      "sealed_gain": doc["evidence"]["sealed_final"].get("gain")}))  # fmt: skip
    return 0


def _report(out, res, doc, log) -> None:
    try:
        from .tune_report import write_report
    except ImportError as e:  # the report module is optional only in the sense of its plots
        log(f"report not written: {e}")
        return
    write_report(out, res, doc)


def _remember(args, res, doc, backend, log) -> None:
    try:
        from .tune_memory import remember
    except ImportError as e:
        log(f"memory not written: {e}")
        return
    for path in remember(args.memory, res, doc, backend.stock):
        log(f"memory entry {path}")
