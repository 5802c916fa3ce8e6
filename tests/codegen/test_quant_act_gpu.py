"""The W4A4 activation quantizer (``codegen/kernels/quant_act``) on a GPU: its bytes are ``layout.py``'s.

The kernel is arch-independent (no FP4 instructions), so this runs on the H200 (sm_90a build) as well as on a
B200: every byte of ``x_fp4`` (the packed E2M1 codes), ``x_block_scale`` (all ``ceil128(M)`` rows of the swizzled
scale matrix, padding included: the outputs are poisoned with 0xFF before the launch) and ``x_scale`` must equal
``quantize_for_sm100``'s, which ``test_quant_act.py`` ties to ``quantize_activation`` (the op's CPU reference)
and to ``pack-sm100``'s layout.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.quant_act.layout import quantize_for_sm100
from ingot.codegen.kernels.quant_act.rule import quantizer_spec, scale_cols
from ingot.codegen.target import get_target
from tests.helpers import rng

pytestmark = pytest.mark.gpu

TARGETS = {"sm_90a": "h200", "sm_100a": "b200"}


@pytest.mark.parametrize("fmt,static", [("nvfp4", True), ("nvfp4", False), ("mxfp4", False)])
@pytest.mark.parametrize("m,k", [(1, 128), (37, 480), (130, 2048), (300, 4096)])
def test_quantizer_matches_numpy(gpu, fmt, static, m, k):
    r = rng()
    x = r.standard_normal((m, k)).astype(np.float32) * np.exp2(r.integers(-8, 5, (m, k // 16)).repeat(16, axis=1))
    if m > 2:
        x[2] = 0  # an all-zero row: per-row global scale 1, zero scales
        x[1, :16] = 0  # an all-zero block
    x = x.astype(ml_dtypes.bfloat16)
    input_scale = np.array(np.abs(x.astype(np.float32)).max() / 2688 * 0.7, np.float32) if static else None
    ws2 = np.array(0.0173, np.float32)
    want_q, want_sf, want_scale = quantize_for_sm100(x.astype(np.float32), fmt, input_scale,
                                                     ws2 if fmt == "nvfp4" else None)
    spec = quantizer_spec(fmt, k, get_target(TARGETS[gpu.arch]), static)
    rows = -(-m // 128) * 128
    x_fp4 = gpu.alloc((m, k // 2), np.uint8)
    sf = gpu.alloc((rows, scale_cols(fmt, k)), np.uint8)
    x_scale = gpu.alloc((m,), np.float32) if fmt == "nvfp4" else None
    gpu.launch(spec, x=gpu.upload(x.view(np.uint16)), input_scale=gpu.upload(input_scale) if static else None,
               weight_scale_2=gpu.upload(ws2) if fmt == "nvfp4" else None, x_fp4=x_fp4, x_block_scale=sf,
               x_scale=x_scale, M=m)
    np.testing.assert_array_equal(gpu.download(sf), want_sf, err_msg="x_block_scale")
    np.testing.assert_array_equal(gpu.download(x_fp4), want_q, err_msg="x_fp4")
    if x_scale is not None:
        np.testing.assert_array_equal(gpu.download(x_scale), want_scale, err_msg="x_scale")
