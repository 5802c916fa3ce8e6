"""The FP8 activation quantizer (``codegen/kernels/quant_act/fp8.cu``) and the W8A8 prefill pair on a GPU (``-m gpu``).

1. Its codes and row scales are ``ir/quant/formats.py``'s bit for bit (``quantize_fp8_per_token``, or
   ``quantize_fp8_static`` with the calibrated scale: what ``quantize_activation`` computes for the op's reference):
   activations with per-token outliers, an all-zero row (scale 1), a static scale small enough that codes saturate at
   448, rows below, at and past one 16-byte chunk per thread; the outputs poisoned before the launch.
2. The pair as a W8A8 prefill step launches it (``codegen/quant_prefill.py``): the quantizer, then the shape-generic
   FP8 CUTLASS GEMM (``cutlass_params.generic_linear_spec("fp8")``, its Params built in Python as the CUDA backend
   does) reading its codes and scales with the weight's per-channel scale, bias and residual, against
   ``quantized_linear``'s reference (W8A8, per token and static), within the quantized GEMV's bound (bf16 output
   rounding and f32 summation order: the quantized operands are the reference's exactly).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.quant_act.rule import fp8_quantizer_spec
from ingot.ir.ops.quantized import QuantizedLinear
from ingot.ir.quant import formats as F
from tests.codegen.common import gpu_target
from tests.codegen.test_gemv_quant_gpu import TOL, activations, quantized_weight
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16


def _x(r: np.random.Generator, m: int, k: int) -> np.ndarray:
    x = activations(r, m, k).astype(np.float32)
    x *= np.exp2(r.integers(-6, 6, (m, 1))).astype(np.float32)  # rows of different magnitudes
    if m > 2:
        x[2] = 0.0  # an all-zero row: scale 1, all codes zero
    return x.astype(BF16)


def _quantize(gpu, x: np.ndarray, static_scale: np.ndarray | None):
    m, k = x.shape
    spec = fp8_quantizer_spec(k, gpu_target(gpu), static_scale is not None)
    q, s = gpu.alloc((m, k), np.uint8), gpu.alloc((m,), np.float32)  # poisoned: 0xFF
    gpu.launch(spec, x=gpu.upload(x.view(np.uint16)),
               input_scale=gpu.upload(static_scale.reshape(1)) if static_scale is not None else None,
               x_fp8=q, x_scale=s, M=m)
    return q, s


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("m,k", [(1, 128), (37, 480), (300, 2048), (130, 8208), (5, 16384)])
def test_quantizer_matches_numpy_bitwise(gpu, static, m, k):
    x = _x(rng(), m, k)
    xf = x.astype(np.float32)
    if static:  # a calibrated scale below most rows' amax / 448: those rows' largest codes saturate
        s = np.asarray(np.abs(xf).max() / 448 * 0.25, np.float32)
        want_q, want_s = F.quantize_fp8_static(xf, s), np.full(m, s, np.float32)
        assert (np.abs(want_q.astype(np.float32)) == 448).any()
    else:
        s = None
        want_q, want_s = F.quantize_fp8_per_token(xf)
        want_s = want_s.reshape(m)
    q, scale = _quantize(gpu, x, s)
    got = gpu.download(q)
    want = want_q.view(np.uint8)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{len(bad)} codes differ, first at {bad[0].tolist()}: {got[tuple(bad[0])]:#x} != " \
                          f"{want[tuple(bad[0])]:#x}"
    assert np.array_equal(gpu.download(scale).view(np.uint32), want_s.view(np.uint32))
    if m > 2 and not static:
        assert gpu.download(scale)[2] == 1.0 and not got[2].any()


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("m,n,k,bias,residual", [(300, 1064, 208, True, False), (2048, 3072, 2048, False, True),
                                                 (777, 2048, 8192, True, True)])
def test_quantizer_and_fp8_gemm_are_quantized_linear(gpu, static, m, n, k, bias, residual):
    from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp
    from ingot.codegen.kernels.gemm_cutlass.build import cutlass_available
    from tests.codegen.test_gemm_cutlass import load_generic

    if not cutlass_available():
        pytest.skip("the FP8 GEMM is a CUTLASS kernel: needs nvcc and the nvidia-cutlass wheel")
    r = rng()
    x = _x(r, m, k)
    wq = quantized_weight(r, "fp8", n, k)
    b = (r.standard_normal(n) * 2).astype(BF16) if bias else None
    res = (r.standard_normal((m, n)) * 4).astype(BF16) if residual else None
    s = np.asarray(np.abs(x.astype(np.float32)).max() / 448 * 0.5, np.float32) if static else None
    op = QuantizedLinear(weight_format="fp8", weight_granularity="channel", act_format="fp8",
                         act_granularity="tensor" if static else "token", in_features=k)
    ref = op.ref(x, wq["weight"], wq["weight_scale"], None, s, b, res).astype(np.float32)

    q, scale = _quantize(gpu, x, s)
    fn, layout = load_generic(cp.generic_linear_spec("fp8", gpu_target(gpu), residual=residual,
                                                     config=cp.shape_config("fp8", n, k, gpu_target(gpu))))
    out = gpu.alloc((m, n), BF16)
    pointers = {"x": q.ptr, "weight": gpu.upload(wq["weight"].view(np.uint8)).ptr, "x_scale": scale.ptr,
                "weight_scale": gpu.upload(wq["weight_scale"]).ptr, "out": out.ptr,
                "bias": gpu.upload(b.view(np.uint16)).ptr if bias else 0,
                "residual": gpu.upload(res.view(np.uint16)).ptr if residual else 0}
    blob, config = cp.build_params(layout, pointers, m, n, k, gpu.sm_count)
    cp.launch(fn, blob, config, 0)
    got = gpu.download(out).astype(np.float32)
    assert np.isfinite(got).all(), "unwritten outputs"
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err < TOL, err
