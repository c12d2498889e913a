"""Capture a callable into a CUDA graph so that timing measures its replay, not its launches."""

from __future__ import annotations

from collections.abc import Callable

import torch


def graph_replay(fn: Callable[[], object], *, warmup: int = 3) -> Callable[[], None]:
    """Capture ``fn`` into a CUDA graph and return the graph's ``replay``.

    ``fn`` must be capturable: static shapes, no host syncs, its inputs and outputs in tensors that
    outlive the graph. It runs ``warmup`` times on a side stream first, as capture requires (lazy
    initialisation such as cuBLAS workspaces must not happen during capture).

    Parameters
    ----------
    fn : callable
        The work to capture, called with no arguments.
    warmup : int
        Eager calls before capture.

    Returns
    -------
    callable
        ``replay()`` launches the captured work on the current stream. It keeps ``fn`` (and so whatever
        ``fn`` holds) alive: the graph reads memory that ``fn``'s objects allocated before capture, such
        as an interleaved kernel's descriptor table, and replaying after that memory is freed is an
        illegal access.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()

    def replay(graph=graph, fn=fn) -> None:
        graph.replay()

    return replay
