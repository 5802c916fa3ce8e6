"""The quantizer's outputs in numpy (``kernel.cu``, byte for byte): what the GPU test compares against.

``quantize_for_sm100(x, fmt, input_scale, weight_scale_2)`` returns

- ``x_fp4`` u8[M, K/2]: ``quantize_activation``'s E2M1 codes (``ir/ops/quantized.py``), packed two a byte
  (``ir/quant/packing.py`` ``pack_e2m1``);
- ``x_block_scale`` u8[ceil128(M), ceil4(K/vec)]: its E4M3 (NVFP4) / E8M0 (MXFP4) block scales through
  ``swizzle_sm100_scales``, the layout ``pack-sm100`` gives the weights; padding rows and columns zero;
- ``x_scale`` f32[M] (NVFP4): the activation global scale times ``weight_scale_2``, the factor the GEMM's
  epilogue applies per row; None for MXFP4.

So ``dequant(x_fp4, x_block_scale) * x_scale / weight_scale_2 == quantize_activation(x)``, and the GEMM's
``(dequant(x) @ dequant(w).T) * x_scale`` is ``quantized_linear``'s reference up to float32 summation order.
"""

from __future__ import annotations

import numpy as np

from ....ir.quant import formats as F
from ....ir.quant.packing import pack_e2m1, swizzle_sm100_scales


def quantize_for_sm100(x: np.ndarray, fmt: str, input_scale: np.ndarray | None = None,
                       weight_scale_2: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(x_fp4, x_block_scale, x_scale) for activations ``x`` [M, K] (see the module docstring); ``input_scale``:
    NVFP4's static global scale (None: per row, ``amax / 2688``)."""
    x = np.asarray(x, np.float32)
    if fmt == "nvfp4":
        if input_scale is None:
            gs = F.nvfp4_global_scale(np.abs(x).max(axis=-1, keepdims=True))
        else:
            gs = np.broadcast_to(np.asarray(input_scale, np.float32).reshape(1, 1), (x.shape[0], 1))
        q, sf = F.quantize_nvfp4(x, gs)
        ws2 = np.float32(1) if weight_scale_2 is None else np.asarray(weight_scale_2, np.float32).reshape(())
        x_scale = (gs.reshape(-1) * ws2).astype(np.float32)
    elif fmt == "mxfp4":
        q, sf = F.quantize_mxfp4(x)
        x_scale = None
    else:
        raise ValueError(f"unknown activation format {fmt!r}")
    return pack_e2m1(q), swizzle_sm100_scales(sf).view(np.uint8), x_scale
