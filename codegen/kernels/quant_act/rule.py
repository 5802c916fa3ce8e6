"""Activation quantizers for block-scaled FP4 GEMMs: bf16 ``x`` -> packed E2M1 codes + sm_100-swizzled scales.

The A operand of the sm_100 block-scaled CUTLASS GEMM (``gemm_cutlass/sm100_blockscaled.cu``; planned by
``gemm_cutlass/blockscaled_rule.py``) is what ``kernel.cu`` writes, for a ``quantized_linear`` with NVFP4 or MXFP4
activations: the same codes and scales as ``ir/ops/quantized.py`` ``quantize_activation`` (``layout.py``
``quantize_for_sm100`` is its numpy form, byte for byte), the scales in CUTLASS's ``Sm1xxBlkScaledConfig`` layout
that ``pack-sm100`` gives the weights (``ir/quant/packing.py``), rows padded to 128. Not a kernel family of the
registry: only the block-scaled lowering launches it. Arch-independent (plain CUDA, no FP4 instructions), so it
compiles with NVRTC for sm_90a and sm_100a and is tested on the H200 (``tests/codegen/test_quant_act_gpu.py``).

Launch: grid ``(128, ceil(M / 128))`` (one block per row of the padded scale matrix), ``BLOCK`` threads.
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
