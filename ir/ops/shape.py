"""Shape and data-movement ops: reshape, shape, transpose, concat, split, slice, squeeze, pad, ...

Shape-like parameters (a reshape's target, slice bounds, pads, axes) are attributes when known at
compile time and inputs otherwise (``const_inputs``). ``reshape``, ``expand`` and
``constant_of_shape`` also accept a *symbolic* target (entries ``int`` or symbol) together with the
runtime shape input: the importer derives it from ``Shape -> Gather -> Concat`` chains so that
``reshape(x: f32[B,S,64], shape)`` still infers ``f32[B,S,4,16]``; the runtime input gives the exact
values, the attribute only sharpens type inference (``"?"`` entries are unknown).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require, same_as
from ..types import UNKNOWN, Dim, DType, Shape, TensorType, dim_add, dim_mul, normalize_axis

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
#: Slice bounds at or beyond this magnitude mean "to the end" (ONNX exporters use INT64_MAX / INT_MAX).
_BIG = 2**31 - 1

# -- symbolic dim arithmetic ---------------------------------------------------------------------


def _split_top(s: str, sep: str) -> list[str] | None:
    """Split ``s`` on ``sep`` at parenthesis depth 0; None when parentheses do not balance."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return None
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        return None
    parts.append("".join(cur))
    return parts


def _strip_parens(s: str) -> str:
    while s.startswith("(") and s.endswith(")"):
        inner = s[1:-1]
        if _split_top(inner, "\0") is None:  # the outer parens do not enclose everything
            break
        s = inner
    return s


def dim_factors(d: Dim) -> tuple[int, list[str]] | None:
    """A dim as an integer coefficient times a list of symbolic factors; None for ``"?"``."""
    if isinstance(d, int):
        return d, []
    if d == UNKNOWN:
        return None
    s = _strip_parens(d)
    parts = _split_top(s, "*")
    if parts is None or len(parts) == 1:
        if s.isdigit():
            return int(s), []
        return 1, [s if _IDENT.fullmatch(s) else d]
    k, syms = 1, []
    for p in parts:
        f = dim_factors(p.strip())
        if f is None:
            return None
        k *= f[0]
        syms += f[1]
    return k, syms


def _from_factors(k: int, syms: Sequence[str]) -> Dim:
    out: Dim = 1
    for s in syms:
        out = dim_mul(out, s)
    return dim_mul(out, k)


def dim_div(a: Dim, b: Dim) -> Dim | None:
    """``a / b`` when it divides exactly as far as the symbols show; None otherwise."""
    fa, fb = dim_factors(a), dim_factors(b)
    if fa is None or fb is None or fb[0] == 0:
        return None
    rest = list(fa[1])
    for s in fb[1]:
        if s not in rest:
            return None
        rest.remove(s)
    if fa[0] % fb[0]:
        return None
    return _from_factors(fa[0] // fb[0], rest)


def numel_dim(shape: Sequence[Dim]) -> Dim:
    k, syms = 1, []
    for d in shape:
        f = dim_factors(d)
        if f is None:
            return UNKNOWN
        k *= f[0]
        syms += f[1]
    return _from_factors(k, syms)


def merge_dims(a: Dim, b: Dim) -> Dim:
    """Two dims that must be equal: the better known one."""
    if a == UNKNOWN:
        return b
    if b == UNKNOWN or a == b:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise OpError(f"dims {a} and {b} differ")
    return b if isinstance(b, int) else a


def bcast_dim(a: Dim, b: Dim) -> Dim:
    """Broadcast two dims that are known to broadcast (bidirectionally)."""
    if a == 1:
        return b
    if b == 1 or a == b:
        return a
    if a == UNKNOWN:
        return b  # a is 1 or b
    if b == UNKNOWN:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise OpError(f"dims {a} and {b} do not broadcast")
    return a if isinstance(a, int) else b


def _rank(t: TensorType) -> int:
    if t.shape is None:
        raise OpError("input of unknown rank")
    return len(t.shape)


def _axes(axes: Sequence[int], rank: int) -> list[int]:
    out = [normalize_axis(a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise OpError(f"repeated axes {list(axes)}")
    return out


def _ints(a: np.ndarray | None, attr: Sequence[int | str] | None, what: str) -> list[int]:
    if a is not None:
        return [int(v) for v in np.asarray(a).reshape(-1)]
    if attr is None:
        raise OpError(f"missing {what}")
    if any(not isinstance(v, int) for v in attr):
        raise OpError(f"{what} {attr} is symbolic: the runtime input is needed")
    return [int(v) for v in attr]  # type: ignore[arg-type]


def _len1d(t: TensorType | None) -> int | None:
    """The static length of a 1-D parameter input, if known."""
    if t is None or t.shape is None or len(t.shape) != 1 or not isinstance(t.shape[0], int):
        return None
    return t.shape[0]


def _check_sym_attr(value: Sequence[int | str] | None, has_input: bool, what: str) -> None:
    if value is not None and not has_input and any(not isinstance(v, int) for v in value):
        raise OpError(f"{what} {list(value)} is symbolic: the runtime shape input is needed")


# -- reshape family ------------------------------------------------------------------------------


def reshape_dims(in_shape: Shape | None, target: Sequence[Dim], allowzero: bool) -> Shape:
    out: list[Dim] = []
    neg = -1
    for i, s in enumerate(target):
        if s == 0 and not allowzero:
            if in_shape is None:
                out.append(UNKNOWN)
            elif i >= len(in_shape):
                raise OpError(f"shape entry {i} is 0 but the input has rank {len(in_shape)}")
            else:
                out.append(in_shape[i])
        elif s == -1:
            if neg >= 0:
                raise OpError(f"shape {list(target)} has more than one -1")
            neg = i
            out.append(UNKNOWN)
        elif isinstance(s, int) and s < -1:
            raise OpError(f"invalid shape entry {s}")
        else:
            out.append(s)
    total = UNKNOWN if in_shape is None else numel_dim(in_shape)
    unknown = [i for i, d in enumerate(out) if d == UNKNOWN]
    if len(unknown) == 1 and total != UNKNOWN:
        # the one unknown entry (-1, or a runtime value that is positive or 0) fills the element count
        i = unknown[0]
        known = numel_dim([d for j, d in enumerate(out) if j != i])
        q = dim_div(total, known) if known != 0 else None
        out[i] = UNKNOWN if q is None else q
    elif not unknown and isinstance(total, int):
        n = numel_dim(out)
        if isinstance(n, int) and n != total:
            raise OpError(f"cannot reshape {tuple(in_shape)} ({total} elements) to {tuple(out)}")  # type: ignore
    return tuple(out)


@register
@dataclass(frozen=True, eq=False)
class Reshape(Op):
    """ONNX Reshape: 0 copies the input dim (unless ``allowzero``), -1 is inferred."""

    name: ClassVar[str] = "reshape"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 2)
    const_inputs: ClassVar[dict[int, str]] = {1: "shape"}
    shape: tuple[int | str, ...] | None = None
    allowzero: bool = False

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        s = inputs[1] if len(inputs) > 1 else None
        _check_sym_attr(self.shape, s is not None, "shape")
        if self.shape is not None:
            if s is not None and _len1d(s) not in (None, len(self.shape)):
                raise OpError(f"shape input {s} does not match the shape hint {list(self.shape)}")
            return [TensorType(x.dtype, reshape_dims(x.shape, self.shape, self.allowzero))]
        n = _len1d(require(s, "shape"))
        return [TensorType(x.dtype, None if n is None else (UNKNOWN,) * n)]

    def ref(self, x: np.ndarray, shape: np.ndarray | None = None) -> np.ndarray:
        target = _ints(shape, self.shape, "shape")
        if not self.allowzero:
            target = [x.shape[i] if v == 0 else v for i, v in enumerate(target)]
        return x.reshape(target)


@register
@dataclass(frozen=True, eq=False)
class ShapeOf(Op):
    """The input's shape (dims ``start:end``) as i64[n]."""

    name: ClassVar[str] = "shape"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    start: int = 0
    end: int | None = None

    def dims(self, shape: Shape) -> Shape:
        r = len(shape)
        s = min(max(self.start + r if self.start < 0 else self.start, 0), r)
        e = r if self.end is None else self.end
        e = min(max(e + r if e < 0 else e, 0), r)
        return tuple(shape[s:e])

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        n: Dim = UNKNOWN if x.shape is None else len(self.dims(x.shape))
        return [TensorType(DType.i64, (n,))]

    def ref(self, x: np.ndarray) -> np.ndarray:
        return np.array(self.dims(x.shape), dtype=np.int64).reshape(-1)


@register
@dataclass(frozen=True, eq=False)
class Size(Op):
    name: ClassVar[str] = "size"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        require(inputs[0])
        return [TensorType(DType.i64, ())]

    def ref(self, x: np.ndarray) -> np.ndarray:
        return np.array(x.size, dtype=np.int64)


@register
@dataclass(frozen=True, eq=False)
class Transpose(Op):
    name: ClassVar[str] = "transpose"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    perm: tuple[int, ...] | None = None

    def _perm(self, rank: int) -> list[int]:
        if self.perm is None:
            return list(range(rank))[::-1]
        if sorted(normalize_axis(p, rank) for p in self.perm) != list(range(rank)):
            raise OpError(f"perm {list(self.perm)} is not a permutation of {rank} axes")
        return [normalize_axis(p, rank) for p in self.perm]

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        if x.shape is None:
            return [TensorType(x.dtype, None if self.perm is None else (UNKNOWN,) * len(self.perm))]
        return [TensorType(x.dtype, tuple(x.shape[p] for p in self._perm(len(x.shape))))]

    def ref(self, x: np.ndarray) -> np.ndarray:
        return np.transpose(x, self._perm(x.ndim))


@register
@dataclass(frozen=True, eq=False)
class Concat(Op):
    name: ClassVar[str] = "concat"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, None)
    axis: int = 0

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        ts = [require(t) for t in inputs]
        if len({t.dtype for t in ts}) > 1:
            raise OpError(f"inputs have different dtypes: {', '.join(str(t) for t in ts)}")
        known = [t.shape for t in ts if t.shape is not None]
        if len(known) < len(ts):
            if not known:
                return [TensorType(ts[0].dtype, None)]
        rank = len(known[0])
        if any(len(s) != rank for s in known):
            raise OpError(f"inputs have different ranks: {', '.join(str(t) for t in ts)}")
        ax = normalize_axis(self.axis, rank)
        out: list[Dim] = list(known[0])
        for s in known[1:]:
            for i in range(rank):
                if i != ax:
                    try:
                        out[i] = merge_dims(out[i], s[i])
                    except OpError:
                        raise OpError(
                            f"inputs differ off the concat axis: {', '.join(str(t) for t in ts)}"
                        ) from None
        if len(known) < len(ts):
            out[ax] = UNKNOWN
        else:
            total: Dim = 0
            for s in known:
                total = dim_add(total, s[ax])
            out[ax] = total
        return [TensorType(ts[0].dtype, tuple(out))]

    def ref(self, *xs: np.ndarray) -> np.ndarray:
        return np.concatenate(xs, axis=self.axis)


@register
@dataclass(frozen=True, eq=False)
class Split(Op):
    """Split along ``axis`` into ``num_outputs`` parts: sizes ``split``, or equal (last smaller)."""

    name: ClassVar[str] = "split"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 2)
    const_inputs: ClassVar[dict[int, str]] = {1: "split"}
    axis: int = 0
    num_outputs: int = 2
    split: tuple[int, ...] | None = None

    def _sizes(self, dim: Dim) -> list[Dim]:
        n = self.num_outputs
        if self.split is not None:
            if len(self.split) != n:
                raise OpError(f"split {list(self.split)} has {len(self.split)} parts, expected {n}")
            if isinstance(dim, int) and sum(self.split) != dim:
                raise OpError(f"split {list(self.split)} does not add up to dim {dim}")
            return list(self.split)
        if isinstance(dim, int):
            if n > dim and dim:
                raise OpError(f"cannot split dim {dim} into {n} parts")
            c = -(-dim // n)
            return [c] * (n - 1) + [dim - c * (n - 1)]
        q = dim_div(dim, n)
        return [UNKNOWN] * n if q is None else [q] * n

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        if self.num_outputs < 1:
            raise OpError("num_outputs must be positive")
        if x.shape is None:
            return [TensorType(x.dtype, None)] * self.num_outputs
        ax = normalize_axis(self.axis, len(x.shape))
        dynamic = len(inputs) > 1 and inputs[1] is not None
        sizes = [UNKNOWN] * self.num_outputs if dynamic else self._sizes(x.shape[ax])
        return [TensorType(x.dtype, x.shape[:ax] + (s,) + x.shape[ax + 1 :]) for s in sizes]

    def ref(self, x: np.ndarray, split: np.ndarray | None = None) -> list[np.ndarray]:
        ax = normalize_axis(self.axis, x.ndim)
        sizes = _ints(split, None, "split") if split is not None else self._sizes(x.shape[ax])
        if len(sizes) != self.num_outputs:
            raise OpError(f"split {sizes} has {len(sizes)} parts, expected {self.num_outputs}")
        cuts = np.cumsum(sizes)[:-1]
        return [np.ascontiguousarray(p) for p in np.split(x, cuts, axis=ax)]


def slice_params(
    starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None, steps: Sequence[int] | None,
    rank: int,
) -> list[tuple[int, int, int, int]]:
    """(axis, start, end, step) per sliced axis, axes normalized."""
    if len(starts) != len(ends):
        raise OpError(f"starts {list(starts)} and ends {list(ends)} differ in length")
    ax = list(range(len(starts))) if axes is None else _axes(axes, rank)
    st = [1] * len(starts) if steps is None else list(steps)
    if len(ax) != len(starts) or len(st) != len(starts):
        raise OpError("starts, ends, axes and steps differ in length")
    if any(s == 0 for s in st):
        raise OpError("slice step 0")
    return list(zip(ax, starts, ends, st))


def _clamp(v: int, dim: int, step: int) -> int:
    if v < 0:
        v += dim
    return min(max(v, 0), dim) if step > 0 else min(max(v, -1), dim - 1)


def slice_dim(dim: Dim, start: int, end: int, step: int) -> Dim:
    if isinstance(dim, int):
        s, e = _clamp(start, dim, step), _clamp(end, dim, step)
        return max(0, -(-(e - s) // step)) if step > 0 else max(0, -(-(s - e) // -step))
    # symbolic dim: exact only when the slice covers it whole
    if step == 1 and start in (0,) or step == 1 and start <= -_BIG:
        if end >= _BIG:
            return dim
    if step == -1 and (start == -1 or start >= _BIG) and end <= -_BIG:
        return dim
    return UNKNOWN


@register
@dataclass(frozen=True, eq=False)
class Slice(Op):
    name: ClassVar[str] = "slice"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 5)
    const_inputs: ClassVar[dict[int, str]] = {1: "starts", 2: "ends", 3: "axes", 4: "steps"}
    starts: tuple[int, ...] | None = None
    ends: tuple[int, ...] | None = None
    axes: tuple[int, ...] | None = None
    steps: tuple[int, ...] | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        ins = list(inputs) + [None] * (5 - len(inputs))
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        rank = len(x.shape)
        for i, a in ((1, "starts"), (2, "ends")):
            if ins[i] is None and getattr(self, a) is None:
                raise OpError(f"missing {a}")
        if ins[3] is not None and self.axes is None:
            return [TensorType(x.dtype, (UNKNOWN,) * rank)]
        n = len(self.starts) if self.starts is not None else (
            len(self.ends) if self.ends is not None else _len1d(ins[1])
        )
        axes = self.axes
        if axes is None:
            if n is None:
                return [TensorType(x.dtype, (UNKNOWN,) * rank)]
            axes = tuple(range(n))
        if ins[1] is not None or ins[2] is not None or ins[4] is not None:
            # some bounds only known at run time: those axes become unknown
            out = list(x.shape)
            for a in _axes(axes, rank):
                out[a] = UNKNOWN
            return [TensorType(x.dtype, tuple(out))]
        assert self.starts is not None and self.ends is not None
        out = list(x.shape)
        for a, s, e, st in slice_params(self.starts, self.ends, axes, self.steps, rank):
            out[a] = slice_dim(x.shape[a], s, e, st)
        return [TensorType(x.dtype, tuple(out))]

    def ref(
        self, x: np.ndarray, starts: np.ndarray | None = None, ends: np.ndarray | None = None,
        axes: np.ndarray | None = None, steps: np.ndarray | None = None,
    ) -> np.ndarray:
        st = _ints(starts, self.starts, "starts")
        en = _ints(ends, self.ends, "ends")
        ax = _ints(axes, self.axes, "axes") if axes is not None or self.axes is not None else None
        sp = _ints(steps, self.steps, "steps") if steps is not None or self.steps is not None else None
        idx = [slice(None)] * x.ndim
        for a, s, e, step in slice_params(st, en, ax, sp, x.ndim):
            d = x.shape[a]
            s, e = _clamp(s, d, step), _clamp(e, d, step)
            idx[a] = slice(s, None if e < 0 else e, step)
        return np.ascontiguousarray(x[tuple(idx)])


@register
@dataclass(frozen=True, eq=False)
class Squeeze(Op):
    """Remove the given size-1 axes (all size-1 axes when ``axes`` is None and no input)."""

    name: ClassVar[str] = "squeeze"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 2)
    const_inputs: ClassVar[dict[int, str]] = {1: "axes"}
    axes: tuple[int, ...] | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        a = inputs[1] if len(inputs) > 1 else None
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        rank = len(x.shape)
        if a is not None:
            n = _len1d(a)
            return [TensorType(x.dtype, None if n is None else (UNKNOWN,) * (rank - n))]
        if self.axes is None:
            if any(not isinstance(d, int) for d in x.shape):
                return [TensorType(x.dtype, None)]  # which dims are 1 is only known at run time
            return [TensorType(x.dtype, tuple(d for d in x.shape if d != 1))]
        axes = _axes(self.axes, rank)
        for i in axes:
            if isinstance(x.shape[i], int) and x.shape[i] != 1:
                raise OpError(f"cannot squeeze axis {i} of size {x.shape[i]}")
        return [TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in axes))]

    def ref(self, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
        if axes is None and self.axes is None:
            return np.squeeze(x)
        ax = _ints(axes, self.axes, "axes")
        return np.squeeze(x, axis=tuple(_axes(ax, x.ndim)))


@register
@dataclass(frozen=True, eq=False)
class Unsqueeze(Op):
    name: ClassVar[str] = "unsqueeze"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 2)
    const_inputs: ClassVar[dict[int, str]] = {1: "axes"}
    axes: tuple[int, ...] | None = None

    @staticmethod
    def out_dims(shape: Shape, axes: Sequence[int]) -> Shape:
        r = len(shape) + len(axes)
        ax = _axes(axes, r)
        it = iter(shape)
        return tuple(1 if i in ax else next(it) for i in range(r))

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        a = inputs[1] if len(inputs) > 1 else None
        if a is not None or self.axes is None:
            n = _len1d(require(a, "axes"))
            if x.shape is None or n is None:
                return [TensorType(x.dtype, None)]
            return [TensorType(x.dtype, (UNKNOWN,) * (len(x.shape) + n))]
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        return [TensorType(x.dtype, self.out_dims(x.shape, self.axes))]

    def ref(self, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
        ax = _ints(axes, self.axes, "axes")
        return x.reshape(self.out_dims(x.shape, ax))  # type: ignore[arg-type]


@register
@dataclass(frozen=True, eq=False)
class Flatten(Op):
    name: ClassVar[str] = "flatten"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    axis: int = 1

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        if x.shape is None:
            return [TensorType(x.dtype, (UNKNOWN, UNKNOWN))]
        r = len(x.shape)
        if not -r <= self.axis <= r:
            raise OpError(f"axis {self.axis} is out of range for rank {r}")
        a = self.axis + r if self.axis < 0 else self.axis
        return [TensorType(x.dtype, (numel_dim(x.shape[:a]), numel_dim(x.shape[a:])))]

    def ref(self, x: np.ndarray) -> np.ndarray:
        a = self.axis + x.ndim if self.axis < 0 else self.axis
        return x.reshape(int(np.prod(x.shape[:a])), int(np.prod(x.shape[a:])))


@register
@dataclass(frozen=True, eq=False)
class Expand(Op):
    """Broadcast ``x`` to ``shape`` (bidirectionally, like ONNX Expand)."""

    name: ClassVar[str] = "expand"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 2)
    const_inputs: ClassVar[dict[int, str]] = {1: "shape"}
    shape: tuple[int | str, ...] | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        s = inputs[1] if len(inputs) > 1 else None
        _check_sym_attr(self.shape, s is not None, "shape")
        if self.shape is not None:
            target: tuple[Dim, ...] = tuple(self.shape)
        else:
            n = _len1d(require(s, "shape"))
            if n is None:
                return [TensorType(x.dtype, None)]
            target = (UNKNOWN,) * n
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        r = max(len(x.shape), len(target))
        a = (1,) * (r - len(x.shape)) + tuple(x.shape)
        b = (1,) * (r - len(target)) + target
        try:
            return [TensorType(x.dtype, tuple(bcast_dim(p, q) for p, q in zip(a, b)))]
        except OpError:
            raise OpError(f"cannot expand {x} to {list(target)}") from None

    def ref(self, x: np.ndarray, shape: np.ndarray | None = None) -> np.ndarray:
        target = _ints(shape, self.shape, "shape")
        out = np.broadcast_shapes(x.shape, tuple(target))
        return np.ascontiguousarray(np.broadcast_to(x, out))


@register
@dataclass(frozen=True, eq=False)
class Tile(Op):
    name: ClassVar[str] = "tile"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 2)
    const_inputs: ClassVar[dict[int, str]] = {1: "repeats"}
    repeats: tuple[int, ...] | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        if len(inputs) > 1 and inputs[1] is not None:
            return [TensorType(x.dtype, (UNKNOWN,) * len(x.shape))]
        if self.repeats is None:
            raise OpError("missing repeats")
        if len(self.repeats) != len(x.shape):
            raise OpError(f"repeats {list(self.repeats)} do not match rank {len(x.shape)}")
        return [TensorType(x.dtype, tuple(dim_mul(d, r) for d, r in zip(x.shape, self.repeats)))]

    def ref(self, x: np.ndarray, repeats: np.ndarray | None = None) -> np.ndarray:
        return np.tile(x, _ints(repeats, self.repeats, "repeats"))


_PAD_MODES = ("constant", "reflect", "edge", "wrap")


@register
@dataclass(frozen=True, eq=False)
class Pad(Op):
    """Pad (negative pads crop). ``pads`` is [begin..., end...] over ``axes`` (all axes if None);
    the optional input 2 is the constant value (0 if omitted)."""

    name: ClassVar[str] = "pad"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 4)
    const_inputs: ClassVar[dict[int, str]] = {1: "pads", 3: "axes"}
    mode: str = "constant"
    pads: tuple[int, ...] | None = None
    axes: tuple[int, ...] | None = None

    def _widths(self, pads: Sequence[int], axes: Sequence[int] | None, rank: int) -> list[tuple[int, int]]:
        ax = list(range(rank)) if axes is None else _axes(axes, rank)
        if len(pads) != 2 * len(ax):
            raise OpError(f"pads {list(pads)} must have 2 entries per padded axis ({len(ax)})")
        w = [(0, 0)] * rank
        for i, a in enumerate(ax):
            w[a] = (pads[i], pads[i + len(ax)])
        return w

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        ins = list(inputs) + [None] * (4 - len(inputs))
        if self.mode not in _PAD_MODES:
            raise OpError(f"unknown pad mode {self.mode!r}")
        if ins[2] is not None and ins[2].dtype != x.dtype:
            raise OpError(f"constant value {ins[2]} does not match the data {x}")
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        rank = len(x.shape)
        if ins[1] is not None or ins[3] is not None:
            if ins[3] is None and self.axes is not None and ins[1] is not None:
                out = list(x.shape)
                for a in _axes(self.axes, rank):
                    out[a] = UNKNOWN
                return [TensorType(x.dtype, tuple(out))]
            return [TensorType(x.dtype, (UNKNOWN,) * rank)]
        if self.pads is None:
            raise OpError("missing pads")
        w = self._widths(self.pads, self.axes, rank)
        return [TensorType(x.dtype, tuple(dim_add(d, b + e) for d, (b, e) in zip(x.shape, w)))]

    def ref(
        self, x: np.ndarray, pads: np.ndarray | None = None, value: np.ndarray | None = None,
        axes: np.ndarray | None = None,
    ) -> np.ndarray:
        p = _ints(pads, self.pads, "pads")
        ax = _ints(axes, self.axes, "axes") if axes is not None or self.axes is not None else None
        w = self._widths(p, ax, x.ndim)
        # negative pads crop first; then pad with the non-negative amounts
        crop = tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(w))
        x = x[crop]
        pos = [(max(b, 0), max(e, 0)) for b, e in w]
        if self.mode == "constant":
            v = np.zeros((), x.dtype) if value is None or value.size == 0 else value.reshape(-1)[0]
            out = np.full(tuple(d + b + e for d, (b, e) in zip(x.shape, pos)), v, dtype=x.dtype)
            out[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, pos))] = x
            return out
        if x.size == 0 and any(b or e for b, e in pos):
            raise OpError(f"cannot {self.mode}-pad an empty tensor")
        if x.dtype.kind not in "biuf" and x.dtype != np.bool_:
            return np.pad(x.astype(np.float32), pos, mode=self.mode).astype(x.dtype)
        return np.pad(x, pos, mode=self.mode)


@register
@dataclass(frozen=True, eq=False)
class ConstantOfShape(Op):
    """A tensor of ``shape`` filled with ``value`` (a one-element array giving the dtype too)."""

    name: ClassVar[str] = "constant_of_shape"
    num_inputs: ClassVar[tuple[int, int | None]] = (0, 1)
    const_inputs: ClassVar[dict[int, str]] = {0: "shape"}
    shape: tuple[int | str, ...] | None = None
    value: np.ndarray = field(default_factory=lambda: np.zeros((1,), np.float32))

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        s = inputs[0] if inputs else None
        if self.value.size != 1:
            raise OpError(f"value must have one element, has {self.value.size}")
        dt = DType.from_np(self.value.dtype)
        _check_sym_attr(self.shape, s is not None, "shape")
        if self.shape is not None:
            if any(isinstance(d, int) and d < 0 for d in self.shape):
                raise OpError(f"negative shape {list(self.shape)}")
            return [TensorType(dt, tuple(UNKNOWN if d == -1 else d for d in self.shape))]
        n = _len1d(require(s, "shape"))
        return [TensorType(dt, None if n is None else (UNKNOWN,) * n)]

    def ref(self, shape: np.ndarray | None = None) -> np.ndarray:
        dims = _ints(shape, self.shape, "shape")
        return np.full(tuple(dims), self.value.reshape(-1)[0], dtype=self.value.dtype)


@register
@dataclass(frozen=True, eq=False)
class Range(Op):
    """``start + i * delta`` for i in [0, max(ceil((limit - start) / delta), 0)); scalar inputs.

    ``length`` is an optional (possibly symbolic) hint for the output length. Floats are computed
    in f64 and cast to the input dtype.
    """

    name: ClassVar[str] = "range"
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 3)
    length: int | str | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        ts = [require(t) for t in inputs]
        if len({t.dtype for t in ts}) > 1:
            raise OpError(f"start, limit and delta have different dtypes: {', '.join(map(str, ts))}")
        for t in ts:
            if t.shape is not None and numel_dim(t.shape) not in (1, UNKNOWN):
                raise OpError(f"start, limit and delta must be scalars, got {t}")
        return [TensorType(ts[0].dtype, (UNKNOWN if self.length is None else self.length,))]

    def ref(self, start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> np.ndarray:
        dt = start.dtype
        if dt.kind in "iu":
            s, lim, d = int(start.reshape(-1)[0]), int(limit.reshape(-1)[0]), int(delta.reshape(-1)[0])
            if d == 0:
                raise OpError("range delta is 0")
            n = max(-(-(lim - s) // d), 0)
            return (s + np.arange(n, dtype=np.int64) * d).astype(dt)
        s, lim, d = (float(np.asarray(v).reshape(-1)[0].astype(np.float64)) for v in (start, limit, delta))
        if d == 0:
            raise OpError("range delta is 0")
        n = max(int(np.ceil((lim - s) / d)), 0)
        return (s + np.arange(n, dtype=np.float64) * d).astype(dt)


@register
@dataclass(frozen=True, eq=False)
class Trilu(Op):
    name: ClassVar[str] = "trilu"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 2)
    const_inputs: ClassVar[dict[int, str]] = {1: "k"}
    upper: bool = True
    k: int = 0

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        if x.shape is not None and len(x.shape) < 2:
            raise OpError(f"trilu needs rank >= 2, got {x}")
        return [same_as(x)]

    def ref(self, x: np.ndarray, k: np.ndarray | None = None) -> np.ndarray:
        kk = self.k if k is None else int(np.asarray(k).reshape(-1)[0])
        n, m = x.shape[-2:]
        i = np.arange(n)[:, None]
        j = np.arange(m)[None, :]
        keep = (j - i >= kk) if self.upper else (j - i <= kk)
        return np.where(keep, x, np.zeros((), x.dtype)).astype(x.dtype)


@register
@dataclass(frozen=True, eq=False)
class EyeLike(Op):
    name: ClassVar[str] = "eye_like"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    k: int = 0
    dtype: DType | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        if x.shape is not None and len(x.shape) != 2:
            raise OpError(f"eye_like needs a 2-D input, got {x}")
        return [TensorType(self.dtype or x.dtype, x.shape)]

    def ref(self, x: np.ndarray) -> np.ndarray:
        dt = (self.dtype.np if self.dtype else x.dtype)
        return np.eye(x.shape[0], x.shape[1], k=self.k, dtype=np.float32).astype(dt)


def _check_rank4(x: TensorType, what: str) -> Shape | None:
    if x.shape is not None and len(x.shape) != 4:
        raise OpError(f"{what} needs a 4-D input, got {x}")
    return x.shape


@register
@dataclass(frozen=True, eq=False)
class DepthToSpace(Op):
    name: ClassVar[str] = "depth_to_space"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    blocksize: int = 2
    mode: str = "DCR"

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        s = _check_rank4(x, "depth_to_space")
        if self.mode not in ("DCR", "CRD"):
            raise OpError(f"unknown mode {self.mode!r}")
        if s is None:
            return [TensorType(x.dtype, (UNKNOWN,) * 4)]
        b = self.blocksize
        c = dim_div(s[1], b * b)
        if c is None and isinstance(s[1], int):
            raise OpError(f"channels {s[1]} are not divisible by blocksize^2 = {b * b}")
        cd: Dim = UNKNOWN if c is None else c
        return [TensorType(x.dtype, (s[0], cd, dim_mul(s[2], b), dim_mul(s[3], b)))]

    def ref(self, x: np.ndarray) -> np.ndarray:
        n, c, h, w = x.shape
        b = self.blocksize
        if self.mode == "DCR":
            t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        return np.ascontiguousarray(t.reshape(n, c // (b * b), h * b, w * b))


@register
@dataclass(frozen=True, eq=False)
class SpaceToDepth(Op):
    name: ClassVar[str] = "space_to_depth"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    blocksize: int = 2
    mode: str = "DCR"

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        s = _check_rank4(x, "space_to_depth")
        if self.mode not in ("DCR", "CRD"):
            raise OpError(f"unknown mode {self.mode!r}")
        if s is None:
            return [TensorType(x.dtype, (UNKNOWN,) * 4)]
        b = self.blocksize
        hw = []
        for d in s[2:]:
            q = dim_div(d, b)
            if q is None and isinstance(d, int):
                raise OpError(f"spatial dim {d} is not divisible by blocksize {b}")
            hw.append(UNKNOWN if q is None else q)
        return [TensorType(x.dtype, (s[0], dim_mul(s[1], b * b), *hw))]

    def ref(self, x: np.ndarray) -> np.ndarray:
        n, c, h, w = x.shape
        b = self.blocksize
        t = x.reshape(n, c, h // b, b, w // b, b)
        t = t.transpose(0, 3, 5, 1, 2, 4) if self.mode == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
        return np.ascontiguousarray(t.reshape(n, c * b * b, h // b, w // b))


@register
@dataclass(frozen=True, eq=False)
class CenterCropPad(Op):
    """Center-crop or zero-pad the ``axes`` to ``shape``."""

    name: ClassVar[str] = "center_crop_pad"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 2)
    const_inputs: ClassVar[dict[int, str]] = {1: "shape"}
    shape: tuple[int, ...] | None = None
    axes: tuple[int, ...] | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        rank = len(x.shape)
        axes = list(range(rank)) if self.axes is None else _axes(self.axes, rank)
        out = list(x.shape)
        dynamic = len(inputs) > 1 and inputs[1] is not None
        if not dynamic and self.shape is None:
            raise OpError("missing shape")
        if not dynamic and len(self.shape) != len(axes):  # type: ignore[arg-type]
            raise OpError(f"shape {list(self.shape)} does not match {len(axes)} axes")  # type: ignore
        for i, a in enumerate(axes):
            out[a] = UNKNOWN if dynamic else self.shape[i]  # type: ignore[index]
        return [TensorType(x.dtype, tuple(out))]

    def ref(self, x: np.ndarray, shape: np.ndarray | None = None) -> np.ndarray:
        target = _ints(shape, self.shape, "shape")
        axes = list(range(x.ndim)) if self.axes is None else _axes(self.axes, x.ndim)
        src = [slice(None)] * x.ndim
        dst = [slice(None)] * x.ndim
        out_shape = list(x.shape)
        for a, t in zip(axes, target):
            d = x.shape[a]
            out_shape[a] = t
            if t < d:
                o = (d - t) // 2
                src[a] = slice(o, o + t)
            elif t > d:
                o = (t - d) // 2
                dst[a] = slice(o, o + d)
        out = np.zeros(out_shape, x.dtype)
        out[tuple(dst)] = x[tuple(src)]
        return out


@register
@dataclass(frozen=True, eq=False)
class ReverseSequence(Op):
    name: ClassVar[str] = "reverse_sequence"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 2)
    batch_axis: int = 1
    time_axis: int = 0

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0])
        lens = require(inputs[1], "sequence_lens")
        if lens.dtype not in (DType.i32, DType.i64):
            raise OpError(f"sequence_lens must be i32 or i64, got {lens}")
        if x.shape is not None and len(x.shape) < 2:
            raise OpError(f"reverse_sequence needs rank >= 2, got {x}")
        return [same_as(x)]

    def ref(self, x: np.ndarray, lens: np.ndarray) -> np.ndarray:
        b, t = normalize_axis(self.batch_axis, x.ndim), normalize_axis(self.time_axis, x.ndim)
        out = x.copy()
        for i in range(x.shape[b]):
            n = int(lens[i])
            idx: list[slice | int] = [slice(None)] * x.ndim
            idx[b] = i
            src = list(idx)
            idx[t] = slice(0, n)
            src[t] = slice(n - 1, None, -1) if n > 0 else slice(0, 0)
            out[tuple(idx)] = x[tuple(src)]
        return out


__all__ = [
    "Reshape", "ShapeOf", "Size", "Transpose", "Concat", "Split", "Slice", "Squeeze", "Unsqueeze",
    "Flatten", "Expand", "Tile", "Pad", "ConstantOfShape", "Range", "Trilu", "EyeLike", "DepthToSpace",
    "SpaceToDepth", "CenterCropPad", "ReverseSequence", "dim_div", "dim_factors", "numel_dim",
    "bcast_dim", "merge_dims", "reshape_dims", "slice_dim", "slice_params",
]
