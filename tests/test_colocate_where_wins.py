"""Co-location only where it wins (issue 18): the server co-locates rounds only at the batch sizes where the
tuned profile measured two co-located rounds to beat one full-batch round; greedy output is exact either way."""

import json
from pathlib import Path

from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.controller.colocate_profile import points_from_results, record, where_wins, winning_batches
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.server.metrics import Metrics

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "colocate_h200.json"


def _results(batch_us: dict[int, tuple[float, float]]) -> dict:
    rows = [
        {"case": f"p{b}.baselines", "batch": b, "median_us": {"anchor": co, "seq_graph_full_batch": fb}}
        for b, (co, fb) in batch_us.items()
    ]
    return {"rows": rows + [{"case": "p.best_interleave"}]}


def _profile(tmp_path: Path) -> Path:
    (tmp_path / "profile.json").write_text(json.dumps({"format": "specpilot-profile/1", "delta": {}}))
    return tmp_path


def test_wins_only_where_two_colocated_rounds_beat_one_full_batch_round():
    # Batch 8: 2 x 8.5 > 10.7 ms (the H200's loss); batch 4: 2 x 4 < 9 ms (a planted win).
    points = points_from_results(_results({8: (8500.0, 10700.0), 4: (4000.0, 9000.0)}))
    assert [p["batch"] for p in points] == [8, 4] and winning_batches(points) == (4,)


def test_the_h200_file_measured_no_full_batch_round_so_colocation_stays_off(tmp_path):
    # colocate_h200.json timed the conventional round over one group of 4, not over all 8.
    assert points_from_results(json.loads(RESULTS.read_text())) == []
    record(_profile(tmp_path), RESULTS)
    opts, line = where_wins(EngineOptions(max_batch_size=8, draft="x"), tmp_path)
    assert not opts.colocate and "no win" in line
    assert not where_wins(EngineOptions(), None)[0].colocate


def test_profile_win_turns_colocation_on_at_that_batch_only(tmp_path):
    res = tmp_path / "colocate.json"
    res.write_text(json.dumps(_results({8: (8500.0, 10700.0), 4: (4000.0, 9000.0)})))
    record(_profile(tmp_path), res)
    opts, line = where_wins(EngineOptions(max_batch_size=8), tmp_path)
    assert opts.colocate and opts.colocate_batches == (4,) and "batch 4" in line
    tree = EngineOptions(max_batch_size=8, tree_budget=4)
    assert not where_wins(tree, tmp_path)[0].colocate  # tree rounds cannot co-locate: off, with the reason


def test_engine_colocates_only_at_listed_batches_and_stays_exact():
    target = tiny_model("tiny-llama")
    draft = target.truncated(1)
    ps = prompts([5, 9, 3, 7], target.cfg.vocab_size, seed=2)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    base = dict(max_seq_len=256, max_batch_size=8, device="cpu", dtype="float32")
    ar = [r.token_ids for r in Engine(target, WordTokenizer(), EngineOptions(**base)).generate(ps, params)]
    eng = Engine(target, WordTokenizer(), EngineOptions(**base, colocate=True, colocate_batches=(4,)), draft)
    assert [r.token_ids for r in eng.generate(ps, params)] == ar  # bucket 4: co-located
    assert eng.colocate_rounds["colocated"] > 0
    before = eng.colocate_rounds["colocated"]
    assert eng.generate([ps[0]], params)[0].token_ids == ar[0]  # bucket 1: conventional
    assert eng.colocate_rounds["colocated"] == before and eng.colocate_rounds["conventional"] > 0
    m = Metrics()
    m.round(eng.batch)
    text = m.render()
    assert "specpilot_colocated_round_active 0" in text and 'colocate_rounds_total{strategy="colocated"}' in text
