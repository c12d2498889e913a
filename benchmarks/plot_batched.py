"""Total tokens/s against concurrency, one line per system, from a batched results file, as an SVG.

    python benchmarks/plot_batched.py benchmarks/results/batched_h200.json [OUT.svg]

Plain SVG written here (no plotting library: ``make results`` runs without the ``report`` extra). The x axis
is log2 of the number of closed-loop clients, the y axis linear from 0. Cells that failed or were not
measured are gaps in their line, never interpolated.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_specpilot.suites.batched_results import LABELS, SYSTEMS  # noqa: E402

COLORS = {"ar": "#555555", "stock": "#1f77b4", "specpilot": "#ff7f0e", "specpilot_batched": "#2ca02c"}
W, H, LEFT, RIGHT, TOP, BOTTOM = 640, 400, 70, 20, 30, 90


def _ticks(top: float) -> list[float]:
    step = 10 ** math.floor(math.log10(top / 4)) if top > 0 else 1
    for m in (1, 2, 5, 10):
        if top / (m * step) <= 6:
            step *= m
            break
    return [i * step for i in range(int(top // step) + 1)]


def svg(data: dict) -> str:
    cells = [c for c in data.get("cells", []) if c.get("total_tokens_per_s")]
    ns = sorted({c["concurrency"] for c in cells})
    if not ns:
        raise SystemExit("no measured cells to plot")
    top = max(c["total_tokens_per_s"] for c in cells) * 1.08
    lo, hi = math.log2(ns[0]), math.log2(ns[-1]) if ns[-1] > ns[0] else math.log2(ns[0]) + 1

    def x(n: int) -> float:
        return LEFT + (math.log2(n) - lo) / (hi - lo) * (W - LEFT - RIGHT)

    def y(v: float) -> float:
        return H - BOTTOM - v / top * (H - TOP - BOTTOM)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">']
    out.append(f'<rect width="{W}" height="{H}" fill="white"/>')
    title = f"{data.get('gpu', '?')}: {data.get('model', {}).get('label', '')}"
    out.append(f'<text x="{LEFT}" y="18" font-size="12">{title}</text>')
    for t in _ticks(top):
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for n in ns:
        out.append(f'<text x="{x(n):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{n}</text>')
    mid = (LEFT + W - RIGHT) / 2
    out.append(f'<text x="{mid}" y="{H - BOTTOM + 32}" text-anchor="middle">concurrent clients (log scale)</text>')
    out.append(f'<text x="16" y="{(TOP + H - BOTTOM) / 2}" transform="rotate(-90 16 {(TOP + H - BOTTOM) / 2})" '
               'text-anchor="middle">total tokens/s</text>')  # fmt: skip
    by = {(c["system"], c["concurrency"]): c["total_tokens_per_s"] for c in cells}
    legend_y = H - 30
    for i, s in enumerate(s for s in SYSTEMS if any(k[0] == s for k in by)):
        color = COLORS[s]
        run: list[str] = []
        for n in ns + [None]:  # a missing cell ends the segment
            if n is not None and (s, n) in by:
                run.append(f"{x(n):.1f},{y(by[(s, n)]):.1f}")
                continue
            if len(run) > 1:
                out.append(f'<polyline points="{" ".join(run)}" fill="none" stroke="{color}" stroke-width="2"/>')
            run = []
        for n in ns:
            if (s, n) in by:
                out.append(f'<circle cx="{x(n):.1f}" cy="{y(by[(s, n)]):.1f}" r="3" fill="{color}"/>')
        lx = LEFT + (i % 2) * 280
        ly = legend_y + (i // 2) * 16
        out.append(f'<line x1="{lx}" x2="{lx + 20}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{lx + 26}" y="{ly}">{LABELS[s]}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    src = Path(argv[0])
    dst = Path(argv[1]) if len(argv) > 1 else src.with_suffix(".svg")
    dst.write_text(svg(json.loads(src.read_text())))
    print(f"wrote {dst}")


if __name__ == "__main__":
    main(sys.argv[1:])
