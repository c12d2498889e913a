"""E2E suite (one GPU): how much faster SpecPilot makes an 8B model than AR and than stock speculation.

The model (``--target``):
- ``llama-3.1-8b`` (default): "SmolLM2-135M lifted to Llama-3.1-8B shapes (stand-in, timing)", built in
  memory on the device from the SmolLM2 GGUF/folder ``--model`` (``models.lift.lift_model``), with its
  EAGLE-3 drafter ``--draft`` (a folder trained for SmolLM2) lifted with it (``models.lift_eagle3``): an
  8B's cost per step, SmolLM2's text, EAGLE-3's drafts at EAGLE-3's 8B cost;
- ``smollm2``: the real SmolLM2-135M-Instruct with the same drafter, no lift (launch-bound at batch 1:
  a step costs ~1 ms whatever it verifies, so speculation buys less there). ``specpilot bench
  e2e_smollm2`` is this suite with that default, so its file (``e2e_smollm2_<gpu>.json``) stands beside
  the 8B's (``e2e_<gpu>.json``);
- any other ``models.lift`` shape (``tiny``, cut with ``--lift-layers``): CPU dry runs of the bookkeeping.

Systems, timed in one process, interleaved batch by batch with the order rotated (no system always
first), greedy, chat template, ``--new-tokens`` (128) tokens with EOS ignored (equal work per system):

  ar      default engine options, no drafter (every engine is sized alike: --max-seq-len, the batches)
  stock   chain speculative decoding with the drafter, the best gamma of ``--gammas`` (3-8)
  trees   SpecPilot best-first trees, the best (N, D, K) of ``--tree-grid`` (AR where it switches off)
  w12     trees with W12 weights on the target (a W12 twin of the BF16 model, built on the device)
  tlv     trees + W12 with two-level verification (a Q chain of --tlv-chain-len tokens from W12's 8-bit
          view, the drafter's tree hanging from its end, one exact pass over both)

Choosing gamma and (N, D, K) (never on the timed prompts; never on MT-Bench, an evaluation set): at batch
1 each candidate generates ``--tune-prompts`` (HumanEval/132-133 and two held-out general chat prompts, disjoint from
HumanEval/100-131) and the fastest by measured tokens/s wins. The tree grid is searched by coordinates
(D at N 32, K 8; then K; then N: 5 + 1 + 2 configs instead of 30), because every config costs a
compile and capture of its round (seconds each at 8B), the grid's axes barely interact at a fixed verify
cost, and the whole suite must fit one ~9-minute device call; ``--tree-search full`` runs all of it. At
larger batches the verify pass is no longer free, so N (at the batch-1 D, K) and gamma are chosen again
per batch by the cost model: S = tau / c with tau from the batch-1 sweep (greedy tau does not depend on
the batch) and c = the candidate's round time at that batch / AR's step time there. The tree candidates
are the measured grid budgets at the batch-1 (D, K) plus N 8 and 4 below the batch-1 N (D capped to N;
``e2e_configs.SMALL_BUDGETS``): their tau is measured by the same short batch-1 run, only when a batch > 1
is asked for, nearest budget first, inside what is left of the budget. At each larger batch the trees
are scored smallest budget first and the chains nearest below the batch-1 gamma, each batch taking an
equal share of the budget left (at least two candidates per system). A chain is a tree with top-k 1, so
where stock's best chain is predicted above every tree, the ``trees`` system runs that chain at that
batch (its ``tune.bs{B}`` row says ``trees_run_chain``). ``--tune-budget-s`` bounds the sweep (configs
left are reported as skipped).

Auto-off (``--fallback-ar``, the default; ``--no-fallback-ar`` keeps the best tree whatever it is
predicted): at a batch > 1 where no tree candidate and no stock gamma is predicted S > 1, SpecPilot
switches speculation off there, so the ``trees`` system is timed as AR at that batch, its selection
reads ``AR (fallback: <why, the best tree and its S>)``, the batch's ``tune.bs{B}`` row carries
``fallback_ar`` and the metric ``e2e_trees_fallback_ar_bs{B}`` is 1 (0 where the trees ran). Stock
keeps its best gamma regardless (stock has no auto-off); W12 and TLV keep the tree (the prediction used
the BF16 trees' round times, not theirs), and the headline takes the best of the three.

Per system, batch and prompt set the results hold tokens/s end to end (prefill included) and in the
decode phase, tau (tokens the rounds emitted / row-rounds), the speedup over AR (both ways), and the cost
model's prediction S = tau / c, c = (the system's round time) / (the AR step time), both from replays of
the engines' own captured round graphs with the batch's rows parked at the set's typical context, with
its error |S / measured - 1| against the decode-phase speedup (the phase it models; the end-to-end error,
which also carries the prefill, is reported beside it). At batch > 1 a batch runs until its slowest row
is done, which the row-rounds of tau do not see: ``straggler`` (batch rounds / mean row rounds) says by
how much. Token forcing (``harness.token_forcing``): every system's text is scored by the AR engine's
target (teacher forcing) and compared with AR's own report on the same prompts; the verdict is per system
and batch, and over all batches.

Metrics: ``e2e_speedup_vs_ar_bs{B}`` and ``e2e_speedup_vs_stock_bs{B}`` (the best SpecPilot system:
trees or trees + W12, end-to-end tokens/s, geometric mean over the prompt sets), ``costmodel_error_max``
(and ``_e2e``), ``forcing_accepted_{system}`` / ``forcing_all_accepted``, and per system and batch its
tokens/s, tau and speedup. ``rows`` hold every raw timing; ``table`` one line per system, batch and set
(``readme_table`` renders it). Robustness: progress lines with the elapsed time on stderr, the results
file rewritten as each part finishes (``"partial"`` names the last one), per-system failures recorded
under ``errors`` and the rest carried on, and parts not started by ``--deadline-s`` skipped and listed.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import time
from pathlib import Path

import torch

from ..harness.bench import register_suite
from .common import Progress, RunLog
from .e2e_configs import (
    NOT_BUILT,
    SYSTEMS,
    batch_chunks,
    best,
    chain,
    config_key,
    config_label,
    config_options,
    fallback_ar,
    parse_grid,
    parse_ints,
    run_order,
    smaller_trees,
    tree,
    tree_search,
    with_tlv,
)
from .e2e_results import cell_stats, cost_model, median, merge_reports, readme_table, summarize
from .stand_in import add_model_args

W12_SYSTEMS = ("w12", "tlv")  # systems whose target is the W12 twin (TLV's Q pass reads its 8-bit view)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default="llama-3.1-8b",
        help="llama-3.1-8b: SmolLM2 lifted to Llama-3.1-8B shapes (in memory); smollm2: the real model; "
        "another models.lift shape (tiny) for CPU dry runs",
    )
    p.add_argument("--model", default=None, help="SmolLM2 GGUF or folder (default: the embedded one)")
    p.add_argument("--draft", default=None, help="EAGLE-3 drafter folder trained for SmolLM2 (lifted with it)")
    p.add_argument("--sets", default="humaneval,mtbench", help="prompt sets: humaneval, mtbench, synthetic")
    p.add_argument("--humaneval", default="100-131", help="HumanEval problems of the humaneval set")
    p.add_argument("--prompts-per-set", type=int, default=8, help="timed prompts per set (at batch B > this: B)")
    p.add_argument("--batches", default="1,4,16", help="batch sizes (distinct prompts per batch)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of {', '.join(SYSTEMS)}")
    p.add_argument("--skip-w12", action="store_true", help="leave out the W12 and TLV systems (no W12 twin is built)")
    p.add_argument("--tlv-chain-len", type=int, default=4, help="TLV: Q-chain tokens (the engine's default)")
    p.add_argument("--draft-weights", default="bf16", choices=["bf16", "fp8"],
                   help="the tree systems' drafter projections (models/fp8_linear.py); stock: bf16")  # fmt: skip
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--gammas", default="3-8", help="stock chain lengths to choose from")
    # Depths 3 and 4 too: in the first H200 sweep (c963b6b) the shortest chain won (gamma 3: 308 tokens/s
    # against 238-282 for 4-8) and depths 5 / 6 / 7 tied or fell (308 / 308 / 293), so the tree optimum at
    # this drafter's acceptance may lie below 5.
    p.add_argument("--tree-grid", default="16,32,64:3,4,5,6,7:4,8", help="tree budgets N : depths D : top-k K")
    p.add_argument("--tree-search", choices=("coordinate", "full"), default="coordinate")
    p.add_argument(
        "--fallback-ar",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="at a batch > 1 where no tree (nor stock's best gamma) is predicted to beat AR, run the trees as AR",
    )
    p.add_argument(
        "--tune-prompts",
        # Measured on the H200 (c963b6b): with two of the drafter's training prompts in this set the sweep's
        # tree tau was 2.84 against 2.15 in the timed run; held-out general chat prompts replace them.
        default="humaneval:132-133,general:2",
        help="prompts of the gamma / tree sweep (never MT-Bench): humaneval:A-B, general:N (held-out chat), "
        "offline:N (training prompts), synthetic:N",
    )
    p.add_argument("--tune-tokens", type=int, default=64, help="tokens per prompt in the sweep")
    p.add_argument("--tune-budget-s", type=float, default=150.0, help="seconds for the whole sweep")
    p.add_argument(
        "--deadline-s", type=float, default=420.0, help="seconds into the run after which no new part starts"
    )
    p.add_argument("--round-iters", type=int, default=20, help="replays per round timing")
    add_model_args(p)


# ---- the run ----------------------------------------------------------------------------------------


class _Run(RunLog):
    """State of one suite run: models, engines, the results under construction."""

    def __init__(self, args: argparse.Namespace, suite: str = "e2e"):
        from ..harness.bench import default_run_dir, gpu_name, gpu_slug

        self.args, self.suite = args, suite
        self.say = Progress("e2e")
        self.dev = torch.device(args.device)
        self.cuda = self.dev.type == "cuda"
        if args.results_dir is None:  # the partial files and the runner's final file share one folder
            args.results_dir = default_run_dir(suite)
        self.path = Path(args.results_dir) / f"{suite}_{gpu_slug(gpu_name(self.dev))}.json"
        self.out: dict = {"metrics": {}, "rows": [], "errors": [], "table": [], "skipped": []}
        self.batches = sorted(set(parse_ints(args.batches)))
        systems = [s.strip() for s in args.systems.split(",") if s.strip()]
        unknown = set(systems) - set(SYSTEMS)
        if unknown:
            raise SystemExit(f"--systems: unknown {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
        if args.skip_w12:
            systems = [s for s in systems if s not in W12_SYSTEMS]
        self.systems = ["ar"] + [s for s in SYSTEMS[1:] if s in systems]  # AR is the reference: always run
        self.engines: dict[tuple, object] = {}
        self.ar_ms: dict[int, float] = {}
        self.selected: dict[int, dict[str, dict]] = {1: {"ar": {"kind": "ar"}}}  # batch -> system -> config
        self.forcing_cache: dict[tuple, object] = {}

    # ---- bookkeeping -------------------------------------------------------------------------------
    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def times_ms(self, fn, iters: int) -> list[float]:
        from ..harness.timing import times_ms

        return times_ms(fn, iters, self.cuda)

    # ---- models ------------------------------------------------------------------------------------
    def n_positions(self) -> int:
        from ..config import EngineOptions
        from ..engine.engine import scratch_slots

        Ns, Ds, Ks = parse_grid(self.args.tree_grid)
        configs = [config_options(chain(g)) for g in parse_ints(self.args.gammas)]
        configs += [config_options(tree(n, d, k)) for n, d, k in itertools.product(Ns, Ds, Ks)]
        widest = [EngineOptions(device="cpu")]
        for c in configs:
            try:
                widest.append(EngineOptions(device="cpu", **c))
            except ValueError:  # an impossible config fails where it is measured, and is reported there
                pass
        return self.args.max_seq_len + max(scratch_slots(o) for o in widest)

    def load(self) -> None:
        from .stand_in import load_stand_in

        a, say = self.args, self.say
        m = load_stand_in(a, self.dev, self.n_positions(), say)
        self.target, self.drafter, self.tok, self.real_vocab = m.target, m.drafter, m.tok, m.real_vocab
        info = m.info
        self.out["model"] = info
        self.out["new_tokens"] = a.new_tokens
        say(
            f"model: {info['label']} ({info['params_b']} B), drafter {info['drafter_params_m']} M, "
            f"{info['build_s']:.1f} s"
        )

    def build_w12(self) -> None:
        from ..models.w12_weights import w12_twin

        t0 = time.perf_counter()
        self.target_w12 = w12_twin(self.target)
        self.sync()
        self.out["rows"].append({"case": "w12_twin", "build_s": time.perf_counter() - t0})
        self.say(f"W12 twin of the target built in {time.perf_counter() - t0:.1f} s")

    # ---- prompts -----------------------------------------------------------------------------------
    def _chat_ids(self, texts: list[str]) -> list[list[int]]:
        chat = hasattr(self.tok, "apply_chat_template")
        self.out["chat_template"] = chat
        return [
            self.tok.encode(self.tok.apply_chat_template([{"role": "user", "content": t}]) if chat else t)
            for t in texts
        ]

    def _synthetic(self, n: int, seed: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(seed)
        V = self.real_vocab  # a lifted vocabulary's extra ids name no token
        lens = torch.randint(6, 20, (n,), generator=g).tolist()
        return [torch.randint(3, V, (k,), generator=g).tolist() for k in lens]

    def prompt_sets(self) -> dict[str, list[list[int]]]:
        from .common import humaneval_prompts

        sets: dict[str, list[list[int]]] = {}
        for name in [s.strip() for s in self.args.sets.split(",") if s.strip()]:
            try:
                if name == "humaneval":
                    lo, hi = (int(x) for x in self.args.humaneval.split("-"))
                    sets["humaneval"] = self._chat_ids(humaneval_prompts(range(lo, hi + 1)))
                elif name == "mtbench":
                    from ..drafters.train import mtbench_turn1_prompts

                    sets["mtbench"] = self._chat_ids(mtbench_turn1_prompts())  # evaluation only
                elif name == "synthetic":
                    sets["synthetic"] = self._synthetic(max(self.args.prompts_per_set, max(self.batches)), 1)
                else:
                    raise ValueError(f"unknown prompt set {name!r} (humaneval, mtbench, synthetic)")
            except Exception as e:
                self.error("prompts", e, set=name)
        if not sets:
            raise SystemExit("no prompt set could be loaded (see the errors above)")
        self.out["prompt_sets"] = {
            n: {"available": len(v), "timed": min(len(v), max(self.args.prompts_per_set, max(self.batches)))}
            for n, v in sets.items()
        }
        return sets

    def tune_prompts(self) -> list[list[int]]:
        from .common import humaneval_prompts

        out: list[list[int]] = []
        for part in [p.strip() for p in self.args.tune_prompts.split(",") if p.strip()]:
            name, _, arg = part.partition(":")
            if name == "mtbench":
                raise SystemExit("--tune-prompts: MT-Bench is an evaluation set; never tune on it")
            if name == "humaneval":
                lo, hi = (int(x) for x in (arg or "132-133").split("-"))
                out += self._chat_ids(humaneval_prompts(range(lo, hi + 1)))
            elif name == "offline":  # the drafter's own training prompts: their tau flatters every config
                from ..drafters.train import offline_prompts

                out += self._chat_ids(offline_prompts(int(arg or 2)))
            elif name == "general":  # chat prompts the drafter never trained on (drafters.general)
                from ..drafters.corpus import load
                from ..drafters.general import heldout_general

                trained = {r["prompt"] for r in load()[1]}
                out += self._chat_ids(heldout_general(int(arg or 2), trained))
            elif name == "synthetic":
                out += self._synthetic(int(arg or 2), 2)
            else:
                raise SystemExit(
                    f"--tune-prompts: unknown set {name!r} (humaneval:A-B, general:N, offline:N, synthetic:N)"
                )
        return out

    # ---- engines -----------------------------------------------------------------------------------
    def base_options(self) -> dict:
        a = self.args
        return dict(
            device=a.device,
            dtype=a.dtype,
            max_seq_len=a.max_seq_len,
            max_batch_size=max(self.batches),
            graph_batch_sizes=tuple(self.batches),  # rows finishing never reach an uncaptured bucket
            compile=False if a.no_compile else None,
        )

    def engine(self, cfg: dict, w12: bool = False):
        from ..config import EngineOptions
        from ..engine import Engine

        key = (w12, config_key(cfg))
        if key not in self.engines:
            target = self.target_w12 if w12 else self.target
            # weights="w12" says what the W12 twin is (TLV checks it: its Q pass reads the 8-bit view)
            w = {"weights": "w12"} if w12 else {}
            # SpecPilot's trees may draft with FP8 projections (--draft-weights); stock's chain keeps bf16.
            if cfg["kind"] == "tree":
                w["draft_weights"] = self.args.draft_weights
            opts = EngineOptions(**self.base_options(), **config_options(cfg), **w)
            drafter = None if cfg["kind"] == "ar" else self.drafter
            self.engines[key] = Engine(target, self.tok, opts, drafter)
        return self.engines[key]

    def drop_engines(self, keep: set[tuple]) -> None:
        for key in [k for k in self.engines if k not in keep]:
            del self.engines[key]
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def capture(self, eng, b: int) -> None:
        """Compile and capture ``eng``'s round at batch bucket ``b`` (no-op off CUDA)."""
        from ..engine.sampling import BatchSampling, SamplingParams

        if eng.captured is not None and b not in eng.captured:
            eng.captured.capture(b, BatchSampling.from_params([SamplingParams()] * b, eng.device))

    def round_ms(self, eng, b: int, context: int) -> list[float]:
        """Replays of ``eng``'s captured round with rows ``0..b-1`` parked at ``context`` cached tokens."""
        from .rounds import _parked_round, _unpark

        self.capture(eng, b)
        g = torch.Generator(device=eng.device).manual_seed(0)
        V = eng.target.cfg.vocab_size
        eng.state.history[:b, : context + 1] = torch.randint(0, V, (b, context + 1), device=eng.device, generator=g)
        with torch.inference_mode():
            ms = self.times_ms(_parked_round(eng, context, b), self.args.round_iters)
        _unpark(eng, b)
        return ms

    def generate(self, eng, prompts: list[list[int]], new_tokens: int) -> dict:
        """One timed batch: wall time, decode-phase time (from the first tokens, after the prefill), and
        per row tokens, rounds and round tokens. A failed row raises (``GenerationError``)."""
        from ..engine import GenerationError, SamplingParams

        params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
        results: dict[int, object] = {}
        self.sync()
        t0 = time.perf_counter()
        t_first = None
        for ev in eng.stream(prompts, params):
            if t_first is None:
                t_first = time.perf_counter()
            if ev.result is not None:
                results[ev.index] = ev.result
        self.sync()
        t1 = time.perf_counter()
        res = [results[i] for i in range(len(prompts))]
        if any(r.error is not None for r in res):
            raise GenerationError(res)
        return {
            "wall_s": t1 - t0,
            "decode_s": t1 - (t_first or t0),
            "tokens": [len(r.token_ids) for r in res],
            "rounds": [r.rounds for r in res],
            "round_tokens": [round(r.mean_accepted * r.rounds) for r in res],
            "token_ids": [r.token_ids for r in res],
        }

    # ---- the sweep ---------------------------------------------------------------------------------
    def measure_bs1(self, cfg: dict, prompts: list[list[int]], deadline: float, context: int) -> dict:
        rec: dict = {"config": cfg, "label": config_label(cfg)}
        if time.perf_counter() > deadline:
            rec["skipped"] = "tune budget spent"
            return rec
        try:
            t0 = time.perf_counter()
            eng = self.engine(cfg)
            self.capture(eng, 1)
            rec["capture_s"] = time.perf_counter() - t0
            self.generate(eng, prompts[:1], 8)  # first use of every path, untimed
            runs = [self.generate(eng, [p], self.args.tune_tokens) for p in prompts]
            rec["wall_s"] = [r["wall_s"] for r in runs]
            tokens = sum(r["tokens"][0] for r in runs)
            rec["tokens_per_s"] = tokens / sum(rec["wall_s"])
            rounds = sum(r["rounds"][0] for r in runs)
            rec["tau"] = sum(r["round_tokens"][0] for r in runs) / rounds if rounds else None
            rec["round_ms"] = self.round_ms(eng, 1, context)
            if rec["tau"] and 1 in self.ar_ms:
                rec |= cost_model(rec["tau"], median(rec["round_ms"]), self.ar_ms[1])
        except Exception as e:
            self.error("tune", e, config=config_label(cfg))
            rec["error"] = f"{type(e).__name__}: {e}"
            self.engines.pop((False, config_key(cfg)), None)
        if "tokens_per_s" in rec:
            got = f"{rec['tokens_per_s']:.1f} tok/s, tau {_num(rec.get('tau'))}, S {_num(rec.get('predicted_speedup'))}"
        else:
            got = rec.get("error", rec.get("skipped", "?"))
        self.say(f"tune {rec['label']}: {got}")
        return rec

    def sweep(self, tune_ids: list[list[int]], context: int) -> None:
        a = self.args
        start = time.perf_counter()
        budget = a.tune_budget_s
        chain_records: list[dict] = []
        tree_records: list[dict] = []
        if "stock" in self.systems:
            # Deadlines at 35 % (chains), 75 % (trees) and 100 % (larger batches) of the budget: what one
            # part leaves, the next may spend.
            dl = start + 0.35 * budget
            gammas = parse_ints(a.gammas)
            order = sorted(gammas, key=lambda g: abs(g - 5))  # middle first: a budget cut keeps a sane one
            chain_records = [self.measure_bs1(chain(g), tune_ids, dl, context) for g in order]
        if any(s in self.systems for s in ("trees", "w12")):
            dl = start + 0.75 * budget
            tree_records = tree_search(
                parse_grid(a.tree_grid), lambda c: self.measure_bs1(c, tune_ids, dl, context), a.tree_search
            )
        self.out["rows"].append({"case": "tune.bs1", "chain": chain_records, "tree": tree_records})
        b_chain = best(chain_records, "tokens_per_s")
        b_tree = best(tree_records, "tokens_per_s")
        pick1 = {"ar": {"kind": "ar"}}
        if b_chain:
            pick1["stock"] = b_chain["config"]
        if b_tree:
            pick1["trees"] = pick1["w12"] = b_tree["config"]
            pick1["tlv"] = with_tlv(b_tree["config"], a.tlv_chain_len)
        self.selected[1] = pick1
        self.say(f"batch 1: {_picks(pick1)}")
        keep = {(False, config_key(r["config"])) for r in chain_records}  # all gammas stay candidates
        if b_tree:
            keep |= {(False, config_key(r["config"])) for r in tree_records if _same_dk(r["config"], b_tree["config"])}
        self.drop_engines(keep | {(False, config_key({"kind": "ar"}))})
        # Larger batches: gamma and N again, by the cost model at that batch.
        deadline = start + budget
        larger = [b for b in run_order(self.batches) if b != 1]
        small: list[dict] = []
        if larger and b_tree:
            # Budgets below the batch-1 grid's (SMALL_BUDGETS): at batch 16 the verify pass costs what its
            # rows x nodes cost (N 32: 16.47 ms against AR's 5.04 ms), so the winner there may be a tree
            # batch 1 never measured. Their tau (batch-independent) from the same short batch-1 run, the
            # nearest below the batch-1 N first, inside what is left of the budget.
            measured = {config_key(r["config"]) for r in tree_records if r.get("tau")}
            small = [
                self.measure_bs1(c, tune_ids, deadline, context)
                for c in smaller_trees(b_tree["config"])
                if config_key(c) not in measured
            ]
            self.out["rows"].append({"case": "tune.small_trees", "tree": small})
        for i, b in enumerate(larger):
            pick = dict(pick1)
            # Each batch gets an equal share of what is left: on the H200 (62be095) batch 16 came first
            # and spent it all on N 64 and 32 (28 and 17 ms rounds), so batch 4 scored one tree only.
            b_deadline = time.perf_counter() + max(0.0, deadline - time.perf_counter()) / (len(larger) - i)
            # Trees first, smallest budget first (a wider batch favours narrower verifies: at batch 16 N 32
            # cost 16.8 ms against AR's 5.0), then chains nearest below the batch-1 gamma, so a budget cut
            # keeps the likeliest candidates.
            cand = {}
            if b_tree:
                recs = [r for r in tree_records if _same_dk(r["config"], b_tree["config"])] + small
                cand["trees"] = sorted([r for r in recs if r.get("tau")], key=lambda r: r["config"]["budget"])
            if b_chain:
                recs = [r for r in chain_records if r.get("tau")]
                cand["stock"] = _nearest_below(recs, "gamma", b_chain["config"]["gamma"])
            rows, top = [], {}  # top: system -> (best predicted S, its config)
            for system, recs in cand.items():
                scored = []
                for r in recs:
                    if time.perf_counter() > b_deadline and len(scored) >= 2:
                        rows.append({"system": system, "config": r["config"], "skipped": "tune budget spent"})
                        continue
                    try:
                        ms = self.round_ms(self.engine(r["config"]), b, context)
                        cm = cost_model(r["tau"], median(ms), self.ar_ms[b])
                        scored.append((cm["predicted_speedup"], r["config"]))
                        rows.append(
                            {"system": system, "config": r["config"], "tau_bs1": r["tau"], "round_ms": ms, **cm}
                        )
                    except Exception as e:
                        self.error("tune", e, config=config_label(r["config"]), batch=b)
                if scored:
                    top[system] = max(scored, key=lambda x: x[0])
                    pick[system] = top[system][1]
            row = {"case": f"tune.bs{b}", "by_cost_model": rows}
            # A chain is a tree with top-k 1: where a chain is predicted to beat every tree at this batch,
            # SpecPilot's trees run that chain (H200, 62be095, batch 4: N 64 ran at 0.99x AR while stock's
            # gamma 3 ran at 1.15x).
            if "trees" in top and "stock" in top and top["stock"][0] > top["trees"][0]:
                row["trees_run_chain"] = config_label(top["stock"][1])
                top["trees"] = top["stock"]
                pick["trees"] = top["stock"][1]
            if "trees" in pick:
                pick["w12"] = pick["trees"]
                if pick["trees"]["kind"] == "tree":  # else TLV keeps its batch-1 tree
                    pick["tlv"] = with_tlv(pick["trees"], a.tlv_chain_len)
            # Nothing speculative predicted to beat AR (no tree, nor stock's best chain): SpecPilot's trees
            # switch themselves off at this batch and run as AR, so the headline is what SpecPilot would do
            # (H200, batch 16: N 32 ran at 0.54x AR). Stock keeps its gamma (stock has no auto-off); W12
            # and TLV keep the tree (their own round times are not the BF16 trees' the prediction used).
            if a.fallback_ar and "trees" in top and all(sp < 1 for sp, _ in top.values()):
                what = "tree or chain" if "stock" in top else "tree"
                pick["trees"] = fallback_ar(
                    f"no {what} predicted S > 1 at batch {b}; best {config_label(top['trees'][1])} "
                    f"at S {top['trees'][0]:.2f}"
                )
                row["fallback_ar"] = pick["trees"]["fallback"]
            self.selected[b] = pick
            self.out["rows"].append(row)
            self.say(f"batch {b}: {_picks(pick)}")
        self.out["selection"] = {str(b): {s: config_label(c) for s, c in p.items()} for b, p in self.selected.items()}
        self.out["rows"].append({"case": "part.tune", "wall_s": time.perf_counter() - start})
        keep = {(False, config_key(c)) for p in self.selected.values() for c in p.values()}
        self.drop_engines(keep)

    # ---- the timed part ----------------------------------------------------------------------------
    def forcing(self, prompt: list[int], generated: list[int]):
        from ..harness.token_forcing import token_forcing

        key = (tuple(prompt), tuple(generated))
        if key not in self.forcing_cache:
            score = self.engine({"kind": "ar"}).teacher_force_logits
            self.forcing_cache[key] = token_forcing(score, [(prompt, generated)])
        return self.forcing_cache[key]

    def system_engine(self, system: str, b: int):
        cfg = self.selected.get(b, {}).get(system) or self.selected[1].get(system)
        if cfg is None:
            return None, None
        return self.engine(cfg, w12=system in W12_SYSTEMS), cfg

    def timed_batch(self, b: int, sets: dict[str, list[list[int]]], tune_ids: list[list[int]], context: int) -> None:
        from ..harness.token_forcing import compare_forcing

        a, say = self.args, self.say
        t_part = time.perf_counter()
        setup: dict[str, tuple] = {}  # system -> (engine, config, round ms)
        for system in self.systems:
            if system in NOT_BUILT:
                continue
            # A system's setup compiles and captures (W12's took 98 s at batch 1 on the H200): none starts
            # past the deadline, so the run ends inside its device call with what it measured written.
            if system != "ar" and self.past_deadline(f"bs{b}.{system}"):
                continue
            try:
                eng, cfg = self.system_engine(system, b)
                if eng is None:
                    raise RuntimeError("no configuration was selected for it (its sweep failed)")
                # Every bucket up to b: as rows finish, a batch drops to smaller buckets, whose first use
                # would otherwise compile and capture inside the timing.
                for bucket in self.batches:
                    if bucket <= b:
                        self.capture(eng, bucket)
                warm = [tune_ids[i % len(tune_ids)] for i in range(b)]
                self.generate(eng, warm, 16)  # untimed: first use of this batch's paths (and W12 configs)
                ms = self.round_ms(eng, b, context)
                setup[system] = (eng, cfg, ms)
                if system == "ar":
                    self.ar_ms[b] = median(ms)
                say(f"bs{b} {system}: {config_label(cfg)}, round {median(ms):.3f} ms")
            except Exception as e:
                self.error("setup", e, system=system, batch=b)
        if "ar" not in setup:
            self.out["skipped"].append({"part": f"bs{b}", "reason": "the AR reference failed at this batch"})
            return
        self.out["rows"].append(
            {
                "case": "round_times",
                "batch": b,
                "context": context,
                "round_ms": {s: ms for s, (_, _, ms) in setup.items()},
                "configs": {s: cfg for s, (_, cfg, _) in setup.items()},
            }
        )
        runs: dict[tuple[str, str], list[dict]] = {}
        timed_prompts: dict[str, list[list[int]]] = {}
        names, active = list(setup), set(setup)
        graphs_before = _dynamo_graphs()
        for si, (set_name, prompts) in enumerate(sets.items()):
            chunks = batch_chunks(prompts, a.prompts_per_set, b)
            if not chunks:
                self.out["skipped"].append({"part": f"bs{b}.{set_name}", "reason": f"fewer than {b} prompts"})
                continue
            if self.past_deadline(f"bs{b}.{set_name}"):
                continue
            for i, batch in enumerate(chunks):
                if i and self.past_deadline(f"bs{b}.{set_name}.chunk{i + 1}"):
                    break  # every system ran the same chunks so far: their ratios stay paired
                r = (i + si) % len(names)  # rotated: no system always runs first
                line = []
                for system in names[r:] + names[:r]:
                    if system not in active:
                        continue
                    try:
                        res = self.generate(setup[system][0], batch, a.new_tokens)
                        runs.setdefault((system, set_name), []).append(res)
                        line.append(f"{system} {res['wall_s']:.3f}s")
                    except Exception as e:
                        self.error("timed", e, system=system, batch=b, set=set_name)
                        active.discard(system)  # a system that failed once is out of this batch size
                timed_prompts.setdefault(set_name, []).extend(batch)
                say(f"bs{b} {set_name} {i + 1}/{len(chunks)}: " + ", ".join(line))
        # Compiles inside the timed batches would be timed too: there should be none.
        self.out["rows"].append(
            {"case": "compiles_while_timed", "batch": b, "graphs": _dynamo_graphs() - graphs_before}
        )
        try:
            self.cells_of_batch(b, setup, runs, timed_prompts, context, compare_forcing)
        except Exception as e:  # the timings are in; keep what there is
            self.error("results", e, batch=b)
        self.out["rows"].append({"case": f"part.bs{b}", "wall_s": time.perf_counter() - t_part})

    def cells_of_batch(self, b, setup, runs, timed_prompts, context, compare_forcing) -> None:
        """Stats, cost model and token forcing of every system at batch ``b``, from its timed runs."""
        say = self.say
        ar_rep = {}
        for set_name, ps in timed_prompts.items():
            if ("ar", set_name) in runs and len(runs[("ar", set_name)]) * b == len(ps):
                ar_rep[set_name] = [
                    self.forcing(p, t) for p, t in zip(ps, _flat_ids(runs[("ar", set_name)]), strict=True)
                ]
        verdicts = {}
        for system, (_, cfg, ms) in setup.items():
            reps, stock = [], []
            for set_name, ps in timed_prompts.items():
                rs, ar_runs = runs.get((system, set_name)), runs.get(("ar", set_name))
                if not rs or set_name not in ar_rep or len(rs) != len(ar_runs):
                    continue  # the system (or AR) failed in this set: no comparison
                ar_cell = {**cell_stats(ar_runs, None, None, None), "runs": ar_runs}
                stats = cell_stats(rs, median(ms), None if system == "ar" else ar_cell, self.ar_ms.get(b))
                ids = _flat_ids(rs)
                try:
                    reps += [self.forcing(p, t) for p, t in zip(ps, ids, strict=True)]
                    stock += ar_rep[set_name]
                except Exception as e:
                    self.error("forcing", e, system=system, batch=b, set=set_name)
                row = {
                    "case": "system",
                    "system": system,
                    "batch": b,
                    "set": set_name,
                    "config": cfg,
                    "setting": config_label(cfg),
                    "round_ms": ms,
                    "ar_step_ms": self.ar_ms.get(b),
                    "context": context,
                    "prompt_tokens": [len(p) for p in ps],
                    **{k: [r[k] for r in rs] for k in ("wall_s", "decode_s", "tokens", "rounds", "round_tokens")},
                    **stats,
                    "mismatched_prompts_vs_ar": sum(x != y for x, y in zip(ids, _flat_ids(ar_runs), strict=True)),
                }
                self.out["rows"].append(row)
                self.cells.append({"system": system, "batch": b, "set": set_name, "setting": row["setting"], **stats})
            if reps:
                system_rep, stock_rep = merge_reports(reps), merge_reports(stock)
                verdict = compare_forcing(system_rep, stock_rep)
                self.reports.setdefault(system, []).extend(reps)
                self.stock_reports.setdefault(system, []).extend(stock)
                verdicts[system] = self.verdicts[(system, b)] = verdict.accepted
                self.out["rows"].append(
                    {
                        "case": "forcing",
                        "system": system,
                        "batch": b,
                        "report": _brief(system_rep),
                        "stock": _brief(stock_rep),
                        "verdict": verdict.to_dict(),
                    }
                )
        for c in self.cells:
            if c["batch"] == b:
                accepted = verdicts.get(c["system"])
                c["verdict"] = "–" if accepted is None else ("accepted" if accepted else "REJECTED")
        say(f"bs{b} forcing: " + ", ".join(f"{s} {'accepted' if v else 'REJECTED'}" for s, v in verdicts.items()))

    def finish(self) -> None:
        """Metrics and table from everything measured so far (run after every part, so partial files have them)."""
        try:
            self._finish()
        except Exception as e:  # the rows are in; the metrics of the last good pass stay
            self.error("metrics", e)

    def _finish(self) -> None:
        from ..harness.token_forcing import compare_forcing

        overall = {}
        for system, reps in self.reports.items():
            v = compare_forcing(merge_reports(reps), merge_reports(self.stock_reports[system]))
            self.verdicts[(system, "all")] = v.accepted
            overall[system] = v.to_dict()
        self.out["forcing_all_batches"] = overall
        self.out["metrics"] = summarize(self.cells, self.verdicts)
        self.out["metrics"]["tlv_built"] = int(any(c["system"] == "tlv" for c in self.cells))
        for b in sorted({c["batch"] for c in self.cells if c["system"] == "trees" and c["batch"] != 1}):
            fell_back = bool(self.selected.get(b, {}).get("trees", {}).get("fallback"))
            self.out["metrics"][f"e2e_trees_fallback_ar_bs{b}"] = int(fell_back)  # 1: the trees ran as AR
        compiles = [r["graphs"] for r in self.out["rows"] if r.get("case") == "compiles_while_timed"]
        if compiles:
            self.out["metrics"]["e2e_compiles_while_timed"] = sum(compiles)
        self.out["table"] = sorted(self.cells, key=lambda c: (c["batch"], SYSTEMS.index(c["system"]), c["set"]))
        self.out["table"] += [{"system": s, "status": NOT_BUILT[s]} for s in self.systems if s in NOT_BUILT]

    def run(self) -> dict:
        try:
            return self._run()
        except BaseException as e:
            # Whatever was measured stays on disk, with the reason the run ended.
            if not isinstance(e, SystemExit):
                self.error("run", e)
            self.write(f"failed: {type(e).__name__}: {e}")
            raise

    def _run(self) -> dict:
        a, say = self.args, self.say
        self.cells: list[dict] = []
        self.verdicts: dict = {}
        self.reports: dict[str, list] = {}
        self.stock_reports: dict[str, list] = {}
        say(f"e2e: target {a.target}, batches {self.batches}, systems {self.systems}, results {self.path}")
        if self.cuda:
            from ..harness.roofline import measure_peaks

            # Every (batch, width) of every engine's compiled block is a cache entry of one function.
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
            torch._dynamo.config.accumulated_cache_size_limit = max(
                torch._dynamo.config.accumulated_cache_size_limit, 2048
            )
            try:
                self.out["peaks"] = measure_peaks("cuda").to_dict()
            except Exception as e:
                self.error("peaks", e)
        self.load()
        sets = self.prompt_sets()
        tune_ids = self.tune_prompts()
        timed = [p for v in sets.values() for p in v[: max(a.prompts_per_set, max(self.batches))]]
        context = int(median([len(p) for p in timed])) + a.new_tokens // 2
        self.out["context"] = context
        self.write("model")
        # The AR reference: warmed up (every prefill shape, every bucket's round), its step time per batch.
        ar = self.engine({"kind": "ar"})
        ar.warmup(tuple(self.batches), progress=lambda m: say(f"AR {m}"))
        for b in self.batches:
            self.ar_ms[b] = median(self.round_ms(ar, b, context))
        self.out["rows"].append(
            {"case": "ar_step", "context": context, "ar_ms": dict(self.ar_ms), "warmup_s": ar.warmup_s}
        )
        say("AR step: " + ", ".join(f"bs{b} {ms:.3f} ms" for b, ms in self.ar_ms.items()))
        if any(s in self.systems for s in ("stock", "trees", "w12")):
            try:
                self.sweep(tune_ids, context)
            except Exception as e:  # systems without a selected config fail at their setup, reported
                self.error("tune", e)
            self.write("tune")
        if any(s in self.systems for s in W12_SYSTEMS):
            if a.dtype not in ("bfloat16", "bf16"):
                for s in [s for s in self.systems if s in W12_SYSTEMS]:
                    self.out["skipped"].append({"part": s, "reason": f"W12 needs bfloat16 (dtype {a.dtype})"})
                self.systems = [s for s in self.systems if s not in W12_SYSTEMS]
            else:
                try:
                    self.build_w12()
                except Exception as e:
                    self.error("w12", e)
                    self.systems = [s for s in self.systems if s not in W12_SYSTEMS]
        for b in run_order(self.batches):
            if self.past_deadline(f"bs{b}"):
                continue
            try:
                self.timed_batch(b, sets, tune_ids, context)
            except Exception as e:
                self.error("batch", e, batch=b)
            self.finish()
            self.write(f"bs{b}")
        self.finish()
        self.out["log"] = self.say.lines
        say(f"done: {self.out['metrics']}")
        return self.out


def _dynamo_graphs() -> int:
    from .rounds import _dynamo_graphs as graphs

    return graphs()


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _nearest_below(records: list[dict], field: str, value: int) -> list[dict]:
    """``records`` ordered: ``config[field] == value`` first, then smaller values nearest first, then larger."""
    return sorted(records, key=lambda r: (r["config"][field] > value, abs(r["config"][field] - value)))


def _same_dk(a: dict, b: dict) -> bool:
    return a["depth"] == b["depth"] and a["top_k"] == b["top_k"]


def _picks(pick: dict) -> str:
    return ", ".join(f"{s} {config_label(c)}" for s, c in pick.items() if s != "ar")


def _flat_ids(runs: list[dict]) -> list[list[int]]:
    return [t for r in runs for t in r["token_ids"]]


def _brief(rep) -> dict:
    d = rep.to_dict()
    d["details"] = d["details"][:20]  # the first mismatches; the counts cover them all
    return d


@register_suite("e2e", add_args=_args)
def e2e(args: argparse.Namespace, suite: str = "e2e") -> dict:
    """End to end on the lifted 8B: AR, stock chains, SpecPilot trees (+ W12) at batch 1, 4, 16."""
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("the e2e suite needs a CUDA GPU (--device cpu runs its bookkeeping on tiny models)")
    return _Run(args, suite).run()


def _args_smollm2(p: argparse.ArgumentParser) -> None:
    _args(p)
    p.set_defaults(target="smollm2")


@register_suite("e2e_smollm2", add_args=_args_smollm2)
def e2e_smollm2(args: argparse.Namespace) -> dict:
    """The e2e suite on the real SmolLM2-135M (no lift; its own results file): same systems, same table."""
    return e2e(args, "e2e_smollm2")


__all__ = ["e2e", "e2e_smollm2", "readme_table"]  # readme_table: a results file as one table (e2e_results)
