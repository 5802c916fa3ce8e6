"""Quantization ops: quantize/dequantize (per tensor, per axis, blocked), dynamic quantization,
quantized matmul and convolution.

Rounding is round-half-to-even; integer results saturate to the target's range; narrow float targets
(fp8, fp4) round to nearest even and saturate (or not) per ONNX, through ``core.cast_array``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..types import UNKNOWN, Dim, DType, Shape, TensorType, normalize_axis
from .core import cast_array
from .linalg import _zero_point_rows, matmul_shape

#: Integer quantization targets and their ranges.
INT_RANGES: dict[DType, tuple[int, int]] = {
    DType.u8: (0, 255),
    DType.i8: (-128, 127),
    DType.u16: (0, 65535),
    DType.i16: (-32768, 32767),
    DType.u4: (0, 15),
    DType.i4: (-8, 7),
}
FLOAT8 = (DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2, DType.f8e5m2fnuz)
QUANT_TYPES = (*INT_RANGES, *FLOAT8, DType.f4e2m1fn)


def _axis(axis: int, rank: int) -> int:
    """The quantization axis, normalized; any axis is accepted for a rank-0/1 input (per tensor)."""
    return axis % rank if rank else 0


def expand_scale(value: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int = 0) -> np.ndarray:
    """Make a scale or zero point broadcastable to ``shape``.

    Scalar (or one element): per tensor. 1-D without ``block_size``: per ``axis``. Otherwise blocked:
    ``value`` has ``shape`` with ``ceil(shape[axis] / block_size)`` along ``axis``; each entry is
    repeated ``block_size`` times (the last block may be partial).
    """
    if value.ndim == 0 or value.size == 1:
        return value.reshape(())
    if not block_size:
        if value.ndim != 1:
            raise OpError(f"per-axis scale must be 1-D, got shape {value.shape}")
        dims = [1] * len(shape)
        dims[axis] = value.size
        return value.reshape(dims)
    value = np.repeat(value, block_size, axis=axis)
    if value.shape[axis] != shape[axis]:
        value = value.take(np.arange(shape[axis]), axis=axis)
    if value.shape != tuple(shape):
        raise OpError(f"blocked scale of shape {value.shape} does not match input shape {shape}")
    return value


def _check_scale(x: TensorType, s: TensorType | None, axis: int, block_size: int, what: str) -> None:
    if s is None or s.shape is None or x.shape is None:
        return
    rank = len(x.shape)
    if len(s.shape) == 0 or all(d == 1 for d in s.shape):
        return
    ax = normalize_axis(axis, rank)
    if not block_size:
        if len(s.shape) != 1:
            raise OpError(f"{what} must be a scalar or 1-D for per-axis quantization, got {s}")
        d, n = x.shape[ax], s.shape[0]
        if isinstance(d, int) and isinstance(n, int) and d != n:
            raise OpError(f"{what} has {n} entries, input has {d} along axis {axis}")
        return
    if len(s.shape) != rank:
        raise OpError(f"blocked {what} {s} must have the input's rank ({x})")
    for i, (d, n) in enumerate(zip(x.shape, s.shape)):
        if not (isinstance(d, int) and isinstance(n, int)):
            continue
        want = math.ceil(d / block_size) if i == ax else d
        if n != want:
            raise OpError(f"blocked {what} {s} does not fit input {x} with block_size {block_size}")


def quantize_array(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, to: DType,
                   axis: int = 1, block_size: int = 0, saturate: bool = True,
                   precision: DType | None = None) -> np.ndarray:
    """``saturate(round(x / scale) + zero_point)`` with ONNX QuantizeLinear semantics."""
    ax = _axis(axis, x.ndim)
    s = expand_scale(scale, x.shape, ax, block_size)
    if s.dtype == DType.f8e8m0.np:
        s = s.astype(np.float32)
    if precision is not None:
        q = x.astype(precision.np) / s.astype(precision.np)
    else:
        if DType.from_np(x.dtype).is_int:
            x = x.astype(np.float64)
        q = x / s
    q = np.asarray(q)
    if to in INT_RANGES:
        lo, hi = INT_RANGES[to]
        r = np.rint(q.astype(np.float64))
        if zero_point is not None:
            r = r + expand_scale(zero_point, x.shape, ax, block_size).astype(np.float64)
        return np.clip(r, lo, hi).astype(np.int64).astype(to.np)
    if to in FLOAT8:
        return cast_array(q.astype(np.float32), to, saturate)
    if to is DType.f4e2m1fn:
        q = q.astype(np.float32)
        if zero_point is not None:
            q = q + expand_scale(zero_point, x.shape, ax, block_size).astype(np.float32)
        return cast_array(q, to, True)
    raise OpError(f"{to.value} is not a quantized type")


def dequantize_array(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, to: DType,
                     axis: int = 1, block_size: int = 0) -> np.ndarray:
    """``(x - zero_point) * scale`` in float32, cast to ``to``; float8/float4 zero points are 0."""
    ax = _axis(axis, x.ndim)
    src = DType.from_np(x.dtype)
    dx = x.astype(np.float32)
    if zero_point is not None and src.is_int:
        dx = dx - expand_scale(zero_point, x.shape, ax, block_size).astype(np.float32)
    s = expand_scale(scale, x.shape, ax, block_size)
    if s.dtype == DType.f8e8m0.np or s.dtype == DType.bf16.np:
        s = s.astype(np.float32)
    y = np.asarray(dx * s)
    return cast_array(y, to, saturate=False) if y.dtype != to.np else y


@register
@dataclass(frozen=True, eq=False)
class QuantizeLinear(Op):
    """``y = saturate(round_half_even(x / scale) + zero_point)`` as ``to``.

    Granularity from ``scale``'s shape: scalar (per tensor), 1-D along ``axis`` (per channel), or
    the input's shape with ``ceil(D_axis / block_size)`` along ``axis`` (blocked). ``precision`` is
    the dtype of the division (default: numpy's promotion of ``x`` and ``scale``).
    """

    name: ClassVar[str] = "quantize_linear"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 3)
    to: DType = DType.u8
    axis: int = 1
    block_size: int = 0
    saturate: bool = True
    precision: DType | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x, s = require(inputs[0], "x"), require(inputs[1], "scale")
        zp = inputs[2] if len(inputs) > 2 else None
        if self.to not in QUANT_TYPES:
            raise OpError(f"quantize_linear: {self.to.value} is not a quantized type")
        if zp is not None and zp.dtype != self.to:
            raise OpError(f"quantize_linear: zero point is {zp.dtype.value}, output is {self.to.value}")
        ok_x = x.dtype.is_float or x.dtype is DType.i32
        if not ok_x or not (s.dtype.is_float or s.dtype is DType.i32):
            raise OpError(f"quantize_linear: bad input dtypes {x.dtype.value}, {s.dtype.value}")
        _check_scale(x, s, self.axis, self.block_size, "scale")
        return [TensorType(self.to, x.shape)]

    def ref(self, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None) -> np.ndarray:
        return quantize_array(x, scale, zero_point, self.to, self.axis, self.block_size,
                              self.saturate, self.precision)


@register
@dataclass(frozen=True, eq=False)
class DequantizeLinear(Op):
    """``y = (x - zero_point) * scale`` as ``to``; granularity as in ``quantize_linear``."""

    name: ClassVar[str] = "dequantize_linear"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 3)
    to: DType = DType.f32
    axis: int = 1
    block_size: int = 0

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x, s = require(inputs[0], "x"), require(inputs[1], "scale")
        zp = inputs[2] if len(inputs) > 2 else None
        if x.dtype not in (*QUANT_TYPES, DType.i32):
            raise OpError(f"dequantize_linear: {x.dtype.value} is not a quantized type")
        if zp is not None and zp.dtype != x.dtype:
            raise OpError(f"dequantize_linear: zero point is {zp.dtype.value}, input is {x.dtype.value}")
        if not s.dtype.is_float or not self.to.is_float:
            raise OpError("dequantize_linear: scale and output must be floats")
        _check_scale(x, s, self.axis, self.block_size, "scale")
        return [TensorType(self.to, x.shape)]

    def ref(self, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None) -> np.ndarray:
        return dequantize_array(x, scale, zero_point, self.to, self.axis, self.block_size)


@register
@dataclass(frozen=True, eq=False)
class DynamicQuantizeLinear(Op):
    """uint8 asymmetric quantization with the range taken from the data (min/max, including 0).

    Outputs ``y`` (u8), ``scale`` (scalar, x's dtype), ``zero_point`` (scalar u8).
    """

    name: ClassVar[str] = "dynamic_quantize_linear"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "x")
        if not x.dtype.is_float:
            raise OpError("dynamic_quantize_linear needs a float input")
        return [TensorType(DType.u8, x.shape), TensorType(x.dtype, ()), TensorType(DType.u8, ())]

    def ref(self, x: np.ndarray) -> list[np.ndarray]:
        qmin, qmax = 0.0, 255.0
        xf = x.astype(np.float32)
        maxx = np.float32(max(0.0, float(np.max(xf)))) if xf.size else np.float32(0)
        minx = np.float32(min(0.0, float(np.min(xf)))) if xf.size else np.float32(0)
        scale = np.float32(1.0 if maxx == minx else (maxx - minx)) / np.float32(qmax - qmin)
        zp = np.rint(np.clip(np.float32(qmin) - minx / scale, qmin, qmax))
        y = np.clip(np.rint(xf / scale) + zp, qmin, qmax)
        return [y.astype(np.uint8), np.asarray(scale).astype(x.dtype), np.asarray(zp).astype(np.uint8)]


def _requantize(acc: np.ndarray, multiplier: np.ndarray, y_zero_point: np.ndarray | None,
                out: DType) -> np.ndarray:
    r = acc.astype(np.float64) * multiplier.astype(np.float64)
    if y_zero_point is not None:
        r = r + y_zero_point.astype(np.float64)
    lo, hi = INT_RANGES[out]
    return np.clip(np.rint(r), lo, hi).astype(out.np)


@register
@dataclass(frozen=True, eq=False)
class QLinearMatMul(Op):
    """Quantized matmul: ``quantize(dequantize(a) @ dequantize(b), y_scale, y_zero_point)``.

    Inputs: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point. The
    accumulation is exact (int32); the rescale uses ``a_scale * b_scale / y_scale`` rounded to the
    scales' dtype, as onnxruntime does.
    """

    name: ClassVar[str] = "qlinear_matmul"
    num_inputs: ClassVar[tuple[int, int | None]] = (8, 8)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        a, b = require(inputs[0], "a"), require(inputs[3], "b")
        yzp = inputs[7]
        out = yzp.dtype if yzp is not None else a.dtype
        if out not in (DType.u8, DType.i8):
            raise OpError(f"qlinear_matmul: output must be u8 or i8, got {out.value}")
        return [TensorType(out, matmul_shape(a.shape, b.shape))]

    def ref(self, a: np.ndarray, a_scale: np.ndarray, a_zero_point: np.ndarray | None, b: np.ndarray,
            b_scale: np.ndarray, b_zero_point: np.ndarray | None, y_scale: np.ndarray,
            y_zero_point: np.ndarray | None) -> np.ndarray:
        a32 = a.astype(np.int32) - _zero_point_rows(a_zero_point, a)
        b32 = b.astype(np.int32) - (0 if b_zero_point is None else b_zero_point.astype(np.int32))
        acc = np.matmul(a32, b32)
        a_s = a_scale.reshape(-1, 1) if a_scale.ndim == 1 and a_scale.size > 1 else a_scale
        mult = np.asarray(a_s * b_scale / y_scale)
        out = DType.from_np(y_zero_point.dtype if y_zero_point is not None else a.dtype)
        return _requantize(acc, mult, y_zero_point, out)


# -- convolution (integer) --------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _ConvAttrs(Op):
    kernel_shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    group: int = 1
    auto_pad: str = "NOTSET"

    def _conv_params(self, spatial: Sequence[Dim], kernel: Sequence[Dim]) -> tuple[
            list[int], list[int], list[Dim], list[Dim]]:
        n = len(spatial)
        strides = list(self.strides) or [1] * n
        dil = list(self.dilations) or [1] * n
        ks: list[Dim] = list(self.kernel_shape) or list(kernel)
        begin: list[Dim] = [0] * n
        end: list[Dim] = [0] * n
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            for i in range(n):
                d, k = spatial[i], ks[i]
                if not (isinstance(d, int) and isinstance(k, int)):
                    begin[i] = end[i] = UNKNOWN
                    continue
                out = -(-d // strides[i])
                total = max(0, (out - 1) * strides[i] + (k - 1) * dil[i] + 1 - d)
                small, big = total // 2, total - total // 2
                begin[i], end[i] = (small, big) if self.auto_pad == "SAME_UPPER" else (big, small)
        elif self.auto_pad in ("NOTSET", ""):
            if self.pads:
                begin, end = list(self.pads[:n]), list(self.pads[n:])
        elif self.auto_pad != "VALID":
            raise OpError(f"unknown auto_pad {self.auto_pad!r}")
        return strides, dil, begin, end

    def _out_shape(self, x: Shape, w: Shape) -> Shape:
        if len(x) < 3 or len(w) != len(x):
            raise OpError(f"conv needs (N, C, spatial...) input and a weight of the same rank, got {x}, {w}")
        spatial, kernel = x[2:], w[2:]
        strides, dil, begin, end = self._conv_params(spatial, kernel)
        out: list[Dim] = [x[0], w[0]]
        for i, d in enumerate(spatial):
            k, b, e = kernel[i], begin[i], end[i]
            if all(isinstance(v, int) for v in (d, k, b, e)):
                out.append((d + b + e - dil[i] * (k - 1) - 1) // strides[i] + 1)  # type: ignore[operator]
            else:
                out.append(UNKNOWN)
        return tuple(out)


def conv_reference(x: np.ndarray, w: np.ndarray, strides: Sequence[int], dilations: Sequence[int],
                   pads_begin: Sequence[int], pads_end: Sequence[int], group: int) -> np.ndarray:
    """Grouped N-d cross-correlation (ONNX Conv) in the inputs' dtype (int32/int64 or float)."""
    n_sp = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0), *zip(pads_begin, pads_end)])
    ks = w.shape[2:]
    out_sp = [(xp.shape[2 + i] - dilations[i] * (ks[i] - 1) - 1) // strides[i] + 1 for i in range(n_sp)]
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    y = np.zeros((n, m, *out_sp), dtype=np.result_type(x.dtype, w.dtype))
    for kpos in itertools.product(*[range(k) for k in ks]):
        sl = tuple(
            slice(o := kpos[i] * dilations[i], o + (out_sp[i] - 1) * strides[i] + 1, strides[i])
            for i in range(n_sp)
        )
        patch = xp[(slice(None), slice(None), *sl)]  # (N, C, out...)
        wk = w[(slice(None), slice(None), *kpos)]  # (M, C/g)
        for g in range(group):
            pg = patch[:, g * cg : (g + 1) * cg]
            y[:, g * mg : (g + 1) * mg] += np.einsum("nc...,mc->nm...", pg, wk[g * mg : (g + 1) * mg])
    return y


@register
@dataclass(frozen=True, eq=False)
class ConvInteger(_ConvAttrs):
    """``conv(x - x_zero_point, w - w_zero_point)`` accumulated in int32."""

    name: ClassVar[str] = "conv_integer"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 4)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x, w = require(inputs[0], "x"), require(inputs[1], "w")
        if x.shape is None or w.shape is None:
            return [TensorType(DType.i32, None)]
        return [TensorType(DType.i32, self._out_shape(x.shape, w.shape))]

    def ref(self, x: np.ndarray, w: np.ndarray, x_zero_point: np.ndarray | None = None,
            w_zero_point: np.ndarray | None = None) -> np.ndarray:
        x32 = x.astype(np.int32) - (0 if x_zero_point is None else x_zero_point.astype(np.int32).reshape(()))
        w32 = _sub_w_zero_point(w, w_zero_point)
        strides, dil, b, e = self._conv_params(x.shape[2:], w.shape[2:])
        return conv_reference(x32, w32, strides, dil, b, e, self.group).astype(np.int32)  # type: ignore


def _sub_w_zero_point(w: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
    w32 = w.astype(np.int32)
    if zp is None:
        return w32
    zp = zp.astype(np.int32)
    if zp.ndim == 1 and zp.size == w.shape[0] and zp.size > 1:
        return w32 - zp.reshape((-1,) + (1,) * (w.ndim - 1))
    return w32 - zp.reshape(())


@register
@dataclass(frozen=True, eq=False)
class QLinearConv(_ConvAttrs):
    """Quantized convolution: int32 accumulation of the zero-point-shifted operands plus the int32
    bias, rescaled by ``x_scale * w_scale / y_scale`` (``w_scale`` per output channel or scalar).

    Inputs: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, bias.
    """

    name: ClassVar[str] = "qlinear_conv"
    num_inputs: ClassVar[tuple[int, int | None]] = (8, 9)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x, w = require(inputs[0], "x"), require(inputs[3], "w")
        yzp = inputs[7]
        out = yzp.dtype if yzp is not None else x.dtype
        if out not in (DType.u8, DType.i8):
            raise OpError(f"qlinear_conv: output must be u8 or i8, got {out.value}")
        if x.shape is None or w.shape is None:
            return [TensorType(out, None)]
        return [TensorType(out, self._out_shape(x.shape, w.shape))]

    def ref(self, x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None, w: np.ndarray,
            w_scale: np.ndarray, w_zero_point: np.ndarray | None, y_scale: np.ndarray,
            y_zero_point: np.ndarray | None, bias: np.ndarray | None = None) -> np.ndarray:
        x32 = x.astype(np.int32) - (0 if x_zero_point is None else x_zero_point.astype(np.int32).reshape(()))
        w32 = _sub_w_zero_point(w, w_zero_point)
        strides, dil, b, e = self._conv_params(x.shape[2:], w.shape[2:])
        acc = conv_reference(x32, w32, strides, dil, b, e, self.group).astype(np.int32)  # type: ignore
        if bias is not None:
            acc = acc + bias.astype(np.int32).reshape((1, -1) + (1,) * (acc.ndim - 2))
        ws = w_scale.reshape((1, -1) + (1,) * (acc.ndim - 2)) if w_scale.size > 1 else w_scale.reshape(())
        mult = np.asarray(x_scale.reshape(()) * ws / y_scale.reshape(()))
        out = DType.from_np(y_zero_point.dtype if y_zero_point is not None else x.dtype)
        return _requantize(acc, mult, None if y_zero_point is None else y_zero_point.reshape(()), out)


__all__ = ["QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearMatMul", "QLinearConv",
           "ConvInteger", "quantize_array", "dequantize_array", "expand_scale", "conv_reference"]
