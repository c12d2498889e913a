"""Why the tune suite's SmolLM2 timings drift within a process (H100, 9effb20): a variant's per-prompt time
jumps by ~15-20 ms a 64-token generation after a few blocks and stays there. This times the tune backend's
generations round robin, as ``judge.time_variants`` does, and records beside each one what could switch:
dynamo's compile counters, captured graphs per runner, Python GC pauses, and the engine's own counters.

    python benchmarks/probes/tune_drift_probe.py --model /tmp/smol.gguf --out $OUT/tune_drift.json
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch


def sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--blocks", type=int, default=24)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--out", default="tune_drift.json")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()

    from sglang_specpilot.config import EngineOptions
    from sglang_specpilot.controller.tune_backend import EngineBackend
    from sglang_specpilot.controller.tune_cli import _prompt_ids
    from sglang_specpilot.drafters import default_drafter_path
    from sglang_specpilot.drafters.eagle3 import load_eagle3
    from sglang_specpilot.models.build import build_model
    from sglang_specpilot.models.loader import default_model_path, load_model_files

    cfg, sd, tok = load_model_files(a.model or default_model_path())
    dev = torch.device(a.device)
    target = build_model(
        cfg,
        device=dev,
        dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32,
        state_dict=sd,
        max_positions=1024 + 1024,
    )
    draft = load_eagle3(str(default_drafter_path()), target)
    dt = "bfloat16" if dev.type == "cuda" else "float32"
    dp = str(default_drafter_path())
    stock = EngineOptions(draft=dp, device=a.device, dtype=dt, max_seq_len=1024, max_batch_size=1)
    be = EngineBackend(stock, new_tokens=a.new_tokens, models=(target, draft, tok))
    prompts = _prompt_ids("humaneval:100-107", cfg.vocab_size, tok, chat=True, seed=1)
    variants = {"stock": {}, "t3": {"tree_budget": 32, "tree_depth": 3, "tree_top_k": 8},
                "t6": {"tree_budget": 32, "tree_depth": 6, "tree_top_k": 8}}  # fmt: skip
    runs = {n: be.runner(d, prompts) for n, d in variants.items()}

    gc_s = [0.0]
    t_gc = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            t_gc[0] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - t_gc[0]

    gc.callbacks.append(on_gc)
    from torch._dynamo.utils import counters

    def state(name):
        eng = be.engine(variants[name])
        out = {}
        for r in ("target_runner", "draft_runner"):
            run = getattr(eng, r, None)
            if run is not None:
                out[r] = [len(run._graphs), len(run._prefill_graphs), len(run.prefill_refused)]
        return out

    rows = []
    for _n, f in runs.items():  # warm-up generation each
        f()
    for blk in range(a.blocks):
        for n, f in runs.items():
            c0 = sum(counters["stats"].values())
            g0 = gc_s[0]
            sync(dev)
            t0 = time.perf_counter()
            f()
            sync(dev)
            ms = (time.perf_counter() - t0) * 1e3
            rows.append({"block": blk, "v": n, "ms": round(ms, 2), "gc_ms": round((gc_s[0] - g0) * 1e3, 2),
                         "dynamo_stats": sum(counters["stats"].values()) - c0, "state": state(n)})  # fmt: skip
        print(blk, " ".join(f"{r['v']}={r['ms']:.1f}(gc{r['gc_ms']:.1f},dyn{r['dynamo_stats']})" for r in rows[-3:]),
              flush=True)  # fmt: skip
    doc = {
        "rows": rows,
        "counters": {k: dict(v) for k, v in counters.items()},
        "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
    }
    with open(a.out, "w") as fh:
        json.dump(doc, fh, indent=1, default=str)
    print("state at end:", {n: state(n) for n in variants})


if __name__ == "__main__":
    main()
