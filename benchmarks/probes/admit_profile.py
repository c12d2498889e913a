"""Where a prompt's admission costs go in the batched server (GPU): the plain round, the carrying round
(the round with riders' prefill in its verify pass), the packed separate prefill and the padded one, each
timed (CUDA events, median) and profiled (CUPTI kernels, summed by name).

On an H100 (lifted 8B, 47ae92f, bucket 16) the warm-up measured the carrying round at 29-39 ms and the
packed prefill of one 64-token prompt at 26 ms, against 9.5 ms for the plain round and a ~6 ms weight
stream: the closed loop spent 1.73 s of 4.14 s in admission. This says which kernels hold that time.

    python benchmarks/probes/admit_profile.py -- <bench batched arguments>

Prints a table per region; JSON to $OUT/admit_profile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def kernels(fn) -> tuple[float, list[tuple[str, int, float]]]:
    """One call of ``fn`` under CUPTI: (GPU busy µs, [(kernel name, calls, total µs)] by total)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    by = defaultdict(lambda: [0, 0.0])
    busy = 0.0
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.device_time > 0:
            by[e.name[:90]][0] += 1
            by[e.name[:90]][1] += e.device_time
            busy += e.device_time
    rows = sorted(((k, n, t) for k, (n, t) in by.items()), key=lambda r: -r[2])
    return busy, rows


def main() -> None:
    from sglang_specpilot.engine.packed_prefill import packed_prefill, worth_packing
    from sglang_specpilot.harness.timing import cuda_times_ms
    from sglang_specpilot.suites.batched import _args, _Run

    argv = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else sys.argv[1:]
    p = argparse.ArgumentParser()
    _args(p)
    p.add_argument("--results-dir", default=os.environ.get("OUT"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("admit_profile: needs CUDA (captured rounds, CUDA events, CUPTI)")
    run = _Run(args)
    run.load()
    eng = run.engine("specpilot_batched")
    b = max(run.concurrency)
    scratch = eng.options.max_seq_len
    regions = {"round (default kind)": lambda: eng.captured.replay(b)} if b in eng.captured else {}
    for key, cap in eng.kinds_captured.items():
        if b in cap:
            regions[f"round {key}"] = lambda cap=cap: cap.replay(b)
    for key in sorted(eng.carrying._graphs, key=str) if eng.carrying is not None else []:
        regions[f"carry {key}"] = lambda key=key: eng.carrying.replay(key, [], [])
    for w in (64, 128, 256):
        lens = [w] + [0] * (b - 1)
        if worth_packing(eng, lens):
            regions[f"packed 1x{w} at {b}"] = lambda lens=lens: packed_prefill(eng, lens, scratch)
        regions[f"padded {b}x{w}"] = lambda w=w: eng._prefill_probe(b, w)
        regions[f"padded 1x{w}"] = lambda w=w: eng._prefill_probe(1, w)
    out = {}
    with torch.inference_mode():
        for name, fn in regions.items():
            ms = sorted(cuda_times_ms(fn, 7, warmup=2))[3]
            busy, rows = kernels(fn)
            out[name] = {"ms": ms, "gpu_busy_ms": busy / 1e3, "kernels": rows[:25]}
            print(f"\n== {name}: {ms:.2f} ms, GPU busy {busy / 1e3:.2f} ms, {sum(r[1] for r in rows)} kernels")
            for k, n, t in rows[:12]:
                print(f"   {t / 1e3:8.3f} ms  {n:5d}x  {k}")
    path = Path(os.environ.get("OUT", ".")) / "admit_profile.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
