"""Types of IR values: dtype, symbolic shape, optional quantization descriptor.

A dimension is an ``int`` (static), a ``str`` naming a symbol or a symbolic expression (``"T"``,
``"(T+1)"``), or ``"?"`` for a dimension nobody knows statically. ``"?"`` is compatible with every
dimension; two different symbols are not assumed equal. A shape of ``None`` means unknown rank.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np

Dim = int | str
Shape = tuple[Dim, ...]
UNKNOWN: str = "?"


class DType(enum.Enum):
    """Element types. The value is the short name used in the text IR."""

    f64 = "f64"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    f8e4m3fn = "f8e4m3fn"
    f8e4m3fnuz = "f8e4m3fnuz"
    f8e5m2 = "f8e5m2"
    f8e5m2fnuz = "f8e5m2fnuz"
    f4e2m1fn = "f4e2m1fn"
    f8e8m0 = "f8e8m0"
    i4 = "i4"
    u4 = "u4"
    i8 = "i8"
    i16 = "i16"
    i32 = "i32"
    i64 = "i64"
    u8 = "u8"
    u16 = "u16"
    u32 = "u32"
    u64 = "u64"
    bool = "bool"

    @property
    def np(self) -> np.dtype:
        """The numpy dtype that holds values of this type (ml_dtypes for the narrow floats)."""
        return _TO_NP[self]

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return self in _INTS

    @property
    def is_signed(self) -> bool:
        return self.is_float or self in (DType.i4, DType.i8, DType.i16, DType.i32, DType.i64)

    @property
    def itemsize_bits(self) -> int:
        if self in (DType.f4e2m1fn, DType.i4, DType.u4):
            return 4
        if self is DType.bool:
            return 8
        return _TO_NP[self].itemsize * 8

    @staticmethod
    def from_np(dtype: np.dtype | type) -> DType:
        dt = np.dtype(dtype)
        try:
            return _FROM_NP[dt]
        except KeyError:
            raise TypeError(f"numpy dtype {dt} has no ingot equivalent") from None

    def __repr__(self) -> str:
        return self.value


_TO_NP: dict[DType, np.dtype] = {
    DType.f64: np.dtype(np.float64),
    DType.f32: np.dtype(np.float32),
    DType.f16: np.dtype(np.float16),
    DType.bf16: np.dtype(ml_dtypes.bfloat16),
    DType.f8e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.f8e4m3fnuz: np.dtype(ml_dtypes.float8_e4m3fnuz),
    DType.f8e5m2: np.dtype(ml_dtypes.float8_e5m2),
    DType.f8e5m2fnuz: np.dtype(ml_dtypes.float8_e5m2fnuz),
    DType.f4e2m1fn: np.dtype(ml_dtypes.float4_e2m1fn),
    DType.f8e8m0: np.dtype(ml_dtypes.float8_e8m0fnu),
    DType.i4: np.dtype(ml_dtypes.int4),
    DType.u4: np.dtype(ml_dtypes.uint4),
    DType.i8: np.dtype(np.int8),
    DType.i16: np.dtype(np.int16),
    DType.i32: np.dtype(np.int32),
    DType.i64: np.dtype(np.int64),
    DType.u8: np.dtype(np.uint8),
    DType.u16: np.dtype(np.uint16),
    DType.u32: np.dtype(np.uint32),
    DType.u64: np.dtype(np.uint64),
    DType.bool: np.dtype(np.bool_),
}
_FROM_NP: dict[np.dtype, DType] = {v: k for k, v in _TO_NP.items()}
_FLOATS = {
    DType.f64, DType.f32, DType.f16, DType.bf16, DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2,
    DType.f8e5m2fnuz, DType.f4e2m1fn, DType.f8e8m0,
}
_INTS = {
    DType.i4, DType.u4, DType.i8, DType.i16, DType.i32, DType.i64, DType.u8, DType.u16, DType.u32,
    DType.u64,
}


@dataclass(frozen=True)
class QuantDesc:
    """How a tensor's stored values map back to real numbers.

    ``format`` names the scheme (``fp8``, ``nvfp4``, ``mxfp4``), ``granularity`` where scales apply
    (``tensor``, ``channel``, ``block``, ``token``), ``block`` the block shape for block scales.
    """

    format: str
    granularity: str
    block: tuple[int, ...] = ()
    scale_dtype: DType = DType.f32


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: Shape | None
    quant: QuantDesc | None = None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def numel(self) -> int | None:
        if not self.is_static:
            return None
        n = 1
        for d in self.shape:  # type: ignore[union-attr]
            n *= d  # type: ignore[operator]
        return n

    def __str__(self) -> str:
        if self.shape is None:
            return f"{self.dtype.value}[*]"
        return f"{self.dtype.value}[{','.join(str(d) for d in self.shape)}]"

    @staticmethod
    def of(array: np.ndarray) -> TensorType:
        return TensorType(DType.from_np(array.dtype), tuple(int(d) for d in array.shape))


def dims_compatible(a: Dim, b: Dim) -> bool:
    return a == b or a == UNKNOWN or b == UNKNOWN


def shapes_compatible(a: Shape | None, b: Shape | None) -> bool:
    if a is None or b is None:
        return True
    return len(a) == len(b) and all(dims_compatible(x, y) for x, y in zip(a, b))


def broadcast_shapes(*shapes: Shape | None) -> Shape | None:
    """Numpy-style broadcast of symbolic shapes; raises ValueError on a static mismatch."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)  # type: ignore[arg-type]
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]  # type: ignore[arg-type]
        known = {d for d in dims if d != 1}
        if not known:
            out.append(1)
        elif len(known) == 1:
            out.append(known.pop())
        else:
            ints = {d for d in known if isinstance(d, int)}
            if len(ints) > 1:
                raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")  # type: ignore
            out.append(ints.pop() if ints else UNKNOWN)
    return tuple(out)


def dim_add(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if a == UNKNOWN or b == UNKNOWN:
        return UNKNOWN
    if a == 0:
        return b
    if b == 0:
        return a
    return f"({a}+{b})"


def dim_mul(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a == 1:
        return b
    if b == 1:
        return a
    if a == 0 or b == 0:
        return 0
    if a == UNKNOWN or b == UNKNOWN:
        return UNKNOWN
    return f"({a}*{b})"


def shape_numel(shape: Sequence[Dim]) -> Dim:
    n: Dim = 1
    for d in shape:
        n = dim_mul(n, d)
    return n


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0
