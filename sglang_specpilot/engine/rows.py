"""The one loop: requests join free KV rows, ``step()`` runs one round for every row, rows leave when done.

``Engine.generate`` / ``Engine.stream`` admit their requests and run ``while batch.busy: batch.step()``;
the server's scheduler runs the same ``step()`` between admissions, so both get the same rounds, the same
lookahead and the same shapes. Rows are the static KV cache's rows (pad, not pack): a request keeps its row
from admission to release, and a released row is reused as it is, since nothing past a row's length is
ever attended to.

A step runs rows ``0 .. hi-1`` padded up to a batch bucket (the graph ladder); free rows ride along with
``in_use`` False at the length their last request left (or 1), so they only write into their own, unowned
row, past that length. Admission fills the lowest free row first to keep ``hi`` small; a prompt admitted
while rounds are in flight may instead take a free row whose kept length clears its prefill's slots and be
prefilled beside those rounds (``_overtake``). A lone request in row 0 runs exactly the shapes of a batch of
one, so greedy output does not depend on how a request arrived.

Lookahead (CUDA): ``step()`` launches round t + 1 before it reads round t's tokens back, so the GPU never
waits for the host's bookkeeping (streaming, stop strings). The read is the one host sync of a round,
into a pinned buffer, and it overlaps the round just launched. A row that finished in round t therefore
runs one extra round; its writes land past its length (the cache's scratch slots absorb them) and its
tokens are dropped. Greedy rounds replay a CUDA graph per bucket (``round.CapturedRound``); sampled rounds
and prompt-lookup trees run the same ``Round.run`` eagerly.

Failures are per row. Each request's own work at admission (its sampling parameters turned into tensors,
its seed, its prompt written into ``history``) runs alone, so a request that breaks there fails by itself;
if the shared prefill still fails, its requests are prefilled again in halves (down to one), in the rows they were
given. A round's result carries a per-row flag, computed on the device, for target logits that hold a NaN
or inf (a corrupt checkpoint, say): that row fails with a clear error instead of emitting what its argmax
made of them, its K/V is cleared before the row is reused, and the other rows go on. A failed request
ends with ``finish_reason == "error"`` (``Request.fail``).

Not thread-safe: one thread (the caller of ``generate``, or the server's scheduler) drives it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels.hold_gate import hold, release
from .admission import FALLBACK, RIDE, RIDER_SLOTS, admission_path, carry_kind, rider_width
from .host_copy import to_device
from .packed_prefill import SLOT_BUCKETS, commit_pending, packable, packed_prefill
from .request import Request, StreamEvent
from .sampling import BatchSampling, SamplingParams, next_tokens, nonfinite_rows

log = logging.getLogger("specpilot.engine")

# Overtaking prefill (below): an A/B switch for benchmarks run in separate processes
# (SPECPILOT_OVERTAKE=0: a prompt admitted while rounds are in flight waits for them, as before).
OVERTAKE = os.environ.get("SPECPILOT_OVERTAKE", "1") != "0"
# Slots below a free row's kept length that a round still in flight may write there, in units of the round's
# max_emitted: an EAGLE-3 drafter writes the K/V of the previous round's accepted tokens (at most
# max_emitted) just below the length. Twice that, for room to spare.
OVERTAKE_MARGIN = 2
# How often ``step(between=...)`` looks for new work while the round it reads is still running.
POLL_S = 0.0002

_IDLE = SamplingParams()  # sampling parameters of a free row (greedy: costs no sampling work)

NONFINITE = (
    "the model produced non-finite logits (NaN or inf) for this request; its output cannot be trusted. "
    "The checkpoint may be corrupt (GGUF files carry no checksum: compare it with its source) or its "
    "values overflow in this dtype"
)


@dataclass
class _Inflight:
    rows: list[Request | None]  # row -> request when the round was launched
    host: torch.Tensor  # [b, D + 3] (pinned on CUDA): a copy of ``state.out``
    done: torch.cuda.Event | None
    kind: object = None  # the round kind it ran (``Engine.kinds``; None: the engine's own round)
    admitted: list[Request] | None = None  # prompts whose prefill rode in the round (``admission``)
    admitted_host: torch.Tensor | None = None  # [b, 2]: first tokens and non-finite flags (riders' rows)


class RowBatch:
    def __init__(self, engine):
        self.engine = engine
        self.state = engine.state
        dev, B = engine.device, engine.options.max_batch_size
        # On by default where the device runs asynchronously (CUDA); the CPU runs it too when asked
        # (tests: the bookkeeping of a round in flight is the same).
        self.lookahead = dev.type == "cuda"
        self.host_len = [0] * B  # seq_len as the host knows it (exact up to the round in flight)
        self.rows: list[Request | None] = [None] * B
        # One generator for the life of the batch: rebuilding it whenever membership changes would replay
        # the same random stream. A request with a seed reseeds it on admission (exact reproduction only
        # when that request runs alone, the same promise ``Engine.generate`` makes for a batch).
        self.generator = torch.Generator(device=dev)
        self.generator.manual_seed(torch.seed())
        self._bs: dict[int, BatchSampling] = {}
        self._inflight: _Inflight | None = None
        # Two pinned host buffers, used in turn: pinned allocation per round costs more than a round.
        width = self.state.out.shape[1]
        self._pinned = (
            [torch.empty((B, width), dtype=torch.long, pin_memory=True) for _ in range(2)] if dev.type == "cuda" else []
        )
        self._first_pinned = torch.empty((B, 2), dtype=torch.long, pin_memory=True) if dev.type == "cuda" else None
        self._launches = 0
        self.rounds = 0  # row-rounds: one per row in use per step
        self.round_tokens = 0  # tokens those row-rounds emitted (accepted drafts + bonus)
        # Chooses each step's round kind from the rows' recent acceptance (None with default options).
        self.policy = getattr(engine, "policy", None)
        # Prompt admission (``admission``): prompt tokens a round may carry (0: off), the parked prompts
        # waiting for the next round, and the decisions by path (/metrics).
        self.admission = getattr(engine.options, "prompt_admission", 0)
        self._riders: list[Request] = []
        self.admissions: dict[str, int] = {}
        self.carrying_kinds: dict[str, int] = {}  # rounds that carried prompts, by the kind that ran (/metrics)
        self._fallback_events: list[StreamEvent] = []
        # Overtaking prefill: the length each free row keeps on the device (what rounds in flight may still
        # write past), the stream of higher priority it runs on, and how many prompts took it.
        self._free_len = [0] * B
        self._prio: torch.cuda.Stream | None = None
        self.overtake = OVERTAKE and self.lookahead and packable(engine)
        self.overtaken = 0

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

    @property
    def busy(self) -> bool:
        """Rows in use, or a round whose tokens are still to be read."""
        return self.active > 0 or self._inflight is not None

    def _hi(self) -> int:
        return max((i + 1 for i, r in enumerate(self.rows) if r is not None), default=0)

    def _bucket(self, hi: int) -> int:
        return next(b for b in self.engine.target_runner.ladder if b >= hi)

    def _sampling(self, b: int) -> BatchSampling:
        # Rows 0 .. b-1 (free ones greedy); built once per membership change, read by every round.
        if b not in self._bs:
            params = [r.params if r is not None else _IDLE for r in self.rows[:b]]
            params += [_IDLE] * (b - len(params))
            self._bs[b] = BatchSampling.from_params(params, self.engine.device, self.generator)
        return self._bs[b]

    def release(self, row: int, clear_kv: bool = False) -> Request | None:
        """Free ``row`` (finished, cancelled or failed); its KV is simply overwritten by the next owner, or
        zeroed first with ``clear_kv`` (non-finite values: see ``KVCache.clear_row``)."""
        if clear_kv:
            for runner in (self.engine.target_runner, self.engine.draft_runner):
                if runner is not None:
                    runner.kv.clear_row(row)
        req, self.rows[row] = self.rows[row], None
        # The row keeps its length on the device (free rows ride along and advance nothing): rounds in flight,
        # and later ones, write only past it, so a prompt of up to that length can be prefilled into the
        # row while they run (``_overtake``). Cleared K/V is written after them: nothing may overtake it.
        self._free_len[row] = 0 if clear_kv else self.host_len[row]
        self.state.in_use[row] = False
        self.host_len[row] = 0
        self._bs.clear()
        self._riders = [r for r in self._riders if r is not req]
        if self.policy is not None:
            self.policy.forget(row)
        return req

    # ---- admission and rounds ----------------------------------------------------------------------
    @torch.inference_mode()
    def admit(self, reqs: list[Request]) -> list[StreamEvent]:
        """Prefill ``reqs`` into free rows (all in one prefill) and return their first-token events.

        Each request's ``index`` becomes its row, the lowest free rows in order. Raises ``ValueError`` when
        there are too few free rows. A request that fails is not raised: its event is its last, with
        ``finish_reason == "error"``, and the others are admitted as if it had not come.
        """
        free = self.free_rows
        if len(reqs) > len(free):
            raise ValueError(f"{len(reqs)} requests but only {len(free)} free rows")
        now = time.perf_counter()
        for req in reqs:
            req.admitted_at = now
        events, placed, overtaking = [], [], set()
        for req in reqs:
            row = self.overtake_row(len(req.prompt), free)
            if row is None:
                row = free[0]
            else:
                overtaking.add(id(req))
            free.remove(row)
            req.index = row
            self.rows[row] = req
            try:
                self._place(req, history=id(req) not in overtaking)
            except Exception as e:  # this request's own work: it fails alone
                events += self._fail(req, f"the engine could not admit the request: {type(e).__name__}: {e}")
            else:
                placed.append(req)
        self._bs.clear()
        if self.active:  # a running row whose parameters broke since its admission fails, not the newcomers
            events += self._sampling_failures()
        placed = [r for r in placed if self.rows[r.index] is r]
        over = [r for r in placed if id(r) in overtaking]
        if over:
            events += self._overtake(over)
        placed = [r for r in placed if id(r) not in overtaking]
        if self.admission:
            placed = self._park_riders(placed)
        return events + self._prefill(placed)

    def overtake_row(self, n_prompt: int, free: list[int] | None = None) -> int | None:
        """The free row a prompt of ``n_prompt`` tokens would be prefilled into beside the rounds in flight
        (``_overtake``), or None where it must wait for them: the lowest free row whose kept length lies past
        the prompt's slots by more than the rounds may write below a length (``OVERTAKE_MARGIN``)."""
        if not (self.overtake and self._inflight is not None):
            return None
        need = n_prompt + OVERTAKE_MARGIN * (self.engine.round.shape.max_emitted + 1)
        rows = self.free_rows if free is None else free
        return next((r for r in rows if self._free_len[r] >= need), None)

    def overtake_count(self, lens: list[int]) -> int:
        """How many of the prompts of ``lens`` tokens, taken in order, ``admit`` would prefill together beside
        the rounds in flight: each takes the row ``overtake_row`` gives it among the rows still free, up to
        the first that gets none and at most the largest captured prefill's slots (``SLOT_BUCKETS``)."""
        free, n = self.free_rows, 0
        for k in lens[: SLOT_BUCKETS[-1]]:
            row = self.overtake_row(k, free)
            if row is None:
                break
            free.remove(row)
            n += 1
        return n

    def _overtake(self, reqs: list[Request]) -> list[StreamEvent]:
        """Prefill ``reqs`` (in rows ``overtake_row`` chose) beside the rounds in flight, on a stream of
        higher priority, and return their first-token events as soon as the target's half of it is done.

        Why. Under the lookahead a prompt that arrives while round t runs is admitted after round t + 1 was
        launched, so its separate prefill waited for both, and its first token came a whole round later than
        the prefill's own time: on the H100 (lifted 8B, 16 closed-loop clients, d91641b) the time to first
        token's median was 18.1 ms for AR and 24.9 for the speculative rounds (~10 ms each; AR's 6.4).

        What. The prompts' K/V go into their slots 0 .. n - 1 (the padding's into scratch slots) of rows
        whose kept length lies past n (``release``), while the rounds in flight write only near and past
        that length, so the two never touch the same slot; the prefill is a captured packed one
        (``PackedGraphs``: its own cuBLAS workspace and split-K counters). Everything the rounds read (the
        rows' length, next token, in-use flag, an EAGLE-3 drafter's features, the history past the prompt)
        is written on the main stream after the prefill, so it lands after the rounds in flight and before
        the next one. The first tokens are read back from the prefill's stream alone.

        Priority alone shares the GPU: the round's kernels and the prefill's alternate (kernels/hold_gate.py),
        so the prefill also sets the target runner's ``hold`` flag while it runs, and the rounds in flight
        wait at their next gate (``runner.GATES`` a round, and one before each draft forward) until the
        target's half is done. The first tokens need only that half (``packed_prefill``'s ``between``): they
        are read back while the drafter's half (an EAGLE-3 drafter's one layer, ~1.1 ms of the H100's 13.5 ms
        for one prompt, lifted 8B) runs beside the rounds, which go on meanwhile."""
        eng, st, dev = self.engine, self.state, self.engine.device
        lens = self._prompt_lens(reqs)
        hi, longest = len(lens), max(lens)
        graphs = eng.packed_graphs
        cuda = dev.type == "cuda"
        if cuda and (graphs is None or graphs.key(hi, len(reqs), longest) not in graphs):
            for r in reqs:  # no captured prefill of this shape: the rounds' own stream, after them
                self._place(r)
            return self._prefill(reqs)
        if cuda and self._prio is None:
            self._prio = torch.cuda.Stream(dev, priority=-100)  # mapped to the highest the device has
        main = torch.cuda.current_stream(dev) if cuda else None
        flag = eng.target_runner.hold
        early: list = []

        def first_tokens(last: torch.Tensor) -> None:
            # Between the target's half and the drafter's: the first tokens need the target alone, so they
            # are on their way to the host while the drafter writes its K/V, and the rounds go on (their
            # gates released) beside that small half at the prefill's priority.
            if flag is not None:
                release(flag)
            early.append(self._first_tokens(reqs, last, bs, wait=False))

        with torch.cuda.stream(self._prio) if cuda else contextlib.nullcontext():
            # Sampling tensors of its own, made on this stream (the cached ones serve the rounds' stream).
            params = [r.params if r is not None else _IDLE for r in self.rows[:hi]]
            bs = BatchSampling.from_params(params, dev, self.generator)
            if flag is not None:  # the rounds in flight stop at their next gate until the target's half is done
                hold(flag)
            try:
                for r in reqs:  # the padding past the prompt is read but reaches no logit (causal)
                    st.history[r.index, : len(r.prompt)] = to_device(r.prompt, dev)
                last, pending = packed_prefill(eng, lens, commit=False, between=first_tokens)
            finally:  # never leave the rounds waiting: a prefill that raised releases them too
                if flag is not None:
                    release(flag)
            first, first_host = early[0]
            first_host = first_host()  # waits for the target's half and the sampling alone
        if cuda:  # the prefill is done (the drafter's half too); the state follows the rounds in flight
            done = torch.cuda.Event()
            done.record(self._prio)
            main.wait_event(done)
            first.record_stream(main)
        for r in reqs:
            st.history[r.index, len(r.prompt) :] = 0
        commit_pending(st, hi, pending)
        self.overtaken += len(reqs)
        for r in reqs:
            r.overtook = True
        return self._start_rows(reqs, first, first_host)

    def _park_riders(self, placed: list[Request]) -> list[Request]:
        """Park the requests whose prefill will ride in the next round (``admission``); returns the rest."""
        new = {id(r) for r in placed} | {id(r) for r in self._riders}
        running = sum(r is not None and id(r) not in new for r in self.rows)
        room = self.admission - sum(len(r.prompt) for r in self._riders)
        rest = []
        costs = getattr(self.engine, "admission_costs", {})
        b = self._bucket(self._hi()) if costs else 0
        for req in placed:
            cost = costs.get((b, rider_width(len(req.prompt), self.engine.target_runner.scratch)))
            path = admission_path(len(req.prompt), running, room, self.admission, RIDER_SLOTS - len(self._riders), cost)
            self.admissions[path] = self.admissions.get(path, 0) + 1
            if path != RIDE:
                rest.append(req)
                continue
            room -= len(req.prompt)
            # Parked in the cache's scratch slots: the round's own group writes nothing into the prompt's.
            self.state.seq_len[req.index] = self.engine.options.max_seq_len
            self._riders.append(req)
        return rest

    def _place(self, req: Request, history: bool = True) -> None:
        """The work of one request alone, before the shared prefill: anything here that raises, raises for
        this request only (``SamplingParams`` refuses such values, but params can be changed after that).
        ``history`` False leaves the row's history to ``_overtake``, which writes it beside the rounds."""
        st, dev = self.state, self.engine.device
        BatchSampling.from_params([req.params], "cpu", self.generator)  # this row's part of the batch's tensors
        if history:
            st.history[req.index].zero_()  # drafts read past the length; keep them independent of the last owner
            st.history[req.index, : len(req.prompt)] = to_device(req.prompt, dev)
        if req.params.seed is not None:
            self.generator.manual_seed(req.params.seed)

    def _prefill(self, reqs: list[Request]) -> list[StreamEvent]:
        """Prefill placed requests together; if that fails, each half again (and so on down to one request),
        so only what fails alone fails. Halves, not one at a time: a wave of 64 prompts that ran the H100 out
        of memory in one prefill (lifted 8B, three engines in one process, 4910b6f) was then prefilled in 64
        separate passes, 2.8 s of AR's 6.7 s part; halving needs two passes where half the wave fits, and
        2 log2(n) to isolate one request that fails in any company."""
        if not reqs:
            return []
        try:
            return self._prefill_rows(reqs)
        except Exception as e:
            if len(reqs) == 1:
                return self._fail(reqs[0], f"the prefill failed: {type(e).__name__}: {e}")
            log.warning(
                "a prefill of %d requests failed (%s: %s); prefilling them in halves",
                len(reqs),
                type(e).__name__,
                e,
            )
            events, mid = [], len(reqs) // 2
            for part in (reqs[:mid], reqs[mid:]):
                seeds = [r.params.seed for r in part if r.params.seed is not None]
                if seeds:  # the failed attempt may have drawn from the generator: as admission seeded it
                    self.generator.manual_seed(seeds[-1])
                events += self._prefill(part)
            return events

    def _prefill_rows(self, reqs: list[Request]) -> list[StreamEvent]:
        lens = self._prompt_lens(reqs)
        last = self.engine.prefill_rows(self.state.history[: len(lens)], lens)
        return self._start_rows(reqs, *self._first_tokens(reqs, last, self._sampling(len(lens))))

    def _prompt_lens(self, reqs: list[Request]) -> list[int]:
        """Prompt tokens per row 0 .. hi - 1: ``reqs``' prompt lengths in their rows, 0 elsewhere."""
        lens = [0] * self._hi()
        for req in reqs:
            lens[req.index] = len(req.prompt)
        return lens

    def _first_tokens(self, reqs: list[Request], last: torch.Tensor, bs: BatchSampling, wait: bool = True) -> tuple:
        """(first tokens [hi] on the device, [[token, non-finite flag]] of ``reqs`` on the host) from the
        prefill's last-position logits: one read back, the prefill's one sync (of the current stream). With
        ``wait`` False the read back is only started (CUDA: into pinned memory, behind an event), and the
        second item is a function that waits for it alone and returns the list."""
        first = next_tokens(last, bs)
        rows = to_device([r.index for r in reqs], self.engine.device)
        flags = torch.stack([first[rows], nonfinite_rows(last[rows]).long()], 1)
        if wait or flags.device.type != "cuda":
            host = flags.tolist()
            return first, host if wait else (lambda: host)
        pinned = self._first_pinned[: flags.shape[0]]  # read below, before any other prefill may reuse it
        pinned.copy_(flags, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()

        def read() -> list:
            ready.synchronize()
            return pinned.tolist()

        return first, read

    def _start_rows(self, reqs: list[Request], first: torch.Tensor, first_host: list) -> list[StreamEvent]:
        """Rows just prefilled join the rounds (those whose logits were finite) and emit their first token."""
        st, dev = self.state, self.engine.device
        ok = [req for req, (_, bad) in zip(reqs, first_host, strict=True) if not bad]
        if ok:
            live = to_device([r.index for r in ok], dev)
            st.next_tok[live] = first[live]
            st.seq_len[live] = to_device([len(r.prompt) for r in ok], dev)
            st.in_use[live] = True
        events, now = [], time.perf_counter()
        for req, (tok, bad) in zip(reqs, first_host, strict=True):
            req.first_at, req.prefill_group = now, len(reqs)
            if bad:
                events += self._fail(req, NONFINITE, clear_kv=True)
                continue
            self.host_len[req.index] = len(req.prompt)
            events += self._emit(req, [tok], count_round=False)
        return events

    @torch.inference_mode()
    def step(self, between: Callable[[], None] | None = None) -> list[StreamEvent]:
        """Launch the next round (if any row is in use), then emit the tokens of the round before it.

        Without lookahead (CPU) the round just launched is read back at once. Finished rows are released
        before this returns. ``between`` (the server's scheduler: new submissions, admission) is called
        every ``POLL_S`` while the round to be read is still running, so a prompt that arrives meanwhile
        can be prefilled beside the rounds in flight (``_overtake``) instead of after them.
        """
        failed = self._sampling_failures() if self.active else []
        launched = self._launch() if self.active else None
        failed += self._fallback_events
        self._fallback_events = []
        if not self.lookahead:
            self._inflight, launched = launched, None
        done = self._inflight.done if self._inflight is not None else None
        if between is not None and done is not None:
            while not done.query():
                between()
                time.sleep(POLL_S)
        events = self._collect() if self._inflight is not None else []
        self._inflight = launched
        return failed + events

    def _sampling_failures(self) -> list[StreamEvent]:
        """Build the round's sampling tensors; if that raises, fail the rows whose own parameters raise
        alone (changed since admission, say) and let the others run. A failure no single row explains is
        the batch's and is raised."""
        try:
            self._sampling(self._bucket(self._hi()))
            return []
        except Exception:
            events = []
            for req in [r for r in self.rows if r is not None]:
                try:
                    BatchSampling.from_params([req.params], "cpu", self.generator)
                except Exception as e:
                    events += self._fail(req, f"the request's sampling failed: {type(e).__name__}: {e}")
            if not events:
                raise
            return events

    def _launch(self) -> _Inflight:
        eng, st = self.engine, self.state
        b = self._bucket(self._hi())
        bs = self._sampling(b)
        # The host knows each row's length up to the round in flight, which may add max_emitted more.
        lag = eng.round.shape.max_emitted if self._inflight is not None else 0
        max_len = max(self.host_len[:b]) + lag
        kind = None
        riders = [r for r in self._riders if self.rows[r.index] is r]
        self._riders = []
        riding = {r.index for r in riders}
        if self.policy is not None:
            running = [i for i, r in enumerate(self.rows[:b]) if r is not None and i not in riding]
            kind = self.policy.choose(running, b)
        if riders:  # the kind measured to carry them within their separate prefill's time
            width = rider_width(max(len(r.prompt) for r in riders), eng.target_runner.scratch)
            kind = carry_kind(eng, b, width, kind)
        admitted = self._run_with_riders(riders, b, bs, max_len, kind) if riders else None
        if admitted is None:
            riders, riding = [], set()
            eng.run_round(b, bs, max_len, kind)
        else:
            name = "spec" if kind is None else str(kind)
            self.carrying_kinds[name] = self.carrying_kinds.get(name, 0) + 1
        if self._pinned:
            host = self._pinned[self._launches % 2][:b]
            host.copy_(st.out[:b], non_blocking=True)
            if admitted is not None:  # a few numbers, read with the round's tokens after the same event
                admitted = admitted.to("cpu", non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        else:
            host, done = st.out[:b].clone(), None
        self._launches += 1
        rows = [None if i in riding else r for i, r in enumerate(self.rows[:b])]  # riders ran no round yet
        return _Inflight(rows, host, done, kind, riders or None, admitted)

    def _run_with_riders(self, riders: list[Request], b: int, bs, max_len: int, kind) -> torch.Tensor | None:
        """The round with the parked prompts' prefill in its target forward (``Engine.run_carrying``); returns
        [b, 2] on the device (first tokens and non-finite flags of the riders' rows). If that fails they are
        prefilled apart, which isolates a request that fails alone (their events come out of this step), and
        None is returned."""
        eng = self.engine
        try:
            out = eng.run_carrying(b, bs, max_len, kind, [r.index for r in riders], [len(r.prompt) for r in riders])
        except Exception as e:
            eng.target_runner.rider = None
            log.warning("a round carrying %d prompts failed (%s: %s); prefilling them apart", len(riders), type(e), e)
            self.admissions[FALLBACK] = self.admissions.get(FALLBACK, 0) + len(riders)
            for r in riders:
                self.state.seq_len[r.index] = 1
            self._fallback_events += self._prefill(riders)
            return None
        for r in riders:
            self.host_len[r.index] = len(r.prompt)
        return out

    def _collect(self) -> list[StreamEvent]:
        inflight = self._inflight
        self._inflight = None
        if inflight.done is not None:
            inflight.done.synchronize()  # the one host sync of a round
        packed = inflight.host.tolist()
        events = []
        for row, req in enumerate(inflight.rows):
            # Rows released (or re-admitted) since the launch, and rows that finished in the round before,
            # ran a round whose tokens belong to no one.
            if req is None or req.finished or self.rows[row] is not req:
                continue
            k = packed[row][-1] + 1
            if k == 0:  # a co-located step drafted this row's half: nothing to emit
                continue
            if packed[row][-2]:  # the target's logits for this row held a NaN or inf
                events += self._fail(req, NONFINITE, clear_kv=True)
                continue
            self.host_len[row] += k
            if self.policy is not None:
                self.policy.observe(row, k, inflight.kind, packed[row])
            self.rounds += 1
            self.round_tokens += k
            events += self._emit(req, packed[row][:k], count_round=True)
        firsts = self._admitted_rows(inflight)
        for req in inflight.admitted or []:
            if self.rows[req.index] is not req:  # cancelled since
                continue
            tok, bad = firsts[req.index]
            if bad:
                events += self._fail(req, NONFINITE, clear_kv=True)
                continue
            events += self._emit(req, [tok], count_round=False)
        return events

    @staticmethod
    def _admitted_rows(inflight: _Inflight) -> list:
        return [] if inflight.admitted_host is None else inflight.admitted_host.tolist()

    def drain(self) -> list[StreamEvent]:
        """Read back the round in flight, if any (nothing new is launched)."""
        return self._collect() if self._inflight is not None else []

    def _fail(self, req: Request, message: str, clear_kv: bool = False) -> list[StreamEvent]:
        """End ``req`` with ``finish_reason == "error"`` and free its row; the other rows go on."""
        log.warning("request in row %d failed: %s", req.index, message)
        ev = req.fail(message)
        if 0 <= req.index < self.capacity and self.rows[req.index] is req:
            self.release(req.index, clear_kv=clear_kv)
        return [ev]

    def _emit(self, req: Request, ids: list[int], count_round: bool) -> list[StreamEvent]:
        try:
            ev = req.add(ids, self.engine.tokenizer.decode, count_round=count_round)
        except Exception as e:  # this request's own bookkeeping (decoding, stop strings): it fails alone
            return self._fail(req, f"the request's output could not be decoded: {type(e).__name__}: {e}")
        if req.finished:
            self.release(req.index)
        return [ev] if ev is not None else []
