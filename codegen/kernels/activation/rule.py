"""Gated activations (``swiglu``, also ``packed`` over one fused gate_up buffer; GeGLU with the tanh GELU
through ``gated_spec``)."""

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
               a_stride: int | None = None, b_stride: int | None = None, b_offset: int = 0) -> KernelSpec:
    """``out[T, width] = act(a) * b``; params: a, b, out, num_tokens. Row t of b starts ``b_offset`` elements
    after ``b + t * b_stride`` (a packed swiglu passes its one buffer as both a and b, b_offset = width)."""
    name = f"{act}_{dtype.value}_w{width}" + ("_packed" if b_offset else "")
    a_stride, b_stride = a_stride or width, b_stride or width
    # 16-byte vectors when every row start is one (the arena aligns buffers to 256 bytes)
    vec = 16 // dtype.np.itemsize
    if any(v % vec for v in (width, a_stride, b_stride, b_offset)):
        vec = 1
    return KernelSpec.make(
        "activation", "kernel.cu", name, target.arch or "",
        {"DT": ctype(dtype), "WIDTH": width, "A_STRIDE": a_stride, "B_STRIDE": b_stride,
         "B_OFFSET": b_offset, "ACT": ACTS[act], "ALPHA": float(alpha), "BLOCK": BLOCK, "VEC": vec},
        [("a", "ptr"), ("b", "ptr"), ("out", "ptr"), ("num_tokens", "i64")],
        BLOCK, [GridDim(const=-(-width // (BLOCK * vec))), GridDim("num_tokens")])


def plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
    if getattr(op, "packed", False):  # one [T, 2I] input: gate = first half, up = second half
        x = inputs[0]
        full = static_dim(x, -1)
        if not target.is_gpu or x is None or full is None or full % 2 or x.rank != 2:
            return None
        if x.dtype not in ACTIVATION_DTYPES:
            return None
        half = full // 2
        return [gated_spec("swiglu", x.dtype, half, target, alpha=op.alpha, a_stride=full, b_stride=full,
                           b_offset=half)]
    if len(inputs) != 2:
        return None
    a, b = inputs[0], inputs[1]
    width = static_dim(a, -1)
    if not target.is_gpu or a is None or b is None or width is None or a.rank != 2:
        return None
    if a.dtype not in ACTIVATION_DTYPES or b.dtype != a.dtype or b.shape != a.shape:
        return None
    return [gated_spec("swiglu", a.dtype, width, target, alpha=op.alpha)]


FAMILY = Family(name="activation", ops=("swiglu",), plan=plan)
