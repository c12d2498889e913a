"""Colocate suite (one GPU): co-located draft/target rounds against the conventional round.

Per pair (synthetic weights at the published shapes, batch split in two groups, gamma draft steps,
``--prompt-len`` tokens already in the caches): the conventional round of one group (draft then verify,
as one captured graph and as two graphs back to back), the conventional round of the whole batch (the
throughput a split must beat: ``throughput_vs_full_batch``), the plain two-stream round (the anchor), and the
best plans MCTS finds without and with interleaved kernels; every plan is gated, checked numerically and
timed anchor / candidate / control in paired blocks (``controller.plan_eval``). GPU utilization is the
busy fraction of a ``torch.profiler`` kernel trace. ``--device cpu`` with tiny presets is a dry run of
the bookkeeping (wall-clock times; no graphs, no trace).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from ..colocate.coschedule import CoScheduledRound
from ..colocate.realize import RealizedGroup
from ..colocate.segments import draft_chain, verify_chain
from ..controller.mcts import MCTS
from ..controller.plan_eval import PlanEvaluator, anchor_speedup, paired_ratio_median
from ..controller.proposer import EditProposer, ProposalContext
from ..engine.colocated import RoundBuffers, build_round
from ..engine.kv_cache import KVCache
from ..harness.bench import register_suite
from ..harness.graphs import graph_replay
from ..harness.timing import paired_timing
from ..models.build import build_model
from ..models.presets import preset_config

PAIRS = {
    "llama-3.1-8b:llama-3.2-1b": "llama8b_1b",
    "qwen3-8b:qwen3-0.6b": "qwen3_8b_06b",
    "llama-3.2-3b:llama-3.2-1b": "llama3b_1b",
}


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pairs", default=",".join(PAIRS), help="target:draft presets, comma separated")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--inner", type=int, default=10)
    p.add_argument("--search-iters", type=int, default=24)
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="eager non-GEMM operations (default on CUDA: each compiled, as the engine's steps are)",
    )
    p.add_argument("--state-dir", type=Path, default=None, help="keep MCTS state here (resumable)")


def _log(t0: float, msg: str) -> None:
    # Progress on stderr: a device run that hits its time limit still says how far it got.
    print(f"[colocate {time.perf_counter() - t0:7.1f} s] {msg}", file=sys.stderr, flush=True)


def _slug(pair: str) -> str:
    return PAIRS.get(pair) or pair.replace(":", "_").replace("-", "").replace(".", "")


def _runner(fn, cuda: bool):
    # Time graph replays on CUDA (launch overhead out of the measurement), eager calls on the CPU.
    return graph_replay(fn) if cuda else fn


def _gpu_busy_fraction(fn, cuda: bool, reps: int = 5) -> float | None:
    """Union of kernel intervals over the span of the trace, for ``reps`` calls of ``fn``."""
    if not cuda:
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    spans = sorted(
        (e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    )
    if not spans:
        return None
    busy, cur_s, cur_e = 0.0, *spans[0]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    return busy / max(1e-9, spans[-1][1] - spans[0][0])


def _state_before(chain, info) -> dict:
    """The chain's slots as the op ``info`` sees them in a round (slot names are reused across steps, so
    the state after a whole round would hand a draft step-0 op the last step's narrower tensors)."""
    for seg in chain.segments[: info.segment]:
        seg.run(chain.state)
    for op in chain.segments[info.segment].ops[: info.position]:
        op.run(chain.state)
    return dict(chain.state)


def build_pair(tname: str, dname: str, batch: int, gamma: int, prompt_len: int, dev: torch.device, dtype):
    """A target/draft pair with synthetic weights and filled caches, ready for timed rounds.

    Returns ``(target, draft, a, b, full)``: the ``RoundBuffers`` of the two groups (rows ``[0, batch/2)``
    and ``[batch/2, batch)``) and of the whole batch, each loaded at ``prompt_len`` tokens with random
    verification and draft blocks (never time on zeros).
    """
    kv_len = prompt_len + 2 * (gamma + 1) + 64
    target = build_model(preset_config(tname), device=dev, dtype=dtype, synthetic_seed=0, max_positions=kv_len)
    draft = build_model(preset_config(dname), device=dev, dtype=dtype, synthetic_seed=1, max_positions=kv_len)
    g = torch.Generator(device=dev).manual_seed(0)
    tk, dk = (KVCache(m.cfg, batch, kv_len, dev, dtype) for m in (target, draft))
    for k, v in tk.layers + dk.layers:
        k.normal_(generator=g)
        v.normal_(generator=g)
    h = batch // 2
    a = RoundBuffers(target, draft, tk, dk, 0, h, gamma, kv_len)
    b = RoundBuffers(target, draft, tk, dk, h, batch, gamma, kv_len)
    # The conventional round over the whole batch: what the same requests cost without splitting them.
    full = RoundBuffers(target, draft, tk, dk, 0, batch, gamma, kv_len)
    V = min(target.cfg.vocab_size, draft.cfg.vocab_size)  # real pairs share a vocabulary; tiny ones may not
    for buf in (a, b, full):
        buf.load(torch.full((buf.hi - buf.lo,), prompt_len, device=dev))
        buf.verify_block.copy_(torch.randint(2, V, buf.verify_block.shape, device=dev, generator=g))
        buf.draft_block.copy_(torch.randint(2, V, buf.draft_block.shape, device=dev, generator=g))
    return target, draft, a, b, full


def run_pair(pair: str, args) -> tuple[dict, list[dict]]:
    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    cuda = dev.type == "cuda"
    t0 = time.perf_counter()
    tname, dname = pair.split(":")
    target, draft, a, b, full = build_pair(tname, dname, args.batch, args.gamma, args.prompt_len, dev, dtype)

    _log(t0, f"{pair}: models and caches built")

    compiled = cuda and not args.no_compile

    def make(plan):
        return build_round(target, draft, a, b, plan, compiled=compiled)

    with torch.inference_mode():
        # Conventional round of one group: draft then verify, in one graph and as two graphs.
        seq = CoScheduledRound(
            verify_chain(target, a.t_inputs, compiled),
            draft_chain(draft, a.d_inputs, compiled),
            streams=False,
            device=dev,
        )
        d_only, t_only = draft_chain(draft, a.d_inputs, compiled), verify_chain(target, a.t_inputs, compiled)
        d_run, t_run = _runner(d_only.run, cuda), _runner(t_only.run, cuda)
        anchor = make(None)
        seq_full = CoScheduledRound(
            verify_chain(target, full.t_inputs, compiled),
            draft_chain(draft, full.d_inputs, compiled),
            streams=False,
            device=dev,
        )
        base = paired_timing(
            {
                "seq_graph": _runner(seq.run, cuda),
                "back_to_back": lambda: (d_run(), t_run()),
                "anchor": _runner(anchor.run, cuda),
                "seq_graph_full_batch": _runner(seq_full.run, cuda),
            },
            blocks=args.blocks,
            inner=args.inner,
            device=dev,
        )
        s_anchor, fastest = anchor_speedup(base, "anchor", ["seq_graph", "back_to_back"])
        _log(
            t0,
            "baselines (us): "
            + ", ".join(f"{n} {base.median(n) * 1e6:.0f}" for n in base.names)
            + f"; two-stream speedup {s_anchor:.3f} over {fastest}",
        )

        def build(plan):
            return _runner(make(plan).run, cuda)

        def outputs(plan):
            rnd = make(plan)
            rnd.run()
            return {
                "target_logits": rnd.target.state["logits"].clone(),
                "draft_logits": torch.stack(rnd.draft.state["draft_logits"], 1).clone(),
            }

        def group_times(group):
            rnd = make(None)
            ops = []
            for m in group.members:
                info = rnd.catalog[m]
                ch = rnd.target if info.model == "target" else rnd.draft
                ops.append((m, ch.segments[info.segment].ops[info.position], _state_before(ch, info)))
            # Every variant writes into a dict of its own, so none rebinds a slot another one reads (a residual
            # add reads and writes "x"); ``ops`` keeps the input tensors alive while the graphs replay.
            realized = RealizedGroup(group, [(op, dict(st)) for _, op, st in ops], dev)
            variants = {m: _runner(lambda op=op, st=st: op.run(dict(st)), cuda) for m, op, st in ops}
            variants["group"] = _runner(realized.run, cuda)
            return paired_timing(variants, blocks=args.blocks, inner=args.inner, device=dev)

        catalog = anchor.catalog
        evaluator = PlanEvaluator(
            catalog, build, outputs, group_times, s_anchor, device=str(dev), blocks=args.blocks, inner=args.inner
        )
        best = {}
        for label, root_interleave in (("no_interleave", False), ("interleave", True)):
            from ..colocate.plan import JointPlan

            path = args.state_dir / f"{_slug(pair)}_{label}.json" if args.state_dir else None
            search = MCTS(
                EditProposer(seed=0),
                evaluator,
                ProposalContext(catalog),
                root=JointPlan(interleave=root_interleave),
                state_path=path,
            )
            evaluator.restore(search.records.values())  # a resumed search keeps its tuned kernels
            for it in range(args.search_iters):
                key = search.step()
                r = search.records[key]
                _log(
                    t0, f"{label} #{it}: {key[:90]} reward {r['reward']} " + " ".join(f["code"] for f in r["feedback"])
                )
            plan = search.best()
            best[label] = (plan, search.records[plan.key])
        busy = {
            "conventional": _gpu_busy_fraction(_runner(seq.run, cuda), cuda),
            "anchor": _gpu_busy_fraction(_runner(anchor.run, cuda), cuda),
            "best_no_interleave": _gpu_busy_fraction(build(evaluator.tuned(best["no_interleave"][0])), cuda),
            "best": _gpu_busy_fraction(build(evaluator.tuned(best["interleave"][0])), cuda),
        }

    slug = _slug(pair)
    # Co-located rounds serve one group (batch / 2 requests) per round; the conventional round over the
    # whole batch serves all of them at once, so with equal acceptance the throughput of co-located rounds
    # over full-batch conventional ones is time(full batch round) / (2 time(co-located round)).
    per_request = paired_ratio_median(base, "seq_graph_full_batch", "anchor") / 2
    metrics = {
        f"throughput_vs_full_batch_{slug}": float(per_request),
        f"round_speedup_{slug}": float(best["interleave"][1]["reward"]),
        f"round_speedup_no_interleave_{slug}": float(best["no_interleave"][1]["reward"]),
        f"round_speedup_two_stream_{slug}": float(s_anchor),
    }
    rows = [
        {
            "case": f"{slug}.baselines",
            "target": tname,
            "draft": dname,
            "batch": args.batch,
            "gamma": args.gamma,
            "prompt_len": args.prompt_len,
            "weights": "synthetic",
            "fastest_conventional": fastest,
            "median_us": {n: base.median(n) * 1e6 for n in base.names},
            "anchor_over_seq_graph": paired_ratio_median(base, "seq_graph", "anchor"),
            "gpu_busy": busy,
        }
    ]
    for label, (plan, rec) in best.items():
        rows.append(
            {
                "case": f"{slug}.best_{label}",
                "plan": evaluator.tuned(plan).to_dict(),
                "reward": rec["reward"],
                "info": rec["info"],
                "verdicts": rec["verdicts"],
            }
        )
    return metrics, rows


def derived_metrics(rows: list[dict]) -> dict:
    """Per pair, from its baselines row: the conventional and two-stream round times (us) and each
    system's GPU busy fraction, so the README table shows them beside the speedups."""
    out = {}
    for r in rows:
        if not r["case"].endswith(".baselines"):
            continue
        slug = r["case"].rsplit(".", 1)[0]
        us = r["median_us"]
        out[f"round_us_conventional_{slug}"] = us[r["fastest_conventional"]]
        out[f"round_us_two_stream_{slug}"] = us["anchor"]
        if "seq_graph_full_batch" in us:
            out[f"round_us_conventional_full_batch_{slug}"] = us["seq_graph_full_batch"]
        for system, frac in (r.get("gpu_busy") or {}).items():
            if frac is not None:
                out[f"gpu_busy_{system}_{slug}"] = frac
    return out


@register_suite("colocate", add_args=_args)
def colocate(args):
    """Co-located draft/target rounds: conventional, two-stream, searched plans without / with interleaving."""
    out = {"metrics": {}, "rows": [], "weights": "synthetic"}
    if args.state_dir:
        args.state_dir.mkdir(parents=True, exist_ok=True)
    for pair in args.pairs.split(","):
        metrics, rows = run_pair(pair, args)
        out["metrics"].update(metrics)
        out["rows"] += rows
    out["metrics"].update(derived_metrics(out["rows"]))
    return out
