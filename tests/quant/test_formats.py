"""ingot's FP8 / NVFP4 / MXFP4 emulation against the independent bit-level reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.ir.quant import formats as F
from ingot.ir.quant.packing import pack_e2m1, unpack_e2m1
from tests.quant import reference_formats as R


def hard_values(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Fresh draws over many magnitudes, plus values beyond every range, subnormals and exact ties."""
    x = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-12, 12, (rows, 1)))
    flat = x.reshape(-1)
    n = flat.size
    idx = rng.permutation(n)
    flat[idx[: n // 16]] *= 1e6  # far beyond the range
    flat[idx[n // 16 : n // 8]] = rng.choice([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], n // 8 - n // 16) \
        * rng.choice([-1, 1], n // 8 - n // 16)  # E2M1 midpoints when the scale is 1
    flat[idx[n // 8 : n // 6]] = rng.choice([2.0**-7, 2.0**-8, 3 * 2.0**-9, 2.0**-10], n // 6 - n // 8)
    return x.astype(np.float32)


def test_decode_tables_match_the_definitions():
    assert [R.decode_e2m1(c) for c in range(8)] == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert R.decode_e4m3(0x7E) == 448 and R.decode_e4m3(0x01) == 2.0**-9 and np.isnan(R.decode_e4m3(0x7F))


def test_e2m1_and_e4m3_casts_round_to_nearest_even_and_saturate():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(4000) * 4, rng.standard_normal(1000) * 600,
                        np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -5.0, 1e9, -1e9])]).astype(np.float32)
    got4 = F.to_e2m1(x).astype(np.float64)
    got8 = F.to_e4m3(x).astype(np.float64)
    assert np.array_equal(got4, [R.e2m1(float(v)) for v in x])
    assert np.array_equal(got8, [R.e4m3(float(v)) for v in x])
    # exact E4M3 ties: midpoints between neighbours go to the even code
    mids = [(R.E4M3[0][i] + R.E4M3[0][i + 1]) / 2 for i in range(len(R.E4M3[0]) - 1)]
    assert np.array_equal(F.to_e4m3(np.array(mids, np.float32)).astype(np.float64), [R.e4m3(m) for m in mids])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nvfp4_matches_reference(seed):
    rng = np.random.default_rng(seed)
    x = hard_values(rng, 8, 64)
    gs = F.nvfp4_global_scale(np.float32(np.abs(x).max() / 50))  # a calibrated scale smaller than amax: saturation
    q, sf = F.quantize_nvfp4(x, gs)
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 16):
            vals, scale = R.nvfp4_block([float(v) for v in x[r, b * 16 : (b + 1) * 16]], float(gs))
            assert float(sf[r, b]) == scale
            assert np.array_equal(q[r, b * 16 : (b + 1) * 16].astype(np.float64), vals), (r, b)
    y = F.dequantize_nvfp4(q, sf, gs)
    expect = np.repeat(sf.astype(np.float32), 16, axis=1) * q.astype(np.float32) * np.float32(gs)
    assert np.array_equal(y, expect)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mxfp4_matches_reference(seed):
    rng = np.random.default_rng(seed)
    x = hard_values(rng, 8, 64)
    x[0, :32] = 0.0  # an all-zero block
    x[1, :32] = np.float32(1e-40)  # float32 subnormals
    q, sc = F.quantize_mxfp4(x)
    for r in range(x.shape[0]):
        for b in range(2):
            vals, code = R.mxfp4_block([float(v) for v in x[r, b * 32 : (b + 1) * 32]])
            assert int(sc.view(np.uint8)[r, b]) == code
            assert np.array_equal(q[r, b * 32 : (b + 1) * 32].astype(np.float64), vals), (r, b)
    y = F.dequantize_mxfp4(q, sc)
    assert np.array_equal(y, q.astype(np.float32) * np.repeat(np.ldexp(np.float32(1), sc.view(np.uint8).astype(
        np.int32) - 127), 32, axis=1))


@pytest.mark.parametrize("granularity", ["tensor", "channel", "block"])
def test_fp8_weights_match_reference(granularity):
    rng = np.random.default_rng(3)
    w = hard_values(rng, 130, 200)
    q, s = F.quantize_fp8(w, granularity)
    se = F.expand_fp8_scale(s, w.shape, granularity)
    want = [R.e4m3(float(np.float32(v) / np.float32(d))) for v, d in zip(w.reshape(-1), np.broadcast_to(se, w.shape)
                                                                           .reshape(-1))]
    assert np.array_equal(q.astype(np.float64).reshape(-1), want)
    assert np.abs(q.astype(np.float32)).max() <= 448


def test_per_token_fp8_scales():
    rng = np.random.default_rng(4)
    x = hard_values(rng, 6, 48)
    q, s = F.quantize_fp8_per_token(x)
    assert np.array_equal(s[:, 0], (np.abs(x).max(axis=1) / np.float32(448)).astype(np.float32))
    assert np.abs(q.astype(np.float32)).max(axis=1).tolist() == [448.0] * 6


def test_e2m1_packing_low_nibble_first():
    vals = np.array([[0.5, -6.0, 1.0, 0.0]], ml_dtypes.float4_e2m1fn)
    packed = pack_e2m1(vals)
    assert packed.tolist() == [[0x1 | (0xF << 4), 0x2]]  # 0.5 = 0b0001, -6 = 0b1111, 1.0 = 0b0010
    rng = np.random.default_rng(5)
    q = F.to_e2m1(rng.standard_normal((7, 64)).astype(np.float32) * 3)
    assert np.array_equal(unpack_e2m1(pack_e2m1(q)).view(np.uint8), q.view(np.uint8) & 0xF)
