"""Elementwise ops: unary functions, parametrized activations, binary arithmetic, comparisons and
logic (numpy broadcasting), where, clip, cast, is_inf. Floats compute in their own type (f32 or
f64), except where the reference computes wider (erf, gelu, pow: f64), like ``ir/ops/elementwise.py``."""

from __future__ import annotations

import math
from typing import Any

from tvm import tirx

from ...ir.types import DType
from .common import Unsupported, builder, cast, const, dt, elementwise, select, tdtype


def _f(x: Any) -> bool:
    return dt(x).startswith("float")


def _sigmoid(x: Any) -> Any:
    e = tirx.exp(-tirx.abs(x))
    one = const(1, dt(x))
    return select(x >= const(0, dt(x)), one / (one + e), e / (one + e))


def _softplus(x: Any) -> Any:
    z = const(0, dt(x))
    return tirx.max(x, z) + tirx.log(const(1, dt(x)) + tirx.exp(-tirx.abs(x)))


def _wide(fn: Any) -> Any:
    def f(x: Any) -> Any:
        return cast(fn(cast(x, "float64")), dt(x))

    return f


UNARY = {
    "abs": tirx.abs,
    "neg": lambda x: -x,
    "sign": lambda x: select(x > const(0, dt(x)), const(1, dt(x)),
                             select(x < const(0, dt(x)), const(-1, dt(x)), const(0, dt(x)))),
    "relu": lambda x: tirx.max(x, const(0, dt(x))),
    "exp": tirx.exp, "log": tirx.log, "sqrt": tirx.sqrt, "sin": tirx.sin, "cos": tirx.cos, "tan": tirx.tan,
    "asin": tirx.asin, "acos": tirx.acos, "atan": tirx.atan, "sinh": tirx.sinh, "cosh": tirx.cosh,
    "asinh": tirx.asinh, "acosh": tirx.acosh, "atanh": tirx.atanh, "tanh": tirx.tanh,
    "erf": _wide(tirx.erf),
    "reciprocal": lambda x: const(1, dt(x)) / x,
    "floor": tirx.floor, "ceil": tirx.ceil, "round": tirx.nearbyint,
    "sigmoid": _sigmoid,
    "softplus": _softplus,
    "softsign": lambda x: x / (const(1, dt(x)) + tirx.abs(x)),
    "hardswish": lambda x: x * tirx.min(tirx.max(x * const(1 / 6, dt(x)) + const(0.5, dt(x)), const(0, dt(x))),
                                        const(1, dt(x))),
    "mish": lambda x: x * tirx.tanh(_softplus(x)),
    "isnan": tirx.isnan,
    "not": lambda x: tirx.Not(x),
    "bitwise_not": tirx.bitwise_not,
}
FLOAT_ONLY = {"exp", "log", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
              "atanh", "tanh", "erf", "reciprocal", "floor", "ceil", "round", "sigmoid", "softplus", "softsign",
              "hardswish", "mish", "isnan"}


@builder(*UNARY)
def unary(op, ins, in_types, out_types):
    fn = UNARY[op.name]
    (x,) = ins
    if op.name in FLOAT_ONLY and not _f(x):
        raise Unsupported(f"{op.name} on {dt(x)}")
    return [elementwise(out_types[0], [x], fn)]


@builder("is_inf")
def is_inf(op, ins, in_types, out_types):
    def f(x: Any) -> Any:
        pos = tirx.isinf(x) & (x > const(0, dt(x)))
        neg = tirx.isinf(x) & (x < const(0, dt(x)))
        r = tirx.const(False, "bool")
        if op.detect_positive:
            r = r | pos
        if op.detect_negative:
            r = r | neg
        return r

    return [elementwise(out_types[0], ins, f)]


def _activation(name: str, x: Any, op: Any) -> Any:
    c = lambda v: const(v, dt(x))  # noqa: E731
    zero = c(0)
    if name == "leaky_relu":
        return select(x < zero, x * c(op.alpha), x)
    if name == "elu":
        return select(x < zero, c(op.alpha) * (tirx.exp(x) - c(1)), x)
    if name == "selu":
        return c(op.gamma) * select(x <= zero, c(op.alpha) * (tirx.exp(x) - c(1)), x)
    if name == "celu":
        return tirx.max(x, zero) + tirx.min(zero, c(op.alpha) * (tirx.exp(x / c(op.alpha)) - c(1)))
    if name == "hard_sigmoid":
        return tirx.min(tirx.max(x * c(op.alpha) + c(op.beta), zero), c(1))
    if name == "thresholded_relu":
        return select(x > c(op.alpha), x, zero)
    if name == "swish":
        return x * _sigmoid(x * c(op.alpha))
    if name == "gelu":
        w = cast(x, "float64")
        h = tirx.const(0.5, "float64")
        if op.approximate == "tanh":
            inner = tirx.const(math.sqrt(2 / math.pi), "float64") * (w + tirx.const(0.044715, "float64") * w * w * w)
            return cast(h * w * (tirx.const(1, "float64") + tirx.tanh(inner)), dt(x))
        return cast(h * w * (tirx.const(1, "float64") + tirx.erf(w / tirx.const(math.sqrt(2), "float64"))), dt(x))
    if name == "shrink":
        lam, b = c(op.lambd), c(op.bias)
        return select(x < -lam, x + b, select(x > lam, x - b, zero))
    raise Unsupported(name)


@builder("leaky_relu", "elu", "selu", "celu", "hard_sigmoid", "thresholded_relu", "swish", "gelu", "shrink")
def activation(op, ins, in_types, out_types):
    if not _f(ins[0]):
        raise Unsupported(f"{op.name} on {ins[0].dtype}")
    return [elementwise(out_types[0], ins, lambda x: _activation(op.name, x, op))]


def _int_div(a: Any, b: Any) -> Any:
    zero = const(0, dt(b))
    return select(b == zero, const(0, dt(a)), tirx.truncdiv(a, select(b == zero, const(1, dt(b)), b)))


def _mod(a: Any, b: Any, floored: bool) -> Any:
    if _f(a):
        r = a - tirx.trunc(a / b) * b  # C fmod (tirx.fmod has no CPU lowering for the llvm checks)
        if not floored:
            return r
        zero = const(0, dt(a))
        return select(tirx.Or(tirx.And(r < zero, b > zero), tirx.And(r > zero, b < zero)), r + b, r)
    zero = const(0, dt(b))
    safe = select(b == zero, const(1, dt(b)), b)
    r = tirx.floormod(a, safe) if floored else tirx.truncmod(a, safe)
    return select(b == zero, const(0, dt(a)), r)


def _pow(a: Any, b: Any) -> Any:
    if not _f(a):
        raise Unsupported("integer pow")
    return cast(tirx.power(cast(a, "float64"), cast(b, "float64")), dt(a))


BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b if _f(a) else _int_div(a, b),
    "mod": lambda a, b: _mod(a, b, True),
    "fmod": lambda a, b: _mod(a, b, False),
    "pow": _pow,
    "max": tirx.max,
    "min": tirx.min,
    "prelu": lambda a, b: select(a < const(0, dt(a)), a * b, a),
    "and": lambda a, b: tirx.And(a, b),
    "or": lambda a, b: tirx.Or(a, b),
    "xor": lambda a, b: tirx.Not(a == b),
    "bitwise_and": tirx.bitwise_and,
    "bitwise_or": tirx.bitwise_or,
    "bitwise_xor": tirx.bitwise_xor,
    "equal": lambda a, b: a == b,
    "less": lambda a, b: a < b,
    "greater": lambda a, b: a > b,
    "less_equal": lambda a, b: a <= b,
    "greater_equal": lambda a, b: a >= b,
}


@builder(*BINARY)
def binary(op, ins, in_types, out_types):
    fn = BINARY[op.name]
    return [elementwise(out_types[0], ins, fn)]


@builder("where")
def where(op, ins, in_types, out_types):
    return [elementwise(out_types[0], ins, lambda c, x, y: select(c, x, y))]


@builder("clip")
def clip(op, ins, in_types, out_types):
    x = ins[0]
    lo_in = ins[1] if len(ins) > 1 else None
    hi_in = ins[2] if len(ins) > 2 else None
    lo = None if op.min is None else const(op.min.reshape(()).item(), dt(x))
    hi = None if op.max is None else const(op.max.reshape(()).item(), dt(x))
    tensors = [x] + [t for t in (lo_in, hi_in) if t is not None]

    def f(v: Any, *bounds: Any) -> Any:
        k = 0
        lo_v, hi_v = lo, hi
        if lo_in is not None:
            lo_v, k = bounds[k], k + 1
        if hi_in is not None:
            hi_v = bounds[k]
        if lo_v is not None:
            v = tirx.max(v, lo_v)
        if hi_v is not None:
            v = tirx.min(v, hi_v)
        return v

    # bounds are scalars or 1-element vectors: broadcasting reads their one element
    return [elementwise(out_types[0], tensors, f)]


@builder("cast")
def cast_op(op, ins, in_types, out_types):
    (x,) = ins
    to = tdtype(op.to)
    src = in_types[0]
    assert src is not None
    if op.to is DType.bool:
        return [elementwise(out_types[0], [x], lambda v: v != const(0, dt(v)))]
    if src.dtype.is_float and op.to.is_int:
        # float -> int: truncation toward zero (C), like numpy's astype
        return [elementwise(out_types[0], [x], lambda v: tirx.trunc(v).astype(to))]
    return [elementwise(out_types[0], [x], lambda v: v.astype(to))]


@builder("identity")
def identity(op, ins, in_types, out_types):
    return [elementwise(out_types[0], [ins[0]], lambda v: v)]
