"""Pooling: max_pool (with indices), avg_pool, lp_pool, global pools, max_unpool, dropout.

Windows follow ONNX (and onnxruntime): ``ceil_mode`` may add a last window that overhangs the end
pad; elements of the overhang never count. ``count_include_pad`` counts the explicit pads in the
divisor of average pooling (and in Lp pooling, whose pads contribute zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..types import UNKNOWN, Dim, DType, TensorType
from .conv import AUTO_PADS, acc_dtype, conv_out_dim, resolve_pads, spatial_params, windows


def _pool_out_shape(op: _Pool, shape: Sequence[Dim]) -> list[Dim]:
    n = len(shape)
    k = op.kernel_shape
    if len(k) != n:
        raise OpError(f"kernel_shape {k} does not match {n} spatial dimension(s)")
    s, d, p = spatial_params(n, op.strides, op.dilations, op.pads)
    if op.auto_pad not in AUTO_PADS:
        raise OpError(f"auto_pad {op.auto_pad!r} is not one of {AUTO_PADS}")
    out: list[Dim] = []
    for i in range(n):
        size = shape[i]
        if not isinstance(size, int):
            out.append(UNKNOWN)
        elif op.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append((size - 1) // s[i] + 1)
        elif op.auto_pad == "VALID":
            out.append(conv_out_dim(size, k[i], s[i], d[i], 0, 0, op.ceil_mode))
        else:
            out.append(conv_out_dim(size, k[i], s[i], d[i], p[i], p[n + i], op.ceil_mode))
    return out


def _geometry(op: _Pool, sp: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...],
                                                     list[int]]:
    """(strides, dilations, pads, out) for a static spatial shape."""
    n = len(sp)
    s, d, p = spatial_params(n, op.strides, op.dilations, op.pads)
    p = resolve_pads(op.auto_pad, sp, op.kernel_shape, s, d, p)
    out = [int(v) for v in _pool_out_shape(op, sp)]  # type: ignore[arg-type]
    return s, d, p, out


def _padded(x: np.ndarray, pads: Sequence[int], out: Sequence[int], kernel: Sequence[int],
            s: Sequence[int], d: Sequence[int], value: float) -> np.ndarray:
    """``x`` padded with ``value``: explicit pads, then the ceil-mode overhang at the end."""
    n = x.ndim - 2
    widths = [(0, 0), (0, 0)]
    for i in range(n):
        need = (out[i] - 1) * s[i] + (kernel[i] - 1) * d[i] + 1
        have = x.shape[2 + i] + pads[i] + pads[n + i]
        widths.append((pads[i], pads[n + i] + max(0, need - have)))
    if all(w == (0, 0) for w in widths):
        return x
    return np.pad(x, widths, mode="constant", constant_values=value)


@dataclass(frozen=True, eq=False)
class _Pool(Op):
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    kernel_shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    auto_pad: str = "NOTSET"
    ceil_mode: bool = False

    def _out_type(self, inputs: Sequence[TensorType | None], dtype: DType | None = None) -> TensorType:
        x = require(inputs[0], "input X")
        if x.shape is None:
            return TensorType(dtype or x.dtype, None)
        if len(x.shape) < 3:
            raise OpError(f"input must have rank >= 3 (N, C, spatial...), got {x}")
        if not self.kernel_shape:
            raise OpError("kernel_shape is required")
        return TensorType(dtype or x.dtype, (*x.shape[:2], *_pool_out_shape(self, x.shape[2:])))

    def _mask_count(self, x: np.ndarray, p: Sequence[int], out: Sequence[int], s: Sequence[int],
                    d: Sequence[int], include_pad: bool, dtype: np.dtype) -> np.ndarray:
        n = x.ndim - 2
        if include_pad:
            ones = np.ones((1, 1) + tuple(x.shape[2 + i] + p[i] + p[n + i] for i in range(n)), dtype)
            m = _padded(ones, (0,) * (2 * n), out, self.kernel_shape, s, d, 0.0)
        else:
            ones = np.ones((1, 1) + x.shape[2:], dtype)
            m = _padded(ones, p, out, self.kernel_shape, s, d, 0.0)
        w = windows(m, self.kernel_shape, s, d, out)
        return w.sum(axis=tuple(range(2 + n, 2 + 2 * n)))


@register
@dataclass(frozen=True, eq=False)
class MaxPool(_Pool):
    """ONNX MaxPool; with ``return_indices`` a second output holds the flat argmax indices."""

    name: ClassVar[str] = "max_pool"
    storage_order: int = 0
    return_indices: bool = False

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        y = self._out_type(inputs)
        if y.dtype is DType.bool:
            raise OpError("max_pool does not accept bool inputs")
        return [y, TensorType(DType.i64, y.shape)] if self.return_indices else [y]

    def ref(self, x: np.ndarray) -> list[np.ndarray]:
        n = x.ndim - 2
        s, d, p, out = _geometry(self, x.shape[2:])
        k = self.kernel_shape
        if x.dtype.kind == "f" or x.dtype.name in ("bfloat16",):
            low = -np.inf
        else:
            low = np.iinfo(x.dtype).min
        xw = x if x.dtype.kind in "fiu" else x.astype(np.float32)
        xp = _padded(xw, p, out, k, s, d, low)
        win = windows(xp, k, s, d, out)
        axes = tuple(range(2 + n, 2 + 2 * n))
        if not self.return_indices:
            return [win.max(axis=axes).astype(x.dtype, copy=False)]
        flat = np.ascontiguousarray(win).reshape(*win.shape[: 2 + n], -1)
        am = flat.argmax(axis=-1)
        y = np.take_along_axis(flat, am[..., None], -1)[..., 0].astype(x.dtype, copy=False)
        kidx = np.unravel_index(am, k)
        N, C = x.shape[:2]
        sp = x.shape[2:]
        coords = []
        for i in range(n):
            o = np.arange(out[i]).reshape((1,) * (2 + i) + (out[i],) + (1,) * (n - 1 - i))
            coords.append(o * s[i] + kidx[i] * d[i] - p[i])
        if self.storage_order == 0:
            idx = np.zeros(am.shape, np.int64)
            for i in range(n):
                idx = idx * sp[i] + coords[i]
        else:
            idx = np.zeros(am.shape, np.int64)
            for i in reversed(range(n)):
                idx = idx * sp[i] + coords[i]
        nc = (np.arange(N).reshape(N, 1) * C + np.arange(C).reshape(1, C)).reshape((N, C) + (1,) * n)
        idx = idx + nc * int(np.prod(sp))
        return [y, idx.astype(np.int64)]


@register
@dataclass(frozen=True, eq=False)
class AvgPool(_Pool):
    name: ClassVar[str] = "avg_pool"
    count_include_pad: bool = False

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        y = self._out_type(inputs)
        if not y.dtype.is_float:
            raise OpError(f"avg_pool needs a float input, got {y.dtype.value}")
        return [y]

    def ref(self, x: np.ndarray) -> np.ndarray:
        n = x.ndim - 2
        s, d, p, out = _geometry(self, x.shape[2:])
        acc = acc_dtype(x.dtype)
        xp = _padded(x.astype(acc, copy=False), p, out, self.kernel_shape, s, d, 0.0)
        axes = tuple(range(2 + n, 2 + 2 * n))
        total = windows(xp, self.kernel_shape, s, d, out).sum(axis=axes)
        cnt = self._mask_count(x, p, out, s, d, self.count_include_pad, acc)
        return (total / cnt).astype(x.dtype, copy=False)


@register
@dataclass(frozen=True, eq=False)
class LpPool(_Pool):
    name: ClassVar[str] = "lp_pool"
    p: int = 2

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        y = self._out_type(inputs)
        if not y.dtype.is_float:
            raise OpError(f"lp_pool needs a float input, got {y.dtype.value}")
        return [y]

    def ref(self, x: np.ndarray) -> np.ndarray:
        n = x.ndim - 2
        s, d, pads, out = _geometry(self, x.shape[2:])
        acc = acc_dtype(x.dtype)
        xa = np.abs(x.astype(acc, copy=False)) ** self.p
        xp = _padded(xa, pads, out, self.kernel_shape, s, d, 0.0)
        axes = tuple(range(2 + n, 2 + 2 * n))
        total = windows(xp, self.kernel_shape, s, d, out).sum(axis=axes)
        return (total ** (1.0 / self.p)).astype(x.dtype, copy=False)


@dataclass(frozen=True, eq=False)
class _GlobalPool(Op):
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "input X")
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        if len(x.shape) < 2:
            raise OpError(f"input must have rank >= 2 (N, C, spatial...), got {x}")
        return [TensorType(x.dtype, (*x.shape[:2], *(1,) * (len(x.shape) - 2)))]


@register
@dataclass(frozen=True, eq=False)
class GlobalAvgPool(_GlobalPool):
    name: ClassVar[str] = "global_avg_pool"

    def ref(self, x: np.ndarray) -> np.ndarray:
        axes = tuple(range(2, x.ndim))
        return x.astype(acc_dtype(x.dtype)).mean(axis=axes, keepdims=True).astype(x.dtype)


@register
@dataclass(frozen=True, eq=False)
class GlobalMaxPool(_GlobalPool):
    name: ClassVar[str] = "global_max_pool"

    def ref(self, x: np.ndarray) -> np.ndarray:
        return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


@register
@dataclass(frozen=True, eq=False)
class GlobalLpPool(_GlobalPool):
    name: ClassVar[str] = "global_lp_pool"
    p: int = 2

    def ref(self, x: np.ndarray) -> np.ndarray:
        xa = np.abs(x.astype(acc_dtype(x.dtype))) ** self.p
        return (xa.sum(axis=tuple(range(2, x.ndim)), keepdims=True) ** (1.0 / self.p)).astype(x.dtype)


@register
@dataclass(frozen=True, eq=False)
class MaxUnpool(Op):
    """ONNX MaxUnpool: scatter ``x`` to the flat ``indices`` of a zero output."""

    name: ClassVar[str] = "max_unpool"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 3)
    const_inputs: ClassVar[dict[int, str]] = {2: "output_shape"}
    kernel_shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    output_shape: tuple[int, ...] = ()

    def _default_shape(self, shape: Sequence[Dim]) -> list[Dim]:
        n = len(shape) - 2
        s, _, p = spatial_params(n, self.strides, (), self.pads)
        out: list[Dim] = list(shape[:2])
        for i in range(n):
            v = shape[2 + i]
            k = self.kernel_shape[i]
            out.append((v - 1) * s[i] + k - p[i] - p[n + i] if isinstance(v, int) else UNKNOWN)
        return out

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "input X")
        i = require(inputs[1], "indices")
        if i.dtype is not DType.i64:
            raise OpError(f"indices must be i64, got {i.dtype.value}")
        if self.output_shape:
            return [TensorType(x.dtype, tuple(self.output_shape))]
        if len(inputs) > 2 and inputs[2] is not None:
            rank = x.rank
            return [TensorType(x.dtype, None if rank is None else (UNKNOWN,) * rank)]
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        if len(self.kernel_shape) != len(x.shape) - 2:
            raise OpError(f"kernel_shape {self.kernel_shape} does not match input {x}")
        return [TensorType(x.dtype, tuple(self._default_shape(x.shape)))]

    def ref(self, x: np.ndarray, indices: np.ndarray, output_shape: np.ndarray | None = None) -> np.ndarray:
        if output_shape is not None:
            shape = tuple(int(v) for v in output_shape)
        elif self.output_shape:
            shape = self.output_shape
        else:
            shape = tuple(int(v) for v in self._default_shape(x.shape))  # type: ignore[arg-type]
        inferred = tuple(int(v) for v in self._default_shape(x.shape))  # type: ignore[arg-type]
        y = np.zeros(int(np.prod(inferred)), x.dtype)
        y[indices.reshape(-1)] = x.reshape(-1)
        y = y.reshape(inferred)
        if tuple(shape) == inferred:
            return y
        # as ONNX's reference: the unpooled tensor fills the leading corner of the requested shape
        out = np.zeros(shape, x.dtype)
        sl = tuple(slice(0, min(a, b)) for a, b in zip(inferred, shape))
        out[sl] = y[sl]
        return out


@register
@dataclass(frozen=True, eq=False)
class Dropout(Op):
    """Inference-mode dropout: the input unchanged and, when ``mask_dtype`` is set, a mask of ones."""

    name: ClassVar[str] = "dropout"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 3)
    mask_dtype: DType | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "input")
        outs = [TensorType(x.dtype, x.shape)]
        if self.mask_dtype is not None:
            outs.append(TensorType(self.mask_dtype, x.shape))
        return outs

    def ref(self, x: np.ndarray, ratio: np.ndarray | None = None,
            training_mode: np.ndarray | None = None) -> list[np.ndarray]:
        """Optional ``ratio``/``training_mode`` inputs: training with a nonzero ratio is an error."""
        if training_mode is not None and bool(np.asarray(training_mode).reshape(-1)[0]):
            r = 0.5 if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
            if r != 0.0:
                raise OpError("training-mode dropout with a nonzero ratio (random masks) is not supported")
        outs = [x]
        if self.mask_dtype is not None:
            outs.append(np.ones(x.shape, self.mask_dtype.np))
        return outs


__all__ = ["MaxPool", "AvgPool", "LpPool", "GlobalAvgPool", "GlobalMaxPool", "GlobalLpPool", "MaxUnpool",
           "Dropout"]
