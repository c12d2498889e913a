"""The fused head + KL of drafter training (drafters/head_loss.py) against its plain autograd reference:
the same loss, hits and gradients, on odd shapes, for a frozen and a trained head."""

import pytest
import torch
from helpers import tiny_model

from sglang_specpilot.drafters.eagle3 import init_eagle3
from sglang_specpilot.drafters.head_loss import head_stats, head_stats_reference, kl_chunk


def _case(head, M, vocab, seed=0):
    target = tiny_model("tiny-llama", dtype=torch.float64)
    torch.manual_seed(seed)
    d2t = torch.randperm(target.cfg.vocab_size)[:vocab].sort().values
    drafter = init_eagle3(target, d2t=d2t, head=head)
    h = torch.randn(M, target.cfg.hidden_size, dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(torch.randn(M, vocab, dtype=torch.float64) * 2, -1)
    neg = (probs * probs.log()).sum(-1)
    top = d2t[torch.randint(0, vocab, (M,))]
    top[::3] = d2t[(drafter.logits(h.detach())).argmax(-1)][::3]  # some rows agree, so hits are counted
    return drafter, h, probs, neg, top


@pytest.mark.parametrize("head", ["target", "trained"])
@pytest.mark.parametrize("M,vocab,chunk", [(37, 53, 8), (5, 200, 64), (64, 17, 64)])
def test_fused_equals_the_reference_with_gradients(head, M, vocab, chunk):
    drafter, h, probs, neg, top = _case(head, M, vocab)
    w = drafter.lm_head.weight
    assert w.requires_grad == (head == "trained")
    kl, hits = head_stats(drafter, h, probs, neg, top, chunk=chunk)
    (gh, *gw) = torch.autograd.grad(3.0 * kl, [h, *([w] if w.requires_grad else [])])
    kl_ref, hits_ref = head_stats_reference(drafter, h, probs, neg, top)
    (gh_ref, *gw_ref) = torch.autograd.grad(3.0 * kl_ref, [h, *([w] if w.requires_grad else [])])
    assert int(hits) == int(hits_ref) > 0
    torch.testing.assert_close(kl, kl_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gh, gh_ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(gw, gw_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_without_grad_nothing_is_kept_and_values_match():
    drafter, h, probs, neg, top = _case("target", 20, 40)
    with torch.no_grad():
        kl, hits = head_stats(drafter, h, probs, neg, top, chunk=7)
        kl_ref, hits_ref = head_stats_reference(drafter, h, probs, neg, top)
    assert not kl.requires_grad and int(hits) == int(hits_ref)
    torch.testing.assert_close(kl, kl_ref, rtol=1e-12, atol=1e-12)


def test_the_chunk_gradient_is_softmax_minus_teacher():
    lg = torch.randn(6, 11, dtype=torch.float64, requires_grad=True)
    p = torch.softmax(torch.randn(6, 11, dtype=torch.float64), -1)
    neg = (p * p.log()).sum(-1)
    kl, _, g = kl_chunk(lg, p, neg, torch.zeros(6, dtype=torch.long), torch.arange(11))
    (auto,) = torch.autograd.grad(kl, lg)
    torch.testing.assert_close(g, auto, rtol=1e-12, atol=1e-12)
    assert kl > 0


def test_under_bf16_autocast_as_training_runs():
    # Training runs the head under bf16 autocast with fp32 hidden states: the fused pass picks bf16 for
    # its GEMMs and returns gradients in the inputs' dtypes, close to the autocast reference.
    drafter, h, probs, neg, top = _case("trained", 50, 64)
    drafter = drafter.float()
    h = h.detach().float().requires_grad_(True)
    probs, neg = probs.float(), neg.float()
    w = drafter.lm_head.weight
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kl, _ = head_stats(drafter, h, probs, neg, top, chunk=16)
        kl_ref, _ = head_stats_reference(drafter, h, probs, neg, top)
    gh, gw = torch.autograd.grad(kl, [h, w])
    gh_ref, gw_ref = torch.autograd.grad(kl_ref, [h, w])
    assert kl.dtype == torch.float32 and gh.dtype == h.dtype and gw.dtype == w.dtype
    torch.testing.assert_close(kl, kl_ref, rtol=2e-2, atol=1e-2)
    torch.testing.assert_close(gh, gh_ref, rtol=5e-2, atol=5e-3)
    torch.testing.assert_close(gw, gw_ref, rtol=5e-2, atol=5e-3)


@pytest.mark.gpu
def test_compiled_chunk_equals_eager_gpu():
    from sglang_specpilot.drafters.head_loss import _kl_chunk_for

    torch.manual_seed(0)
    for m in (8192, 1234):  # a full chunk and a short last one: one compile (dynamic rows)
        lg = torch.randn(m, 32000, device="cuda", dtype=torch.bfloat16) * 3
        p = torch.softmax(torch.randn(m, 32000, device="cuda"), -1)
        neg = (p * p.log()).sum(-1)
        top, d2t = torch.randint(0, 32000, (m,), device="cuda"), torch.arange(32000, device="cuda")
        got, want = _kl_chunk_for(lg)(lg, p, neg, top, d2t), kl_chunk(lg, p, neg, top, d2t)
        torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-2)
        assert int(got[1]) == int(want[1])
        torch.testing.assert_close(got[2].float(), want[2].float(), rtol=0, atol=1e-2)


def test_a_failing_compiled_pass_falls_back_to_eager(monkeypatch):
    from sglang_specpilot.drafters import head_loss

    def broken(*a):
        raise RuntimeError("inductor: no working C++ compiler\nmore lines")

    lg = torch.randn(4, 9, dtype=torch.float64)
    p = torch.softmax(torch.randn(4, 9, dtype=torch.float64), -1)
    args = (lg, p, (p * p.log()).sum(-1), torch.zeros(4, dtype=torch.long), torch.arange(9))
    monkeypatch.setattr(head_loss, "_compiled", broken)
    monkeypatch.setattr(head_loss, "_compile_failed", None)
    with pytest.warns(UserWarning, match="running eagerly"):
        got = head_loss._guarded(*args)
    want = kl_chunk(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    assert head_loss._compile_failed.startswith("RuntimeError: inductor")
    assert head_loss._kl_chunk_for(lg.cuda() if torch.cuda.is_available() else lg) is kl_chunk  # given up for good
