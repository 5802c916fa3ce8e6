"""Elementwise ops: unary math and activations, binary arithmetic/logic, comparisons, select,
clip, bit casts and cumulative sums/products.

Most functions go through three table-driven ops, ``unary``, ``binary`` and ``compare``, whose
``fn`` attribute picks the function; activations with parameters (``leaky_relu``, ``elu``, ...)
have their own op with typed attributes.

Numerics of the references (the CPU backend is the oracle for GPU kernels): f64 computes in f64,
f32 in f32, and narrower floats (f16, bf16, fp8) in f32, rounded back once per op with
``cast_array`` (round to nearest even, saturating). ``erf``, ``gelu`` and float ``pow`` compute in
f64 and round back. Integer arithmetic wraps like C; integer division truncates toward zero, and
integer division or remainder by zero gives 0 (where C leaves it undefined).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..types import DType, TensorType, broadcast_shapes, normalize_axis
from .core import cast_array

try:  # scipy is optional: its erf is fast; math.erf is exact but runs per element
    from scipy.special import erf as _erf64  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - depends on the environment
    _erf64 = np.vectorize(math.erf, otypes=[np.float64])

# -- dtype helpers --------------------------------------------------------------------------------

_NARROW_INTS = (DType.i4, DType.u4)


def _kind(dt: DType) -> str:
    """One letter per dtype class: f(loat), i(signed int), u(nsigned int), b(ool), x (other)."""
    if dt is DType.bool:
        return "b"
    if dt is DType.f8e8m0 or dt in _NARROW_INTS:
        return "x"  # scale-only / packed formats: no elementwise arithmetic
    if dt.is_float:
        return "f"
    return "i" if dt.is_signed else "u"


_KIND_NAMES = {"f": "float", "i": "signed int", "u": "unsigned int", "b": "bool"}


def _check(t: TensorType, kinds: str, what: str) -> None:
    if _kind(t.dtype) not in kinds:
        allowed = ", ".join(_KIND_NAMES[k] for k in kinds)
        raise OpError(f"{what} does not accept {t.dtype.value} inputs (allowed: {allowed})")


def _compute_dtype(dtype: np.dtype, wide: bool = False) -> np.dtype:
    """The dtype a float computation runs in: f64 stays, everything else runs in f32 (or f64)."""
    if dtype == np.float64 or wide:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _back(y: np.ndarray | np.generic, dtype: np.dtype) -> np.ndarray:
    """Round a computed result back to the op's output dtype (once)."""
    y = np.asarray(y)
    if y.dtype == dtype:
        return y
    return cast_array(y, DType.from_np(dtype))


def _fapply(f: Callable[..., np.ndarray], x: np.ndarray, *rest: np.ndarray, wide: bool = False) -> np.ndarray:
    """Apply a float function in the compute dtype and round back to ``x``'s dtype."""
    cdt = _compute_dtype(x.dtype, wide)
    with np.errstate(all="ignore"):
        y = f(x.astype(cdt, copy=False), *(r.astype(cdt, copy=False) for r in rest))
    return _back(y, x.dtype)


def _contig(x: np.ndarray) -> np.ndarray:
    """C-contiguous (np.ascontiguousarray would turn a 0-d array into 1-d)."""
    return x if x.flags.c_contiguous else x.copy(order="C")


def _same_dtypes(ts: Sequence[TensorType], what: str) -> None:
    if len({t.dtype for t in ts}) > 1:
        raise OpError(f"{what}: inputs must have one dtype, got {', '.join(t.dtype.value for t in ts)}")


def _broadcast(ts: Sequence[TensorType], what: str) -> tuple | None:
    try:
        return broadcast_shapes(*(t.shape for t in ts))
    except ValueError as e:
        raise OpError(f"{what}: {e}") from None


# -- unary functions ------------------------------------------------------------------------------


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(x, np.zeros((), x.dtype))


def _hardswish(x: np.ndarray) -> np.ndarray:
    return x * np.clip(x * x.dtype.type(1 / 6) + x.dtype.type(0.5), 0, 1)


def _mish(x: np.ndarray) -> np.ndarray:
    return x * np.tanh(_softplus(x))


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, x.dtype.type(0))


#: fn -> (accepted dtype kinds, function, output is bool, compute floats in f64)
_UNARY: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray], bool, bool]] = {
    "abs": ("fiu", np.abs, False, False),
    "neg": ("fi", np.negative, False, False),
    "sign": ("fiu", np.sign, False, False),
    "relu": ("fi", _relu, False, False),
    "exp": ("f", np.exp, False, False),
    "log": ("f", np.log, False, False),
    "sqrt": ("f", np.sqrt, False, False),
    "reciprocal": ("f", np.reciprocal, False, False),
    "sin": ("f", np.sin, False, False),
    "cos": ("f", np.cos, False, False),
    "tan": ("f", np.tan, False, False),
    "asin": ("f", np.arcsin, False, False),
    "acos": ("f", np.arccos, False, False),
    "atan": ("f", np.arctan, False, False),
    "sinh": ("f", np.sinh, False, False),
    "cosh": ("f", np.cosh, False, False),
    "asinh": ("f", np.arcsinh, False, False),
    "acosh": ("f", np.arccosh, False, False),
    "atanh": ("f", np.arctanh, False, False),
    "erf": ("f", _erf64, False, True),
    "floor": ("f", np.floor, False, False),
    "ceil": ("f", np.ceil, False, False),
    "round": ("f", np.rint, False, False),  # half to even
    "sigmoid": ("f", _sigmoid, False, False),
    "tanh": ("f", np.tanh, False, False),
    "softplus": ("f", _softplus, False, False),
    "softsign": ("f", lambda x: x / (1 + np.abs(x)), False, False),
    "hardswish": ("f", _hardswish, False, False),
    "mish": ("f", _mish, False, False),
    "isnan": ("f", np.isnan, True, False),
    "not": ("b", np.logical_not, False, False),
    "bitwise_not": ("iu", np.invert, False, False),
}


@dataclass(frozen=True, eq=False)
class Unary(Op):
    """``y = fn(x)`` for a function from a fixed table (``abs``, ``exp``, ``sigmoid``, ...).

    One registered op per function (``exp(%x)``, ``sigmoid(%x)``); build them with ``unary(fn)``.
    """

    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    fn: ClassVar[str] = ""

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        if self.fn not in _UNARY:
            raise OpError(f"unknown unary function {self.fn!r}")
        t = require(inputs[0])
        kinds, _, to_bool, _ = _UNARY[self.fn]
        _check(t, kinds, self.fn)
        return [TensorType(DType.bool if to_bool else t.dtype, t.shape)]

    def ref(self, x: np.ndarray) -> np.ndarray:
        kinds, f, to_bool, wide = _UNARY[self.fn]
        if _kind(DType.from_np(x.dtype)) == "f":
            if to_bool:
                return np.asarray(f(x.astype(_compute_dtype(x.dtype), copy=False)))
            return _fapply(f, x, wide=wide)
        with np.errstate(all="ignore"):
            return np.asarray(f(x)).astype(x.dtype, copy=False)


@register
@dataclass(frozen=True, eq=False)
class IsInf(Op):
    name: ClassVar[str] = "is_inf"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    detect_negative: bool = True
    detect_positive: bool = True

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        t = require(inputs[0])
        _check(t, "f", "is_inf")
        return [TensorType(DType.bool, t.shape)]

    def ref(self, x: np.ndarray) -> np.ndarray:
        xf = x.astype(_compute_dtype(x.dtype), copy=False)
        out = np.zeros(x.shape, np.bool_)
        if self.detect_positive:
            out |= np.isposinf(xf)
        if self.detect_negative:
            out |= np.isneginf(xf)
        return out


# -- activations with parameters ------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _FloatActivation(Op):
    """Base of the parametrized activations: same type out as in, computed by ``_f``."""

    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    kinds: ClassVar[str] = "f"
    wide: ClassVar[bool] = False

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        t = require(inputs[0])
        _check(t, self.kinds, self.name)
        return [TensorType(t.dtype, t.shape)]

    def ref(self, x: np.ndarray) -> np.ndarray:
        if _kind(DType.from_np(x.dtype)) != "f":  # integer inputs: compute in f64, truncate back
            with np.errstate(all="ignore"):
                return cast_array(np.asarray(self._f(x.astype(np.float64))), DType.from_np(x.dtype))
        return _fapply(self._f, x, wide=self.wide)

    def _f(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError


@register
@dataclass(frozen=True, eq=False)
class LeakyRelu(_FloatActivation):
    name: ClassVar[str] = "leaky_relu"
    alpha: float = 0.01

    def _f(self, x: np.ndarray) -> np.ndarray:
        return np.where(x < 0, x * x.dtype.type(self.alpha), x)


@register
@dataclass(frozen=True, eq=False)
class Elu(_FloatActivation):
    name: ClassVar[str] = "elu"
    alpha: float = 1.0

    def _f(self, x: np.ndarray) -> np.ndarray:
        return np.where(x < 0, x.dtype.type(self.alpha) * np.expm1(x), x)


@register
@dataclass(frozen=True, eq=False)
class Selu(_FloatActivation):
    name: ClassVar[str] = "selu"
    alpha: float = 1.67326319217681884765625
    gamma: float = 1.05070102214813232421875

    def _f(self, x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        return t(self.gamma) * np.where(x <= 0, t(self.alpha) * np.expm1(x), x)


@register
@dataclass(frozen=True, eq=False)
class Celu(_FloatActivation):
    name: ClassVar[str] = "celu"
    alpha: float = 1.0

    def _f(self, x: np.ndarray) -> np.ndarray:
        a = x.dtype.type(self.alpha)
        return np.maximum(x, 0) + np.minimum(0, a * np.expm1(x / a))


@register
@dataclass(frozen=True, eq=False)
class HardSigmoid(_FloatActivation):
    name: ClassVar[str] = "hard_sigmoid"
    alpha: float = 0.2
    beta: float = 0.5

    def _f(self, x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        return np.clip(x * t(self.alpha) + t(self.beta), 0, 1)


@register
@dataclass(frozen=True, eq=False)
class ThresholdedRelu(_FloatActivation):
    name: ClassVar[str] = "thresholded_relu"
    alpha: float = 1.0

    def _f(self, x: np.ndarray) -> np.ndarray:
        return np.where(x > x.dtype.type(self.alpha), x, 0)


@register
@dataclass(frozen=True, eq=False)
class Swish(_FloatActivation):
    """``x * sigmoid(alpha * x)`` (SiLU for alpha = 1)."""

    name: ClassVar[str] = "swish"
    alpha: float = 1.0

    def _f(self, x: np.ndarray) -> np.ndarray:
        return x * _sigmoid(x * x.dtype.type(self.alpha))


@register
@dataclass(frozen=True, eq=False)
class Gelu(_FloatActivation):
    """``approximate="none"``: ``x * Phi(x)`` with erf; ``"tanh"``: the tanh approximation."""

    name: ClassVar[str] = "gelu"
    wide: ClassVar[bool] = True
    approximate: str = "none"

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        if self.approximate not in ("none", "tanh"):
            raise OpError(f"gelu: unknown approximate={self.approximate!r} (none or tanh)")
        return super().infer(inputs)

    def _f(self, x: np.ndarray) -> np.ndarray:
        if self.approximate == "tanh":
            inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
            return 0.5 * x * (1 + np.tanh(inner))
        return 0.5 * x * (1 + _erf64(x / math.sqrt(2)))


@register
@dataclass(frozen=True, eq=False)
class Shrink(_FloatActivation):
    """``x - bias`` above ``lambd``, ``x + bias`` below ``-lambd``, else 0 (ints too)."""

    name: ClassVar[str] = "shrink"
    kinds: ClassVar[str] = "fiu"
    bias: float = 0.0
    lambd: float = 0.5

    def _f(self, x: np.ndarray) -> np.ndarray:
        t = x.dtype.type
        lam, b = t(self.lambd), t(self.bias)
        return np.where(x < -lam, x + b, np.where(x > lam, x - b, 0))


# -- binary ---------------------------------------------------------------------------------------


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (C semantics); x / 0 gives 0."""
    safe = np.where(b == 0, 1, b).astype(b.dtype)
    q = np.floor_divide(a, safe)
    if a.dtype.kind == "i":
        r = a - q * safe
        q = q + ((r != 0) & ((a < 0) != (safe < 0))).astype(q.dtype)
    return np.where(b == 0, 0, q).astype(a.dtype)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.true_divide(a, b) if a.dtype.kind == "f" else _int_div(a, b)


def _mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Remainder with the sign of the divisor (Python's %); x % 0 gives 0 for integers."""
    if a.dtype.kind == "f":
        return np.mod(a, b)
    return np.where(b == 0, 0, np.mod(a, np.where(b == 0, 1, b).astype(b.dtype))).astype(a.dtype)


def _fmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Remainder with the sign of the dividend (C's fmod / %); x % 0 gives 0 for integers."""
    if a.dtype.kind == "f":
        return np.fmod(a, b)
    return np.where(b == 0, 0, np.fmod(a, np.where(b == 0, 1, b).astype(b.dtype))).astype(a.dtype)


def _unsigned(dt: np.dtype) -> np.dtype:
    return np.dtype(f"u{dt.itemsize}")


def _shift(a: np.ndarray, b: np.ndarray, left: bool) -> np.ndarray:
    """Logical left / arithmetic right shift; shifts < 0 or >= the bit width give 0 (-1 for a
    negative value shifted right)."""
    bits = a.dtype.itemsize * 8
    a, b = np.broadcast_arrays(a, b)
    b64 = b.astype(np.int64)
    out_of_range = (b64 < 0) | (b64 >= bits)
    s = np.where(out_of_range, 0, b64)
    if left:
        u = _contig(a).view(_unsigned(a.dtype))
        r = np.left_shift(u, s.astype(u.dtype)).view(a.dtype)
        return np.where(out_of_range, 0, r).astype(a.dtype)
    r = np.right_shift(a, s.astype(a.dtype))
    fill = np.where(a < 0, -1, 0) if a.dtype.kind == "i" else 0
    return np.where(out_of_range, fill, r).astype(a.dtype)


def _prelu(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    return np.where(x < 0, x * slope, x)


def _int_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer power, wrapping like repeated multiplication; negative exponents truncate (so
    1 -> 1, -1 -> +-1, others -> 0)."""
    wide = np.dtype(np.int64) if a.dtype.kind == "i" else np.dtype(np.uint64)
    b64 = b.astype(np.int64)
    neg = b64 < 0
    with np.errstate(all="ignore"):
        r = np.power(a.astype(wide), np.where(neg, 0, b64).astype(wide))
    odd = (b64 % 2) != 0
    neg_val = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0)) if a.dtype.kind == "i" else (
        np.where(a == 1, 1, 0)
    )
    return np.where(neg, neg_val, r).astype(a.dtype)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a ** b`` in ``a``'s dtype; the exponent may have another numeric dtype."""
    if _kind(DType.from_np(a.dtype)) == "f":
        # float bases: computed in f64 (mixed-dtype exponents lose nothing), rounded once
        with np.errstate(all="ignore"):
            y = np.power(a.astype(np.float64), b.astype(np.float64))
        return _back(y, a.dtype)
    if _kind(DType.from_np(b.dtype)) == "f":
        with np.errstate(all="ignore"):
            y = np.power(a.astype(np.float64), b.astype(np.float64))
        return cast_array(np.asarray(y), DType.from_np(a.dtype))
    return _int_pow(a, b)


#: fn -> (accepted dtype kinds, function)
_BINARY: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "add": ("fiu", np.add),
    "sub": ("fiu", np.subtract),
    "mul": ("fiu", np.multiply),
    "div": ("fiu", _div),
    "mod": ("fiu", _mod),
    "fmod": ("fiu", _fmod),
    "pow": ("fiu", _pow),
    "max": ("fiu", np.maximum),
    "min": ("fiu", np.minimum),
    "prelu": ("fiu", _prelu),
    "and": ("b", np.logical_and),
    "or": ("b", np.logical_or),
    "xor": ("b", np.logical_xor),
    "bitwise_and": ("iu", np.bitwise_and),
    "bitwise_or": ("iu", np.bitwise_or),
    "bitwise_xor": ("iu", np.bitwise_xor),
    "shl": ("iu", lambda a, b: _shift(a, b, True)),
    "shr": ("iu", lambda a, b: _shift(a, b, False)),
}


@dataclass(frozen=True, eq=False)
class Binary(Op):
    """``y = fn(a, b)`` with numpy broadcasting; one dtype in and out (``pow``: out is ``a``'s
    dtype, the exponent may be any numeric type).

    One registered op per function (``add(%a, %b)``, ``mul``, ...); build them with ``binary(fn)``.
    """

    num_inputs: ClassVar[tuple[int, int | None]] = (2, 2)
    fn: ClassVar[str] = ""

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        if self.fn not in _BINARY:
            raise OpError(f"unknown binary function {self.fn!r}")
        a, b = require(inputs[0]), require(inputs[1])
        kinds = _BINARY[self.fn][0]
        _check(a, kinds, self.fn)
        _check(b, kinds, self.fn)
        if self.fn != "pow":
            _same_dtypes([a, b], self.fn)
        return [TensorType(a.dtype, _broadcast([a, b], self.fn))]

    def ref(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        f = _BINARY[self.fn][1]
        if self.fn == "pow":
            return _pow(a, b)
        if _kind(DType.from_np(a.dtype)) == "f":
            return _fapply(f, a, b)
        with np.errstate(all="ignore"):
            return np.asarray(f(a, b)).astype(a.dtype, copy=False)


_COMPARE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "equal": np.equal,
    "less": np.less,
    "greater": np.greater,
    "less_equal": np.less_equal,
    "greater_equal": np.greater_equal,
}


@dataclass(frozen=True, eq=False)
class Compare(Op):
    """``y = a <fn> b`` (equal, less, greater, less_equal, greater_equal) with broadcasting; the
    output is bool. One registered op per comparison; build them with ``compare(fn)``."""

    num_inputs: ClassVar[tuple[int, int | None]] = (2, 2)
    fn: ClassVar[str] = ""

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        if self.fn not in _COMPARE:
            raise OpError(f"unknown comparison {self.fn!r} (one of {', '.join(_COMPARE)})")
        a, b = require(inputs[0]), require(inputs[1])
        _check(a, "fiub" if self.fn == "equal" else "fiu", self.fn)
        _same_dtypes([a, b], self.fn)
        return [TensorType(DType.bool, _broadcast([a, b], self.fn))]

    def ref(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if _kind(DType.from_np(a.dtype)) == "f" and a.dtype not in (np.float32, np.float64):
            a, b = a.astype(np.float32), b.astype(np.float32)  # exact for the narrow floats
        return np.asarray(_COMPARE[self.fn](a, b))


@register
@dataclass(frozen=True, eq=False)
class Where(Op):
    """``cond ? x : y`` with three-way broadcasting."""

    name: ClassVar[str] = "where"
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 3)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        c, x, y = (require(t) for t in inputs)
        if c.dtype is not DType.bool:
            raise OpError(f"where: the condition must be bool, got {c.dtype.value}")
        _same_dtypes([x, y], "where")
        return [TensorType(x.dtype, _broadcast([c, x, y], "where"))]

    def ref(self, c: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.asarray(np.where(c, x, y)).astype(x.dtype, copy=False)


@register
@dataclass(frozen=True, eq=False)
class Clip(Op):
    """``min(max(x, min), max)``; bounds are scalar attributes when constant, else inputs 1 and 2.
    With min > max every element becomes max."""

    name: ClassVar[str] = "clip"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 3)
    const_inputs: ClassVar[dict[int, str]] = {1: "min", 2: "max"}
    min: np.ndarray | None = None
    max: np.ndarray | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        _check(x, "fiu", "clip")
        for i, attr in ((1, self.min), (2, self.max)):
            bound = inputs[i] if i < len(inputs) else None
            if attr is not None and bound is not None:
                raise OpError(f"clip: bound {i} is given both as an attribute and an input")
            if attr is not None:
                if attr.size != 1 or attr.dtype != x.dtype.np:
                    raise OpError(f"clip: bound {i} must be one {x.dtype.value}, got {TensorType.of(attr)}")
            if bound is not None:
                if bound.dtype != x.dtype or (bound.shape is not None and len(bound.shape) > 1):
                    raise OpError(f"clip: bound {i} must be a scalar {x.dtype.value}, got {bound}")
        return [TensorType(x.dtype, x.shape)]

    def ref(self, x: np.ndarray, lo: np.ndarray | None = None, hi: np.ndarray | None = None) -> np.ndarray:
        lo = self.min if lo is None else lo
        hi = self.max if hi is None else hi
        is_float = _kind(DType.from_np(x.dtype)) == "f"
        cdt = _compute_dtype(x.dtype) if is_float else x.dtype
        y = x.astype(cdt, copy=False)
        with np.errstate(all="ignore"):
            if lo is not None:
                y = np.maximum(y, np.asarray(lo).reshape(()).astype(cdt))
            if hi is not None:
                y = np.minimum(y, np.asarray(hi).reshape(()).astype(cdt))
        return _back(y, x.dtype) if is_float else np.asarray(y).astype(x.dtype, copy=False)


@register
@dataclass(frozen=True, eq=False)
class BitCast(Op):
    """Reinterpret the bits of each element as another type of the same width."""

    name: ClassVar[str] = "bit_cast"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    to: DType = DType.i32

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        t = require(inputs[0])
        if t.dtype.itemsize_bits != self.to.itemsize_bits:
            raise OpError(
                f"bit_cast: {t.dtype.value} ({t.dtype.itemsize_bits} bits) and {self.to.value} "
                f"({self.to.itemsize_bits} bits) differ in width"
            )
        return [TensorType(self.to, t.shape)]

    def ref(self, x: np.ndarray) -> np.ndarray:
        return _contig(x).view(self.to.np)


# -- cumulative -----------------------------------------------------------------------------------


@register
@dataclass(frozen=True, eq=False)
class Cumulative(Op):
    """Running sum or product along ``axis`` (``fn`` = "sum" | "prod"); ``exclusive`` leaves the
    current element out, ``reverse`` runs from the end. The axis is an input when not constant.
    Narrow floats accumulate in f32."""

    name: ClassVar[str] = "cumulative"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 2)
    const_inputs: ClassVar[dict[int, str]] = {1: "axis"}
    fn: str = "sum"
    axis: int | None = None
    exclusive: bool = False
    reverse: bool = False

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        if self.fn not in ("sum", "prod"):
            raise OpError(f"cumulative: unknown fn {self.fn!r} (sum or prod)")
        x = require(inputs[0])
        _check(x, "fiu", f"cum{self.fn}")
        dyn = inputs[1] if len(inputs) > 1 else None
        if self.axis is None and dyn is None:
            raise OpError(f"cum{self.fn}: no axis (neither an attribute nor an input)")
        if dyn is not None and _kind(dyn.dtype) not in "iu":
            raise OpError(f"cum{self.fn}: the axis must be an integer, got {dyn.dtype.value}")
        if self.axis is not None and x.rank is not None:
            normalize_axis(self.axis, x.rank)
        return [TensorType(x.dtype, x.shape)]

    def ref(self, x: np.ndarray, axis: np.ndarray | None = None) -> np.ndarray:
        ax = normalize_axis(self.axis if axis is None else int(np.asarray(axis).reshape(-1)[0]), x.ndim)
        is_float = _kind(DType.from_np(x.dtype)) == "f"
        y = x.astype(_compute_dtype(x.dtype), copy=False) if is_float else x
        if self.reverse:
            y = np.flip(y, ax)
        with np.errstate(all="ignore"):
            acc = np.cumsum(y, axis=ax, dtype=y.dtype) if self.fn == "sum" else np.cumprod(
                y, axis=ax, dtype=y.dtype
            )
        if self.exclusive and acc.shape[ax] > 0:
            first = np.full_like(np.take(acc, [0], axis=ax), 0 if self.fn == "sum" else 1)
            rest = np.take(acc, np.arange(acc.shape[ax] - 1), axis=ax)
            acc = np.concatenate([first, rest], axis=ax)
        if self.reverse:
            acc = np.flip(acc, ax)
        acc = _contig(acc)
        return _back(acc, x.dtype) if is_float else acc.astype(x.dtype, copy=False)


def _family(base: type, table: dict) -> dict[str, type]:
    """One registered op class per function of ``table``: ``exp``, ``add``, ``less``, ..."""
    classes = {}
    for fn in table:
        cls_name = "".join(part.title() for part in fn.split("_"))
        cls = dataclass(frozen=True, eq=False)(
            type(cls_name, (base,), {"name": fn, "fn": fn, "__module__": __name__, "__qualname__": cls_name})
        )
        classes[fn] = register(cls)
    return classes


UNARY_OPS = _family(Unary, _UNARY)
BINARY_OPS = _family(Binary, _BINARY)
COMPARE_OPS = _family(Compare, _COMPARE)


def unary(fn: str) -> Unary:
    """The unary op ``fn`` (``"exp"``, ``"sigmoid"``, ...)."""
    if fn not in UNARY_OPS:
        raise OpError(f"unknown unary function {fn!r}")
    return UNARY_OPS[fn]()


def binary(fn: str) -> Binary:
    """The binary op ``fn`` (``"add"``, ``"mul"``, ``"pow"``, ...)."""
    if fn not in BINARY_OPS:
        raise OpError(f"unknown binary function {fn!r}")
    return BINARY_OPS[fn]()


def compare(fn: str) -> Compare:
    """The comparison ``fn`` (``"equal"``, ``"less"``, ...)."""
    if fn not in COMPARE_OPS:
        raise OpError(f"unknown comparison {fn!r}")
    return COMPARE_OPS[fn]()


__all__ = [
    "unary", "binary", "compare", "UNARY_OPS", "BINARY_OPS", "COMPARE_OPS",
    "Unary", "IsInf", "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "ThresholdedRelu", "Swish",
    "Gelu", "Shrink", "Binary", "Compare", "Where", "Clip", "BitCast", "Cumulative",
]
