"""kernels/greedy.py: each row's argmax and non-finite flag against the PyTorch reference, on odd shapes,
ties, -inf rows, NaN and inf (Triton interpreter on the CPU, the GPU where there is one)."""

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="Triton kernels need a GPU or TRITON_INTERPRET=1 (set before triton is imported)",
)


def _dev():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("shape", [(1, 5), (1, 49152), (3, 8193), (2, 4, 10007), (33, 128256)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_greedy_pick_matches_the_reference(shape, dtype):
    from sglang_specpilot.kernels.greedy import greedy_pick, greedy_pick_ref

    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g) * 4).to(dtype).to(_dev())
    tok, bad = greedy_pick(x)
    ref_tok, ref_bad = greedy_pick_ref(x)
    assert tok.shape == shape[:-1] and tok.dtype == torch.int64 and bad.dtype == torch.bool
    assert torch.equal(tok, ref_tok) and torch.equal(bad, ref_bad) and not bad.any()
    assert torch.equal(tok, x.argmax(-1))  # finite rows: exactly torch's argmax


def test_greedy_pick_ties_go_to_the_smallest_index_across_chunks():
    from sglang_specpilot.kernels.greedy import CHUNK, greedy_pick

    V = 3 * CHUNK + 17
    x = torch.zeros(4, V, device=_dev())
    x[0, [5, 9, CHUNK + 1]] = 3.0  # within a chunk and across chunks
    x[1, [2 * CHUNK + 3, CHUNK + 7]] = 1.0  # the later chunk comes first in the list
    x[2] = float("-inf")  # all -inf: index 0, as torch.argmax
    x[3, V - 1] = 1.0  # the last entry of a partial chunk
    tok, bad = greedy_pick(x)
    assert tok.tolist() == [5, CHUNK + 7, 0, V - 1] == x.argmax(-1).tolist()
    assert bad.tolist() == [False, False, True, False]  # -inf is not finite (as nonfinite_rows has it)


def test_greedy_pick_flags_nan_and_inf_rows_only():
    from sglang_specpilot.kernels.greedy import CHUNK, greedy_pick, greedy_pick_ref

    x = torch.randn(5, 2 * CHUNK + 3, device=_dev())
    x[1, CHUNK + 2] = float("nan")
    x[2, 0] = float("inf")
    x[3, 2 * CHUNK + 2] = float("-inf")
    tok, bad = greedy_pick(x)
    ref_tok, ref_bad = greedy_pick_ref(x)
    assert bad.tolist() == [False, True, True, True, False] == ref_bad.tolist()
    assert torch.equal(tok, ref_tok)  # the NaN row names its largest number
    assert tok[0] == x[0].argmax() and tok[4] == x[4].argmax()
