"""Merge batched-suite files whose N ran in separate device calls into one grid file.

    python benchmarks/merge_batched.py OUT.json FILE.json:N[,N...] [FILE.json:N ...] [--commit FILE=SHA ...]
        [--attach NAME=PATH ...] [--note TEXT]

Each input gives the cells (and request rows) of the Ns named after its colon, every system it ran at those
N, so each N's systems come from one process, side by side, as the suite measured them; the metrics and the
README table are recomputed from the merged cells (``batched_results.summarize``). The first input gives
the header (GPU, versions, model, prompts). Every input's commit, date and command are kept under ``runs``
with the Ns it gave, and each cell names the commit whose tree measured it (``measured_at``): the device's
git metadata is the session's starting commit, so ``--commit FILE=SHA`` records what the call really
carried, a clean commit (the recorded one and its dirty flag are kept as ``device_git_recorded`` and
``device_dirty_recorded``). ``merge_results.py`` cannot do this: every
batched file carries the summary metrics, which would clash.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# This checkout's package and merge_results beside this file: an installed sglang_specpilot may be another
# checkout's (an editable install made elsewhere), whose summarize would drop metrics this one writes.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).parent)]
from merge_results import write  # noqa: E402

from sglang_specpilot.suites.batched_results import readme_table, summarize  # noqa: E402


def merge(parts: list[tuple[dict, list[int], str]]) -> dict:
    """``parts``: (document, its Ns, the commit it carried). Raises SystemExit where two give one N."""
    taken: dict[int, int] = {}
    out = {k: v for k, v in parts[0][0].items() if k not in ("cells", "rows", "metrics", "incomplete", "table")}
    out["cells"], out["rows"], out["runs"] = [], [], []
    for i, (doc, ns, commit) in enumerate(parts):
        for n in ns:
            if n in taken:
                raise SystemExit(f"N = {n} given by inputs {taken[n]} and {i}")
            taken[n] = i
        cells = [c for c in doc["cells"] if c["concurrency"] in ns and "carried_from" not in c]
        missing = set(ns) - {c["concurrency"] for c in cells}
        if missing:
            raise SystemExit(f"input {i} has no cells at N = {sorted(missing)}")
        out["cells"] += [dict(c, measured_at=commit) for c in cells]
        rows = [r for r in doc["rows"] if r.get("concurrency") in ns or r.get("case") == "engine"]
        out["rows"] += [dict(r, measured_at=commit) for r in rows]
        out["runs"].append({
            "commit": commit, "device_git_recorded": doc.get("commit"), "device_dirty_recorded": doc.get("dirty"),
            "date": doc.get("date"),
            "command": doc.get("command"), "switches": doc.get("switches", {}), "concurrency": sorted(ns),
            "systems": sorted({c["system"] for c in cells}), "errors": doc.get("errors", []),
        })  # fmt: skip
    grid = sorted(taken)
    out["metrics"], out["incomplete"] = summarize(out["cells"], grid)
    out["table"] = readme_table(out["cells"])
    commits = sorted({p[2] for p in parts})
    out["commit"] = commits[0] if len(commits) == 1 else ",".join(commits)
    out["device_git_recorded"] = sorted({str(p[0].get("commit")) for p in parts})
    # The device compares the carried tree with the commit it recorded (the session's start), so a call that
    # carried a later clean commit reads dirty there; a part is dirty only where its own commit was not named.
    out["dirty"] = any(bool(p[0].get("dirty")) for p in parts if p[2] == p[0].get("commit"))
    out["date"] = max(str(p[0].get("date")) for p in parts)
    out["metric_commits"] = {}
    for m in out["metrics"]:  # a per-N metric names its N's commit; a summary over N names every commit used
        n = m.rsplit("_n", 1)[-1]
        i = taken.get(int(n)) if n.isdigit() else None
        out["metric_commits"][m] = parts[i][2] if i is not None else out["commit"]
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("inputs", nargs="+", help="FILE.json:N[,N...]")
    p.add_argument("--commit", action="append", default=[], help="FILE=SHA: the commit that call carried")
    p.add_argument("--attach", action="append", default=[], help="NAME=PATH of a JSON document to attach")
    p.add_argument("--note", default=None, help="provenance note to record")
    a = p.parse_args(argv)
    carried = dict(x.split("=", 1) for x in a.commit)
    parts = []
    for spec in a.inputs:
        path, _, ns = spec.rpartition(":")
        if not path or not ns:
            raise SystemExit(f"{spec}: expected FILE.json:N[,N...]")
        doc = json.loads(Path(path).read_text())
        parts.append((doc, [int(n) for n in ns.split(",")], carried.get(path, doc.get("commit"))))
    out = merge(parts)
    write(out, a.out, a.attach, a.note)
    print(json.dumps(out["metrics"], indent=1))
    print("incomplete:", out["incomplete"])


if __name__ == "__main__":
    main()
