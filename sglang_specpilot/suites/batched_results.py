"""The batched suite's numbers: one cell per (system, concurrency N) from its clients' records, and the
issue's metrics over the cells (issue 18):

    batched_min_speedup_vs_ar      min over N = 1..64 of total tokens/s, SpecPilot with the mechanisms / AR
    batched_min_speedup_vs_stock   min over N = 1..32 of the same against the stock chain
    batched_speedup_vs_ar_n1       the same ratio at N = 1
    batched_ttft_p50_ratio_vs_ar   TTFT p50 of SpecPilot with the mechanisms / AR's, at N = 16
    batched_ttft_steady_p50_ratio_vs_ar   the same over each client's requests after its first: the first
                                   wave (N prompts at once at t = 0) is a quarter of a part's requests at 4
                                   a client, and sits above the median, which it moves to the steady p67
    batched_forcing_all_accepted   1 if token forcing accepted every speculative cell's outputs against AR's
    batched_forcing_rejected_S_nN  1 for each cell it rejected (system S at N): its figures are not the product's

A metric is written only where every cell it needs was measured; ``incomplete`` lists what is missing, so
a run cut short by its deadline never reports a minimum over fewer batch sizes as if it were the whole.
"""

from __future__ import annotations

import statistics

SYSTEMS = ("ar", "stock", "specpilot", "specpilot_batched")
LABELS = {
    "ar": "AR",
    "stock": "stock chain",
    "specpilot": "SpecPilot trees (no batched mechanisms)",
    "specpilot_batched": "SpecPilot trees + batched mechanisms",
}
MAIN = "specpilot_batched"
AR_RANGE, STOCK_RANGE, TTFT_N = (1, 64), (1, 32), 16


def cell(system: str, n: int, records: list[dict], wall_s: float, ar_ids: dict[int, list[int]] | None) -> dict:
    """Summary of one (system, N) run; ``ar_ids`` (prompt -> AR's tokens) gives ``same_as_ar``, the share of
    requests whose greedy tokens equal AR's (lossless up to GPU near-ties)."""
    ok = [r for r in records if r["error"] is None]
    tokens = sum(r["tokens"] for r in ok)
    ttft = [r["ttft_s"] for r in ok]
    # Client c's requests are prompts c, c + N, ... (``run_clients``): prompts 0 .. N - 1 are the first wave.
    steady = [r["ttft_s"] for r in ok if r.get("prompt", 0) >= n]
    itl = [r["itl_s"] for r in ok if r["itl_s"] is not None]
    out = {
        "system": system,
        "concurrency": n,
        "requests": len(records),
        "failed": len(records) - len(ok),
        "tokens": tokens,
        "wall_s": wall_s,
        "total_tokens_per_s": tokens / wall_s if wall_s > 0 and ok else None,
        "per_request_tokens_per_s": statistics.median(r["tokens"] / r["request_s"] for r in ok) if ok else None,
        "ttft_p50_s": statistics.median(ttft) if ttft else None,
        "ttft_p90_s": statistics.quantiles(ttft, n=10)[-1] if len(ttft) > 1 else (ttft[0] if ttft else None),
        "ttft_steady_p50_s": statistics.median(steady) if steady else None,
        "itl_p50_s": statistics.median(itl) if itl else None,
        "itl_mean_s": statistics.fmean(itl) if itl else None,
    }
    # The steady requests' time to first token in its two parts (``batched_clients._ttft_parts``): waiting to
    # be admitted, and admission to the first token; and how many of them shared their prefill with others.
    parts = [r for r in ok if r.get("prompt", 0) >= n and r.get("prefill_s") is not None]
    if parts:
        out["admit_wait_steady_p50_s"] = statistics.median(r["admit_wait_s"] for r in parts)
        out["prefill_steady_p50_s"] = statistics.median(r["prefill_s"] for r in parts)
        out["prefill_shared_steady"] = sum(r["prefill_group"] > 1 for r in parts)
    if ar_ids is not None and ok:
        same = [r["token_ids"] == ar_ids[r["prompt"]] for r in ok if r["prompt"] in ar_ids]
        out["same_as_ar"] = sum(same) / len(same) if same else None
    return out


def _ratio(cells: dict, a: str, b: str, n: int, field: str) -> float | None:
    x, y = cells.get((a, n), {}).get(field), cells.get((b, n), {}).get(field)
    return x / y if x is not None and y else None


def summarize(cell_list: list[dict], concurrency: list[int]) -> tuple[dict, list[str]]:
    """(metrics, incomplete): the issue's metrics, per-cell tokens/s and speedups, and what could not be
    computed because a cell is missing."""
    cells = {(c["system"], c["concurrency"]): c for c in cell_list}
    m: dict[str, float] = {}
    incomplete: list[str] = []
    for c in cell_list:
        s, n = c["system"], c["concurrency"]
        if c["total_tokens_per_s"] is not None:
            m[f"batched_tokens_per_s_{s}_n{n}"] = round(c["total_tokens_per_s"], 2)
        if s != "ar" and (r := _ratio(cells, s, "ar", n, "total_tokens_per_s")) is not None:
            m[f"batched_speedup_vs_ar_{s}_n{n}"] = round(r, 3)

    def over(base: str, lo_hi: tuple[int, int], name: str) -> None:
        ns = [n for n in concurrency if lo_hi[0] <= n <= lo_hi[1]]
        rs = [_ratio(cells, MAIN, base, n, "total_tokens_per_s") for n in ns]
        if not ns or any(r is None for r in rs):
            incomplete.append(f"{name}: needs {MAIN} and {base} at N = {ns}")
            return
        m[name] = round(min(rs), 3)
        m[f"{name}_at_n"] = ns[rs.index(min(rs))]

    over("ar", AR_RANGE, "batched_min_speedup_vs_ar")
    over("stock", STOCK_RANGE, "batched_min_speedup_vs_stock")
    if (r := _ratio(cells, MAIN, "ar", 1, "total_tokens_per_s")) is not None:
        m["batched_speedup_vs_ar_n1"] = round(r, 3)
    else:
        incomplete.append(f"batched_speedup_vs_ar_n1: needs {MAIN} and ar at N = 1")
    forced = [c["forcing"]["accepted"] for c in cell_list if "forcing" in c]
    if forced:  # every speculative cell's token forcing against AR accepted (1) or not (0), and which were not
        m["batched_forcing_all_accepted"] = int(all(forced))
        for c in cell_list:
            if "forcing" in c and not c["forcing"]["accepted"]:
                m[f"batched_forcing_rejected_{c['system']}_n{c['concurrency']}"] = 1
    if (r := _ratio(cells, MAIN, "ar", TTFT_N, "ttft_p50_s")) is not None:
        m["batched_ttft_p50_ratio_vs_ar"] = round(r, 3)
    else:
        incomplete.append(f"batched_ttft_p50_ratio_vs_ar: needs {MAIN} and ar at N = {TTFT_N}")
    if (r := _ratio(cells, MAIN, "ar", TTFT_N, "ttft_steady_p50_s")) is not None:  # a diagnostic beside it
        m["batched_ttft_steady_p50_ratio_vs_ar"] = round(r, 3)
    return m, incomplete


def results_table(data: dict) -> str:
    """A batched results file's table (``make results``, ``harness.report.SUITE_TABLES``)."""
    return readme_table(data.get("cells", []))


def readme_table(cell_list: list[dict]) -> str:
    """One line per system and N: total and per-request tokens/s, TTFT and inter-token latency."""
    lines = [
        "| system | N | total tok/s | per-request tok/s | TTFT p50 (ms) | ITL p50 (ms) | vs AR |",
        "|---|---|---|---|---|---|---|",
    ]
    cells = {(c["system"], c["concurrency"]): c for c in cell_list}

    def f(x, scale=1.0, nd=1):
        return "-" if x is None else f"{x * scale:.{nd}f}"

    for c in sorted(cell_list, key=lambda c: (c["concurrency"], SYSTEMS.index(c["system"]))):
        r = _ratio(cells, c["system"], "ar", c["concurrency"], "total_tokens_per_s")
        lines.append(
            f"| {LABELS[c['system']]} | {c['concurrency']} | {f(c['total_tokens_per_s'])} | "
            f"{f(c['per_request_tokens_per_s'])} | {f(c['ttft_p50_s'], 1e3)} | {f(c['itl_p50_s'], 1e3, 2)} | "
            f"{f(r, 1.0, 2)} |"
        )
    return "\n".join(lines)


def grid_table(data: dict) -> str:
    """Total tokens/s by N (rows) and system (columns), with the mechanisms' ratios to AR and to stock: the
    README's grid (``harness.report``, between its batched-grid markers). A system that failed at an N says
    so (the file's ``errors``); one not run there is "-"."""
    cells = {(c["system"], c["concurrency"]): c for c in data.get("cells", [])}
    failed = {(e.get("system"), e.get("concurrency")): e.get("error", "") for e in data.get("errors", [])}
    systems = [s for s in SYSTEMS if any(k[0] == s for k in cells) or any(k[0] == s for k in failed)]
    ns = sorted({n for _, n in cells} | {n for _, n in failed if n is not None})
    head = "| N | " + " | ".join(LABELS[s] for s in systems) + " | vs AR | vs stock |"
    lines = [head, "|---:|" + "---:|" * (len(systems) + 2)]

    def tps(s: str, n: int) -> str:
        c = cells.get((s, n))
        if c is not None and c.get("total_tokens_per_s") is not None:
            return f"{c['total_tokens_per_s']:,.0f}"
        err = failed.get((s, n))
        return f"failed ({err.split(':')[0]})" if err else "-"

    def ratio(base: str, n: int) -> str:
        r = _ratio(cells, MAIN, base, n, "total_tokens_per_s")
        return "-" if r is None else f"{r:.2f}x"

    for n in ns:
        row = " | ".join(tps(s, n) for s in systems)
        lines.append(f"| {n} | {row} | {ratio('ar', n)} | {ratio('stock', n)} |")
    return "\n".join(lines)
