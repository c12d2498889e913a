"""Paired, interleaved timing of several variants in one process.

Every block runs the variants in a palindromic order, e.g. ``A B B A`` or, for Conjugate Compilation's
anchor / candidate / placement control, ``A C P C A``. In a palindrome every variant's average slot
is the block's centre, so a linear drift inside a block (clocks warming, a neighbour starting) adds the
same to every variant and cancels in their per-block ratios; that is why non-palindromic orders are
refused.

On ``device="cuda"`` each sample is bracketed by CUDA events on the current stream, the host
synchronizes once per run, and the callables are meant to be CUDA-graph replays (see
``graphs.graph_replay``). On ``device="cpu"`` each sample is read from the wall clock
(``time.perf_counter``), with a device synchronize around it if CUDA is in use, so that the harness
also runs, and is tested, without a GPU.

A variant may be a list of callables, one per weight copy: successive calls rotate through them, so
that with enough copies the weights cannot stay resident in L2 between calls (H200: 60 MB of L2).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .jsonable import JsonMixin
from .stats import RatioCI, log_ratio_ci

Fn = Callable[[], object]
VariantFns = Fn | Sequence[Fn]


def abba_order(n_variants: int = 2) -> list[int]:
    """The order ``0 1 .. n-1 n-1 .. 1 0``; for two variants ``A B B A``."""
    return list(range(n_variants)) + list(reversed(range(n_variants)))


def anchor_candidate_control_order() -> list[int]:
    """Conjugate Compilation's block ``anchor, candidate, control, candidate, anchor``.

    The variants must be given in the order (anchor, candidate, placement control).
    """
    return [0, 1, 2, 1, 0]


@dataclass
class PairedTimes(JsonMixin):
    """Raw per-call times of an interleaved run.

    Attributes
    ----------
    names : list of str
        Variant names, in the order the variants were given.
    order : list of int
        Slots of one block as indices into ``names``.
    samples : dict of str to array of float, shape [blocks, occurrences]
        Seconds per call; ``occurrences`` is how often the variant appears in one block.
    device : str
        ``"cpu"`` (wall clock) or a CUDA device (events).
    inner : int
        Calls averaged inside each sample.
    """

    names: list[str]
    order: list[int]
    samples: dict[str, np.ndarray]
    device: str = "cpu"
    inner: int = 1

    @classmethod
    def from_block_times(cls, block_times: Mapping[str, Sequence[float]], device: str = "cpu") -> PairedTimes:
        """Wrap already-paired per-block times ``{name: [blocks]}`` (synthetic data, other tools)."""
        names = list(block_times)
        samples = {n: np.asarray(block_times[n], dtype=np.float64).reshape(-1, 1) for n in names}
        if len({s.shape[0] for s in samples.values()}) != 1:
            raise ValueError("every variant needs the same number of blocks")
        return cls(names=names, order=abba_order(len(names)), samples=samples, device=device)

    @property
    def blocks(self) -> int:
        return int(next(iter(self.samples.values())).shape[0])

    def block_times(self, name: str) -> np.ndarray:
        """Mean seconds per call of ``name`` in each block, shape [blocks]."""
        return self.samples[name].mean(axis=1)

    def median(self, name: str) -> float:
        """Median seconds per call of ``name`` over all its samples."""
        return float(np.median(self.samples[name]))

    def ratio(self, base: str, new: str, *, confidence: float = 0.95) -> RatioCI:
        """Paired ratio ``time(base) / time(new)``: above 1 when ``new`` is faster."""
        return log_ratio_ci(self.block_times(base), self.block_times(new), confidence=confidence)

    def rows(self) -> list[dict]:
        """One row per variant with every sample in microseconds, for a benchmark file."""
        return [
            {"variant": n, "order": [self.names[i] for i in self.order], "times_us": (self.samples[n] * 1e6)}
            for n in self.names
        ]


class _Rotation:
    """Calls one of several weight-copy callables per call, cycling."""

    def __init__(self, fns: VariantFns):
        self.fns = [fns] if callable(fns) else list(fns)
        if not self.fns:
            raise ValueError("a variant needs at least one callable")
        self.i = 0

    def __call__(self) -> None:
        self.fns[self.i]()
        self.i = (self.i + 1) % len(self.fns)


def _resolve_order(order: Sequence[int | str] | None, names: list[str]) -> list[int]:
    if order is None:
        return abba_order(len(names))
    idx = [names.index(o) if isinstance(o, str) else int(o) for o in order]
    if any(not 0 <= i < len(names) for i in idx):
        raise ValueError(f"order {list(order)} names a variant outside {names}")
    if set(idx) != set(range(len(names))):
        raise ValueError(f"order {list(order)} leaves out a variant of {names}")
    if idx != idx[::-1]:
        raise ValueError(f"order {list(order)} is not a palindrome, so drift would not cancel")
    return idx


def paired_timing(
    variants: Mapping[str, VariantFns],
    *,
    order: Sequence[int | str] | None = None,
    blocks: int = 30,
    warmup: int = 3,
    inner: int = 1,
    device: str | torch.device = "cpu",
    clock: Callable[[], float] = time.perf_counter,
) -> PairedTimes:
    """Time variants interleaved in palindromic blocks.

    Parameters
    ----------
    variants : mapping of name to callable or list of callables
        A list holds one callable per weight copy; calls rotate through it.
    order : sequence of int or str, optional
        One block's slots, as indices into ``variants`` or names; must be a palindrome that uses every
        variant. Default ``abba_order(len(variants))``.
    blocks : int
        Number of blocks; 20 or more for the confidence interval to reach its coverage.
    warmup : int
        Rounds through every weight copy of every variant before timing.
    inner : int
        Calls per sample; the sample is their mean. Short calls need several: for a 32 us GEMV graph on
        an H200 the stock-vs-stock noise over 40 blocks was 1.1-1.5% with ``inner=1``, 0.3-0.5% with 10.
    device : str or torch.device
        ``"cpu"`` for the wall clock, a CUDA device for CUDA events.
    clock : callable
        Wall clock for ``device="cpu"`` (replaceable by a simulated clock in tests).

    Returns
    -------
    PairedTimes
        ``samples[name]`` has shape [blocks, occurrences of name in one block].
    """
    names = list(variants)
    if not names:
        raise ValueError("nothing to time")
    if blocks < 1 or inner < 1 or warmup < 0:
        raise ValueError("blocks and inner must be >= 1, warmup >= 0")
    slots = _resolve_order(order, names)
    runners = [_Rotation(variants[n]) for n in names]
    device = torch.device(device)
    for run in runners:
        for _ in range(warmup * len(run.fns)):
            run()
    if device.type == "cuda":
        raw = _time_cuda(runners, slots, blocks, inner, device)
    else:
        raw = _time_wall(runners, slots, blocks, inner, clock)
    samples = {n: raw[:, [s for s, v in enumerate(slots) if v == i]] for i, n in enumerate(names)}
    return PairedTimes(names=names, order=slots, samples=samples, device=str(device), inner=inner)


def _time_wall(runners: list[_Rotation], slots: list[int], blocks: int, inner: int, clock) -> np.ndarray:
    # Without the synchronize, wall-clock timing of GPU work would measure only the launches.
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else (lambda: None)
    raw = np.empty((blocks, len(slots)))
    for b in range(blocks):
        for s, v in enumerate(slots):
            sync()
            t0 = clock()
            for _ in range(inner):
                runners[v]()
            sync()
            raw[b, s] = (clock() - t0) / inner
    return raw


def _time_cuda(runners: list[_Rotation], slots: list[int], blocks: int, inner: int, device: torch.device) -> np.ndarray:
    with torch.cuda.device(device):
        events = [
            [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in slots]
            for _ in range(blocks)
        ]
        torch.cuda.synchronize()
        # One host sync at the end, none between samples or blocks: the host queues ahead, so the GPU
        # never idles between events. With a sync after every block, the first slot of each block ran
        # 8% slower (185 vs 172 us, bf16 4096^3 GEMM graph on an H200), a stock-vs-stock bias of 4.5-5.5%;
        # without the gaps the same run's noise was 0.15-0.25%.
        for block in events:
            for (start, end), v in zip(block, slots, strict=True):
                start.record()
                for _ in range(inner):
                    runners[v]()
                end.record()
        torch.cuda.synchronize()
        return np.array([[s.elapsed_time(e) * 1e-3 / inner for s, e in block] for block in events])


def cuda_times_ms(fn, iters: int, warmup: int = 3) -> list[float]:
    """Per-call milliseconds of ``fn`` by CUDA events (one event pair per call)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def times_ms(fn, iters: int, cuda: bool) -> list[float]:
    """Per-call milliseconds of ``fn``: by CUDA events on the GPU (``cuda_times_ms``), by the wall clock
    otherwise (the suites' CPU dry runs, where only the bookkeeping counts)."""
    if cuda:
        return cuda_times_ms(fn, iters)
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out
