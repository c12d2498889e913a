"""Plain-JSON conversion for the harness's report and verdict dataclasses."""

from __future__ import annotations

import json
import math
from dataclasses import fields, is_dataclass
from pathlib import Path

import numpy as np
import torch


def to_jsonable(obj: object) -> object:
    """Convert dataclasses, numpy and torch values to plain JSON types, recursively.

    Non-finite floats become ``None`` so the output is strict JSON that any reader accepts.
    """
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(to_jsonable(v) for v in obj)
    if isinstance(obj, (np.ndarray, torch.Tensor)):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_json(path: str | Path, doc: object, **dumps) -> None:
    """Write ``doc`` as JSON (``json.dumps(doc, indent=1, **dumps)``) to a file beside ``path`` and rename it
    there: a run killed mid-write leaves the previous file whole (a state to resume, partial results)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, **{"indent": 1, **dumps}))
    tmp.replace(path)


class JsonMixin:
    """Gives a dataclass ``to_dict()`` (plain JSON types) and ``to_json()``."""

    def to_dict(self) -> dict:
        return to_jsonable(self)  # type: ignore[return-value]

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)
