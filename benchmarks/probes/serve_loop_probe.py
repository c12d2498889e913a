"""Where the server's closed-loop time goes at N clients: ``bench batched`` with the scheduler's two calls
into the engine timed on the host.

At 16 clients (H100, lifted 8B, 4 requests a client, dc8fd0d) the mechanisms served 0.81x AR's tokens/s
while their rows accepted 2.89 tokens a round and the captured narrowed round replays in 9.6 ms against
AR's 6.4 (its step curve): 250 rounds in 5.0 s is 20 ms a round. This splits the wall into
``RowBatch.step`` (a round launched, the one before it read back) by the kind it launched and whether it
carried prompts, and ``RowBatch.admit`` (separate prefills: their one sync), and counts the rows each round
ran for, so the lost time can be told apart: longer rounds, prefills, rows left idle, or the host. An admission's
host time includes waiting for the round in flight (its first tokens are the prefill's one sync), so each
``Engine.prefill_rows`` is also timed on the stream (CUDA events) by its path: packed in a captured graph,
packed eagerly, or padded over the bucket's rows.

    python benchmarks/probes/serve_loop_probe.py -- <bench batched arguments>

Prints a table per system; JSON to $OUT/serve_loop_probe.json.
"""

import json
import os
import statistics
import sys
import time
from collections import defaultdict

import torch

from sglang_specpilot.engine import engine as engine_mod
from sglang_specpilot.engine import rows as rows_mod

LOG: list[dict] = []
_step, _admit, _launch = rows_mod.RowBatch.step, rows_mod.RowBatch.admit, rows_mod.RowBatch._launch
_prefill_rows = engine_mod.Engine.prefill_rows


def launch(self):
    inflight = _launch(self)
    self._probe_launch = {"kind": str(inflight.kind), "rows": sum(r is not None for r in inflight.rows),
                          "riders": len(inflight.admitted or [])}  # fmt: skip
    return inflight


def step(self, between=None):
    """A step's wall, less the admissions the scheduler ran inside it (``between``: overtaking prefills)."""
    t0 = time.perf_counter()
    self._probe_launch = {"kind": "none", "rows": 0, "riders": 0}
    self._probe_inner = 0.0
    out = _step(self, between=between)
    LOG.append({"what": "step", "s": time.perf_counter() - t0 - self._probe_inner, "t": t0, **self._probe_launch,
                "emitted": sum(len(e.token_ids) for e in out)})  # fmt: skip
    return out


def admit(self, reqs):
    t0 = time.perf_counter()
    out = _admit(self, reqs)
    s = time.perf_counter() - t0
    self._probe_inner = getattr(self, "_probe_inner", 0.0) + s
    LOG.append({"what": "admit", "s": s, "t": t0, "n": len(reqs)})
    return out


def prefill_rows(self, history, lens):
    """``Engine.prefill_rows`` with its path (packed in a graph, packed eager, a wave in width tiers, padded)
    and its stream time (CUDA events around it: the prefill's GPU work plus any launch gaps, not the
    in-flight round before it)."""
    from sglang_specpilot.engine.packed_prefill import worth_packing, worth_tiering

    new = [n for n in lens if n > 0]
    path = "padded"
    packs = worth_packing(self, lens)
    if packs or worth_tiering(self, lens):
        g = self.packed_graphs
        path = "packed graph" if g is not None and g.key(len(lens), len(new), max(new)) in g else "packed eager"
        path += "" if packs else " tiers"  # a wave, packed by width tier
    ev = None
    if torch.cuda.is_available():
        ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        ev[0].record()
    t0 = time.perf_counter()
    out = _prefill_rows(self, history, lens)
    if ev is not None:
        ev[1].record()
    LOG.append({"what": "prefill", "s": 0.0, "host_s": time.perf_counter() - t0, "t": t0, "path": path,
                "rows": len(lens), "new": len(new), "longest": max(new), "ev": ev})  # fmt: skip
    return out


def prefills(log: list[dict]) -> dict:
    """Per prefill path: calls, new rows, median longest prompt, median and summed stream ms."""
    by = defaultdict(list)
    for e in log:
        if e["what"] == "prefill":
            ms = e["ev"][0].elapsed_time(e["ev"][1]) if e["ev"] is not None else 1e3 * e["host_s"]
            by[f"{e['path']} @{e['rows']}"].append((ms, e["new"], e["longest"]))
    return {
        k: {"n": len(v), "new": sum(x[1] for x in v), "longest_median": statistics.median(x[2] for x in v),
            "median_ms": statistics.median(x[0] for x in v), "sum_s": sum(x[0] for x in v) / 1e3}
        for k, v in by.items()
    }  # fmt: skip


def summarize(log: list[dict]) -> dict:
    steps = [e for e in log if e["what"] == "step"]
    admits = [e for e in log if e["what"] == "admit"]
    wall = (max(e["t"] + e["s"] for e in log) - min(e["t"] for e in log)) if log else 0.0
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
        "prefills": prefills(log),
    }


def main() -> None:
    rows_mod.RowBatch.step, rows_mod.RowBatch.admit, rows_mod.RowBatch._launch = step, admit, launch
    engine_mod.Engine.prefill_rows = prefill_rows
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
        for k, v in sorted(s["prefills"].items(), key=lambda kv: -kv[1]["sum_s"]):
            print(f"   prefill {k:16} n {v['n']:4}  new {v['new']:4}  longest~{v['longest_median']:5.0f}  "
                  f"median {v['median_ms']:6.2f} ms  sum {v['sum_s']:6.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
