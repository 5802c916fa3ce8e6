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


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """Float -> float8e8m0 (a bare power-of-two exponent) with ONNX's rounding rules.

    The result is the float32 exponent field, ignoring sign and mantissa: ``up`` rounds up when any
    mantissa bit is set, ``nearest`` when the top mantissa bit is (for subnormals only past half),
    ``down`` truncates. NaN and +-inf give NaN (0xFF); with ``saturate`` a round-up never reaches it.
    """
    bits = np.array(x, dtype=np.float32, order="C").view(np.uint32)  # a copy; 0-d stays 0-d
    exp = ((bits >> 23) & 0xFF).astype(np.int32)
    frac = bits & 0x7FFFFF
    special = exp == 0xFF
    if round_mode == "up":
        inc = frac != 0
    elif round_mode == "nearest":
        inc = ((frac & 0x400000) != 0) & ((exp > 0) | ((frac & 0x3FFFFF) != 0))
    elif round_mode == "down":
        inc = np.zeros(exp.shape, np.bool_)
    else:
        raise ValueError(f"unknown round_mode {round_mode!r} for a cast to f8e8m0")
    if saturate:
        inc &= exp != 0xFE
    out = np.where(special, 0xFF, exp + inc.astype(np.int32)).astype(np.uint8)
    return out.view(DType.f8e8m0.np)


def cast_array(x: np.ndarray, to: DType, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """Cast with ONNX semantics.

    Narrow floats round to nearest even; with ``saturate`` out-of-range values and infinities clip
    to the largest finite value (ml_dtypes alone would give NaN), without it values that still
    overflow after rounding become inf where the format has one and NaN otherwise. f8e8m0 follows
    ``round_mode`` (see ``_to_e8m0``). Float -> int truncates toward zero.
    """
    target = to.np
    if x.dtype == target:
        return x.copy()
    src = DType.from_np(x.dtype)
    if to is DType.f8e8m0:
        return _to_e8m0(x, saturate, round_mode)
    if to.is_float and to.itemsize_bits <= 8:
        # via float32 (exact for every narrower source; f64 rounds there first, as ONNX's reference)
        xf = x.astype(np.float32)
        if saturate:
            # every format saturates infinities too (e5m2 included, per the ONNX Cast spec)
            m = np.float32(_float_max(to))
            xf = np.where(np.isnan(xf), xf, np.clip(xf, -m, m))
        # ml_dtypes rounds to nearest even; what still overflows after rounding becomes inf, or NaN
        # in the formats without one (so max < |x| < max + half an ulp rounds down to max)
        return xf.astype(target)
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
    #: rounding of casts to f8e8m0: "up", "nearest" or "down" (ignored for other targets)
    round_mode: str = "up"

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        t = require(inputs[0])
        if self.round_mode not in ("up", "nearest", "down"):
            raise OpError(f"unknown round_mode {self.round_mode!r}")
        return [TensorType(self.to, t.shape)]

    def ref(self, x: np.ndarray) -> np.ndarray:
        return cast_array(x, self.to, self.saturate, self.round_mode)


__all__ = ["Constant", "Identity", "Cast", "cast_array", "OpError"]
