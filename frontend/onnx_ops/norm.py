"""Converters for Softmax, LogSoftmax, Hardmax, the normalizations and the two losses."""

from __future__ import annotations

import numpy as np

from ...ir.graph import Value
from ...ir.ops.norm import (
    BatchNorm,
    BatchNormTraining,
    GroupNorm,
    Hardmax,
    LayerNorm,
    LogSoftmax,
    LpNorm,
    Lrn,
    MeanVarianceNorm,
    NllLoss,
    RmsNorm,
    Softmax,
)
from ...ir.types import DType, normalize_axis
from ..onnx import NodeContext, Unsupported, converter, dtype_from_onnx

_SOFTMAX = {"Softmax": Softmax, "LogSoftmax": LogSoftmax, "Hardmax": Hardmax}


@converter(*_SOFTMAX)
def _softmax(ctx: NodeContext) -> Value:
    cls = _SOFTMAX[ctx.node.op_type]
    x = ctx.input(0)
    assert x is not None
    if ctx.opset >= 13:
        return ctx.add1(cls(axis=int(ctx.attr("axis", -1))), [x])
    # opset < 13: the input is coerced to 2-D [prod(shape[:axis]), prod(shape[axis:])]
    axis = int(ctx.attr("axis", 1))
    rank = x.type.rank
    last = rank is not None and normalize_axis(axis, rank) == rank - 1
    return ctx.add1(cls(axis=axis, coerce_2d=not last), [x])


def _stash(ctx: NodeContext) -> DType:
    stash = dtype_from_onnx(int(ctx.attr("stash_type", 1)), "stash_type")
    if not stash.is_float:
        raise Unsupported(f"stash_type {stash.value} is not a float type")
    return stash


@converter("LayerNormalization")
def _layer_norm(ctx: NodeContext) -> list[Value]:
    stats = any(ctx.node.output[1:])
    op = LayerNorm(
        eps=float(ctx.attr("epsilon", 1e-5)), axis=int(ctx.attr("axis", -1)), stash_type=_stash(ctx),
        stats=stats,
    )
    return ctx.add(op, [ctx.input(0), ctx.input(1), ctx.input(2)])


@converter("RMSNormalization")
def _rms_norm(ctx: NodeContext) -> Value:
    op = RmsNorm(eps=float(ctx.attr("epsilon", 1e-5)), axis=int(ctx.attr("axis", -1)), stash_type=_stash(ctx))
    return ctx.add1(op, [ctx.input(0), ctx.input(1)])


@converter("BatchNormalization")
def _batch_norm(ctx: NodeContext) -> list[Value]:
    if ctx.opset < 9 and int(ctx.attr("spatial", 1)) != 1:
        raise Unsupported("spatial=0 (per-activation statistics)")
    eps = float(ctx.attr("epsilon", 1e-5))
    ins = [ctx.input(i) for i in range(5)]
    if ctx.opset >= 14:
        training = bool(ctx.attr("training_mode", 0))
    elif ctx.opset < 7 and "is_test" in ctx.attrs:
        training = not ctx.attr("is_test")
    else:
        training = any(ctx.node.output[1:])
    if not training:
        return ctx.add(BatchNorm(eps=eps), ins)
    if any(ctx.node.output[3:]):
        raise Unsupported("training mode with saved_mean/saved_var outputs (opset < 14)")
    return ctx.add(BatchNormTraining(eps=eps, momentum=float(ctx.attr("momentum", 0.9))), ins)


@converter("InstanceNormalization")
def _instance_norm(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    assert x is not None
    c = x.type.shape[1] if x.type.shape is not None and len(x.type.shape) >= 2 else None
    if not isinstance(c, int):
        raise Unsupported(f"the channel count of {x.type} is not static")
    op = GroupNorm(num_groups=c, eps=float(ctx.attr("epsilon", 1e-5)))
    return ctx.add1(op, [x, ctx.input(1), ctx.input(2)])


@converter("GroupNormalization")
def _group_norm(ctx: NodeContext) -> Value:
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    assert x is not None and scale is not None and bias is not None
    groups = int(ctx.attr("num_groups"))
    eps = float(ctx.attr("epsilon", 1e-5))
    if ctx.opset >= 21:
        return ctx.add1(GroupNorm(num_groups=groups, eps=eps, stash_type=_stash(ctx)), [x, scale, bias])
    # opset 18: scale and bias are per group; repeat them per channel
    c = x.type.shape[1] if x.type.shape is not None and len(x.type.shape) >= 2 else None
    s, b = ctx.const_value(scale), ctx.const_value(bias)
    if not isinstance(c, int) or s is None or b is None or c % groups:
        raise Unsupported(
            "per-group scale/bias (opset 18) need constant scale/bias and a static channel count"
        )
    k = c // groups
    scale = ctx.const(np.repeat(np.asarray(s).reshape(-1), k))
    bias = ctx.const(np.repeat(np.asarray(b).reshape(-1), k))
    return ctx.add1(GroupNorm(num_groups=groups, eps=eps), [x, scale, bias])


@converter("LpNormalization")
def _lp_norm(ctx: NodeContext) -> Value:
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise Unsupported(f"p={p} (only 1 and 2 are defined)")
    return ctx.add1(LpNorm(axis=int(ctx.attr("axis", -1)), p=p), [ctx.input(0)])


@converter("MeanVarianceNormalization")
def _mvn(ctx: NodeContext) -> Value:
    axes = tuple(int(a) for a in ctx.attr("axes", (0, 2, 3)))
    return ctx.add1(MeanVarianceNorm(axes=axes), [ctx.input(0)])


@converter("LRN")
def _lrn(ctx: NodeContext) -> Value:
    op = Lrn(
        size=int(ctx.attr("size")),
        alpha=float(ctx.attr("alpha", 1e-4)),
        beta=float(ctx.attr("beta", 0.75)),
        bias=float(ctx.attr("bias", 1.0)),
    )
    return ctx.add1(op, [ctx.input(0)])


def _nll_op(ctx: NodeContext) -> NllLoss:
    ii = ctx.attr("ignore_index")
    return NllLoss(reduction=str(ctx.attr("reduction", "mean")), ignore_index=None if ii is None else int(ii))


@converter("NegativeLogLikelihoodLoss")
def _nll_loss(ctx: NodeContext) -> Value:
    return ctx.add1(_nll_op(ctx), [ctx.input(0), ctx.input(1), ctx.input(2)])


@converter("SoftmaxCrossEntropyLoss")
def _sce_loss(ctx: NodeContext) -> list[Value]:
    log_prob = ctx.add1(LogSoftmax(axis=1), [ctx.input(0)])
    loss = ctx.add1(_nll_op(ctx), [log_prob, ctx.input(1), ctx.input(2)])
    return [loss, log_prob]
