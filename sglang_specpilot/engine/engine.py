"""The engine: one static KV cache per model, one round per configuration, one loop.

Requests of different prompt lengths share the static KV cache, one row each, right-padded; nothing is
packed. Each row keeps its own length (``seq_len``), rope positions and mask, so padding is never attended
to. ``generate`` / ``stream`` admit the requests into rows (``rows.RowBatch``) and run
``while busy: step()``, the loop the server runs too. Every step is one round of ``round.Round``: an AR
step, a chain round or a best-first tree round, the same code with a different ``RoundShape``
(a chain is a tree with top-k 1); on CUDA greedy rounds replay one CUDA graph per batch bucket.

A chain round (gamma draft tokens), per request, with ``seq_len`` tokens in the target cache and
``next_tok`` the last emitted token (not yet in any cache):

    draft   [tok[seq_len-1], next_tok] at positions seq_len-1, seq_len -> d_1; then d_i -> d_{i+1}
    verify  [next_tok, d_1 .. d_gamma] at seq_len .. seq_len+gamma, causal       -> gamma+1 logits
    accept  n leading draft tokens + a bonus (spec.py); seq_len += n + 1; next_tok = bonus

Feeding tok[seq_len-1] again re-writes a draft K/V entry the draft may already hold, so the draft never
needs a catch-up step after a fully accepted round, and every draft step has a fixed shape.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import torch

from tlv import TLVPlan

from ..config import EngineOptions
from ..models.llama import Transformer
from .attn_meta import causal_tree
from .packed_prefill import PackedGraphs, packable, packed_prefill, worth_packing, worth_tiering
from .request import GenerationError, GenerationResult, Request, RequestError, StreamEvent
from .round import CapturedRound, Round, RoundShape, RoundState
from .round_kinds import SpecPolicy, alternate_rounds, kinds_at
from .rows import OVERTAKE, RowBatch
from .runner import ModelRunner
from .sampling import BatchSampling, SamplingParams
from .step_curve import StepCurve, measure
from .tlv_round import TLVRound, TLVShape

log = logging.getLogger("specpilot.engine")


def round_shape(options: EngineOptions, speculative: bool) -> RoundShape:
    """The round of a configuration: AR (depth 0), a chain (top-k 1) or a best-first tree."""
    if not speculative:
        return RoundShape(0, 0, 1)
    if options.tlv:
        return TLVShape.of(tlv_plan(options))
    if options.tree:
        return RoundShape(options.tree_budget, options.tree_depth, options.tree_top_k)
    g = options.num_speculative_tokens
    return RoundShape(g, g, 1)


def tlv_plan(options: EngineOptions) -> TLVPlan:
    """The TLV round's budget split (``options.tlv``): trunk L, the hanging tree, the root tree."""
    depth, top_k, _ = options.tlv_lattice
    return TLVPlan(options.tlv_chain_len, depth, top_k, options.tlv_hang_budget_resolved, options.tlv_root_budget)


# Prefill chunks are padded to a multiple of this many tokens. A prompt length the process has not seen
# cost its first generation ~50 ms more than a repeat on the H200 (SmolLM2, HumanEval/132-141: 0.21 vs
# 0.16 s for 128 tokens): the eager prefill's GEMMs and attention pick kernels per shape and load them
# lazily. Padding leaves chunk // 64 shapes per batch size, all run at warm-up.
PREFILL_ALIGN = 64


def prefill_width(n: int, chunk: int) -> int:
    """Tokens a prefill chunk of ``n`` real tokens runs: ``n`` rounded up to ``PREFILL_ALIGN``, at most
    the chunk."""
    return min(chunk, -(-n // PREFILL_ALIGN) * PREFILL_ALIGN)


def scratch_slots(options: EngineOptions) -> int:
    """Cache slots past max_seq_len per row: the widest step (prefill chunk, or a round that a finished
    row runs once more under the lookahead, starting up to ``max_emitted`` slots further). Sized for the
    speculative round of the options even when the engine turns out to decode AR (no drafter)."""
    shape = round_shape(options, True)
    return max(64, options.prefill_chunk, shape.reach + shape.max_emitted + 1)


def drafting_vocab(target, draft) -> int:
    """Tokens a drafter's children are chosen from: an EAGLE-3 drafter's reduced vocabulary, else the target's."""
    spec = getattr(draft, "spec", None)
    return min(target.cfg.vocab_size, getattr(spec, "draft_vocab", None) or target.cfg.vocab_size)


def _fp8_draft(draft, target, device: torch.device):
    """``draft_weights="fp8"``: a copy of the drafter with FP8 projections (``models.fp8_linear``)."""
    from ..models.fp8_linear import fp8_drafter

    if draft is None:
        raise ValueError("draft_weights='fp8' converts a drafter's weights, and this engine has no drafter")
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        name = torch.cuda.get_device_name(device)
        raise ValueError(f"draft_weights='fp8' needs FP8 tensor cores (compute capability 8.9+); {name} has none")
    return fp8_drafter(draft, target)


class Engine:
    def __init__(self, target: Transformer, tokenizer, options: EngineOptions, draft: Transformer | None = None):
        options = options.resolved(target.cfg.max_position_embeddings)
        self.options = options
        self.tokenizer = tokenizer
        self.target = target
        self.device = target.embed.weight.device
        if options.draft_weights == "fp8":
            draft = _fp8_draft(draft, target, self.device)
        self.draft = draft
        if options.max_seq_len > target.cfg.max_position_embeddings:
            raise ValueError(
                f"max_seq_len {options.max_seq_len} exceeds the model's context "
                f"({target.cfg.max_position_embeddings} positions)"
            )
        if draft is not None and draft.cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(f"draft vocab {draft.cfg.vocab_size} != target vocab {target.cfg.vocab_size}")
        self.ngram = options.ngram_size if draft is None else 0
        speculative = draft is not None or self.ngram > 0
        if options.tree and speculative and options.tree_top_k > drafting_vocab(target, draft):
            raise ValueError(
                f"tree_top_k {options.tree_top_k} exceeds the vocabulary the drafter proposes from "
                f"({drafting_vocab(target, draft)} tokens)"
            )
        shape = round_shape(options, speculative)
        need_pos = options.max_seq_len + scratch_slots(options)
        for m in (target, draft):
            if m is not None and m.rope.shape[0] < need_pos:
                raise ValueError(
                    f"model was built for {m.rope.shape[0]} positions; the engine needs {need_pos} "
                    "(build_model(max_positions=...) >= max_seq_len + scratch)"
                )
        kw = dict(
            cuda_graphs=options.cuda_graphs,
            graph_batch_sizes=options.graph_batch_sizes,
            scratch_slots=scratch_slots(options),
            compile=options.compile_on,
            decode_gemv=options.decode_gemv,
            verify_gemm=options.verify_gemm,
        )
        self.target_runner = ModelRunner(target, options.max_batch_size, options.max_seq_len, **kw)
        self.draft_runner = ModelRunner(draft, options.max_batch_size, options.max_seq_len, **kw) if draft else None
        if OVERTAKE:  # the flag the rounds' gates read while a prefill overtakes them (RowBatch._overtake)
            if self.target_runner.enable_gates() and self.draft_runner is not None:
                self.draft_runner.share_gates(self.target_runner.hold)
        eos = set(target.cfg.eos_token_ids) | set(getattr(tokenizer, "eos_token_ids", []) or [])
        self.eos = frozenset(eos)
        if self.target_runner.recurrent is not None:
            self._check_hybrid(options, shape)
            if options.prompt_admission:
                raise ValueError("prompt_admission: a hybrid target's recurrent state is not prefilled inside a round")
        if options.tlv:
            self.round = self._tlv_round(shape)
        else:
            self.round = Round(self.target_runner, self.draft_runner, self.ngram, shape)
        width = options.max_seq_len + self.target_runner.scratch
        # An EAGLE-3 drafter (drafters.eagle3) reads target features: the round state carries them.
        self.feature_layers = self.round.feature_layers
        features = None
        if self.feature_layers is not None:
            if max(self.feature_layers) >= target.num_layers:
                raise ValueError(f"the drafter reads target layer {max(self.feature_layers)} of {target.num_layers}")
            features = (len(self.feature_layers) * target.cfg.hidden_size, target.embed.weight.dtype)
        self.state = RoundState.allocate(
            options.max_batch_size,
            width,
            shape,
            self.device,
            features,
            ranks=options.adaptive_width,
            greedy=bool(options.chain_depths),
        )
        if options.tlv and self.state.n_prev is None:  # a plain drafter's TLV window needs n_prev too
            self.state.n_prev = torch.zeros(options.max_batch_size, dtype=torch.long, device=self.device)
        self.captured = None
        if self.target_runner.use_graphs and self.round.capturable:
            self.captured = CapturedRound(self.round, self.state, park_at=options.max_seq_len)
        # Other round kinds (automatic off's AR round, adaptive depths, the shared budget's narrower verify
        # blocks) and the policy choosing among them: none with default options.
        self.kinds = alternate_rounds(self)
        self.kinds_captured = {
            k: CapturedRound(r, self.state, park_at=options.max_seq_len)
            for k, r in self.kinds.items()
            if self.captured is not None and r.capturable
        }
        curve = StepCurve.from_triples(options.auto_off_curve) if options.auto_off_curve else None
        if options.shared_budget is not None:
            for rnd in (self.round, *self.kinds.values()):
                rnd.shared_budget = options.shared_budget if rnd.shape.depth else None
                if options.adaptive_width:  # the accepted nodes' ranks, read back with the tokens
                    rnd.rank_col = shape.depth + 1
        if options.chain_depths:  # what a chain would have accepted
            if self.draft_runner is None:
                raise ValueError(
                    "chain_depths needs a draft model: what a chain would accept is known from the drafter's top-1 "
                    "children (prompt-lookup trees have none)"
                )
            col = self.state.out.shape[1] - 3
            for rnd in (self.round, *self.kinds.values()):
                rnd.greedy_col = col if rnd.shape.depth and not rnd.shape.chain else None
        self.policy = SpecPolicy(self, curve) if self.kinds or options.shared_budget is not None else None
        self.sampled_refused: dict[tuple, str] = {}  # (captured round, bucket, filter) -> why its capture failed
        self.colocated = None
        if options.colocate:
            if draft is None:
                raise ValueError("colocate needs a draft model (co-located rounds draft with it)")
            if self.feature_layers is not None:
                raise ValueError(
                    "colocate drafts with a standalone model; an EAGLE-3 drafter reads the target's features"
                )
            from .colocated import ColocatedRound

            self.colocated = ColocatedRound(self.target_runner, self.draft_runner, shape.depth, self.round)
        # Co-location only where it wins (``colocate_batches``): rounds by strategy, and the latest one's.
        self.colocate_rounds = {"colocated": 0, "conventional": 0}
        self.colocated_last = False
        self._batch: RowBatch | None = None
        self.warmup_s: float | None = None
        # Prompt admission's carrying rounds, captured per (kind, bucket, width, riders) where rounds are.
        self.carrying = None
        self.admission_costs: dict[tuple[int, int], tuple[float, float]] = {}  # measured at warm-up (CUDA)
        self.carry_ms: dict[tuple[int, int], dict] = {}  # (bucket, width) -> {carrying kind: ms}, at warm-up
        if options.prompt_admission and self.captured is not None:
            from .admission import CarryingGraphs

            self.carrying = CarryingGraphs(self)
        # Packed prefills of prompts admitted beside running rows, captured per (bucket, slots, width).
        self.packed_graphs = PackedGraphs(self) if self.captured is not None and packable(self) else None

    def _check_hybrid(self, options: EngineOptions, shape: RoundShape) -> None:
        """A hybrid (GDN) target: set its verify strategy, refuse what its recurrent state cannot serve."""
        if self.draft is not None and self.draft.cfg.is_hybrid:
            raise ValueError("the drafter has GDN layers; drafting keeps no recurrent state (use an attention drafter)")
        if options.tlv or options.colocate:
            raise ValueError("tlv and colocate rounds do not carry a hybrid target's recurrent state")
        if options.gdn_verify == "stock" and shape.depth and not shape.chain:
            raise ValueError(
                "gdn_verify='stock' keeps one state snapshot per chain position and cannot verify trees; "
                "use gdn_verify='path' or 'wy' for tree rounds on a hybrid target"
            )
        self.target_runner.recurrent.configure(options.gdn_verify, shape.depth + 1)

    def _tlv_round(self, shape: RoundShape) -> TLVRound:
        """Two-level verification: the Q pass runs ``view8_twin(target)`` (the 8-bit view, every tensor
        shared) on the target's own runner and KV cache (a shallow copy of the runner, its model swapped)."""
        import copy

        from ..models.w12_weights import has_w12, view8_twin

        if not has_w12(self.target):
            raise ValueError("tlv needs W12 weights (--weights w12): its Q pass reads their 8-bit view")
        if self.draft_runner is None:
            raise ValueError("tlv needs a draft model (--draft or --draft-layers): it drafts again from the Q chain")
        q_runner = copy.copy(self.target_runner)
        q_runner.model = view8_twin(self.target)
        return TLVRound(self.target_runner, self.draft_runner, q_runner, shape.plan)

    @property
    def shape(self) -> RoundShape:
        return self.round.shape

    @property
    def batch(self) -> RowBatch:
        """The engine's rows: ``generate`` and the server's scheduler both drive this one loop."""
        if self._batch is None:
            self._batch = RowBatch(self)
        return self._batch

    def reserved_slots(self) -> int:
        """Context positions a request needs beyond prompt + max_new_tokens (what one round writes
        past the row's length); every caller (the engine, the server) sizes requests with this."""
        return self.round.shape.reach

    def max_new_tokens_for(self, n_prompt: int) -> int:
        """The most tokens a prompt of ``n_prompt`` tokens may ask for in this context."""
        return self.options.max_seq_len - n_prompt - self.reserved_slots()

    @classmethod
    def from_options(cls, options: EngineOptions | None = None) -> Engine:
        from .loading import load_engine_models

        options = options or EngineOptions()
        target, draft, tokenizer, options = load_engine_models(options)
        return cls(target, tokenizer, options, draft)

    def warmup(
        self, buckets: tuple[int, ...] | None = None, progress=True, prefill_batches: tuple[int, ...] | None = None
    ) -> float:
        """Compile and capture every round this configuration runs (each batch bucket) and run every
        padded prefill shape, now rather than on first use; returns the seconds it took (also kept in
        ``warmup_s``). ``progress``: True logs each step (logger ``specpilot.engine``), a callable gets
        each line, False/None is silent. ``prefill_batches``: the numbers of prompts prefilled together whose
        shapes to run (default every count up to the largest bucket: at 64 rows and an 8B model that sweep
        alone is minutes of compute). No-op off CUDA."""
        if self.captured is None:
            return 0.0
        say = (lambda m: log.info("%s", m)) if progress is True else (progress or (lambda m: None))
        t0 = time.perf_counter()
        ladder = buckets or self.target_runner.ladder
        say("warm-up: prefill shapes")
        self._warm_prefill(ladder, prefill_batches)
        for i, b in enumerate(ladder):
            say(
                f"warm-up: compiling and capturing the round for batch {b} ({i + 1}/{len(ladder)}, "
                f"{time.perf_counter() - t0:.1f} s so far)"
            )
            bs = BatchSampling.from_params([SamplingParams()] * b, self.device)
            here = [self._capture_of(k) for k in self._captured_kinds_at(b)]
            for cap in here:
                cap.capture(b, bs)
            if self.options.capture_sampling:  # sampled rounds without top-k/top-p (those: on first use)
                params = [SamplingParams(temperature=1.0)] * b
                sampled = BatchSampling.from_params(params, self.device, self.batch.generator)
                for cap in here:
                    self._sampled_graph(cap, b, sampled)
            if self.carrying is not None:
                self._warm_carrying(b, bs)
            if self.packed_graphs is not None:  # before measure_costs, which times them
                for key in self.packed_graphs.keys_at(b):
                    self.packed_graphs.capture(key)
        if self.carrying is not None:
            from .admission import measure_costs

            say("warm-up: timing carrying rounds against separate prefills (prompt admission)")
            self.admission_costs, self.carry_ms = measure_costs(self, ladder)
        if self.policy is not None and self.policy.auto_off is not None and self.policy.auto_off.curve is None:
            say("warm-up: timing the AR and speculative rounds per batch bucket (automatic off's step curve)")
            self.policy.auto_off.curve = self._measure_curve(ladder)
        torch.cuda.synchronize()
        self.warmup_s = time.perf_counter() - t0
        say(f"warm-up done in {self.warmup_s:.1f} s ({len(ladder)} batch sizes)")
        return self.warmup_s

    def _warm_carrying(self, b: int, bs: BatchSampling) -> None:
        # Every (kind, width) a carrying round of bucket b may take (``admission.carry_kinds``): a capture at
        # serving time would cost the first riders of each shape their TTFT.
        from .admission import RIDER_SHAPES, carry_kinds, rider_widths

        for w in rider_widths(self.options.prompt_admission, self.target_runner.scratch):
            for kind in carry_kinds(self, b):
                for s in RIDER_SHAPES:
                    self.carrying.capture((kind, b, w, s), self.round if kind is None else self.kinds[kind], bs)

    def _captured_kinds_at(self, b: int) -> list:
        """The captured round kinds a batch of bucket ``b`` may run (``round_kinds.kinds_at``; None: the
        engine's own round)."""
        return [k for k in kinds_at(self, b) if k is None or k in self.kinds_captured]

    def _capture_of(self, kind) -> CapturedRound:
        return self.captured if kind is None else self.kinds_captured[kind]

    @torch.inference_mode()
    def _measure_curve(self, ladder: tuple[int, ...]) -> StepCurve:
        """Replay each captured kind per bucket (no row in use: replays advance nothing) -> the step curve."""
        curve = StepCurve()
        for b in ladder:
            if b in self.captured:  # not where a shared budget narrows it (``kinds_at``)
                curve.add("spec", b, measure(lambda b=b: self.captured.replay(b)))
            for key, cap in self.kinds_captured.items():
                if b in cap:  # narrowed kinds: only at the buckets that run them
                    curve.add(key, b, measure(lambda b=b, cap=cap: cap.replay(b)))
        log.info("step curve (ms by kind and rows): %s", curve.as_dict())
        return curve

    @torch.inference_mode()
    def _warm_prefill(self, ladder: tuple[int, ...], batches: tuple[int, ...] | None = None) -> None:
        # Every padded prefill shape once per batch size, in the scratch slots past max_seq (no row's); the
        # shapes that replay graphs (ModelRunner.prefill) are captured now.
        chunk = self.options.prefill_chunk
        widths = sorted({prefill_width(n, chunk) for n in range(1, chunk + 1)})
        for runner in (self.target_runner, self.draft_runner):
            if runner is None:
                continue
            runner.capture_prefill = True
            try:
                # A prompt count past the cache's rows is no shape this engine meets (and would index past
                # them: ``bench batched --concurrency 1`` asked for 2 at max_batch_size 1 and hit a device assert).
                counts = batches if batches is not None else range(1, max(ladder) + 1)
                for b in [b for b in counts if b <= self.options.max_batch_size]:
                    for w in widths:
                        self._prefill_probe(b, w, (runner,))
            finally:
                runner.capture_prefill = False

    def _prefill_probe(self, b: int, w: int, runners=None) -> None:
        # One prefill chunk of b rows and w tokens through each runner (a graph replay where one is captured),
        # written into the scratch slots past max_seq (no row's): warm-up and the admission's cost measurement.
        seq = torch.full((b,), self.options.max_seq_len, device=self.device)
        toks = torch.zeros(b, w, dtype=torch.long, device=self.device)
        rows = torch.zeros(b, 1, dtype=torch.long, device=self.device)
        for runner in runners or (self.target_runner, self.draft_runner):
            if runner is None:
                continue
            extra = self._prefill_extra(runner, b, w)
            # As the prefill calls it: the target with logit rows, a drafter without.
            runner.prefill(toks, seq, 0, rows if runner is self.target_runner else None, **extra)

    def _prefill_extra(self, runner: ModelRunner, b: int, w: int) -> dict:
        # What an eager prefill step of an EAGLE-3 setup passes: the target returns its features, the
        # drafter reads (here: zero) features.
        if self.feature_layers is None:
            return {}
        if runner is self.target_runner:
            return {"feature_layers": self.feature_layers}
        return {"g": torch.zeros(b, w, self.target.cfg.hidden_size, device=self.device, dtype=self.draft.dtype)}

    def run_round(self, b: int, bs: BatchSampling, max_len: int | None, kind=None, eager: bool = False) -> None:
        """One round over state rows ``0 .. b-1`` (a ladder bucket): a graph replay for greedy rounds
        on CUDA, else ``Round.run`` eagerly (or the co-located strategy, see ``colocated.ColocatedRound``).
        ``kind``: one of ``self.kinds`` (None: the engine's own round); ``eager``: ``Round.run`` even where a
        graph is captured (a round carrying a prompt's prefill, ``admission``). Reads nothing back to the host."""
        max_len = max_len if self.device.type != "cuda" else None  # only dense-mask (CPU) attention uses it
        rnd = self.round if kind is None else self.kinds[kind]
        captured = self.captured if kind is None else self.kinds_captured.get(kind)
        colocate = self.colocated is not None and (
            self.options.colocate_batches is None or b in self.options.colocate_batches
        )
        if self.colocated is not None:
            self.colocated_last = colocate
            self.colocate_rounds["colocated" if colocate else "conventional"] += 1
        if colocate:
            self.colocated.run(self.state, b, bs, max_len)
        elif captured is not None and bs.all_greedy and not eager:
            if b not in captured:
                captured.capture(b, bs)
            captured.replay(b)
        elif captured is not None and not eager and self._sampled_graph(captured, b, bs):
            captured.replay_sampled(b, bs)
        else:
            rnd.run(self.state, b, bs, max_len)

    def _sampled_graph(self, captured, b: int, bs: BatchSampling) -> bool:
        """Whether a sampled round of bucket ``b`` replays a graph (``capture_sampling``), capturing it on
        first use. A capture that fails is not retried: that round runs eagerly, as without the option."""
        if not self.options.capture_sampling:
            return False
        if not captured.takes_sampled(b, bs):
            key = (id(captured), b, bs.needs_filter)
            if key in self.sampled_refused:
                return False
            try:
                captured.capture_sampled(b, bs)
            except Exception as e:  # noqa: BLE001 - any capture failure falls back to the eager round
                self.sampled_refused[key] = f"{type(e).__name__}: {e}"
                log.warning("sampled round of batch %d not captured, it runs eagerly: %s", b, e)
                return False
        return captured.takes_sampled(b, bs)

    def run_carrying(self, b: int, bs: BatchSampling, max_len: int | None, kind, rows: list[int], lens: list[int]):
        """A round over rows ``0 .. b - 1`` that carries the prefill of prompts parked in ``rows`` (``lens``
        tokens each; ``admission.carry``): a graph replay for greedy rounds on CUDA, else eager. Returns
        [b, 2] on the device: first tokens and non-finite flags (the riders' rows). Reads nothing back."""
        from .admission import Riders, carry, rider_width

        width = rider_width(max(lens), self.target_runner.scratch)
        rnd = self.round if kind is None else self.kinds[kind]
        if self.carrying is not None and bs.all_greedy and rnd.capturable:
            key = (kind, b, width, len(rows))
            if key not in self.carrying:
                self.carrying.capture(key, rnd, bs)
            return self.carrying.replay(key, rows, lens)
        riders = Riders.empty(width, self.device, len(rows))
        riders.fill(rows, lens)
        max_len = max_len if self.device.type != "cuda" else None
        return carry(self, rnd, self.state, b, bs, riders, max_len)

    # ---- requests ------------------------------------------------------------------------------
    def encode(self, prompt: str | list[int], chat: bool = False) -> list[int]:
        if isinstance(prompt, str):
            if chat:
                prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def _make_request(self, index: int, prompt: list[int], params: SamplingParams) -> Request:
        if len(prompt) == 0:
            raise RequestError("prompt is empty")
        vocab = self.target.cfg.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise RequestError(f"prompt holds token ids outside the vocabulary [0, {vocab})")
        need = len(prompt) + params.max_new_tokens + self.reserved_slots()
        if need > self.options.max_seq_len:
            raise RequestError(
                f"prompt of {len(prompt)} tokens + max_new_tokens {params.max_new_tokens} needs {need} positions "
                f"but the context holds {self.options.max_seq_len} (max_seq_len)"
            )
        return Request(index, prompt, params, self.eos)

    # ---- generation ----------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[str | list[int]] | str,
        params: SamplingParams | list[SamplingParams] | None = None,
        chat: bool = False,
        raise_on_error: bool = True,
    ) -> list[GenerationResult]:
        """Generate for a batch of prompts (text or token ids); returns one result per prompt.

        A request the engine fails (non-finite logits, parameters it cannot use) fails alone: the others
        finish as they would have alone. Then ``GenerationError`` is raised, with every result in
        ``.results``; with ``raise_on_error=False`` the results are returned, the failed ones with
        ``finish_reason == "error"`` and ``error`` set. A failure is never returned as a success.
        """
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int))
        batch = [prompts] if single else list(prompts)
        results: dict[int, GenerationResult] = {}
        for ev in self.stream(batch, params, chat=chat):
            if ev.result is not None:
                results[ev.index] = ev.result
        out = [results[i] for i in range(len(batch))]
        if raise_on_error and any(r.error is not None for r in out):
            raise GenerationError(out)
        return out

    def stream(
        self,
        prompts: list[str | list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        chat: bool = False,
    ) -> Iterator[StreamEvent]:
        """Yield ``StreamEvent``s as tokens are produced; each request's last event carries its result.

        A request that fails ends with an event of ``finish_reason == "error"`` (its result's ``error``
        says why); the other requests go on."""
        if not prompts:
            raise RequestError("no prompts given")
        if len(prompts) > self.options.max_batch_size:
            raise RequestError(f"batch of {len(prompts)} exceeds max_batch_size {self.options.max_batch_size}")
        if params is None:
            params = SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise RequestError("one SamplingParams per prompt is required")
        reqs = [
            self._make_request(i, self.encode(p, chat), sp)
            for i, (p, sp) in enumerate(zip(prompts, plist, strict=False))
        ]
        yield from self._run(reqs)

    def _run(self, reqs: list[Request]) -> Iterator[StreamEvent]:
        batch = self.batch
        if batch.busy:
            raise RequestError("the engine is serving other requests (its rows are in use)")
        try:
            events = batch.admit(reqs)
            while True:
                yield from events
                if not batch.busy:
                    break
                events = batch.step()
        finally:
            for r in reqs:  # an abandoned stream frees its rows
                if 0 <= r.index < batch.capacity and batch.rows[r.index] is r:
                    batch.release(r.index)
            if not batch.active:
                batch.drain()

    def _prefill_chunks(self, lens_t: torch.Tensor, total: int):
        """Per prefill chunk: (start, real tokens n, padded width, seq_len [B]). Rows whose prompt ended
        before the chunk get seq_len max_seq_len: they write into the cache's scratch slots."""
        chunk = self.options.prefill_chunk
        for start in range(0, total, chunk):
            n = min(chunk, total - start)
            width = prefill_width(n, chunk)
            seq = torch.where(lens_t > start, torch.full_like(lens_t, start), self.options.max_seq_len)
            yield start, n, width, seq

    def _prefill(self, runner: ModelRunner, history: torch.Tensor, lens: list[int], want_logits: bool = True):
        """Run the prompts through ``runner`` in chunks; return each request's last-position logits [B, V].

        Rows whose prompt ended before a chunk write that chunk into the cache's scratch slots. Each
        chunk is padded to a multiple of ``PREFILL_ALIGN`` tokens (the pad lands past the row's length,
        where nothing reads it), so prefill shapes come from a short list that ``warmup`` runs once.
        """
        lens_t = torch.tensor(lens, device=self.device)
        out = None
        for start, n, width, seq in self._prefill_chunks(lens_t, max(lens)):
            rows = (lens_t - 1 - start).clamp(0, n - 1)[:, None] if want_logits else None
            # A hybrid's recurrent state must not step over the chunk's padding: it gets the real count.
            extra = {} if runner.recurrent is None else {"valid": (lens_t - start).clamp(0, n)}
            logits = runner.prefill(history[:, start : start + width], seq, start, rows, **extra)
            if want_logits:
                here = ((lens_t - 1 >= start) & (lens_t - 1 < start + n))[:, None]
                out = logits[:, 0] if out is None else torch.where(here, logits[:, 0], out)
        return out

    # ---- step-level API: the loop's pieces (engine/rows.py) -------------------------------------
    def new_request(self, prompt: str | list[int], params: SamplingParams, chat: bool = False) -> Request:
        """Encode and validate one request (raises ``RequestError``); its row is assigned on admission."""
        return self._make_request(-1, self.encode(prompt, chat), params)

    @torch.inference_mode()
    def prefill_rows(self, history: torch.Tensor, lens: list[int]) -> torch.Tensor:
        """Prefill target (and draft) for the rows with ``lens[b] > 0``; returns last-position logits [B, V].

        history : [B, W] (rows 0..B-1 of the cache). Rows with ``lens[b] == 0`` write only into the cache's
        scratch slots, so rows that are mid-generation keep their KV; their logits are meaningless.
        """
        # Packed: prompts admitted beside running rows (the new rows alone), or a wave of mixed lengths (by
        # width tier).
        if worth_packing(self, lens) or worth_tiering(self, lens):
            return packed_prefill(self, lens)
        if self.feature_layers is not None:
            return self._prefill_eagle(history, lens)
        last = self._prefill(self.target_runner, history, lens)
        if self.state.n_prev is not None:  # a TLV round's drafter window starts at the prompt's end
            rows = torch.tensor(lens, device=self.device) > 0
            self.state.n_prev[: len(lens)] = torch.where(rows, 0, self.state.n_prev[: len(lens)])
        if self.draft_runner is not None:
            self._prefill(self.draft_runner, history, lens, want_logits=False)
        return last

    def _prefill_eagle(self, history: torch.Tensor, lens: list[int]) -> torch.Tensor:
        """Prefill for an EAGLE-3 drafter: each target chunk also returns its features, and the drafter
        runs the same chunk with the features one position earlier (zeros before position 0; the drafter
        was trained so). The prompt's last feature waits in the round state for the first round, which
        feeds it with the first emitted token (``draft_tree._eagle_root``, n_prev 0)."""
        dev, st = self.device, self.state
        B = len(lens)
        lens_t = torch.tensor(lens, device=dev)
        F = st.feats.shape[-1]
        prev = torch.zeros(B, 1, F, device=dev, dtype=st.feats.dtype)
        last_feat = torch.zeros(B, F, device=dev, dtype=st.feats.dtype)
        out = None
        for start, n, width, seq in self._prefill_chunks(lens_t, max(lens)):
            end = (lens_t - 1 - start).clamp(0, n - 1)[:, None]
            toks = history[:, start : start + width]
            extra = {} if self.target_runner.recurrent is None else {"valid": (lens_t - start).clamp(0, n)}
            extra["feature_layers"] = self.feature_layers
            logits, feats = self.target_runner.prefill(toks, seq, start, end, **extra)
            g = self.draft.prefill_inputs(feats, prev)
            self.draft_runner.prefill(toks, seq, start, g=g)
            here = (lens_t - 1 >= start) & (lens_t - 1 < start + n)
            out = logits[:, 0] if out is None else torch.where(here[:, None], logits[:, 0], out)
            last_feat = torch.where(here[:, None], feats.gather(1, end[:, :, None].expand(B, 1, F))[:, 0], last_feat)
            prev = feats[:, n - 1 : n]
        rows = lens_t > 0
        st.feats[:B, 0] = torch.where(rows[:, None], last_feat, st.feats[:B, 0])
        st.n_prev[:B] = torch.where(rows, 0, st.n_prev[:B])
        return out

    @torch.inference_mode()
    def teacher_force_logits(self, prompt_ids: list[int], generated_ids: list[int]) -> torch.Tensor:
        """Stock target logits [T, V] (float32) where row t predicts generated_ids[t] (token forcing)."""
        seq = list(prompt_ids) + list(generated_ids)
        if len(seq) + 1 > self.options.max_seq_len:
            raise RequestError("sequence longer than max_seq_len")
        dev, L, T = self.device, len(prompt_ids), len(generated_ids)
        toks = torch.tensor([seq], device=dev)
        rows = []
        for start in range(0, len(seq) - 1, self.options.prefill_chunk):
            n = min(self.options.prefill_chunk, len(seq) - 1 - start)
            anc, depth = causal_tree(n, dev)
            seq_len = torch.tensor([start], device=dev)
            rows.append(
                self.target_runner.step(
                    toks[:, start : start + n],
                    seq_len,
                    anc,
                    depth,
                    max_len_hint=start,
                    logit_rows=torch.arange(n, device=dev)[None],
                    eager=True,
                )[0]
            )
        return torch.cat(rows)[L - 1 : L - 1 + T].float()
