"""Sampling on the GPU: greedy (row-wise argmax of the logits, ``arg_max`` over the last axis).

The CUDA executor (``runtime/cuda_backend.py``) builds ``greedy_spec`` for its ``[S, vocab]`` f32 logits when
the engine samples greedily on the device (docs/SERVING_FORM.md, "Greedy sampling on the device"); the rule
also takes a graph's ``arg_max`` over the last axis without keepdims. The kernel is numpy's argmax exactly:
the first index on ties, NaN above every number.
"""

from __future__ import annotations

from collections.abc import Sequence

from ....ir.op import Op
from ....ir.types import DType, TensorType
from ...family import ACTIVATION_DTYPES, Family, ctype, static_dim
from ...kernel import GridDim, KernelSpec
from ...target import Target

BLOCK = 1024
#: packs each thread loads before comparing (loads in flight per thread)
UNROLL = 4


def pack_width(dtype: DType, vocab: int) -> int:
    """Elements per vector load: the widest of up to 16 bytes that divides a row (rows stay aligned)."""
    vec = max(1, 16 // dtype.np.itemsize)
    while vocab % vec:
        vec //= 2
    return vec


def greedy_spec(dtype: DType, vocab: int, target: Target) -> KernelSpec:
    """``tokens[S] (i64) = argmax(logits[S, vocab])``, first index on ties; params: logits, tokens, num_rows."""
    vec = pack_width(dtype, vocab)
    block = min(BLOCK, max(32, -(-vocab // vec // 32) * 32))
    return KernelSpec.make("sampling", "kernel.cu", f"greedy_{dtype.value}_v{vocab}", target.arch or "",
                           {"DT": ctype(dtype), "VOCAB": vocab, "BLOCK": block, "VEC": vec, "UNROLL": UNROLL},
                           [("logits", "ptr"), ("tokens", "ptr"), ("num_rows", "i64")], block, [GridDim("num_rows")])


def plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
    x = inputs[0]
    vocab = static_dim(x, -1)
    if not target.is_gpu or x is None or vocab is None or x.rank != 2 or x.dtype not in ACTIVATION_DTYPES:
        return None
    if op.axis not in (-1, 1) or op.keepdims or op.select_last_index:
        return None
    return [greedy_spec(x.dtype, vocab, target)]


FAMILY = Family(name="sampling", ops=("arg_max",), plan=plan)
