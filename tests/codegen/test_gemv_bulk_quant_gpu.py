"""The bulk-copy decode GEMV with FP8 weights (``codegen/kernels/gemv/bulk.cu``, ``WB`` 1: weight-only
``quantized_linear``, e4m3 weights with per-output-channel f32 scales, bf16 x) against numpy on the GPU (``-m gpu``;
skipped without one).

The reference dequantizes the stored codes exactly (ml_dtypes' float8_e4m3fn) and multiplies in float64. Weights
quantized by ``ir/quant/formats.py`` with saturated rows and tiny (subnormal-code) rows (test_gemv_quant_gpu.py's
``quantized_weight``); the 1B model's shapes and odd ones (N off the tile, K off the slice: the last slice's short
last stage), token counts from 1 to the bucket, bias and residual epilogues, outputs allocated for the whole bucket
and poisoned (rows past M must stay so), each launch done twice (the split-K counter must be reset by the first)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.gemv.bulk_rule import bulk_config, bulk_quant_spec
from tests.codegen.common import check_gemv, gpu_target
from tests.codegen.test_gemv_quant_gpu import activations, quantized_weight
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16
TOL = 1e-2  # max |error| / max |reference|, as the other GEMV tests


@pytest.mark.parametrize("n,k,mb,ms", [
    (3072, 2048, 8, (1, 3, 8)), (2048, 2048, 16, (9, 16)), (16384, 2048, 8, (1,)), (2048, 8192, 32, (1, 17, 32)),
    (128256, 2048, 8, (2,)), (200, 128, 64, (1, 33, 64)), (1000, 4160, 16, (5, 16)), (1000, 4160, 32, (2, 32)),
    (576, 576, 8, (2,)), (3072, 2048, 64, (1, 40, 64)),
])
@pytest.mark.parametrize("epilogue", ["plain", "bias+residual"])
def test_bulk_fp8_gemv_matches_numpy(gpu, n, k, mb, ms, epilogue):
    r = rng()
    tgt = gpu_target(gpu)
    has = epilogue != "plain"
    spec = bulk_quant_spec(n, k, mb, tgt, bias=has, residual=has)
    assert spec is not None, bulk_config(n, k, mb, tgt.num_sms or 132, wb=1)
    wq = quantized_weight(r, "fp8", n, k)
    codes, scale = np.ascontiguousarray(wq["weight"]), np.asarray(wq["weight_scale"], np.float32)
    assert codes.dtype == ml_dtypes.float8_e4m3fn and scale.shape == (n,)
    w = codes.astype(np.float64) * scale.astype(np.float64)[:, None]  # exact: every e4m3 value is a float64
    weights = {"weight": gpu.upload(codes.view(np.uint8)), "weight_scale": gpu.upload(scale), "weight_scale_2": None,
               "input_scale": None}
    bias = (r.standard_normal(n) * 0.1).astype(BF16)
    check_gemv(gpu, spec, ms, w, weights, bias if has else None,
               lambda m: (activations(r, m, k), r.standard_normal((m, n)).astype(BF16)), whole_bucket=True, tol=TOL)
