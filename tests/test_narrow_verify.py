"""Narrower verify blocks under the shared node budget (``engine.round_kinds.width_for``): at a wide batch
a tree round verifies fewer nodes per row, as its own round kind, and greedy output still equals AR."""

import pytest
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.engine.round_kinds import MIN_WIDTH, kind_key, kinds_at, width_for, widths_below


def test_width_halves_until_the_batch_fits_the_budget():
    # The server's default (N 32, budget 128): N 32 up to 4 rows, 16 at 8, 8 at 16, the floor beyond.
    assert [width_for(32, 128, b) for b in (1, 2, 4, 8, 16, 32, 64)] == [32, 32, 32, 16, 8, 4, 4]
    assert width_for(32, None, 64) == 32  # no shared budget: the round's own width
    assert width_for(6, 8, 4) == MIN_WIDTH == 4 and width_for(3, 1, 8) == 3  # never below 4, nor above N
    assert widths_below(32) == [16, 8, 4] and widths_below(6) == [4] and widths_below(4) == []


def _engine(target, draft, **kw):
    opts = EngineOptions(max_seq_len=256, max_batch_size=8, device="cpu", dtype="float32", **kw)
    return Engine(target, WordTokenizer(), opts, draft)


def test_kinds_exist_only_for_shared_tree_rounds():
    target = tiny_model("tiny-llama")
    draft = target.truncated(2)
    tree = dict(tree_budget=16, tree_depth=5, tree_top_k=2)
    eng = _engine(target, draft, **tree, shared_budget=32, adaptive_depths=(3,))
    # Depth 3's lattice holds 10 candidates (K 2), so its widths are 5 and 4.
    assert set(eng.kinds) == {3, (5, 8), (5, 4), (3, 5), (3, 4)}
    assert eng.kinds[(5, 4)].shape.budget == 4 and eng.kinds[(5, 4)].shape.depth == 4  # 4 nodes reach depth 4
    assert eng.policy.depth_of((5, 4)) == 4 and eng.policy.depth_of((3, 5)) == 3
    # Which kind a depth runs at each bucket; warm-up captures the narrowed kinds only where they run.
    assert [kind_key(eng, 5, b) for b in (1, 2, 3, 4, 8)] == [None, None, (5, 8), (5, 8), (5, 4)]
    assert [kind_key(eng, 3, b) for b in (1, 2, 4, 8)] == [3, 3, (3, 5), (3, 4)]
    # None is the engine's own round; at 4 rows both depths run narrowed, so their whole kinds are not listed.
    assert kinds_at(eng, 1) == [None, 3] and set(kinds_at(eng, 4)) == {(5, 8), (3, 5)}
    assert not _engine(target, draft, **tree).kinds  # defaults: one round, as before
    chain = _engine(target, draft, num_speculative_tokens=4, adaptive_depths=(2,))
    assert set(chain.kinds) == {2}


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_greedy_with_narrowed_rounds_equals_ar(batch):
    target = tiny_model("tiny-llama")
    draft = target.truncated(2)
    lens = [5, 17, 9, 3, 12, 30, 7, 21][:batch]
    ps = prompts(lens, target.cfg.vocab_size, seed=8)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    ar = [r.token_ids for r in _engine(target, None).generate(ps, params)]
    eng = _engine(target, draft, tree_budget=16, tree_depth=4, tree_top_k=4, shared_budget=16)
    assert [r.token_ids for r in eng.generate(ps, params)] == ar
    widths = eng.policy.width_rounds
    if batch == 1:
        assert not widths  # one row fits N 16
    else:  # 3 rows (bucket 4) and 8 rows: 4 nodes each (16 / 4, the floor); 8 at 2 rows as the batch drains
        assert widths and set(widths) <= {8, 4} and widths.get(4, 0) > 0
    assert eng.batch.round_tokens > eng.batch.rounds  # the narrowed trees still accept drafts
