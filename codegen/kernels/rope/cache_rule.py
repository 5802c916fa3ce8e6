"""``qkv_cache.cu``: ``rope_qkv`` with paged attention's cache write folded in (rotated q to a buffer, rotated k and
v into the paged cache at ``slot_mapping``). Not a family rule of its own: ``codegen/rope_cache_fusion.py`` builds
this spec when it replaces a ``rope_qkv`` launch and the cache-write launch of the attention reading its k and v.

Units of ``VEC`` consecutive elements per thread (``vec_width``): 16-byte loads of a bf16 / f16 qkv row where the
head layout allows (every head, its rotary half / pair span and its pass-through part a multiple of ``VEC``
elements), narrower otherwise; one block per token, one unit per thread up to 512 threads.
"""

from __future__ import annotations

from ....ir.types import DType
from ...family import ctype, threads_for
from ...kernel import GridDim, KernelSpec
from ...target import Target

#: the fused launch's parameters; ``kv_scale`` (f32[2, num_kv_heads], the FP8 cache's static K/V scales) is bound
#: to null for a cache stored without scales
PARAMS = [("qkv", "ptr"), ("positions", "ptr"), ("cos", "ptr"), ("sin", "ptr"), ("q", "ptr"), ("kv_cache", "ptr"),
          ("slot_mapping", "ptr"), ("kv_scale", "ptr"), ("num_tokens", "i64")]
#: the widest unit: 16 bytes of the activation type
MAX_VEC_BYTES = 16


def vec_width(dtype: DType, head_dim: int, rotary_dim: int, interleaved: bool) -> int | None:
    """Elements per unit: the largest power of two of at most 16 bytes dividing the head, its rotary span (half of
    it for the non-interleaved (i, i + rotary_dim / 2) pairs) and its pass-through part; interleaved units hold whole
    pairs (at least 2). None: no width fits (an odd head with interleaved pairs)."""
    span = rotary_dim if interleaved else rotary_dim // 2
    vec = MAX_VEC_BYTES // dtype.np.itemsize
    while vec >= (2 if interleaved else 1):
        if head_dim % vec == 0 and span % vec == 0 and (head_dim - rotary_dim) % vec == 0:
            return vec
        vec //= 2
    return None


def rope_qkv_cache_spec(dtype: DType, table_dtype: DType, cache_dtype: DType, num_heads: int, num_kv_heads: int,
                        head_dim: int, rotary_dim: int, interleaved: bool, block_size: int, kv_scaled: bool,
                        target: Target) -> KernelSpec:
    """Params ``PARAMS``; grid one block per token. ``kv_scaled``: the cache is e4m3 written as ``x / kv_scale``
    (``paged_attention_fp8``); otherwise values are rounded to the cache type as ``cache_write.cu`` rounds them."""
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and <= head_dim {head_dim}")
    if kv_scaled and cache_dtype is not DType.f8e4m3fn:
        raise ValueError(f"a scaled K/V cache is f8e4m3fn, got {cache_dtype.value}")
    vec = vec_width(dtype, head_dim, rotary_dim, interleaved)
    if vec is None:
        raise ValueError(f"no unit width for head_dim {head_dim}, rotary_dim {rotary_dim} (interleaved pairs)")
    heads = num_heads + num_kv_heads
    per_head = head_dim if interleaved else head_dim - rotary_dim // 2  # a non-interleaved unit rotates 2 * vec
    units = (heads * per_head + num_kv_heads * head_dim) // vec
    block = threads_for(units, per_thread=1, hi=512)
    values = {"DT": ctype(dtype), "CT": ctype(table_dtype), "KT": ctype(cache_dtype), "NQ": num_heads,
              "NKV": num_kv_heads, "HEAD_DIM": head_dim, "ROT": rotary_dim, "INTERLEAVED": interleaved,
              "BLOCK_SIZE": block_size, "KV_SCALED": kv_scaled, "VEC": vec, "BLOCK": block}
    tag = (f"{dtype.value}_{cache_dtype.value}{'_scaled' if kv_scaled else ''}_{num_heads}x{num_kv_heads}x{head_dim}"
           f"_r{rotary_dim}{'i' if interleaved else ''}_b{block_size}")
    return KernelSpec.make("rope", "qkv_cache.cu", f"rope_qkv_cache_{tag}", target.arch or "", values, PARAMS, block,
                           [GridDim("num_tokens")],
                           doc=f"rope_qkv + KV cache write, {vec}-element units, {units} per token")
