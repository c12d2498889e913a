"""The cost model S = tau / c and its ceiling, split into three factors.

``c = T_step / T_AR`` is the step's cost in AR steps (the e2e suite's ``cost_model``, reused here). The
ceiling is the speedup a step could reach if it verified the best tree in one exact pass and every kernel
ran at its floor. Relative to the current S it is a product of three factors:

    ceiling / S = (tau_best / tau)                      better trees
                * (T_profiled / T_floor)                faster kernels (profiled time over its floors)
                * (T_step / T_profiled)                 time outside the profile (host, launch gaps)

A factor whose inputs were not measured (no floors: a CPU run) is reported as unavailable, never as 1.
"""

from __future__ import annotations

from ..suites.e2e_results import cost_model, rel_error

FACTORS = ("trees", "kernels", "outside")


def ceiling(profile: dict) -> dict:
    """The ceiling of one round kind from its step profile (``step_profile.measure``'s dict).

    ``profile`` needs ``tau``, ``tau_best``, ``step_ms``, ``ar_ms``, ``host_ms`` (time in no category) and
    ``floor_ms`` (sum of the categories' floors, None where no floors exist). Returns the current S, each
    factor (None = unavailable), the ceiling over the available factors, and the largest factor by name.
    """
    now = cost_model(profile["tau"], profile["step_ms"], profile["ar_ms"])
    profiled = profile["step_ms"] - profile["host_ms"]
    factors = {
        "trees": profile["tau_best"] / profile["tau"],
        "kernels": profiled / profile["floor_ms"] if profile.get("floor_ms") else None,
        "outside": profile["step_ms"] / profiled if profiled > 0 else None,
    }
    avail = {k: v for k, v in factors.items() if v is not None}
    bound = now["predicted_speedup"]
    for v in avail.values():
        bound *= v
    missing = [k for k, v in factors.items() if v is None]
    return {
        "speedup_now": now["predicted_speedup"],
        "c": now["c"],
        "factors": factors,
        "ceiling": bound,
        "partial": bool(missing),
        "unavailable": missing,
        "largest": max(avail, key=avail.get) if avail else None,
    }


def predicted_gain(base: dict, cand: dict) -> float:
    """Predicted ``time(base) / time(cand)`` per generated token: S(cand) / S(base), both over one AR."""
    s_base = cost_model(base["tau"], base["step_ms"], base["ar_ms"])["predicted_speedup"]
    s_cand = cost_model(cand["tau"], cand["step_ms"], cand["ar_ms"])["predicted_speedup"]
    return s_cand / s_base


def validate(pairs: list[dict]) -> dict:
    """Prediction errors: ``pairs`` of ``{"candidate", "predicted", "measured"}`` speed ratios."""
    rows = [p | {"error": rel_error(p["predicted"], p["measured"])} for p in pairs if p.get("measured")]
    errs = sorted(r["error"] for r in rows)
    return {
        "rows": rows,
        "n": len(rows),
        "error_median": errs[len(errs) // 2] if errs else None,
        "error_max": errs[-1] if errs else None,
    }
