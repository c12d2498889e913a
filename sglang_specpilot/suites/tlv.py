"""TLV suite (one GPU, issue 16): two-level verification + trees + W12 against trees + W12, in one run.

Per target of ``--targets`` (default: the lifted 8B stand-in, then the real SmolLM2; each built as
``suites/e2e.py`` builds it, with its EAGLE-3 drafter and a W12 twin of the target), these steps; every
target's load, engines and timed steps run first, then every target's forcing, then every target's
steps, then the replays, so a deadline cuts the cross-checks before the headline:

1. engines: trees + W12 with the best single-draft tree ``--tree N,D,K`` (the e2e suite's batch-1 pick
   on the H200: N 32, D 6, K 8), and TLV + trees + W12 at the same exact-pass node budget N (a Q chain of
   ``--chain-len`` L, ``--root-budget`` R nodes of a tree from the root, N - L - R hanging from the
   chain's end, the same drafter lattice D, K). Each is captured at batch 1 and warmed up untimed.
2. timed: batch 1, greedy, ``--new-tokens`` per prompt with EOS ignored, the two engines interleaved
   prompt by prompt with the order alternating. tokens/s end to end (prefill included) gives
   ``tlv_e2e_speedup_vs_trees_w12_bs1`` (geometric mean over the prompt sets); tokens per exact pass (the
   rounds' tokens over their rounds: each round of either engine is one exact pass) gives
   ``tlv_tokens_per_exact_pass_ratio``; the two texts are compared (lossless: they must be equal):
   ``tlv_mismatched_prompts_vs_trees``.
3. forcing: in bf16 kernel rounding can tip a near-tie, so unequal texts are judged by token forcing
   (``harness/token_forcing.py``, as the e2e suite judges its systems): a plain BF16 AR engine on the
   same target (e2e's ``{"kind": "ar"}``, captured, untimed) generates its greedy text on the timed
   prompts; AR's, trees + W12's and TLV's texts are scored by AR's target (teacher forcing), and each
   system's report is compared with AR's own: ``tlv_forcing_accepted`` and ``trees_w12_forcing_accepted``
   (1: no more large-margin mismatches than AR's, a rate within AR's + 0.5 points), and
   ``tlv_mismatched_prompts_vs_ar``; the ``forcing`` row holds every report (rate, large-margin count,
   first mismatches) and verdict.
4. steps: one Q step and one exact verify step of the TLV engine, each one CUDA graph, at the prompts'
   typical context (``suites/tlv_steps.py``): ``tlv_q_pass_over_exact_pass``; and both engines' whole
   captured rounds.
5. replay: ``specpilot tau``'s TLV replay (``harness/tlv_replay.py``) on ``--replay-prompts`` prompts:
   ``tlv_q_chain_agreement`` (the engine does not count it) and the replayed ratio as a cross-check.

Metrics of the lifted 8B carry the issue's names; every other target's carry ``_<target>`` (e.g.
``tlv_e2e_speedup_vs_trees_w12_bs1_smollm2``). Robustness: the results file is rewritten as each step
finishes (``"partial"`` names the last), a failing step is recorded under ``errors`` with its target and
the rest go on, and no step starts past ``--deadline-s`` (skipped steps are listed), so the run ends
inside one ~8-minute device call. On the CPU (``--device cpu``, tiny models) the timings mean nothing;
the run checks the bookkeeping.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ..harness.bench import register_suite
from .common import Progress, RunLog
from .e2e_results import geomean, median
from .stand_in import add_model_args

NEEDS = {
    "engines": (),
    "timed": ("trees_w12", "tlv"),
    "forcing": ("trees_w12", "tlv"),  # their timed texts, that is
    "steps": ("trees_w12", "tlv"),
    "replay": ("trees_w12",),
}


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--targets", default="llama-3.1-8b,smollm2", help="comma list: llama-3.1-8b, smollm2, tiny")
    p.add_argument("--model", default=None, help="SmolLM2 GGUF or folder (default: the embedded one)")
    p.add_argument("--draft", default=None, help="EAGLE-3 drafter folder trained for SmolLM2 (lifted with it)")
    p.add_argument("--tree", default="32,6,8", help="the best single-draft tree N,D,K (e2e's batch-1 pick)")
    p.add_argument("--chain-len", type=int, default=4, help="TLV Q-chain tokens L")
    p.add_argument("--root-budget", type=int, default=0, help="TLV nodes of a drafter tree from the root")
    p.add_argument("--sets", default="humaneval,mtbench", help="prompt sets: humaneval, mtbench, synthetic")
    p.add_argument("--humaneval", default="100-131", help="HumanEval problems of the humaneval set")
    p.add_argument("--prompts-per-set", type=int, default=4, help="timed prompts per set")
    p.add_argument("--warm-prompts", default="humaneval:132-133", help="untimed warm-up prompts (as e2e's tune)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--replay-prompts", type=int, default=2, help="timed prompts of the first set replayed")
    p.add_argument("--step-iters", type=int, default=20, help="replays per step / round timing")
    p.add_argument(
        "--deadline-s",
        type=float,
        default=360.0,
        help="seconds into the run after which no step starts (the e2e suite's W12 engine setup, its longest "
        "step, took 98 s on the H200: the run ends inside 8 minutes)",
    )
    add_model_args(p, dtype_help="W12 needs bfloat16")


def parse_tree(text: str) -> tuple[int, int, int]:
    try:
        n, d, k = (int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"--tree: expected N,D,K, got {text!r}") from None
    return n, d, k


def suffix(target: str) -> str:
    """Metric-name suffix of a target: none for the lifted 8B (the issue's names), ``_<target>`` else."""
    return "" if target == "llama-3.1-8b" else "_" + target.replace("-", "_").replace(".", "_")


def speed(runs: list[dict]) -> dict:
    """Pooled stats of timed runs: tokens/s (end to end and decode phase) and tokens per exact pass."""
    tokens = sum(sum(r["tokens"]) for r in runs)
    rounds = sum(sum(r["rounds"]) for r in runs)
    return {
        "tokens_per_s": tokens / sum(r["wall_s"] for r in runs),
        "decode_tokens_per_s": tokens / sum(r["decode_s"] for r in runs),
        "tokens_per_exact_pass": sum(sum(r["round_tokens"]) for r in runs) / rounds if rounds else None,
        "rounds": rounds,
    }


class _Run(RunLog):
    suite = "tlv"
    error_key = "step"  # the suite runs steps (engines, timings, replays), and its records name them

    def __init__(self, args: argparse.Namespace):
        from ..harness.bench import default_run_dir, gpu_name, gpu_slug

        self.args, self.say = args, Progress("tlv")
        self.dev = torch.device(args.device)
        self.cuda = self.dev.type == "cuda"
        self.tree = parse_tree(args.tree)
        self.hang = self.tree[0] - args.chain_len - args.root_budget
        if self.hang < 1:
            raise SystemExit(f"--tree N {self.tree[0]} leaves no hanging node after --chain-len + --root-budget")
        if args.results_dir is None:  # the partial files and the runner's final file share one folder
            args.results_dir = default_run_dir("tlv")
        self.path = Path(args.results_dir) / f"tlv_{gpu_slug(gpu_name(self.dev))}.json"
        self.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
        self.out: dict = {"metrics": {}, "rows": [], "errors": [], "skipped": [], "targets": {}}
        n, d, k = self.tree
        self.out["config"] = {
            "trees_w12": {"tree_budget": n, "tree_depth": d, "tree_top_k": k},
            "tlv": {"tlv_chain_len": args.chain_len, "tlv_hang_budget": self.hang, "tlv_root_budget": args.root_budget},
            "exact_pass_nodes": n,
        }

    # ---- bookkeeping -------------------------------------------------------------------------------
    # ---- one target --------------------------------------------------------------------------------
    def e2e_run(self, target: str):
        """The e2e suite's model builder and prompt sets for ``target`` (the lift, the drafter, W12)."""
        from .e2e import _Run as E2ERun

        a = self.args
        n, d, k = self.tree
        ns = argparse.Namespace(
            **{k_: v for k_, v in vars(a).items() if k_ not in ("targets", "tree")},
            target=target,
            batches="1",
            systems="ar,trees,w12",
            skip_w12=False,
            gammas="3",
            tree_grid=f"{n}:{d}:{k}",
            tune_prompts=a.warm_prompts,
            round_iters=a.step_iters,
        )
        run = E2ERun(ns, suite="tlv")
        run.say = self.say
        return run

    def engines(self, run, engines: dict) -> None:
        """Build, capture and warm both engines into ``engines``, trees + W12 first: if TLV's setup fails,
        the replay (which needs only the trees engine's greedy text) still runs."""
        from ..config import EngineOptions
        from ..engine import Engine

        n, d, k = self.tree
        a = self.args
        base = {**run.base_options(), "weights": "w12", "tree_budget": n, "tree_depth": d, "tree_top_k": k}
        tlv = dict(tlv=True, tlv_chain_len=a.chain_len, tlv_hang_budget=self.hang, tlv_root_budget=a.root_budget)
        for name, opts in (("trees_w12", base), ("tlv", {**base, **tlv})):
            t0 = time.perf_counter()
            eng = Engine(run.target_w12, run.tok, EngineOptions(**opts), run.drafter)
            run.capture(eng, 1)
            run.generate(eng, self.warm[:1], 16)  # untimed: first use of every path (and of W12's configs)
            engines[name] = eng
            self.rows.append({"case": "setup", "system": name, "seconds": time.perf_counter() - t0})
            self.say(f"{name}: captured and warmed in {time.perf_counter() - t0:.1f} s")

    def timed(self, run, engines: dict, sets: dict) -> dict:
        a, names = self.args, list(engines)
        runs: dict[tuple[str, str], list[dict]] = {}
        for si, (set_name, prompts) in enumerate(sets.items()):
            for i, p in enumerate(prompts[: a.prompts_per_set]):
                if self.past_deadline(f"{self.target}.timed.{set_name}.{i + 1}"):
                    break  # both systems ran the same prompts so far: their ratios stay paired
                pair = {}
                try:
                    for name in names if (i + si) % 2 == 0 else names[::-1]:  # no system always first
                        pair[name] = run.generate(engines[name], [p], a.new_tokens)
                except Exception as e:  # a prompt counts only where both ran it; stop at the first failure
                    self.error("timed", e, target=self.target, set=set_name, prompt=i)
                    return self.cells(runs)
                for name, res in pair.items():
                    runs.setdefault((name, set_name), []).append(res)
                self.say(
                    f"{self.target} {set_name} {i + 1}: "
                    + ", ".join(f"{n} {r['wall_s']:.3f}s" for n, r in pair.items())
                )
        return self.cells(runs)

    def cells(self, runs: dict) -> dict:
        cells = {}
        for (name, set_name), rs in runs.items():
            ids = [t for r in rs for t in r["token_ids"]]
            cells.setdefault(set_name, {})[name] = {**speed(rs), "token_ids": ids}
            self.rows.append(
                {
                    "case": "timed",
                    "system": name,
                    "set": set_name,
                    **{k: [r[k] for r in rs] for k in ("wall_s", "decode_s", "tokens", "rounds", "round_tokens")},
                    **speed(rs),
                }
            )
        return cells

    def timed_metrics(self, cells: dict) -> None:
        s, m = suffix(self.target), self.out["metrics"]
        both = {k: c for k, c in cells.items() if "tlv" in c and "trees_w12" in c}
        if not both:
            return
        m[f"tlv_e2e_speedup_vs_trees_w12_bs1{s}"] = round(
            geomean([c["tlv"]["tokens_per_s"] / c["trees_w12"]["tokens_per_s"] for c in both.values()]), 4
        )
        m[f"tlv_decode_speedup_vs_trees_w12_bs1{s}"] = round(
            geomean([c["tlv"]["decode_tokens_per_s"] / c["trees_w12"]["decode_tokens_per_s"] for c in both.values()]), 4
        )
        per_pass = {}
        for name in ("tlv", "trees_w12"):
            tok = sum(c[name]["tokens_per_exact_pass"] * c[name]["rounds"] for c in both.values())
            per_pass[name] = tok / sum(c[name]["rounds"] for c in both.values())
            m[f"{name}_tokens_per_exact_pass{s}"] = round(per_pass[name], 4)
        m[f"tlv_tokens_per_exact_pass_ratio{s}"] = round(per_pass["tlv"] / per_pass["trees_w12"], 4)
        # Greedy and lossless: TLV's text must be trees + W12's, token for token.
        m[f"tlv_mismatched_prompts_vs_trees{s}"] = sum(
            x != y
            for c in both.values()
            for x, y in zip(c["tlv"]["token_ids"], c["trees_w12"]["token_ids"], strict=True)
        )

    def forcing(self, run, sets: dict, cells: dict) -> None:
        """Token forcing of both systems' timed texts against a plain BF16 AR engine's on the same prompts."""
        from ..harness.token_forcing import compare_forcing
        from .e2e import _brief
        from .e2e_results import merge_reports

        s, m = suffix(self.target), self.out["metrics"]
        both = {k: c for k, c in cells.items() if "tlv" in c and "trees_w12" in c}
        if not both:
            raise RuntimeError("no timed texts to score (the timed step ran no prompt)")
        ar = run.engine({"kind": "ar"})  # e2e's reference engine; run.forcing scores with its target
        run.capture(ar, 1)
        run.generate(ar, self.warm[:1], 16)  # untimed: first use of every path
        texts: dict[str, list] = {"ar": [], "trees_w12": [], "tlv": []}
        prompts = []
        for set_name, c in both.items():
            # timed() runs a set's prompts in order, both systems or neither: its texts are of the first ones
            ps = sets[set_name][: len(c["tlv"]["token_ids"])]
            prompts += ps
            texts["ar"] += [run.generate(ar, [p], self.args.new_tokens)["token_ids"][0] for p in ps]
            for name in ("trees_w12", "tlv"):
                texts[name] += c[name]["token_ids"]
        reps = {
            name: merge_reports([run.forcing(p, t) for p, t in zip(prompts, ids, strict=True)])
            for name, ids in texts.items()
        }
        row = {"case": "forcing", "prompts": len(prompts), "ar": _brief(reps["ar"])}
        for name in ("trees_w12", "tlv"):
            verdict = compare_forcing(reps[name], reps["ar"])
            mismatched = sum(x != y for x, y in zip(texts[name], texts["ar"], strict=True))
            m[f"{name}_forcing_accepted{s}"] = int(verdict.accepted)
            row[name] = {
                "report": _brief(reps[name]),
                "verdict": verdict.to_dict(),
                "mismatched_prompts_vs_ar": mismatched,
            }
        m[f"tlv_mismatched_prompts_vs_ar{s}"] = row["tlv"]["mismatched_prompts_vs_ar"]
        self.rows.append(row)
        verdicts = {n: "accepted" if row[n]["verdict"]["accepted"] else "REJECTED" for n in ("trees_w12", "tlv")}
        self.say(f"{self.target} forcing: {verdicts}")

    def steps(self, run, engines: dict, context: int) -> None:
        from .tlv_steps import step_fns, step_ms

        s, m, it = suffix(self.target), self.out["metrics"], self.args.step_iters
        q_step, exact_step = step_fns(engines["tlv"], context)
        q_ms, exact_ms = step_ms(q_step, it, self.cuda), step_ms(exact_step, it, self.cuda)
        m[f"tlv_q_pass_over_exact_pass{s}"] = round(median(q_ms) / median(exact_ms), 4)
        rounds = {name: run.round_ms(eng, 1, context) for name, eng in engines.items()}
        m[f"tlv_round_over_trees_w12_round{s}"] = round(median(rounds["tlv"]) / median(rounds["trees_w12"]), 4)
        self.rows.append(
            {"case": "steps", "context": context, "q_step_ms": q_ms, "exact_step_ms": exact_ms, "round_ms": rounds}
        )
        self.say(f"{self.target} steps: Q {median(q_ms):.3f} ms, exact {median(exact_ms):.3f} ms")

    def replay(self, engines: dict, prompts: list[list[int]]) -> None:
        from ..harness.tau_replay import tau_report
        from ..harness.tlv_replay import TLVReplay

        a, (n, d, k) = self.args, self.tree
        s, m = suffix(self.target), self.out["metrics"]
        t0 = time.perf_counter()
        # Its greedy text from the trees engine (lossless: AR's); its lattices and Q chains eager.
        tlv = TLVReplay(a.chain_len, a.root_budget)
        rep = tau_report(engines["trees_w12"], self.drafter, prompts, a.new_tokens, d, k, (n,), oracle_ks=(), tlv=tlv)
        self.rows.append({"case": "replay", "prompts": len(prompts), "seconds": time.perf_counter() - t0, **rep})
        if "tlv_q_chain_agreement" in rep:
            m[f"tlv_q_chain_agreement{s}"] = rep["tlv_q_chain_agreement"]
            m[f"tlv_tokens_per_exact_pass_ratio_replay{s}"] = rep["tlv_tokens_per_exact_pass_ratio"]
        self.say(f"{self.target} replay: {rep.get('tlv_tokens_per_exact_pass_ratio')}x per exact pass")

    # ---- the run: step by step across targets ----------------------------------------------------
    def select(self, t: dict) -> None:
        """Make target state ``t`` the current one (the steps read its name, rows, prompts, drafter)."""
        self.target, self.rows, self.warm, self.drafter = t["name"], t["rows"], t.get("warm"), t.get("drafter")

    def load(self, target: str) -> dict | None:
        """The target's models (lift, drafter, W12 twin) and prompts: its state, or None if they failed."""
        t = {"name": target, "rows": []}
        self.out["targets"][target] = {"rows": t["rows"]}
        self.select(t)
        if self.past_deadline(f"{target}.load"):
            return None
        try:
            run = self.e2e_run(target)
            run.load()
            run.build_w12()
            self.out["targets"][target]["model"] = run.out["model"]
            sets = run.prompt_sets()
            timed = [p for v in sets.values() for p in v[: self.args.prompts_per_set]]
            t |= {"run": run, "sets": sets, "drafter": run.drafter, "engines": {}}
            try:
                t["warm"] = run.tune_prompts()
            except (Exception, SystemExit) as e:  # HumanEval not installed: warm up on a timed prompt instead
                self.error("warm prompts", e, target=target)
            t["warm"] = t.get("warm") or next(iter(sets.values()))
            t["context"] = int(median([len(p) for p in timed])) + self.args.new_tokens // 2
        except (Exception, SystemExit) as e:  # an unknown target or drafter ends this target only
            self.error("load", e, target=target)
            return None
        self.write(f"{target}.load")
        return t

    def step(self, t: dict, step: str) -> None:
        """One step of one target, recorded on its own: a failure ends only the steps that need it."""
        self.select(t)
        name = t["name"]
        if self.past_deadline(f"{name}.{step}"):
            return
        try:
            run, engines = t["run"], t["engines"]
            missing = [e for e in NEEDS[step] if e not in engines]
            if missing:
                raise RuntimeError(f"no {' / '.join(missing)} engine (its setup failed or was skipped)")
            if step == "engines":
                self.engines(run, engines)
            elif step == "timed":
                t["cells"] = self.timed(run, engines, t["sets"])
                self.timed_metrics(t["cells"])
            elif step == "forcing":
                self.forcing(run, t["sets"], t.get("cells", {}))
            elif step == "steps":
                self.steps(run, engines, t["context"])
            else:
                first = next(iter(t["sets"].values()))
                self.replay(engines, first[: self.args.replay_prompts])
        except Exception as e:
            self.error(step, e, target=name)
        self.write(f"{name}.{step}")

    def run(self) -> dict:
        a = self.args
        self.say(f"tlv: targets {self.targets}, tree {self.tree}, L {a.chain_len}, R {a.root_budget}, {self.path}")
        if self.cuda:
            # Every (batch, width) of every engine's compiled block is a cache entry of one function.
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
            torch._dynamo.config.accumulated_cache_size_limit = max(
                torch._dynamo.config.accumulated_cache_size_limit, 2048
            )
        # Step-major: every target's speedup first (the models stay resident: the 8B, its W12 twin and
        # SmolLM2 fit the H200 together), then the forcing verdicts on its texts, then the step timings,
        # then the replays, so a deadline cuts the cross-checks, not the headline.
        states = []
        for target in self.targets:
            t = self.load(target)
            if t is not None:
                states.append(t)
                for step in ("engines", "timed"):
                    self.step(t, step)
        for step in ("forcing", "steps", "replay"):
            for t in states:
                self.step(t, step)
        self.out["log"] = self.say.lines
        self.say(f"done: {self.out['metrics']}")
        return self.out


@register_suite("tlv", add_args=_args)
def tlv(args: argparse.Namespace) -> dict:
    """Two-level verification + trees + W12 against trees + W12 (issue 16): the lifted 8B and SmolLM2."""
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("the tlv suite needs a CUDA GPU (--device cpu runs its bookkeeping on tiny models)")
    return _Run(args).run()
