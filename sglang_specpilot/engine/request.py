"""Host-side state of one request: its tokens, the text streamed so far, and why it stopped."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .sampling import SamplingParams


class RequestError(ValueError):
    """A request the engine refuses (empty prompt, too long for the context, bad parameters)."""


class RequestFailed(RuntimeError):
    """A request the engine admitted and could not finish (``finish_reason == "error"``); it failed alone,
    the requests that ran beside it were not affected."""


class GenerationError(RuntimeError):
    """``Engine.generate``: some requests failed. ``results`` holds every request's result in order (the
    failed ones with ``finish_reason == "error"`` and ``error`` set), so the others are not lost."""

    def __init__(self, results: list[GenerationResult]):
        self.results = results
        failed = [f"prompt {i}: {r.error}" for i, r in enumerate(results) if r.error is not None]
        super().__init__(f"{len(failed)} of {len(results)} requests failed; " + "; ".join(failed))


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    rounds: int  # decode steps (AR) or speculative rounds after the first token
    mean_accepted: float  # tokens per round: accepted draft tokens + the bonus token (1.0 for AR)
    time_s: float
    tokens_per_s: float
    error: str | None = None  # why the request failed (``finish_reason == "error"``); None on success


@dataclass
class StreamEvent:
    index: int  # position of the request in the batch
    token_ids: list[int]  # tokens new since the last event
    text: str  # text new since the last event
    finished: bool = False
    finish_reason: str | None = None  # "stop" (EOS or stop string), "length", or "error" (see result.error)
    result: GenerationResult | None = None  # set on the request's last event


@dataclass
class Request:
    index: int
    prompt: list[int]
    params: SamplingParams
    eos: frozenset[int]
    ids: list[int] = field(default_factory=list)
    text: str = ""  # text already sent
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None  # set when the engine failed this request (finish_reason "error")
    rounds: int = 0
    round_tokens: int = 0
    start: float = field(default_factory=time.perf_counter)
    end: float = 0.0
    # Where its time to first token went (perf_counter; the batched suite's per-request rows): when the
    # batch took it in (``RowBatch.admit``), when its first token reached the host, how many prompts its
    # prefill held, and whether that prefill overtook rounds in flight (``RowBatch._overtake``).
    admitted_at: float | None = None
    first_at: float | None = None
    prefill_group: int = 0
    overtook: bool = False

    def add(self, new_ids: list[int], decode, count_round: bool) -> StreamEvent | None:
        """Append a step's tokens, apply EOS / max-token / stop-string rules, return the event to send."""
        if self.finished:
            return None
        if count_round:
            self.rounds += 1
            self.round_tokens += len(new_ids)
        added: list[int] = []
        for t in new_ids:
            if t in self.eos and not self.params.ignore_eos:
                self._finish("stop")
                break
            added.append(t)
            if len(self.ids) + len(added) >= self.params.max_new_tokens:
                self._finish("length")
                break
        self.ids.extend(added)
        full = decode(self.ids)
        for s in self.params.stop:
            # Only the tail can hold a new match; start early enough to catch one spanning the old text.
            at = full.find(s, max(0, len(self.text) - len(s)))
            if at != -1:
                full = full[:at]
                self._finish("stop")
        if self.finished:
            safe = len(full)
        else:
            # Hold back an incomplete UTF-8 character and any tail that could still become a stop string.
            safe = len(full.rstrip("\ufffd"))
            hold = max((len(s) - 1 for s in self.params.stop), default=0)
            safe = max(len(self.text), safe - hold)
        # Byte-level BPE decoding is prefix-stable once incomplete characters are held back.
        delta = full[len(self.text) : safe]
        self.text += delta
        if not added and not delta and not self.finished:
            return None
        result = self.result() if self.finished else None
        return StreamEvent(self.index, added, delta, self.finished, self.finish_reason, result)

    def fail(self, message: str) -> StreamEvent:
        """Finish with ``finish_reason == "error"``; the last event carries ``message``. Text not yet sent
        (held back for a stop string or an incomplete character) is dropped: nothing after the failure is
        trusted."""
        self.error = message
        # Even over a finish already recorded: a failure in the step that finished it voids that finish.
        self.finished, self.finish_reason, self.end = True, "error", time.perf_counter()
        return StreamEvent(self.index, [], "", True, "error", self.result())

    def _finish(self, reason: str) -> None:
        if not self.finished:
            self.finished, self.finish_reason, self.end = True, reason, time.perf_counter()

    def result(self) -> GenerationResult:
        elapsed = (self.end or time.perf_counter()) - self.start
        return GenerationResult(
            text=self.text,
            token_ids=list(self.ids),
            finish_reason=self.finish_reason or "length",
            prompt_tokens=len(self.prompt),
            rounds=self.rounds,
            mean_accepted=self.round_tokens / self.rounds if self.rounds else 0.0,
            time_s=elapsed,
            tokens_per_s=len(self.ids) / elapsed if elapsed > 0 else 0.0,
            error=self.error,
        )
