"""Launch configurations of the W12 GEMMs: a heuristic, a small candidate list, and an offline-tuned table.

Configs are chosen on the host from static shapes only (M, N, K, the device), never by timing at the
first call: the choice is the same in eager mode, under ``torch.compile`` and inside a CUDA-graph capture,
and nothing is benchmarked while a graph is being recorded. Tuning is offline:
``python benchmarks/w12_gemm.py --tune`` times ``candidates(M)`` on every benchmarked shape and writes
``w12/kernels/tuned/<gpu>.json``, keyed by (view, M bucket, N, K); a shape missing there gets
``default_config``. None of the numbers below is a measurement: the first GPU session has to run the
tuner. They follow the design notes (DEVICE.md, w12-prior-art.md) and the SASS of sm_90 builds made on a
CPU (Triton and its bundled ptxas, as in ``test_kernels_compile_for_sm90``). Hot-loop instructions per
weight, per thread, against a budget of ~11.6 for the exact planes and ~7.8 for the view (issue rate over
weight rate at 4.3 TB/s):

    exact, tensor cores, 64-128 rows x 128-256 K: 4.6-5.0      view8, tensor cores: 3.1-3.5
    exact, fp32 FMA, M = 1, 32 rows x 512 K:      6.0          exact, fp32 FMA, M = 2-4: 7.5-12 (FMA bound)

so the FMA path is the default only at M = 1 (the shape of the earlier H200 probe); the tuner tries both.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton

TUNED_DIR = Path(__file__).with_name("tuned")
DEFAULT_NUM_SMS = 132  # H100 / H200; used off the GPU (the interpreter)
MAX_SPLIT_K = 8
COUNTER_SLOTS = 1024  # split-K counters of one launch (one per tile); W12Linear and the launchers own buffers
FMA_MAX_M = 4  # the fp32 FMA path holds at most 4 rows per tile (M FMAs per weight: past 2 it is FMA bound)
MAX_BLOCK_M = 64


@dataclass(frozen=True)
class GemmConfig:
    """One launch configuration.

    block_n : output rows (weight rows) per program
    block_k : weights along K per loop iteration (a multiple of 64: 16 quads, two asm packs per thread)
    split_k : programs sharing one tile's K range; their fp32 partials are summed in split order by the
        last one to finish (deterministic)
    use_dot : tensor cores (``tl.dot``) instead of fp32 FMAs; needs block_n >= 16
    """

    block_n: int
    block_k: int
    split_k: int = 1
    use_dot: bool = False
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name}={v} must be a power of two")
        if self.block_k < 64:
            raise ValueError(f"block_k={self.block_k} must be >= 64")
        if self.use_dot and self.block_n < 16:
            raise ValueError("tensor-core configs need block_n >= 16")
        if not 1 <= self.split_k <= 64:
            raise ValueError(f"split_k={self.split_k} out of 1..64")

    def block_m(self, M: int) -> int:
        """Activation rows per program: one tile holds all M <= 64 (the weights are read once)."""
        if self.use_dot:
            return min(max(16, triton.next_power_of_2(M)), MAX_BLOCK_M)
        return min(triton.next_power_of_2(M), FMA_MAX_M)

    def to_dict(self) -> dict:
        return asdict(self)

    def op_args(self) -> tuple[int, int, int, bool, int, int]:
        """The fields in the order the ``w12::gemm`` op takes them."""
        return (self.block_n, self.block_k, self.split_k, self.use_dot, self.num_warps, self.num_stages)


def m_bucket(M: int) -> int:
    """The tuning table's M key: the next power of two, at most 64."""
    return min(triton.next_power_of_2(max(M, 1)), MAX_BLOCK_M)


def split_for(tiles: int, k_tiles: int, num_sms: int) -> int:
    """Splits of K so that about two programs per SM stream weights, each with >= 2 K-iterations."""
    if tiles >= 2 * num_sms:
        return 1
    return max(1, min(triton.cdiv(2 * num_sms, tiles), k_tiles // 2, MAX_SPLIT_K))


def default_config(M: int, N: int, K: int, *, view8: bool = False, num_sms: int = DEFAULT_NUM_SMS) -> GemmConfig:
    """The heuristic config for y[M, N] = x[M, K] @ W^T (not tuned; see the module doc)."""
    k_cap = max(64, triton.next_power_of_2(K))
    if M == 1:
        # 32 rows x 512 weights: 24 KB of planes per iteration (16 KB for the view); 162 registers, 3 per SM.
        cfg = GemmConfig(32, min(512, k_cap), use_dot=False, num_warps=4, num_stages=2)
    else:
        # 128 weight rows on the MMA's M side (swap A/B: weights are A, activations B, padded to 16), 8 warps:
        # 76-146 registers from M = 16 to 64; 3 stages of cp.async-staged planes.
        cfg = GemmConfig(128, min(128, k_cap), use_dot=True, num_warps=8, num_stages=3)
    return with_split(cfg, M, N, K, None, num_sms)


def candidates(M: int) -> list[GemmConfig]:
    """The small list the offline tuner times for an M bucket (split_k is re-derived per shape)."""
    dot = [
        GemmConfig(bn, bk, 1, True, nw, st)
        for bn, bk, nw, st in ((64, 128, 4, 3), (128, 128, 8, 3), (64, 256, 4, 2), (128, 256, 8, 2))
    ]
    if M == 1:
        fma = [(32, 512, 4), (16, 512, 4), (64, 256, 8)]
    elif M <= FMA_MAX_M:
        fma = [(16, 256, 4), (32, 256, 4)]  # bigger FMA tiles spill at 4 rows ([32, 4, 128] fp32 partials)
    else:
        fma = []
    return [GemmConfig(bn, bk, 1, False, nw, 2) for bn, bk, nw in fma] + dot


def with_split(cfg: GemmConfig, M: int, N: int, K: int, split_k: int | None, num_sms: int) -> GemmConfig:
    """``cfg`` with ``split_k`` set (None: the heuristic's split for this tile size)."""
    if split_k is None:
        tiles = triton.cdiv(N, cfg.block_n) * triton.cdiv(M, cfg.block_m(M))
        split_k = split_for(tiles, triton.cdiv(K, cfg.block_k), num_sms)
    return GemmConfig(cfg.block_n, cfg.block_k, split_k, cfg.use_dot, cfg.num_warps, cfg.num_stages)


def table_key(M: int, N: int, K: int, view8: bool) -> str:
    return f"{'view8' if view8 else 'exact'}_m{m_bucket(M)}_n{N}_k{K}"


def gpu_file_slug(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"h200"`` (the same rule as the benchmark harness's result files)."""
    words = re.sub(r"\b(nvidia|geforce|tesla)\b", " ", name.lower())
    return re.sub(r"[^a-z0-9]+", "-", words).strip("-") or "unknown"


@functools.lru_cache(maxsize=8)
def tuned_table(device_name: str, section: str = "configs") -> dict:
    """The tuned configs of a device (empty if none were written for it): section "configs" holds the Triton
    quad kernels' ``GemmConfig``, "tc" the tensor-core kernel's ``TcConfig``, "mma" the CUDA kernel's
    ``mma.MmaConfig``."""
    path = TUNED_DIR / f"{gpu_file_slug(device_name)}.json"
    if not path.exists():
        return {}
    if section == "mma":
        from .mma import MmaConfig as cls
    elif section == "tc":
        cls = TcConfig
    else:
        cls = GemmConfig
    raw = json.loads(path.read_text())
    return {key: cls(**cfg) for key, cfg in raw.get(section, {}).items()}


def save_tuned(device_name: str, configs: dict, extra: dict | None = None, section: str = "configs") -> Path:
    """Write (merge into) ``tuned/<gpu>.json``: ``section`` "configs" (Triton GemmConfig) or "mma" (the CUDA
    kernel's MmaConfig); returns its path."""
    TUNED_DIR.mkdir(exist_ok=True)
    path = TUNED_DIR / f"{gpu_file_slug(device_name)}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    merged = {**old.get(section, {}), **{k: c.to_dict() for k, c in configs.items()}}
    path.write_text(json.dumps({**old, **(extra or {}), section: dict(sorted(merged.items()))}, indent=1) + "\n")
    clear_caches()
    return path


def clear_caches() -> None:
    """Forget the tables read so far (after writing one, or when a test points TUNED_DIR elsewhere)."""
    tuned_table.cache_clear()
    _tc_lookup.cache_clear()


@functools.lru_cache(maxsize=16)
def _device_facts(device: torch.device) -> tuple[str, int]:
    if device.type != "cuda":
        return "cpu", DEFAULT_NUM_SMS
    props = torch.cuda.get_device_properties(device)
    return props.name, props.multi_processor_count


def pick_config(M: int, N: int, K: int, device: torch.device, *, view8: bool = False) -> GemmConfig:
    """Tuned config for (view, M bucket, N, K) on this device if there is one, else ``default_config``."""
    name, num_sms = _device_facts(torch.device(device))
    tuned = tuned_table(name).get(table_key(M, N, K, view8))
    return tuned if tuned is not None else default_config(M, N, K, view8=view8, num_sms=num_sms)


# ---------------------------------------------------------------------------------------------------------
# The tensor-core kernel for verify-sized M (gemm_tc.py): formula, candidates, tuned table (nearest shape)
# ---------------------------------------------------------------------------------------------------------

TC_MIN_M = 2  # the launcher sends M >= 2 with an even K to gemm_tc (M = 1 keeps the quad kernel's FMAs)
TC_SMEM_BYTES = 220 * 1024  # of the H100 / H200's 227 KB per SM (the rest: Triton's barriers, the epilogue)
TC_NEAREST_MAX = 2.0  # a tuned tile shape serves untuned shapes up to this factor away in N and in K


@dataclass(frozen=True)
class TcConfig:
    """One launch of ``gemm_tc._w12_tc_kernel``.

    block_n : weight rows per program (the wgmma's 64-row side: 64 per 4 warps)
    block_k : weights along K per step (block_k / 2 pairs of the uint16 hi view)
    split_k : programs sharing a tile's K range (fp32 partials summed in split order; a run-time argument)
    num_warps, num_stages : Triton's; stages >= 3 keep two steps of planes in flight behind the one decoded
    """

    block_n: int = 64
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"{name}={v} must be a power of two")
        if self.block_n < 16 or self.block_k < 32:
            raise ValueError(f"tl.dot needs block_n >= 16 and block_k >= 32, got {self.block_n}, {self.block_k}")
        if not 1 <= self.split_k <= 64:
            raise ValueError(f"split_k={self.split_k} out of 1..64")
        if self.num_stages < 1:
            raise ValueError(f"num_stages={self.num_stages} must be >= 1")

    def block_m(self, M: int) -> int:
        """Activation rows per program: M padded to 16, 32 or 64 (the MMA's N side)."""
        return min(max(16, triton.next_power_of_2(M)), MAX_BLOCK_M)

    def stage_bytes(self, M: int) -> int:
        """Shared memory of one pipeline stage: the planes (1.5 B per weight) and the x tile."""
        return self.block_n * self.block_k * 3 // 2 + self.block_k * self.block_m(M) * 2

    def smem_bytes(self, M: int) -> int:
        """Shared memory of one program: ``num_stages - 1`` stage buffers and x's two MMA operand tiles (the
        sm_90 builds' own figure, exactly, for every candidate at M = 16 and 64)."""
        return max(1, self.num_stages - 1) * self.stage_bytes(M) + self.block_k * self.block_m(M) * 2

    def to_dict(self) -> dict:
        return asdict(self)

    def op_args(self) -> tuple[int, int, int, int, int]:
        """The fields in the order the ``w12::tc_gemm`` op takes them."""
        return (self.block_n, self.block_k, self.split_k, self.num_warps, self.num_stages)

    def with_split(self, split_k: int) -> TcConfig:
        return TcConfig(self.block_n, self.block_k, split_k, self.num_warps, self.num_stages)


def tc_split_for(cfg: TcConfig, M: int, N: int, K: int, num_sms: int = DEFAULT_NUM_SMS) -> int:
    """K splits: the split s in 1..MAX_SPLIT_K (each split >= 2 K-steps) whose busiest SM holds the fewest
    K-steps, ``ceil(tiles s / SMs) / s`` in tiles; within 5% of that, the one whose program count is nearest
    two per SM (bytes in flight: one program keeps only its pipeline's stages in flight). Splits cost little
    at these M (an fp32 partial of M x N each: 1-4% of the weight bytes at N = 4096). E.g. 96 tiles (qkv,
    6144 rows / 64): s = 4, 384 programs, each SM 0.75 of a tile against 1.0 unsplit; 448 tiles (gate_up,
    28672 rows): s = 2, 3.5 tiles per SM against 4 (a 1.7-wave grid). Grids past COUNTER_SLOTS tiles (the
    split-K counters) are not split: at 1024+ tiles the last wave costs < 1/8 anyway."""
    tiles = triton.cdiv(N, cfg.block_n) * triton.cdiv(M, cfg.block_m(M))
    steps = triton.cdiv(K, cfg.block_k)
    if tiles > COUNTER_SLOTS:
        return 1
    options = [s for s in range(1, MAX_SPLIT_K + 1) if s == 1 or steps >= 2 * s]
    load = {s: triton.cdiv(tiles * s, num_sms) / s for s in options}
    best = min(load.values())
    good = [s for s in options if load[s] <= 1.05 * best]
    return min(good, key=lambda s: (abs(tiles * s - 2 * num_sms), s))


def default_tc_config(M: int, N: int, K: int, num_sms: int = DEFAULT_NUM_SMS) -> TcConfig:
    """The formula config (no table): 64 rows per program, 4 warps (one warpgroup on wgmma's 64-row side),
    two programs per SM, split-K by ``tc_split_for``. The tile: 256 weights a K-step with 3 stages, else
    (two programs do not fit, or the split leaves fewer than 4 steps per program: a short loop is mostly
    pipeline fill) 128 with 4 stages.

    Why, measured: one program's K loop is serial (decode, wgmma, a full wgmma wait; sm_90 builds), so only
    a second program per SM overlaps it, and every config that fits one program an SM was the slowest at
    its M in the H100 sweep (w12_xsplit_h100.json, a02a30b, geomean of the 8B's projections at each tile's
    best split): at M = 64, 64 x 256 x 3 stages takes 144 KB (one program) at 0.55x cuBLAS against 0.67x for
    64 x 128 x 4 (100 KB); at M = 16, 3 stages beat 4 (0.98x against 0.94x), and at M = 32, 64 x 256 x 3 was
    the best (0.87x). The H200's tuned table picked the same tiles for those shapes. Before this, the formula
    took 4 stages wherever two programs fit and otherwise 3 stages without checking that two still fit."""
    cfg = None
    for block_k, stages in ((256, 3), (128, 4)):
        tile = TcConfig(64, min(block_k, max(32, triton.next_power_of_2(K))), 1, 4, stages)
        fits = 2 * tile.smem_bytes(M) <= TC_SMEM_BYTES
        if not fits and cfg is not None:
            continue
        cfg = tile.with_split(tc_split_for(tile, M, N, K, num_sms))
        if fits and triton.cdiv(K, tile.block_k) >= 4 * cfg.split_k:
            break
    return cfg


def tc_candidates(M: int) -> list[TcConfig]:
    """Tile shapes the benchmark's sweep times per M bucket (splits are varied around ``tc_split_for``);
    configs whose stages do not fit in shared memory are left out."""
    # sm_90 builds (CPU, ptxas): 64 x 256 x 4 warps 213-255 registers, no spills, 5.6 hot-loop instructions
    # per weight (M = 16); 64 x 128: 118 registers, 5.9; 128 rows x 8 warps: 228-254, 5.4; 64 x 512 spills.
    shapes = [(64, 256, 4, 3), (64, 256, 4, 4), (64, 128, 4, 4), (128, 256, 8, 3), (128, 128, 8, 4)]
    out = [TcConfig(bn, bk, 1, nw, st) for bn, bk, nw, st in shapes]
    return [c for c in out if c.smem_bytes(M) <= TC_SMEM_BYTES]


def tc_bucket(M: int) -> int:
    """The tuned table's M bucket: 1, 8, 16, 32, 64 (M = 2..7 share 8: both pad to 16 rows). Bucket 1 has
    entries only where the sweep found the tensor-core kernel faster than the quad kernel at M = 1."""
    return 1 if M == 1 else max(8, m_bucket(M))


def tc_table_key(M: int, N: int, K: int, view8: bool = False) -> str:
    return f"{'tc8' if view8 else 'tc'}_m{tc_bucket(M)}_n{N}_k{K}"


def nearest_tc(table: dict, M: int, N: int, K: int, view8: bool = False) -> tuple[str, TcConfig] | None:
    """The tuned entry of the same kind and M bucket nearest to (N, K) in log distance, if within
    TC_NEAREST_MAX on both sides; None otherwise."""
    import math

    prefix = f"{'tc8' if view8 else 'tc'}_m{tc_bucket(M)}_"
    best = None
    for key, cfg in table.items():
        if not key.startswith(prefix):
            continue
        n_t, k_t = (int(p[1:]) for p in key[len(prefix) :].split("_"))
        dn, dk = abs(math.log(N / n_t)), abs(math.log(K / k_t))
        if max(dn, dk) > math.log(TC_NEAREST_MAX):
            continue
        if best is None or dn + dk < best[0]:
            best = (dn + dk, key, cfg)
    return None if best is None else (best[1], best[2])


@functools.lru_cache(maxsize=4096)
def _tc_lookup(device_name: str, num_sms: int, M: int, N: int, K: int, view8: bool) -> TcConfig | None:
    # Cached: a launch looks up its config on every eager call (the nearest-shape scan parses every key).
    table = tuned_table(device_name, "tc")
    hit = table.get(tc_table_key(M, N, K, view8))
    if hit is not None:
        return hit
    near = nearest_tc(table, M, N, K, view8)
    if near is not None:
        return near[1].with_split(tc_split_for(near[1], M, N, K, num_sms))
    return None


def tc_tuned_for(M: int, N: int, K: int, device: torch.device, *, view8: bool = False) -> bool:
    """Whether this device's table has an entry for (kind, M bucket, N, K) or a nearest shape."""
    return _tc_lookup(*_device_facts(torch.device(device)), M, N, K, view8) is not None


def pick_tc_config(M: int, N: int, K: int, device: torch.device, *, view8: bool = False) -> TcConfig:
    """The tensor-core kernel's config: the tuned entry for (M bucket, N, K) on this device; else the nearest
    tuned shape's tile with the split re-derived for this shape (``tc_split_for``); else ``default_tc_config``."""
    name, num_sms = _device_facts(torch.device(device))
    found = _tc_lookup(name, num_sms, M, N, K, view8)
    return found if found is not None else default_tc_config(M, N, K, num_sms)
