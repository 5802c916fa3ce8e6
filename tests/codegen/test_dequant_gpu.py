"""The prefill dequantize kernel (``codegen/kernels/dequant``) on the GPU (``-m gpu``; skipped without one).

Its output must equal its numpy model ``dequant_reference`` bit for bit (every value is exact: no tolerance): FP8
and NVFP4 weights quantized by ``ir/quant/formats.py`` with saturated codes, subnormal scales and an all-zero block,
the scratch poisoned first (every element must be written), shapes whose chunk count is below, at and above the
grid's threads. Then the pair as the prefill path launches it: the template GEMM (``codegen/kernels/gemm/mma.cu``,
bf16 weights with the per-channel scale, as a bf16 linear's alternative) reading the scratch, against
``quantized_linear``'s reference, within the quantized GEMV's own test bound (bf16 output rounding plus f32
summation order).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.dequant.rule import dequant_reference, dequant_spec
from ingot.codegen.kernels.gemm.rule import linear_spec
from ingot.codegen.target import get_target
from ingot.ir.ops.quantized import QuantizedLinear
from ingot.ir.types import DType
from tests.codegen.test_gemv_quant_gpu import TOL, activations, quantized_weight
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16
#: (N, K): the 1B model's gate_up and down, small and odd ones (grids of one CTA to the 8-per-SM cap)
SHAPES = [(16384, 2048), (2048, 8192), (200, 256), (1000, 4224), (16, 128)]


def _u8(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def _dequantize(gpu, fmt: str, wq: dict, n: int, k: int):
    tgt = get_target("h200" if gpu.arch == "sm_90a" else "b200")
    spec = dequant_spec(fmt, n, k, tgt)
    s2 = wq["weight_scale_2"]
    weight, scale = gpu.upload(_u8(wq["weight"])), gpu.upload(
        wq["weight_scale"] if wq["weight_scale"].dtype == np.float32 else _u8(wq["weight_scale"]))
    scale_2 = gpu.upload(np.asarray(s2, np.float32).reshape(1)) if s2 is not None else None
    out = gpu.alloc((n, k), BF16)  # poisoned: 0xFFFF is a bf16 NaN
    out_scale = gpu.alloc((n,), np.float32) if fmt == "nvfp4" else None
    gpu.launch(spec, weight=weight, weight_scale=scale, weight_scale_2=scale_2, out=out, out_scale=out_scale, M=4096)
    return out, out_scale, scale


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("n,k", SHAPES)
def test_dequant_matches_numpy_bitwise(gpu, fmt, n, k):
    wq = quantized_weight(rng(), fmt, n, k)
    want, column = dequant_reference(fmt, wq["weight"], wq["weight_scale"], wq["weight_scale_2"])
    out, out_scale, _ = _dequantize(gpu, fmt, wq, n, k)
    got = gpu.download(out)
    bad = np.argwhere(got.view(np.uint16) != want.view(np.uint16))
    assert bad.size == 0, f"{len(bad)} values differ, first at {bad[0].tolist()}: {got[tuple(bad[0])]} != " \
                          f"{want[tuple(bad[0])]}"
    if out_scale is not None:
        assert np.array_equal(gpu.download(out_scale).view(np.uint32), column.view(np.uint32))


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("m", [65, 300])
def test_dequant_then_template_gemm_matches_quantized_linear(gpu, fmt, m):
    r = rng()
    n, k = 1000, 4224
    tgt = get_target("h200" if gpu.arch == "sm_90a" else "b200")
    wq = quantized_weight(r, fmt, n, k)
    out, out_scale, scale = _dequantize(gpu, fmt, wq, n, k)
    op = QuantizedLinear(weight_format=fmt, weight_granularity="channel", in_features=k)
    x = activations(r, m, k)
    bias = (r.standard_normal(n) * 0.1).astype(BF16)
    res = r.standard_normal((m, n)).astype(BF16)
    ref = op.ref(x, wq["weight"], wq["weight_scale"], wq["weight_scale_2"], None, bias, res).astype(np.float64)
    spec = linear_spec(DType.bf16, DType.bf16, n, k, tgt, bias=True, residual=True, weight_scale=True)
    y = gpu.alloc((m, n), BF16)
    gpu.launch(spec, x=gpu.upload(x), weight=out, weight_scale=out_scale if out_scale is not None else scale,
               bias=gpu.upload(bias), residual=gpu.upload(res), out=y, M=m)
    got = gpu.download(y).astype(np.float64)
    assert np.isfinite(got).all()
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < TOL, f"{fmt} M={m}: relative error {err:.2e}"
