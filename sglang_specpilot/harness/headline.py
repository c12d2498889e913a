"""The README's headline results: a few rows, each computed from one committed results file.

A row names its file, the model, the batch and what was measured, and says how the result cell reads
from the file's metrics; the GPU and the commit come from the file itself. ``report.py`` writes the table
between ``<!-- headline:begin -->`` and ``<!-- headline:end -->`` of the README, next to the full tables
it writes into ``benchmarks/README.md``, so no headline number is ever typed by hand.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


class HeadlineError(ValueError):
    """A headline row whose results file or metric is missing."""


@dataclass(frozen=True)
class Headline:
    file: str  # a file in the results folder
    model: str
    batch: str
    what: str
    result: Callable[[dict], str]  # the file's metrics -> the result cell


def _vs(a: float, b: float, unit: str, ratio: float, extra: str = "") -> str:
    return f"{a:,.2f} vs {b:,.2f}{unit} ({ratio:.2f}x{extra})"


def _tokens_vs(a: float, b: float, ratio: float, extra: str = "") -> str:
    return f"{a:,.0f} vs {b:,.0f} tokens/s ({ratio:.2f}x{extra})"


def _best(m: dict) -> str:
    """The e2e suite's best SpecPilot system at batch 1 (its speedup metrics are that system's)."""
    if m.get("e2e_best_is_tlv_bs1"):  # absent from files written before TLV ran in the suite
        return "tlv"
    return "w12" if m["e2e_best_is_w12_bs1"] else "trees"


LIFTED_8B = "SmolLM2-135M lifted to Llama-3.1-8B shapes (stand-in, timing) + EAGLE-3 drafter"


def _batched_ns(m: dict, base: str, lo_hi: tuple[int, int]) -> list[int]:
    ns = {int(k.rsplit("_n", 1)[1]) for k in m if k.startswith(f"batched_tokens_per_s_{base}_n")}
    return sorted(n for n in ns if lo_hi[0] <= n <= lo_hi[1] and f"batched_tokens_per_s_specpilot_batched_n{n}" in m)


def _batched_range(m: dict, base: str, lo_hi: tuple[int, int]) -> str:
    """min-max over the measured N in ``lo_hi`` of the mechanisms' tokens/s over ``base``'s."""
    ns = _batched_ns(m, base, lo_hi)
    if not ns:
        raise KeyError(f"batched_tokens_per_s_{base}_n*")
    rs = [m[f"batched_tokens_per_s_specpilot_batched_n{n}"] / m[f"batched_tokens_per_s_{base}_n{n}"] for n in ns]
    return f"{min(rs):.2f}-{max(rs):.2f}x {base if base == 'stock' else 'AR'} at N {ns[0]}-{ns[-1]}"


def _batched_forcing(m: dict) -> str:
    """A note where token forcing rejected a cell: its figures are not the product's (older files without the
    flag say nothing)."""
    if m.get("batched_forcing_all_accepted") != 0:
        return ""
    ns = sorted({int(k.rsplit("_n", 1)[1]) for k in m if k.startswith("batched_forcing_rejected_")})
    return f"; token forcing REJECTED N = {', '.join(map(str, ns)) or '?'}"


def _batched_missing(m: dict, n: int) -> str:
    if f"batched_tokens_per_s_specpilot_batched_n{n}" in m:
        return ""
    return f"; the mechanisms not measured at N = {n} (the file's errors say why)"


HEADLINES: tuple[Headline, ...] = (
    Headline(
        "e2e_h100.json",
        LIFTED_8B,
        "1",
        "e2e: best SpecPilot system vs AR, HumanEval/100-131 + MT-Bench turn 1, 128 tokens, greedy",
        lambda m: _tokens_vs(
            m[f"e2e_{_best(m)}_tok_s_bs1"],
            m["e2e_ar_tok_s_bs1"],
            m["e2e_speedup_vs_ar_bs1"],
            f"; {_best(m)}; forcing {'accepted' if m['forcing_all_accepted'] else 'REJECTED'}",
        ),
    ),
    Headline(
        "e2e_h100.json",
        LIFTED_8B,
        "1",
        "e2e: best SpecPilot system vs stock chain speculative decoding (best gamma), same run",
        lambda m: _tokens_vs(m[f"e2e_{_best(m)}_tok_s_bs1"], m["e2e_stock_tok_s_bs1"], m["e2e_speedup_vs_stock_bs1"]),
    ),
    Headline(
        "e2e_bs4_16_h100.json",
        LIFTED_8B,
        "4",
        "e2e: SpecPilot trees vs AR (N, gamma chosen again at this batch by the cost model), separate run from batch 1",
        lambda m: _tokens_vs(m["e2e_trees_tok_s_bs4"], m["e2e_ar_tok_s_bs4"], m["e2e_speedup_vs_ar_bs4"]),
    ),
    Headline(
        "e2e_bs4_16_h100.json",
        LIFTED_8B,
        "16",
        "e2e: SpecPilot trees vs AR (same run as batch 4; the cost model chose stock's chain at this batch)",
        lambda m: _tokens_vs(m["e2e_trees_tok_s_bs16"], m["e2e_ar_tok_s_bs16"], m["e2e_speedup_vs_ar_bs16"]),
    ),
    Headline(
        "batched_h200.json",
        LIFTED_8B,
        "1 ... 64 clients",
        "server, steady state (4 requests a client): trees + the batched mechanisms vs AR and stock chain, "
        "total tokens/s, each N side by side",
        lambda m: _tokens_vs(
            m["batched_tokens_per_s_specpilot_batched_n1"],
            m["batched_tokens_per_s_ar_n1"],
            m["batched_speedup_vs_ar_specpilot_batched_n1"],
            f" at 1; {_batched_range(m, 'ar', (2, 64))}; "
            f"{_batched_range(m, 'stock', (1, 32))}{_batched_missing(m, 64)}{_batched_forcing(m)}",
        ),
    ),
    Headline(
        "batched_h100.json",
        LIFTED_8B,
        "1 ... 64 clients",
        "server, steady state (4 requests a client): trees + the batched mechanisms (chain kinds included) vs "
        "AR and stock, total tokens/s, each N side by side",
        lambda m: _tokens_vs(
            m["batched_tokens_per_s_specpilot_batched_n1"],
            m["batched_tokens_per_s_ar_n1"],
            m["batched_speedup_vs_ar_specpilot_batched_n1"],
            f" at 1; {_batched_range(m, 'ar', (2, 64))}; {_batched_range(m, 'stock', (1, 32))}{_batched_forcing(m)}",
        ),
    ),
    Headline(
        "tune_h200.json",
        LIFTED_8B,
        "1",
        "specpilot tune from stock (sealed final on unseen prompts): tuned vs stock, vs the e2e table's "
        "hand-picked tree, and the loop without its cost model",
        lambda m: (
            f"{m['tune_final_speedup_vs_stock_bs1_lifted8b']:.2f}x stock "
            f"({m['tune_final_over_best_manual_bs1_lifted8b']:.2f}x the hand-picked) in "
            f"{m['tune_device_minutes']:.1f} min; no cost model {m['tune_single_loop_ablation']:.2f}x"
        ),
    ),
    Headline(
        "tlv_h200.json",
        LIFTED_8B + ", W12",
        "1",
        "TLV + trees + W12 vs trees + W12: tokens per exact pass, and tokens/s",
        lambda m: (
            f"{m['tlv_tokens_per_exact_pass_ratio']:.2f}x per exact pass; "
            f"{m['tlv_e2e_speedup_vs_trees_w12_bs1']:.2f}x tokens/s"
        ),
    ),
    Headline(
        "hybrid_h200.json",
        "Qwen3-Next-like 8B hybrid, Gated DeltaNet (synthetic)",
        "1",
        "tree-32 verify: TreeWY kernel vs path recompute, and vs a snapshot chain of the same depth",
        lambda m: (
            _vs(m["wy_tree_ms"], m["path_tree_ms"], " ms", m["wy_verify_over_path_recompute"])
            + f"; {m['tree32_verify_over_chain_verify']:.2f}x the chain"
        ),
    ),
    Headline(
        "rounds_smollm2_h100.json",
        "SmolLM2-135M-Instruct (real weights)",
        "1",
        "prompt-lookup chains vs AR, default options, HumanEval/100-131 chat, 128 tokens",
        lambda m: _tokens_vs(
            m["smollm2_lookup_tok_s_bs1"], m["smollm2_ar_tok_s_bs1"], m["smollm2_lookup_speedup_vs_ar_bs1"]
        ),
    ),
    Headline(
        "rounds_smollm2_h100.json",
        "SmolLM2-135M + the shipped EAGLE-3 drafter",
        "1",
        "best-first tree (32 nodes) vs AR, same run",
        lambda m: _tokens_vs(
            m["smollm2_tree32_tok_s_bs1"],
            m["smollm2_ar_tok_s_bs1"],
            m["smollm2_tree32_speedup_vs_ar_bs1"],
            f"; {m['smollm2_tree32_mean_accepted']:.2f} tokens per round",
        ),
    ),
    Headline(
        "rounds_h200.json",
        "Llama-3.1-8B (synthetic)",
        "1",
        "AR step at 1k cached tokens vs gpt-fast's, back to back in one process",
        # The ratio's own run (its AR step may be from a later re-measure of the llama8b part).
        lambda m: (
            f"gpt-fast {m['llama8b_gptfast_step_ms_bs1']:.2f} ms; "
            f"ours {m['llama8b_ar_speedup_vs_gptfast_bs1']:.2f}x faster"
        ),
    ),
    Headline(
        "eagle3_tau_cpu.json",
        "SmolLM2-135M + the shipped EAGLE-3 drafter",
        "1",
        "tokens per round on MT-Bench turn 1 (never trained on; replay in float32): tree (32 nodes, depth 6) vs "
        "chain (6)",
        lambda m: _vs(m["tau_tree32_mtbench"], m["tau_chain6_mtbench"], "", m["tau_ratio_tree32_chain6_mtbench"]),
    ),
    Headline(
        "w12_ar_h200.json",
        "Llama-3.1-8B, W12 weights (synthetic)",
        "1",
        "AR step vs BF16",
        lambda m: _vs(m["llama8b_w12_step_ms"], m["llama8b_bf16_step_ms"], " ms", m["ar_speedup_bs1_llama8b"]),
    ),
    Headline(
        "colocate_h200.json",
        "Llama-3.1-8B / Llama-3.2-1B (synthetic)",
        "8",
        "co-located round vs conventional round",
        lambda m: _vs(
            m["round_us_two_stream_llama8b_1b"] / 1000,
            m["round_us_conventional_llama8b_1b"] / 1000,
            " ms",
            m["round_speedup_llama8b_1b"],
        ),
    ),
    Headline(
        "w12_bits_cpu.json",
        "SmolLM2-135M, W12",
        "-",
        "bits per weight (lossless)",
        lambda m: f"{m['smollm2_135m.linear.bits_per_weight']:.2f}",
    ),
)


class _Reads(dict):
    """A metrics dict that remembers which keys a row's result read."""

    def __init__(self, metrics: dict):
        super().__init__(metrics)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def gpu_label(gpu: str) -> str:
    """'NVIDIA H200' -> 'H200', 'cpu' -> 'CPU'."""
    return "CPU" if gpu.lower() == "cpu" else gpu.removeprefix("NVIDIA ").strip()


def render_headline(results_dir: Path, rows: Sequence[Headline] = HEADLINES) -> str:
    """The headline table (markdown) from the files in ``results_dir``; raises ``HeadlineError`` for a
    missing file or metric."""
    lines = [
        "| GPU | model | batch | what was measured | result | commit |",
        "|---|---|---:|---|---|---|",
    ]
    docs: dict[str, dict] = {}
    for row in rows:
        if row.file not in docs:
            path = results_dir / row.file
            if not path.is_file():
                raise HeadlineError(f"headline row {row.what!r} needs {path}, which does not exist")
            docs[row.file] = json.loads(path.read_text())
        doc = docs[row.file]
        metrics = _Reads(doc.get("metrics", {}))
        try:
            cell = row.result(metrics)
        except KeyError as e:
            raise HeadlineError(f"headline row {row.what!r}: {row.file} has no metric {e.args[0]!r}") from None
        # A merged file (benchmarks/merge_results.py) says which run measured each metric.
        by_metric = doc.get("metric_commits", {})
        commits = sorted({str(by_metric[m])[:7] for m in metrics.read if m in by_metric})
        dirty = doc.get("dirty")
        if commits and doc.get("runs"):  # dirty only if a run that measured the row's metrics was
            dirty = any(r.get("dirty") for r in doc["runs"] if str(r.get("commit"))[:7] in commits)
        commits = commits or [str(doc.get("commit", "unknown"))[:7]]
        commit = ", ".join(f"`{c}`" for c in commits) + (" (dirty)" if dirty else "")
        gpu = gpu_label(str(doc.get("gpu", "?")))
        lines.append(f"| {gpu} | {row.model} | {row.batch} | {row.what} | {cell} | {commit} |")
    return "\n".join(lines) + "\n"
