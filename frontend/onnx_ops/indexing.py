"""Converters for Gather*, Scatter*, TensorScatter, OneHot, Compress, NonZero, TopK, Unique."""

from __future__ import annotations

from ...ir.ops.indexing import (
    Compress,
    Gather,
    GatherElements,
    GatherND,
    NonZero,
    OneHot,
    ScatterElements,
    ScatterND,
    TensorScatter,
    TopK,
    Unique,
)
from ..onnx import NodeContext, converter
from .shape import emit, emit1


@converter("Gather")
def _gather(ctx: NodeContext):
    return emit1(ctx, Gather(axis=int(ctx.attr("axis", 0))), [ctx.input(0), ctx.input(1)])


@converter("GatherElements")
def _gather_elements(ctx: NodeContext):
    return emit1(ctx, GatherElements(axis=int(ctx.attr("axis", 0))), [ctx.input(0), ctx.input(1)])


@converter("GatherND")
def _gather_nd(ctx: NodeContext):
    return emit1(ctx, GatherND(batch_dims=int(ctx.attr("batch_dims", 0))), [ctx.input(0), ctx.input(1)])


@converter("Scatter", "ScatterElements")
def _scatter_elements(ctx: NodeContext):
    op = ScatterElements(axis=int(ctx.attr("axis", 0)), reduction=str(ctx.attr("reduction", "none")))
    return emit1(ctx, op, [ctx.input(0), ctx.input(1), ctx.input(2)])


@converter("ScatterND")
def _scatter_nd(ctx: NodeContext):
    op = ScatterND(reduction=str(ctx.attr("reduction", "none")))
    return emit1(ctx, op, [ctx.input(0), ctx.input(1), ctx.input(2)])


@converter("TensorScatter")
def _tensor_scatter(ctx: NodeContext):
    op = TensorScatter(axis=int(ctx.attr("axis", -2)), mode=str(ctx.attr("mode", "linear")))
    return emit1(ctx, op, [ctx.input(0), ctx.input(1), ctx.input(2)])


@converter("OneHot")
def _one_hot(ctx: NodeContext):
    return emit1(ctx, OneHot(axis=int(ctx.attr("axis", -1))), [ctx.input(0), ctx.input(1), ctx.input(2)])


@converter("Compress")
def _compress(ctx: NodeContext):
    axis = ctx.attr("axis")
    return emit1(ctx, Compress(axis=None if axis is None else int(axis)), [ctx.input(0), ctx.input(1)])


@converter("NonZero")
def _non_zero(ctx: NodeContext):
    return emit1(ctx, NonZero(), [ctx.input(0)])


@converter("TopK")
def _topk(ctx: NodeContext):
    axis = int(ctx.attr("axis", -1))
    largest = bool(ctx.attr("largest", 1))
    srt = bool(ctx.attr("sorted", 1))
    if ctx.opset < 10:
        return emit(ctx, TopK(axis=axis, largest=largest, sorted=srt, k=int(ctx.attr("k"))), [ctx.input(0)])
    return emit(ctx, TopK(axis=axis, largest=largest, sorted=srt), [ctx.input(0), ctx.input(1)])


@converter("Unique")
def _unique(ctx: NodeContext):
    axis = ctx.attr("axis")
    op = Unique(axis=None if axis is None else int(axis), sorted=bool(ctx.attr("sorted", 1)))
    return emit(ctx, op, [ctx.input(0)])
