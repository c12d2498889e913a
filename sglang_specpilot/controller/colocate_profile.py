"""Co-location only where it wins (issue 18, mechanism 5): the tuned profile's co-location measurements and
the batch sizes at which the server turns co-located rounds on.

A co-located round verifies one half of the batch while drafting the other, so two of them serve every row
once, as one conventional round over the whole batch does. Co-location wins at batch b only where

    2 x colocated_round_ms(b) < full_batch_round_ms(b)

measured on the deployment (``specpilot bench colocate`` times both: its ``anchor`` and
``seq_graph_full_batch`` rounds). On the H200 it lost at batch 8 for Llama-3.1-8B / Llama-3.2-1B (README,
"Co-located rounds"), which is why nothing turns it on without a measurement that says otherwise.

The profile (``DIR/profile.json``, ``tune_profile``) keeps the points under ``"colocate"``: a list of
``{"pair", "batch", "colocated_round_ms", "full_batch_round_ms", "source"}``. ``record`` copies them from a
colocate results file; ``where_wins`` reads them back as the options the server runs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from .tune_profile import PROFILE, read

KEY = "colocate"


def points_from_results(doc: dict, source: str = "") -> list[dict]:
    """The (batch, co-located round, full-batch round) points of a colocate results file: only pairs whose
    full-batch round was timed (older runs timed the conventional round over one group only)."""
    points = []
    for row in doc.get("rows", []):
        us = row.get("median_us") or {}
        if not row.get("case", "").endswith(".baselines") or "seq_graph_full_batch" not in us or "anchor" not in us:
            continue
        points.append({
            "pair": row["case"].rsplit(".", 1)[0],
            "batch": int(row["batch"]),
            "colocated_round_ms": us["anchor"] / 1e3,
            "full_batch_round_ms": us["seq_graph_full_batch"] / 1e3,
            "source": source,
        })  # fmt: skip
    return points


def winning_batches(points: list[dict]) -> tuple[int, ...]:
    """Batch sizes where two co-located rounds took less time than one full-batch round."""
    return tuple(sorted({p["batch"] for p in points if 2 * p["colocated_round_ms"] < p["full_batch_round_ms"]}))


def record(profile_dir: str | Path, results_path: str | Path) -> list[dict]:
    """Store the co-location points of ``results_path`` (a colocate results file) in the profile."""
    doc = read(profile_dir)
    points = points_from_results(json.loads(Path(results_path).read_text()), str(results_path))
    doc[KEY] = points
    path = Path(profile_dir)
    (path / PROFILE if path.is_dir() else path).write_text(json.dumps(doc, indent=1))
    return points


def where_wins(options, profile: str | Path | None) -> tuple[object, str]:
    """``options`` with co-located rounds on exactly at the batches the profile measured them to win, and a
    line saying what was decided (the server logs it). No profile, no points, or no win: co-location off."""
    points = read(profile).get(KEY, []) if profile is not None else []
    wins = winning_batches(points)
    if not wins:
        why = "no tuned profile" if profile is None else f"the profile measured no win ({len(points)} points)"
        return replace(options, colocate=False, colocate_batches=None), f"co-located rounds off: {why}"
    try:
        on = replace(options, colocate=True, colocate_batches=wins)
    except ValueError as e:  # these options cannot co-locate (tree rounds, one KV row, ...)
        return replace(options, colocate=False, colocate_batches=None), f"co-located rounds off: {e}"
    return on, f"co-located rounds on at batch {', '.join(map(str, wins))} (measured wins in {profile})"
