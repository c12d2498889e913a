"""Where the server's closed-loop time goes at N clients: ``bench batched`` with the scheduler's two calls
into the engine timed on the host.

At 16 clients (H100, lifted 8B, 4 requests a client, dc8fd0d) the mechanisms served 0.81x AR's tokens/s
while their rows accepted 2.89 tokens a round and the captured narrowed round replays in 9.6 ms against
AR's 6.4 (its step curve): 250 rounds in 5.0 s is 20 ms a round. This splits the wall into
``RowBatch.step`` (a round launched, the one before it read back) by the kind it launched and whether it
carried prompts, and ``RowBatch.admit`` (separate prefills: their one sync), and counts the rows each round
ran for, so the lost time can be told apart: longer rounds, prefills, rows left idle, or the host.

    python benchmarks/probes/serve_loop_probe.py -- <bench batched arguments>

Prints a table per system; JSON to $OUT/serve_loop_probe.json.
"""

import json
import os
import statistics
import sys
import time
from collections import defaultdict

from sglang_specpilot.engine import rows as rows_mod

LOG: list[dict] = []
_step, _admit, _launch = rows_mod.RowBatch.step, rows_mod.RowBatch.admit, rows_mod.RowBatch._launch


def launch(self):
    inflight = _launch(self)
    self._probe_launch = {"kind": str(inflight.kind), "rows": sum(r is not None for r in inflight.rows),
                          "riders": len(inflight.admitted or [])}  # fmt: skip
    return inflight


def step(self):
    t0 = time.perf_counter()
    self._probe_launch = {"kind": "none", "rows": 0, "riders": 0}
    out = _step(self)
    LOG.append({"what": "step", "s": time.perf_counter() - t0, "t": t0, **self._probe_launch,
                "emitted": sum(len(e.token_ids) for e in out)})  # fmt: skip
    return out


def admit(self, reqs):
    t0 = time.perf_counter()
    out = _admit(self, reqs)
    LOG.append({"what": "admit", "s": time.perf_counter() - t0, "t": t0, "n": len(reqs)})
    return out


def summarize(log: list[dict]) -> dict:
    steps = [e for e in log if e["what"] == "step"]
    admits = [e for e in log if e["what"] == "admit"]
    wall = (log[-1]["t"] + log[-1]["s"] - log[0]["t"]) if log else 0.0
    by_kind = defaultdict(list)
    for e in steps:
        by_kind[e["kind"] + (" +riders" if e["riders"] else "")].append(e)
    kinds = {
        k: {"n": len(v), "sum_s": sum(e["s"] for e in v), "median_ms": 1e3 * statistics.median(e["s"] for e in v),
            "rows_mean": statistics.mean(e["rows"] for e in v)}
        for k, v in by_kind.items()
    }  # fmt: skip
    return {
        "wall_s": wall,
        "step_s": sum(e["s"] for e in steps),
        "admit_s": sum(e["s"] for e in admits),
        "admits": len(admits),
        "admitted": sum(e["n"] for e in admits),
        "other_s": wall - sum(e["s"] for e in log),
        "rounds": len(steps),
        "rows_per_round": statistics.mean(e["rows"] for e in steps) if steps else 0.0,
        "by_kind": kinds,
    }


def main() -> None:
    rows_mod.RowBatch.step, rows_mod.RowBatch.admit, rows_mod.RowBatch._launch = step, admit, launch
    argv = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else []
    from sglang_specpilot.suites import batched as batched_mod

    parts: dict[str, dict] = {}
    marks: list[int] = []
    _part, _decisions = batched_mod._Run.part, batched_mod._decisions

    def decisions(eng):  # called just before and just after the timed pass: mark where it is in the log
        marks.append(len(LOG))
        return _decisions(eng)

    def part(self, system, n, prompts, ar_ids):
        _part(self, system, n, prompts, ar_ids)
        parts[f"{system} N={n}"] = summarize(LOG[marks[-2] : marks[-1]])

    batched_mod._decisions = decisions
    batched_mod._Run.part = part
    from sglang_specpilot.cli import main as cli_main

    cli_main(["bench", "batched", *argv])
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "serve_loop_probe.json"), "w") as f:
        json.dump(parts, f, indent=1)
    for name, s in parts.items():
        print(f"{name}: wall {s['wall_s']:.2f} s = step {s['step_s']:.2f} + admit {s['admit_s']:.2f} "
              f"({s['admits']} calls, {s['admitted']} requests) + other {s['other_s']:.2f}; "
              f"{s['rounds']} rounds, {s['rows_per_round']:.1f} rows a round")  # fmt: skip
        for k, v in sorted(s["by_kind"].items(), key=lambda kv: -kv[1]["sum_s"]):
            print(f"   {k:22} n {v['n']:5}  sum {v['sum_s']:6.2f} s  median {v['median_ms']:6.2f} ms  "
                  f"rows {v['rows_mean']:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
