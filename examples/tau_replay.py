"""Replay tau (tokens emitted per round) of the shipped SmolLM2 drafter: chain, best-first trees of a few
budgets, and top-k oracles, against the target's own greedy output. What `specpilot tau` reports.

    python examples/tau_replay.py --new-tokens 32
"""

import argparse
import json
from dataclasses import replace

import torch

from sglang_specpilot import EngineOptions
from sglang_specpilot.drafters import default_drafter_path
from sglang_specpilot.engine import Engine
from sglang_specpilot.engine.loading import load_engine_models
from sglang_specpilot.harness.tau_replay import tau_report

PROMPTS = [
    "def is_palindrome(s: str) -> bool:\n",
    "Write a short poem about the sea.",
    "Explain what a hash map is in two sentences.",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--new-tokens", type=int, default=32, help="greedy tokens replayed per prompt")
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the built-in prompts")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--top-k", type=int, default=4)
    args = p.parse_args()

    options = EngineOptions(device="cpu", draft=str(default_drafter_path()), max_batch_size=1)
    target, draft, tokenizer, options = load_engine_models(options)
    ar = Engine(target, tokenizer, replace(options, draft=None))  # the target alone: its greedy output
    prompts = [ar.encode(text, chat=True) for text in PROMPTS[: args.prompts]]
    with torch.inference_mode():
        report = tau_report(ar, draft, prompts, args.new_tokens, args.depth, args.top_k, budgets=(4, 8))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
