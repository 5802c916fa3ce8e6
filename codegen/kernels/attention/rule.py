"""Paged attention (``paged_attention`` op): two launches, in stream order.

1. ``cache_write.cu``: each token's K/V into the cache at ``slot_mapping`` (the op's in-place update);
2. ``paged_attention.cu``: every token (prefill chunk or decode, mixed in one batch) attends causally to
   its sequence's cached positions through ``block_tables``, with GQA, softcap and a sliding window.

One kernel serves prefill and decode because the serving form mixes them in one step.

**Split-KV decode** (``decode_split.cu``, ``split_rule.py``): for bf16 queries the attention launch is the
split-KV (flash-decoding) kernel, GQA-aware, wherever ``split_rule.use_split`` says so (long or symbolic contexts,
batches that do not fill the GPU by themselves); ``paged_attention.cu`` stays the other choice.
``paged_attention_fp8`` (e4m3 cache, ``kv_scale`` f32[2, num_kv_heads]) lowers to ``cache_write_fp8.cu`` and the
split kernel with its ``kv_scale`` parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

from ....ir.op import Op
from ....ir.types import DType, TensorType
from ...family import ACTIVATION_DTYPES, CTYPES, Family, ctype, static_dim, threads_for
from ...kernel import GridDim, KernelSpec
from ...target import Target
from .split_rule import cache_write_fp8_spec, decode_split_spec, use_split

WRITE_PARAMS = [("k", "ptr"), ("v", "ptr"), ("kv_cache", "ptr"), ("slot_mapping", "ptr"), ("num_tokens", "i64")]
ATTEND_PARAMS = [("q", "ptr"), ("kv_cache", "ptr"), ("block_tables", "ptr"), ("seq_lens", "ptr"),
                 ("query_start_loc", "ptr"), ("out", "ptr"), ("num_tokens", "i32"), ("num_seqs", "i32"),
                 ("max_blocks", "i32")]


def paged_attention_specs(dtype: DType, cache_dtype: DType, num_heads: int, num_kv_heads: int, head_dim: int,
                          block_size: int, scale: float, target: Target, softcap: float = 0.0,
                          sliding_window: int = 0) -> list[KernelSpec]:
    """The cache write and the attention launch. Index inputs: slot_mapping i64[T], block_tables
    i32[S, max_blocks], seq_lens i32[S], query_start_loc i32[S + 1]."""
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    group = num_heads // num_kv_heads
    arch = target.arch or ""
    width = num_kv_heads * head_dim
    write_block = threads_for(width, per_thread=2, hi=512)
    shape = {"HEAD_DIM": head_dim, "KV_HEADS": num_kv_heads, "BLOCK_SIZE": block_size,
             "DT": ctype(dtype), "CT": ctype(cache_dtype)}
    tag = f"{dtype.value}_{cache_dtype.value}_{num_heads}x{num_kv_heads}x{head_dim}_b{block_size}"
    write = KernelSpec.make(
        "attention", "cache_write.cu", f"kv_cache_write_{tag}", arch,
        {**shape, "K_STRIDE": width, "V_STRIDE": width, "BLOCK": write_block},
        WRITE_PARAMS, write_block, [GridDim("num_tokens")])
    warps = min(group, 4)
    attend = KernelSpec.make(
        "attention", "paged_attention.cu", f"paged_attention_{tag}", arch,
        {**shape, "GROUP": group, "WARPS": warps, "Q_STRIDE": num_heads * head_dim, "SCALE": float(scale),
         "SOFTCAP": float(softcap), "SLIDING_WINDOW": int(sliding_window)},
        ATTEND_PARAMS, warps * 32, [GridDim("num_tokens"), GridDim(const=num_kv_heads)])
    return [write, attend]


def plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
    q, k, v, cache = inputs[:4]
    fp8_op = op.name == "paged_attention_fp8"
    if not target.is_gpu or q is None or k is None or v is None or cache is None or cache.rank != 5:
        return None
    if q.dtype not in ACTIVATION_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype or cache.dtype not in CTYPES:
        return None
    block_size = static_dim(cache, 2)
    if block_size is None or len(inputs) < 8 or any(t is None or t.dtype not in (DType.i32, DType.i64)
                                                    for t in inputs[4:8]):
        return None
    if inputs[4].dtype is not DType.i32 or inputs[5].dtype is not DType.i32 or inputs[6].dtype is not DType.i32:
        return None
    if inputs[7].dtype is not DType.i64:
        return None
    shape = (q.dtype, cache.dtype, op.num_heads, op.num_kv_heads, op.head_dim, block_size)
    if fp8_op:
        scale = inputs[8] if len(inputs) > 8 else None
        if scale is None or scale.dtype is not DType.f32 or cache.dtype is not DType.f8e4m3fn:
            return None
        if not use_split(*shape, None, None, target):
            return None
        return [cache_write_fp8_spec(q.dtype, op.num_kv_heads, op.head_dim, block_size, target),
                decode_split_spec(*shape, op.scale, target, op.softcap, op.sliding_window, kv_scale=True)]
    specs = paged_attention_specs(*shape, op.scale, target, op.softcap, op.sliding_window)
    if use_split(*shape, static_dim(q, 0), static_dim(inputs[4], 1), target):
        specs[1] = decode_split_spec(*shape, op.scale, target, op.softcap, op.sliding_window)
    return specs


FAMILY = Family(name="attention", ops=("paged_attention", "paged_attention_fp8"), plan=plan)
