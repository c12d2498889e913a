"""Where AR ``generate`` spends its time at batch 1 (GPU): the captured round's GPU time, then the wall time
from ``generate()`` to N tokens for several N. The intercept at N = 1 is the prompt's time to the first
token (prefill and its one read-back); the slope is the time a token costs in the loop.

    python benchmarks/probes/prefill_probe.py [--model smollm2-135m] [--results-dir DIR]

Synthetic weights of a preset (timing only): the prompts are random token ids, ``ignore_eos`` holds the
length. Writes ``prefill_probe.json`` (seconds per N, medians over the prompts) and, with ``--profile``,
prints the host functions that one 256-token generation spends its time in (cProfile).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from statistics import median

import torch

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.loading import load_engine_models
from sglang_specpilot.suites.rounds import _round_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m", help="a preset name (synthetic weights)")
    ap.add_argument("--results-dir", default=os.environ.get("OUT"))
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one 256-token generation")
    args = ap.parse_args()
    opts = EngineOptions(model=args.model, synthetic=True, max_batch_size=1, max_seq_len=2048)
    target, _, tok, opts = load_engine_models(opts)
    eng = Engine(target, tok, opts)
    from sglang_specpilot.harness.bench import provenance

    command = "python benchmarks/probes/prefill_probe.py " + " ".join(sys.argv[1:])
    out = {"suite": "prefill_probe", **provenance(), "command": command}
    out.update({"model": args.model, "warmup_s": eng.warmup()})
    out["round_ms"] = median(_round_ms(eng, 30, 200))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (140 + 7 * i,), generator=g).tolist() for i in range(6)]
    for n in (1, 16, 64, 128, 256):
        params = SamplingParams(max_new_tokens=n, ignore_eos=True)
        ts = []
        for p in prompts:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            eng.generate([p], params)
            ts.append(time.perf_counter() - t0)
        out[f"gen_s_{n}"] = median(ts)
    if args.profile:
        pr = cProfile.Profile()
        pr.enable()
        eng.generate([prompts[0]], SamplingParams(max_new_tokens=256, ignore_eos=True))
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
        print(s.getvalue())
    if args.results_dir:
        os.makedirs(args.results_dir, exist_ok=True)
        with open(os.path.join(args.results_dir, "prefill_probe.json"), "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
