"""Step time against rows: the c of the cost model S = tau / c, per round kind and batch bucket.

``c = T_spec(b) / T_AR(b)`` depends on the batch: at batch 1 a round is weight-bound and c is close to 1
plus the drafter, while at large batches every verified node costs compute and c grows. The curve is
measured per deployment (``measure``: captured rounds replayed at warm-up on CUDA) or given
(``EngineOptions.auto_off_curve``: CPU tests, a tuned profile). Between measured row counts the time is
interpolated linearly; past the ends it is the nearest point's (a flat extrapolation, never a guess of a
slope nobody measured).
"""

from __future__ import annotations

import bisect


class StepCurve:
    """Milliseconds per round by kind ("ar", or a speculative round's key) and rows."""

    def __init__(self):
        self.points: dict[object, list[tuple[int, float]]] = {}

    @classmethod
    def from_triples(cls, triples) -> StepCurve:
        """``(rows, ar_ms, spec_ms)`` triples (the option's form): spec_ms applies to every speculative kind."""
        curve = cls()
        for rows, ar_ms, spec_ms in triples:
            curve.add("ar", rows, ar_ms)
            curve.add("spec", rows, spec_ms)
        return curve

    def add(self, kind, rows: int, ms: float) -> None:
        pts = self.points.setdefault(kind, [])
        pts[:] = sorted([p for p in pts if p[0] != rows] + [(int(rows), float(ms))])

    def has(self, kind) -> bool:
        return kind in self.points or (kind != "ar" and "spec" in self.points)

    def ms(self, kind, rows: int) -> float:
        pts = self.points.get(kind) or self.points["spec" if kind != "ar" else "ar"]
        xs = [r for r, _ in pts]
        i = bisect.bisect_left(xs, rows)
        if i < len(xs) and xs[i] == rows:
            return pts[i][1]
        if i == 0:
            return pts[0][1]
        if i == len(xs):
            return pts[-1][1]
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)

    def as_dict(self) -> dict:
        return {str(k): v for k, v in self.points.items()}


def measure(replay, reps: int = 20) -> float:
    """Median milliseconds of ``replay()`` (a captured round) on the current CUDA stream, after one warm
    replay. Only at warm-up, with no row in use: replays then write only into free rows, advancing nothing."""
    from ..harness.timing import cuda_times_ms

    times = cuda_times_ms(replay, reps, warmup=1)
    return sorted(times)[len(times) // 2]
