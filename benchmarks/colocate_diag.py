"""Co-location diagnostic (one GPU): the round's parts, stream priorities and grouped-GEMM configurations.

    python benchmarks/colocate_diag.py llama-3.1-8b llama-3.2-1b [--eager] [--out diag.json]

Builds the pair with synthetic weights (batch 8 in two groups of 4, gamma 4, 1,024-token prompts, as the
``colocate`` suite), checks that each two-stream round captured in one graph is bit-identical to the
sequential round, then times, paired: the verification alone, the gamma draft steps alone, both in one
graph, and the two-stream round under each stream priority. Last, two cross-model GEMM pairs (target
down + draft down, target qkv + draft gate_up) run as one grouped GEMM per configuration against the
two cuBLAS calls. Prints a table; writes the medians (us) and errors as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sglang_specpilot.colocate.coschedule import CoScheduledRound
from sglang_specpilot.colocate.grouped_gemm import GemmMember, GroupedGemm
from sglang_specpilot.colocate.plan import PRIORITIES, JointPlan
from sglang_specpilot.colocate.segments import draft_chain, verify_chain
from sglang_specpilot.engine.colocated import build_round
from sglang_specpilot.harness.graphs import graph_replay
from sglang_specpilot.harness.timing import paired_timing
from sglang_specpilot.suites.colocate import build_pair

# (block_m, block_n, block_k, split_k) tried for each GEMM pair.
CONFIGS = [
    (16, 64, 64, 1),
    (32, 64, 64, 1),
    (32, 32, 128, 1),
    (32, 64, 128, 1),
    (32, 128, 64, 1),
    (32, 64, 64, 4),
    (32, 32, 64, 8),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target")
    p.add_argument("draft")
    p.add_argument("--eager", action="store_true", help="eager non-GEMM operations (default: compiled)")
    p.add_argument("--out", type=Path, default=Path("colocate_diag.json"))
    args = p.parse_args()
    t0 = time.time()
    dev, dt = torch.device("cuda"), torch.bfloat16
    B, gamma = 8, 4
    h = B // 2
    target, draft, a, b, _ = build_pair(args.target, args.draft, B, gamma, 1024, dev, dt)
    res: dict[str, float | bool] = {}
    compiled = not args.eager
    with torch.inference_mode():
        seq = CoScheduledRound(
            verify_chain(target, a.t_inputs, compiled),
            draft_chain(draft, b.d_inputs, compiled),
            streams=False,
            device=dev,
        )
        d_only, t_only = draft_chain(draft, b.d_inputs, compiled), verify_chain(target, a.t_inputs, compiled)
        rounds = {pr: build_round(target, draft, a, b, JointPlan(priority=pr), compiled=compiled) for pr in PRIORITIES}
        seq.run()
        ref_logits = seq.target.state["logits"].clone()
        ref_drafts = torch.stack(seq.draft.state["drafts"], 1).clone()
        for pr, rnd in rounds.items():
            rnd.capture()
            rnd()
            torch.cuda.synchronize()
            res[f"identical_{pr}"] = torch.equal(rnd.target.state["logits"], ref_logits) and torch.equal(
                torch.stack(rnd.draft.state["drafts"], 1), ref_drafts
            )
        variants = {
            "t_only": graph_replay(t_only.run),
            "d_only": graph_replay(d_only.run),
            "seq_graph": graph_replay(seq.run),
        }
        variants.update({f"anchor_{pr}": rnd.graph.replay for pr, rnd in rounds.items()})
        times = paired_timing(variants, blocks=10, inner=5, device=dev)
        res.update({n: times.median(n) * 1e6 for n in times.names})

        layer = 3
        tw, dw = target.layers[layer].mlp.w2.weight, draft.layers[layer].mlp.w2.weight
        tqkv, dgu = target.layers[layer].attn.wqkv.weight, draft.layers[layer].mlp.w13.weight
        pairs = {
            "down+down": (
                (torch.randn(h * (gamma + 1), tw.shape[1], device=dev, dtype=dt), tw),
                (torch.randn(h, dw.shape[1], device=dev, dtype=dt), dw),
            ),
            "qkv+gate_up": (
                (torch.randn(h * (gamma + 1), tqkv.shape[1], device=dev, dtype=dt), tqkv),
                (torch.randn(h, dgu.shape[1], device=dev, dtype=dt), dgu),
            ),
        }
        for name, ((tx, tw_), (dx, dw_)) in pairs.items():
            ref = [F.linear(tx, tw_).float(), F.linear(dx, dw_).float()]
            var = {"sep": graph_replay(lambda tx=tx, tw_=tw_, dx=dx, dw_=dw_: (F.linear(tx, tw_), F.linear(dx, dw_)))}
            for bm, bn, bk, sk in CONFIGS:
                outs = [
                    torch.empty(tx.shape[0], tw_.shape[0], device=dev, dtype=dt),
                    torch.empty(dx.shape[0], dw_.shape[0], device=dev, dtype=dt),
                ]
                gg = GroupedGemm(
                    [GemmMember(tx, tw_, None, sk), GemmMember(dx, dw_, None, sk)],
                    outs,
                    block_m=bm,
                    block_n=bn,
                    block_k=bk,
                )
                gg()
                tag = f"g{bm}x{bn}x{bk}s{sk}"
                res[f"{name}_err_{tag}"] = max(
                    float((o.float() - r).abs().max() / r.abs().max()) for o, r in zip(outs, ref, strict=True)
                )
                var[tag] = graph_replay(gg)
            tt = paired_timing(var, blocks=10, inner=10, device=dev)
            res.update({f"{name}_{n}": tt.median(n) * 1e6 for n in tt.names})
    for k, v in res.items():
        print(f"{k:32s} {v if isinstance(v, bool) else f'{v:10.1f}'}")
    print(f"done in {time.time() - t0:.0f} s")
    args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
