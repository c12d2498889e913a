"""A tuning backend over tiny synthetic models with planted mechanisms of known gain.

Generations, token forcing and profiles run the real tiny engines; only the timing is injected: each timed
call advances a ``SimulatedClock`` by a planted cost per option delta, so a gain is known exactly.
"""

from __future__ import annotations

from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.controller.tune_backend import EngineBackend
from sglang_specpilot.harness.synthetic import SimulatedClock

BASE_S = 0.010
# num_speculative_tokens -> time factor: 8 is a real mechanism (+33%), 2 a gain too small to promote (+0.5%),
# 6 a shortcut that is faster but changes the output (planted in ``generate``); the rest are slower.
PLANTED = {4: 1.0, 8: 0.75, 2: 0.995, 6: 0.6}
SHORTCUT_GAMMA = 6


class PlantedBackend(EngineBackend):
    def __init__(self, seed: int = 0, fail_after: int | None = None, replica_factor: float = 1.0):
        target = tiny_model("tiny-llama", seed=0)
        draft = tiny_model("tiny-llama", seed=1, num_layers=1)
        stock = EngineOptions(
            draft="tiny-draft", device="cpu", dtype="float32", max_seq_len=256, max_batch_size=1, cuda_graphs=False
        )
        super().__init__(stock, new_tokens=12, models=(target, draft, WordTokenizer()))
        self.clock = SimulatedClock(seed, jitter_sigma=0.003, outlier_rate=0.0, drift_per_s=0.0, wobble=0.0)
        self.fail_after, self.calls = fail_after, 0
        # A second build of a configuration runs this much slower (instance-to-instance variance).
        self.replica_factor = replica_factor
        self.vocab = target.cfg.vocab_size

    def _opts(self, delta):
        from sglang_specpilot.controller.option_space import apply

        return apply(self.stock, delta)

    def cost(self, delta) -> float:
        o = self._opts(delta)
        if not o.speculative:
            return BASE_S * 2.0  # AR
        return BASE_S * (1.1 if o.tree else PLANTED.get(o.num_speculative_tokens, 1.1))

    def runner(self, delta, prompts_):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt("planted kill")
        return self.clock.work(self.cost(delta))

    def replica_runner(self, delta, prompts_):
        return self.clock.work(self.cost(delta) * self.replica_factor)

    def generate(self, delta, prompts_):
        out = super().generate(delta, prompts_)
        if self._opts(delta).num_speculative_tokens == SHORTCUT_GAMMA:
            # The shortcut: every third token replaced by another one (what a wrong kernel would write).
            out = [(p, [(t + 1) % self.vocab if i % 3 == 2 else t for i, t in enumerate(g)]) for p, g in out]
        return out


def tune_prompts(n: int = 3, seed: int = 0):
    return prompts([6, 9, 7, 8, 5][:n], 512, seed=seed)
