"""The Gated DeltaNet layer's math: chunked / tree WY forms against the recurrent step (fp64), the
layer's prefill in chunks against token-by-token decode, and the Qwen3-Next tensor names round trip."""

import pytest
import torch
from helpers import tiny_model

from sglang_specpilot.engine.gdn_state import RecurrentState
from sglang_specpilot.engine.gdn_verify import Tree, strategy
from sglang_specpilot.models.gdn_ops import chunked, l2norm, recurrent, state_at, tree_wy
from sglang_specpilot.models.safetensors_loader import load_safetensors_folder, save_safetensors_folder
from tree_verify import ancestor_mask

F64 = torch.float64


def _inputs(B, T, H, dk, dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    q, k = l2norm(r(B, T, H, dk)) * dk**-0.5, l2norm(r(B, T, H, dk))
    v = r(B, T, H, dv)
    gl = -torch.rand(B, T, H, generator=g, dtype=F64) * 2
    beta = torch.rand(B, T, H, generator=g, dtype=F64)
    return q, k, v, gl, beta, r(B, H, dk, dv)


@pytest.mark.parametrize("T,chunk", [(1, 64), (37, 8), (130, 64), (64, 64)])
def test_chunked_equals_recurrent(T, chunk):
    q, k, v, g, beta, S0 = _inputs(2, T, 3, 8, 5)
    o_ref, states = recurrent(q, k, v, g, beta, S0)
    o, S = chunked(q, k, v, g, beta, S0, chunk=chunk)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(S, states[:, -1], rtol=0, atol=1e-12)


def _random_tree(T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, T - 1)])


def _along(anc_row, b, q, k, v, g, beta, S0):
    """The recurrence of row b along the root path ``anc_row`` marks."""
    path = anc_row.nonzero()[:, 0]
    return recurrent(*(x[b : b + 1, path] for x in (q, k, v, g, beta)), S0[b : b + 1])


@pytest.mark.parametrize("name", ["path", "wy"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_strategies_equal_each_root_path(name, seed):
    # Every node's output and state equal the recurrence run along its own root path.
    T, B = 11, 2
    q, k, v, g, beta, S0 = _inputs(B, T, 2, 6, 4, seed)
    parents = torch.stack([_random_tree(T, seed), _random_tree(T, seed + 10)])  # node n = block entry n + 1
    anc = ancestor_mask(parents)  # [B, T, T]
    tree = Tree.from_anc(anc, B, T)
    strat = strategy(name)
    o, memo = strat.run(q, k, v, g, beta, S0, tree)
    for b in range(B):
        for t in range(T):
            o_ref, _ = _along(anc[b, t], b, q, k, v, g, beta, S0)
            torch.testing.assert_close(o[b, t], o_ref[0, -1], rtol=0, atol=1e-12)
    last = torch.tensor([T - 1, T - 1])
    S = strat.state_after(memo, S0, tree, last)
    for b in range(B):
        _, st = _along(anc[b, T - 1], b, q, k, v, g, beta, S0)
        torch.testing.assert_close(S[b], st[0, -1], rtol=0, atol=1e-12)


def test_state_at_chain_prefix():
    q, k, v, g, beta, S0 = _inputs(1, 9, 2, 4, 4, 5)
    anc = torch.ones(9, 9, dtype=torch.bool).tril()
    _, u, G = tree_wy(q, k, v, g, beta, S0, anc)
    _, states = recurrent(q, k, v, g, beta, S0)
    for t in range(9):
        torch.testing.assert_close(state_at(k, u, G, S0, anc[t][None]), states[:, t], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["tiny-hybrid", "tiny-hybrid-8"])
def test_layer_prefill_in_chunks_equals_decode(name):
    # The whole model: one prefill of 40 tokens (two chunks, padding in the second) against 40 decode
    # steps, fp64: the chunked WY form and the recurrent step agree through every GDN and attention layer.
    from sglang_specpilot.engine.attn_meta import causal_tree
    from sglang_specpilot.engine.runner import ModelRunner

    model = tiny_model(name, dtype=F64)
    toks = torch.randint(2, model.cfg.vocab_size, (1, 40), generator=torch.Generator().manual_seed(3))
    a = ModelRunner(model, 1, 128, cuda_graphs=False)
    pad = torch.cat([toks, torch.zeros(1, 24, dtype=torch.long)], 1)
    first = a.step(pad[:, :32], torch.tensor([0]), *causal_tree(32), valid=torch.tensor([32]))
    second = a.step(pad[:, 32:], torch.tensor([32]), *causal_tree(32), valid=torch.tensor([8]))
    chunked_logits = torch.cat([first, second[:, :8]], 1)
    b = ModelRunner(model, 1, 128, cuda_graphs=False)
    steps = [b.step(toks[:, t : t + 1], torch.tensor([t]), *causal_tree(1)) for t in range(40)]
    torch.testing.assert_close(chunked_logits, torch.cat(steps, 1), rtol=0, atol=1e-10)
    torch.testing.assert_close(a.recurrent.ssm, b.recurrent.ssm, rtol=0, atol=1e-10)
    # conv inputs are projections of upstream hidden states: equal to rounding, like the logits
    torch.testing.assert_close(a.recurrent.conv, b.recurrent.conv, rtol=0, atol=1e-10)


def test_hybrid_safetensors_round_trip(tmp_path):
    model = tiny_model("tiny-hybrid")
    sd = model.hf_state_dict()
    assert "model.layers.0.linear_attn.in_proj_qkvz.weight" in sd and "model.layers.3.self_attn.q_proj.weight" in sd
    assert "model.layers.0.self_attn.q_proj.weight" not in sd
    save_safetensors_folder(tmp_path, model.cfg, sd)
    cfg, sd2, meta = load_safetensors_folder(tmp_path)
    assert cfg.to_dict() == model.cfg.to_dict()
    assert meta["config"]["layer_types"][:4] == ["linear_attention"] * 3 + ["full_attention"]
    assert sd2.keys() == sd.keys() and all(torch.equal(sd[n], sd2[n]) for n in sd)
    from sglang_specpilot.models.build import build_model

    again = build_model(cfg, state_dict=sd2)
    assert all(torch.equal(p, q) for p, q in zip(again.parameters(), model.parameters(), strict=True))


def test_state_memory_per_row():
    from sglang_specpilot.models.presets import preset_config

    cfg = preset_config("qwen3-next-8b-like")
    st = RecurrentState(cfg, 1, 16, "meta", torch.bfloat16)
    # 27 GDN layers x 32 value heads x 128 x 128 float32, plus 3 conv inputs of 8192 bf16 channels.
    assert len(cfg.gdn_layers) == 27 and st.nbytes_per_row() == 27 * (32 * 128 * 128 * 4 + 3 * 8192 * 2)
