"""Row norms over the last axis: ``rms_norm``, ``layer_norm``, and their fused residual-add forms.

The fused form (``add_rms_norm_spec``) computes ``h = x + residual`` (rounded to the activation
dtype, written to ``residual_out``) and normalizes ``h``: one pass over the row instead of an add
kernel and a norm kernel. Its reference is ``add`` followed by the norm's own reference.
"""

from __future__ import annotations

from collections.abc import Sequence

from ....ir.op import Op
from ....ir.types import DType, TensorType
from ...family import ACTIVATION_DTYPES, Family, ctype, static_dim, threads_for
from ...kernel import GridDim, KernelSpec
from ...target import Target

PARAMS = [("x", "ptr"), ("weight", "ptr"), ("bias", "ptr"), ("residual", "ptr"), ("residual_out", "ptr"),
          ("out", "ptr"), ("rows", "i64")]


def norm_spec(kind: str, dtype: DType, weight_dtype: DType, hidden: int, eps: float, target: Target,
              residual: bool = False, bias: bool = False) -> KernelSpec:
    """``kind`` is ``rms`` or ``layer``. Params: x, weight, bias, residual, residual_out, out, rows
    (unused pointers may be 0)."""
    if kind not in ("rms", "layer"):
        raise ValueError(f"norm kind must be rms or layer, got {kind!r}")
    if bias and kind == "rms":
        raise ValueError("rms_norm has no bias")
    block = threads_for(hidden, per_thread=8)
    per_thread = -(-hidden // block)
    tag = ("add_" if residual else "") + f"{kind}_norm_{dtype.value}_h{hidden}"
    return KernelSpec.make(
        "norm", "kernel.cu", tag, target.arch or "",
        {"DT": ctype(dtype), "WT": ctype(weight_dtype), "HIDDEN": hidden, "BLOCK": block, "PER_THREAD": per_thread,
         "KIND": 0 if kind == "rms" else 1, "EPS": float(eps), "RESIDUAL": residual, "BIAS": bias},
        PARAMS, block, [GridDim("rows")])


def plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    hidden = static_dim(x, -1)
    if not target.is_gpu or x is None or w is None or hidden is None or x.dtype not in ACTIVATION_DTYPES:
        return None
    if getattr(op, "axis", -1) not in (-1, (x.rank or 0) - 1) or getattr(op, "stash_type", DType.f32) != DType.f32:
        return None
    if getattr(op, "stats", False) or w.dtype not in ACTIVATION_DTYPES or w.shape != (hidden,):
        return None
    if b is not None and (b.dtype not in ACTIVATION_DTYPES or b.shape != (hidden,) or b.dtype != w.dtype):
        return None
    kind = "rms" if op.name == "rms_norm" else "layer"
    return [norm_spec(kind, x.dtype, w.dtype, hidden, op.eps, target, bias=b is not None)]


FAMILY = Family(name="norm", ops=("rms_norm", "layer_norm"), plan=plan)
