"""Row copies with conversion: ``split`` along the last axis, ``gather`` on axis 0 and ``cast``.

One template (``kernel.cu``): one block per output row, each copying ``width`` elements from a row of
``src`` (a column window of it: ``src_stride`` / ``src_offset``), optionally through an index
(gather), converting between storage types (cast). The CUDA lowering (``codegen/lower.py``) plans
these ops through ``plan``; they are not in the registry's family list, so other callers of
``registry.plan_op`` are unaffected.
"""

from __future__ import annotations

from collections.abc import Sequence

from ....ir.op import Op
from ....ir.types import DType, TensorType
from ...family import CTYPES, Family, ctype, static_dim, threads_for
from ...kernel import GridDim, KernelSpec
from ...target import Target

PARAMS = [("src", "ptr"), ("index", "ptr"), ("dst", "ptr"), ("rows", "i64"), ("src_rows", "i64")]


def copy_spec(src_dtype: DType, dst_dtype: DType, width: int, target: Target, src_stride: int | None = None,
              src_offset: int = 0, indexed: bool = False) -> KernelSpec:
    """``dst[rows, width] = convert(src[row, src_offset : src_offset + width])``; params: src, index
    (i64[rows], only when ``indexed``), dst, rows, src_rows."""
    stride = width if src_stride is None else src_stride
    if src_offset + width > stride:
        raise ValueError(f"copy: columns {src_offset}..{src_offset + width} exceed the source row of {stride}")
    block = threads_for(width, per_thread=4, hi=512)
    tag = f"{'gather' if indexed else 'copy'}_{src_dtype.value}_{dst_dtype.value}_w{width}"
    if stride != width:
        tag += f"_s{stride}_o{src_offset}"
    return KernelSpec.make(
        "copy", "kernel.cu", tag, target.arch or "",
        {"ST": ctype(src_dtype), "DT": ctype(dst_dtype), "WIDTH": width, "SRC_STRIDE": stride,
         "SRC_OFFSET": src_offset, "INDEXED": indexed, "BLOCK": block},
        PARAMS, block, [GridDim("rows")])


def plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
    """Launches for ``split`` (static sizes, last axis: one per output), ``gather`` (axis 0, 1-D int64
    indices, rank-2 data) and ``cast`` (between kernel storage types, static last dim)."""
    x = inputs[0]
    if not target.is_gpu or x is None or x.shape is None or not x.shape or x.dtype not in CTYPES:
        return None
    width = static_dim(x, -1)
    if width is None:
        return None
    if op.name == "split":
        if len(inputs) > 1 and inputs[1] is not None:
            return None
        if getattr(op, "axis", 0) not in (-1, len(x.shape) - 1) or op.split is None:
            return None
        specs, offset = [], 0
        for size in op.split:
            specs.append(copy_spec(x.dtype, x.dtype, size, target, src_stride=width, src_offset=offset))
            offset += size
        return specs
    if op.name == "gather":
        idx = inputs[1]
        if op.axis != 0 or x.rank != 2 or idx is None or idx.dtype is not DType.i64 or idx.rank != 1:
            return None
        return [copy_spec(x.dtype, x.dtype, width, target, indexed=True)]
    if op.name == "cast":
        if op.to not in CTYPES:
            return None
        return [copy_spec(x.dtype, op.to, width, target)]
    return None


FAMILY = Family(name="copy", ops=("split", "gather", "cast"), plan=plan)
