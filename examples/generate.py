"""Generate with the embedded SmolLM2 three ways (AR, chain speculation, best-first trees) and check that
greedy output is the same token for token.

    python examples/generate.py --prompt "Write a haiku about GPUs." --max-new-tokens 32
"""

import argparse

from sglang_specpilot import EngineOptions
from sglang_specpilot.drafters import default_drafter_path
from sglang_specpilot.engine import Engine, SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt", default="Write a Python function that reverses a string.")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--device", default="auto")
    args = p.parse_args()

    modes = {
        "ar": EngineOptions(device=args.device),  # no drafter: plain autoregressive decoding
        "chain": EngineOptions(device=args.device, ngram_size=3),  # prompt-lookup drafts, gamma 4
        # Best-first trees drafted by the shipped trained drafter: 8 nodes verified per round.
        "tree": EngineOptions(device=args.device, draft=str(default_drafter_path()), tree_budget=8, tree_top_k=2),
    }
    params = SamplingParams(max_new_tokens=args.max_new_tokens)  # temperature 0: greedy
    outputs = {}
    for name, options in modes.items():
        engine = Engine.from_options(options)
        result = engine.generate(args.prompt, params, chat=True)[0]
        outputs[name] = result.token_ids
        print(f"--- {name}: {result.tokens_per_s:.1f} tokens/s, {result.mean_accepted:.2f} tokens per step")
        print(result.text)
    same = outputs["ar"] == outputs["chain"] == outputs["tree"]
    print(f"--- greedy output identical across modes: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
