"""``DIR/report.md`` and a self-contained ``DIR/report.html`` (PNG plots embedded as data URIs).

Sections: the ceiling factors per round; tau (replayed per scheme, and each profiled system's accepted tokens
per round); the paired-timing distribution (per-block ratios) of every promoted and rejected candidate; the
step-time breakdown against floors; the sealed final against stock and AR. Plots need matplotlib; without it
the report says so and carries the same numbers as tables.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None


def _png(plt, fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _ceiling_fig(plt, rounds):
    fig, ax = plt.subplots(figsize=(6, 3))
    names = ("trees", "kernels", "outside")
    rs = [r for r in rounds if "ceiling" in r]
    for i, n in enumerate(names):
        vals = [r["ceiling"]["factors"].get(n) or 0.0 for r in rs]
        ax.bar([j + i * 0.25 for j in range(len(rs))], vals, 0.25, label=n + (" (unavailable = 0)" if n == "kernels"
                                                                                 and 0.0 in vals else ""))  # fmt: skip
    ax.axhline(1.0, color="k", lw=0.5)
    ax.set_xticks([j + 0.25 for j in range(len(rs))], [f"round {r['round']}" for r in rs])
    ax.set_ylabel("factor (x)")
    ax.legend(fontsize=7)
    return fig


def _timing_fig(plt, history):
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(history) + 1.5))
    data = [h["timing"]["block_ratios"] for h in history]
    try:
        bp = ax.boxplot(data, orientation="horizontal", patch_artist=True)
    except TypeError:  # matplotlib < 3.10
        bp = ax.boxplot(data, vert=False, patch_artist=True)
    for patch, h in zip(bp["boxes"], history, strict=True):
        patch.set_facecolor("#7fc97f" if h["promoted"] else "#fdc086")
    ax.set_yticks(range(1, len(history) + 1), [f"r{h['round']} {h['id']}" for h in history], fontsize=7)
    ax.axvline(1.0, color="k", lw=0.5)
    ax.set_xlabel("per-block time(best) / time(candidate); green = promoted")
    return fig


def _steps_fig(plt, profiles):
    fig, ax = plt.subplots(figsize=(7, 3))
    cats = list(next(iter(profiles.values()))["categories_ms"])
    left = [0.0] * len(profiles)
    for c in cats:
        vals = [p["categories_ms"][c] for p in profiles.values()]
        ax.barh(range(len(profiles)), vals, left=left, label=c)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    for i, p in enumerate(profiles.values()):
        if p.get("floor_ms"):
            ax.plot([p["floor_ms"]], [i], "k|", ms=18)
    ax.set_yticks(range(len(profiles)), list(profiles), fontsize=7)
    ax.set_xlabel("ms per round (| = floor, where measured)")
    ax.legend(fontsize=6, ncol=3)
    return fig


def _tau_fig(plt, profiles, replay):
    fig, ax = plt.subplots(figsize=(6, 3))
    labels, vals = [], []
    for k, v in (replay or {}).items():
        if k.startswith("tau_") and not k.startswith("tau_ratio"):
            labels.append("replay " + k[4:])
            vals.append(v)
    for name, p in profiles.items():
        labels.append(name)
        vals.append(p["tau"])
    ax.bar(range(len(vals)), vals)
    ax.set_xticks(range(len(vals)), labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("tokens per round (tau)")
    return fig


def _tables(res: dict, doc: dict) -> list[str]:
    md = ["## Ceiling per round", "", "| round | S now | trees | kernels | outside | ceiling | largest | promoted |",
          "|---:|---:|---:|---:|---:|---:|---|---|"]  # fmt: skip

    def f(x):
        return "unavailable" if x is None else f"{x:.3f}"

    for r in res["rounds"]:
        if "ceiling" not in r:
            md.append(f"| {r['round']} | stopped: {r.get('stopped')} | | | | | | |")
            continue
        c = r["ceiling"]
        md.append(f"| {r['round']} | {c['speedup_now']:.3f} | {f(c['factors']['trees'])} | "
                  f"{f(c['factors']['kernels'])} | {f(c['factors']['outside'])} | {c['ceiling']:.3f}"
                  f"{' (partial)' if c['partial'] else ''} | {c['largest']} | {r['promoted'] or '–'} |")  # fmt: skip
    md += ["", "## Candidates (paired ABBA vs the current best)", "",
           "| round | candidate | gain | 95% low | threshold | predicted | verdict | feedback |",
           "|---:|---|---:|---:|---:|---:|---|---|"]  # fmt: skip
    for h in res["history"]:
        md.append(f"| {h['round']} | {h['id']} | {h['timing']['gain']:+.4f} | {h['timing']['gain_low']:+.4f} | "
                  f"{h['promotion']['threshold']:.4f} | {h['predicted'] - 1:+.4f} | "
                  f"{'promoted' if h['promoted'] else 'rejected'} | {', '.join(h['feedback']) or '–'} |")  # fmt: skip
    v = res["validation"]
    md += ["", f"Cost-model validation: {v['n']} candidates, median error {f(v['error_median'])}, "
           f"max {f(v['error_max'])} (predicted S ratio against the measured paired ratio).", ""]  # fmt: skip
    fin = res["final"]
    md += ["## Sealed final (held-out prompts)", ""]
    if fin.get("ran"):
        t = fin["timing"]
        md += ["| system | ms per generation | vs stock | vs AR |", "|---|---:|---:|---:|",
               f"| tuned | {t['ms']['tuned']:.2f} | {1 + t['gain']:.3f}x | {1 + t['vs_ar']['gain']:.3f}x |",
               f"| stock | {t['ms']['stock']:.2f} | 1.000x | {1 + t['stock_vs_ar']['gain']:.3f}x |",
               f"| AR | {t['ms']['ar']:.2f} | | 1.000x |", "",
               f"Confirmed: {fin['confirmed']} ({', '.join(fin['feedback']) or 'both gates passed'})."]  # fmt: skip
    else:
        md.append(fin.get("reason", "not run"))
    md += ["", f"Profile: `{doc['delta']}` — {doc['applied_reason']}.", ""]
    return md


def write_report(out, res: dict, doc: dict) -> tuple[Path, Path]:
    out = Path(out)
    plt = _plt()
    profiles = {}
    for r in res["rounds"]:
        if "profile" in r:
            profiles[f"r{r['round']} best"] = r["profile"]
    replay = next((p.get("tau_replay") for p in profiles.values() if p.get("tau_replay")), None)
    head = ["# specpilot tune report", "", f"Deployment: `{doc['deployment']}`; stock-vs-stock noise "
            f"{res['stock_noise']:.4f}.", ""]  # fmt: skip
    notes = []
    if any(p.get("floors_ms") is None for p in profiles.values()):
        notes.append(next(p["floors_note"] for p in profiles.values() if p.get("floors_ms") is None))
    notes.append("Accepted length per depth is not recorded by the engine's results (only tokens per round); the "
                 "tau figure shows the replayed schemes and each profiled system's tau.")  # fmt: skip
    figs = []
    if plt is None:
        notes.append("matplotlib is not installed: no plots (pip install matplotlib); the tables hold the numbers.")
    else:
        if profiles:
            figs.append(("Ceiling factors per round", _png(plt, _ceiling_fig(plt, res["rounds"]))))
            figs.append(("tau", _png(plt, _tau_fig(plt, profiles, replay))))
            figs.append(("Step-time breakdown against floors", _png(plt, _steps_fig(plt, profiles))))
        if res["history"]:
            figs.append(("Paired-timing distributions", _png(plt, _timing_fig(plt, res["history"]))))
    md = head + [f"> {n}" for n in notes] + [""] + _tables(res, doc)
    md_path = out / "report.md"
    md_path.write_text("\n".join(md) + "\n")
    body = [f"<p>{html.escape(line)}</p>" if line else "" for line in md]
    imgs = [f'<h2>{html.escape(t)}</h2><img alt="{html.escape(t)}" src="data:image/png;base64,{b}">' for t, b in figs]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>specpilot tune report</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:auto}p{white-space:pre-wrap;margin:.2em 0;"
            "font-family:monospace;font-size:12px}img{max-width:100%}</style></head><body>"
            + "\n".join(imgs + body) + "</body></html>")  # fmt: skip
    html_path = out / "report.html"
    html_path.write_text(page)
    return md_path, html_path
