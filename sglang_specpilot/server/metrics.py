"""Server counters and gauges, rendered in the Prometheus text exposition format (version 0.0.4).

Counters only grow (requests by outcome, prompt and generated tokens, rounds, rejected HTTP requests);
gauges are sampled now (queue depth, running requests, free KV rows) or computed over a window
(tokens/s over the last ``window_s`` seconds; mean accepted tokens per step since start, where a step is
one row's share of one round: accepted draft tokens + the bonus token, 1.0 for AR). Histograms: time to
first token (submit -> first token, queueing included) and inter-token latency (the time between a
request's events divided by the tokens the later one brought; a speculative round brings several).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque

from ..engine.request import Request

PREFIX = "specpilot"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """A Prometheus histogram: cumulative bucket counts, sum and count (not thread-safe on its own)."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        i = next((j for j, b in enumerate(self.buckets) if value <= b), len(self.buckets))
        self.counts[i] += n
        self.sum += value * n
        self.count += n

    def samples(self, name: str) -> list[str]:
        out, running = [], 0
        for b, c in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += c
            le = "+Inf" if b == float("inf") else f"{b:g}"
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        return out + [f"{name}_sum {self.sum:.6g}", f"{name}_count {self.count}"]


class Metrics:
    def __init__(self, window_s: float = 10.0):
        self.window_s = window_s
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # finished requests by outcome: stop, length, cancelled, error
        self.rejected: Counter[int] = Counter()  # HTTP errors by status (bad input never reaches the engine)
        self.refusals: Counter[str] = Counter()  # the same errors by reason (their OpenAI code, or type)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.queue_depth = 0
        self.running = 0
        self.kv_rows_free = 0
        self.kv_rows_total = 0
        self.batch_rounds = 0
        self.row_rounds = 0
        self.round_tokens = 0
        self.overtaken = 0  # prompts prefilled beside the rounds in flight (RowBatch._overtake)
        self._recent: deque[tuple[float, int]] = deque()
        # Batched-serving decisions (issue 18), copied from the engine's round policy each round.
        self.spec_decisions: dict[str, int] = {}
        self.depth_rounds: dict[int, int] = {}
        self.predicted_speedup: float | None = None
        self.shared_budget_rounds = 0
        self.width_rounds: dict[int, int] = {}
        self.width_choices: dict[str, int] = {}
        self.chain_rounds: dict[int, int] = {}
        self.chain_choices: dict[str, int] = {}
        self.depth_choices: dict[str, int] = {}
        self.adaptive_depth = False
        self.admissions: dict[str, int] | None = None  # prompt admission's decisions (None: off)
        self.carrying_kinds: dict[str, int] = {}  # rounds that carried prompts, by round kind
        self.colocate: tuple[dict[str, int], bool] | None = None  # co-location: rounds by strategy, latest's

    # ---- updates (scheduler thread, or the event loop for ``rejected``) ----------------------------
    def queued(self, delta: int) -> None:
        with self._lock:
            self.queue_depth += delta

    def admitted(self, req: Request) -> None:
        with self._lock:
            self.prompt_tokens += len(req.prompt)

    def tokens(self, n: int) -> None:
        now = time.monotonic()
        with self._lock:
            self.generation_tokens += n
            self._recent.append((now, n))

    def finished(self, outcome: str, req: Request) -> None:
        with self._lock:
            self.requests[outcome] += 1

    def round(self, batch) -> None:
        with self._lock:
            self.batch_rounds += 1
            self.row_rounds, self.round_tokens = batch.rounds, batch.round_tokens
            self.overtaken = getattr(batch, "overtaken", 0)
            if getattr(batch, "admission", 0):
                self.admissions = dict(batch.admissions)
                self.carrying_kinds = dict(getattr(batch, "carrying_kinds", {}))
            eng = getattr(batch, "engine", None)
            if getattr(eng, "colocated", None) is not None:
                self.colocate = (dict(eng.colocate_rounds), eng.colocated_last)
            policy = getattr(batch, "policy", None)
            if policy is not None:
                self.spec_decisions, self.depth_rounds = dict(policy.decisions), dict(policy.depth_rounds)
                self.shared_budget_rounds, self.adaptive_depth = policy.shared_rounds, policy.adaptive
                self.width_rounds = dict(policy.width_rounds)
                self.width_choices = dict(getattr(policy, "width_choices", {}))
                self.depth_choices = dict(getattr(policy, "depth_choices", {}))
                self.chain_rounds = dict(getattr(policy, "chain_rounds", {}))
                self.chain_choices = dict(getattr(policy, "chain_choices", {}))
                if policy.auto_off is not None:
                    self.predicted_speedup = policy.auto_off.last_speedup

    def gauges(self, batch) -> None:
        with self._lock:
            self.running = batch.active
            self.kv_rows_free = len(batch.free_rows)
            self.kv_rows_total = batch.capacity

    def reject(self, status: int, reason: str | None = None) -> None:
        with self._lock:
            self.rejected[status] += 1
            self.refusals[reason or "invalid_request_error"] += 1

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def inter_token(self, seconds: float, n: int = 1) -> None:
        with self._lock:
            self.itl.observe(seconds, n)

    # ---- reading ------------------------------------------------------------------------------------
    def tokens_per_s(self) -> float:
        cutoff = time.monotonic() - self.window_s
        with self._lock:
            while self._recent and self._recent[0][0] < cutoff:
                self._recent.popleft()
            return sum(n for _, n in self._recent) / self.window_s

    def mean_accepted(self) -> float:
        with self._lock:
            return self.round_tokens / self.row_rounds if self.row_rounds else 0.0

    def _policy_rows(self) -> list[tuple]:
        """The round policy's counters (present only when a mechanism of issue 18 is on)."""
        rows = []
        if self.spec_decisions:
            rows.append((
                "speculation_decisions_total",
                "counter",
                "Automatic off: rounds by decision (spec: S > 1; ar: S <= 1, an AR round ran; probe: a speculative "
                "round re-measuring acceptance while off; unmeasured: speculated with no curve or a new row).",
                [({"decision": k}, v) for k, v in sorted(self.spec_decisions.items())],
            ))  # fmt: skip
        if self.predicted_speedup is not None:
            rows.append((
                "predicted_speculation_speedup",
                "gauge",
                "Automatic off: the cost model's latest S = tau / c for speculating at the current batch.",
                [({}, self.predicted_speedup)],
            ))  # fmt: skip
        if self.adaptive_depth:
            rows.append((
                "draft_depth_rounds_total",
                "counter",
                "Adaptive draft length: speculative rounds by the draft depth the batch ran.",
                [({"depth": str(k)}, v) for k, v in sorted(self.depth_rounds.items())],
            ))  # fmt: skip
        if self.depth_choices:
            rows.append((
                "adaptive_depth_choices_total",
                "counter",
                "Adaptive draft length: rounds by how their depth was chosen (chosen: the most estimated tokens "
                "per ms; capped: one deeper, a row accepted every drafted token; rule: the headroom rule, the "
                "step curve or an estimate was missing).",
                [({"how": k}, v) for k, v in sorted(self.depth_choices.items())],
            ))  # fmt: skip
        if self.shared_budget_rounds:
            rows.append((
                "shared_budget_rounds_total",
                "counter",
                "Shared node budget: tree rounds whose verify nodes were shared across the batch.",
                [({}, self.shared_budget_rounds)],
            ))  # fmt: skip
        if self.width_rounds:
            rows.append((
                "narrowed_verify_rounds_total",
                "counter",
                "Shared node budget: tree rounds whose verify block was cut to fit the budget (or, with adaptive "
                "width, chosen narrower), by nodes per row.",
                [({"width": str(k)}, v) for k, v in sorted(self.width_rounds.items())],
            ))  # fmt: skip
        if self.width_choices:
            rows.append((
                "adaptive_width_choices_total",
                "counter",
                "Adaptive width: rounds by how their width was chosen (chosen: the most estimated tokens per ms; "
                "widest: a row had no estimate yet; probe: the widest, re-measuring the wider widths).",
                [({"how": k}, v) for k, v in sorted(self.width_choices.items())],
            ))  # fmt: skip
        if self.chain_choices:
            rows.append((
                "chain_kind_rounds_total",
                "counter",
                "Chain kinds: rounds a tree batch ran as a greedy chain instead, by chain depth.",
                [({"depth": str(k)}, v) for k, v in sorted(self.chain_rounds.items())],
            ))  # fmt: skip
            rows.append((
                "chain_kind_choices_total",
                "counter",
                "Chain kinds: rounds by how tree or chain was chosen (chain: a chain promised the most tokens per "
                "ms; tree: the tree did; probe: the tree after probe_every chains in a row; unmeasured: an "
                "estimate or a curve point was missing, the tree ran).",
                [({"how": k}, v) for k, v in sorted(self.chain_choices.items())],
            ))  # fmt: skip
        if self.admissions is not None:
            rows.append((
                "prompt_admissions_total",
                "counter",
                "Prompt admission: prompts by prefill path (verify: rode in a round's verify pass; idle: no row "
                "was running; long: over the round's token allowance; full: the allowance was taken by earlier "
                "prompts; slower: the carrying round was measured slower than the separate prefill; fallback: "
                "the carrying round failed, prefilled apart).",
                [({"path": k}, v) for k, v in sorted(self.admissions.items())] or [({"path": "verify"}, 0)],
            ))  # fmt: skip
            rows.append((
                "carrying_rounds_total",
                "counter",
                "Prompt admission: rounds that carried prompts' prefill, by the round kind that ran (spec: the "
                "engine's own round; ar: the keep-up AR round, where the speculative one was measured slower "
                "than the separate prefill; (depth, width): a narrowed tree round).",
                [({"kind": k}, v) for k, v in sorted(self.carrying_kinds.items())] or [({"kind": "spec"}, 0)],
            ))  # fmt: skip
        if self.colocate is not None:
            counts, last = self.colocate
            rows.append((
                "colocated_round_active",
                "gauge",
                "Co-location only where it wins: 1 if the latest round was co-located (its batch is one the tuned "
                "profile measured co-location to beat the full-batch round at), 0 if it ran the conventional round.",
                [({}, int(last))],
            ))  # fmt: skip
            rows.append((
                "colocate_rounds_total",
                "counter",
                "Rounds by strategy while co-location is on (colocated, conventional).",
                [({"strategy": k}, v) for k, v in sorted(counts.items())],
            ))  # fmt: skip
        return rows

    def render(self) -> str:
        tps, acc = self.tokens_per_s(), self.mean_accepted()
        with self._lock:
            rows = [
                (
                    "requests_total",
                    "counter",
                    "Requests finished, by outcome.",
                    [({"outcome": k}, v) for k, v in sorted(self.requests.items())] or [({"outcome": "stop"}, 0)],
                ),
                (
                    "rejected_requests_total",
                    "counter",
                    "Requests refused with an HTTP error, by status.",
                    [({"status": str(k)}, v) for k, v in sorted(self.rejected.items())] or [({"status": "400"}, 0)],
                ),
                (
                    "refusals_total",
                    "counter",
                    "Requests refused with an HTTP error, by reason (the error's code).",
                    [({"reason": k}, v) for k, v in sorted(self.refusals.items())]
                    or [({"reason": "invalid_request_error"}, 0)],
                ),
                ("prompt_tokens_total", "counter", "Prompt tokens prefilled.", [({}, self.prompt_tokens)]),
                ("generation_tokens_total", "counter", "Tokens generated.", [({}, self.generation_tokens)]),
                (
                    "rounds_total",
                    "counter",
                    "Engine rounds (AR steps or speculative rounds) run.",
                    [({}, self.batch_rounds)],
                ),
                (
                    "prefill_overtakes_total",
                    "counter",
                    "Prompts prefilled beside the rounds in flight (on a stream of higher priority) instead of "
                    "after them.",
                    [({}, self.overtaken)],
                ),
                (
                    "tokens_per_second",
                    "gauge",
                    f"Tokens generated per second over the last {self.window_s:g} s.",
                    [({}, tps)],
                ),
                (
                    "mean_accepted_tokens_per_step",
                    "gauge",
                    "Tokens emitted per request per round since start (accepted draft tokens + bonus; 1 for AR).",
                    [({}, acc)],
                ),
                *self._policy_rows(),
                ("queue_depth", "gauge", "Requests waiting for a KV row.", [({}, self.queue_depth)]),
                ("running_requests", "gauge", "Requests holding a KV row.", [({}, self.running)]),
                ("kv_rows_free", "gauge", "Free KV cache rows.", [({}, self.kv_rows_free)]),
                ("kv_rows_total", "gauge", "KV cache rows (max batch size).", [({}, self.kv_rows_total)]),
            ]
        out = []
        for name, kind, help_, samples in rows:
            out += [f"# HELP {PREFIX}_{name} {help_}", f"# TYPE {PREFIX}_{name} {kind}"]
            for labels, value in samples:
                lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
                text = str(value) if isinstance(value, int) else f"{value:.6g}"
                out.append(f"{PREFIX}_{name}{'{' + lab + '}' if lab else ''} {text}")
        with self._lock:
            for name, help_, hist in (
                ("time_to_first_token_seconds", "Submit to first token, queueing included.", self.ttft),
                ("inter_token_latency_seconds", "Time per token between a request's events.", self.itl),
            ):
                out += [f"# HELP {PREFIX}_{name} {help_}", f"# TYPE {PREFIX}_{name} histogram"]
                out += hist.samples(f"{PREFIX}_{name}")
        return "\n".join(out) + "\n"
