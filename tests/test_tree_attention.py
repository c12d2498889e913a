"""Tree attention: the Triton kernel against the PyTorch reference, the reference against brute force.

Where the kernel runs: on the GPU when there is one, else on the CPU in the Triton interpreter. The
interpreter only works if TRITON_INTERPRET=1 is set before triton is imported, and other test modules
import it first, so on a CPU the kernel cases (named ``test_kernel_*``) run in a child pytest
(``test_kernel_cases_in_interpreter``). To see them case by case:
``TRITON_INTERPRET=1 pytest tests/test_tree_attention.py``.

Tolerances (max |kernel - reference| <= atol + rtol * |reference|): fp32 atol = rtol = 1e-4 (the kernel
and the reference differ only in summation order); bf16 and fp16 2e-2, about two bf16 ulps at the
output's magnitude (~1): the kernel rounds p to bf16 before p @ v as the tensor cores need, the reference
does not.
"""

import importlib

import pytest
import torch
from helpers import run_kernel_cases_in_interpreter

from sglang_specpilot.kernels.tree_attention import (
    INTERPRETED,
    Config,
    default_num_splits,
    pick_config,
    row_block,
    split_count,
    tree_attention,
    tree_attention_ref,
)

ta_module = importlib.import_module("sglang_specpilot.kernels.tree_attention")

# The interpreter's range() over a run-time bound converts a 1-element array to int: deprecated in numpy.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_HERE = torch.cuda.is_available() or INTERPRETED
kernel_case = pytest.mark.skipif(
    not KERNEL_HERE, reason="on a CPU the kernel cases run in test_kernel_cases_in_interpreter's child"
)
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}
S = 160  # cache capacity: 2.5 blocks of 64, so ranges end mid-block and some splits are empty


def chain_anc(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def tree_anc(n: int, gen: torch.Generator) -> torch.Tensor:
    """Random tree in topological order: node i's parent is some j < i; anc = ancestor-or-self."""
    anc = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        parent = int(torch.randint(0, i, (1,), generator=gen))
        anc[i] |= anc[parent]
    return anc


def expansion_anc(n: int, w: int, gen: torch.Generator) -> torch.Tensor:
    """[n, w]: n queries at distinct window slots of a random w-node tree, each seeing its slot's ancestry."""
    tree = tree_anc(w, gen)
    return tree[torch.randperm(w, generator=gen)[:n]]


def make_case(batch, n, groups, head_dim, seq_lens, anc_kind, dtype=torch.float32, kv_heads=2, seed=0, win=None, cap=S):
    """q [batch, n, ...], caches of cap slots, seq_len, anc [n, win] (or [batch, n, win]); win defaults to n.

    anc kinds: "chain", "tree" (shared, square), "per_request" (a tree per request), "expansion" (shared
    [n, win], see ``expansion_anc``), "expansion_per_request". In the expansion kinds the window slots that
    no query sees hold large stale values, so a leak of one would show.
    """
    gen = torch.Generator().manual_seed(seed)
    win = n if win is None else win
    # One spare cache row: rows past the batch must be ignored.
    q = torch.randn(batch, n, kv_heads * groups, head_dim, generator=gen)
    k = torch.randn(batch + 1, cap, kv_heads, head_dim, generator=gen)
    v = torch.randn(batch + 1, cap, kv_heads, head_dim, generator=gen)
    if anc_kind == "chain":
        anc = chain_anc(n)
    elif anc_kind == "tree":
        anc = tree_anc(n, gen)
    elif anc_kind == "per_request":
        anc = torch.stack([tree_anc(n, gen) for _ in range(batch)])
    elif anc_kind == "expansion":
        anc = expansion_anc(n, win, gen)
    else:
        assert anc_kind == "expansion_per_request", anc_kind
        anc = torch.stack([expansion_anc(n, win, gen) for _ in range(batch)])
    assert anc.shape[-1] == win
    if anc_kind.startswith("expansion"):
        unseen = ~anc.expand(batch, n, win).any(1)  # [batch, win]
        for b, s in enumerate(seq_lens):
            for t in unseen[b].nonzero().flatten().tolist():
                k[b, s + t] *= 30.0
                v[b, s + t] *= 30.0
    seq_len = torch.tensor(seq_lens, dtype=torch.int64)
    return [t.to(DEVICE, dtype if t.is_floating_point() else None) for t in (q, k, v, seq_len, anc)]


def assert_close(out, ref, tol, what=""):
    err = (out.float() - ref.float()).abs()
    bound = tol + tol * ref.float().abs()
    bad = (err > bound) | ~out.isfinite()
    if bad.any():
        b, i, h, d = (int(x) for x in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} elements off, max err {err.max().item():.3g}; first at "
            f"[b={b}, token={i}, head={h}, dim={d}]: {out[b, i, h, d].item()} vs {ref[b, i, h, d].item()}"
        )


# ---------------------------------------------------------------------------------------------------------
# The reference against brute force (CPU, fast)
# ---------------------------------------------------------------------------------------------------------


def brute_force(q, k_cache, v_cache, seq_len, anc):
    B, N, Hq, D = q.shape
    W = anc.shape[-1]
    G = Hq // k_cache.shape[2]
    anc = anc.expand(B, N, W)
    o = torch.zeros(B, N, Hq, D, dtype=torch.float64)
    for b in range(B):
        s = int(seq_len[b])
        for i in range(N):
            seen = list(range(s)) + [s + j for j in range(W) if anc[b, i, j]]
            for h in range(Hq):
                kk = k_cache[b, seen, h // G].double()
                vv = v_cache[b, seen, h // G].double()
                o[b, i, h] = torch.softmax(kk @ q[b, i, h].double() * D**-0.5, 0) @ vv
    return o


@pytest.mark.parametrize("anc_kind", ["chain", "tree", "per_request"])
def test_reference_matches_brute_force(anc_kind):
    q, k, v, seq_len, anc = (t.cpu() for t in make_case(3, 5, 3, 32, [0, 17, 130], anc_kind))
    k[:, 150:] = float("nan")  # past every request's end: the reference must not see it
    assert_close(tree_attention_ref(q, k, v, seq_len, anc), brute_force(q, k, v, seq_len, anc), 1e-5, "ref")


@pytest.mark.parametrize("anc_kind", ["expansion", "expansion_per_request"])
def test_reference_matches_brute_force_window(anc_kind):
    # Nq = 4 queries over a W = 9 window: the window slots past the queries' count must still be seen.
    q, k, v, seq_len, anc = (t.cpu() for t in make_case(3, 4, 3, 32, [0, 17, 130], anc_kind, win=9))
    k[:, 140:] = float("nan")  # past every request's window
    assert_close(tree_attention_ref(q, k, v, seq_len, anc), brute_force(q, k, v, seq_len, anc), 1e-5, "ref")


def test_default_num_splits():
    # Batch 1, 8 kv heads on 132 SMs: 2 x 16 = 32 splits (the measured best, kernels/tree_attention.py).
    assert default_num_splits(1, 8, 1, 8192, 132) == 32
    # A big batch fills the GPU on its own: one split, no merge.
    assert default_num_splits(64, 8, 1, 8192, 132) == 1
    # Never more splits than cache blocks (128 slots in decode), never more than 64.
    assert default_num_splits(1, 1, 1, 160, 132) == 2
    assert default_num_splits(1, 1, 1, 1 << 20, 132) == 64


def test_pick_config():
    # Plain decode on the 8B shape: 16-row tiles, 128-slot blocks, 2 stages, 32 splits.
    assert pick_config(1, 4, 8, 4224, 2, 132) == Config(16, 128, 32, 1, 4, 2)
    # fp32 decode keeps 64-slot blocks (a 128 x 128 fp32 tile pair per stage would not fit twice).
    assert pick_config(1, 4, 8, 4224, 4, 132).block_s == 64
    # A 64-token verify tree: 64-row tiles (4 a kv head), half a wave: 2 splits (the H200 sweep's best).
    # A split covers at least 8 blocks: at 1k cached tokens and more the 8B's verify still runs both.
    assert pick_config(1, 256, 8, 4224, 2, 132) == Config(64, 64, 2, 8, 4, 3)
    # SmolLM2's 33-token verify (3 kv heads, G 3): 6 programs would get 11 splits; the tree table caps them
    # at 2, live from 16 blocks on.
    assert pick_config(1, 99, 3, 2112, 2, 132) == Config(64, 64, 2, 8, 4, 3)
    # The tests' pinned count wins.
    assert pick_config(1, 256, 8, 4224, 2, 132, num_splits=7).num_splits == 7


def test_small_heads_take_their_own_tree_entry(monkeypatch):
    # Heads of 64 dims or fewer read TUNING["tree_d64"]; the 8B's 128-dim heads and decode never do.
    from sglang_specpilot.kernels import tree_attention as ta

    monkeypatch.setitem(ta.TUNING, "tree_d64", ta.TUNING["tree"]._replace(block_s=128, num_stages=2))
    assert pick_config(1, 99, 3, 2112, 2, 132, head_dim=64)[1:6:4] == (128, 2)
    assert pick_config(1, 99, 3, 2112, 2, 132, head_dim=128) == Config(64, 64, 2, 8, 4, 3)
    assert pick_config(1, 9, 3, 2112, 2, 132, head_dim=64).block_s == ta.TUNING["decode"].block_s
    assert ta._tuning_from_env("tree_d64=64,64,128,4,3,0.5,8,2")["tree_d64"].block_s == 128


def test_row_block():
    assert row_block(1, 1, 8, 132) == 16  # tl.dot needs 16 rows
    assert row_block(24, 1, 8, 132) == 32
    assert row_block(256, 8, 8, 132) == 128  # 128 programs: big tiles
    assert row_block(256, 1, 8, 132) == 64  # 16 programs: more, smaller tiles


def test_row_block_small_grid_tile():
    # The tuning table's small-grid tile: 128-row tiles kept at batch 1 when the table says so.
    assert row_block(256, 1, 8, 132, max_block_r=128, small_grid_block_r=128) == 128
    assert row_block(256, 1, 8, 132, max_block_r=256, small_grid_block_r=256) == 256
    assert row_block(24, 1, 8, 132, max_block_r=256, small_grid_block_r=64) == 32


def test_split_count():
    # waves x whole sets of row programs per 132 SMs: 16 sets of 8 (decode), 8 sets of 16 (128-row trees).
    assert split_count(8, 4224, 128, 132, 2.0) == 32
    assert split_count(16, 4224, 64, 132, 0.5) == 4
    assert split_count(32, 4224, 64, 132, 0.75) == 3
    # Capped by the cache's blocks and MAX_SPLITS; never below one.
    assert split_count(8, 200, 64, 132, 2.0) == 4
    assert split_count(1, 1 << 20, 64, 132, 4.0) == 64
    assert split_count(512, 4224, 64, 132, 1.0) == 1


def test_cpu_falls_back_to_reference():
    if INTERPRETED:
        pytest.skip("under the interpreter CPU tensors go to the kernel")
    q, k, v, seq_len, anc = (t.cpu() for t in make_case(2, 3, 2, 32, [5, 64], "tree"))
    assert torch.equal(tree_attention(q, k, v, seq_len, anc), tree_attention_ref(q, k, v, seq_len, anc))


# ---------------------------------------------------------------------------------------------------------
# The kernel against the reference
# ---------------------------------------------------------------------------------------------------------

# (batch, N, G, head_dim, seq_lens, anc, num_splits); S = 160, BLOCK_S = 64. None = the launcher's choice.
CASES = [
    (1, 1, 1, 32, [0], "chain", None),  # the first token of a request: nothing but itself
    (1, 1, 4, 64, [130], "chain", None),  # plain decode, GQA 4
    (1, 1, 1, 32, [130], "chain", 3),  # one row: the merge reads a single row of each partial
    (1, 1, 2, 32, [100], "chain", 16),  # two rows, 16 grid splits over 2 live blocks
    (3, 3, 3, 32, [0, 17, 130], "tree", 1),  # one split: the kernel writes o directly
    (3, 5, 4, 64, [63, 64, 65], "tree", 2),  # the new block straddles a block edge, or starts on one
    (3, 7, 3, 32, [1, 130, 64], "chain", 5),  # more splits than blocks: empty splits must add nothing
    (3, 7, 1, 64, [65, 0, 17], "per_request", 3),
    (3, 3, 1, 32, [130, 1, 64], "per_request", 16),
    (1, 5, 4, 32, [155], "tree", 3),  # seq_len + N = S: the cache's last slot
]


@kernel_case
@pytest.mark.parametrize("batch,n,groups,head_dim,seq_lens,anc_kind,num_splits", CASES)
def test_kernel_matches_reference(batch, n, groups, head_dim, seq_lens, anc_kind, num_splits):
    q, k, v, seq_len, anc = make_case(batch, n, groups, head_dim, seq_lens, anc_kind)
    out = tree_attention(q, k, v, seq_len, anc, num_splits=num_splits)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_close(out, tree_attention_ref(q, k, v, seq_len, anc), TOL[torch.float32], "fp32")


# (batch, Nq, W, G, head_dim, seq_lens, anc, num_splits): fewer queries than window slots.
WINDOW_CASES = [
    (1, 1, 9, 4, 64, [130], "expansion", None),  # one query over a 9-slot window
    (3, 4, 9, 3, 32, [0, 60, 130], "expansion", 2),  # the window straddles a block edge (60 .. 68)
    (3, 5, 70, 1, 32, [1, 64, 17], "expansion_per_request", 3),  # W > BLOCK_S: the window spans two blocks
    (2, 3, 11, 4, 64, [149, 5], "expansion", 1),  # seq_len + W = S; one split writes o directly
    (2, 7, 12, 3, 32, [33, 100], "expansion_per_request", 16),  # more splits than blocks
]


@kernel_case
@pytest.mark.parametrize("batch,n,win,groups,head_dim,seq_lens,anc_kind,num_splits", WINDOW_CASES)
def test_kernel_window_wider_than_queries(batch, n, win, groups, head_dim, seq_lens, anc_kind, num_splits):
    q, k, v, seq_len, anc = make_case(batch, n, groups, head_dim, seq_lens, anc_kind, win=win)
    ref = tree_attention_ref(q, k, v, seq_len, anc)
    # Past the window: garbage the kernel must not read into the result.
    for b, s in enumerate(seq_lens):
        k[b, s + win :] = float("nan")
        v[b, s + win :] = float("nan")
    out = tree_attention(q, k, v, seq_len, anc, num_splits=num_splits)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_close(out, ref, TOL[torch.float32], f"Nq {n}, W {win}")


@kernel_case
def test_kernel_window_half_precision():
    q, k, v, seq_len, anc = make_case(2, 3, 2, 64, [70, 0], "expansion", dtype=torch.bfloat16, win=10)
    out = tree_attention(q, k, v, seq_len, anc, num_splits=2)
    assert_close(out, tree_attention_ref(q, k, v, seq_len, anc), TOL[torch.bfloat16], "bf16 window")


@kernel_case
@pytest.mark.parametrize("num_sms", [1, 132])
def test_kernel_row_tiles(num_sms, monkeypatch):
    # 33 tokens x G = 4 is 132 rows: two tiles of 128 when the grid is big enough (one SM), else three of 64.
    monkeypatch.setattr(ta_module, "_num_sms", lambda device: num_sms)
    q, k, v, seq_len, anc = make_case(1, 33, 4, 128, [40], "tree")
    out = tree_attention(q, k, v, seq_len, anc, num_splits=2)
    assert_close(out, tree_attention_ref(q, k, v, seq_len, anc), TOL[torch.float32], f"{num_sms} SMs")


@kernel_case
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kernel_half_precision(dtype, num_splits):
    q, k, v, seq_len, anc = make_case(3, 5, 3, 64, [0, 65, 130], "tree", dtype=dtype)
    out = tree_attention(q, k, v, seq_len, anc, num_splits=num_splits)
    assert out.dtype == dtype
    assert_close(out, tree_attention_ref(q, k, v, seq_len, anc), TOL[dtype], str(dtype))


@kernel_case
@pytest.mark.parametrize("fill", [float("nan"), float("inf")])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_kernel_ignores_garbage_past_the_end(fill, num_splits):
    q, k, v, seq_len, anc = make_case(3, 5, 3, 32, [0, 64, 100], "tree")
    ref = tree_attention_ref(q, k, v, seq_len, anc)  # on the clean cache
    for b, s in enumerate(seq_len.tolist()):
        k[b, s + 5 :] = fill
        v[b, s + 5 :] = fill
    k[3:] = fill  # the spare row
    v[3:] = fill
    out = tree_attention(q, k, v, seq_len, anc, num_splits=num_splits)
    assert out.isfinite().all()
    assert_close(out, ref, TOL[torch.float32], f"garbage {fill}")


@kernel_case
def test_kernel_tickets_left_zero():
    # The in-kernel merge's ticket counters must be zero after every call, or the next call (or graph
    # replay) would pick the wrong merger.
    q, k, v, seq_len, anc = make_case(3, 5, 3, 32, [0, 64, 100], "tree")
    for num_splits in (2, 4, 16):
        tree_attention(q, k, v, seq_len, anc, num_splits=num_splits)
        assert not ta_module._TICKETS[q.device].any(), num_splits


@kernel_case
def test_kernel_scale_and_int32_seq_len():
    q, k, v, seq_len, anc = make_case(2, 3, 2, 32, [17, 130], "chain")
    out = tree_attention(q, k, v, seq_len.int(), anc, scale=0.3, num_splits=2)
    assert_close(out, tree_attention_ref(q, k, v, seq_len, anc, scale=0.3), TOL[torch.float32], "scale")


# (Nq, G, seq_len, head_dim, num_splits): the rows (1, 3, 17, 64), contexts (1, 5, 1000, 4097) and GQA ratios
# (1, 3, 4) of issue 12, one kv head, a random tree (W = Nq) on a cache of ODD_S slots; None = pick_config.
ODD_S = 4097 + 64 + 3
ODD_CASES = [
    (1, 1, 1, 32, None),
    (3, 3, 5, 32, None),
    (17, 4, 1000, 64, None),
    (64, 4, 4097, 32, None),  # 256 rows: two 128-row tiles or four of 64
    (1, 4, 4097, 128, None),  # plain decode at 4k
    (64, 1, 5, 32, 3),  # more splits than a 69-slot context has blocks
    (17, 3, 4097, 32, 7),
    (3, 1, 1000, 128, 64),  # the most splits: the merge takes one row a step
    (64, 3, 1000, 64, None),
]


@kernel_case
@pytest.mark.parametrize("n,groups,seq,head_dim,num_splits", ODD_CASES)
def test_kernel_odd_shapes(n, groups, seq, head_dim, num_splits):
    q, k, v, seq_len, anc = make_case(1, n, groups, head_dim, [seq], "tree", kv_heads=1, cap=ODD_S)
    ref = tree_attention_ref(q, k, v, seq_len, anc)
    k[:, seq + n :] = float("nan")  # past the window
    v[:, seq + n :] = float("nan")
    out = tree_attention(q, k, v, seq_len, anc, num_splits=num_splits)
    assert_close(out, ref, TOL[torch.float32], f"Nq {n}, G {groups}, seq {seq}")


@kernel_case
@pytest.mark.parametrize("n,groups,seq,head_dim,num_splits", [c for c in ODD_CASES if c[2] != 4097])
def test_kernel_odd_shapes_balanced(n, groups, seq, head_dim, num_splits, monkeypatch):
    # The same through a table whose ranges are equal slot counts.
    tuning = {k: t._replace(balanced=True) for k, t in ta_module.TUNING.items()}
    monkeypatch.setattr(ta_module, "TUNING", tuning)
    q, k, v, seq_len, anc = make_case(1, n, groups, head_dim, [seq], "tree", kv_heads=1, cap=ODD_S)
    out = tree_attention(q, k, v, seq_len, anc, num_splits=num_splits)
    assert_close(out, tree_attention_ref(q, k, v, seq_len, anc), TOL[torch.float32], f"Nq {n}, seq {seq}")


@kernel_case
@pytest.mark.parametrize("seq", [5, 14 * 64 - 33, 16 * 64 - 33, 16 * 64 - 32, 24 * 64 - 33])
def test_kernel_live_splits_follow_context(seq):
    # SmolLM2's verify shape (33 tokens, G 3, head_dim 64) through pick_config: the tree regime's grid has
    # many splits, but a context under 16 blocks runs one live split (no merge) and 16 blocks on run two or
    # three; the answer must not depend on where the count changes.
    q, k, v, seq_len, anc = make_case(1, 33, 3, 64, [seq], "tree", kv_heads=1, cap=ODD_S)
    ref = tree_attention_ref(q, k, v, seq_len, anc)
    k[:, seq + 33 :] = float("nan")
    v[:, seq + 33 :] = float("nan")
    out = tree_attention(q, k, v, seq_len, anc)
    assert_close(out, ref, TOL[torch.float32], f"seq {seq}")
    assert not ta_module._TICKETS[q.device].any()


@kernel_case
def test_kernel_odd_shape_bf16():
    # The 8B shape's head_dim and GQA ratio, bf16, 64 tokens of a tree at 1000 cached tokens.
    q, k, v, seq_len, anc = make_case(1, 64, 4, 128, [1000], "tree", dtype=torch.bfloat16, cap=ODD_S)
    out = tree_attention(q, k, v, seq_len, anc)
    assert_close(out, tree_attention_ref(q, k, v, seq_len, anc), TOL[torch.bfloat16], "bf16 tree")


# Launch shapes the benchmark's sweep tries beyond pick_config's choices: 256-row tiles (16 warps), 128-row
# tiles with 32-slot blocks, 256-slot decode blocks, 64 splits merged one row a step, >= 2 blocks a split,
# programmatic dependent launch, every block through the masked loop, equal-slot split ranges.
LAUNCH_CASES = [
    Config(256, 64, 4, 1, 16, 2),
    Config(128, 32, 8, 1, 8, 3),
    Config(16, 256, 8, 1, 8, 2),
    Config(64, 64, 64, 1, 4, 3, 512),
    Config(32, 64, 5, 2, 4, 3),
    Config(64, 64, 4, 1, 4, 3, pdl=True),  # on a GPU; the interpreter launches plainly
    Config(64, 64, 3, 1, 4, 3, one_loop=True),
    Config(16, 128, 8, 1, 4, 2, one_loop=True),
    Config(16, 64, 7, 1, 4, 3, balanced=True),  # equal-slot ranges: they end mid-block, mid-prefix
    Config(64, 32, 5, 2, 4, 3, balanced=True, one_loop=True),
]


@kernel_case
@pytest.mark.parametrize("cfg", LAUNCH_CASES, ids=lambda c: "-".join(map(str, c)))
def test_kernel_launch_shapes(cfg):
    q, k, v, seq_len, anc = make_case(2, 64, 4, 64, [1000, 37], "per_request", kv_heads=1, cap=ODD_S)
    tickets = ta_module._tickets(q.device, 4096)
    out = ta_module._launch(q, k, v, seq_len, anc, tickets, 64**-0.5, cfg)
    assert_close(out, tree_attention_ref(q, k, v, seq_len, anc), TOL[torch.float32], str(cfg))
    assert not tickets.any()


@kernel_case
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_half_partials(dtype):
    # bf16 partial outputs (the sweep's half_partials) stay within the bf16 tolerance; fp32 calls ignore it.
    q, k, v, seq_len, anc = make_case(1, 64, 4, 128, [1000], "tree", dtype=dtype, cap=ODD_S)
    tickets = ta_module._tickets(q.device, 4096)
    out = ta_module._launch(q, k, v, seq_len, anc, tickets, 128**-0.5, Config(64, 64, 4, 1, 4, 3, 8192, True))
    assert_close(out, tree_attention_ref(q, k, v, seq_len, anc), TOL[dtype], f"half partials {dtype}")


def test_kernel_cases_in_interpreter():
    if KERNEL_HERE:
        pytest.skip("the kernel cases ran in this process")
    run_kernel_cases_in_interpreter(__file__, "kernel and not interpreter")


# ---------------------------------------------------------------------------------------------------------
# Compile and capture
# ---------------------------------------------------------------------------------------------------------


def test_compile_fullgraph():
    if INTERPRETED:
        pytest.skip(
            "torch.compile traces the op body with fake tensors, and an interpreted kernel reads their data "
            "pointers; compiling the Triton path is covered on the GPU"
        )
    q, k, v, seq_len, anc = make_case(2, 3, 2, 32, [17, 130], "tree")
    compiled = torch.compile(tree_attention, fullgraph=True)
    out = compiled(q, k, v, seq_len, anc, num_splits=3 if DEVICE == "cuda" else None)
    assert_close(out, tree_attention_ref(q, k, v, seq_len, anc), TOL[torch.float32], "compiled")


@pytest.mark.gpu
@pytest.mark.parametrize("win", [None, 9])
def test_cuda_graph_replay_follows_seq_len(win):
    anc_kind = "tree" if win is None else "expansion"
    q, k, v, seq_len, anc = make_case(3, 5, 4, 64, [0, 65, 130], anc_kind, dtype=torch.bfloat16, win=win)
    tree_attention(q, k, v, seq_len, anc)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tree_attention(q, k, v, seq_len, anc)
    for lens in ([0, 65, 130], [150, 3, 64]):
        seq_len.copy_(torch.tensor(lens))
        graph.replay()
        assert_close(out, tree_attention_ref(q, k, v, seq_len, anc), TOL[torch.bfloat16], f"replay {lens}")


def test_tuning_env_hook_parses_and_refuses():
    from sglang_specpilot.kernels.tree_attention import Tuning, _tuning_from_env

    assert _tuning_from_env("") == {}
    got = _tuning_from_env("tree=128,64,64,4,3,1.0; decode=16,16,128,4,2,2")
    assert got["tree"] == Tuning(128, 64, block_s=64, num_warps=4, num_stages=3, waves=1.0)
    assert got["decode"].block_s == 128 and got["decode"].waves == 2.0
    # The split rule's two fields are optional: without them, the rule as before it (1 block, 64 splits).
    assert got["tree"].min_split_blocks == 1 and got["tree"].max_splits == 64
    assert _tuning_from_env("tree=64,64,64,4,3,0.5,8,2")["tree"] == ta_module.TUNING["tree"]
    assert _tuning_from_env("tree=64,64,64,4,3,0.5,8")["tree"].max_splits == 64
    with pytest.raises(ValueError, match="unknown regime"):
        _tuning_from_env("tre=1,2,3,4,5,6")
    with pytest.raises(ValueError, match="is not regime="):
        _tuning_from_env("tree=1,2")
    with pytest.raises(ValueError, match="is not regime="):
        _tuning_from_env("tree=64,64,64,4,3,0.5,8,2,1")
