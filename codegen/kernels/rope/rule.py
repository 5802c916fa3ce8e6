"""Rotary position embedding (``rope`` op; ``rope_qkv``: q and k rotated, v copied, from one fused qkv row):
one block per token, one thread per rotating pair. Every rope kernel rotates through ``rotate.cuh``, so they agree bit
for bit. ``qkv_cache.cu`` (``cache_rule.py``), ``rope_qkv`` writing k and v straight into the paged KV cache, is not
chosen here but by ``codegen/rope_cache_fusion.py``, which also drops the attention's cache-write launch."""

from __future__ import annotations

from collections.abc import Sequence

from ....ir.op import Op
from ....ir.types import DType, TensorType
from ...family import ACTIVATION_DTYPES, Family, ctype, static_dim, threads_for
from ...kernel import GridDim, KernelSpec
from ...target import Target


def rope_spec(dtype: DType, table_dtype: DType, heads: int, head_dim: int, rotary_dim: int, interleaved: bool,
              target: Target) -> KernelSpec:
    """Params: x, positions (i64), cos, sin, out (may alias x), num_tokens."""
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and <= head_dim {head_dim}")
    work = heads * (rotary_dim // 2 + head_dim - rotary_dim)
    block = threads_for(work, per_thread=2, hi=512)
    return KernelSpec.make(
        "rope", "kernel.cu", f"rope_{dtype.value}_{heads}x{head_dim}_r{rotary_dim}", target.arch or "",
        {"DT": ctype(dtype), "CT": ctype(table_dtype), "HEADS": heads, "HEAD_DIM": head_dim, "ROT": rotary_dim,
         "INTERLEAVED": interleaved, "BLOCK": block},
        [("x", "ptr"), ("positions", "ptr"), ("cos", "ptr"), ("sin", "ptr"), ("out", "ptr"), ("num_tokens", "i64")],
        block, [GridDim("num_tokens")])


def rope_qkv_spec(dtype: DType, table_dtype: DType, num_heads: int, num_kv_heads: int, head_dim: int,
                  rotary_dim: int, interleaved: bool, target: Target) -> KernelSpec:
    """Params: qkv, positions (i64), cos, sin, q, k, v (outputs, not aliasing qkv), num_tokens."""
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and <= head_dim {head_dim}")
    heads = num_heads + num_kv_heads
    work = heads * (rotary_dim // 2 + head_dim - rotary_dim) + num_kv_heads * head_dim
    block = threads_for(work, per_thread=2, hi=512)
    return KernelSpec.make(
        "rope", "qkv.cu", f"rope_qkv_{dtype.value}_{num_heads}x{num_kv_heads}x{head_dim}_r{rotary_dim}",
        target.arch or "",
        {"DT": ctype(dtype), "CT": ctype(table_dtype), "NQ": num_heads, "NKV": num_kv_heads, "HEAD_DIM": head_dim,
         "ROT": rotary_dim, "INTERLEAVED": interleaved, "BLOCK": block},
        [("qkv", "ptr"), ("positions", "ptr"), ("cos", "ptr"), ("sin", "ptr"), ("q", "ptr"), ("k", "ptr"),
         ("v", "ptr"), ("num_tokens", "i64")],
        block, [GridDim("num_tokens")])


def plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
    x, pos, cos, sin = inputs[:4]
    width = static_dim(x, -1)
    if not target.is_gpu or x is None or pos is None or cos is None or sin is None or width is None:
        return None
    if x.rank != 2 or x.dtype not in ACTIVATION_DTYPES or pos.dtype is not DType.i64:
        return None
    if cos.dtype not in ACTIVATION_DTYPES or sin.dtype != cos.dtype or width % op.head_dim:
        return None
    if op.name == "rope_qkv":
        if width != (op.num_heads + 2 * op.num_kv_heads) * op.head_dim:
            return None
        return [rope_qkv_spec(x.dtype, cos.dtype, op.num_heads, op.num_kv_heads, op.head_dim, op.rotary_dim,
                              op.interleaved, target)]
    return [rope_spec(x.dtype, cos.dtype, width // op.head_dim, op.head_dim, op.rotary_dim, op.interleaved, target)]


FAMILY = Family(name="rope", ops=("rope", "rope_qkv"), plan=plan)
