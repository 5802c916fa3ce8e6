"""Embedding gather: one block per token copies its table row (``embedding`` op)."""

from __future__ import annotations

from collections.abc import Sequence

from ....ir.op import Op
from ....ir.types import DType, TensorType
from ...family import CTYPES, Family, ctype, static_dim, threads_for
from ...kernel import GridDim, KernelSpec
from ...target import Target


def embedding_spec(dtype: DType, hidden: int, target: Target) -> KernelSpec:
    """``out[T, hidden] = table[ids]``; params: table, ids (i64), out, num_tokens, vocab."""
    block = threads_for(hidden, per_thread=8, hi=512)
    return KernelSpec.make(
        "embedding", "kernel.cu", f"embedding_{dtype.value}_h{hidden}", target.arch or "",
        {"DT": ctype(dtype), "HIDDEN": hidden, "BLOCK": block},
        [("table", "ptr"), ("ids", "ptr"), ("out", "ptr"), ("num_tokens", "i64"), ("vocab", "i64")],
        block, [GridDim("num_tokens")])


def plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
    table, ids = inputs[0], inputs[1]
    hidden = static_dim(table, 1)
    if not target.is_gpu or table is None or ids is None or hidden is None or table.dtype not in CTYPES:
        return None
    if ids.dtype is not DType.i64 or ids.rank != 1:
        return None
    return [embedding_spec(table.dtype, hidden, target)]


FAMILY = Family(name="embedding", ops=("embedding",), plan=plan)
