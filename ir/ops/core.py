"""Core ops: constants, identity, casts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import ml_dtypes
import numpy as np

from ..op import Op, OpError, register, require, same_as
from ..types import DType, TensorType


@register
@dataclass(frozen=True, eq=False)
class Constant(Op):
    """A constant tensor held in the graph (small values; large ones are weights)."""

    name: ClassVar[str] = "constant"
    num_inputs: ClassVar[tuple[int, int | None]] = (0, 0)
    value: np.ndarray = field(default_factory=lambda: np.zeros((), np.float32))

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        return [TensorType.of(self.value)]

    def ref(self) -> np.ndarray:
        return self.value


@register
@dataclass(frozen=True, eq=False)
class Identity(Op):
    name: ClassVar[str] = "identity"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        return [same_as(inputs[0])]

    def ref(self, x: np.ndarray) -> np.ndarray:
        return x


def _float_max(dtype: DType) -> float:
    return float(ml_dtypes.finfo(dtype.np).max)


def cast_array(x: np.ndarray, to: DType, saturate: bool = True) -> np.ndarray:
    """Cast with ONNX semantics.

    Narrow floats round to nearest even; with ``saturate`` out-of-range values clip to the largest
    finite value (ml_dtypes alone would give NaN), without it they become inf where the format has
    one and NaN otherwise. Float -> int truncates toward zero.
    """
    target = to.np
    if x.dtype == target:
        return x.copy()
    src = DType.from_np(x.dtype)
    if to.is_float and to.itemsize_bits <= 8 and to is not DType.f8e8m0:
        xf = x.astype(np.float64) if src.is_float or src.is_int else x.astype(np.float64)
        if src in (DType.f64,):
            # round once, from the source precision, as ONNX's reference does from float32
            xf = x.astype(np.float32).astype(np.float64)
        m = _float_max(to)
        finite = np.isfinite(xf)
        if saturate:
            xf = np.where(finite, np.clip(xf, -m, m), xf)
            if to in (DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2fnuz, DType.f4e2m1fn):
                xf = np.where(np.isinf(xf), np.sign(xf) * m, xf)
            elif to is DType.f8e5m2:
                pass  # e5m2 keeps infinities even when saturating
        out = xf.astype(np.float32).astype(target)
        if not saturate and to in (DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2fnuz):
            # no infinity in these formats: overflow is NaN
            big = np.abs(xf) > m
            out = np.where(big, np.array(np.nan, dtype=target), out)
        return out.astype(target)
    if to.is_int and (src.is_float):
        with np.errstate(invalid="ignore", over="ignore"):
            return np.trunc(x.astype(np.float64)).astype(target)
    if to is DType.bool:
        return (x.astype(np.float64) != 0) if src.itemsize_bits < 8 else x.astype(np.bool_)
    if src.itemsize_bits < 8 or src in (DType.bf16,) or src.is_float and src.itemsize_bits == 8:
        return x.astype(np.float32).astype(target) if not (src.is_int and to.is_int) else x.astype(
            np.int64
        ).astype(target)
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(target)


@register
@dataclass(frozen=True, eq=False)
class Cast(Op):
    name: ClassVar[str] = "cast"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    to: DType = DType.f32
    saturate: bool = True

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        t = require(inputs[0])
        return [TensorType(self.to, t.shape)]

    def ref(self, x: np.ndarray) -> np.ndarray:
        return cast_array(x, self.to, self.saturate)


__all__ = ["Constant", "Identity", "Cast", "cast_array", "OpError"]
