"""Helpers every TE builder shares: dtypes, static shapes, broadcasting, the builder table.

A builder turns one IR node into TE tensors::

    @builder("relu")
    def relu(op, ins, in_types, out_types):   # ins: te placeholders (None for an absent input)
        return [te.compute(...)]              # one tensor per output of the op, in order

It may raise ``Unsupported`` (an attribute or dtype it does not handle); the node then has no kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tvm
from tvm import te, tirx

from ...ir.op import Op
from ...ir.types import DType, TensorType

Builder = Callable[[Op, list[Any], list[TensorType | None], list[TensorType]], list[Any]]
BUILDERS: dict[str, Builder] = {}

#: ingot dtype -> TVM dtype string (f16/bf16 and the narrow formats are left to the templates)
TVM_DTYPES: dict[DType, str] = {
    DType.f32: "float32", DType.f64: "float64", DType.i8: "int8", DType.i16: "int16", DType.i32: "int32",
    DType.i64: "int64", DType.u8: "uint8", DType.u16: "uint16", DType.u32: "uint32", DType.u64: "uint64",
    DType.bool: "bool",
}


class Unsupported(ValueError):
    """The builder does not handle this node (attribute, dtype or shape)."""


def builder(*names: str) -> Callable[[Builder], Builder]:
    def register(fn: Builder) -> Builder:
        for n in names:
            BUILDERS[n] = fn
        return fn

    return register


def tdtype(dt: DType) -> str:
    try:
        return TVM_DTYPES[dt]
    except KeyError:
        raise Unsupported(f"dtype {dt.value} has no generated kernels (supported: "
                          f"{', '.join(d.value for d in TVM_DTYPES)})") from None


def static_shape(t: TensorType | None) -> tuple[int, ...]:
    if t is None or t.shape is None:
        raise Unsupported("unknown rank")
    if not all(isinstance(d, int) for d in t.shape):
        raise Unsupported(f"{t} has symbolic dims (kernels from TVM need static shapes)")
    return tuple(int(d) for d in t.shape)  # type: ignore[arg-type]


def dt(e: Any) -> str:
    """The dtype of a tensor or an expression (0.27's expressions expose it through ``expr_ty``)."""
    if isinstance(e, te.Tensor):
        return str(e.dtype)
    d = getattr(e, "dtype", None)
    return str(d) if d is not None else str(e.expr_ty())


def const(v: Any, dtype: str) -> Any:
    return tirx.const(v, dtype)


def cast(x: Any, dtype: str) -> Any:
    return x if dt(x) == dtype else x.astype(dtype)


def bload(x: te.Tensor, idx: Sequence[Any]) -> Any:
    """``x`` read at output index ``idx`` under numpy broadcasting (x's rank <= len(idx))."""
    r = len(x.shape)
    sub = list(idx[len(idx) - r:]) if r else []
    args = [0 if int(d) == 1 else i for d, i in zip(x.shape, sub)]
    return x(*args) if r else x()


def elementwise(out: TensorType, ins: Sequence[te.Tensor], fn: Callable[..., Any], name: str = "out0") -> te.Tensor:
    """``out[i] = fn(in0[i], in1[i], ...)`` with broadcasting to ``out``'s static shape."""
    shape = static_shape(out)
    return te.compute(shape, lambda *i: fn(*[bload(x, i) for x in ins]), name=name)


def norm_axis(axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise Unsupported(f"axis {axis} out of range for rank {rank}")
    return a


def flat_index(idx: Sequence[Any], shape: Sequence[int]) -> Any:
    """Row-major flat index of ``idx`` in ``shape`` (int64 arithmetic)."""
    f: Any = tirx.const(0, "int64")
    for i, d in zip(idx, shape):
        f = f * d + cast(i, "int64")
    return f


def unflatten(f: Any, shape: Sequence[int]) -> list[Any]:
    """The index in ``shape`` of row-major flat index ``f``."""
    out = []
    for d in reversed(shape):
        out.append(tirx.floormod(f, d) if d != 1 else tirx.const(0, dt(f)))
        f = tirx.floordiv(f, d) if d != 1 else f
    return list(reversed(out))


def select(c: Any, a: Any, b: Any) -> Any:
    return tvm.tirx.Select(c, a, b)


def if_then_else(c: Any, a: Any, b: Any) -> Any:
    """Lazily evaluated select (the untaken branch is never read: safe for guarded loads)."""
    return tirx.if_then_else(c, a, b)


def min_value(dtype: str) -> Any:
    return tirx.min_value(dtype)


def max_value(dtype: str) -> Any:
    return tirx.max_value(dtype)
