"""Converters for the elementwise ONNX ops: unary math and activations, arithmetic, logic,
comparisons, Where, Clip, BitCast, CumSum/CumProd, and the variadic Max/Min/Sum/Mean."""

from __future__ import annotations

import numpy as np

from ...ir.graph import Value
from ...ir.ops.core import Identity
from ...ir.ops.elementwise import (
    BitCast,
    Celu,
    Clip,
    Cumulative,
    Elu,
    Gelu,
    HardSigmoid,
    IsInf,
    LeakyRelu,
    Selu,
    Shrink,
    Swish,
    ThresholdedRelu,
    Where,
    binary,
    compare,
    unary,
)
from ..onnx import NodeContext, Unsupported, converter, dtype_from_onnx

_UNARY = {
    "Abs": "abs", "Neg": "neg", "Sign": "sign", "Relu": "relu", "Exp": "exp", "Log": "log",
    "Sqrt": "sqrt", "Reciprocal": "reciprocal", "Sin": "sin", "Cos": "cos", "Tan": "tan",
    "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh",
    "Acosh": "acosh", "Atanh": "atanh", "Erf": "erf", "Floor": "floor", "Ceil": "ceil",
    "Round": "round", "Sigmoid": "sigmoid", "Tanh": "tanh", "Softplus": "softplus",
    "Softsign": "softsign", "HardSwish": "hardswish", "Mish": "mish", "IsNaN": "isnan", "Not": "not",
    "BitwiseNot": "bitwise_not",
}

_BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "PRelu": "prelu",
    "And": "and", "Or": "or", "Xor": "xor", "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor",
}

_COMPARE = {
    "Equal": "equal", "Less": "less", "Greater": "greater", "LessOrEqual": "less_equal",
    "GreaterOrEqual": "greater_equal",
}


def _x(ctx: NodeContext, i: int = 0) -> Value:
    v = ctx.input(i)
    if v is None:
        raise Unsupported(f"input {i} is required")
    return v


def _check_legacy_broadcast(ctx: NodeContext) -> None:
    """Opsets < 7 broadcast only with ``broadcast=1``; with ``axis`` the operand aligns at that
    axis instead of the trailing dims, which numpy-style broadcasting cannot express directly."""
    if ctx.opset < 7 and ctx.attr("broadcast", 0) and ctx.attr("axis") is not None:
        a, b = _x(ctx, 0), _x(ctx, 1)
        if a.type.rank is None or b.type.rank is None or ctx.attr("axis") % a.type.rank != (
            a.type.rank - b.type.rank
        ):
            raise Unsupported("legacy broadcasting with an explicit axis")


def _unary(ctx: NodeContext) -> Value:
    return ctx.add1(unary(_UNARY[ctx.node.op_type]), [_x(ctx)])


def _binary(ctx: NodeContext) -> Value:
    _check_legacy_broadcast(ctx)
    return ctx.add1(binary(_BINARY[ctx.node.op_type]), [_x(ctx, 0), _x(ctx, 1)])


def _compare(ctx: NodeContext) -> Value:
    _check_legacy_broadcast(ctx)
    return ctx.add1(compare(_COMPARE[ctx.node.op_type]), [_x(ctx, 0), _x(ctx, 1)])


converter(*_UNARY)(_unary)
converter(*_BINARY)(_binary)
converter(*_COMPARE)(_compare)


@converter("IsInf")
def _is_inf(ctx: NodeContext) -> Value:
    return ctx.add1(
        IsInf(
            detect_negative=bool(ctx.attr("detect_negative", 1)),
            detect_positive=bool(ctx.attr("detect_positive", 1)),
        ),
        [_x(ctx)],
    )


@converter("Mod")
def _mod(ctx: NodeContext) -> Value:
    fn = "fmod" if ctx.attr("fmod", 0) else "mod"
    return ctx.add1(binary(fn), [_x(ctx, 0), _x(ctx, 1)])


@converter("BitShift")
def _bit_shift(ctx: NodeContext) -> Value:
    direction = ctx.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise Unsupported(f"direction {direction!r} (LEFT or RIGHT)")
    return ctx.add1(binary("shl" if direction == "LEFT" else "shr"), [_x(ctx, 0), _x(ctx, 1)])


def _fold(ctx: NodeContext, fn: str, args: list[Value]) -> Value:
    acc = args[0]
    for v in args[1:]:
        acc = ctx.add1(binary(fn), [acc, v])
    return acc


@converter("Max", "Min", "Sum", "Mean")
def _variadic(ctx: NodeContext) -> Value:
    args = [v for v in ctx.inputs if v is not None]
    if not args:
        raise Unsupported("no inputs")
    if len(args) == 1:
        return ctx.add1(Identity(), args)
    op = ctx.node.op_type
    fn = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}[op]
    acc = _fold(ctx, fn, args)
    if op == "Mean":
        acc = ctx.add1(binary("div"), [acc, ctx.const(len(args), acc.type.dtype)])
    return acc


@converter("Where")
def _where(ctx: NodeContext) -> Value:
    return ctx.add1(Where(), [_x(ctx, 0), _x(ctx, 1), _x(ctx, 2)])


@converter("Clip")
def _clip(ctx: NodeContext) -> Value:
    x = _x(ctx)
    if ctx.opset < 11:
        lo, hi = ctx.attr("min"), ctx.attr("max")
        np_dt = x.type.dtype.np
        op = Clip(
            min=None if lo is None else np.asarray(lo, np.float64).astype(np_dt),
            max=None if hi is None else np.asarray(hi, np.float64).astype(np_dt),
        )
        return ctx.add1(op, [x])
    return ctx.add1(Clip(), [x, ctx.input(1), ctx.input(2)])


@converter("BitCast")
def _bit_cast(ctx: NodeContext) -> Value:
    return ctx.add1(BitCast(to=dtype_from_onnx(ctx.attr("to"), "BitCast's target")), [_x(ctx)])


@converter("CumSum", "CumProd")
def _cumulative(ctx: NodeContext) -> Value:
    op = Cumulative(
        fn="sum" if ctx.node.op_type == "CumSum" else "prod",
        exclusive=bool(ctx.attr("exclusive", 0)),
        reverse=bool(ctx.attr("reverse", 0)),
    )
    return ctx.add1(op, [_x(ctx, 0), _x(ctx, 1)])


# -- activations with parameters ------------------------------------------------------------------


@converter("LeakyRelu")
def _leaky_relu(ctx: NodeContext) -> Value:
    return ctx.add1(LeakyRelu(alpha=float(ctx.attr("alpha", 0.01))), [_x(ctx)])


@converter("Elu")
def _elu(ctx: NodeContext) -> Value:
    return ctx.add1(Elu(alpha=float(ctx.attr("alpha", 1.0))), [_x(ctx)])


@converter("Selu")
def _selu(ctx: NodeContext) -> Value:
    d = Selu()
    return ctx.add1(
        Selu(alpha=float(ctx.attr("alpha", d.alpha)), gamma=float(ctx.attr("gamma", d.gamma))), [_x(ctx)]
    )


@converter("Celu")
def _celu(ctx: NodeContext) -> Value:
    return ctx.add1(Celu(alpha=float(ctx.attr("alpha", 1.0))), [_x(ctx)])


@converter("HardSigmoid")
def _hard_sigmoid(ctx: NodeContext) -> Value:
    return ctx.add1(
        HardSigmoid(alpha=float(ctx.attr("alpha", 0.2)), beta=float(ctx.attr("beta", 0.5))), [_x(ctx)]
    )


@converter("ThresholdedRelu")
def _thresholded_relu(ctx: NodeContext) -> Value:
    return ctx.add1(ThresholdedRelu(alpha=float(ctx.attr("alpha", 1.0))), [_x(ctx)])


@converter("Swish")
def _swish(ctx: NodeContext) -> Value:
    return ctx.add1(Swish(alpha=float(ctx.attr("alpha", 1.0))), [_x(ctx)])


@converter("Gelu")
def _gelu(ctx: NodeContext) -> Value:
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"approximate={approximate!r}")
    return ctx.add1(Gelu(approximate=approximate), [_x(ctx)])


@converter("Shrink")
def _shrink(ctx: NodeContext) -> Value:
    return ctx.add1(
        Shrink(bias=float(ctx.attr("bias", 0.0)), lambd=float(ctx.attr("lambd", 0.5))), [_x(ctx)]
    )
