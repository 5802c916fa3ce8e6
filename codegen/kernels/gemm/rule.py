"""Straightforward tiled GEMM for ``linear``: ``x[M, K] @ w[N, K]^T (+ bias[N]) (+ residual[M, N])``.

Two templates, both correct for any M, N, K (tiles are bounds-checked) and used on both arches:

- ``mma.cu``: bf16 activations, bf16 or fp8 e4m3 weights (per-output-channel float scale), on
  tensor cores through ``mma.sync`` (f32 accumulate);
- ``simt.cu``: any storage types (f32, f16, bf16, fp8 weights), fp32 FMA.

Speed is not the point yet: wgmma/TMA (sm_90a) and tcgen05 (sm_100a) GEMMs come in per-arch
templates with the performance work, and this rule then picks them first.
"""

from __future__ import annotations

from collections.abc import Sequence

from ....ir.op import Op
from ....ir.types import DType, TensorType
from ...family import ACTIVATION_DTYPES, Family, ctype, static_dim
from ...kernel import GridDim, KernelSpec
from ...target import Target

PARAMS = [("x", "ptr"), ("weight", "ptr"), ("weight_scale", "ptr"), ("bias", "ptr"), ("residual", "ptr"),
          ("out", "ptr"), ("M", "i64")]
WEIGHT_DTYPES = (*ACTIVATION_DTYPES, DType.f8e4m3fn)


def linear_spec(x_dtype: DType, w_dtype: DType, n: int, k: int, target: Target, bias: bool = False,
                residual: bool = False, weight_scale: bool | None = None) -> KernelSpec:
    """Params: x, weight, weight_scale (f32[N], fp8 weights), bias, residual, out, M (unused pointers may be 0).
    Output, bias and residual have ``x_dtype``."""
    if x_dtype not in ACTIVATION_DTYPES or w_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"linear: unsupported dtypes x={x_dtype.value} w={w_dtype.value}")
    scale = w_dtype is DType.f8e4m3fn if weight_scale is None else weight_scale
    flags = {"HAS_SCALE": scale, "HAS_BIAS": bias, "HAS_RESIDUAL": residual, "N": n, "K": k}
    tag = f"linear_{x_dtype.value}_{w_dtype.value}_n{n}_k{k}"
    if x_dtype is DType.bf16 and w_dtype in (DType.bf16, DType.f8e4m3fn):
        return KernelSpec.make("gemm", "mma.cu", tag, target.arch or "",
                               {**flags, "WT": ctype(w_dtype), "OT": "bf16", "BM": 64, "BN": 64, "BK": 32},
                               PARAMS, 128, [GridDim(const=-(-n // 64)), GridDim("M", 64)])
    return KernelSpec.make("gemm", "simt.cu", tag, target.arch or "",
                           {**flags, "XT": ctype(x_dtype), "WT": ctype(w_dtype), "BM": 64, "BN": 64, "BK": 16},
                           PARAMS, 256, [GridDim(const=-(-n // 64)), GridDim("M", 64)])


def plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    residual = inputs[3] if len(inputs) > 3 else None
    n, k = static_dim(w, 0), static_dim(w, 1)
    if not target.is_gpu or x is None or w is None or n is None or k is None or w.rank != 2:
        return None
    if x.dtype not in ACTIVATION_DTYPES or w.dtype not in (x.dtype,) or static_dim(x, -1) != k:
        return None
    if any(t is not None and t.dtype != x.dtype for t in (bias, residual)):
        return None
    return [linear_spec(x.dtype, w.dtype, n, k, target, bias=bias is not None, residual=residual is not None)]


FAMILY = Family(name="gemm", ops=("linear",), plan=plan)
