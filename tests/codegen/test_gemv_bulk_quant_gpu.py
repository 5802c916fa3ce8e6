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
from ingot.codegen.target import get_target
from tests.codegen.test_gemv_quant_gpu import activations, quantized_weight
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16
TOL = 1e-2  # max |error| / max |reference|, as the other GEMV tests


def _target(gpu):
    return get_target("h200" if gpu.arch == "sm_90a" else "b200")


@pytest.mark.parametrize("n,k,mb,ms", [
    (3072, 2048, 8, (1, 3, 8)), (2048, 2048, 16, (9, 16)), (16384, 2048, 8, (1,)), (2048, 8192, 32, (1, 17, 32)),
    (128256, 2048, 8, (2,)), (200, 128, 64, (1, 33, 64)), (1000, 4160, 16, (5, 16)), (1000, 4160, 32, (2, 32)),
    (576, 576, 8, (2,)), (3072, 2048, 64, (1, 40, 64)),
])
@pytest.mark.parametrize("epilogue", ["plain", "bias+residual"])
def test_bulk_fp8_gemv_matches_numpy(gpu, n, k, mb, ms, epilogue):
    r = rng()
    tgt = _target(gpu)
    has = epilogue != "plain"
    spec = bulk_quant_spec(n, k, mb, tgt, bias=has, residual=has)
    assert spec is not None, bulk_config(n, k, mb, tgt.num_sms or 132, wb=1)
    wq = quantized_weight(r, "fp8", n, k)
    codes, scale = np.ascontiguousarray(wq["weight"]), np.asarray(wq["weight_scale"], np.float32)
    assert codes.dtype == ml_dtypes.float8_e4m3fn and scale.shape == (n,)
    w = codes.astype(np.float64) * scale.astype(np.float64)[:, None]  # exact: every e4m3 value is a float64
    wd, sd = gpu.upload(codes.view(np.uint8)), gpu.upload(scale)
    bias = (r.standard_normal(n) * 0.1).astype(BF16)
    bd = gpu.upload(bias) if has else None
    for m in ms:
        x = activations(r, m, k)
        res = r.standard_normal((m, n)).astype(BF16)
        ref = x.astype(np.float64) @ w.T
        if has:
            ref = ref + bias.astype(np.float64) + res.astype(np.float64)
        xd, rd = gpu.upload(x), gpu.upload(res)
        for attempt in range(2):
            out = gpu.alloc((mb, n), BF16)  # poisoned (0xFF: NaN); rows M.. of the bucket must stay so
            gpu.launch(spec, x=xd, weight=wd, weight_scale=sd, weight_scale_2=None, input_scale=None, bias=bd,
                       residual=rd if has else None, out=out, M=m)
            full = gpu.download(out)
            assert (full[m:].view(np.uint16) == 0xFFFF).all(), f"M={m} launch {attempt}: rows past M written"
            got = full[:m].astype(np.float64)
            assert np.isfinite(got).all(), f"M={m} launch {attempt}: unwritten or non-finite outputs"
            err = np.abs(got - ref).max() / np.abs(ref).max()
            assert err < TOL, f"{n}x{k} MB={mb} M={m} launch {attempt}: relative error {err:.2e} ({spec.doc})"
