"""What the tuning loop runs candidates on: engines of one deployment sharing its loaded weights.

``EngineBackend`` builds one ``Engine`` per option delta over the same target and drafter (W12 deltas load a
W12 copy once), warms it up (CUDA: compile and capture), and offers the loop four things: a timing callable
(one greedy generation of the next prompt per call), generations for token forcing, the stock target's
teacher-forced logits, and a step profile. Tests replace the timing callable and the clock (``runner`` and
``clock``) to plant mechanisms of known gain; everything else runs the real engines.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import replace

from ..config import EngineOptions
from . import step_profile
from .option_space import TREE_KEYS, apply, delta_key

KEEP_ENGINES = 4  # engines kept built (stock, best, the candidate, AR); older ones are rebuilt on demand


def _alloc_counts(device) -> dict | None:
    """The CUDA caching allocator's device allocations and retries so far (None off CUDA)."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return None
    st = torch.cuda.memory_stats(device)
    return {"device_allocs": st.get("num_device_alloc", 0), "alloc_retries": st.get("num_alloc_retries", 0)}


class EngineBackend:
    def __init__(self, stock: EngineOptions, new_tokens: int = 32, models=None, log=None):
        """``stock``: the deployment's stock options (model, drafter, device; every tuned option at its
        default). ``models``: (target, draft, tokenizer) already loaded, else loaded from ``stock``."""
        self.new_tokens = new_tokens
        self.clock = time.perf_counter
        self.log = log or (lambda m: None)
        if models is None:
            from ..engine.loading import load_engine_models

            # Loaded with the widest tree's scratch, so every candidate's positions fit the same weights.
            wide = replace(stock, tree_budget=64, tree_depth=8, tree_top_k=8)
            target, draft, tok, wide = load_engine_models(wide)
            stock = replace(wide, **{k: getattr(stock, k) for k in TREE_KEYS})
            models = (target, draft, tok)
        self.stock = stock
        self._models = {("bf16", "bf16"): models}
        self._engines: OrderedDict[str, object] = OrderedDict()
        self._replicas: dict[str, object] = {}  # second builds (``replica_runner``), kept apart from the LRU
        # Per timed generation, by engine (delta key; "replica:" + key for second builds): prompt, rounds,
        # time to first token and total ms. Why: on the H100 (tune_h100.json) one configuration of the real
        # SmolLM2 timed 1.5-2x apart between builds and parts, and a time alone cannot tell more rounds
        # (lower acceptance) from slower rounds or a slower prefill.
        self.gen_log: dict[str, list[dict]] = {}
        self._tau_best: dict = {}

    def admits(self, delta: dict) -> bool:
        """Whether this deployment's models can run ``delta`` (a tree's top-k must fit the drafter's vocabulary,
        which ``EngineOptions`` cannot see)."""
        from ..engine.engine import drafting_vocab

        target, draft, _ = self._models[("bf16", "bf16")]
        k = delta.get("tree_top_k")
        return k is None or k <= drafting_vocab(target, draft)

    def _models_for(self, opts: EngineOptions):
        key = (opts.weights, opts.draft_weights)
        if key not in self._models:
            from ..models.w12_weights import to_w12

            target, draft, tok = self._models[("bf16", "bf16")]
            t = to_w12(target) if opts.weights == "w12" else target
            d = to_w12(draft) if draft is not None and opts.draft_weights == "w12" else draft
            self._models[key] = (t, d, tok)
        return self._models[key]

    def _build(self, delta: dict):
        from ..engine import Engine

        opts = apply(self.stock, delta)
        target, draft, tok = self._models_for(opts)
        eng = Engine(target, tok, opts, draft if opts.draft is not None else None)
        eng.warmup(progress=False)
        return eng

    def engine(self, delta: dict):
        key = delta_key(delta)
        if key in self._engines:
            self._engines.move_to_end(key)
            return self._engines[key]
        eng = self._build(delta)
        self._engines[key] = eng
        while len(self._engines) > KEEP_ENGINES:
            self._engines.popitem(last=False)
        return eng

    def replica_engine(self, delta: dict):
        """A second engine of ``delta``, built apart from ``engine(delta)``'s (the stock-vs-stock noise)."""
        key = delta_key(delta)
        if key not in self._replicas:
            self._replicas[key] = self._build(delta)
        return self._replicas[key]

    def _params(self):
        from ..engine import SamplingParams

        return SamplingParams(max_new_tokens=self.new_tokens, ignore_eos=True)

    def runner(self, delta: dict, prompts):
        return self._runner(self.engine(delta), prompts, delta_key(delta))

    def _runner(self, eng, prompts, key: str):
        params, i = self._params(), [0]
        log = self.gen_log.setdefault(key, [])

        def run():
            k = i[0] % len(prompts)
            mem0 = _alloc_counts(eng.device)
            t0, first, res = time.perf_counter(), None, None
            for ev in eng.stream([prompts[k]], params):
                if first is None and ev.token_ids:
                    first = time.perf_counter() - t0
                res = ev.result or res
            ms = (time.perf_counter() - t0) * 1e3
            if res.error is not None:  # a failed generation is never a timing (``generate`` would raise too)
                raise RuntimeError(f"a timed generation failed: {res.error}")
            row = {"prompt": k, "rounds": res.rounds, "tokens": len(res.token_ids),
                   "ttft_ms": round((first or 0.0) * 1e3, 3), "ms": round(ms, 3)}  # fmt: skip
            if mem0 is not None:  # cudaMalloc calls and allocator retries (a full pool syncs the device)
                row |= {name: n - mem0[name] for name, n in _alloc_counts(eng.device).items()}
            log.append(row)
            i[0] += 1

        return run

    def gen_summary(self) -> dict:
        """Per engine: generations timed, median rounds, ms per round past the first token, TTFT (medians)."""
        from statistics import median

        out = {}
        for key, rows in self.gen_log.items():
            if rows:
                per_round = [(r["ms"] - r["ttft_ms"]) / max(r["rounds"], 1) for r in rows]
                out[key] = {"n": len(rows), "rounds": median(r["rounds"] for r in rows),
                            "ms_per_round": round(median(per_round), 4),
                            "ttft_ms": round(median(r["ttft_ms"] for r in rows), 3),
                            "ms": round(median(r["ms"] for r in rows), 3),
                            "device_allocs": sum(r.get("device_allocs", 0) for r in rows),
                            "alloc_retries": sum(r.get("alloc_retries", 0) for r in rows)}  # fmt: skip
        return out

    def replica_runner(self, delta: dict, prompts):
        """``runner`` over ``replica_engine(delta)``."""
        return self._runner(self.replica_engine(delta), prompts, "replica:" + delta_key(delta))

    def generate(self, delta: dict, prompts) -> list[tuple[list[int], list[int]]]:
        eng, params = self.engine(delta), self._params()
        return [(list(p), eng.generate([p], params)[0].token_ids) for p in prompts]

    def score_fn(self, prompt_ids, generated_ids):
        return self.engine({}).teacher_force_logits(prompt_ids, generated_ids)

    def ar_delta(self) -> dict:
        return {"draft": None, "draft_layers": 0, "ngram_size": 0, **dict.fromkeys(TREE_KEYS)}

    def tau_best(self, prompts) -> float | None:
        """The best replayed tau (``tau_replay``: trees of every budget over the drafter's lattice); None
        without a draft model (prompt lookup has no lattice to replay)."""
        _, draft, _ = self._models[("bf16", "bf16")]
        if draft is None or self.stock.draft is None:
            return None
        if "v" not in self._tau_best:
            from ..engine.engine import drafting_vocab
            from ..harness.tau_replay import tau_report

            ar = self.engine(self.ar_delta())
            top_k = min(8, drafting_vocab(ar.target, draft))
            rep = tau_report(ar, draft, prompts, self.new_tokens, depth=6, top_k=top_k, budgets=(8, 16, 32, 64))
            trees = [v for k, v in rep.items() if k.startswith("tau_tree")]
            # No replayed round (every generation ended at once): no tree headroom is known.
            self._tau_best["v"] = max(trees) if trees else None
            self._tau_best["report"] = rep
        return self._tau_best["v"]

    def profile(self, delta: dict, prompts) -> dict:
        if "ar" not in self._tau_best:  # the AR step is every profile's unit; measured once
            ar_eng = self.engine(self.ar_delta())
            self._tau_best["ar"] = step_profile.measure(ar_eng, prompts[0], self.new_tokens, ar_ms=None, tau_best=None)
        ar = self._tau_best["ar"]
        out = step_profile.measure(
            self.engine(delta), prompts[0], self.new_tokens, ar_ms=ar["step_ms"], tau_best=self.tau_best(prompts[:4])
        )
        out["tau_replay"] = self._tau_best.get("report")
        out["ar_profile"] = ar
        return out

    def describe(self) -> dict:
        import torch

        o = self.stock
        gpu = torch.cuda.get_device_name(0) if o.device.startswith("cuda") else "cpu"
        return {"model": o.model, "draft": o.draft, "device": o.device, "dtype": o.dtype, "gpu": gpu}
