"""Batched serving suite (issue 18): tokens/s, TTFT and inter-token latency under N concurrent clients.

For N in ``--concurrency`` (1, 2, 4, 8, 16, 32, 64), N closed-loop clients (``batched_clients``) send
HumanEval/100-131 and MT-Bench turn-1 prompts (chat template, interleaved) to the server's scheduler,
``--new-tokens`` (128-256: each request's count drawn once, seeded, the same for every system) greedy tokens
each, EOS ignored (equal work per system), ``--requests-per-client``
(4) requests per client and at least ``--min-requests`` per N. Several per client, because a closed loop's
throughput is its steady state: with one request per client a part is one wave, which ends with its
slowest request (on the H200, 4fb4ff5, 16 clients with one request each: the trees' median request took
0.67 s against AR's 0.82 s, their slowest 0.87 s, so the wave's tokens/s came out at 0.94x AR's).
Systems, one engine each, all warmed up (every bucket captured, and automatic off's step curve measured)
before anything is timed:

  ar                 no drafter
  stock              chain speculative decoding with the drafter, gamma ``--gamma``
  specpilot          best-first trees ``--tree N,D,K``, none of issue 18's mechanisms; both SpecPilot systems
                     draft with ``--draft-weights`` (bf16, or fp8: the drafter's projections in FP8)
  specpilot_batched  the same trees with automatic off, adaptive draft depth (``--adaptive-depths``), the
                     shared node budget (``--shared-budget``), prompt admission (``--prompt-admission``) and
                     chain kinds (``--chain-depths``: stock's chain where it beats the tree per ms)

The model is the e2e suite's (``--target``): SmolLM2 lifted to Llama-3.1-8B shapes with its EAGLE-3
drafter lifted alongside (an 8B's cost per step), the real SmolLM2 (``smollm2``), or a tiny lift shape
for CPU dry runs. Per (system, N) the results hold total tokens/s (all tokens / wall time from the first
submit to the last token), the median request's tokens/s, TTFT p50 / p90, inter-token latency p50 and
mean, the share of requests whose tokens equal AR's, token forcing of every speculative system's outputs
against AR's (``force``: greedy output must be AR's up to near-ties), and each mechanism's decisions during
the part.
``batched_results`` turns the cells into the issue's metrics.

Fits one ~9-minute device call: parts run in the order N = 1, 16, 64, then the rest, systems rotated
within each N; none starts after ``--deadline-s``; the results file is rewritten after every part
(``"partial"`` names the last one); a part that fails is recorded under ``errors`` and the rest go on.
``--resume FILE`` carries the cells of an earlier (partial) file over, for the (system, N) pairs this run
does not measure, so two calls can cover the whole grid.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from ..harness.bench import register_suite
from .batched_clients import run_clients
from .batched_results import LABELS, SYSTEMS, cell, readme_table, summarize
from .common import Progress, RunLog
from .e2e_configs import parse_ints
from .stand_in import add_model_args

PRIORITY = (1, 16, 64)  # the metrics read these first: N = 1 (vs AR), 16 (TTFT), 64 (the far end)


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="llama-3.1-8b", help="llama-3.1-8b (lifted SmolLM2), smollm2, or tiny")
    p.add_argument("--model", default=None, help="SmolLM2 GGUF or folder (default: the embedded one)")
    p.add_argument("--draft", default=None, help="EAGLE-3 drafter folder trained for SmolLM2 (default: the shipped)")
    p.add_argument("--sets", default="humaneval,mtbench", help="prompt sets: humaneval, mtbench, synthetic")
    p.add_argument("--humaneval", default="100-131", help="HumanEval problems of the humaneval set")
    p.add_argument("--concurrency", default="1,2,4,8,16,32,64", help="numbers of concurrent clients N")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of {', '.join(SYSTEMS)}")
    # A range, as the 128-256 tokens: with one count for all, a closed loop's AR requests end in the same
    # round and their clients send the next prompts as one wave (H100, 2ab09a6: AR's waves at 64 clients were
    # 3.4 of its 7.1 s, padded), a lockstep that real traffic, whose answers differ in length, does not have.
    p.add_argument("--new-tokens", default="128-256", help="greedy tokens a request: N, or LO-HI drawn per request")
    p.add_argument("--min-requests", type=int, default=8, help="requests per N at least")
    p.add_argument("--requests-per-client", type=int, default=4,
                   help="requests each of the N clients sends (steady state rather than one wave)")  # fmt: skip
    # The e2e suite's H200 picks at batch 1 (README): stock gamma 3, trees N 32, D 6, K 8.
    p.add_argument("--gamma", type=int, default=3, help="stock chain length")
    p.add_argument("--tree", default="32,6,8", help="SpecPilot trees: budget N, depth D, top-k K")
    p.add_argument("--adaptive-depths", default="3,4", help="specpilot_batched: shallower depths a batch may run")
    # 128: 8 nodes a row at 16 rows, where the e2e sweep (H200, 1ff0900) predicted and measured N 8 best
    # (1.07x AR; the N 32 round, 17.3 ms against AR's 5.2, lost); N 32 up to 4 rows.
    p.add_argument("--shared-budget", type=int, default=128, help="specpilot_batched: verify nodes per round")
    p.add_argument("--prompt-admission", type=int, default=256, help="specpilot_batched: prompt tokens per round")
    # Stock's chain as an alternative kind: where the tree loses to it per ms (16 and 32 rows at 2bcb6d1,
    # batched_h200.json), the batch runs it.
    p.add_argument("--chain-depths", default="3", help="specpilot_batched: greedy chains a batch may run ('' none)")
    p.add_argument(
        "--adaptive-width", action="store_true", help="specpilot_batched: each round's width by tokens per ms"
    )
    # FP8 drafter projections for SpecPilot's systems (models/fp8_linear.py): a draft step reads half the bytes;
    # stock keeps SGLang's bf16 drafter. Output is AR's either way; token forcing checks it. bf16 by default
    # until FP8 is timed faster (as first built it was not: models/fp8_linear.py).
    p.add_argument("--draft-weights", default="bf16", choices=["bf16", "fp8"],
                   help="specpilot and specpilot_batched: the drafter's projections (stock: bf16)")  # fmt: skip
    add_model_args(p)
    p.add_argument("--deadline-s", type=float, default=480.0, help="seconds after which no new part starts")
    p.add_argument("--part-timeout-s", type=float, default=120.0, help="seconds one (system, N) part may take")
    p.add_argument(
        "--warm-tokens", type=int, default=8, help="tokens per request of the untimed pass before each part (0: none)"
    )
    p.add_argument("--resume", default=None, help="an earlier batched results file whose cells to carry over")


def request_lengths(spec: str, n: int, seed: int = 0) -> list[int]:
    """Tokens each of ``n`` requests generates: ``spec`` "N" for all, or "LO-HI" drawn uniformly per request
    from a generator seeded by ``seed`` (request i gets the same count in every system and every run)."""
    import random

    lo, _, hi = str(spec).partition("-")
    try:
        lo_i, hi_i = int(lo), int(hi or lo)
    except ValueError:
        raise SystemExit(f"--new-tokens {spec!r}: expected N or LO-HI") from None
    if not 1 <= lo_i <= hi_i:
        raise SystemExit(f"--new-tokens {spec!r}: expected 1 <= LO <= HI")
    rng = random.Random(seed)
    return [rng.randint(lo_i, hi_i) for _ in range(n)]


def system_options(a: argparse.Namespace, concurrency: list[int], system: str) -> dict:
    """EngineOptions keywords of one system at these parsed arguments (``_args``) and N: the suite's engines,
    and ``probes/round_profile.py --systems batched`` (the same mechanisms' round kinds, profiled)."""
    base = dict(
        device=a.device,
        dtype=a.dtype,
        max_seq_len=a.max_seq_len,
        max_batch_size=max(concurrency),
        graph_batch_sizes=tuple(concurrency),
        compile=False if a.no_compile else None,
    )
    n, d, k = parse_ints(a.tree)
    tree = dict(tree_budget=n, tree_depth=d, tree_top_k=k, draft_weights=a.draft_weights)
    return (
        base
        | {
            "ar": {},
            "stock": {"num_speculative_tokens": a.gamma},
            "specpilot": tree,
            "specpilot_batched": tree
            | dict(
                auto_off=True,
                adaptive_depths=tuple(parse_ints(a.adaptive_depths)) if a.adaptive_depths else (),
                shared_budget=a.shared_budget,
                adaptive_width=a.adaptive_width,
                prompt_admission=a.prompt_admission,
                chain_depths=tuple(parse_ints(a.chain_depths)) if a.chain_depths else (),
            ),
        }[system]
    )


class _Run(RunLog):  # its own write(): the batched file carries no command line
    def __init__(self, args: argparse.Namespace):
        from ..harness.bench import default_run_dir, gpu_name, gpu_slug

        self.args = args
        self.say = Progress("batched")
        self.dev = torch.device(args.device)
        if args.results_dir is None:  # the partial files and the runner's final file share one folder
            args.results_dir = default_run_dir("batched")
        self.path = Path(args.results_dir) / f"batched_{gpu_slug(gpu_name(self.dev))}.json"
        self.concurrency = sorted(set(parse_ints(args.concurrency)))
        if args.requests_per_client < 1:
            raise SystemExit(f"--requests-per-client must be >= 1, got {args.requests_per_client}")
        systems = [s.strip() for s in args.systems.split(",") if s.strip()]
        unknown = set(systems) - set(SYSTEMS)
        if unknown:
            raise SystemExit(f"--systems: unknown {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
        self.systems = ["ar"] + [s for s in SYSTEMS[1:] if s in systems]  # AR is every ratio's reference
        self.out: dict = {"metrics": {}, "rows": [], "cells": [], "errors": [], "skipped": [], "incomplete": []}
        # The A/B switches this process ran under (SPECPILOT_OVERTAKE=0, SPECPILOT_PACKED_PREFILL=0, ...): two
        # files of one A/B differ only here, so each says which side it is.
        self.out["switches"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith("SPECPILOT_")
                                and k not in ("SPECPILOT_COMMIT", "SPECPILOT_DIRTY")}  # fmt: skip
        self.engines: dict[str, object] = {}
        self.carried: list[dict] = []
        # (system, N) -> its finished requests' (prompt, tokens), and AR's token-forcing report per N.
        self.generations: dict[tuple[str, int], list[tuple[list[int], list[int]]]] = {}
        self.ar_forcing: dict[int, object] = {}

    # ---- bookkeeping -------------------------------------------------------------------------------
    def write(self, part: str) -> None:
        from ..harness.bench import provenance
        from ..harness.jsonable import to_jsonable

        try:
            self.finish()
            record = {"suite": "batched", **provenance(device=self.dev), "partial": part, **self.out}
            record["log"] = self.say.lines
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(to_jsonable(record), indent=1) + "\n")
        except Exception as e:  # a partial file is a convenience; never let it end the run
            self.say(f"could not write the partial results: {e}")

    # ---- models, prompts, engines ------------------------------------------------------------------
    def options(self, system: str) -> dict:
        return system_options(self.args, self.concurrency, system)

    def load(self) -> None:
        from ..config import EngineOptions
        from ..engine.engine import scratch_slots
        from .stand_in import load_stand_in

        a = self.args
        widest = [EngineOptions(max_seq_len=a.max_seq_len)]
        for s in self.systems:
            try:
                widest.append(EngineOptions(**self.options(s)))
            except ValueError:  # options that cannot run fail in their own parts, recorded there
                pass
        m = load_stand_in(a, self.dev, a.max_seq_len + max(scratch_slots(o) for o in widest))
        self.target, self.drafter, self.tok, self.real_vocab = m.target, m.drafter, m.tok, m.real_vocab
        self.out["model"] = m.info
        self.say(f"model: {m.info['label']} ({m.info['params_b']} B)")

    def prompts(self) -> list[list[int]]:
        """The sets' prompts interleaved (humaneval, mtbench, humaneval, ...), as token ids."""
        from .common import humaneval_prompts

        sets: list[list[list[int]]] = []
        chat = hasattr(self.tok, "apply_chat_template")
        for name in [s.strip() for s in self.args.sets.split(",") if s.strip()]:
            try:
                if name == "synthetic":
                    g = torch.Generator().manual_seed(1)
                    lens = torch.randint(6, 40, (max(self.concurrency) + self.args.min_requests,), generator=g)
                    sets.append([torch.randint(3, self.real_vocab, (int(n),), generator=g).tolist() for n in lens])
                    continue
                if name == "humaneval":
                    lo, hi = (int(x) for x in self.args.humaneval.split("-"))
                    texts = humaneval_prompts(range(lo, hi + 1))
                elif name == "mtbench":
                    from ..drafters.train import mtbench_turn1_prompts

                    texts = mtbench_turn1_prompts()
                else:
                    raise ValueError(f"unknown prompt set {name!r} (humaneval, mtbench, synthetic)")
                render = (lambda t: self.tok.apply_chat_template([{"role": "user", "content": t}])) if chat else str
                sets.append([self.tok.encode(render(t)) for t in texts])
            except Exception as e:
                self.error("prompts", e, set=name)
        if not sets:
            raise SystemExit("no prompt set could be loaded (see the errors above)")
        pooled = [p for group in zip(*sets, strict=False) for p in group]
        pooled += [p for s in sets for p in s[min(map(len, sets)) :]]
        self.out["prompts"] = {"available": len(pooled), "lengths_median": sorted(map(len, pooled))[len(pooled) // 2],
                               "new_tokens": self.args.new_tokens}  # fmt: skip
        return pooled

    def engine(self, system: str):
        from ..config import EngineOptions
        from ..engine import Engine

        if system not in self.engines:
            opts = EngineOptions(**self.options(system))
            eng = Engine(self.target, self.tok, opts, None if system == "ar" else self.drafter)
            t0 = time.perf_counter()
            # Prefill shapes of one or two prompts only: the untimed pass before each part runs the ones the
            # part meets (the engine's full sweep, every row count up to 64, is minutes at 8B).
            eng.warmup(tuple(self.concurrency), lambda m: self.say(f"{system} {m}"), prefill_batches=(1, 2))
            curve = eng.policy.auto_off.curve if eng.policy is not None and eng.policy.auto_off else None
            self.out["rows"].append({
                "case": "engine", "system": system, "warmup_s": time.perf_counter() - t0,
                "options": {k: v for k, v in self.options(system).items() if k != "device"},
                "step_curve_ms": curve.as_dict() if curve is not None else None,
                # (bucket, width) -> (carrying round ms, separate prefill ms): where prompts may ride
                "admission_costs_ms": {f"{b}x{w}": c for (b, w), c in getattr(eng, "admission_costs", {}).items()},
                "carry_ms_by_kind": {
                    f"{b}x{w}": {str(k): v for k, v in m.items()} for (b, w), m in getattr(eng, "carry_ms", {}).items()
                },
            })  # fmt: skip
            self.engines[system] = eng
        return self.engines[system]

    # ---- parts -------------------------------------------------------------------------------------
    def plan(self) -> list[tuple[str, int]]:
        done = {(c["system"], c["concurrency"]) for c in self.carried}
        order = [n for n in PRIORITY if n in self.concurrency] + [n for n in self.concurrency if n not in PRIORITY]
        parts = []
        for i, n in enumerate(order):
            k = i % len(self.systems)  # rotate: no system always first
            parts += [(s, n) for s in self.systems[k:] + self.systems[:k] if (s, n) not in done]
        return parts

    def part(self, system: str, n: int, prompts: list[list[int]], ar_ids: dict) -> None:
        from ..server.scheduler import Scheduler

        eng = self.engine(system)
        reqs = max(n * self.args.requests_per_client, self.args.min_requests)
        chosen = [prompts[i % len(prompts)] for i in range(reqs)]
        sched = Scheduler(eng, idle_wait_s=0.01)
        sched.start()
        try:
            if self.args.warm_tokens:  # the same prompts and arrivals, untimed: every prefill shape they meet
                run_clients(sched, eng, chosen, n, self.args.warm_tokens, self.args.part_timeout_s)
            before = _decisions(eng)
            lengths = request_lengths(self.args.new_tokens, reqs)
            records, wall = run_clients(sched, eng, chosen, n, lengths, self.args.part_timeout_s)
            after = _decisions(eng)
        finally:
            sched.stop()
            eng.batch.drain()
            for row, req in enumerate(eng.batch.rows):  # requests a timeout abandoned: not the next part's work
                if req is not None:
                    eng.batch.release(row)
        if system == "ar":
            ar_ids.update({r["prompt"]: r["token_ids"] for r in records if r["error"] is None})
        c = cell(system, n, records, wall, ar_ids if system != "ar" and ar_ids else None)
        c["decisions"] = _delta(before, after)
        self.out["cells"].append(c)
        self.generations[(system, n)] = [(chosen[r["prompt"]], r["token_ids"]) for r in records if r["error"] is None]
        for s in [x for x in self.systems if x != "ar"] if system == "ar" else [system]:
            self.force(s, n)
        keep = ("prompt", "n_prompt", "tokens", "ttft_s", "itl_s", "request_s", "error", "submit_s", "admit_wait_s",
                "prefill_s", "prefill_group", "overtook")  # fmt: skip
        self.out["rows"].append({"case": "requests", "system": system, "concurrency": n,
                                 "requests": [{k: r.get(k) for k in keep} for r in records]})  # fmt: skip
        tps = c["total_tokens_per_s"]
        self.say(f"{system} N={n}: {tps and round(tps, 1)} tok/s, TTFT p50 {c['ttft_p50_s']}, failed {c['failed']}")

    def force(self, system: str, n: int) -> None:
        """Token forcing of ``system``'s outputs at N against AR's on the same prompts, once both ran: every
        token a greedy system emits must be the AR engine's argmax given its prefix, except near-ties kernel
        rounding tips (``harness.token_forcing``); AR's own outputs, scored the same way, are the baseline."""
        from ..harness.token_forcing import compare_forcing, token_forcing

        if (system, n) not in self.generations or ("ar", n) not in self.generations:
            return
        try:
            score = self.engines["ar"].teacher_force_logits
            if n not in self.ar_forcing:
                self.ar_forcing[n] = token_forcing(score, self.generations[("ar", n)])
            rep, ar = token_forcing(score, self.generations[(system, n)]), self.ar_forcing[n]
            v = compare_forcing(rep, ar)
        except Exception as e:
            self.error("forcing", e, system=system, concurrency=n)
            return
        here = [c for c in self.out["cells"] if "carried_from" not in c]
        c = next(c for c in here if (c["system"], c["concurrency"]) == (system, n))
        c["forcing"] = {"tokens": rep.tokens, "mismatches": rep.mismatches, "large_margin": rep.large_margin,
                        "ar_mismatches": ar.mismatches, "ar_large_margin": ar.large_margin,
                        "accepted": v.accepted, "reasons": v.reasons,
                        "worst": worst_mismatches(rep, self.generations[(system, n)]),
                        "ar_worst": worst_mismatches(ar, self.generations[("ar", n)])}  # fmt: skip

    def finish(self) -> None:
        cells = self.out["cells"]  # the carried ones first, marked ``carried_from``
        # Over every N measured in this call or carried from an earlier one (two calls cover the grid).
        grid = sorted(set(self.concurrency) | {c["concurrency"] for c in cells})
        self.out["metrics"], self.out["incomplete"] = summarize(cells, grid)
        self.out["table"] = readme_table(cells)
        self.out["systems"] = {s: LABELS[s] for s in self.systems}

    def run(self) -> dict:
        try:
            return self._run()
        except BaseException as e:  # whatever was measured stays on disk, with the reason the run ended
            if not isinstance(e, SystemExit):
                self.error("run", e)
            self.write(f"failed: {type(e).__name__}: {e}")
            raise

    def _run(self) -> dict:
        a = self.args
        if a.resume:
            prev = json.loads(Path(a.resume).read_text())
            self.carried = [c if "carried_from" in c else dict(c, carried_from=prev.get("commit"))
                            for c in prev.get("cells", [])]  # fmt: skip
            self.out["cells"] = list(self.carried)
        request_lengths(a.new_tokens, 1)  # a malformed --new-tokens fails here, not after the warm-ups
        self.say(f"batched: N {self.concurrency}, systems {self.systems}, results {self.path}")
        self.load()
        prompts = self.prompts()
        self.write("model")
        ar_ids: dict[int, list[int]] = {}
        for system, n in self.plan():
            if self.say.elapsed() > a.deadline_s:
                self.out["skipped"].append({"part": f"{system} N={n}", "reason": f"past --deadline-s {a.deadline_s}"})
                continue
            try:
                self.part(system, n, prompts, ar_ids)
            except Exception as e:
                self.error("part", e, system=system, concurrency=n)
            self.write(f"{system} N={n}")
        self.finish()
        self.out["log"] = self.say.lines
        self.say(f"done: {self.out['metrics']}")
        return self.out


# Mismatches a cell keeps in its file, largest token margin first: enough to tell a near-tie that kernel
# rounding tipped from a wrong token (H100, 2ab09a6: one mismatch over the 0.5 eps at N = 32 that the file
# could not explain, since it kept only the counts).
WORST_KEPT = 5


def worst_mismatches(rep, generations) -> list[dict]:
    """The report's ``WORST_KEPT`` largest-margin mismatches: where (request, position, prompt length), the
    token emitted and AR's argmax, both margins (the token's below the max, and the top two's gap), the
    argmax's logit and the token's margin in bf16 rounding steps at that logit (``bf16_ulps``)."""
    from ..harness.token_forcing import bf16_ulps

    worst = sorted(rep.details, key=lambda m: -m.token_margin)[:WORST_KEPT]
    return [
        {
            "sequence": m.sequence,
            "position": m.position,
            "n_prompt": len(generations[m.sequence][0]),
            "token": m.token,
            "argmax": m.argmax,
            "token_margin": round(m.token_margin, 4),
            "top_margin": round(m.top_margin, 4),
            "large": m.large,
            "top_logit": None if m.top_logit is None else round(m.top_logit, 4),
            "ulps": None if m.top_logit is None else round(bf16_ulps(m.token_margin, m.top_logit), 2),
        }
        for m in worst
    ]


def _decisions(eng) -> dict:
    """The engine's mechanism counters now (automatic off, depths, shared budget, admission)."""
    p, b = eng.policy, eng.batch
    out = {"admissions": dict(b.admissions), "row_rounds": b.rounds, "round_tokens": b.round_tokens}
    out["carrying_kinds"] = dict(b.carrying_kinds)
    out["overtaken"] = b.overtaken  # prompts prefilled beside the rounds in flight (RowBatch._overtake)
    if p is not None:
        out |= {
            "speculation": dict(p.decisions),
            "depths": dict(p.depth_rounds),
            "shared_rounds": p.shared_rounds,
            "widths": dict(p.width_rounds),
            "width_choices": dict(p.width_choices),
            "depth_choices": dict(p.depth_choices),
            "chains": dict(p.chain_rounds),
            "chain_choices": dict(p.chain_choices),
        }
    return out


def _delta(before: dict, after: dict) -> dict:
    out = {}
    for k, v in after.items():
        if isinstance(v, dict):
            out[k] = {
                kk: vv - before.get(k, {}).get(kk, 0) for kk, vv in v.items() if vv - before.get(k, {}).get(kk, 0)
            }
        else:
            out[k] = v - before.get(k, 0)
    if out.get("row_rounds"):
        out["tau"] = out["round_tokens"] / out["row_rounds"]
    return out


@register_suite("batched", add_args=_args)
def batched(args: argparse.Namespace) -> dict:
    """Batched serving: AR, stock, SpecPilot without and with issue 18's mechanisms under N = 1..64 clients."""
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("the batched suite needs a CUDA GPU (--device cpu runs its bookkeeping on tiny models)")
    return _Run(args).run()
