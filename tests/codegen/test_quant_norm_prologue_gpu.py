"""W8A8's decode GEMV with the rms_norm prologue (``quant.cu``'s ``PROLOGUE``, ``quant_rule.fused_quant_spec``) on the
GPU (``-m gpu``; skipped without one): the kernel reads the norm's input and weight, normalizes each token over all of
K and quantizes the norm's output; against the numpy references of ``rms_norm`` then ``quantized_linear`` (per-token
and static activation scales, outlier columns, a norm weight with large entries, bias and residual, outputs poisoned,
each launch done twice)."""

from __future__ import annotations

import numpy as np
import pytest

from ingot.codegen.kernels.gemv.quant_rule import fused_quant_spec, quant_gemv_spec
from ingot.codegen.kernels.gemv.rule import Prologue
from ingot.codegen.target import get_target
from ingot.ir.ops.norm import RmsNorm
from ingot.ir.ops.quantized import QuantizedLinear
from tests.codegen.test_gemv_quant_gpu import BF16, activations, quantized_weight, run_case
from tests.helpers import rng

pytestmark = pytest.mark.gpu
EPS = 1e-5
#: (N, K, bucket, token counts): the 1B shape's qkv and gate_up (bucket 8, row groups / split-K) and a K of 8192
CASES = [(3072, 2048, 8, (1, 3, 8)), (16384, 2048, 8, (1, 5)), (2048, 8192, 8, (2, 8)), (1000, 4224, 16, (9, 16))]


@pytest.mark.parametrize("gran", ["token", "tensor"])
@pytest.mark.parametrize("n,k,mb,ms", CASES)
@pytest.mark.parametrize("epilogue", ["plain", "bias+residual"])
def test_rms_norm_prologue_matches_norm_then_gemv_reference(gpu, gran, n, k, mb, ms, epilogue):
    r = rng()
    tgt = get_target("h200" if gpu.arch == "sm_90a" else "b200")
    has = epilogue != "plain"
    spec = fused_quant_spec(quant_gemv_spec(n, k, mb, tgt, "fp8", "fp8", gran, bias=has, residual=has),
                            Prologue("rms_norm", eps=EPS), tgt)
    op = QuantizedLinear(weight_format="fp8", weight_granularity="channel", act_format="fp8", act_granularity=gran,
                         in_features=k)
    norm = RmsNorm(eps=EPS)
    wq = quantized_weight(r, "fp8", n, k)
    g = (1.0 + 0.2 * r.standard_normal(k)).astype(np.float32)
    g[r.integers(0, k, size=4)] = 6.0  # large norm weights: their columns set the scales
    g = g.astype(BF16)
    bias = (r.standard_normal(n) * 0.1).astype(BF16) if has else None
    for m in ms:
        h = (activations(r, m, k).astype(np.float32) * 3.0).astype(BF16)  # the norm's input, not of unit rms
        y = norm.ref(h, g)  # what the skipped norm launch would write (bf16)
        res = r.standard_normal((m, n)).astype(BF16) if has else None
        input_scale = None
        if gran == "tensor":  # half the calibrated scale: the outliers saturate at 448
            input_scale = np.float32(np.abs(y.astype(np.float32)).max() / 448.0 * 0.5)
        # run_case's reference is op.ref(y, ...); the kernel reads h and g instead of y
        run_case(gpu, spec, op, wq, y, bias, res, input_scale, n, launch_x=h, extra={"norm_weight": gpu.upload(g)})
