"""Merge results files of one suite, written by separate runs, into one file.

    python benchmarks/merge_results.py OUT.json IN.json [IN.json ...] [--log NAME=PATH ...]
        [--attach NAME=PATH ...] [--note TEXT]

Used when a suite's parts ran as separate device calls (one pair per call, so a call that runs out of
time loses only its own part). The first input gives the header (suite, GPU, versions, peaks); every
input's commit, date and command are kept under ``runs``; metrics are united (a metric measured by two
inputs is an error) and rows concatenated. A suite module with a ``derived_metrics(rows)`` function
(e.g. ``colocate``) has those metrics recomputed from the merged rows. ``--log`` attaches a run's
progress lines (the search's per-plan rewards) as evidence, ``--attach`` a JSON document (a search's
state file with every evaluated plan and kernel verdict, a diagnostic's output) under ``attachments``.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path


def merge(inputs: list[dict]) -> dict:
    if len({d["suite"] for d in inputs}) != 1:
        raise SystemExit("inputs come from different suites")
    out = {k: v for k, v in inputs[0].items() if k not in ("metrics", "rows", "command", "commit", "date")}
    commits = sorted({d["commit"] for d in inputs})
    out["commit"] = commits[0] if len(commits) == 1 else ",".join(commits)
    out["dirty"] = any(d.get("dirty") for d in inputs)
    out["date"] = max(d["date"] for d in inputs)
    out["command"] = " ; ".join(d["command"] for d in inputs)
    out["runs"] = [{k: d.get(k) for k in ("commit", "dirty", "date", "command")} for d in inputs]
    out["metrics"], out["rows"] = {}, []
    # Which run measured each metric, so a table citing one metric cites that run's commit.
    out["metric_commits"] = {}
    for d in inputs:
        clash = set(out["metrics"]) & set(d["metrics"])
        if clash:
            raise SystemExit(f"metrics measured twice: {sorted(clash)}")
        out["metrics"].update(d["metrics"])
        out["metric_commits"].update({m: d.get("metric_commits", {}).get(m, d["commit"]) for m in d["metrics"]})
        out["rows"] += d["rows"]
    try:
        suite = importlib.import_module(f"sglang_specpilot.suites.{out['suite']}")
    except ImportError:
        suite = None
    if hasattr(suite, "derived_metrics"):
        out["metrics"].update(suite.derived_metrics(out["rows"]))
    return out


def write(doc: dict, out: Path, attach: list[str], note: str | None) -> None:
    """``doc`` to ``out`` with each ``NAME=PATH`` JSON document under ``attachments`` and the note recorded."""
    if attach:
        doc["attachments"] = {}
        for item in attach:
            name, path = item.split("=", 1)
            doc["attachments"][name] = json.loads(Path(path).read_text())
    if note:
        doc["provenance_note"] = note
    out.write_text(json.dumps(doc, indent=1) + "\n")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("inputs", type=Path, nargs="+")
    p.add_argument("--log", action="append", default=[], help="NAME=PATH of a run's log to attach")
    p.add_argument("--attach", action="append", default=[], help="NAME=PATH of a JSON document to attach")
    p.add_argument("--note", default=None, help="provenance note to record")
    a = p.parse_args(argv)
    doc = merge([json.loads(f.read_text()) for f in a.inputs])
    if a.log:
        doc["logs"] = {}
        for item in a.log:
            name, path = item.split("=", 1)
            doc["logs"][name] = [ln.rstrip("\n") for ln in Path(path).read_text().splitlines() if ln.startswith("[")]
    write(doc, a.out, a.attach, a.note)
    print(f"wrote {a.out}: {len(doc['metrics'])} metrics, {len(doc['rows'])} rows")


if __name__ == "__main__":
    main()
