"""Reductions: reduce_{sum,mean,max,min,prod,l1,l2,log_sum,log_sum_exp,sum_square}, arg_max, arg_min.

Every ``reduce_*`` op takes ``axes`` (an attribute when known at compile time, else a second i64
input), ``keepdims`` and ``noop_with_empty_axes``. No axes (``none`` or ``[]``) reduces every axis,
or returns the input unchanged with ``noop_with_empty_axes``. Reducing an empty set gives the
identity element (0 for sums, 1 for products, -inf / the smallest integer for max, ...). Narrow
floats (f16, bf16, fp8) accumulate in float32 and are cast back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..types import UNKNOWN, DType, Shape, TensorType, normalize_axis
from .core import cast_array


def _is_narrow_float(dtype: np.dtype) -> bool:
    dt = DType.from_np(dtype)
    return dt.is_float and dt not in (DType.f32, DType.f64)


def to_compute(x: np.ndarray) -> np.ndarray:
    """``x`` in a dtype numpy computes well in: float32 for narrow floats, unchanged otherwise."""
    return x.astype(np.float32) if _is_narrow_float(x.dtype) else x


def from_compute(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast a result computed by ``to_compute`` back to ``dtype`` (ONNX cast semantics)."""
    y = np.asarray(y)
    if y.dtype == dtype:
        return y
    dt = DType.from_np(dtype)
    if dt.is_float:
        return cast_array(y, dt)
    if dt is DType.bool:
        return y.astype(np.bool_)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.trunc(y).astype(dtype) if y.dtype.kind == "f" else y.astype(dtype)


def reduced_shape(shape: Shape, axes: Sequence[int], keepdims: bool) -> Shape:
    """``shape`` with normalized ``axes`` reduced (kept as 1 with ``keepdims``)."""
    ax = set(axes)
    if keepdims:
        return tuple(1 if i in ax else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in ax)


def _norm_axes(axes: Sequence[int], rank: int) -> tuple[int, ...]:
    out = tuple(normalize_axis(int(a), rank, "reduction axis") for a in axes)
    if len(set(out)) != len(out):
        raise OpError(f"reduction axes {tuple(axes)} repeat an axis")
    return out


@dataclass(frozen=True, eq=False)
class _Reduce(Op):
    """Base of the reductions (not registered)."""

    num_inputs: ClassVar[tuple[int, int | None]] = (1, 2)
    const_inputs: ClassVar[dict[int, str]] = {1: "axes"}
    #: May the op take bool inputs?
    allows_bool: ClassVar[bool] = False
    axes: tuple[int, ...] | None = None
    keepdims: bool = True
    noop_with_empty_axes: bool = False

    # -- types -------------------------------------------------------------------------------
    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        if x.dtype is DType.bool and not self.allows_bool:
            raise OpError(f"{self.name} does not accept bool inputs")
        dyn = inputs[1] if len(inputs) > 1 else None
        if dyn is not None:
            if not dyn.dtype.is_int:
                raise OpError(f"axes must be an integer tensor, got {dyn}")
            if dyn.shape is not None and len(dyn.shape) != 1:
                raise OpError(f"axes must be 1-D, got {dyn}")
            if x.shape is None:
                return [TensorType(x.dtype, None)]
            n = dyn.shape[0] if dyn.shape is not None else UNKNOWN
            if n == 0:
                return [TensorType(x.dtype, self._shape_all(x.shape))]
            if self.keepdims:
                return [TensorType(x.dtype, tuple(1 if d == 1 else UNKNOWN for d in x.shape))]
            if isinstance(n, int):
                return [TensorType(x.dtype, (UNKNOWN,) * max(len(x.shape) - n, 0))]
            return [TensorType(x.dtype, None)]
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        if not self.axes:
            return [TensorType(x.dtype, self._shape_all(x.shape))]
        axes = _norm_axes(self.axes, len(x.shape))
        return [TensorType(x.dtype, reduced_shape(x.shape, axes, self.keepdims))]

    def _shape_all(self, shape: Shape) -> Shape:
        if self.noop_with_empty_axes:
            return shape
        return reduced_shape(shape, range(len(shape)), self.keepdims)

    # -- reference ---------------------------------------------------------------------------
    def ref(self, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
        given = self.axes if axes is None else tuple(int(a) for a in np.asarray(axes).reshape(-1))
        if not given:
            if self.noop_with_empty_axes:
                return x.copy()
            ax = tuple(range(x.ndim))
        else:
            ax = _norm_axes(given, x.ndim)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            y = self.compute(to_compute(x), ax)
        y = from_compute(np.asarray(y), x.dtype)
        if not self.keepdims:
            y = y.reshape(reduced_shape(x.shape, ax, False))
        return y

    def compute(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        """The reduction over ``axes`` with keepdims, in ``x``'s (compute) dtype."""
        raise NotImplementedError


def _sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    return np.sum(x, axis=axes, keepdims=True, dtype=x.dtype)


@register
@dataclass(frozen=True, eq=False)
class ReduceSum(_Reduce):
    name: ClassVar[str] = "reduce_sum"

    def compute(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return _sum(x, axes)


@register
@dataclass(frozen=True, eq=False)
class ReduceSumSquare(_Reduce):
    name: ClassVar[str] = "reduce_sum_square"

    def compute(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return _sum(x * x, axes)


@register
@dataclass(frozen=True, eq=False)
class ReduceMean(_Reduce):
    name: ClassVar[str] = "reduce_mean"

    def compute(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        if x.dtype.kind == "f":
            return _sum(x, axes) / np.asarray(n, x.dtype)
        return np.sum(x, axis=axes, keepdims=True, dtype=np.float64) / n


def _extreme(x: np.ndarray, axes: tuple[int, ...], largest: bool) -> np.ndarray:
    fn = np.max if largest else np.min
    if all(x.shape[a] > 0 for a in axes):
        return fn(x, axis=axes, keepdims=True)
    # an empty set: the identity element
    if x.dtype == np.bool_:
        init: object = not largest
    elif x.dtype.kind == "f":
        init = -np.inf if largest else np.inf
    else:
        info = np.iinfo(x.dtype)
        init = info.min if largest else info.max
    return fn(x, axis=axes, keepdims=True, initial=init)


@register
@dataclass(frozen=True, eq=False)
class ReduceMax(_Reduce):
    name: ClassVar[str] = "reduce_max"
    allows_bool: ClassVar[bool] = True

    def compute(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return _extreme(x, axes, True)


@register
@dataclass(frozen=True, eq=False)
class ReduceMin(_Reduce):
    name: ClassVar[str] = "reduce_min"
    allows_bool: ClassVar[bool] = True

    def compute(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return _extreme(x, axes, False)


@register
@dataclass(frozen=True, eq=False)
class ReduceProd(_Reduce):
    name: ClassVar[str] = "reduce_prod"

    def compute(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return np.prod(x, axis=axes, keepdims=True, dtype=x.dtype)


@register
@dataclass(frozen=True, eq=False)
class ReduceL1(_Reduce):
    name: ClassVar[str] = "reduce_l1"

    def compute(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return _sum(np.abs(x), axes)


def _float(x: np.ndarray) -> np.ndarray:
    return x if x.dtype.kind == "f" else x.astype(np.float64)


@register
@dataclass(frozen=True, eq=False)
class ReduceL2(_Reduce):
    name: ClassVar[str] = "reduce_l2"

    def compute(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        x = _float(x)
        return np.sqrt(_sum(x * x, axes))


@register
@dataclass(frozen=True, eq=False)
class ReduceLogSum(_Reduce):
    name: ClassVar[str] = "reduce_log_sum"

    def compute(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return np.log(_sum(_float(x), axes))


@register
@dataclass(frozen=True, eq=False)
class ReduceLogSumExp(_Reduce):
    name: ClassVar[str] = "reduce_log_sum_exp"

    def compute(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        x = _float(x)
        m = _extreme(x, axes, True)
        m = np.where(np.isfinite(m), m, np.zeros_like(m))
        return np.log(_sum(np.exp(x - m), axes)) + m


# -- arg_max / arg_min ----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _ArgReduce(Op):
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    largest: ClassVar[bool] = True
    axis: int = 0
    keepdims: bool = True
    select_last_index: bool = False

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        if x.shape is None:
            return [TensorType(DType.i64, None)]
        axis = normalize_axis(self.axis, len(x.shape))
        if len(x.shape) == 0:
            raise OpError(f"{self.name} needs an input of rank >= 1")
        if x.shape[axis] == 0:
            raise OpError(f"{self.name} over an empty axis {self.axis}")
        return [TensorType(DType.i64, reduced_shape(x.shape, (axis,), self.keepdims))]

    def ref(self, x: np.ndarray) -> np.ndarray:
        axis = normalize_axis(self.axis, x.ndim)
        x = to_compute(x)
        fn = np.argmax if self.largest else np.argmin
        if self.select_last_index:
            idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            idx = fn(x, axis=axis)
        idx = np.asarray(idx, dtype=np.int64)
        return np.expand_dims(idx, axis) if self.keepdims else idx


@register
@dataclass(frozen=True, eq=False)
class ArgMax(_ArgReduce):
    name: ClassVar[str] = "arg_max"


@register
@dataclass(frozen=True, eq=False)
class ArgMin(_ArgReduce):
    name: ClassVar[str] = "arg_min"
    largest: ClassVar[bool] = False


__all__ = [
    "ReduceSum", "ReduceSumSquare", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
    "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin", "reduced_shape", "to_compute",
    "from_compute",
]
