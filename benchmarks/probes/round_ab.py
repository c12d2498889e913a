"""A/B of captured rounds across environment settings: round_profile.py in separate processes (the settings are
read at import, and baked into compiled blocks and captured graphs), the variants alternated, ``--reps`` runs
each; one JSON with every run's round times and the median of the runs' medians per variant and system.

    python benchmarks/probes/round_ab.py --variant on:SPECPILOT_ROUND_KERNELS=1 \
        --variant off:SPECPILOT_ROUND_KERNELS=0 --systems ar,chain6,tree32d6 --out $OUT/round_kernels_ab.json \
        -- --target smollm2 --model /tmp/smol.gguf

Arguments after ``--`` go to round_profile.py as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PROFILE = Path(__file__).with_name("round_profile.py")
KEEP = ("round_ms_median", "kernels", "kernel_us", "by_category_us", "round_ms")


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``name:VAR=value,VAR=value`` -> (name, environment). A comma starts a new assignment only before an
    upper-case ``VAR=``, so a value may hold commas (``SPECPILOT_ATTENTION_TUNING=tree_d64=64,64,128,...``)."""
    name, _, assigns = text.partition(":")
    env = dict(a.split("=", 1) for a in re.split(r",(?=[A-Z_][A-Z0-9_]*=)", assigns) if a)
    if not name or not env:
        raise argparse.ArgumentTypeError(f"a variant is name:VAR=value[,VAR=value], got {text!r}")
    return name, env


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", action="append", type=parse_variant, required=True)
    p.add_argument("--systems", required=True)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--timeout", type=int, default=240, help="seconds one round_profile run may take")
    p.add_argument("--out", required=True)
    a = p.parse_args(own)
    runs: dict[str, dict[str, list]] = {}
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.reps):
            for name, env in a.variant:
                path = Path(tmp) / f"{name}_{rep}.json"
                cmd = [sys.executable, str(PROFILE), "--systems", a.systems, "--out", str(path), *rest]
                res = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=a.timeout)
                if res.returncode != 0 or not path.exists():
                    failures.append({"variant": name, "rep": rep, "tail": (res.stdout + res.stderr)[-2000:]})
                    print(f"{name} run {rep}: failed\n{(res.stdout + res.stderr)[-1500:]}")
                    continue
                print(f"{name} run {rep}: {res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ''}")
                for system, r in json.loads(path.read_text())["systems"].items():
                    runs.setdefault(name, {}).setdefault(system, []).append({k: r[k] for k in KEEP})
    from sglang_specpilot.harness.bench import provenance

    out = {
        "suite": "round_ab",
        **provenance(),
        "command": "python benchmarks/probes/round_ab.py " + " ".join(argv),
        "variants": {name: env for name, env in a.variant},
        "runs": runs,
        "failures": failures,
        "median_round_ms": {
            v: {s: statistics.median(x["round_ms_median"] for x in rs) for s, rs in sys_runs.items()}
            for v, sys_runs in runs.items()
        },
        "kernels": {v: {s: rs[0]["kernels"] for s, rs in sys_runs.items()} for v, sys_runs in runs.items()},
    }
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"median_round_ms": out["median_round_ms"], "kernels": out["kernels"]}))


if __name__ == "__main__":
    main()
