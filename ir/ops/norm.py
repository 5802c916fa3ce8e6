"""Softmax and normalizations: softmax, log_softmax, hardmax, layer_norm, rms_norm, batch_norm,
batch_norm_training, group_norm, lp_norm, mean_variance_norm, lrn; and the nll_loss op.

``layer_norm`` and ``rms_norm`` normalize over the axes ``[axis, rank)`` (``axis=-1``: the last one)
in ``stash_type`` precision (f32 by default, so narrow inputs compute in float32 and are cast back)::

    %3 = rms_norm(%1, %w) {eps=1e-06, axis=-1, stash_type=f32} : bf16[T,2048]

The softmax family takes one ``axis``; ``coerce_2d`` gives ONNX's opset < 13 semantics, which
normalize over ``axis`` and every axis after it as one flattened axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require, same_as
from ..types import UNKNOWN, DType, Shape, TensorType, broadcast_shapes, normalize_axis
from .reduce import from_compute, to_compute


def _require_float(t: TensorType, op: str, what: str = "input") -> None:
    if not t.dtype.is_float:
        raise OpError(f"{op} needs a float {what}, got {t}")


def _compute_dtype(stash: DType) -> np.dtype:
    return np.dtype(np.float64) if stash is DType.f64 else np.dtype(np.float32)


# -- softmax family ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _SoftmaxLike(Op):
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    axis: int = -1
    coerce_2d: bool = False

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        _require_float(x, self.name)
        if x.shape is not None:
            if len(x.shape) == 0:
                raise OpError(f"{self.name} needs an input of rank >= 1")
            normalize_axis(self.axis, len(x.shape))
        return [same_as(x)]

    def ref(self, x: np.ndarray) -> np.ndarray:
        axis = normalize_axis(self.axis, x.ndim)
        xc = to_compute(x)
        if self.coerce_2d:
            rows = int(np.prod(x.shape[:axis], dtype=np.int64))
            y = self.compute(xc.reshape(rows, -1), 1).reshape(x.shape)
        else:
            y = self.compute(xc, axis)
        return from_compute(y, x.dtype)

    def compute(self, x: np.ndarray, axis: int) -> np.ndarray:
        raise NotImplementedError


def _shifted(x: np.ndarray, axis: int) -> np.ndarray:
    if x.shape[axis] == 0:
        return x
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, np.zeros_like(m))
    return x - m


@register
@dataclass(frozen=True, eq=False)
class Softmax(_SoftmaxLike):
    name: ClassVar[str] = "softmax"

    def compute(self, x: np.ndarray, axis: int) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(_shifted(x, axis))
            return e / np.sum(e, axis=axis, keepdims=True)


@register
@dataclass(frozen=True, eq=False)
class LogSoftmax(_SoftmaxLike):
    name: ClassVar[str] = "log_softmax"

    def compute(self, x: np.ndarray, axis: int) -> np.ndarray:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            s = _shifted(x, axis)
            return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


@register
@dataclass(frozen=True, eq=False)
class Hardmax(_SoftmaxLike):
    """1 at the first maximum along the axis, 0 elsewhere."""

    name: ClassVar[str] = "hardmax"

    def compute(self, x: np.ndarray, axis: int) -> np.ndarray:
        y = np.zeros_like(x)
        if x.size:
            idx = np.expand_dims(np.argmax(x, axis=axis), axis)
            np.put_along_axis(y, idx, 1, axis=axis)
        return y


# -- layer_norm / rms_norm -----------------------------------------------------------------------


def _check_param(x: TensorType, p: TensorType | None, axis: int, op: str, what: str) -> None:
    if p is None:
        return
    _require_float(p, op, what)
    if x.shape is None or p.shape is None:
        return
    try:
        out = broadcast_shapes(x.shape[axis:], p.shape)
    except ValueError:
        dims = x.shape[axis:]
        raise OpError(f"{op}: {what} {p} does not broadcast to the normalized dims {dims}") from None
    if out is not None and len(out) > len(x.shape[axis:]):
        raise OpError(f"{op}: {what} {p} has more dims than the normalized dims {x.shape[axis:]}")


def _stats_shape(shape: Shape, axis: int) -> Shape:
    return tuple(shape[:axis]) + (1,) * (len(shape) - axis)


@register
@dataclass(frozen=True, eq=False)
class LayerNorm(Op):
    """``(x - mean) / sqrt(var + eps) * scale + bias`` over the axes ``[axis, rank)``.

    With ``stats`` the op also returns the mean and ``1/sqrt(var + eps)`` (in ``stash_type``, shaped
    like the input with the normalized dims set to 1).
    """

    name: ClassVar[str] = "layer_norm"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 3)
    eps: float = 1e-5
    axis: int = -1
    stash_type: DType = DType.f32
    stats: bool = False

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        _require_float(x, self.name)
        if not self.stash_type.is_float:
            raise OpError(f"stash_type must be a float type, got {self.stash_type.value}")
        outs = [same_as(x)]
        if x.shape is None:
            outs += [TensorType(self.stash_type, None)] * 2 if self.stats else []
            return outs
        axis = normalize_axis(self.axis, len(x.shape))
        _check_param(x, require(inputs[1], "scale"), axis, self.name, "scale")
        _check_param(x, inputs[2] if len(inputs) > 2 else None, axis, self.name, "bias")
        if self.stats:
            outs += [TensorType(self.stash_type, _stats_shape(x.shape, axis))] * 2
        return outs

    def ref(
        self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None
    ) -> list[np.ndarray]:
        axis = normalize_axis(self.axis, x.ndim)
        ct = _compute_dtype(self.stash_type)
        axes = tuple(range(axis, x.ndim))
        xc = x.astype(ct)
        mean = np.mean(xc, axis=axes, keepdims=True)
        d = xc - mean
        var = np.mean(d * d, axis=axes, keepdims=True)
        inv = (1 / np.sqrt(var + ct.type(self.eps))).astype(ct)
        y = d * inv * scale.astype(ct)
        if bias is not None:
            y = y + bias.astype(ct)
        outs = [from_compute(y, x.dtype)]
        if self.stats:
            outs += [from_compute(mean, self.stash_type.np), from_compute(inv, self.stash_type.np)]
        return outs


@register
@dataclass(frozen=True, eq=False)
class RmsNorm(Op):
    """``x / sqrt(mean(x^2) + eps) * scale`` over the axes ``[axis, rank)``."""

    name: ClassVar[str] = "rms_norm"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 2)
    eps: float = 1e-5
    axis: int = -1
    stash_type: DType = DType.f32

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        _require_float(x, self.name)
        if not self.stash_type.is_float:
            raise OpError(f"stash_type must be a float type, got {self.stash_type.value}")
        if x.shape is not None:
            axis = normalize_axis(self.axis, len(x.shape))
            _check_param(x, require(inputs[1], "scale"), axis, self.name, "scale")
        return [same_as(x)]

    def ref(self, x: np.ndarray, scale: np.ndarray) -> np.ndarray:
        axis = normalize_axis(self.axis, x.ndim)
        ct = _compute_dtype(self.stash_type)
        xc = x.astype(ct)
        ms = np.mean(xc * xc, axis=tuple(range(axis, x.ndim)), keepdims=True)
        y = xc * (1 / np.sqrt(ms + ct.type(self.eps))).astype(ct) * scale.astype(ct)
        return from_compute(y, x.dtype)


# -- batch / group / instance norm ---------------------------------------------------------------


def _check_channel_params(
    x: TensorType, params: Sequence[TensorType | None], names: Sequence[str], op: str
) -> None:
    if x.shape is not None and len(x.shape) < 2:
        raise OpError(f"{op} needs an input of rank >= 2 (N, C, ...), got {x}")
    c = x.shape[1] if x.shape is not None else UNKNOWN
    for p, what in zip(params, names):
        p = require(p, what)
        _require_float(p, op, what)
        if p.shape is None:
            continue
        if len(p.shape) != 1:
            raise OpError(f"{op}: {what} must be 1-D, got {p}")
        if isinstance(c, int) and isinstance(p.shape[0], int) and p.shape[0] != c:
            raise OpError(f"{op}: {what} has {p.shape[0]} elements, expected {c}")



def _channel(a: np.ndarray, rank: int, ct: np.dtype) -> np.ndarray:
    return a.astype(ct).reshape((1, -1) + (1,) * (rank - 2))


@register
@dataclass(frozen=True, eq=False)
class BatchNorm(Op):
    """Inference batch norm: ``(x - mean) / sqrt(var + eps) * scale + bias`` per channel (axis 1)."""

    name: ClassVar[str] = "batch_norm"
    num_inputs: ClassVar[tuple[int, int | None]] = (5, 5)
    eps: float = 1e-5

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        _require_float(x, self.name)
        _check_channel_params(x, inputs[1:5], ("scale", "bias", "mean", "var"), self.name)
        return [same_as(x)]

    def ref(
        self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray
    ) -> np.ndarray:
        ct = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
        r = x.ndim
        y = (x.astype(ct) - _channel(mean, r, ct)) / np.sqrt(_channel(var, r, ct) + ct.type(self.eps))
        y = y * _channel(scale, r, ct) + _channel(bias, r, ct)
        return from_compute(y, x.dtype)


@register
@dataclass(frozen=True, eq=False)
class BatchNormTraining(Op):
    """Training batch norm: normalizes with the batch statistics (biased variance) and returns
    ``y, running_mean, running_var`` with ``running = input * momentum + batch * (1 - momentum)``."""

    name: ClassVar[str] = "batch_norm_training"
    num_inputs: ClassVar[tuple[int, int | None]] = (5, 5)
    eps: float = 1e-5
    momentum: float = 0.9

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        _require_float(x, self.name)
        _check_channel_params(x, inputs[1:5], ("scale", "bias", "mean", "var"), self.name)
        return [same_as(x), same_as(inputs[3]), same_as(inputs[4])]

    def ref(
        self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray
    ) -> list[np.ndarray]:
        ct = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
        r = x.ndim
        axes = (0,) + tuple(range(2, r))
        xc = x.astype(ct)
        bm = np.mean(xc, axis=axes)
        bv = np.mean((xc - bm.reshape((1, -1) + (1,) * (r - 2))) ** 2, axis=axes)
        y = (xc - _channel(bm, r, ct)) / np.sqrt(_channel(bv, r, ct) + ct.type(self.eps))
        y = y * _channel(scale, r, ct) + _channel(bias, r, ct)
        m = ct.type(self.momentum)
        rm = mean.astype(ct) * m + bm * (1 - m)
        rv = var.astype(ct) * m + bv * (1 - m)
        return [from_compute(y, x.dtype), from_compute(rm, mean.dtype), from_compute(rv, var.dtype)]


@register
@dataclass(frozen=True, eq=False)
class GroupNorm(Op):
    """Group norm over ``(N, C, ...)``: the channels split into ``num_groups`` groups, each
    normalized over its channels and the spatial dims; then a per-channel ``scale`` and ``bias``.
    Instance norm is ``num_groups = C``."""

    name: ClassVar[str] = "group_norm"
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 3)
    num_groups: int = 1
    eps: float = 1e-5
    stash_type: DType = DType.f32

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        _require_float(x, self.name)
        if self.num_groups < 1:
            raise OpError(f"num_groups must be >= 1, got {self.num_groups}")
        _check_channel_params(x, inputs[1:3], ("scale", "bias"), self.name)
        if x.shape is not None and isinstance(x.shape[1], int) and x.shape[1] % self.num_groups:
            raise OpError(f"{x.shape[1]} channels do not split into {self.num_groups} groups")
        return [same_as(x)]

    def ref(self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
        ct = _compute_dtype(self.stash_type)
        n, c = x.shape[:2]
        g = x.astype(ct).reshape(n, self.num_groups, -1)
        mean = np.mean(g, axis=2, keepdims=True)
        d = g - mean
        var = np.mean(d * d, axis=2, keepdims=True)
        y = (d / np.sqrt(var + ct.type(self.eps))).reshape(x.shape)
        y = y * _channel(scale, x.ndim, ct) + _channel(bias, x.ndim, ct)
        return from_compute(y, x.dtype)


# -- lp_norm, mean_variance_norm, lrn ------------------------------------------------------------


@register
@dataclass(frozen=True, eq=False)
class LpNorm(Op):
    """``x / ||x||_p`` along ``axis`` (0 where the norm is 0)."""

    name: ClassVar[str] = "lp_norm"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    axis: int = -1
    p: int = 2

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        _require_float(x, self.name)
        if self.p not in (1, 2):
            raise OpError(f"p must be 1 or 2, got {self.p}")
        if x.shape is not None:
            normalize_axis(self.axis, len(x.shape))
        return [same_as(x)]

    def ref(self, x: np.ndarray) -> np.ndarray:
        axis = normalize_axis(self.axis, x.ndim)
        xc = to_compute(x)
        if self.p == 1:
            norm = np.sum(np.abs(xc), axis=axis, keepdims=True)
        else:
            norm = np.sqrt(np.sum(xc * xc, axis=axis, keepdims=True))
        with np.errstate(invalid="ignore", divide="ignore"):
            y = np.where(norm == 0, np.zeros_like(xc), xc / norm)
        return from_compute(y, x.dtype)


@register
@dataclass(frozen=True, eq=False)
class MeanVarianceNorm(Op):
    """``(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + eps)`` over ``axes`` (ONNX's function body)."""

    name: ClassVar[str] = "mean_variance_norm"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    axes: tuple[int, ...] = (0, 2, 3)
    eps: float = 1e-9

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        _require_float(x, self.name)
        if x.shape is not None:
            for a in self.axes:
                normalize_axis(a, len(x.shape))
        return [same_as(x)]

    def ref(self, x: np.ndarray) -> np.ndarray:
        axes = tuple(normalize_axis(a, x.ndim) for a in self.axes)
        xc = to_compute(x)
        mean = np.mean(xc, axis=axes, keepdims=True)
        var = np.mean(xc * xc, axis=axes, keepdims=True) - mean * mean
        with np.errstate(invalid="ignore"):
            y = (xc - mean) / (np.sqrt(var) + xc.dtype.type(self.eps))
        return from_compute(y, x.dtype)


@register
@dataclass(frozen=True, eq=False)
class Lrn(Op):
    """Local response normalization across channels (axis 1):
    ``x / (bias + alpha / size * sum_{window} x^2) ^ beta``."""

    name: ClassVar[str] = "lrn"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    size: int = 1
    alpha: float = 1e-4
    beta: float = 0.75
    bias: float = 1.0

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        _require_float(x, self.name)
        if self.size < 1:
            raise OpError(f"size must be >= 1, got {self.size}")
        if x.shape is not None and len(x.shape) < 2:
            raise OpError(f"{self.name} needs an input of rank >= 2 (N, C, ...), got {x}")
        return [same_as(x)]

    def ref(self, x: np.ndarray) -> np.ndarray:
        xc = to_compute(x)
        c = x.shape[1]
        lo, hi = (self.size - 1) // 2, -(-(self.size - 1) // 2)
        sq = xc * xc
        pad = [(0, 0)] * x.ndim
        pad[1] = (lo, hi)
        sq = np.pad(sq, pad)
        acc = np.zeros_like(xc)
        for k in range(self.size):
            acc = acc + np.take(sq, range(k, k + c), axis=1)
        dt = xc.dtype.type
        y = xc / (dt(self.bias) + dt(self.alpha / self.size) * acc) ** dt(self.beta)
        return from_compute(y, x.dtype)


# -- loss -----------------------------------------------------------------------------------------


@register
@dataclass(frozen=True, eq=False)
class NllLoss(Op):
    """Negative log-likelihood: ``loss[n, d...] = -weight[t] * input[n, t, d...]`` with
    ``t = target[n, d...]``; targets equal to ``ignore_index`` contribute 0 (and no weight).
    ``reduction``: ``none`` (shaped like target), ``sum``, or ``mean`` (divided by the sum of the
    weights used). Softmax cross-entropy is ``nll_loss(log_softmax(x, axis=1), target)``."""

    name: ClassVar[str] = "nll_loss"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 3)
    reduction: str = "mean"
    ignore_index: int | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        t = require(inputs[1], "target")
        _require_float(x, self.name)
        if not t.dtype.is_int:
            raise OpError(f"target must be an integer tensor, got {t}")
        if self.reduction not in ("none", "sum", "mean"):
            raise OpError(f"reduction must be none, sum or mean, got {self.reduction!r}")
        if x.shape is not None:
            if len(x.shape) < 2:
                raise OpError(f"input must have rank >= 2 (N, C, ...), got {x}")
            if t.shape is not None:
                want = (x.shape[0], *x.shape[2:])
                if len(t.shape) != len(want) or any(
                    isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(t.shape, want)
                ):
                    raise OpError(f"target {t} does not match input {x} (expected shape {want})")
        w = inputs[2] if len(inputs) > 2 else None
        if w is not None:
            _require_float(w, self.name, "weight")
            if w.shape is not None and len(w.shape) != 1:
                raise OpError(f"weight must be 1-D, got {w}")
        if self.reduction == "none":
            return [TensorType(x.dtype, t.shape)]
        return [TensorType(x.dtype, ())]

    def ref(self, x: np.ndarray, target: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
        xc = to_compute(x)
        c = x.shape[1]
        t = target.astype(np.int64)
        keep = np.ones(t.shape, bool) if self.ignore_index is None else t != self.ignore_index
        tc = np.where(keep, t, 0)
        if np.any((tc < 0) | (tc >= c)):
            raise ValueError(f"target values must lie in [0, {c}) (or equal ignore_index)")
        picked = np.take_along_axis(xc, np.expand_dims(tc, 1), axis=1).squeeze(1)
        w = np.where(keep, 1, 0).astype(xc.dtype)
        if weight is not None:
            w = w * to_compute(weight).astype(xc.dtype)[tc]
        loss = -picked * w
        if self.reduction == "sum":
            loss = np.sum(loss)
        elif self.reduction == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                loss = np.sum(loss) / np.sum(w)
        return from_compute(np.asarray(loss, xc.dtype), x.dtype)


__all__ = [
    "Softmax", "LogSoftmax", "Hardmax", "LayerNorm", "RmsNorm", "BatchNorm", "BatchNormTraining",
    "GroupNorm", "LpNorm", "MeanVarianceNorm", "Lrn", "NllLoss",
]
