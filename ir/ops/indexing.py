"""Indexing ops: gather/scatter families, one_hot, compress, non_zero, topk, unique, tensor_scatter.

Indices may be negative (counted from the end of the axis) wherever ONNX allows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require, same_as
from ..types import UNKNOWN, Dim, DType, TensorType, normalize_axis
from .shape import merge_dims, numel_dim

_INDEX_DTYPES = (DType.i32, DType.i64)
_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _index_type(t: TensorType | None, what: str = "indices") -> TensorType:
    t = require(t, what)
    if t.dtype not in _INDEX_DTYPES:
        raise OpError(f"{what} must be i32 or i64, got {t}")
    return t


def _wrap(idx: np.ndarray, dim: int | np.ndarray) -> np.ndarray:
    idx = idx.astype(np.int64)
    out = np.where(idx < 0, idx + dim, idx)
    if np.any(out < 0) or np.any(out >= dim):
        raise IndexError(f"index out of range for a dim of size {dim}")
    return out


def _f32(x: np.ndarray) -> np.ndarray:
    """Narrow floats (ml_dtypes) computed in float32."""
    return x.astype(np.float32) if x.dtype.kind == "V" or x.dtype.name in _NARROW else x


_NARROW = {"bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
           "float4_e2m1fn", "float8_e8m0fnu", "int4", "uint4"}


@register
@dataclass(frozen=True, eq=False)
class Gather(Op):
    name: ClassVar[str] = "gather"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 2)
    axis: int = 0

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        idx = _index_type(inputs[1])
        if x.shape is None or idx.shape is None:
            return [TensorType(x.dtype, None)]
        if not x.shape:
            raise OpError("cannot gather from a scalar")
        a = normalize_axis(self.axis, len(x.shape))
        return [TensorType(x.dtype, x.shape[:a] + idx.shape + x.shape[a + 1 :])]

    def ref(self, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
        a = normalize_axis(self.axis, x.ndim)
        return np.take(x, _wrap(idx, x.shape[a]), axis=a)


@register
@dataclass(frozen=True, eq=False)
class GatherElements(Op):
    name: ClassVar[str] = "gather_elements"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 2)
    axis: int = 0

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        idx = _index_type(inputs[1])
        if x.shape is not None and idx.shape is not None and len(x.shape) != len(idx.shape):
            raise OpError(f"data {x} and indices {idx} differ in rank")
        return [TensorType(x.dtype, idx.shape)]

    def ref(self, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
        a = normalize_axis(self.axis, x.ndim)
        idx = _wrap(idx, x.shape[a])
        # indices may be smaller than the data off the axis: index explicitly
        return x[tuple(idx if i == a else g for i, g in enumerate(np.indices(idx.shape, sparse=True)))]


@register
@dataclass(frozen=True, eq=False)
class GatherND(Op):
    name: ClassVar[str] = "gather_nd"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 2)
    batch_dims: int = 0

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        idx = _index_type(inputs[1])
        if idx.dtype is not DType.i64:
            raise OpError(f"indices must be i64, got {idx}")
        if x.shape is None or idx.shape is None:
            return [TensorType(x.dtype, None)]
        b = self.batch_dims
        k = idx.shape[-1] if idx.shape else None
        if not isinstance(k, int):
            return [TensorType(x.dtype, None)]
        if b + k > len(x.shape):
            raise OpError(f"indices {idx} index {k} dims past batch_dims {b} of data {x}")
        batch = tuple(merge_dims(p, q) for p, q in zip(x.shape[:b], idx.shape[:b]))
        return [TensorType(x.dtype, batch + idx.shape[b:-1] + x.shape[b + k :])]

    def ref(self, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
        b = self.batch_dims
        k = idx.shape[-1]
        bshape = x.shape[:b]
        nb = int(np.prod(bshape))
        xs = x.reshape((nb,) + x.shape[b:])
        ids = idx.reshape((nb, -1, k))
        ids = _wrap(ids, np.array(x.shape[b : b + k]))
        out = np.stack([xs[i][tuple(ids[i].T)] for i in range(nb)]) if nb else np.zeros(
            (0, ids.shape[1]) + x.shape[b + k :], x.dtype
        )
        return out.reshape(bshape + idx.shape[b:-1] + x.shape[b + k :])


def _apply(reduction: str, out: np.ndarray, where: tuple, upd: np.ndarray) -> None:
    """``out[where] (op)= upd``; repeated positions apply one after another."""
    if reduction == "none":
        out[where] = upd  # numpy writes repeated positions in order: the last one wins
        return
    ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}.get(reduction)
    if ufunc is None:
        raise OpError(f"unknown reduction {reduction!r}")
    ufunc.at(out, where, upd)


@register
@dataclass(frozen=True, eq=False)
class ScatterElements(Op):
    """Copy of data with ``updates`` written (or reduced) at ``indices`` along ``axis``; duplicates
    apply in order."""

    name: ClassVar[str] = "scatter_elements"
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 3)
    axis: int = 0
    reduction: str = "none"

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        idx = _index_type(inputs[1])
        upd = require(inputs[2], "updates")
        if self.reduction not in _REDUCTIONS:
            raise OpError(f"unknown reduction {self.reduction!r}")
        if upd.dtype != x.dtype:
            raise OpError(f"updates {upd} do not match data {x}")
        if idx.shape is not None and upd.shape is not None and len(idx.shape) != len(upd.shape):
            raise OpError(f"indices {idx} and updates {upd} differ in rank")
        if x.shape is not None and idx.shape is not None and len(x.shape) != len(idx.shape):
            raise OpError(f"indices {idx} and data {x} differ in rank")
        return [same_as(x)]

    def ref(self, x: np.ndarray, idx: np.ndarray, upd: np.ndarray) -> np.ndarray:
        a = normalize_axis(self.axis, x.ndim)
        out = _f32(x).copy()
        u = _f32(upd)
        idx = _wrap(idx, x.shape[a])
        if u.shape != idx.shape:
            raise OpError(f"updates {u.shape} and indices {idx.shape} differ in shape")
        where = tuple(idx if i == a else g for i, g in enumerate(np.indices(idx.shape, sparse=True)))
        _apply(self.reduction, out, where, u)
        return out.astype(x.dtype)


@register
@dataclass(frozen=True, eq=False)
class ScatterND(Op):
    name: ClassVar[str] = "scatter_nd"
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 3)
    reduction: str = "none"

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        idx = _index_type(inputs[1])
        upd = require(inputs[2], "updates")
        if idx.dtype is not DType.i64:
            raise OpError(f"indices must be i64, got {idx}")
        if self.reduction not in _REDUCTIONS:
            raise OpError(f"unknown reduction {self.reduction!r}")
        if upd.dtype != x.dtype:
            raise OpError(f"updates {upd} do not match data {x}")
        if x.shape is not None and idx.shape and isinstance(idx.shape[-1], int):
            k = idx.shape[-1]
            if k > len(x.shape):
                raise OpError(f"indices {idx} index more dims than data {x} has")
            if upd.shape is not None and len(upd.shape) != len(idx.shape) - 1 + len(x.shape) - k:
                raise OpError(f"updates {upd} do not fit indices {idx} and data {x}")
        return [same_as(x)]

    def ref(self, x: np.ndarray, idx: np.ndarray, upd: np.ndarray) -> np.ndarray:
        out = _f32(x).copy()
        u = _f32(upd)
        k = idx.shape[-1]
        ids = _wrap(idx.reshape(-1, k), np.array(x.shape[:k]))
        u = u.reshape((ids.shape[0],) + x.shape[k:])
        _apply(self.reduction, out, tuple(ids.T), u)
        return out.astype(x.dtype)


@register
@dataclass(frozen=True, eq=False)
class TensorScatter(Op):
    """KV-cache write: ``update`` goes into ``past`` along ``axis`` at each batch row's write index
    (0 when omitted); ``circular`` wraps around the cache length."""

    name: ClassVar[str] = "tensor_scatter"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 3)
    axis: int = -2
    mode: str = "linear"

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        past = require(inputs[0], "past_cache")
        upd = require(inputs[1], "update")
        if self.mode not in ("linear", "circular"):
            raise OpError(f"unknown mode {self.mode!r}")
        if upd.dtype != past.dtype:
            raise OpError(f"update {upd} does not match the cache {past}")
        if len(inputs) > 2 and inputs[2] is not None:
            _index_type(inputs[2], "write_indices")
        if past.shape is not None and upd.shape is not None:
            if len(past.shape) != len(upd.shape):
                raise OpError(f"update {upd} and cache {past} differ in rank")
            a = normalize_axis(self.axis, len(past.shape))
            if a == 0:
                raise OpError("axis cannot be the batch axis")
        return [same_as(past)]

    def ref(self, past: np.ndarray, upd: np.ndarray, write: np.ndarray | None = None) -> np.ndarray:
        a = normalize_axis(self.axis, past.ndim)
        out = past.copy()
        n, length = upd.shape[a], past.shape[a]
        for b in range(past.shape[0]):
            w = 0 if write is None else int(write[b])
            pos = np.arange(w, w + n)
            if self.mode == "circular":
                pos %= length
            elif n and (w < 0 or w + n > length):
                raise IndexError(f"write index {w} + {n} updates overflow the cache of {length}")
            dst = [slice(None)] * past.ndim
            dst[0] = b  # type: ignore[call-overload]
            dst[a] = pos  # type: ignore[call-overload]
            src = [slice(None)] * past.ndim
            src[0] = b  # type: ignore[call-overload]
            # indexing with an int and an array moves the array axis first: do it per position
            for j, p in enumerate(pos):
                dst[a] = int(p)  # type: ignore[call-overload]
                src[a] = j  # type: ignore[call-overload]
                out[tuple(dst)] = upd[tuple(src)]
        return out


@register
@dataclass(frozen=True, eq=False)
class OneHot(Op):
    """One-hot along ``axis``: ``values = [off, on]`` (their dtype is the output's); negative
    indices count from ``depth``; out-of-range ones give all ``off``."""

    name: ClassVar[str] = "one_hot"
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 3)
    const_inputs: ClassVar[dict[int, str]] = {1: "depth"}
    axis: int = -1
    depth: int | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        idx = require(inputs[0], "indices")
        vals = require(inputs[2], "values")
        if vals.shape is not None and numel_dim(vals.shape) not in (2, UNKNOWN):
            raise OpError(f"values must have 2 elements, got {vals}")
        if inputs[1] is None and self.depth is None:
            raise OpError("missing depth")
        if idx.shape is None:
            return [TensorType(vals.dtype, None)]
        r = len(idx.shape) + 1
        a = normalize_axis(self.axis, r)
        d: Dim = UNKNOWN if inputs[1] is not None else self.depth  # type: ignore[assignment]
        return [TensorType(vals.dtype, idx.shape[:a] + (d,) + idx.shape[a:])]

    def ref(self, idx: np.ndarray, depth: np.ndarray | None, values: np.ndarray) -> np.ndarray:
        d = self.depth if depth is None else int(np.asarray(depth).reshape(-1)[0].astype(np.float64))
        assert d is not None
        a = normalize_axis(self.axis, idx.ndim + 1)
        i = np.asarray(idx).astype(np.float64)
        i = np.trunc(i).astype(np.int64)
        i = np.where(i < 0, i + d, i)
        hot = np.expand_dims(i, a) == np.arange(d).reshape([-1 if k == a else 1 for k in range(idx.ndim + 1)])
        v = values.reshape(-1)
        return np.where(hot, v[1], v[0]).astype(values.dtype)


@register
@dataclass(frozen=True, eq=False)
class Compress(Op):
    """The slices along ``axis`` (of the flattened input when None) where ``condition`` is true."""

    name: ClassVar[str] = "compress"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 2)
    axis: int | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        c = require(inputs[1], "condition")
        if c.dtype is not DType.bool:
            raise OpError(f"condition must be bool, got {c}")
        if self.axis is None:
            return [TensorType(x.dtype, (UNKNOWN,))]
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        a = normalize_axis(self.axis, len(x.shape))
        return [TensorType(x.dtype, x.shape[:a] + (UNKNOWN,) + x.shape[a + 1 :])]

    def ref(self, x: np.ndarray, cond: np.ndarray) -> np.ndarray:
        return np.compress(cond.reshape(-1), x, axis=self.axis)


@register
@dataclass(frozen=True, eq=False)
class NonZero(Op):
    """Indices of the non-zero elements, i64[rank, count]."""

    name: ClassVar[str] = "non_zero"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        return [TensorType(DType.i64, (UNKNOWN if x.shape is None else len(x.shape), UNKNOWN))]

    def ref(self, x: np.ndarray) -> np.ndarray:
        nz = _f32(x) != 0
        if nz.ndim == 0:
            return np.zeros((0, int(nz)), np.int64)
        return np.array(np.nonzero(nz), dtype=np.int64).reshape(nz.ndim, -1)


@register
@dataclass(frozen=True, eq=False)
class TopK(Op):
    """The ``k`` largest (or smallest) values along ``axis`` and their i64 indices, sorted; ties go
    to the lower index."""

    name: ClassVar[str] = "topk"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 2)
    const_inputs: ClassVar[dict[int, str]] = {1: "k"}
    axis: int = -1
    largest: bool = True
    sorted: bool = True
    k: int | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        dynamic = len(inputs) > 1 and inputs[1] is not None
        if not dynamic and self.k is None:
            raise OpError("missing k")
        if x.shape is None:
            return [TensorType(x.dtype, None), TensorType(DType.i64, None)]
        a = normalize_axis(self.axis, len(x.shape))
        d = x.shape[a]
        if not dynamic and isinstance(d, int) and not 0 <= self.k <= d:  # type: ignore[operator]
            raise OpError(f"k={self.k} is out of range for axis {a} of {x}")
        kd: Dim = UNKNOWN if dynamic else self.k  # type: ignore[assignment]
        shape = x.shape[:a] + (kd,) + x.shape[a + 1 :]
        return [TensorType(x.dtype, shape), TensorType(DType.i64, shape)]

    def ref(self, x: np.ndarray, k: np.ndarray | None = None) -> list[np.ndarray]:
        kk = self.k if k is None else int(np.asarray(k).reshape(-1)[0])
        assert kk is not None
        a = normalize_axis(self.axis, x.ndim)
        v = _f32(x)
        if self.largest:
            # stable descending order with ties at the lower index: sort the reversed axis
            rev = np.flip(v, axis=a)
            order = np.flip(np.argsort(rev, axis=a, kind="stable"), axis=a)
            order = x.shape[a] - 1 - order
        else:
            order = np.argsort(v, axis=a, kind="stable")
        idx = np.take(order, np.arange(kk), axis=a).astype(np.int64)
        return [np.take_along_axis(x, idx, axis=a), idx]


@register
@dataclass(frozen=True, eq=False)
class Unique(Op):
    """Unique elements (or slices along ``axis``): values, first-occurrence indices, inverse
    indices and counts; ``sorted=False`` keeps the order of first occurrence."""

    name: ClassVar[str] = "unique"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    axis: int | None = None
    sorted: bool = True

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        q = (UNKNOWN,)
        if self.axis is None:
            n: Dim = UNKNOWN if x.shape is None else numel_dim(x.shape)
            return [TensorType(x.dtype, q), TensorType(DType.i64, q), TensorType(DType.i64, (n,)),
                    TensorType(DType.i64, q)]
        if x.shape is None:
            return [TensorType(x.dtype, None)] + [TensorType(DType.i64, q)] * 3
        a = normalize_axis(self.axis, len(x.shape))
        y = x.shape[:a] + q + x.shape[a + 1 :]
        return [TensorType(x.dtype, y), TensorType(DType.i64, q), TensorType(DType.i64, (x.shape[a],)),
                TensorType(DType.i64, q)]

    def ref(self, x: np.ndarray) -> list[np.ndarray]:
        v = _f32(x)
        if self.axis is None:
            _, first, inv, counts = np.unique(
                v.reshape(-1), return_index=True, return_inverse=True, return_counts=True
            )
            a = 0
            src = x.reshape(-1)
        else:
            a = normalize_axis(self.axis, x.ndim)
            _, first, inv, counts = np.unique(
                v, axis=a, return_index=True, return_inverse=True, return_counts=True
            )
            src = x
        inv = inv.reshape(-1)
        if not self.sorted:
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            first, counts, inv = first[order], counts[order], rank[inv]
        y = np.take(src, first, axis=a)
        return [y, first.astype(np.int64), inv.astype(np.int64), counts.astype(np.int64)]


__all__ = [
    "Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND", "TensorScatter", "OneHot",
    "Compress", "NonZero", "TopK", "Unique",
]
