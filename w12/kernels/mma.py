"""The CUDA C++ W12 GEMM (``csrc/w12_mma.cu``): decode straight into tensor-core fragments, K % 64 == 0.

Why it exists beside the Triton kernels: see the .cu file's header (Triton's layout exchange between the
decode and the MMA cost 2-3x at M = 32 on the H200). Same contract as ``gemm.w12_gemm``: exact weights,
escapes in the epilogue, fp32 accumulation, output within ``gemm.gemm_tolerance`` of decode-then-matmul.

Build. The kernel needs no torch headers, so it is compiled by ``nvcc`` alone into a small shared library
(about 10 s, against about a minute for a torch extension) and called through ctypes on torch's current
stream; the library is cached under ``~/.cache/specpilot`` keyed by a hash of the source and the GPU
architecture. ``torch.library.custom_op`` wraps the call, so ``torch.compile`` treats it as one opaque op
and CUDA graphs capture its launch. Where nvcc or a GPU of compute capability >= 8.0 is missing,
``available()`` is False and the launchers use the Triton kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("csrc") / "w12_mma.cu"
CACHE_DIR = Path(os.path.expanduser("~")) / ".cache" / "specpilot"
MAX_NT = 8  # activation tiles of 8 rows per CTA (M <= 64 in one CTA; grid.z takes the rest)
TARGET_WARPS_PER_SM = 16  # resident warps to keep weight loads in flight (Little's law, ~40 KB per SM)


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class MmaConfig:
    """Launch shape of the CUDA kernel.

    rows_per_warp : 16 or 32 weight rows per CTA (every warp of the CTA works on the same rows)
    warps : warps per CTA; they share the CTA's K range round-robin, 64 weights at a time
    splits : CTAs along K (fp32 partials, summed in split order by the last to arrive); 0 = heuristic
    """

    rows_per_warp: int = 16
    warps: int = 8
    splits: int = 0

    def __post_init__(self) -> None:
        if self.rows_per_warp not in (16, 32):
            raise ValueError(f"rows_per_warp={self.rows_per_warp}: 16 or 32")
        if not 1 <= self.warps <= 8:
            raise ValueError(f"warps={self.warps}: 1..8")
        if not 0 <= self.splits <= 64:
            raise ValueError(f"splits={self.splits}: 0..64")

    def to_dict(self) -> dict:
        return asdict(self)


def nt_for(M: int) -> int:
    """Activation tiles of 8 rows per CTA: the next power of two of ceil(M / 8), at most 8."""
    tiles = (M + 7) // 8
    nt = 1
    while nt < tiles and nt < MAX_NT:
        nt *= 2
    return nt


def splits_for(M: int, N: int, K: int, cfg: MmaConfig, num_sms: int) -> int:
    """K splits so that about TARGET_WARPS_PER_SM warps per SM stream weights, each over >= 2 steps."""
    if cfg.splits:
        return cfg.splits
    blocks = -(-N // cfg.rows_per_warp) * -(-M // (8 * nt_for(M)))
    want = -(-(TARGET_WARPS_PER_SM * num_sms) // (blocks * cfg.warps))
    most = max(1, K // (128 * cfg.warps))
    return max(1, min(want, most, 16))


DEFAULT_CONFIG = MmaConfig(16, 8, 0)


@functools.lru_cache(maxsize=8)
def tuned_mma_table(device_name: str) -> dict[str, MmaConfig]:
    """The tuned CUDA-kernel configs of a device: the ``"mma"`` section of ``tuned/<gpu>.json``."""
    from .config import TUNED_DIR, gpu_file_slug

    path = TUNED_DIR / f"{gpu_file_slug(device_name)}.json"
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {key: MmaConfig(**cfg) for key, cfg in raw.get("mma", {}).items()}


def pick_mma_config(M: int, N: int, K: int, device: torch.device, view8: bool) -> MmaConfig:
    """Tuned config for (view, M bucket, N, K) on this device if there is one, else ``DEFAULT_CONFIG``."""
    from .config import table_key

    name = torch.cuda.get_device_name(device)
    return tuned_mma_table(name).get(table_key(M, N, K, view8), DEFAULT_CONFIG)


def _arch_flags(device: torch.device) -> tuple[str, list[str]]:
    major, minor = torch.cuda.get_device_capability(device)
    arch = f"{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")
    return arch, [f"-gencode=arch=compute_{arch},code=sm_{arch}"]


def build(arch_flags: list[str], out: Path, nvcc: str | None = None) -> Path:
    """Compile the .cu into a shared library at ``out`` (atomic rename; raises BuildError with nvcc's log)."""
    nvcc = nvcc or shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin/nvcc")
    if not os.path.exists(nvcc):
        raise BuildError("nvcc not found (PATH or CUDA_HOME): the CUDA W12 GEMM cannot be built")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = [nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", *arch_flags, "-o", str(tmp), str(SOURCE)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"nvcc failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
    os.replace(tmp, out)
    return out


@functools.lru_cache(maxsize=4)
def _library(arch: str) -> ctypes.CDLL:
    flags = [f"-gencode=arch=compute_{arch},code=sm_{arch}"]
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    path = CACHE_DIR / f"w12_mma_sm{arch}_{digest}.so"
    if not path.exists():
        build(flags, path)
    lib = ctypes.CDLL(str(path))
    fn = lib.w12_mma_gemm
    fn.argtypes = [ctypes.c_void_p] * 11 + [ctypes.c_int] * 10 + [ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return lib


@functools.lru_cache(maxsize=8)
def available(device: torch.device | str = "cuda") -> bool:
    """True if the CUDA kernel can run on ``device`` (a GPU of capability >= 8.0 and a working nvcc)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability(device)[0] < 8:
        return False
    try:
        _library(_arch_flags(device)[0])
    except (BuildError, OSError):
        return False
    return True


@torch.compiler.assume_constant_result
def usable(device: torch.device) -> bool:
    """``available(device)`` as a constant for torch.compile (traced code calls it once, at trace time)."""
    return available(device)


@functools.lru_cache(maxsize=8)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


@torch.library.custom_op("w12::mma_gemm", mutates_args=("counters",))
def _mma_gemm_op(
    x: torch.Tensor,
    hi: torch.Tensor,
    lo: torch.Tensor,
    base: torch.Tensor,
    esc_idx: torch.Tensor,
    esc_val: torch.Tensor,
    esc_row_ptr: torch.Tensor,
    bias: torch.Tensor | None,
    counters: torch.Tensor,
    view8: bool,
    rows_per_warp: int,
    warps: int,
    splits: int,
) -> torch.Tensor:
    M, K = x.shape
    N = hi.shape[0]
    lib = _library(_arch_flags(x.device)[0])
    x, hi, lo = _aligned(x, 8, 16), _aligned(hi, 16, 16), _aligned(lo, 8, 8)
    if rows_per_warp == 0:  # pick here, from static shapes (this body runs eagerly, never traced)
        cfg = pick_mma_config(M, N, K, x.device, view8)
    else:
        cfg = MmaConfig(rows_per_warp, warps, splits)
    rows_per_warp, warps = cfg.rows_per_warp, cfg.warps
    nt = nt_for(M)
    s = splits_for(M, N, K, cfg, _num_sms(x.device.index or 0))
    y = torch.empty((M, N), device=x.device, dtype=torch.bfloat16)
    if s > 1:
        blocks = -(-N // rows_per_warp) * -(-M // (8 * nt))
        assert counters.numel() >= blocks, f"split-K needs {blocks} counters, got {counters.numel()}"
        part = torch.empty((s, M, N), device=x.device, dtype=torch.float32)
    else:
        part = None
    bias32 = None if bias is None else bias.float().contiguous()
    err = lib.w12_mma_gemm(
        _ptr(x), _ptr(hi), _ptr(lo), _ptr(base), _ptr(esc_idx), _ptr(esc_val), _ptr(esc_row_ptr), _ptr(bias32),
        _ptr(y), _ptr(part), _ptr(counters),
        M, N, K, x.stride(0), y.stride(0), nt, rows_per_warp, s, warps, int(view8),
        torch.cuda.current_stream(x.device).cuda_stream,
    )  # fmt: skip
    if err != 0:
        raise RuntimeError(f"w12_mma_gemm launch failed: cudaError {err}")
    return y


@_mma_gemm_op.register_fake
def _(x, hi, lo, base, esc_idx, esc_val, esc_row_ptr, bias, counters, view8, rows_per_warp, warps, splits):
    return x.new_empty((x.shape[0], hi.shape[0]))


def supports(K: int) -> bool:
    """Shapes the CUDA kernel takes: K % 64 == 0 (alignment is fixed inside the op, by copying)."""
    return K % 64 == 0


def _aligned(t: torch.Tensor, row_elems: int, align: int) -> torch.Tensor:
    # 16-byte vector loads need aligned rows; a fresh allocation is (the caching allocator aligns to 512).
    ok = t.data_ptr() % align == 0 and (t.dim() < 2 or t.stride(0) % row_elems == 0) and t.stride(-1) == 1
    return t if ok else t.contiguous().clone()


def mma_gemm(
    x2: torch.Tensor,
    hi: torch.Tensor,
    lo: torch.Tensor,
    base: torch.Tensor,
    esc_idx: torch.Tensor,
    esc_val: torch.Tensor,
    esc_row_ptr: torch.Tensor,
    bias: torch.Tensor | None,
    counters: torch.Tensor,
    view8: bool,
    config: MmaConfig | None = None,
) -> torch.Tensor:
    """``x2 [M, K] @ W^T`` for 2-D bf16 x2 with unit stride along K (the checks are the caller's, gemm.launch)."""
    c = (0, 0, 0) if config is None else (config.rows_per_warp, config.warps, config.splits)
    return _mma_gemm_op(x2, hi, lo, base, esc_idx, esc_val, esc_row_ptr, bias, counters, view8, *c)
