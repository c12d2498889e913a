"""The model of the end-to-end suites (e2e, tlv, batched): the real SmolLM2 or its lift, with the EAGLE-3 drafter.

``--target smollm2`` is the real SmolLM2-135M-Instruct with the drafter as trained; any ``models.lift``
shape (``llama-3.1-8b``, ``llama-3.2-1b``, ``tiny``; ``--lift-layers`` cuts it for CPU dry runs) is
"SmolLM2-135M lifted to <shape> (stand-in, timing)": SmolLM2's text at that shape's cost, the drafter
lifted with it (``models.lift_eagle3``). The suites share these flags and this loader so that a number
of one suite is a number of the same model as the other's.
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass

import torch


def add_model_args(p: argparse.ArgumentParser, dtype_help: str | None = None) -> None:
    """The flags every stand-in suite takes for its model and engines (``--target`` / ``--model`` /
    ``--draft`` stay with each suite: their defaults and help differ)."""
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--device", default="cuda", help="cuda; cpu runs the bookkeeping on tiny models (dry run)")
    p.add_argument("--dtype", default="bfloat16", help=dtype_help)
    p.add_argument("--lift-layers", type=int, default=None, help="cut the lift shape to this many layers (dry runs)")
    p.add_argument("--no-compile", action="store_true", help="engines without torch.compile")
    p.add_argument("--seed", type=int, default=0, help="seed of the lift's random entries")


@dataclass
class StandIn:
    target: torch.nn.Module
    drafter: torch.nn.Module
    tok: object
    real_vocab: int  # the SmolLM2 vocabulary: a lifted vocabulary's extra ids name no token
    info: dict  # what the results file says of the model (label, shape, sizes, build time)


def load_stand_in(args: argparse.Namespace, device: torch.device, n_positions: int, say=None) -> StandIn:
    """``args.target`` with its drafter (``args.draft``, default the shipped one), on ``device``, with rope
    tables for ``n_positions``; ``say`` gets a progress line. Refuses a non-EAGLE-3 drafter and an unknown
    target in one line."""
    from ..drafters import default_drafter_path
    from ..drafters.eagle3 import is_eagle3, load_eagle3
    from ..models.lift import SHAPES, lift_model, load_small
    from ..models.lift_eagle3 import lift_eagle3

    draft = args.draft or str(default_drafter_path())
    if not is_eagle3(draft):
        raise SystemExit(
            f"--draft {draft!r} is not an EAGLE-3 drafter folder (train one: specpilot train-drafter --kind eagle3)"
        )
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    if args.target == "smollm2":
        from ..models.build import build_model
        from ..models.loader import default_model_path, load_model_files

        cfg, sd, tok = load_model_files(args.model or default_model_path())
        target = build_model(cfg, device=device, dtype=dtype, state_dict=sd, max_positions=n_positions)
        del sd
        drafter = load_eagle3(draft, target)
        real_vocab, lifted = cfg.vocab_size, False
    else:
        if args.target not in SHAPES:
            raise SystemExit(f"--target {args.target!r}: use smollm2 or a lift shape ({', '.join(SHAPES)})")
        # The shape's name (not a dict) names the lift in the model's label.
        shape = args.target if args.lift_layers is None else {**SHAPES[args.target], "num_layers": args.lift_layers}
        small, tok = load_small(args.model, max_positions=1)
        small_draft = load_eagle3(draft, small)
        real_vocab, lifted = small.cfg.vocab_size, True
        if say:
            say(f"loaded {small.cfg.name} and the drafter ({time.perf_counter() - t0:.1f} s); lifting to {args.target}")
        target = lift_model(small, shape, args.seed, device=device, dtype=dtype, max_positions=n_positions)
        drafter = lift_eagle3(small_draft, target, shape, args.seed + 1, dtype=dtype)
        del small, small_draft
        gc.collect()
    info = {
        "label": target.cfg.name,
        "target": args.target,
        "lifted": lifted,
        "source": args.model or "embedded SmolLM2-135M-Instruct",
        "draft": draft,
        "params_b": round(target.cfg.num_params() / 1e9, 3),
        "drafter_params_m": round(sum(p.numel() for n, p in drafter.named_parameters() if "embed" not in n) / 1e6, 1),
        "feature_layers": list(drafter.feature_layers),
        "draft_vocab": drafter.spec.draft_vocab,
        "dtype": args.dtype,
        "build_s": round(time.perf_counter() - t0, 2),
    }
    return StandIn(target, drafter, tok, real_vocab, info)
