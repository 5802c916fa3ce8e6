"""Converters for MaxPool, AveragePool, LpPool, the global pools, MaxUnpool and Dropout."""

from __future__ import annotations

import numpy as np

from ...ir.ops.pool import (
    AvgPool,
    Dropout,
    GlobalAvgPool,
    GlobalLpPool,
    GlobalMaxPool,
    LpPool,
    MaxPool,
    MaxUnpool,
)
from ...ir.types import DType
from ..onnx import NodeContext, Unsupported, converter
from .conv import _ints, static_auto_pad


def _common(ctx: NodeContext) -> dict:
    kernel = _ints(ctx, "kernel_shape")
    auto_pad, pads = static_auto_pad(ctx, kernel or None)
    return dict(kernel_shape=kernel, strides=_ints(ctx, "strides"), pads=pads,
                dilations=_ints(ctx, "dilations"), auto_pad=auto_pad,
                ceil_mode=bool(ctx.attr("ceil_mode", 0)))


@converter("MaxPool")
def _max_pool(ctx: NodeContext):
    with_idx = ctx.num_outputs > 1 and bool(ctx.node.output[1])
    op = MaxPool(**_common(ctx), storage_order=int(ctx.attr("storage_order", 0)), return_indices=with_idx)
    return ctx.add(op, [ctx.input(0)])


@converter("AveragePool")
def _avg_pool(ctx: NodeContext):
    return ctx.add1(AvgPool(**_common(ctx), count_include_pad=bool(ctx.attr("count_include_pad", 0))),
                    [ctx.input(0)])


@converter("LpPool")
def _lp_pool(ctx: NodeContext):
    return ctx.add1(LpPool(**_common(ctx), p=int(ctx.attr("p", 2))), [ctx.input(0)])


@converter("GlobalAveragePool")
def _gap(ctx: NodeContext):
    return ctx.add1(GlobalAvgPool(), [ctx.input(0)])


@converter("GlobalMaxPool")
def _gmp(ctx: NodeContext):
    return ctx.add1(GlobalMaxPool(), [ctx.input(0)])


@converter("GlobalLpPool")
def _glp(ctx: NodeContext):
    return ctx.add1(GlobalLpPool(p=int(ctx.attr("p", 2))), [ctx.input(0)])


@converter("MaxUnpool")
def _max_unpool(ctx: NodeContext):
    op = MaxUnpool(kernel_shape=_ints(ctx, "kernel_shape"), strides=_ints(ctx, "strides"),
                   pads=_ints(ctx, "pads"))
    return ctx.add1(op, [ctx.input(0), ctx.input(1), ctx.input(2)])


@converter("Dropout")
def _dropout(ctx: NodeContext):
    extra: list = []
    if ctx.opset >= 12 and ctx.input(2) is not None:
        t = ctx.const_value(ctx.input(2))
        r = ctx.const_value(ctx.input(1)) if ctx.input(1) is not None else np.array(0.5)
        if t is None:
            extra = [ctx.input(1), ctx.input(2)]  # decided at run time
        elif bool(np.asarray(t).reshape(-1)[0]):
            if r is None:
                extra = [ctx.input(1), ctx.input(2)]
            elif float(np.asarray(r).reshape(-1)[0]) != 0.0:
                raise Unsupported("training-mode dropout (random masks) is not supported")
    with_mask = ctx.num_outputs > 1 and bool(ctx.node.output[1])
    mask_dtype = None
    if with_mask:
        x = ctx.input(0)
        assert x is not None
        mask_dtype = DType.bool if ctx.opset >= 10 else x.type.dtype
    return ctx.add(Dropout(mask_dtype=mask_dtype), [ctx.input(0), *extra])
