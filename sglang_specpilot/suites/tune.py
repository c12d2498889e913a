"""Tune suite (one GPU, issue 17): ``specpilot tune``'s loop on the lifted 8B stand-in, from stock.

The model is built as the e2e suite builds it (``stand_in.py``: SmolLM2-135M lifted to Llama-3.1-8B shapes,
a timing stand-in, with its EAGLE-3 drafter lifted along); one ``EngineBackend`` over it serves every part.
Stock is the engine's default speculative options with that drafter (a chain of ``num_speculative_tokens``),
at batch 1. The parts (``--parts``), each a tuning run in its own folder under ``--work``, so a killed part
resumes from its ``state.json`` in the next device call and a finished one is read back, not re-run:

- ``cold``: the tuner with its cost model from stock and an empty memory (``WORK/memory``); its confirmed
  promotions are written to that memory. ``tune_final_speedup_vs_stock_bs1_lifted8b`` is its sealed final
  (stock vs tuned on HumanEval 100-115, prompts no proposer saw); ``tune_device_minutes`` its own time.
- ``manual``: the tuned system against the best hand-picked configuration of the e2e table (the e2e
  results file's batch-1 pick, ``--manual-from``) and stock, paired and interleaved on the sealed-final
  prompts in one run: ``tune_final_over_best_manual_bs1_lifted8b``.
- ``memory``: a second deployment (a fresh tuning folder) started from a memory: the cold run's own
  (``WORK/memory``: the same deployment again), or with ``--memory-from DIR`` another deployment's, e.g. the
  real SmolLM2 started from what the lifted 8B's cold run promoted (another model, as the issue's reuse rule
  asks). Its entries are timed first, the search goes on from what won. Candidates timed to reach
  its final (through the round that promoted it), against the cold run's: ``tune_memory_candidates_{cold,
  reuse}`` and ``..._saved``; ``..._timed_{cold,reuse}`` count every candidate, the confirming rounds too.
- ``ablation``: the cold run's settings without the cost model (each round's "largest factor" replaced by
  the most visible gap, tokens per step), ``tune_single_loop_ablation`` beside the cost model's final.

``--edits`` restricts the searched edit kinds (default: every kind but W12's, whose conversion of the 8B
alone took 98 s of a 10-minute device call in the e2e suite; the W12 GEMM loses to cuBLAS at the 16-64 rows a
tree verifies, w12_gemm_h200.json). No part starts past ``--deadline-s``; the results file is rewritten after
each part. On the CPU (``--device cpu --target tiny``) it checks the bookkeeping; the times mean nothing.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from ..harness.bench import register_suite
from .common import Progress, RunLog
from .stand_in import add_model_args

PARTS = ("cold", "manual", "memory", "ablation")
DEFAULT_EDITS = "gamma,tree,chain,compile,cuda_graphs,ladder"


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="llama-3.1-8b", help="llama-3.1-8b (the lifted stand-in), smollm2, tiny")
    p.add_argument("--model", default=None, help="SmolLM2 GGUF or folder (default: the embedded one)")
    p.add_argument("--draft", default=None, help="EAGLE-3 drafter folder trained for SmolLM2 (lifted with it)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--work", default="specpilot-tune-suite", help="folder of the parts' tuning runs (resumable)")
    p.add_argument("--prompts", default="humaneval:0-15", help="tuning prompts (never mtbench)")
    p.add_argument("--final-prompts", default="humaneval:100-115", help="sealed-final prompts")
    p.add_argument("--budget-minutes", type=float, default=5.0, help="per tuning run: no round starts after it")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--candidates", type=int, default=8)
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--screen-blocks", type=int, default=6)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--edits", default=DEFAULT_EDITS, help="edit kinds searched (comma list; 'all' for every kind)")
    p.add_argument("--manual-from", default="benchmarks/results/e2e_h200.json",
                   help="e2e results file whose batch-1 pick is the best hand-picked configuration")  # fmt: skip
    p.add_argument("--manual", default=None, help="or the hand-picked tree N,D,K itself")
    p.add_argument("--memory-from", default=None,
                   help="the memory part's store: another deployment's memory folder (default: WORK/memory, "
                   "this deployment's cold run)")  # fmt: skip
    p.add_argument("--deadline-s", type=float, default=540.0, help="no part starts after this many seconds")
    add_model_args(p, dtype_help="bfloat16 on the GPU")


def metric_suffix(target: str) -> str:
    return {"llama-3.1-8b": "_lifted8b", "smollm2": "_smollm2"}.get(target, "_" + target.replace("-", "_"))


def manual_delta(args) -> tuple[dict, str]:
    """The best hand-picked configuration: ``--manual N,D,K``, else the e2e table's batch-1 pick."""
    if args.manual:
        n, d, k = (int(x) for x in args.manual.split(","))
        return {"tree_budget": n, "tree_depth": d, "tree_top_k": k}, f"--manual {args.manual}"
    path = Path(args.manual_from)
    if not path.exists():
        raise SystemExit(f"--manual-from {path}: no such e2e results file (or pass --manual N,D,K)")
    doc = json.loads(path.read_text())
    row = [r for r in doc.get("table", []) if r.get("batch") == 1 and r.get("system") not in ("ar",)]
    if not row:
        raise SystemExit(f"--manual-from {path}: no batch-1 speculative rows in its table")
    # The e2e table's fastest batch-1 system (tokens/s, geometric over its prompt sets): its setting.
    from .e2e_results import geomean

    by_sys: dict[str, list[float]] = {}
    for r in row:
        by_sys.setdefault(r["system"], []).append(r["tokens_per_s"])
    best = max(by_sys, key=lambda s: geomean(by_sys[s]))
    setting = next(r["setting"] for r in row if r["system"] == best)
    return parse_setting(setting), f"{path} batch-1 {best}: {setting}"


def parse_setting(setting: str) -> dict:
    """An e2e table setting ('tree N=32 D=3 K=8', 'chain gamma=3') as EngineOptions fields."""
    words = dict(w.split("=") for w in setting.split() if "=" in w)
    if setting.startswith("tree") and not {"N", "D", "K"} - set(words) and "TLV" not in setting:
        return {"tree_budget": int(words["N"]), "tree_depth": int(words["D"]), "tree_top_k": int(words["K"])}
    if setting.startswith("chain") and "gamma" in words:
        return {"num_speculative_tokens": int(words["gamma"])}
    raise SystemExit(f"cannot run the e2e setting {setting!r} as a hand-picked configuration")


def candidates_timed(res: dict) -> int:
    """Distinct candidate systems a tuning run timed to reach its final (screens, stacks; not stock)."""
    ids = set()
    for rnd in res.get("rounds", []):
        ids |= {(rnd["round"], s["id"]) for s in rnd.get("screened", [])}
        if rnd.get("stack"):
            ids.add((rnd["round"], rnd["stack"]["id"]))
    return len(ids)


def candidates_to_final(rounds: list[dict]) -> int:
    """Candidates timed up to and including the round that promoted the final system (the issue's "to reach
    its final"); the rounds after it, which promoted nothing, only confirmed it. 0 when nothing was promoted."""
    last = max((i for i, r in enumerate(rounds) if r.get("promoted")), default=None)
    if last is None:
        return 0
    return sum(len(r.get("screened", [])) + bool(r.get("stack")) for r in rounds[: last + 1])


def run_summary(res: dict, doc: dict, elapsed_s: float) -> dict:
    final = res["final"]
    t = final.get("timing") or {}
    return {
        "best": res["best"],
        "confirmed": bool(final.get("confirmed")),
        "applied": doc["applied_reason"],
        "speedup_vs_stock": 1 + t["gain"] if t else 1.0,
        "speedup_vs_ar": 1 + t["vs_ar"]["gain"] if t.get("vs_ar") else None,
        "stock_vs_ar": 1 + t["stock_vs_ar"]["gain"] if t.get("stock_vs_ar") else None,
        "final_ms": t.get("ms"),
        "rounds": [
            {k: r.get(k) for k in ("round", "memory_only", "largest", "promoted", "legal_edits", "stopped")}
            | {"screened": [(s["id"], round(s["gain"], 4)) for s in r.get("screened", [])]}
            for r in res["rounds"]
        ],
        "candidates_timed": candidates_timed(res),
        "candidates_to_final": candidates_to_final(res["rounds"]),
        "stock_noise": res["stock_noise"],
        "costmodel_validation": {k: res["validation"][k] for k in ("n", "error_median", "error_max")},
        "minutes": elapsed_s / 60,
    }


class _Run(RunLog):
    suite = "tune"
    error_key = "part"

    def __init__(self, args: argparse.Namespace):
        from ..harness.bench import default_run_dir, gpu_name, gpu_slug

        self.args, self.say = args, Progress("tune")
        self.dev = torch.device(args.device)
        if args.results_dir is None:
            args.results_dir = default_run_dir("tune")
        self.path = Path(args.results_dir) / f"tune_{gpu_slug(gpu_name(self.dev))}.json"
        self.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
        bad = set(self.parts) - set(PARTS)
        if bad:
            raise SystemExit(f"--parts: unknown {sorted(bad)} (use {', '.join(PARTS)})")
        self.work = Path(args.work)
        self.sfx = metric_suffix(args.target)
        self.out: dict = {"metrics": {}, "rows": [], "errors": [], "skipped": [], "runs": {}}
        self.out["settings"] = {k: getattr(args, k) for k in ("target", "prompts", "final_prompts", "budget_minutes",
                                "rounds", "candidates", "blocks", "screen_blocks", "new_tokens", "edits")}  # fmt: skip

    # ---- the deployment ----------------------------------------------------------------------------
    def load(self) -> None:
        from ..config import EngineOptions
        from ..controller.tune_backend import EngineBackend
        from ..controller.tune_cli import _prompt_ids, check_sets
        from ..drafters import default_drafter_path
        from ..engine.engine import scratch_slots
        from .stand_in import load_stand_in

        a = self.args
        check_sets(a.prompts, a.final_prompts)
        a.draft = a.draft or str(default_drafter_path())
        base = dict(device=a.device, dtype=a.dtype, max_seq_len=a.max_seq_len, max_batch_size=1)
        base["compile"] = False if a.no_compile else None
        self.stock = EngineOptions(draft=a.draft, **base)
        wide = [replace(self.stock, tree_budget=64, tree_depth=8, tree_top_k=8), replace(self.stock,
                num_speculative_tokens=8)]  # fmt: skip
        m = load_stand_in(a, self.dev, a.max_seq_len + max(scratch_slots(o) for o in wide), self.say)
        self.out["model"] = m.info
        self.say(f"model: {m.info['label']} ({m.info['params_b']} B), drafter {m.info['drafter_params_m']} M")
        self.backend = EngineBackend(self.stock, new_tokens=a.new_tokens, models=(m.target, m.drafter, m.tok))
        vocab = m.target.cfg.vocab_size
        self.tp = _prompt_ids(a.prompts, vocab, m.tok, chat=True)
        self.fp = _prompt_ids(a.final_prompts, vocab, m.tok, chat=True, seed=1)

    def config(self, use_cost_model: bool = True):
        from ..controller.tune_loop import TuneConfig

        a = self.args
        kinds = None if a.edits == "all" else tuple(k.strip() for k in a.edits.split(",") if k.strip())
        return TuneConfig(rounds=a.rounds, candidates=a.candidates, blocks=a.blocks, screen_blocks=a.screen_blocks,
                          budget_s=a.budget_minutes * 60, kinds=kinds, use_cost_model=use_cost_model,
                          extra={"deployment": self.backend.describe(), "prompts": a.prompts,
                                 "final_prompts": a.final_prompts, "new_tokens": a.new_tokens})  # fmt: skip

    def tune(self, name: str, use_cost_model: bool = True, seeds=()) -> dict:
        """One tuning run in WORK/name (resumed if killed, read back if done); its summary."""
        from ..controller.tune_loop import Tuner
        from ..controller.tune_profile import write

        done = self.work / name / "summary.json"
        if done.exists():
            self.say(f"{name}: read back from {done}")
            return json.loads(done.read_text())
        self.say(f"{name}: tuning (budget {self.args.budget_minutes} min, seeds {[n for n, _ in seeds]})")
        self.backend.gen_log.clear()  # this run's generations only (``generations`` below)
        tuner = Tuner(self.backend, self.tp, self.fp, self.work / name, self.config(use_cost_model), seeds=seeds)
        res = tuner.run()
        doc = write(self.work / name, res, self.backend.describe(), self.backend.stock)
        summary = run_summary(res, doc, tuner.state.data["elapsed_s"])
        summary |= {"result": res, "measured_now": res["measured_now"], "resumed": res["resumed_measurements"],
                    "generations": self.backend.gen_summary()}  # fmt: skip
        done.write_text(json.dumps(summary, indent=1, default=str))
        if name == "cold":
            from ..controller.tune_memory import remember

            paths = remember(self.work / "memory", res, doc, self.backend.stock)
            # A run that promoted nothing leaves an empty store, not a missing one: the memory part (and
            # another deployment's --memory-from) then reuses no entries instead of failing. On the CPU the
            # cold run's two candidates lose to stock within noise now and then (CI, 6bb16ca).
            (self.work / "memory").mkdir(parents=True, exist_ok=True)
            self.say(f"memory: {len(paths)} entries written")
        self.say(f"{name}: final {summary['best']} x{summary['speedup_vs_stock']:.3f} vs stock, "
                 f"{summary['candidates_timed']} candidates, {summary['minutes']:.1f} min")  # fmt: skip
        return summary

    def cold_summary(self, needed_by: str | None = None) -> dict | None:
        """The cold run's summary; None when it has not run, or an error naming the part that needs it."""
        path = self.work / "cold" / "summary.json"
        if path.exists():
            return json.loads(path.read_text())
        if needed_by:
            raise RuntimeError(f"the {needed_by} part needs the cold run (part cold) first")
        return None

    def keep_run(self, name: str, summary: dict, **extra) -> None:
        self.out["runs"][name] = {k: v for k, v in summary.items() if k != "result"} | extra

    # ---- parts -------------------------------------------------------------------------------------
    def part(self, name: str) -> None:
        m, s = self.out["metrics"], self.sfx
        if name == "cold":
            r = self.tune("cold")
            self.keep_run("cold", r)
            m[f"tune_final_speedup_vs_stock_bs1{s}"] = round(r["speedup_vs_stock"], 4)
            if r["speedup_vs_ar"]:
                m[f"tune_final_speedup_vs_ar_bs1{s}"] = round(r["speedup_vs_ar"], 4)
            m["tune_device_minutes"] = round(r["minutes"], 2)
            m["tune_final_confirmed"] = int(r["confirmed"])
            m["tune_memory_candidates_cold"] = r["candidates_to_final"]
            m["tune_memory_candidates_timed_cold"] = r["candidates_timed"]
        elif name == "manual":
            self.manual()
        elif name == "memory":
            from ..controller.tune_memory import seeds

            c = self.cold_summary(needed_by="memory")
            store = Path(self.args.memory_from) if self.args.memory_from else self.work / "memory"
            if not store.is_dir():
                raise RuntimeError(f"--memory-from {store}: no such memory folder")
            sd = seeds(store, self.backend.stock)
            self.say(f"memory: {len(sd)} applicable entries from {store}")
            r = self.tune("memory_reuse", seeds=sd)
            self.keep_run("memory_reuse", r, seeds=sd, memory_from=str(store),
                          other_deployment=bool(self.args.memory_from))  # fmt: skip
            m["tune_memory_from_other_deployment"] = int(bool(self.args.memory_from))
            # The count: candidates timed to reach the final; every candidate timed beside it.
            m["tune_memory_candidates_cold"] = c["candidates_to_final"]
            m["tune_memory_candidates_reuse"] = r["candidates_to_final"]
            m["tune_memory_reuse_candidates_saved"] = c["candidates_to_final"] - r["candidates_to_final"]
            m["tune_memory_candidates_timed_cold"] = c["candidates_timed"]
            m["tune_memory_candidates_timed_reuse"] = r["candidates_timed"]
            m["tune_memory_reuse_same_final"] = int(r["best"] == c["best"])
            m[f"tune_memory_reuse_speedup_vs_stock_bs1{s}"] = round(r["speedup_vs_stock"], 4)
        elif name == "ablation":
            r = self.tune("ablation", use_cost_model=False)
            self.keep_run("ablation", r)
            m["tune_single_loop_ablation"] = round(r["speedup_vs_stock"], 4)
            c = self.cold_summary()
            if c is not None:
                m["tune_single_loop_ablation_cost_model"] = round(c["speedup_vs_stock"], 4)

    def manual(self) -> None:
        from ..controller import judge

        done = self.work / "manual.json"
        if done.exists():
            self.say(f"manual: read back from {done}")
            rec = json.loads(done.read_text())
            self.out["rows"].append(rec)
            self.out["metrics"][f"tune_final_over_best_manual_bs1{self.sfx}"] = rec["tuned_over_manual"]
            return
        tuned = self.cold_summary(needed_by="manual")["best"]
        delta, source = manual_delta(self.args)
        from ..controller.option_space import normalize

        delta = normalize(self.backend.stock, delta)
        self.say(f"manual: tuned {tuned} vs hand-picked {delta} ({source}) vs stock, {self.args.blocks} blocks")
        variants = {"stock": {}, "tuned": tuned, "manual": delta}
        if tuned == delta:
            variants = {"stock": {}, "tuned": tuned}  # the same system: its ratio is 1 by construction
        self.backend.gen_log.clear()
        times = judge.time_variants(self.backend, variants, self.fp, self.args.blocks)
        ms = {n: times.median(n) * 1e3 for n in variants}
        rec = {"case": "manual", "tuned": tuned, "manual": delta, "manual_source": source, "median_ms": ms,
               "stock_vs_tuned": judge.timing_record(times, "stock", "tuned"),
               "generations": self.backend.gen_summary()}  # fmt: skip
        if "manual" in variants:
            rec["manual_vs_tuned"] = judge.timing_record(times, "manual", "tuned")
            rec["stock_vs_manual"] = judge.timing_record(times, "stock", "manual")
            ratio = 1 + rec["manual_vs_tuned"]["gain"]
        else:
            ratio = 1.0
        rec["tuned_over_manual"] = round(ratio, 4)
        done.write_text(json.dumps(rec, indent=1, default=str))
        self.out["rows"].append(rec)
        self.out["metrics"][f"tune_final_over_best_manual_bs1{self.sfx}"] = round(ratio, 4)
        self.say(f"manual: tuned over hand-picked x{ratio:.3f} (median ms {ms})")

    def run(self) -> dict:
        try:
            self.load()
        except Exception as e:
            self.error("load", e)
            return self.out
        for name in self.parts:
            if self.past_deadline(name):
                continue
            try:
                self.part(name)
            except Exception as e:
                self.error(name, e)
            self.write(name)
        if self.args.target != "llama-3.1-8b":  # the unsuffixed names are the 8B's: a merge keeps both
            m = self.out["metrics"]
            self.out["metrics"] = {k if k.endswith(self.sfx) else k + self.sfx: v for k, v in m.items()}
        self.out["log"] = self.say.lines
        self.say(f"done: {self.out['metrics']}")
        return self.out


@register_suite("tune", add_args=_args)
def tune(args: argparse.Namespace) -> dict:
    """`specpilot tune` on the lifted 8B stand-in from stock: cold, vs hand-picked, from memory, ablation."""
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("the tune suite needs a CUDA GPU (--device cpu --target tiny checks its bookkeeping)")
    return _Run(args).run()
