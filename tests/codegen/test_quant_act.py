"""The activation quantizer of W4A4 linears on b200 (``codegen/kernels/quant_act``) without a GPU: it compiles for
sm_90a and sm_100a without local memory; its numpy form (``layout.py``, what the GPU test compares the kernel's
bytes with) is ``quantize_activation``'s result in the layout ``pack-sm100`` gives the weights; the kernel's
E2M1 rounding and scale offsets, transcribed to numpy, agree with ml_dtypes and ``swizzle_sm100_scales``; and
a block-scaled GEMM over those operands, with the per-row scale in its epilogue, is ``quantized_linear``'s
reference. The kernel itself runs in ``test_quant_act_gpu.py``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.quant_act.layout import quantize_for_sm100
from ingot.codegen.kernels.quant_act.rule import quantizer_spec, scale_cols
from ingot.codegen.target import get_target
from ingot.ir.ops.quantized import QuantizedLinear, quantize_activation
from ingot.ir.quant import formats as F
from ingot.ir.quant.packing import (
    pack_e2m1,
    sm100_scale_offset,
    swizzle_sm100_scales,
    unpack_e2m1,
    unswizzle_sm100_scales,
)
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    module_kernel_cache,
    needs_compiler,
    sass_opcodes,
)
from tests.helpers import rng

#: (format, static global scale)
CASES = [("nvfp4", True), ("nvfp4", False), ("mxfp4", False)]


def _x(r: np.random.Generator, m: int, k: int) -> np.ndarray:
    """bf16-valued activations with a spread of block magnitudes (some blocks tiny, one row all zero)."""
    x = r.standard_normal((m, k)).astype(np.float32) * np.exp2(r.integers(-6, 4, (m, k // 16)).repeat(16, axis=1))
    if m > 2:
        x[2] = 0
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def quantize_fp4_weight(w: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``w`` as a W4A4 linear's operands (``fmt`` nvfp4 or mxfp4): packed E2M1 codes, sm100-swizzled block scales
    and the NVFP4 global scale (None for MXFP4)."""
    if fmt == "nvfp4":
        ws2 = F.nvfp4_global_scale(np.abs(w).max())
        qw, sfw = F.quantize_nvfp4(w, ws2)
    else:
        ws2, (qw, sfw) = None, F.quantize_mxfp4(w)
    return pack_e2m1(qw), swizzle_sm100_scales(sfw), ws2


def _dequant(x_fp4: np.ndarray, sf: np.ndarray, fmt: str, m: int, k: int) -> np.ndarray:
    vec = 16 if fmt == "nvfp4" else 32
    q = unpack_e2m1(x_fp4).astype(np.float32)
    scales = unswizzle_sm100_scales(sf, m, k // vec)
    s = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32) if fmt == "nvfp4" else F.e8m0_to_f32(scales)
    return (q.reshape(m, k // vec, vec) * s[..., None]).reshape(m, k)


@pytest.mark.parametrize("fmt,static", CASES)
@pytest.mark.parametrize("m,k", [(1, 128), (37, 480), (130, 256)])
def test_numpy_layout_is_the_reference_quantization(fmt, static, m, k):
    r = rng()
    x = _x(r, m, k)
    input_scale = np.float32(np.abs(x).max() / 2688 * 0.8) if static else None  # a calibrated clip: some saturate
    ws2 = np.float32(0.0123)
    x_fp4, sf, x_scale = quantize_for_sm100(x, fmt, input_scale, ws2 if fmt == "nvfp4" else None)
    assert x_fp4.shape == (m, k // 2) and x_fp4.dtype == np.uint8
    rows = -(-m // 128) * 128
    assert sf.shape == (rows, scale_cols(fmt, k)) and sf.dtype == np.uint8
    vec = 16 if fmt == "nvfp4" else 32
    # padding (rows past m, scale columns past K / vec) is zero
    full = unswizzle_sm100_scales(sf, rows, sf.shape[1])
    assert not full[m:].any() and not full[:, k // vec:].any()
    # dequantized (times the activation global scale) it is quantize_activation's result
    ref = quantize_activation(fmt, "tensor" if static else "token", x, input_scale)
    got = _dequant(x_fp4, sf, fmt, m, k)
    if fmt == "nvfp4":
        assert x_scale is not None and x_scale.shape == (m,) and x_scale.dtype == np.float32
        gs_ref = (np.full((m,), input_scale, np.float32) if static
                  else F.nvfp4_global_scale(np.abs(x).max(axis=-1)))
        np.testing.assert_array_equal(x_scale, (gs_ref * ws2).astype(np.float32))
        got = (got * gs_ref[:, None]).astype(np.float32)
    else:
        assert x_scale is None
    np.testing.assert_array_equal(got, ref)


def test_kernel_scale_offsets_are_the_swizzle():
    """kernel.cu's sf_offset is packing.py's sm100_scale_offset; scattering by it gives swizzle_sm100_scales."""
    r = rng()
    for rows, cols in [(1, 2), (37, 30), (130, 8), (256, 15)]:
        sf = r.integers(1, 255, (rows, cols)).astype(np.uint8)
        out = np.zeros(-(-rows // 128) * 128 * (-(-cols // 4) * 4), np.uint8)
        for i in range(rows):
            for j in range(cols):
                off = ((i >> 7) * (-(-cols // 4)) + (j >> 2)) * 512 + (i & 31) * 16 + ((i & 127) >> 5) * 4 + (j & 3)
                assert off == sm100_scale_offset(i, j, cols)
                out[off] = sf[i, j]
        np.testing.assert_array_equal(out, swizzle_sm100_scales(sf).reshape(-1))


def _e2m1_code(v: np.ndarray) -> np.ndarray:
    """kernel.cu's e2m1_code, in numpy."""
    a = np.abs(v)
    c = np.select([a <= 0.25, a < 0.75, a <= 1.25, a < 1.75, a <= 2.5, a < 3.5, a <= 5.0], [0, 1, 2, 3, 4, 5, 6], 7)
    return (np.signbit(v).astype(np.uint8) << 3) | c.astype(np.uint8)


def test_kernel_e2m1_rounding_is_ml_dtypes():
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    ties = (grid[:-1] + grid[1:]) / 2
    v = np.concatenate([grid, ties, np.nextafter(ties, 0), np.nextafter(ties, 10), [7.0, 100.0, 1e-30, 5.9999]])
    v = np.concatenate([v, -v, rng().uniform(-8, 8, 10000).astype(np.float32)]).astype(np.float32)
    want = F.to_e2m1(v).view(np.uint8)
    np.testing.assert_array_equal(_e2m1_code(v), want)


@pytest.mark.parametrize("fmt,static", CASES)
def test_block_scaled_gemm_with_row_scale_is_the_reference(fmt, static):
    """What the lowering computes, emulated: out = x_scale[m] * (dequant(x) @ dequant(w).T) + bias + residual,
    over the quantizer's operands and the pack-sm100 weights, equals quantized_linear's reference."""
    r = rng()
    m, n, k = 45, 96, 256
    x = _x(r, m, k)
    w = r.standard_normal((n, k)).astype(np.float32) / 16
    weight, weight_scale, ws2 = quantize_fp4_weight(w, fmt)
    input_scale = np.float32(np.abs(x).max() / 2688) if static else None
    bias, residual = r.standard_normal(n).astype(np.float32), r.standard_normal((m, n)).astype(np.float32)
    op = QuantizedLinear(weight_format=fmt, weight_granularity="block", act_format=fmt,
                         act_granularity="tensor" if static else "token", scale_layout="sm100", in_features=k)
    ref = op.ref(x, weight, weight_scale, ws2, input_scale, bias, residual)
    x_fp4, sf, x_scale = quantize_for_sm100(x, fmt, input_scale, ws2)
    a = _dequant(x_fp4, sf, fmt, m, k)
    b = _dequant(weight, weight_scale.view(np.uint8), fmt, n, k)
    acc = a.astype(np.float64) @ b.astype(np.float64).T
    out = acc * (x_scale[:, None] if x_scale is not None else 1) + bias + residual
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("fmt,static", CASES)
def test_compiles_without_spills(target, fmt, static):
    tgt = get_target(target)
    spec = quantizer_spec(fmt, 480, tgt, static)
    assert [p.name for p in spec.params] == ["x", "input_scale", "weight_scale_2", "x_fp4", "x_block_scale",
                                             "x_scale", "M"]
    assert spec.grid_dims({"M": 300}) == (128, 3, 1)  # every row of the 128-padded scale matrix
    assert_no_local_memory(sass_opcodes(spec, tgt.arch), spec.entry)


def test_spec_checks_its_inputs():
    b200 = get_target("b200")
    with pytest.raises(ValueError, match="multiple of 32"):
        quantizer_spec("nvfp4", 48, b200, True)
    with pytest.raises(ValueError, match="no static scale"):
        quantizer_spec("mxfp4", 64, b200, True)
    assert scale_cols("nvfp4", 480) == 32 and scale_cols("mxfp4", 480) == 16 and scale_cols("nvfp4", 128) == 8
