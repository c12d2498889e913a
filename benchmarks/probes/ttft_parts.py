"""Where the time to first token went, request by request, in a batched-suite results file.

The suite keeps each request's arrival on the run's clock (``submit_s``) and its time to first token in two
parts stamped by the engine (``batched_clients._ttft_parts``): waiting to be admitted (``admit_wait_s``) and
admission to the first token on the host (``prefill_s``: the prefill, and whatever it waited for on the
device), plus how many prompts that prefill held and whether it overtook the rounds in flight. What is left
(``ttft_s`` minus both) is the event's way back to the client.

Why: at af7b241 (H100, lifted 8B, 16 clients, batched_h100.json) the mechanisms' steady TTFT p50 was 22.7 ms
against AR's 18.5, with two gaps in the sorted times: a floor ~3 ms above AR's (20-21 against 16.5-17.5 ms)
and 13 of 48 requests at 31-39 ms (AR's slowest steady ones: 22.5-23.8). Prompts that arrive together
("together": within ``--together-ms`` of another) are one suspect for the second; this tells.

    python benchmarks/probes/ttft_parts.py RESULTS.json [--n 16] [--together-ms 2]

Prints a table per system at that N; JSON to $OUT/ttft_parts.json where $OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path


def _p50(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def parts(requests: list[dict], n: int, together_s: float) -> dict:
    """Summary of one (system, N) cell's steady requests (each client's after its first)."""
    done = [r for r in requests if r.get("error") is None and r.get("ttft_s") is not None]
    steady = [r for r in done if r.get("prompt", 0) >= n]
    arrivals = sorted(r["submit_s"] for r in done if r.get("submit_s") is not None)
    out: dict = {"steady": len(steady)}
    if not steady:
        return out
    stamped = [r for r in steady if r.get("prefill_s") is not None]

    def together(r) -> bool:  # another request arrived within the window of this one
        t = r.get("submit_s")
        return t is not None and sum(abs(t - a) <= together_s for a in arrivals) > 1

    def row(rs: list[dict]) -> dict:
        st = [r for r in rs if r.get("prefill_s") is not None]
        return {
            "requests": len(rs),
            "ttft_p50_ms": _ms(_p50([r["ttft_s"] for r in rs])),
            "admit_wait_p50_ms": _ms(_p50([r["admit_wait_s"] for r in st])),
            "prefill_p50_ms": _ms(_p50([r["prefill_s"] for r in st])),
            "rest_p50_ms": _ms(_p50([r["ttft_s"] - r["admit_wait_s"] - r["prefill_s"] for r in st])),
            "shared_prefill": sum((r.get("prefill_group") or 0) > 1 for r in rs),
            "overtook": sum(bool(r.get("overtook")) for r in rs),
        }

    out["all"] = row(steady)
    out["together"] = row([r for r in steady if together(r)])
    out["alone"] = row([r for r in steady if not together(r)])
    out["unstamped"] = len(steady) - len(stamped)
    out["sorted_ttft_ms"] = sorted(round(r["ttft_s"] * 1e3, 1) for r in steady)
    return out


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1e3, 2)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path)
    p.add_argument("--n", type=int, default=16, help="the concurrency to look at")
    p.add_argument("--together-ms", type=float, default=2.0, help="arrivals this close count as together")
    a = p.parse_args(argv)
    doc = json.loads(a.results.read_text())
    rows = [r for r in doc.get("rows", []) if r.get("case") == "requests" and r.get("concurrency") == a.n]
    if not rows:
        raise SystemExit(f"{a.results}: no per-request rows at N = {a.n}")
    report = {r["system"]: parts(r["requests"], a.n, a.together_ms / 1e3) for r in rows}
    cols = ("requests", "ttft_p50_ms", "admit_wait_p50_ms", "prefill_p50_ms", "rest_p50_ms", "shared_prefill")
    print(f"N = {a.n}, steady requests; 'together': arrived within {a.together_ms} ms of another")
    print(f"{'system':<20} {'group':<9} " + " ".join(f"{c:>17}" for c in cols))
    for system, rep in report.items():
        for group in ("all", "together", "alone"):
            if group in rep:
                print(f"{system:<20} {group:<9} " + " ".join(f"{rep[group][c]!s:>17}" for c in cols))
        if "sorted_ttft_ms" in rep:
            print(f"{'':<20} sorted ms: {rep['sorted_ttft_ms']}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "ttft_parts.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    sys.exit(main() and 0)
