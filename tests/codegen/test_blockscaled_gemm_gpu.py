"""The W4A4 pair on a B200 (sm_100a only; skipped elsewhere, the H200 included): the activation quantizer, then the
block-scaled CUTLASS GEMM launched the way the CUDA backend does (cubin + a Params blob built in Python from the
probed layout), against ``quantized_linear``'s reference. Written before any B200 was available: not yet run.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.gemm_cutlass import blockscaled_rule as bs
from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp
from ingot.codegen.kernels.gemm_cutlass.build import cutlass_available
from ingot.codegen.kernels.quant_act.rule import quantizer_spec, scale_cols
from ingot.codegen.target import get_target
from ingot.ir.ops.quantized import QuantizedLinear
from tests.codegen.test_quant_act import quantize_fp4_weight
from tests.helpers import rng

pytestmark = pytest.mark.gpu
needs_cutlass = pytest.mark.skipif(not cutlass_available(),
                                   reason="needs nvcc and CUTLASS headers: pip install nvidia-cutlass nvidia-cuda-nvcc")


@needs_cutlass
@pytest.mark.parametrize("fmt,static,residual", [("nvfp4", True, False), ("nvfp4", False, True),
                                                 ("mxfp4", False, True)])
def test_quantizer_then_block_scaled_gemm(gpu, fmt, static, residual):
    if gpu.arch != "sm_100a":
        pytest.skip(f"the block-scaled GEMM is sm_100a (B200) code; this GPU is {gpu.arch}")
    from cuda.bindings import driver as drv

    from tests.codegen.cuda_launch import check

    b200 = get_target("b200")
    spec = bs.blockscaled_spec(fmt, b200, residual=residual)
    kernel, layout = cp.build_linear(spec)
    fn = check(drv.cuModuleGetFunction(check(drv.cuModuleLoadData(kernel.cubin)), spec.entry.encode()))
    check(drv.cuFuncSetAttribute(fn, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 int(layout["smem"])))
    sm_count = check(drv.cuDeviceGetAttribute(drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                              gpu.device))
    r = rng()
    for m, n, k in ((1, 256, 512), (77, 384, 1024), (300, 1064, 480)):
        x = r.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
        w = (r.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        weight, weight_scale, ws2 = quantize_fp4_weight(w, fmt)
        input_scale = np.array(np.abs(x.astype(np.float32)).max() / 2688, np.float32) if static else None
        bias = r.standard_normal(n).astype(ml_dtypes.bfloat16)
        res = r.standard_normal((m, n)).astype(ml_dtypes.bfloat16) if residual else None
        op = QuantizedLinear(weight_format=fmt, weight_granularity="block", act_format=fmt,
                             act_granularity="tensor" if static else "token", scale_layout="sm100", in_features=k)
        ref = op.ref(x.astype(np.float32), weight, weight_scale, ws2, input_scale, bias.astype(np.float32),
                     None if res is None else res.astype(np.float32))
        x_fp4 = gpu.alloc((m, k // 2), np.uint8)
        x_sf = gpu.alloc((-(-m // 128) * 128, scale_cols(fmt, k)), np.uint8)
        x_scale = gpu.alloc((m,), np.float32) if fmt == "nvfp4" else None
        gpu.launch(quantizer_spec(fmt, k, b200, static), x=gpu.upload(x.view(np.uint16)),
                   input_scale=gpu.upload(input_scale) if static else None,
                   weight_scale_2=gpu.upload(ws2) if fmt == "nvfp4" else None, x_fp4=x_fp4, x_block_scale=x_sf,
                   x_scale=x_scale, M=m)
        out = gpu.alloc((m, n), np.uint16)  # bf16 bits, poisoned with NaN
        ptrs = {"x": x_fp4.ptr, "weight": gpu.upload(weight).ptr, "x_block_scale": x_sf.ptr,
                "weight_block_scale": gpu.upload(weight_scale.view(np.uint8)).ptr,
                "x_scale": x_scale.ptr if x_scale is not None else 0, "bias": gpu.upload(bias.view(np.uint16)).ptr,
                "residual": gpu.upload(res.view(np.uint16)).ptr if res is not None else 0, "out": out.ptr}
        blob, config = cp.build_params(layout, ptrs, m, n, k, sm_count)
        cp.launch(fn, blob, config, 0)
        got = gpu.download(out).view(ml_dtypes.bfloat16).astype(np.float32)
        assert np.isfinite(got).all(), f"M, N, K = {m, n, k}: unwritten outputs (grid {config['grid']})"
        np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max(), err_msg=f"{m, n, k}")
