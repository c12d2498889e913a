"""Continuous batching at round boundaries: requests join free KV rows and leave when they finish.

``RowBatch`` owns the per-row state that ``Engine._run`` keeps in locals for one whole batch (token
history, lengths, the next token, sampling tensors) and keeps it across rounds, so a scheduler can
``admit`` new requests, run ``step`` (one AR step or speculative round for every row in use) and
``release`` a row whenever it likes between rounds. Rows are the static KV cache's rows (pad, not pack):
a request keeps its row from admission to release, and a released row is reused as it is, since
nothing past a row's length is ever attended to.

A step runs rows ``0 .. hi-1`` where ``hi`` is one past the highest row in use; free rows inside that
range ride along with length 1 (they only write into their own, unowned row). Admission fills the
lowest free row first to keep ``hi`` small. A lone request in row 0 runs exactly the shapes
``Engine.generate`` runs for a batch of one, so greedy output matches it token for token.

Not thread-safe: one thread (the server's scheduler) drives it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .engine import Engine
from .request import Request, StreamEvent
from .sampling import BatchSampling, SamplingParams, next_tokens

_IDLE = SamplingParams()  # sampling parameters of a free row (greedy: costs no sampling work)


class RowBatch:
    def __init__(self, engine: Engine):
        self.engine = engine
        dev, B = engine.device, engine.options.max_batch_size
        width = engine.options.max_seq_len + engine.target_runner.scratch
        self.history = torch.zeros(B, width, dtype=torch.long, device=dev)
        # A free row keeps length 1: a draft step reads the token at seq_len - 1.
        self.seq_len = torch.ones(B, dtype=torch.long, device=dev)
        self.next_tok = torch.zeros(B, dtype=torch.long, device=dev)
        self.host_len = [0] * B  # seq_len as the host knows it (one readback per round keeps it exact)
        self.rows: list[Request | None] = [None] * B
        # One generator for the life of the batch: rebuilding it whenever membership changes would replay
        # the same random stream. A request with a seed reseeds it on admission (exact reproduction only
        # when that request runs alone, the same promise ``Engine.generate`` makes for a batch).
        self.generator = torch.Generator(device=dev)
        self.generator.manual_seed(torch.seed())
        self._bs: BatchSampling | None = None
        self.rounds = 0  # row-rounds: one per row in use per step
        self.round_tokens = 0  # tokens those row-rounds emitted (accepted drafts + bonus)

    # ---- occupancy ---------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return len(self.rows)

    @property
    def free_rows(self) -> list[int]:
        return [i for i, r in enumerate(self.rows) if r is None]

    @property
    def active(self) -> int:
        return sum(r is not None for r in self.rows)

    def _hi(self) -> int:
        return max((i + 1 for i, r in enumerate(self.rows) if r is not None), default=0)

    def _sampling(self, hi: int) -> BatchSampling:
        if self._bs is None or self._bs.temperature.shape[0] != hi:
            params = [r.params if r is not None else _IDLE for r in self.rows[:hi]]
            self._bs = replace(BatchSampling.from_params(params, self.engine.device), generator=self.generator)
        return self._bs

    def release(self, row: int) -> Request | None:
        """Free ``row`` (finished, cancelled or failed); its KV is simply overwritten by the next owner."""
        req, self.rows[row] = self.rows[row], None
        self.seq_len[row] = 1
        self.host_len[row] = 0
        self._bs = None
        return req

    # ---- admission and rounds ----------------------------------------------------------------------
    @torch.inference_mode()
    def admit(self, reqs: list[Request]) -> list[StreamEvent]:
        """Prefill ``reqs`` into free rows (all in one prefill) and return their first-token events.

        Each request's ``index`` becomes its row. Raises ``ValueError`` when there are too few free rows.
        """
        free = self.free_rows
        if len(reqs) > len(free):
            raise ValueError(f"{len(reqs)} requests but only {len(free)} free rows")
        if not reqs:
            return []
        dev = self.engine.device
        for req, row in zip(reqs, free, strict=False):
            req.index = row
            self.rows[row] = req
            self.history[row].zero_()  # drafts read past the length; keep them independent of the last owner
            self.history[row, : len(req.prompt)] = torch.tensor(req.prompt, device=dev)
            if req.params.seed is not None:
                self.generator.manual_seed(req.params.seed)
        self._bs = None
        hi = self._hi()
        lens = [0] * hi
        for req in reqs:
            lens[req.index] = len(req.prompt)
        last = self.engine.prefill_rows(self.history[:hi], lens)
        first = next_tokens(last, self._sampling(hi))
        rows = torch.tensor([r.index for r in reqs], device=dev)
        self.next_tok[rows] = first[rows]
        self.seq_len[rows] = torch.tensor([len(r.prompt) for r in reqs], device=dev)
        first_host = first[rows].tolist()
        events = []
        for req, tok in zip(reqs, first_host, strict=True):
            self.host_len[req.index] = len(req.prompt)
            events += self._emit(req, [tok], count_round=False)
        return events

    @torch.inference_mode()
    def step(self) -> list[StreamEvent]:
        """One round for every row in use; finished rows are released before this returns."""
        hi = self._hi()
        if hi == 0:
            return []
        in_use = torch.tensor([r is not None for r in self.rows[:hi]], device=self.engine.device)
        new, n, nxt = self.engine.round_step(
            self.history[:hi], self.seq_len[:hi], self.next_tok[:hi], self._sampling(hi), max(self.host_len[:hi])
        )
        self.seq_len[:hi] += (n + 1) * in_use
        self.next_tok[:hi] = nxt
        packed = torch.cat([new, n[:, None]], 1).tolist()  # the one host sync of a round
        events = []
        for row, req in enumerate(self.rows[:hi]):
            if req is None:
                continue
            k = packed[row][-1] + 1
            self.host_len[row] += k
            self.rounds += 1
            self.round_tokens += k
            events += self._emit(req, packed[row][:k], count_round=True)
        return events

    def _emit(self, req: Request, ids: list[int], count_round: bool) -> list[StreamEvent]:
        ev = req.add(ids, self.engine.tokenizer.decode, count_round=count_round)
        if req.finished:
            self.release(req.index)
        return [ev] if ev is not None else []
