"""Hybrid suite (one GPU): verify on a Gated-DeltaNet hybrid target, the three ``gdn_verify`` strategies.

On the Qwen3-Next-like preset (``qwen3-next-8b-like``: 27 GDN + 9 attention layers, synthetic weights,
bf16; timing only), batch 1, after a real prefill of ``--context`` tokens (so the recurrent states and the
KV cache hold what a prompt leaves), one target verify forward (``ModelRunner.forward``, what a round
captures) followed by the commit of its deepest spine node, of:

    wy_tree     a best-first-shaped tree of ``--budget`` drafted nodes + the root, depth ``--depth``,
                gdn_verify = "wy" (the TreeWY kernel on CUDA)
    path_tree   the same tree, gdn_verify = "path" (depth-wise path recompute, PyTorch)
    stock_chain a chain of ``--depth`` drafted nodes + the root, gdn_verify = "stock" (a state snapshot per
                position, what SGLang and vLLM keep)

each captured whole in a CUDA graph and timed interleaved (palindromic blocks, CUDA events,
``harness.timing``). The GDN mixing op alone (one layer's shapes, the same tree) is timed the same way.

Metrics: ``wy_verify_over_path_recompute`` (wy_tree / path_tree step time; goal <= 0.5),
``tree32_verify_over_chain_verify`` (wy_tree / stock_chain; goal <= 1.3), ``wy_max_ulp_vs_path`` (over
every GDN layer of one tree verify, each layer fed the path strategy's activations: the kernel's o against
the path recurrence's in bf16 ulps at scale, ``kernels.gdn_tree_wy.bf16_ulps_at_scale``; goal <= 1; the
row adds the elementwise distance and both strategies' distance from a float64 solve) and
``snapshot_memory_ratio`` (state memory a round keeps for the commit, over every GDN layer: a snapshot per
verified position of the tree over WY's k, u and path log-decays; measured from the tensors the verify
step holds). A CPU dry run (``--device cpu --model tiny-hybrid``) exercises the bookkeeping; off the GPU
"wy" is the PyTorch form and its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import time

import torch

from ..harness.bench import register_suite


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="qwen3-next-8b-like")
    p.add_argument("--dtype", default=None, help="default bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--budget", type=int, default=32, help="drafted nodes of the tree (the block adds the root)")
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--context", type=int, default=512, help="prefilled tokens before the verify")
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--inner", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", action="store_true", help="also time the TreeWY kernel's launch shapes (CUDA)")


def tree_parents(nodes: int, depth: int, seed: int) -> list[int]:
    """Block parents (-1: the root) of a tree of ``nodes`` block entries whose deepest node is at ``depth``:
    a spine first (the best-first tree's most likely path), then each node under a random earlier node
    above the deepest level. Only the shape matters to the time."""
    gen = torch.Generator().manual_seed(seed)
    parents, depths = [-1], [0]
    for i in range(1, nodes):
        above = [j for j in range(i) if depths[j] < depth]
        p = i - 1 if i <= depth else above[int(torch.randint(len(above), (), generator=gen))]
        parents.append(p)
        depths.append(depths[p] + 1)
    return parents


def _anc(parents: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    T = len(parents)
    anc = torch.eye(T, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
    return anc.to(device), (anc.sum(-1) - 1).to(device)


class _Compare:
    """A verify strategy that runs WY and path recompute on the same inputs, keeps their distances in bf16
    ulps (at scale, ``bf16_ulps_at_scale``; and elementwise, ``bf16_ulps``) and each one's from a float64
    solve, and passes the path output on (so every layer sees the reference's activations)."""

    def __init__(self):
        from ..engine.gdn_verify import strategy

        self.wy, self.path = strategy("wy"), strategy("path")
        self.worst: dict[str, list[torch.Tensor]] = {}

    def _keep(self, key: str, value: torch.Tensor) -> None:
        self.worst.setdefault(key, []).append(value.max().double())

    def run(self, q, k, v, g, beta, S0, tree):
        from ..kernels.gdn_tree_wy import bf16_ulps, bf16_ulps_at_scale
        from ..models.gdn_ops import tree_wy

        o_wy, memo = self.wy.run(q, k, v, g, beta, S0, tree)
        o_path, _ = self.path.run(q, k, v, g, beta, S0, tree)
        o_exact, _, _ = tree_wy(*(x.double() for x in (q, k, v, g, beta, S0)), tree.anc)
        self._keep("wy_vs_path", bf16_ulps_at_scale(o_wy, o_path))
        self._keep("wy_vs_exact", bf16_ulps_at_scale(o_wy, o_exact))
        self._keep("path_vs_exact", bf16_ulps_at_scale(o_path, o_exact))
        self._keep("wy_vs_path_elementwise", bf16_ulps(o_wy, o_path))
        self._keep("path_vs_exact_elementwise", bf16_ulps(o_path, o_exact))
        return o_path, memo

    def state_after(self, memo, S0, tree, last):
        return self.wy.state_after(memo, S0, tree, last)

    def summary(self) -> dict[str, float]:
        return {f"max_ulp_{k}": round(float(torch.stack(v).max()), 4) for k, v in self.worst.items()}


def _memo_bytes(memo) -> int:
    parts = memo if isinstance(memo, tuple) else (memo,)
    return sum(t.numel() * t.element_size() for t in parts)


@register_suite("hybrid", add_args=_args)
def hybrid(args: argparse.Namespace) -> dict:
    """Verify on a GDN hybrid: TreeWY vs path recompute vs stock snapshot chain (qwen3-next-8b-like, synthetic)."""
    from ..engine.attn_meta import build_step_meta, causal_tree
    from ..engine.runner import ModelRunner
    from ..harness.graphs import graph_replay
    from ..harness.timing import paired_timing
    from ..kernels.gdn_tree_wy import supported
    from ..models.build import build_model
    from ..models.presets import preset_config

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("the hybrid suite needs a CUDA GPU (or --device cpu --model tiny-hybrid for a dry run)")
    t_start = time.perf_counter()
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    dev = torch.device(args.device)
    cfg = preset_config(args.model)
    T_tree, T_chain, levels = args.budget + 1, args.depth + 1, args.depth + 1
    max_seq = args.context + 2 * T_tree
    model = build_model(cfg, device=dev, dtype=dtype, synthetic_seed=args.seed, max_positions=max_seq + 64)
    runner = ModelRunner(model, 1, max_seq, cuda_graphs=False, scratch_slots=max(64, T_tree))
    rec = runner.recurrent
    out: dict = {"metrics": {}, "rows": [], "weights": "synthetic", "model": args.model}
    if cuda:
        from ..harness.roofline import measure_peaks

        out["peaks"] = measure_peaks(dev).to_dict()

    # -- prefill a random prompt: real recurrent states and K/V for the verify to start from --------------
    gen = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, cfg.vocab_size, (1, args.context), generator=gen).to(dev)
    anc_p, depth_p = causal_tree(args.context, dev)
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    runner.step(prompt, zero, anc_p, depth_p, eager=True)
    seq_len = torch.full((1,), args.context, dtype=torch.long, device=dev)

    anc_t, depth_t = _anc(tree_parents(T_tree, args.depth, args.seed), dev)
    anc_c, depth_c = causal_tree(T_chain, dev)
    last = torch.full((1,), args.depth, dtype=torch.long, device=dev)  # the spine's end in both blocks

    def verify(name: str, anc, depth):
        tokens = torch.randint(0, cfg.vocab_size, (1, anc.shape[-1]), generator=gen).to(dev)
        meta = build_step_meta(seq_len, anc, depth, max_seq, runner.group, with_mask=False)

        def step():
            # configure is host-side only: the forward reads it when it builds its verify step. The commit
            # belongs to the step's cost (WY moves work there: it rebuilds the kept state from k, u, G).
            # It keeps the spine's end (node ``depth``: every drafted token accepted), as a full round would;
            # each replay moves the committed state on, which changes its values, not the work.
            rec.configure(name, levels)
            logits = runner.forward(tokens, meta.positions, meta.slots, seq_len, anc)
            rec.commit(last, seq_len)
            return logits

        return step

    steps = {
        "wy_tree": verify("wy", anc_t, depth_t),
        "path_tree": verify("path", anc_t, depth_t),
        "stock_chain": verify("stock", anc_c, depth_c),
    }

    # -- accuracy and memory, from eager verify steps --------------------------------------------------------
    with torch.inference_mode():
        cmp = _Compare()
        rec.configure("wy", levels)
        rec.strategy = cmp
        tokens = torch.randint(0, cfg.vocab_size, (1, T_tree), generator=gen).to(dev)
        meta = build_step_meta(seq_len, anc_t, depth_t, max_seq, runner.group, with_mask=False)
        runner.forward(tokens, meta.positions, meta.slots, seq_len, anc_t)
        acc = cmp.summary()
        memory = {}
        for name, anc, depth in (("wy", anc_t, depth_t), ("stock", anc_t, depth_t), ("stock_chain", anc_c, depth_c)):
            # "stock" on the tree: the memory of a snapshot per verified position (its outputs are unused).
            rec.configure(name.split("_")[0], levels)
            m = build_step_meta(seq_len, anc, depth, max_seq, runner.group, with_mask=False)
            runner.forward(tokens[:, : anc.shape[-1]], m.positions, m.slots, seq_len, anc)
            memory[name] = sum(_memo_bytes(memo) for _, memo in rec._pending.saved.values())
    q_probe = torch.empty(1, T_tree, cfg.linear_num_value_heads, cfg.linear_key_head_dim, device=dev)
    v_probe = torch.empty(1, T_tree, cfg.linear_num_value_heads, cfg.linear_value_head_dim, device=dev)
    wy_impl = "triton" if supported(q_probe, v_probe) else "pytorch"
    out["rows"].append(
        {
            "case": "accuracy",
            "gdn_layers": len(cfg.gdn_layers),
            "tree_nodes": T_tree,
            "depth": args.depth,
            "wy_impl": wy_impl,
            **acc,
            "note": "o of every GDN layer of one tree verify, fed the path output's activations; ulps at "
            "scale (max(|ref|, RMS of the head vector)) unless elementwise; exact = float64 WY solve",
        }
    )
    out["rows"].append(
        {
            "case": "memory",
            "bytes_snapshots_tree": memory["stock"],
            "bytes_wy_tree": memory["wy"],
            "bytes_snapshots_chain": memory["stock_chain"],
            "note": "state kept for the commit, all GDN layers, batch 1: a snapshot per position vs k, u, G",
        }
    )

    # -- timing: the whole verify forward, and the mixing op alone -----------------------------------------
    from ..engine.gdn_verify import Tree, strategy

    H, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = lambda *s: torch.randn(*s, generator=gen).to(dev)  # noqa: E731
    q, k = (torch.nn.functional.normalize(r(1, T_tree, H, dk), dim=-1) for _ in range(2))
    # One layer's inputs as the layer makes them: unit q (scaled) and k, log decays <= 0, beta in (0, 1).
    mix_in = (q * dk**-0.5, k, r(1, T_tree, H, dv), -r(1, T_tree, H).abs(), r(1, T_tree, H).sigmoid(), r(1, H, dk, dv))
    chain_in = tuple(x[:, :T_chain] for x in mix_in[:5]) + mix_in[5:]
    tree, chain = Tree.from_anc(anc_t, 1, levels), Tree.from_anc(anc_c, 1, levels)
    mixes = {
        "mix_wy_tree": lambda: strategy("wy").run(*mix_in, tree),
        "mix_path_tree": lambda: strategy("path").run(*mix_in, tree),
        "mix_stock_chain": lambda: strategy("stock").run(*chain_in, chain),
    }
    variants = {**steps, **mixes}
    with torch.inference_mode():
        fns = {n: graph_replay(f) for n, f in variants.items()} if cuda else variants
        pt = paired_timing(fns, blocks=args.blocks, inner=args.inner, device=dev if cuda else "cpu")
    med_ms = {n: pt.median(n) * 1e3 for n in variants}
    for base, new, key in (
        ("wy_tree", "path_tree", "wy_verify_over_path_recompute"),
        ("wy_tree", "stock_chain", "tree32_verify_over_chain_verify"),
        ("mix_wy_tree", "mix_path_tree", "wy_mix_over_path_mix"),
        ("mix_wy_tree", "mix_stock_chain", "tree_mix_over_chain_mix"),
    ):
        ci = pt.ratio(base, new)  # time(base) / time(new), paired by block
        out["metrics"][key] = round(ci.ratio, 4)
        out["rows"].append({"case": f"ratio.{key}", "numerator": base, "denominator": new, **ci.to_dict()})
    for n, ms in med_ms.items():
        out["metrics"][f"{n}_ms"] = round(ms, 4)
    out["metrics"]["wy_max_ulp_vs_path"] = acc["max_ulp_wy_vs_path"]
    out["metrics"]["wy_max_ulp_vs_fp64"] = acc["max_ulp_wy_vs_exact"]
    out["metrics"]["snapshot_memory_ratio"] = round(memory["stock"] / memory["wy"], 3)
    # The op's bytes: q, k, v, g, beta and S0 in, o and u out (fp32); S0 dominates (d_k d_v per head).
    op_bytes = sum(x.numel() * 4 for x in mix_in) + 2 * T_tree * H * dv * 4
    out["rows"].append(
        {
            "case": "timing",
            "tree_nodes": T_tree,
            "chain_nodes": T_chain,
            "context": args.context,
            "dtype": str(dtype).removeprefix("torch."),
            "wy_impl": wy_impl,
            "median_ms": med_ms,
            "mix_wy_GBps": op_bytes / (med_ms["mix_wy_tree"] * 1e-3) / 1e9,
            "samples": pt.rows(),
        }
    )
    if args.sweep and (cuda or wy_impl == "triton"):  # on the CPU: the interpreter's bookkeeping run
        _sweep(mix_in, anc_t, levels, args, out)
    out["metrics"]["suite_seconds"] = round(time.perf_counter() - t_start, 1)
    return out


def _sweep(mix_in, anc, levels: int, args, out: dict) -> None:
    """Time the kernel's launch shapes around ``pick_config``'s on one layer's inputs (graph replays,
    interleaved); a shape that fails to build or launch, or strays over one bf16 ulp from the default's
    output, is noted and left out. Rows only, and the best's time as a metric: the table stays by hand."""
    from ..harness.graphs import graph_replay
    from ..harness.timing import paired_timing
    from ..kernels.gdn_tree_wy import _launch, _num_sms, bf16_ulps_at_scale, pick_config

    q, k, v, g, beta, S0 = mix_in
    B, T, H, dk = q.shape
    base = pick_config(B, H, T, dk, v.shape[-1], levels, _num_sms(q.device))
    shapes = {base}
    for bv in (16, 32, 64):
        for chunk in (16, 32):
            for warps in (4, 8):
                shapes.add(base._replace(block_v=bv, chunk_k=chunk, num_warps=warps))
    shapes |= {base._replace(num_stages=1), base._replace(num_stages=3)}
    ref = _launch(q, k, v, g, beta, S0, anc, base)[0]
    fns, notes = {}, []
    for cfg in sorted(shapes):
        name = f"bv{cfg.block_v}_k{cfg.chunk_k}_w{cfg.num_warps}_s{cfg.num_stages}"
        try:
            o = _launch(q, k, v, g, beta, S0, anc, cfg)[0]
            err = float(bf16_ulps_at_scale(o, ref).max())
            if err > 1:
                notes.append({"config": name, "skipped": f"{err:.2f} ulps from the default's output"})
                continue
            fn = lambda c=cfg: _launch(q, k, v, g, beta, S0, anc, c)  # noqa: E731
            fns[name] = graph_replay(fn) if q.is_cuda else fn
        except Exception as e:  # a shape the GPU cannot build or launch (registers, shared memory)
            notes.append({"config": name, "skipped": f"{type(e).__name__}: {e}"[:200]})
    with torch.inference_mode():
        inner = max(10, args.inner) if q.is_cuda else args.inner  # a kernel of ~10 us: 10 calls a sample
        pt = paired_timing(fns, blocks=args.blocks, inner=inner, device=q.device if q.is_cuda else "cpu")
    us = {n: round(pt.median(n) * 1e6, 2) for n in fns}
    best = min(us, key=us.get)
    default = f"bv{base.block_v}_k{base.chunk_k}_w{base.num_warps}_s{base.num_stages}"
    out["rows"].append({"case": "sweep.mix_wy_tree", "median_us": us, "default": default, "best": best, "notes": notes})
    out["metrics"]["mix_wy_tree_best_of_sweep_ms"] = round(us[best] / 1e3, 4)
