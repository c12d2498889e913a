"""Runs one model over its static KV cache: eager on any device, CUDA-graph replays on GPU.

A step is (tokens [B, N], seq_len [B], anc [N, N], depth [N]) -> logits [B, N, V]; see attn_meta.py.
On CUDA, each (batch size, N) pair is captured once, lazily or up front by ``capture``, with the batch
padded up to the next size of the ladder. Padding rows use seq_len 0 and write to cache rows no request
owns, so they cannot disturb real requests. All graphs share one memory pool.
"""

from __future__ import annotations

import torch

from ..models.llama import Transformer, fused_attention_supported, run_block
from ..models.mixed_forward import Group, mixed_forward
from ..models.w12_weights import align_w12_escapes
from .attn_meta import build_step_meta, window_mask
from .gdn_state import RecurrentState
from .kv_cache import KVCache


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


class _Graph:
    def __init__(self, runner: ModelRunner, batch: int, n: int, pool):
        dev = runner.device
        self.tokens = torch.zeros(batch, n, dtype=torch.long, device=dev)
        self.seq_len = torch.zeros(batch, dtype=torch.long, device=dev)
        self.anc = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        self.depth = torch.arange(n, device=dev)
        # Warm up outside capture (allocator, cuBLAS handles, lazy inits). The warm-up really runs, so
        # it writes its K/V into the cache's scratch slots past max_seq, never into a request's slots.
        self.seq_len.fill_(runner.max_seq)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                runner._graph_fn(self.tokens, self.seq_len, self.anc, self.depth, runner.max_seq)
        torch.cuda.current_stream().wait_stream(stream)
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
    ):
        self.model = model
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
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            torch._dynamo.config.accumulated_cache_size_limit = max(
                torch._dynamo.config.accumulated_cache_size_limit, 512
            )
            self._layer_fn = torch.compile(run_block, fullgraph=True, dynamic=False)
            align_w12_escapes(model)  # W12 layers: one escape length per projection, one graph for all layers
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        # Rounds (engine/round.py) attend with the fused kernel wherever it runs natively.
        self.round_fused = self.fused_attention and self.device.type == "cuda"
        # A prefill group that rides in this runner's next round forward (prompt admission, see
        # engine/admission.py): one pass reads the weights for both; its result lands in ``rider.out``.
        self.rider = None

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

    def _round_forward(self, tokens, positions, slots, seq_len, anc, kv_len, **extra) -> torch.Tensor:
        if self.rider is not None:
            return self._ride(tokens, positions, slots, seq_len, anc, kv_len, **extra)
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
