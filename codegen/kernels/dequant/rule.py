"""Weight dequantization for prefill: a ``quantized_linear``'s weight to a bf16 [N, K] scratch (``kernel.cu``).

Not a family that implements an op by itself (``codegen/registry.py`` does not list it): ``codegen/quant_prefill.py``
pairs it with the bf16 GEMM for steps with more rows than the quantized GEMV's largest bucket. What it writes is
exact (``dequant_reference`` is its numpy model, bit for bit), and the weight's scale stays a per-output-channel
f32 vector that the GEMM applies in its epilogue:

=============================  ==============================================  =========================================
``weight_format``               scratch (bf16 [N, K])                           epilogue column scale (f32 [N])
=============================  ==============================================  =========================================
``fp8`` (channel scales)       the e4m3 code's value                           ``weight_scale`` itself
``nvfp4`` (linear scales)      ``e2m1 * f32(block scale)``                     ``weight_scale_2`` copied to N entries
=============================  ==============================================  =========================================

So ``f32(scratch) * column_scale[:, None]`` is ``ir/ops/quantized.py``'s ``dequantize_weight`` exactly (the same
products in the same order), and the GEMM computes ``sum_k x * scratch`` in f32 times the scale, as the quantized
GEMV (``codegen/kernels/gemv/quant.cu``) does. Only weight-only formats (``act_format`` ``none``): with quantized
activations the bf16 GEMM would not compute the reference's quantized x. Formats are those the GEMV takes
(``quant_rule.quant_applies``): MXFP4 and sm100-swizzled NVFP4 scales have no GPU kernel at all yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ....ir.op import Op
from ....ir.quant.packing import unpack_e2m1
from ....ir.types import TensorType
from ...kernel import GridDim, KernelSpec
from ...target import Target
from ..gemv.quant_rule import quant_applies

PARAMS = [("weight", "ptr"), ("weight_scale", "ptr"), ("weight_scale_2", "ptr"), ("out", "ptr"), ("out_scale", "ptr"),
          ("M", "i64")]
WEIGHT_FORMATS = {"fp8": 0, "nvfp4": 1}
THREADS = 256
#: grid-stride: at most this many CTAs per SM (16-byte chunks are many more than threads for any real weight)
CTAS_PER_SM = 8
#: codes per 16-byte chunk a thread converts
CHUNK_CODES = {"fp8": 16, "nvfp4": 32}


@dataclass(frozen=True)
class DequantShape:
    weight_format: str
    n: int
    k: int


def applies(op: Op, inputs: Sequence[TensorType | None], target: Target) -> DequantShape | None:
    """The format and shape when a weight-only ``quantized_linear`` the quantized GEMV takes can be dequantized here."""
    a = quant_applies(op, inputs, target)
    if a is None or a.act != "none" or a.weight_format not in WEIGHT_FORMATS:
        return None
    return DequantShape(a.weight_format, a.n, a.k)


def dequant_spec(weight_format: str, n: int, k: int, target: Target) -> KernelSpec:
    """The kernel dequantizing a ``weight_format`` weight of N rows and K columns (params ``PARAMS``)."""
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"dequant: weight format must be one of {sorted(WEIGHT_FORMATS)}, got {weight_format!r}")
    codes = CHUNK_CODES[weight_format]
    if k % codes or n < 1:
        raise ValueError(f"dequant {weight_format}: K must be a multiple of {codes}, got N={n} K={k}")
    chunks = n * k // codes
    grid = max(1, min(-(-chunks // THREADS), CTAS_PER_SM * (target.num_sms or 132)))
    values = {"N": n, "K": k, "WFMT": WEIGHT_FORMATS[weight_format], "THREADS": THREADS}
    return KernelSpec.make("dequant", "kernel.cu", f"dequant_{weight_format}_n{n}_k{k}", target.arch or "", values,
                           PARAMS, THREADS, [GridDim(const=grid)],
                           doc=f"{weight_format} weight [{n}, {k}] -> bf16 scratch for the prefill GEMM")


def dequant_reference(weight_format: str, weight: np.ndarray, weight_scale: np.ndarray,
                      weight_scale_2: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """What the kernel writes, as numpy: (bf16 [N, K] scratch, f32 [N] epilogue column scale; for fp8 that is
    ``weight_scale``, which the kernel leaves where it is)."""
    if weight_format == "fp8":
        codes = np.asarray(weight).view(ml_dtypes.float8_e4m3fn)
        return codes.astype(ml_dtypes.bfloat16), np.asarray(weight_scale, np.float32).reshape(-1)
    if weight_format == "nvfp4":
        q = unpack_e2m1(weight).astype(np.float32)
        n, k = q.shape
        sf = np.asarray(weight_scale).view(ml_dtypes.float8_e4m3fn).astype(np.float32).reshape(n, k // 16)
        products = (q.reshape(n, k // 16, 16) * sf[..., None]).reshape(n, k)  # exact in f32, and in bf16
        gs = np.asarray(weight_scale_2, np.float32).reshape(-1)[0]
        return products.astype(ml_dtypes.bfloat16), np.full(n, gs, np.float32)
    raise ValueError(f"dequant: weight format must be one of {sorted(WEIGHT_FORMATS)}, got {weight_format!r}")
