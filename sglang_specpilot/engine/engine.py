"""The engine: prefill, then AR steps or chain speculative rounds until every request stops.

Batching: requests of different prompt lengths share one static KV cache, one row each, right-padded;
nothing is packed. Each row keeps its own length (``seq_len``), rope positions and mask, so padding is
never attended to. Finished rows stay in the batch but stop advancing until the batch ends.

A speculative round (gamma draft tokens), per request, with ``seq_len`` tokens in the target cache and
``next_tok`` the last emitted token (not yet in any cache):

    draft   [tok[seq_len-1], next_tok] at positions seq_len-1, seq_len -> d_1; then d_i -> d_{i+1}
    verify  [next_tok, d_1 .. d_gamma] at seq_len .. seq_len+gamma, causal       -> gamma+1 logits
    accept  n leading draft tokens + a bonus (spec.py); seq_len += n + 1; next_tok = bonus

Feeding tok[seq_len-1] again re-writes a draft K/V entry the draft may already hold, so the draft never
needs a catch-up step after a fully accepted round, and every draft step has a fixed shape.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..config import EngineOptions, tree_expansions
from ..models.llama import Transformer
from .attn_meta import causal_tree
from .ngram import ngram_draft
from .request import GenerationResult, Request, RequestError, StreamEvent
from .runner import ModelRunner
from .sampling import BatchSampling, SamplingParams, next_tokens, probs_from_logits, sample_from_probs
from .spec import chain_accept_greedy, chain_accept_sampling
from .tree_round import TreeRounds


def tree_reach(options: EngineOptions) -> int:
    """Slots past a row's length that one tree round writes: the verify block or the draft's expansions."""
    return max(options.tree_budget, tree_expansions(options.tree_depth, options.tree_top_k)) + 1


def scratch_slots(options: EngineOptions) -> int:
    """Cache slots past max_seq_len per row: the widest step (prefill chunk or verify block)."""
    if options.tree:
        # One lagged round (CUDA lookahead) may start a finished row up to depth + 1 slots further.
        return max(64, options.prefill_chunk, tree_reach(options) + options.tree_depth + 1)
    return max(64, options.prefill_chunk, options.num_speculative_tokens + 1)


class Engine:
    def __init__(self, target: Transformer, tokenizer, options: EngineOptions, draft: Transformer | None = None):
        options = options.resolved(target.cfg.max_position_embeddings)
        self.options = options
        self.tokenizer = tokenizer
        self.target = target
        self.draft = draft
        self.device = target.embed.weight.device
        if options.max_seq_len > target.cfg.max_position_embeddings:
            raise ValueError(
                f"max_seq_len {options.max_seq_len} exceeds the model's context "
                f"({target.cfg.max_position_embeddings} positions)"
            )
        need_pos = options.max_seq_len + scratch_slots(options)
        for m in (target, draft):
            if m is not None and m.rope.shape[0] < need_pos:
                raise ValueError(f"model was built for {m.rope.shape[0]} positions; the engine needs {need_pos} "
                                 "(build_model(max_positions=...) >= max_seq_len + scratch)")
        if draft is not None and draft.cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(f"draft vocab {draft.cfg.vocab_size} != target vocab {target.cfg.vocab_size}")
        self.ngram = options.ngram_size if draft is None else 0
        self.gamma = options.num_speculative_tokens if draft is not None or self.ngram else 0
        # Tree rounds emit at most tree_depth + 1 tokens, so gamma (the round's token bound) is the depth.
        self.tree = None
        self._reach = self.gamma
        if options.tree and self.gamma:
            if options.tree_top_k > target.cfg.vocab_size:
                raise ValueError(f"tree_top_k {options.tree_top_k} exceeds the vocabulary ({target.cfg.vocab_size})")
            self.gamma = options.tree_depth
            self._reach = tree_reach(options) - 1
        kw = dict(
            cuda_graphs=options.cuda_graphs,
            graph_batch_sizes=options.graph_batch_sizes,
            scratch_slots=scratch_slots(options),
            compile=options.compile,
        )
        self.target_runner = ModelRunner(target, options.max_batch_size, options.max_seq_len, **kw)
        self.draft_runner = ModelRunner(draft, options.max_batch_size, options.max_seq_len, **kw) if draft else None
        eos = set(target.cfg.eos_token_ids) | set(getattr(tokenizer, "eos_token_ids", []) or [])
        self.eos = frozenset(eos)
        dev = self.device
        self._chain = {n: causal_tree(n, dev) for n in {1, 2, self.gamma + 1}}
        if options.tree and self.gamma:
            self.tree = TreeRounds(self.target_runner, self.draft_runner, self.ngram, options.tree_depth,
                                   options.tree_top_k, options.tree_budget)

    @classmethod
    def from_options(cls, options: EngineOptions | None = None) -> Engine:
        from .loading import load_engine_models

        options = options or EngineOptions()
        target, draft, tokenizer, options = load_engine_models(options)
        return cls(target, tokenizer, options, draft)

    def warmup(self) -> None:
        """Capture every CUDA graph the engine can use (no-op on CPU)."""
        if not self.gamma:
            self.target_runner.capture((1,))
        else:
            self.target_runner.capture((self.gamma + 1,))
        if self.draft_runner is not None:
            self.draft_runner.capture((1, 2))

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
        need = len(prompt) + params.max_new_tokens + self._reach + 1
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
    ) -> list[GenerationResult]:
        """Generate for a batch of prompts (text or token ids); returns one result per prompt."""
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int))
        batch = [prompts] if single else list(prompts)
        results: dict[int, GenerationResult] = {}
        for ev in self.stream(batch, params, chat=chat):
            if ev.result is not None:
                results[ev.index] = ev.result
        return [results[i] for i in range(len(batch))]

    def stream(
        self,
        prompts: list[str | list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        chat: bool = False,
    ) -> Iterator[StreamEvent]:
        """Yield ``StreamEvent``s as tokens are produced; each request's last event carries its result."""
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

    @torch.inference_mode()
    def _run(self, reqs: list[Request]) -> Iterator[StreamEvent]:
        dev, B = self.device, len(reqs)
        bs = BatchSampling.from_params([r.params for r in reqs], dev)
        width = self.options.max_seq_len + self.target_runner.scratch
        history = torch.zeros(B, width, dtype=torch.long, device=dev)
        lens = [len(r.prompt) for r in reqs]
        for i, r in enumerate(reqs):
            history[i, : lens[i]] = torch.tensor(r.prompt, device=dev)
        last = self._prefill(self.target_runner, history, lens)
        if self.draft_runner is not None:
            self._prefill(self.draft_runner, history, lens, want_logits=False)
        next_tok = next_tokens(last, bs)
        seq_len = torch.tensor(lens, device=dev)
        decode = self.tokenizer.decode
        for r, t in zip(reqs, next_tok.tolist(), strict=False):
            ev = r.add([t], decode, count_round=False)
            if ev:
                yield ev
        host_len = list(lens)
        # On CUDA the host runs one round behind: round t+1 is launched before round t's tokens are read
        # back, so the GPU never waits for the host's bookkeeping. A row that finished in round t runs
        # one extra round; its writes land past its length (the scratch slots absorb them) and are
        # never emitted. ``lag`` widens the eager attention window by the round the host has not seen.
        lag = (self.gamma + 1) if dev.type == "cuda" else 0
        active, n_finished, inflight = None, -1, None
        # Two pinned host buffers, used in turn: pinned allocation per round costs more than a round.
        pinned = [torch.empty((B, self.gamma + 2), dtype=torch.long, pin_memory=True) for _ in range(2)] if lag else []
        rounds = 0
        while inflight is not None or not all(r.finished for r in reqs):
            launched = None
            if not all(r.finished for r in reqs):
                if n_finished != sum(r.finished for r in reqs):  # rebuild the row mask only when it changes
                    n_finished = sum(r.finished for r in reqs)
                    active = torch.tensor([not r.finished for r in reqs], device=dev)
                hint = max(host_len) + lag
                if not self.gamma:
                    new, n_acc = self._ar_step(history, seq_len, next_tok, bs, hint)
                    next_tok = new[:, -1]
                else:
                    new, n_acc = self._spec_round(history, seq_len, next_tok, bs, hint)
                    next_tok = new.gather(1, n_acc[:, None]).squeeze(1)
                seq_len += (n_acc + 1) * active
                launched = self._to_host(torch.cat([new, n_acc[:, None]], 1), pinned[rounds % 2] if lag else None)
                rounds += 1
                if not lag:  # CPU: no lookahead, read this round back at once
                    inflight, launched = launched, None
            if inflight is not None:
                rows = self._from_host(inflight)  # the one host sync of a round
                for r, row in zip(reqs, rows, strict=True):
                    if not r.finished:
                        n = row[-1]
                        host_len[r.index] += n + 1
                        ev = r.add(row[: n + 1], decode, count_round=True)
                        if ev:
                            yield ev
            inflight = launched

    def _to_host(self, packed: torch.Tensor, host: torch.Tensor | None):
        if packed.device.type != "cuda":
            return packed, None
        host.copy_(packed, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host, done

    @staticmethod
    def _from_host(inflight) -> list[list[int]]:
        host, done = inflight
        if done is not None:
            done.synchronize()
        return host.tolist()

    def _ar_step(self, history, seq_len, next_tok, bs, max_len):
        anc, depth = self._chain[1]
        history.scatter_(1, seq_len[:, None], next_tok[:, None])
        logits = self.target_runner.step(next_tok[:, None], seq_len, anc, depth, max_len_hint=max_len)
        new = next_tokens(logits, bs)  # [B, 1]
        return new, torch.zeros_like(seq_len)

    def _spec_round(self, history, seq_len, next_tok, bs, max_len):
        """One chain round; returns (tokens [B, gamma + 1] = accepted drafts then bonus at n, n [B])."""
        if self.tree is not None:
            return self.tree.round(history, seq_len, next_tok, bs, max_len)
        draft, qs = self._draft(history, seq_len, next_tok, bs, max_len)
        return self._verify(history, seq_len, next_tok, draft, qs, bs, max_len)

    def _draft(self, history, seq_len, next_tok, bs, max_len):
        """gamma draft tokens [B, gamma] (and their proposal distributions when sampling)."""
        if self.ngram:
            draft = ngram_draft(history, seq_len, next_tok, self.ngram, self.gamma)
            if bs.all_greedy:
                return draft, None
            one_hot = torch.zeros(*draft.shape, self.target.cfg.vocab_size, device=draft.device)
            return draft, one_hot.scatter_(-1, draft[..., None], 1.0)
        g, dr = self.gamma, self.draft_runner
        prev = history.gather(1, (seq_len - 1)[:, None])
        block = torch.cat([prev, next_tok[:, None]], 1)
        logits = dr.step(block, seq_len - 1, *self._chain[2], max_len_hint=max_len)[:, -1]
        drafts, qs = [], []
        for i in range(g):
            if bs.all_greedy:
                d = logits.argmax(-1)
            else:
                q = probs_from_logits(logits, bs)
                d = sample_from_probs(q, bs.generator)
                qs.append(q)
            drafts.append(d)
            if i < g - 1:
                logits = dr.step(d[:, None], seq_len + 1 + i, *self._chain[1], max_len_hint=max_len + 1 + i)[:, 0]
        return torch.stack(drafts, 1), (torch.stack(qs, 1) if qs else None)

    def _verify(self, history, seq_len, next_tok, draft, qs, bs, max_len):
        """Target pass over [next_tok, drafts] and the acceptance rule; see ``_spec_round``."""
        g = self.gamma
        block = torch.cat([next_tok[:, None], draft], 1)
        history.scatter_(1, seq_len[:, None] + torch.arange(g + 1, device=seq_len.device), block)
        tlogits = self.target_runner.step(block, seq_len, *self._chain[g + 1], max_len_hint=max_len)
        if bs.all_greedy:
            n, bonus = chain_accept_greedy(draft, tlogits)
        else:
            n, bonus = chain_accept_sampling(draft, qs, probs_from_logits(tlogits, bs), bs.generator)
        out = torch.cat([draft, bonus[:, None]], 1)
        out.scatter_(1, n[:, None], bonus[:, None])  # row layout: d_1 .. d_n, bonus
        return out, n

    def _prefill(self, runner: ModelRunner, history: torch.Tensor, lens: list[int], want_logits: bool = True):
        """Run the prompts through ``runner`` in chunks; return each request's last-position logits [B, V].

        Rows whose prompt ended before a chunk write that chunk into the cache's scratch slots.
        """
        dev = self.device
        lens_t = torch.tensor(lens, device=dev)
        chunk = self.options.prefill_chunk
        out = None
        for start in range(0, max(lens), chunk):
            n = min(chunk, max(lens) - start)
            seq = torch.where(lens_t > start, torch.full_like(lens_t, start), self.options.max_seq_len)
            anc, depth = causal_tree(n, dev)
            rows = (lens_t - 1 - start).clamp(0, n - 1)[:, None] if want_logits else None
            logits = runner.step(history[:, start : start + n], seq, anc, depth, max_len_hint=start, logit_rows=rows)
            if want_logits:
                here = ((lens_t - 1 >= start) & (lens_t - 1 < start + n))[:, None]
                out = logits[:, 0] if out is None else torch.where(here, logits[:, 0], out)
        return out

    # ---- step-level API: continuous batching (engine/rows.py) ------------------------------------
    # Thin public wrappers over the round internals, so a scheduler can admit requests into free rows,
    # run one round for the rows in use and release rows between rounds. ``_run`` does not use them.
    def new_request(self, prompt: str | list[int], params: SamplingParams, chat: bool = False) -> Request:
        """Encode and validate one request (raises ``RequestError``); its row is assigned on admission."""
        return self._make_request(-1, self.encode(prompt, chat), params)

    @torch.inference_mode()
    def prefill_rows(self, history: torch.Tensor, lens: list[int]) -> torch.Tensor:
        """Prefill target (and draft) for the rows with ``lens[b] > 0``; returns last-position logits [B, V].

        history : [B, W] (rows 0..B-1 of the cache). Rows with ``lens[b] == 0`` write only into the cache's
        scratch slots, so rows that are mid-generation keep their KV; their logits are meaningless.
        """
        last = self._prefill(self.target_runner, history, lens)
        if self.draft_runner is not None:
            self._prefill(self.draft_runner, history, lens, want_logits=False)
        return last

    @torch.inference_mode()
    def round_step(self, history, seq_len, next_tok, bs: BatchSampling, max_len: int):
        """One AR step or speculative round over rows 0..B-1 (all tensors on the device, nothing synced).

        Returns (tokens [B, k] with row b's emitted tokens in ``tokens[b, : n[b] + 1]``, n [B], next_tok [B]).
        The caller advances ``seq_len`` by ``n + 1`` for the rows it keeps; ``max_len`` >= max(seq_len).
        """
        if not self.gamma:
            new, n_acc = self._ar_step(history, seq_len, next_tok, bs, max_len)
            return new, n_acc, new[:, -1]
        new, n_acc = self._spec_round(history, seq_len, next_tok, bs, max_len)
        return new, n_acc, new.gather(1, n_acc[:, None]).squeeze(1)

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
                )[0]
            )
        return torch.cat(rows)[L - 1 : L - 1 + T].float()
