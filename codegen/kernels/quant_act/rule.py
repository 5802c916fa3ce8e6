"""Activation quantizers for the quantized GEMMs: bf16 ``x`` -> packed E2M1 codes + sm_100-swizzled scales
(``kernel.cu``, block-scaled FP4), or E4M3 codes + a row scale (``fp8.cu``, FP8).

The A operand of the sm_100 block-scaled CUTLASS GEMM (``gemm_cutlass/sm100_blockscaled.cu``; planned by
``gemm_cutlass/blockscaled_rule.py``) is what ``kernel.cu`` writes, for a ``quantized_linear`` with NVFP4 or MXFP4
activations: the same codes and scales as ``ir/ops/quantized.py`` ``quantize_activation`` (``layout.py``
``quantize_for_sm100`` is its numpy form, byte for byte), the scales in CUTLASS's ``Sm1xxBlkScaledConfig`` layout
that ``pack-sm100`` gives the weights (``ir/quant/packing.py``), rows padded to 128. Not a kernel family of the
registry: only the block-scaled lowering launches it. Arch-independent (plain CUDA, no FP4 instructions), so it
compiles with NVRTC for sm_90a and sm_100a and is tested on the H200 (``tests/codegen/test_quant_act_gpu.py``).

Launch: grid ``(128, ceil(M / 128))`` (one block per row of the padded scale matrix), ``BLOCK`` threads.

``fp8.cu`` (``fp8_quantizer_spec``) is the A operand of the FP8 GEMM in W8A8 prefill steps
(``codegen/quant_prefill.py``): ``x_fp8`` e4m3[M, K] and ``x_scale`` f32[M] (per row ``amax / 448``, or the
calibrated static scale), exactly ``quantize_activation("fp8", ...)``'s codes and scales; one block of ``FP8_BLOCK``
threads per row, the row held in registers (x read once). Arch-independent as well; tested on the H200
(``tests/codegen/test_quant_act_fp8_gpu.py``).
"""

from __future__ import annotations

from ...kernel import GridDim, KernelSpec
from ...target import Target

#: formats -> (FMT value in kernel.cu, elements per scale factor)
FORMATS = {"nvfp4": (0, 16), "mxfp4": (1, 32)}
#: the kernel's parameters, in order: x bf16[M, K]; input_scale f32[] (static NVFP4; else null); weight_scale_2
#: f32[] (NVFP4's weight global scale; null reads 1); x_fp4 u8[M, K/2]; x_block_scale u8[sf_rows(M), KV_PAD];
#: x_scale f32[M] (NVFP4: the epilogue's row scale; not written for MXFP4); M
PARAMS = [("x", "ptr"), ("input_scale", "ptr"), ("weight_scale_2", "ptr"), ("x_fp4", "ptr"), ("x_block_scale", "ptr"),
          ("x_scale", "ptr"), ("M", "i64")]
BLOCK = 128
#: rows of one scale-factor atom: the scale matrix is padded to a multiple
ATOM_ROWS = 128


def scale_cols(fmt: str, k: int) -> int:
    """Scale columns of a [rows, K] operand in the swizzled layout: K / vec padded to the atom's 4."""
    vec = FORMATS[fmt][1]
    return -(-(k // vec) // 4) * 4


def quantizer_spec(fmt: str, k: int, target: Target, static: bool) -> KernelSpec:
    """The quantizer of ``fmt`` (nvfp4 | mxfp4) activations with K = ``k`` inputs; ``static``: NVFP4 with the
    calibrated ``input_scale`` as global scale (else per row). K must be a multiple of 32 (the GEMM's alignment;
    whole 16-byte loads) and, for MXFP4, of 32 already."""
    if fmt not in FORMATS:
        raise ValueError(f"quant_act: format must be one of {sorted(FORMATS)}, got {fmt!r}")
    if fmt == "mxfp4" and static:
        raise ValueError("quant_act: mxfp4 activations have no static scale")
    if k % 32:
        raise ValueError(f"quant_act {fmt}: K must be a multiple of 32, got {k}")
    code, vec = FORMATS[fmt]
    name = f"quant_act_{fmt}_k{k}{'_static' if static else ''}"
    doc = (f"bf16 x[M, {k}] -> {fmt} codes u8[M, {k // 2}] + sm_100-swizzled scales u8[ceil128(M), "
           f"{scale_cols(fmt, k)}] (+ the epilogue's row scale) for the block-scaled CUTLASS GEMM")
    return KernelSpec.make("quant_act", "kernel.cu", name, target.arch or "",
                           {"K": k, "VEC": vec, "KV_PAD": scale_cols(fmt, k), "FMT": code, "STATIC": static,
                            "BLOCK": BLOCK},
                           PARAMS, BLOCK, [GridDim(const=ATOM_ROWS), GridDim("M", ATOM_ROWS)], doc=doc)


#: ``fp8.cu``'s parameters: x bf16[M, K]; input_scale f32[] (static; else null); x_fp8 e4m3[M, K]; x_scale f32[M]; M
FP8_PARAMS = [("x", "ptr"), ("input_scale", "ptr"), ("x_fp8", "ptr"), ("x_scale", "ptr"), ("M", "i64")]
FP8_BLOCK = 256
#: the widest row ``fp8.cu`` holds in registers (FP8_BLOCK threads x 16 chunks of 8 values)
FP8_MAX_K = FP8_BLOCK * 8 * 16


def fp8_quantizer_spec(k: int, target: Target, static: bool) -> KernelSpec:
    """The FP8 (E4M3) quantizer of activations with K = ``k`` inputs: per row (``static`` False) or with the
    calibrated ``input_scale``. K must be a multiple of 16 (the FP8 GEMM's rows are whole 16-byte vectors) and at
    most ``FP8_MAX_K``."""
    if k % 16 or not 0 < k <= FP8_MAX_K:
        raise ValueError(f"quant_act fp8: K must be a multiple of 16 in (0, {FP8_MAX_K}], got {k}")
    name = f"quant_act_fp8_k{k}{'_static' if static else ''}"
    doc = (f"bf16 x[M, {k}] -> e4m3 codes x_fp8[M, {k}] + x_scale f32[M] "
           f"({'the static input_scale' if static else 'amax / 448 per row'}) for the FP8 GEMM")
    return KernelSpec.make("quant_act", "fp8.cu", name, target.arch or "", {"K": k, "STATIC": static,
                                                                          "BLOCK": FP8_BLOCK},
                           FP8_PARAMS, FP8_BLOCK, [GridDim("M")], doc=doc)
