"""Converters for Constant, Identity, Cast, CastLike."""

from __future__ import annotations

import numpy as np

from ...ir.ops.core import Cast, Constant, Identity
from ..onnx import NodeContext, Unsupported, converter, dtype_from_onnx


@converter("Constant")
def _constant(ctx: NodeContext):
    a = ctx.attrs
    if "value" in a:
        arr = a["value"]
    elif "value_float" in a:
        arr = np.array(a["value_float"], np.float32)
    elif "value_floats" in a:
        arr = np.array(a["value_floats"], np.float32)
    elif "value_int" in a:
        arr = np.array(a["value_int"], np.int64)
    elif "value_ints" in a:
        arr = np.array(a["value_ints"], np.int64)
    else:
        raise Unsupported(f"Constant with attribute(s) {sorted(a)} (sparse or string values)")
    return ctx.graph.add1(Constant(value=np.asarray(arr)), [], source=ctx.name)


@converter("Identity")
def _identity(ctx: NodeContext):
    return ctx.add1(Identity(), [ctx.input(0)])


@converter("Cast")
def _cast(ctx: NodeContext):
    to = dtype_from_onnx(ctx.attr("to"), "Cast's target")
    return ctx.add1(
        Cast(to=to, saturate=bool(ctx.attr("saturate", 1)), round_mode=str(ctx.attr("round_mode", "up"))),
        [ctx.input(0)],
    )


@converter("CastLike")
def _cast_like(ctx: NodeContext):
    like = ctx.input(1)
    assert like is not None
    return ctx.add1(
        Cast(
            to=like.type.dtype,
            saturate=bool(ctx.attr("saturate", 1)),
            round_mode=str(ctx.attr("round_mode", "up")),
        ),
        [ctx.input(0)],
    )
