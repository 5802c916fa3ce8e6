"""Converters for the Reduce* family, ArgMax and ArgMin."""

from __future__ import annotations

from ...ir.graph import Value
from ...ir.ops.reduce import (
    ArgMax,
    ArgMin,
    ReduceL1,
    ReduceL2,
    ReduceLogSum,
    ReduceLogSumExp,
    ReduceMax,
    ReduceMean,
    ReduceMin,
    ReduceProd,
    ReduceSum,
    ReduceSumSquare,
    _Reduce,
)
from ..onnx import NodeContext, converter

_REDUCE: dict[str, type[_Reduce]] = {
    "ReduceSum": ReduceSum,
    "ReduceSumSquare": ReduceSumSquare,
    "ReduceMean": ReduceMean,
    "ReduceMax": ReduceMax,
    "ReduceMin": ReduceMin,
    "ReduceProd": ReduceProd,
    "ReduceL1": ReduceL1,
    "ReduceL2": ReduceL2,
    "ReduceLogSum": ReduceLogSum,
    "ReduceLogSumExp": ReduceLogSumExp,
}
#: The opset from which ``axes`` is an input rather than an attribute.
_AXES_INPUT_SINCE = {"ReduceSum": 13}


@converter(*_REDUCE)
def _reduce(ctx: NodeContext) -> Value:
    op_type = ctx.node.op_type
    cls = _REDUCE[op_type]
    keepdims = bool(ctx.attr("keepdims", 1))
    noop = bool(ctx.attr("noop_with_empty_axes", 0))
    if ctx.opset >= _AXES_INPUT_SINCE.get(op_type, 18):
        return ctx.add1(cls(keepdims=keepdims, noop_with_empty_axes=noop), [ctx.input(0), ctx.input(1)])
    axes = ctx.attr("axes")
    op = cls(axes=None if axes is None else tuple(int(a) for a in axes), keepdims=keepdims)
    return ctx.add1(op, [ctx.input(0)])


@converter("ArgMax", "ArgMin")
def _arg(ctx: NodeContext) -> Value:
    cls = ArgMax if ctx.node.op_type == "ArgMax" else ArgMin
    op = cls(
        axis=int(ctx.attr("axis", 0)),
        keepdims=bool(ctx.attr("keepdims", 1)),
        select_last_index=bool(ctx.attr("select_last_index", 0)),
    )
    return ctx.add1(op, [ctx.input(0)])
