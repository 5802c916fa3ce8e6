"""Quantization numerics: the FP8 / NVFP4 / MXFP4 formats (``formats``) and how their bits are laid out
for the kernels (``packing``). Pure numpy; the ``quantized_linear`` op's reference is built on them."""

from .formats import (
    E2M1_MAX,
    E4M3_MAX,
    MX_BLOCK,
    NVFP4_BLOCK,
    dequantize_fp8,
    dequantize_mxfp4,
    dequantize_nvfp4,
    nvfp4_global_scale,
    quantize_fp8,
    quantize_fp8_per_token,
    quantize_mxfp4,
    quantize_nvfp4,
    to_e2m1,
    to_e4m3,
)
from .packing import pack_e2m1, swizzle_sm100_scales, unpack_e2m1, unswizzle_sm100_scales

__all__ = [
    "E2M1_MAX", "E4M3_MAX", "MX_BLOCK", "NVFP4_BLOCK", "to_e4m3", "to_e2m1", "quantize_fp8", "dequantize_fp8",
    "quantize_fp8_per_token", "nvfp4_global_scale", "quantize_nvfp4", "dequantize_nvfp4", "quantize_mxfp4",
    "dequantize_mxfp4", "pack_e2m1", "unpack_e2m1", "swizzle_sm100_scales", "unswizzle_sm100_scales",
]
