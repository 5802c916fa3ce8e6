"""Gated activations (``swiglu``; GeGLU with the tanh GELU through ``gated_spec``)."""

from __future__ import annotations

from collections.abc import Sequence

from ....ir.op import Op
from ....ir.types import DType, TensorType
from ...family import ACTIVATION_DTYPES, Family, ctype, static_dim
from ...kernel import GridDim, KernelSpec
from ...target import Target

BLOCK = 256
ACTS = {"swiglu": 0, "geglu": 1}


def gated_spec(act: str, dtype: DType, width: int, target: Target, alpha: float = 1.0,
               a_stride: int | None = None, b_stride: int | None = None) -> KernelSpec:
    """``out[T, width] = act(a) * b``; params: a, b, out, num_tokens."""
    return KernelSpec.make(
        "activation", "kernel.cu", f"{act}_{dtype.value}_w{width}", target.arch or "",
        {"DT": ctype(dtype), "WIDTH": width, "A_STRIDE": a_stride or width, "B_STRIDE": b_stride or width,
         "ACT": ACTS[act], "ALPHA": float(alpha), "BLOCK": BLOCK},
        [("a", "ptr"), ("b", "ptr"), ("out", "ptr"), ("num_tokens", "i64")],
        BLOCK, [GridDim(const=-(-width // BLOCK)), GridDim("num_tokens")])


def plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
    a, b = inputs[0], inputs[1]
    width = static_dim(a, -1)
    if not target.is_gpu or a is None or b is None or width is None or a.rank != 2:
        return None
    if a.dtype not in ACTIVATION_DTYPES or b.dtype != a.dtype or b.shape != a.shape:
        return None
    return [gated_spec("swiglu", a.dtype, width, target, alpha=op.alpha)]


FAMILY = Family(name="activation", ops=("swiglu",), plan=plan)
