"""Linear algebra ops: matmul, gemm, einsum, integer matmul.

Narrow float inputs (f16, bf16, fp8) are multiplied in float32 and rounded once to the result type,
as GPU kernels (and onnxruntime) accumulate in float32.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..types import UNKNOWN, Dim, DType, Shape, TensorType, broadcast_shapes, dims_compatible
from .core import cast_array


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a reference computes in: float32 for narrow floats, the dtype itself otherwise."""
    dt = DType.from_np(dtype)
    if dt.is_float and dt not in (DType.f32, DType.f64):
        return np.dtype(np.float32)
    return np.dtype(dtype)


def to_compute(x: np.ndarray) -> np.ndarray:
    return x.astype(compute_dtype(x.dtype), copy=False)


def from_compute(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == dtype:
        return x
    return cast_array(x, DType.from_np(dtype), saturate=False)


def matmul_shape(a: Shape | None, b: Shape | None) -> Shape | None:
    """numpy.matmul's output shape for symbolic shapes (1-D operands are promoted and squeezed)."""
    if a is None or b is None:
        return None
    if len(a) == 0 or len(b) == 0:
        raise OpError("matmul operands must have rank >= 1")
    a2 = (1, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)
    if not dims_compatible(a2[-1], b2[-2]):
        raise OpError(f"matmul: contraction dims differ ({a2[-1]} vs {b2[-2]}) for shapes {a} and {b}")
    try:
        batch = broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError as e:
        raise OpError(f"matmul: batch dims of {a} and {b} do not broadcast") from e
    assert batch is not None
    out: list[Dim] = [*batch]
    if len(a) > 1:
        out.append(a2[-2])
    if len(b) > 1:
        out.append(b2[-1])
    return tuple(out)


@register
@dataclass(frozen=True, eq=False)
class MatMul(Op):
    """``a @ b`` with numpy semantics: batched, broadcasting batch dims, 1-D operands."""

    name: ClassVar[str] = "matmul"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 2)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        a, b = require(inputs[0], "a"), require(inputs[1], "b")
        if a.dtype != b.dtype:
            raise OpError(f"matmul operands have different dtypes ({a.dtype.value}, {b.dtype.value})")
        if a.dtype is DType.bool:
            raise OpError("matmul of bool tensors")
        return [TensorType(a.dtype, matmul_shape(a.shape, b.shape))]

    def ref(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return from_compute(np.matmul(to_compute(a), to_compute(b)), a.dtype)


@register
@dataclass(frozen=True, eq=False)
class Gemm(Op):
    """``alpha * op(a) @ op(b) + beta * c`` for 2-D ``a``, ``b``; ``c`` broadcasts to the result."""

    name: ClassVar[str] = "gemm"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 3)
    trans_a: bool = False
    trans_b: bool = False
    alpha: float = 1.0
    beta: float = 1.0

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        a, b = require(inputs[0], "a"), require(inputs[1], "b")
        c = inputs[2] if len(inputs) > 2 else None
        if a.dtype != b.dtype or (c is not None and c.dtype != a.dtype):
            raise OpError("gemm operands must have the same dtype")
        if a.shape is None or b.shape is None:
            return [TensorType(a.dtype, (UNKNOWN, UNKNOWN))]
        if len(a.shape) != 2 or len(b.shape) != 2:
            raise OpError(f"gemm needs 2-D operands, got {a} and {b}")
        m, k = a.shape[::-1] if self.trans_a else a.shape
        k2, n = b.shape[::-1] if self.trans_b else b.shape
        if not dims_compatible(k, k2):
            raise OpError(f"gemm: contraction dims differ ({k} vs {k2})")
        out = (m, n)
        if c is not None and c.shape is not None:
            try:
                bc = broadcast_shapes(out, c.shape)
            except ValueError as e:
                raise OpError(f"gemm: c {c} does not broadcast to {out}") from e
            if bc is None or len(bc) != 2 or not all(dims_compatible(x, y) for x, y in zip(bc, out)):
                raise OpError(f"gemm: c {c} does not broadcast to {out}")
        return [TensorType(a.dtype, out)]

    def ref(self, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
        dtype = a.dtype
        a2, b2 = to_compute(a), to_compute(b)
        if self.trans_a:
            a2 = a2.T
        if self.trans_b:
            b2 = b2.T
        y = a2 @ b2
        if self.alpha != 1.0:
            y = y * np.asarray(self.alpha, y.dtype)
        if c is not None and self.beta != 0.0:
            c2 = to_compute(c)
            y = y + (c2 if self.beta == 1.0 else c2 * np.asarray(self.beta, c2.dtype))
        return from_compute(np.asarray(y, dtype=y.dtype), dtype)


# -- einsum ----------------------------------------------------------------------------------------

_EINSUM_TERM = re.compile(r"^(?:[A-Za-z]|\.\.\.)*$")


def parse_einsum(equation: str, ranks: Sequence[int]) -> tuple[list[list[str]], list[str]]:
    """Split an equation into per-input label lists and the output label list.

    The ellipsis expands to labels ``"0"``, ``"1"``, ... (one per broadcast dim, right-aligned), so
    every label list has one entry per dimension. Implicit output: the labels seen once, sorted,
    after the ellipsis dims.
    """
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise OpError(f"einsum {equation!r} has {len(terms)} operands, got {len(ranks)} inputs")
    n_ell = 0
    for t, r in zip(terms, ranks):
        if not _EINSUM_TERM.match(t) or t.count("...") > 1:
            raise OpError(f"einsum: bad term {t!r} in {equation!r}")
        if "..." in t:
            n_ell = max(n_ell, r - (len(t) - 3))
    ell = [str(i) for i in range(n_ell)]

    def expand(t: str, r: int | None) -> list[str]:
        if "..." not in t:
            labels = list(t)
            if r is not None and len(labels) != r:
                raise OpError(f"einsum term {t!r} has {len(labels)} labels for an input of rank {r}")
            return labels
        pre, post = t.split("...")
        k = (r - len(pre) - len(post)) if r is not None else n_ell
        if k < 0:
            raise OpError(f"einsum term {t!r} has more labels than its input's rank {r}")
        return [*pre, *ell[n_ell - k :], *post]

    ins = [expand(t, r) for t, r in zip(terms, ranks)]
    if arrow:
        if not _EINSUM_TERM.match(rhs):
            raise OpError(f"einsum: bad output term {rhs!r}")
        out = expand(rhs, None)
    else:
        counts: dict[str, int] = {}
        for labels in ins:
            for x in labels:
                counts[x] = counts.get(x, 0) + 1
        out = ell + sorted(x for x, c in counts.items() if c == 1 and not x.isdigit())
    return ins, out


@register
@dataclass(frozen=True, eq=False)
class Einsum(Op):
    name: ClassVar[str] = "einsum"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, None)
    equation: str = ""

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        ts = [require(t) for t in inputs]
        if len({t.dtype for t in ts}) != 1:
            raise OpError("einsum operands must have the same dtype")
        if any(t.shape is None for t in ts):
            return [TensorType(ts[0].dtype, None)]
        ins, out = parse_einsum(self.equation, [len(t.shape) for t in ts])  # type: ignore[arg-type]
        dims: dict[str, list[Dim]] = {}
        for labels, t in zip(ins, ts):
            for x, d in zip(labels, t.shape):  # type: ignore[arg-type]
                dims.setdefault(x, []).append(d)
        shape: list[Dim] = []
        for x in out:
            if x not in dims:
                raise OpError(f"einsum output label {x!r} does not appear in the inputs")
            ds = dims[x]
            if x.isdigit():  # ellipsis dims broadcast
                b = broadcast_shapes(*[(d,) for d in ds])
                assert b is not None
                shape.append(b[0])
            else:
                known = [d for d in ds if d != UNKNOWN and d != 1]
                ints = {d for d in known if isinstance(d, int)}
                if len(ints) > 1:
                    raise OpError(f"einsum label {x!r} has sizes {ds}")
                shape.append(ints.pop() if ints else (known[0] if known else ds[0]))
        return [TensorType(ts[0].dtype, tuple(shape))]

    def ref(self, *xs: np.ndarray) -> np.ndarray:
        dtype = xs[0].dtype
        y = np.einsum(self.equation, *[to_compute(x) for x in xs], optimize=len(xs) > 2)
        return from_compute(np.asarray(y), dtype)


# -- integer matmul ---------------------------------------------------------------------------------


def _zero_point_rows(zp: np.ndarray | None, a: np.ndarray) -> np.ndarray | int:
    """A's zero point as a per-row column: scalar, or 1-D of A's rows (M)."""
    if zp is None:
        return 0
    zp = zp.astype(np.int32)
    if zp.ndim == 0 or zp.size == 1:
        return zp.reshape(())
    if zp.ndim == 1 and a.ndim >= 2:
        return zp.reshape(-1, 1)
    return zp


@register
@dataclass(frozen=True, eq=False)
class MatMulInteger(Op):
    """``(a - a_zero_point) @ (b - b_zero_point)`` in int32, matmul semantics.

    ``a_zero_point`` is a scalar or per row of ``a`` (1-D, M); ``b_zero_point`` a scalar or per
    column of ``b`` (1-D, N).
    """

    name: ClassVar[str] = "matmul_integer"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 4)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        a, b = require(inputs[0], "a"), require(inputs[1], "b")
        for t in (a, b):
            if t.dtype not in (DType.i8, DType.u8, DType.i16, DType.u16, DType.i4, DType.u4):
                raise OpError(f"matmul_integer needs 8/16/4-bit integer operands, got {t.dtype.value}")
        return [TensorType(DType.i32, matmul_shape(a.shape, b.shape))]

    def ref(self, a: np.ndarray, b: np.ndarray, a_zero_point: np.ndarray | None = None,
            b_zero_point: np.ndarray | None = None) -> np.ndarray:
        a32 = a.astype(np.int32) - _zero_point_rows(a_zero_point, a)
        b32 = b.astype(np.int32) - (0 if b_zero_point is None else b_zero_point.astype(np.int32))
        return np.matmul(a32, b32).astype(np.int32)


__all__ = ["MatMul", "Gemm", "Einsum", "MatMulInteger", "matmul_shape", "parse_einsum",
           "compute_dtype", "to_compute", "from_compute"]
