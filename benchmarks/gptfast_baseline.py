"""gpt-fast's AR decode step on Llama-3.1-8B shapes (synthetic weights), the baseline our AR round is
compared with in the rounds suite.

gpt-fast (pytorch-labs/gpt-fast) is not part of this project: pass the folder holding its ``model.py``
(a checkout, never committed here) with ``--gptfast-dir``. This script only builds its ``Transformer``
with random bf16 weights, fills its KV cache to the same length as our run, and times its decode step
the way its ``generate.py`` runs it: ``torch.compile(mode="reduce-overhead", fullgraph=True)`` of one
forward at ``input_pos`` plus the argmax, CUDA events over repeats, after warm-up.

``measure_gptfast(dir, context)`` returns per-step milliseconds. The rounds suite runs this script as a
subprocess between two timings of its own AR round, back to back in one call: in its own process at
6e058fb, gpt-fast's reduce-overhead step was followed twice by "CUDA error: unspecified launch failure"
when our captured round was timed again (benchmarks/device/README.md), and a process of its own keeps the
two CUDA-graph pools and compile caches apart.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch


def _load(dir_: str):
    path = Path(dir_) / "model.py"
    if not path.exists():
        raise FileNotFoundError(f"no gpt-fast model.py under {dir_}")
    spec = importlib.util.spec_from_file_location("gptfast_model", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gptfast_model"] = mod
    spec.loader.exec_module(mod)
    return mod


@torch.no_grad()
def measure_gptfast(dir_: str, context: int = 1024, iters: int = 50, name: str = "llama-3.1-8b") -> dict:
    mod = _load(dir_)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = mod.Transformer.from_name(name)
        for p in model.parameters():
            p.data.normal_(0, 0.02)
        model = model.to(torch.bfloat16).eval()
        model.setup_caches(max_batch_size=1, max_seq_length=context + 256)
    model = model.to("cuda")
    # Fill the cache as a prompt of ``context`` tokens would (one prefill forward, eager).
    prompt = torch.randint(0, 1000, (1, context), device="cuda")
    model(prompt, torch.arange(context, device="cuda"))

    def step(x, input_pos):
        return model(x, input_pos).argmax(-1)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    x = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.tensor([context], device="cuda")
    for _ in range(5):
        compiled(x, pos)
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        compiled(x, pos)
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return {"step_ms": ms, "median_ms": statistics.median(ms), "context": context, "model": name}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gptfast-dir", required=True)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json-out", default=None, help="write every step time here (the rounds suite reads it)")
    args = ap.parse_args()
    res = measure_gptfast(args.gptfast_dir, args.context, args.iters)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res))
    print(json.dumps({k: v for k, v in res.items() if k != "step_ms"}))
