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
    kernels' ``GemmConfig``, "mma" the CUDA kernel's ``mma.MmaConfig``."""
    path = TUNED_DIR / f"{gpu_file_slug(device_name)}.json"
    if not path.exists():
        return {}
    if section == "mma":
        from .mma import MmaConfig as cls
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
    tuned_table.cache_clear()
    return path


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
