"""``specpilot tune``: the SpecPilot loop over engine options.

Each round: profile the current best and compute its ceiling; order the legal edits by the largest factor;
the LLM proposer (optional) and the built-in successive halving pick candidates; each finalist is timed
against the current best in paired ABBA blocks and must pass the promotion gate (95% lower bound of the
gain > 1% + 2 x stock-vs-stock noise) and token forcing (mismatch <= stock + 0.5 points at 95%, no more
large-margin mismatches than stock); small gains that pass forcing are stacked and the stack is timed under
the same rule. After the rounds a sealed final times the promoted system against stock (and AR) on prompts
no proposer saw; the profile applies the tuned options only if the sealed final confirms them.

Everything measured goes to ``DIR/state.json`` as it is measured (``tune_state``), so a killed run resumes.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from ..harness.token_forcing import ForcingReport, Mismatch, compare_forcing
from . import judge
from .costmodel import ceiling, predicted_gain, validate
from .halving import largest_workable, order_edits, rungs, successive_halving
from .option_space import Edit, applied, delta_key, legal_edits
from .tune_state import TuneState


@dataclass
class TuneConfig:
    rounds: int = 3
    candidates: int = 8  # per round, after the largest-factor ordering
    blocks: int = 20  # the gate's full-length paired run (the interval's coverage needs 20+)
    screen_blocks: int = 6
    min_gain: float = 0.01
    budget_s: float | None = None
    kinds: tuple[str, ...] | None = None  # edit kinds to search (gamma, tree, w12, ...); None = all
    use_cost_model: bool = True  # False: the ablation (largest factor replaced by "the most visible gap")
    progress: bool = False
    extra: dict = field(default_factory=dict)  # describes the deployment (model, prompts...), checked on resume


def _report(d: dict) -> ForcingReport:
    d = dict(d)
    d["details"] = [Mismatch(**m) for m in d.get("details", [])]
    return ForcingReport(**d)


class _Bars:
    def __init__(self, on: bool, rounds: int):
        from tqdm.auto import tqdm

        self.on = on
        self.rounds = tqdm(total=rounds, desc="rounds", position=0, disable=not on)
        self.cands = tqdm(total=0, desc="candidates", position=1, disable=not on, leave=False)
        self.blocks = tqdm(total=0, desc="timing calls", position=2, disable=not on, leave=False)

    def close(self):
        for b in (self.blocks, self.cands, self.rounds):
            b.close()


class Tuner:
    def __init__(self, backend, tune_prompts, final_prompts, out, config: TuneConfig, llm=None, seeds=()):
        """``seeds``: (name, delta over stock) from the memory (``tune_memory.seeds``), first-round candidates."""
        self.b, self.cfg, self.llm = backend, config, llm
        self.seeds = [Edit(f"memory:{n}", tuple(sorted(d.items())), "memory") for n, d in seeds]
        self.tp, self.fp = tune_prompts, final_prompts
        cfg = asdict(config) | {"progress": None, "budget_s": None, "llm": getattr(llm, "name", None)}
        cfg["seeds"] = [[e.id, e.changes] for e in self.seeds]
        self.state = TuneState(out, cfg)
        self.t_start = time.perf_counter()
        self.bars = _Bars(config.progress, config.rounds)
        self._llm_rounds: list[dict] = []  # the LLM's answers so far, whose feedback codes it is shown
        self.timed = 0  # measurements taken in this process (not from the state file)

    # ---- cached measurements ------------------------------------------------------------------------
    def _cached(self, key: str, fn):
        rec = self.state.get(key)
        if rec is None:
            rec = fn()
            self.timed += 1
            self.state.put(key, rec)
        return rec

    def _over_budget(self) -> bool:
        if self.cfg.budget_s is None:
            return False
        return self.state.data["elapsed_s"] + time.perf_counter() - self.t_start > self.cfg.budget_s

    def stock_forcing(self, which: str) -> dict:
        prompts = self.tp if which == "tune" else self.fp
        return self._cached(f"forcing|stock|{which}", lambda: judge.forcing(self.b, {}, prompts).to_dict())

    def profile(self, delta: dict) -> dict:
        return self._cached(f"profile|{delta_key(delta)}", lambda: self.b.profile(delta, self.tp))

    def timing(self, base: dict, cand: dict, blocks: int, prompts, tag: str) -> dict:
        key = f"time|{tag}|{delta_key(base)}|{delta_key(cand)}|{blocks}"
        return self._cached(
            key,
            lambda: judge.timing_record(
                judge.time_variants(self.b, {"base": base, "cand": cand}, prompts, blocks, self.bars.blocks),
                "base",
                "cand",
            ),
        )

    def forcing(self, delta: dict, which: str = "tune") -> dict:
        prompts = self.tp if which == "tune" else self.fp
        stock = _report(self.stock_forcing(which))

        def run():
            rep = judge.forcing(self.b, delta, prompts)
            return {"report": rep.to_dict(), "verdict": compare_forcing(rep, stock).to_dict()}

        return self._cached(f"forcing|{which}|{delta_key(delta)}", run)

    # ---- one candidate at full length ---------------------------------------------------------------
    def judge_full(self, base: dict, cand: dict, noise: float, tag: str) -> dict:
        t = self.timing(base, cand, self.cfg.blocks, self.tp, tag)
        f = self.forcing(cand)
        verdict = judge.gate(t, noise, f["verdict"], self.cfg.min_gain)
        pred = predicted_gain(self.profile(base), self.profile(cand))
        return {"timing": t, "forcing": f["verdict"], "predicted": pred, **verdict}

    # ---- the loop -----------------------------------------------------------------------------------
    def run(self) -> dict:
        try:
            return self._run()
        finally:
            self.state.add_elapsed(time.perf_counter() - self.t_start)
            self.t_start = time.perf_counter()
            self.bars.close()

    def _run(self) -> dict:
        stock: dict = {}
        noise = self._cached(
            "noise", lambda: {"noise": judge.measure_noise(self.b, stock, self.tp, self.cfg.blocks, self.bars.blocks)}
        )["noise"]
        self.stock_forcing("tune")
        best, rounds, history, tried = stock, [], [], set()
        for r in range(self.cfg.rounds):
            if self._over_budget():
                rounds.append({"round": r, "stopped": "budget"})
                break
            rnd = self._round(r, best, noise, history, tried)
            rounds.append(rnd)
            self.bars.rounds.update(1)
            if rnd["promoted"] is None and not rnd.get("memory_only"):
                break  # converged: nothing passed, the next round would start from the same best
            best = rnd["best_after"]
        final = self._sealed_final(best, noise)
        pairs = [
            {"candidate": h["id"], "predicted": h["predicted"], "measured": 1 + h["timing"]["gain"]} for h in history
        ]
        return {
            "stock_noise": noise,
            "rounds": rounds,
            "history": history,
            "best": best,
            "final": final,
            "validation": validate(pairs),
            "measured_now": self.timed,
            "resumed_measurements": self.state.resumed,
        }

    def _round(self, r: int, best: dict, noise: float, history: list, tried: set) -> dict:
        prof = self.profile(best)
        ceil = ceiling(prof)
        edits = legal_edits(self.b.stock, best)
        edits = [e for e in edits if self.b.admits(applied(self.b.stock, best, e))]  # what these models can run
        if self.cfg.kinds:
            edits = [e for e in edits if e.id.split("=")[0] in self.cfg.kinds]
        base_key = delta_key(best)
        tried_here = {h["id"] for h in history if h["base"] == base_key}
        if self.cfg.use_cost_model:
            # The largest factor this round's edits can work on (the ceiling's own largest is reported too).
            largest = largest_workable(ceil["factors"], edits, tried_here)
        else:
            largest = "trees"  # the ablation: the most visible gap (tokens per step), whatever the ceiling says
        # Memory first: a deployment with applicable entries times only them in round 0 (a promoted entry
        # skips the search that found it); the searched rounds follow from whatever won.
        memory_only = r == 0 and bool(self.seeds)
        chosen, llm_info = (list(self.seeds) if r == 0 else []), None
        if self.llm is not None:
            past = [f for rnd in self._llm_rounds for f in rnd["feedback"]]
            ctx = {"round": r, "profile": prof, "ceiling": ceil, "history": history, "best": best, "llm_feedback": past}
            llm_info = self._cached(f"llm|{r}|{base_key}", lambda: self.llm.propose(ctx, edits, self.cfg.candidates))
            self._llm_rounds.append(llm_info)
            by_id = {e.id: e for e in edits}
            chosen = [by_id[i] for i in llm_info["accepted"] if i in by_id and i not in tried_here]
        for e in [] if memory_only else order_edits(edits, largest, self.cfg.candidates, tried_here):
            if len(chosen) >= self.cfg.candidates:
                break
            if e not in chosen:
                chosen.append(e)
        self.bars.cands.reset(total=len(chosen))
        deltas = {e.id: applied(self.b.stock, best, e) for e in chosen}

        def measure(e, blocks):
            rec = self.timing(best, deltas[e.id], blocks, self.tp, f"r{r}")
            if blocks == self.cfg.blocks:
                self.bars.cands.update(1)
            return rec

        finals = successive_halving(chosen, measure, rungs(self.cfg.blocks, self.cfg.screen_blocks, len(chosen)))
        judged = []
        for e, _ in finals:
            v = self.judge_full(best, deltas[e.id], noise, f"r{r}")
            rec = {"round": r, "id": e.id, "factor": e.factor, "base": base_key, "delta": deltas[e.id], **v}
            judged.append(rec)
            history.append(rec)
        for e in chosen:
            tried.add(e.id)
        screened = [
            {"id": e.id, "factor": e.factor, "gain": self.timing(best, deltas[e.id], b0, self.tp, f"r{r}")["gain"]}
            for e, b0 in ((e, rungs(self.cfg.blocks, self.cfg.screen_blocks, len(chosen))[0]) for e in chosen)
        ]
        passing = [j for j in judged if j["promoted"]]
        promoted = max(passing, key=lambda j: j["promotion"]["gain_low"]) if passing else None
        new_best = promoted["delta"] if promoted else best
        stack = self._stack(r, best, new_best, promoted, judged, noise, history)
        if stack is not None and stack["promoted"]:
            new_best, promoted = stack["delta"], stack
        return {
            "round": r,
            "memory_only": memory_only,
            "profile": prof,
            "ceiling": ceil,
            "largest": largest,
            "ceiling_largest": ceil["largest"],
            "legal_edits": len(edits),
            "llm": llm_info,
            "screened": screened,
            "judged": [j["id"] for j in judged],
            "promoted": None if promoted is None else promoted["id"],
            "stack": None if stack is None else {k: stack[k] for k in ("id", "promoted", "feedback")},
            "best_after": new_best,
        }

    def _stack(self, r, base, new_best, promoted, judged, noise, history):
        """Small gains (positive, forcing accepted, not promoted) with disjoint options, stacked on the new
        best and timed under the same rule; None when fewer than two (or one over a promotion) are left."""
        used = set(promoted["delta"]) - set(base) if promoted else set()
        parts = []
        for j in sorted(judged, key=lambda j: -j["timing"]["gain"]):
            if j is promoted or j["timing"]["gain"] <= 0 or not j["forcing"]["accepted"]:
                continue
            keys = {k for k in j["delta"] if j["delta"].get(k) != base.get(k)}
            if keys & used:
                continue
            used |= keys
            parts.append(j)
        if len(parts) + (promoted is not None) < 2:
            return None
        delta = dict(new_best)
        for j in parts:
            delta |= {k: v for k, v in j["delta"].items() if v != base.get(k)}
        delta = applied(self.b.stock, delta, _NoEdit)
        sid = "stack(" + "+".join(([promoted["id"]] if promoted else []) + [j["id"] for j in parts]) + ")"
        v = self.judge_full(new_best, delta, noise, f"r{r}-stack")
        rec = {"round": r, "id": sid, "factor": "stack", "base": delta_key(new_best), "delta": delta, **v}
        history.append(rec)
        return rec

    def _sealed_final(self, best: dict, noise: float) -> dict:
        if not best:
            return {"ran": False, "confirmed": False, "reason": "nothing was promoted: the profile is stock"}
        ar = self.b.ar_delta()

        def run():
            times = judge.time_variants(
                self.b, {"stock": {}, "tuned": best, "ar": ar}, self.fp, self.cfg.blocks, self.bars.blocks
            )
            rec = judge.timing_record(times, "stock", "tuned")
            rec["vs_ar"] = judge.timing_record(times, "ar", "tuned")
            rec["stock_vs_ar"] = judge.timing_record(times, "ar", "stock")
            rec["ms"] = {n: times.median(n) * 1e3 for n in ("stock", "tuned", "ar")}
            return rec

        t = self._cached(f"final|{delta_key(best)}|{self.cfg.blocks}", run)
        self.stock_forcing("final")
        f = self.forcing(best, "final")
        verdict = judge.gate(t, noise, f["verdict"], self.cfg.min_gain)
        return {"ran": True, "confirmed": verdict["promoted"], "timing": t, **verdict}


class _NoEdit:
    changes: dict = {}
