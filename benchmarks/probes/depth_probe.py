"""Per-round cost by round shape, SmolLM2-135M shapes (synthetic weights, timing only) with an EAGLE-3
drafter: the captured round's GPU time (parked row, CUDA events) beside the wall time per round of a real
generation (host loop included). Why: in the tune suite on the H100 (9effb20) the real SmolLM2's stock chain
(gamma 4) and tree 32/3/8 took ~2.3 ms a round in generation against 1.7 for tree 32/6/8, while their
rounds do less work. This tells GPU-side from host-side.

    python benchmarks/probes/depth_probe.py --out $OUT/depth_probe.json
"""

from __future__ import annotations

import argparse
import json
import time
from statistics import median

import torch


class _Tok:
    eos_token_ids: list = []

    def decode(self, ids):
        return ""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="depth_probe.json")
    p.add_argument("--configs", default="ar,c4,c6,t3,t6")
    a = p.parse_args()

    from sglang_specpilot.config import EngineOptions
    from sglang_specpilot.drafters.eagle3 import init_eagle3
    from sglang_specpilot.engine import Engine, SamplingParams
    from sglang_specpilot.engine.engine import scratch_slots
    from sglang_specpilot.models.build import build_model
    from sglang_specpilot.models.presets import preset_config
    from sglang_specpilot.suites.rounds import _round_ms, _round_profile

    dev = torch.device("cuda")
    cfg = preset_config("smollm2-135m")
    wide = EngineOptions(tree_budget=64, tree_depth=8, tree_top_k=8, max_seq_len=1024)
    target = build_model(cfg, device=dev, dtype=torch.bfloat16, synthetic_seed=0,
                         max_positions=1024 + scratch_slots(wide))  # fmt: skip
    draft = init_eagle3(target).to(dev, torch.bfloat16)
    confs = {
        "ar": None,
        "c4": {"num_speculative_tokens": 4},
        "c6": {"num_speculative_tokens": 6},
        "t3": {"tree_budget": 32, "tree_depth": 3, "tree_top_k": 8},
        "t6": {"tree_budget": 32, "tree_depth": 6, "tree_top_k": 8},
    }
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (150,), generator=g).tolist()
    rows = []
    for name in a.configs.split(","):
        d = confs[name]
        opts = EngineOptions(max_seq_len=1024, max_batch_size=1, **(d or {}))
        eng = Engine(target, _Tok(), opts, draft if d is not None else None)
        t0 = time.perf_counter()
        eng.warmup(progress=False)
        warm = time.perf_counter() - t0
        gpu = median(_round_ms(eng, 30, 200))
        prof = _round_profile(eng, 200, top=8)
        params = SamplingParams(max_new_tokens=64, ignore_eos=True)
        eng.generate([prompt], params)
        walls = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = eng.generate([prompt], params)[0]
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) * 1e3 / max(r.rounds, 1))
        row = {"config": name, "warmup_s": round(warm, 1), "gpu_round_ms": round(gpu, 3),
               "wall_ms_per_round": round(median(walls), 3), "rounds": r.rounds, "profile": prof}  # fmt: skip
        rows.append(row)
        print(f"{name}: warm {warm:.1f} s, GPU round {gpu:.3f} ms, wall/round {median(walls):.3f} ms "
              f"({r.rounds} rounds), kernels {prof['kernels_per_round']:.0f} ({prof['kernel_us_per_round']:.0f} us)",
              flush=True)  # fmt: skip
        for k in prof["top"][:5]:
            print(f"    {k['count']:5.1f} x {k['us']:8.1f} us  {k['name'][:70]}", flush=True)
        with open(a.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
        del eng


if __name__ == "__main__":
    main()
