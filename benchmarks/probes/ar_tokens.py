"""Greedy AR tokens of the real SmolLM2 with the default options, for comparing kernel paths across processes.

The fused decode kernels (``SPECPILOT_FUSED_ROPE``, ``SPECPILOT_FUSED_NORM``, ``SPECPILOT_FUSED_DECODE``) are
fixed per process, so an A/B of their output runs this twice: once to write the tokens, once with
``--against`` the first file, where every prompt whose tokens differ is judged by token forcing in this
process: the margin between the top two logits of this engine at the first differing position, over the
other run's tokens (a near-tie is what another rounding order may tip; a large margin is a bug).

    SPECPILOT_FUSED_DECODE=0 python benchmarks/probes/ar_tokens.py --model /tmp/smol.gguf --out $OUT/off.json
    python benchmarks/probes/ar_tokens.py --model /tmp/smol.gguf --out $OUT/on.json --against $OUT/off.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", default="100-115", help="HumanEval problem range (never trained on)")
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--out", required=True)
    p.add_argument("--against", default=None, help="another run's --out: judge the prompts whose tokens differ")
    args = p.parse_args(argv)

    from sglang_specpilot.config import EngineOptions
    from sglang_specpilot.engine import Engine, SamplingParams
    from sglang_specpilot.engine.loading import load_engine_models
    from sglang_specpilot.suites.common import humaneval_prompts

    opts = EngineOptions(model=args.model, max_batch_size=1, max_seq_len=2048)
    target, _, tok, opts = load_engine_models(opts)
    eng = Engine(target, tok, opts)
    eng.warmup()
    lo, hi = (int(x) for x in args.prompts.split("-"))
    ids = [eng.encode(q, chat=True) for q in humaneval_prompts(range(lo, hi + 1))]
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    tokens = [eng.generate([q], params)[0].token_ids for q in ids]  # batch 1, as the rounds suite
    env = {k: v for k, v in os.environ.items() if k.startswith("SPECPILOT_FUSED")}
    out = {"env": env, "prompts": args.prompts, "tokens": tokens}
    if args.against:
        other = json.load(open(args.against))
        judged = []
        for prompt, mine, theirs in zip(ids, tokens, other["tokens"], strict=True):
            if mine == theirs:
                continue
            t = next((j for j, (u, v) in enumerate(zip(mine, theirs, strict=False)) if u != v), len(mine))
            top2 = eng.teacher_force_logits(prompt, theirs)[t].float().topk(2).values
            judged.append({"position": t, "margin": round(float(top2[0] - top2[1]), 4)})
        out |= {"against": other["env"], "differing_prompts": len(judged), "first_difference": judged}
        print(f"{len(judged)} of {len(ids)} prompts differ from {other['env']}: {judged}")
    with open(args.out, "w") as f:
        json.dump(out, f)
    print("wrote", args.out, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
