"""The cost model's ceiling and its validation (arithmetic, no engine)."""

from __future__ import annotations

import pytest

from sglang_specpilot.controller.costmodel import ceiling, predicted_gain, validate


def _prof(**kw):
    return {"tau": 3.0, "tau_best": 4.5, "step_ms": 10.0, "ar_ms": 5.0, "host_ms": 2.0, "floor_ms": 4.0} | kw


def test_ceiling_is_the_product_of_three_factors_and_names_the_largest():
    c = ceiling(_prof())
    assert c["speedup_now"] == pytest.approx(1.5)
    assert c["factors"] == {"trees": 1.5, "kernels": 2.0, "outside": 1.25}
    assert c["ceiling"] == pytest.approx(1.5 * 1.5 * 2.0 * 1.25)
    # The ceiling is tau_best over the floor's cost in AR steps: 4.5 / (4 / 5).
    assert c["ceiling"] == pytest.approx(4.5 / (4.0 / 5.0))
    assert c["largest"] == "kernels" and not c["partial"]


def test_without_floors_the_kernel_factor_is_unavailable_not_one():
    c = ceiling(_prof(floor_ms=None))
    assert c["factors"]["kernels"] is None and c["unavailable"] == ["kernels"] and c["partial"]
    assert c["largest"] == "trees"


def test_prediction_and_validation():
    assert predicted_gain(_prof(), _prof(tau=3.3, step_ms=10.0)) == pytest.approx(1.1)
    v = validate(
        [{"candidate": "a", "predicted": 1.1, "measured": 1.0}, {"candidate": "b", "predicted": 1.0, "measured": 1.0}]
    )
    assert v["n"] == 2 and v["error_max"] == pytest.approx(0.1)


def test_the_round_works_on_the_largest_factor_it_has_edits_for():
    from sglang_specpilot.controller.halving import largest_workable, order_edits
    from sglang_specpilot.controller.option_space import FALLBACK, Edit

    def e(i, f):
        return Edit(i, (), f)

    edits = [e("compile=off", FALLBACK), e("gamma=2", "trees"), e("tree=32/4/8", "trees"), e("ladder=1", "outside")]
    factors = {"trees": 1.3, "kernels": 1.6, "outside": 1.1}
    # Kernels have the most headroom, but switching compile off cannot close it: the trees factor is worked on.
    assert largest_workable(factors, edits, set()) == "trees"
    assert largest_workable(factors, edits + [e("w12=on", "kernels")], set()) == "kernels"
    assert largest_workable(factors, edits, {"gamma=2", "tree=32/4/8"}) == "outside"
    assert largest_workable({"trees": None, "kernels": None, "outside": None}, edits, set()) is None
    # Fallbacks come after every other factor's edits.
    assert [x.id for x in order_edits(edits, "kernels", 10, set())][-1] == "compile=off"
