"""``DIR/profile.json``: the tuned options with their evidence, and how ``--profile DIR`` applies them.

The file holds the deployment (model, drafter, device), the option delta over stock, and the evidence: the
stock-vs-stock noise, every round's ceiling and promotion, and the sealed final. Only a delta the sealed final
confirmed is applied; an unconfirmed run writes ``"delta": {}`` (stock) and says why in ``"applied_reason"``.

``specpilot generate|serve --profile DIR`` apply the delta on top of the options their flags give. The
SGLang plugin reads the same file through the environment variable ``SPECPILOT_PROFILE`` (a folder or the
JSON file), which the server's worker processes inherit.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict, replace
from pathlib import Path

PROFILE = "profile.json"
ENV = "SPECPILOT_PROFILE"


def _commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


def write(out: str | Path, result: dict, deployment: dict, stock) -> dict:
    final = result["final"]
    confirmed = bool(final.get("confirmed"))
    delta = result["best"] if confirmed else {}
    doc = {
        "format": "specpilot-profile/1",
        "deployment": deployment,
        "stock_options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(stock).items()},
        "delta": delta,
        "tuned_delta": result["best"],
        "applied_reason": "sealed final confirmed the tuned options"
        if confirmed
        else f"not applied: {final.get('reason') or ', '.join(final.get('feedback', [])) or 'sealed final failed'}",
        "evidence": {
            "stock_noise": result["stock_noise"],
            "rounds": [
                {k: r.get(k) for k in ("round", "largest", "ceiling", "promoted", "stack", "legal_edits", "stopped")}
                for r in result["rounds"]
            ],
            "sealed_final": {k: final.get(k) for k in ("ran", "confirmed", "promotion", "forcing", "feedback")}
            | ({"gain": final["timing"]["gain"], "ms": final["timing"].get("ms")} if final.get("timing") else {}),
            "costmodel_validation": {k: result["validation"][k] for k in ("n", "error_median", "error_max")},
        },
        "commit": _commit(),
    }
    Path(out, PROFILE).write_text(json.dumps(doc, indent=1))
    return doc


def read(path: str | Path) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / PROFILE
    if not p.exists():
        raise FileNotFoundError(f"no tuned profile at {p} (run: specpilot tune ... --out DIR)")
    doc = json.loads(p.read_text())
    if doc.get("format") != "specpilot-profile/1":
        raise ValueError(f"{p} is not a specpilot profile (format {doc.get('format')!r})")
    return doc


def apply_profile(options, path: str | Path | None):
    """``options`` with the profile's delta applied (``path`` None: ``options`` as they are)."""
    if path is None:
        return options
    from .option_space import apply

    doc = read(path)
    delta = dict(doc["delta"])
    dep = doc.get("deployment", {})
    if options.model is None and dep.get("model") is not None:
        delta.setdefault("model", dep["model"])
    return apply(replace(options), delta)


def env_profile() -> str | None:
    """The profile the SGLang plugin's processes read (``SPECPILOT_PROFILE``)."""
    return os.environ.get(ENV) or None
