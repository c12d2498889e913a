"""Runs one model over its static KV cache: eager on any device, CUDA-graph replays on GPU.

A step is (tokens [B, N], seq_len [B], anc [N, N], depth [N]) -> logits [B, N, V]; see attn_meta.py.
On CUDA, each (batch size, N) pair is captured once, lazily or up front by ``capture``, with the batch
padded up to the next size of the ladder. Padding rows use seq_len 0 and write to cache rows no request
owns, so they cannot disturb real requests. All graphs share one memory pool.
"""

from __future__ import annotations

import logging
import os

import torch

from ..kernels.hold_gate import wait_while_held
from ..models.linear import set_decode_gemv, verify_gemm_layers
from ..models.llama import Transformer, fused_attention_supported, run_block
from ..models.mixed_forward import Group, mixed_forward
from ..models.w12_weights import align_w12_escapes
from .attn_meta import build_step_meta, causal_tree, window_mask
from .gdn_state import RecurrentState
from .kv_cache import KVCache

log = logging.getLogger("specpilot.engine")


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _compiled_entries(fn) -> int:
    """How many compiled versions dynamo holds for ``fn``'s code (a private torch helper; where it is missing,
    a bound as large as the e2e suite's, 256)."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        return len(_debug_get_cache_entry_list(fn))
    except Exception:  # pragma: no cover - another torch version
        return 256


def side_stream_warmup(fn, times: int = 2) -> None:
    """Run ``fn`` ``times`` times on a side stream, as CUDA-graph capture needs first (allocator, cuBLAS
    handles, lazy inits must not happen during capture); the current stream waits for it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(times):
            fn()
    torch.cuda.current_stream().wait_stream(stream)


class _Graph:
    def __init__(self, runner: ModelRunner, batch: int, n: int, pool):
        dev = runner.device
        self.tokens = torch.zeros(batch, n, dtype=torch.long, device=dev)
        self.seq_len = torch.zeros(batch, dtype=torch.long, device=dev)
        self.anc, self.depth = causal_tree(n, dev)
        # Warm up outside capture. The warm-up really runs, so it writes its K/V into the cache's scratch
        # slots past max_seq, never into a request's slots.
        self.seq_len.fill_(runner.max_seq)
        side_stream_warmup(lambda: runner._graph_fn(self.tokens, self.seq_len, self.anc, self.depth, runner.max_seq))
        self.seq_len.zero_()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits = runner._graph_fn(self.tokens, self.seq_len, self.anc, self.depth, runner.max_seq)
        self._last_tree = None
        self._last_batch = batch

    def __call__(self, tokens, seq_len, anc, depth) -> torch.Tensor:
        B = tokens.shape[0]
        self.tokens[:B].copy_(tokens)
        self.seq_len[:B].copy_(seq_len)
        if B != self._last_batch:  # padding rows must read as empty; they stay so until B changes
            self.seq_len[B:].zero_()
            self._last_batch = B
        # Chains pass the same (anc, depth) tensors every step: skip two copies per replay then.
        if self._last_tree is None or self._last_tree[0] is not anc or self._last_tree[1] is not depth:
            self.anc.copy_(anc)
            self.depth.copy_(depth)
            self._last_tree = (anc, depth)
        self.graph.replay()
        return self.logits[:B]


# Prefill chunks run as CUDA-graph replays for batches of up to this many rows. An eager prefill pays a
# kernel launch from Python per op: on the H200, SmolLM2 (30 layers, synthetic weights) took 22.5 ms from
# prompt to first token at 140-175 prompt tokens while a decode round's GPU time is 1.10 ms, so 128 tokens
# spent 14% of their time in the eager prefill (b5e79e0). The launches cost per forward, not per row, so
# graphs pay most for the few prompts prefilled together that set a request's time to first token; each
# (rows, width) pair costs a capture at warm-up and the widest step's activations in a pool of its own.
PREFILL_GRAPH_MAX_BATCH = 4

# Gates a captured round has between its target's layers (``ModelRunner.hold``): a prefill that overtakes
# the round waits at most for the stretch of layers up to the next one (on the H100's lifted 8B, a quarter
# of a ~9.5 ms tree round). Each costs one one-program launch when the flag is clear.
GATES = 4
# SPECPILOT_ROUND_GATES=0 captures rounds without them (an A/B switch for runs in separate processes).
ROUND_GATES = os.environ.get("SPECPILOT_ROUND_GATES", "1") != "0"
# Targets narrower than this get no gates. On the lifted 8B (hidden 4,096) they cost no measurable throughput
# (batched_gates_ab_h100.json: 2,708 / 2,722 tok/s on / off); at SmolLM2's 576 a round is ~1-2 ms and a
# prompt's prefill about as short, so a round's 4 extra launches (a few us each: an estimate, not timed there)
# would buy little, and the figures measured on it without gates stay what they were.
GATE_MIN_HIDDEN = 2048


def _tensors(out, fn):
    return tuple(fn(t) for t in out) if isinstance(out, tuple) else fn(out)


class _PrefillGraph:
    """A captured prefill chunk of ``batch`` rows and ``width`` tokens that starts at slot 0: the same
    kernels as the eager chunk (SDPA over a dense causal mask of ``width`` slots), so the same bits.
    Inputs are copied into static buffers (tokens, seq_len, logit rows, an EAGLE-3 drafter's features ``g``);
    outputs are cloned out, since every prefill graph of the runner shares one memory pool."""

    def __init__(self, runner: ModelRunner, batch: int, width: int, logit_rows: bool, extra: dict, pool):
        dev = runner.device
        self.tokens = torch.zeros(batch, width, dtype=torch.long, device=dev)
        self.seq_len = torch.full((batch,), runner.max_seq, dtype=torch.long, device=dev)
        self.rows = torch.zeros(batch, 1, dtype=torch.long, device=dev) if logit_rows else None
        # Tensors (the drafter's g) become static buffers; anything else (feature layer indices) is fixed.
        self.extra = {k: torch.zeros_like(v) if torch.is_tensor(v) else v for k, v in extra.items()}
        # Kept on the object: the graph reads these very tensors at every replay.
        self.anc, self.depth = causal_tree(width, dev)
        kv_len = min(runner.max_seq, _round_up(width, 64))  # as the eager chunk at start 0

        def fn():
            return runner._forward(self.tokens, self.seq_len, self.anc, self.depth, kv_len, self.rows, **self.extra)

        side_stream_warmup(fn)  # writes into the scratch slots past max_seq (seq_len above)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = fn()

    def __call__(self, tokens, seq_len, logit_rows, extra) -> torch.Tensor | tuple[torch.Tensor, ...]:
        self.tokens.copy_(tokens)
        self.seq_len.copy_(seq_len)
        if self.rows is not None:
            self.rows.copy_(logit_rows)
        for k, v in extra.items():
            if torch.is_tensor(v):
                self.extra[k].copy_(v)
        self.graph.replay()
        return _tensors(self.out, torch.Tensor.clone)


class ModelRunner:
    def __init__(
        self,
        model: Transformer,
        max_batch: int,
        max_seq: int,
        *,
        cuda_graphs: bool = True,
        graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
        scratch_slots: int = 64,
        compile: bool = False,
        fused_attention: bool = True,
        decode_gemv: bool = True,
        verify_gemm: bool = True,
    ):
        self.model = model
        # One-row projections run kernels/gemv.py where it beats cuBLAS, verify-sized ones (2..64 rows)
        # kernels/skinny_gemm.py where that does (models/linear.py); CUDA bf16 only.
        self.decode_gemv_layers = set_decode_gemv(model, decode_gemv, verify_gemm)
        self.verify_gemm_layers = verify_gemm_layers(model)
        self.device = model.embed.weight.device
        self.dtype = model.embed.weight.dtype
        self.max_batch, self.max_seq = max_batch, max_seq
        self.group = model.cfg.num_heads // model.cfg.num_kv_heads
        # Extra slots per row past max_seq take writes that belong to no request: graph warm-ups (see
        # _Graph) and prefill chunks of rows whose prompt already ended. Must cover the widest step.
        self.scratch = scratch_slots
        self.kv = KVCache(model.cfg, max_batch, max_seq + scratch_slots, self.device, self.dtype)
        # A hybrid model's GDN layers keep per-row recurrent state beside the KV cache (gdn_state.py).
        self.recurrent = None
        if model.cfg.is_hybrid:
            self.recurrent = RecurrentState(model.cfg, max_batch, max_seq, self.device, self.dtype)
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        ladder = sorted({b for b in graph_batch_sizes if b < max_batch} | {max_batch})
        self.ladder = tuple(ladder)
        self._graphs: dict[tuple[int, int], _Graph] = {}
        # torch.compile fuses each block's norms, rope and SwiGLU into a few kernels; only graph-captured
        # (fixed-shape) steps use it, so eager prefill never triggers a recompile. One compiled block
        # serves all layers; each (batch, width, model shape) adds a cache entry, hence the larger limit.
        self.fused_attention = fused_attention and fused_attention_supported(model.cfg)
        self._layer_fn = None
        if compile:
            # The entries are run_block's, shared by every runner of the process (its guards hold shapes, not
            # models): this runner's room counts from what earlier ones left, or with fullgraph its first new
            # shape past the limit raises (FailOnRecompileLimitHit; tests/test_compile_cache.py).
            held = _compiled_entries(run_block)
            cfg = torch._dynamo.config
            cfg.cache_size_limit = max(cfg.cache_size_limit, held + 64)
            cfg.accumulated_cache_size_limit = max(cfg.accumulated_cache_size_limit, held + 512)
            self._layer_fn = torch.compile(run_block, fullgraph=True, dynamic=False)
            align_w12_escapes(model)  # W12 layers: one escape length per projection, one graph for all layers
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        # Prefill graphs (``prefill``): captured only while ``capture_prefill`` is set (the engine's warm-up),
        # so serving never pays a capture; a shape not captured then runs eagerly.
        self._prefill_graphs: dict[tuple, _PrefillGraph] = {}
        self.prefill_refused: dict[tuple, str] = {}  # shapes whose capture failed: they run eagerly
        self._prefill_pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.capture_prefill = False
        # Rounds (engine/round.py) attend with the fused kernel wherever it runs natively.
        self.round_fused = self.fused_attention and self.device.type == "cuda"
        # A prefill group that rides in this runner's next round forward (prompt admission, see
        # engine/admission.py): one pass reads the weights for both; its result lands in ``rider.out``.
        self.rider = None
        # The flag a prefill overtaking the rounds sets while it runs (``RowBatch._overtake``): rounds captured
        # while it is a tensor wait at ``GATES`` points between their layers while it is set (kernels/
        # hold_gate.py). None (the default, and on the CPU): rounds have no gates.
        self.hold: torch.Tensor | None = None
        self._gate_each_forward = False  # a drafter's runner: one gate before each forward (``share_gates``)

    def _forward(
        self, tokens, seq_len, anc, depth, kv_len, logit_rows=None, layer_fn=None, fused_attention=False, **extra
    ) -> torch.Tensor:
        meta = build_step_meta(seq_len, anc, depth, kv_len, self.group, with_mask=not fused_attention)
        if self.recurrent is not None:  # prefill / teacher forcing: ``valid`` real tokens per row
            extra["rec"] = self.recurrent.prefill(seq_len, extra.pop("valid", None), tokens.shape[1])
        return self.model(
            tokens, meta.positions, meta.slots, meta.mask, self.kv.layers, logit_rows, layer_fn, seq_len, anc, **extra
        )

    def _graph_fn(self, tokens, seq_len, anc, depth, kv_len) -> torch.Tensor:
        # Graph steps are narrow (N <= verify width) and attend over the whole cache capacity, which is
        # where the fused kernel pays: it reads only each row's live slots. Prefill keeps SDPA.
        return self._forward(
            tokens, seq_len, anc, depth, kv_len, layer_fn=self._layer_fn, fused_attention=self.fused_attention
        )

    @torch.inference_mode()
    def capture(self, widths: tuple[int, ...]) -> None:
        """Capture every (ladder batch size, N) graph now instead of on first use."""
        if self.use_graphs:
            for n in widths:
                for b in self.ladder:
                    self._graph(b, n)

    def _graph(self, batch: int, n: int) -> _Graph:
        key = (batch, n)
        if n > self.scratch:
            raise ValueError(f"step width {n} exceeds the {self.scratch} scratch slots graphs warm up in")
        if key not in self._graphs:
            self._graphs[key] = _Graph(self, batch, n, self._pool)
        return self._graphs[key]

    @torch.inference_mode()
    def step(
        self,
        tokens: torch.Tensor,
        seq_len: torch.Tensor,
        anc: torch.Tensor,
        depth: torch.Tensor,
        *,
        max_len_hint: int | None = None,
        logit_rows: torch.Tensor | None = None,
        eager: bool = False,
        **extra,
    ) -> torch.Tensor:
        """Write the new tokens' K/V and return their logits [B, N, V] (or [B, R, V] with logit_rows).

        ``max_len_hint`` (host int >= max(seq_len)) lets eager runs attend over fewer cache slots.
        ``eager`` (prefill, teacher forcing) never uses or captures a graph: a graph per prompt length
        would compile and capture anew for every new prompt. ``extra`` goes to the model's forward (the
        features an EAGLE-3 drafter reads, the feature layers a target returns); such steps run eagerly.
        """
        B, N = tokens.shape
        graphable = logit_rows is None and anc.dim() == 2 and not extra and self.recurrent is None
        if self.use_graphs and not eager and graphable:
            bucket = next(b for b in self.ladder if b >= B)
            return self._graph(bucket, N)(tokens, seq_len, anc, depth)
        kv_len = self.max_seq
        if max_len_hint is not None:
            kv_len = min(self.max_seq, _round_up(max_len_hint + N, 64))
        return self._forward(tokens, seq_len, anc, depth, kv_len, logit_rows, **extra)

    @torch.inference_mode()
    def prefill(
        self, tokens: torch.Tensor, seq_len: torch.Tensor, start: int, logit_rows: torch.Tensor | None = None, **extra
    ):
        """One prefill chunk: ``tokens`` [B, N] at slots ``seq_len + 0 .. N - 1`` of each row, causal among
        themselves (``step`` with ``causal_tree(N)``, eager). A chunk that starts at 0 (``start``, the chunk's
        offset in the prompt) of at most PREFILL_GRAPH_MAX_BATCH rows replays a graph where one was captured
        (while ``capture_prefill`` is set, it captures one); the result is the eager chunk's, bit for bit."""
        B, N = tokens.shape
        if self.use_graphs and start == 0 and B <= PREFILL_GRAPH_MAX_BATCH and self.recurrent is None:
            # Tensors (the drafter's g) are inputs; other extras (feature layer indices) are part of the shape.
            fixed = tuple((k, None if torch.is_tensor(v) else v) for k, v in sorted(extra.items()))
            key = (B, N, logit_rows is not None, fixed)
            graph = self._prefill_graphs.get(key)
            if graph is None and self.capture_prefill and key not in self.prefill_refused:
                try:
                    graph = _PrefillGraph(self, B, N, logit_rows is not None, extra, self._prefill_pool)
                    self._prefill_graphs[key] = graph
                except Exception as e:  # noqa: BLE001 - a shape that cannot be captured runs eagerly, as before
                    self.prefill_refused[key] = f"{type(e).__name__}: {e}"
                    log.warning("prefill of %d rows x %d tokens not captured, it runs eagerly: %s", B, N, e)
            if graph is not None:
                return graph(tokens, seq_len, logit_rows, extra)
        anc, depth = causal_tree(N, tokens.device)
        return self.step(tokens, seq_len, anc, depth, max_len_hint=start, logit_rows=logit_rows, eager=True, **extra)

    @torch.inference_mode()
    def forward(self, tokens, positions, slots, seq_len, anc, kv_len: int | None = None, **extra) -> torch.Tensor:
        """One step of a speculative round (capturable: no host sync, shapes fixed by the round).

        tokens, positions, slots : [B, Nq]; seq_len : [B] prefix length; anc : [Nq, W] or [B, Nq, W] bool,
        query i sees every prefix slot and window slot ``seq_len + t`` where ``anc[(b,) i, t]`` (the
        step's own tokens sit inside that window at ``slots``). On CUDA the fused kernel reads only the
        live slots and the blocks run compiled; elsewhere SDPA with a dense mask over ``kv_len`` slots
        (default: the whole cache). Returns logits [B, Nq, V]; ``extra`` goes to the model's forward (an
        EAGLE-3 drafter's features ``g``, which then returns hidden states; a target's ``feature_layers``).
        A hybrid model's GDN layers verify the block without committing: ``recurrent.commit`` follows.
        """
        if self.recurrent is None:
            return self._round_forward(tokens, positions, slots, seq_len, anc, kv_len, **extra)
        out = self._round_forward(
            tokens, positions, slots, seq_len, anc, kv_len, rec=self.recurrent.verify(anc, tokens.shape[0]), **extra
        )
        if tokens.shape[1] == 1:  # an AR step: its one token is accepted, whatever round runs it
            self.recurrent.commit(torch.zeros_like(seq_len), seq_len)
        return out

    def enable_gates(self) -> bool:
        """Give this runner's captured rounds their gates (``hold``), where they pay: graphs on, a target at
        least ``GATE_MIN_HIDDEN`` wide, no recurrent state; ``SPECPILOT_ROUND_GATES=0`` never. Call before any
        round is captured. Returns whether it has them."""
        wide = self.model.cfg.hidden_size >= GATE_MIN_HIDDEN
        if ROUND_GATES and wide and self.use_graphs and self.recurrent is None and self.hold is None:
            self.hold = torch.zeros(1, dtype=torch.int32, device=self.device)
            wait_while_held(self.hold)  # the kernel compiled and loaded here, not first inside a graph capture
        return self.hold is not None

    def share_gates(self, flag: torch.Tensor | None) -> None:
        """A drafter's runner waits at the target runner's flag (``enable_gates``) once before each of its
        round forwards, one a draft step: a prefill that overtakes a round in its draft phase would otherwise
        share the GPU with its draft steps up to the target's first gate (the draft phase of the lifted 8B's
        (6, 8) tree round is one drafter forward a depth, each a few small kernels). None: no gates."""
        self.hold, self._gate_each_forward = flag, flag is not None

    def _gate(self, layer: int) -> None:
        # Evenly spaced from layer 0: the round's draft work ends at the first one.
        if layer % -(-self.model.num_layers // GATES) == 0:
            wait_while_held(self.hold)

    def _round_forward(self, tokens, positions, slots, seq_len, anc, kv_len, **extra) -> torch.Tensor:
        if self.rider is not None:
            return self._ride(tokens, positions, slots, seq_len, anc, kv_len, **extra)
        if self._gate_each_forward:  # a drafter's step (``share_gates``)
            wait_while_held(self.hold)
        elif self.hold is not None:  # only where ``enable_gates`` made it
            extra["gate"] = self._gate
        if self.round_fused:
            return self.model(
                tokens, positions, slots, None, self.kv.layers, None, self._layer_fn, seq_len, anc, **extra
            )
        B, Nq = tokens.shape
        W = anc.shape[-1]
        # Compiled blocks see the whole cache: a mask narrowed to the live length would change shape, and
        # so recompile, every 64 tokens.
        if kv_len is None or self._layer_fn is not None:
            kv_len = self.kv.max_seq
        kv_len = min(self.kv.max_seq, _round_up(kv_len, 64))
        mask = window_mask(seq_len, anc.expand(B, Nq, W), kv_len, self.group)
        return self.model(tokens, positions, slots, mask, self.kv.layers, None, self._layer_fn, **extra)

    def _ride(self, tokens, positions, slots, seq_len, anc, kv_len, feature_layers=None) -> torch.Tensor:
        # The round's group attends as ``_round_forward`` would (fused kernel or dense window mask); the
        # rider's group brings its own dense prefill mask. Eager: a rider's shape is the prompt's.
        rider, self.rider = self.rider, None
        B, Nq = tokens.shape
        mask = None
        if not self.round_fused:
            W = anc.shape[-1]
            kv_len = self.kv.max_seq if kv_len is None else min(self.kv.max_seq, _round_up(kv_len, 64))
            mask = window_mask(seq_len, anc.expand(B, Nq, W), kv_len, self.group)
        own = Group(tokens, positions, slots, mask, (0, B), seq_len, anc, feature_layers=feature_layers)
        out, rider.out = mixed_forward(self.model, [own, rider.group], self.kv.layers)
        return out
