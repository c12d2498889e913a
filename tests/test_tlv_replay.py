"""The TLV replay (``specpilot tau --tlv``, harness/tlv_replay.py): it counts the engine's TLV rounds, and
the CLI reports the issue's replay metrics at the best tree's budget."""

import json

import pytest
import torch
from helpers import WordTokenizer, prompts, tiny_model
from test_eagle3 import _drafter

from sglang_specpilot.config import EngineOptions
from sglang_specpilot.engine import Engine, SamplingParams
from sglang_specpilot.harness.tau_replay import tau_report
from sglang_specpilot.harness.tlv_replay import TLVReplay
from sglang_specpilot.models.w12_weights import to_w12

V = 12
OPTS = dict(device="cpu", dtype="bfloat16", weights="w12", max_seq_len=256, max_batch_size=1)


def _models(eagle: bool):
    # No EOS: the replay stops its text at EOS, where the engine spends one more round emitting it.
    base = tiny_model("tiny-llama", vocab_size=V, dtype=torch.bfloat16, eos_token_ids=[])
    draft = _drafter(base) if eagle else None
    target = to_w12(base)
    return target, draft if eagle else target.truncated(1)


@pytest.mark.parametrize("eagle", [False, True], ids=["plain", "eagle3"])
@pytest.mark.parametrize("chain_len,root", [(2, 0), (3, 2)])
def test_tlv_replay_counts_the_engines_rounds(eagle, chain_len, root):
    # The replay's Q chain runs the 8-bit view over the exact prefix K/V, and its lattices are the ones the
    # engine's TLV round grows (from the chain's end, and from the root): so its rounds are the engine's.
    target, draft = _models(eagle)
    ps = prompts([6, 11, 4], V, seed=4)
    n, budget = 40, 8
    ar = Engine(target, WordTokenizer(), EngineOptions(**OPTS))
    rep = tau_report(ar, draft, ps, n, depth=3, top_k=2, budgets=(budget,), tlv=TLVReplay(chain_len, root))
    tlv = dict(tlv_chain_len=chain_len, tlv_hang_budget=budget - chain_len - root, tlv_root_budget=root)
    tree = dict(tree_budget=budget, tree_depth=3, tree_top_k=2)
    eng = Engine(target, WordTokenizer(), EngineOptions(**OPTS, tlv=True, **tree, **tlv), draft)
    rounds = sum(eng.generate([p], SamplingParams(max_new_tokens=n))[0].rounds for p in ps)
    assert rounds == rep[f"rounds_tlv{budget}"], (rounds, rep)
    assert rep["tlv_budget"] == budget and rep["tlv_hang_budget"] == budget - chain_len - root
    assert rep["tlv_tokens_per_exact_pass"] == rep["tlv_tokens_per_round"] == rep[f"tau_tlv{budget}"]
    assert rep["tlv_tokens_per_exact_pass_ratio"] == pytest.approx(rep["tau_tlv8"] / rep["tau_tree8"], abs=1e-3)
    assert 0 < rep["tlv_q_chain_agreement"] <= 1


def test_tlv_replay_refusals():
    base = tiny_model("tiny-llama", vocab_size=V, dtype=torch.bfloat16)
    ar = Engine(base, WordTokenizer(), EngineOptions(**{**OPTS, "weights": "bf16"}))
    with pytest.raises(ValueError, match="W12"):
        tau_report(ar, base.truncated(1), prompts([5], V), 8, depth=3, top_k=2, budgets=(8,), tlv=TLVReplay(2))
    target, draft = _models(False)
    ar = Engine(target, WordTokenizer(), EngineOptions(**OPTS))
    with pytest.raises(ValueError, match="hanging tree"):  # 4 nodes: chain 3 + root 1 leave none
        tau_report(ar, draft, prompts([5], V), 8, depth=3, top_k=2, budgets=(4,), tlv=TLVReplay(3, 1))


def test_cli_tau_tlv(capsys):
    from sglang_specpilot.cli import main

    common = ["tau", "--model", "tiny-llama", "--synthetic", "--device", "cpu", "--prompts", "synthetic:2"]
    common += ["--new-tokens", "12", "--depth", "3", "--top-k", "2", "--budgets", "4,8", "--draft-layers", "1"]
    assert main([*common, "--weights", "w12", "--tlv", "--tlv-chain-len", "2", "--tlv-root-budget", "1"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"tau_tlv4", "tau_tlv8", "tlv4_q_chain_agreement", "tlv_tokens_per_exact_pass_ratio"} <= set(out)
    assert out["tlv_budget"] in (4, 8) and out["tlv_chain_len"] == 2 and out["tlv_root_budget"] == 1
    assert main([*common, "--tlv"]) == 2 and "--weights w12" in capsys.readouterr().err


def test_cli_tau_tlv_with_an_eagle3_drafter(tmp_path, capsys):
    # The shipped drafter is an EAGLE-3 one: it must load onto a W12 target (whose head it copies rows of).
    from sglang_specpilot.cli import main
    from sglang_specpilot.drafters.eagle3 import save_eagle3

    save_eagle3(_drafter(tiny_model("tiny-llama")), tmp_path / "e3")
    argv = ["tau", "--model", "tiny-llama", "--synthetic", "--device", "cpu", "--prompts", "synthetic:1"]
    argv += ["--new-tokens", "10", "--depth", "3", "--top-k", "2", "--budgets", "6", "--draft", str(tmp_path / "e3")]
    assert main([*argv, "--weights", "w12", "--tlv", "--tlv-chain-len", "2"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["tlv_budget"] == 6 and out["tlv_hang_budget"] == 4 and "tlv_q_chain_agreement" in out
