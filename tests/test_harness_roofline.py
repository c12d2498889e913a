import pytest

from sglang_specpilot.harness.roofline import (
    Peaks,
    attention_floor,
    decode_step_floor,
    gemm_floor,
    measure_peaks,
)

H200 = Peaks(hbm_TBps=4.3, bf16_TFLOPs=790.0)


def test_gemv_is_byte_bound():
    f = gemm_floor(1, 4096, 4096, H200)
    assert f.bytes == 4096 * 4096 * 2 + (4096 + 4096) * 2
    assert f.bound == "bytes" and f.time_s == pytest.approx(f.bytes / 4.3e12)
    # W12: 1.5 bytes per weight reads 3/4 of the weight bytes.
    assert gemm_floor(1, 4096, 4096, H200, weight_bytes=1.5).bytes == pytest.approx(4096 * 4096 * 1.5 + 16384)


def test_large_gemm_is_flop_bound():
    f = gemm_floor(8192, 8192, 8192, H200)
    assert f.bound == "flops" and f.time_s == pytest.approx(2 * 8192**3 / 790e12)
    assert f.time_s == max(f.flop_time_s, f.byte_time_s)


def test_attention_floor_counts_kv_once_per_kv_head():
    f = attention_floor(2, 32, 1, 4096, 128, H200, kv_heads=8)
    assert f.flops == 4 * 2 * 32 * 1 * 4096 * 128
    assert f.bytes == 2 * 2 * 8 * 4096 * 128 * 2 + 2 * 2 * 32 * 1 * 128 * 2
    assert f.bound == "bytes"


def test_decode_step_floor():
    f = decode_step_floor(16e9, 1e9, 2 * 8e9, H200)
    assert f.time_s == pytest.approx(17e9 / 4.3e12)
    assert f.to_dict()["bound"] == "bytes"


def test_measure_peaks_on_cpu_with_small_sizes():
    peaks = measure_peaks("cpu", gemv_shape=(256, 2048), gemm_size=128, blocks=3)
    assert peaks.device == "cpu" and peaks.dtype == "float32"
    assert peaks.hbm_TBps > 0 and peaks.bf16_TFLOPs > 0
    assert set(peaks.to_dict()) == {"hbm_TBps", "bf16_TFLOPs", "device", "dtype"}
