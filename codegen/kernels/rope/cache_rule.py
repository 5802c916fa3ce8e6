"""``qkv_cache.cu``: ``rope_qkv`` with paged attention's cache write folded in (rotated q to a buffer, rotated k and
v into the paged cache at ``slot_mapping``). Not a family rule of its own: ``codegen/rope_cache_fusion.py`` builds
this spec when it replaces a ``rope_qkv`` launch and the cache-write launch of the attention reading its k and v.

Units of ``VEC`` consecutive elements per thread (``vec_width``): 16-byte loads of a bf16 / f16 qkv row where the
head layout allows (every head, its rotary half / pair span and its pass-through part a multiple of ``VEC``
elements), narrower otherwise; one block per token, one unit per thread up to 512 threads.

With ``prefetch_ctas > 0`` (``codegen/l2_prefetch.py``) the grid gets that many more rows of blocks (grid y) and the
parameters ``PF_PARAMS``: at decode (at most ``PF_MAX_TOKENS`` tokens) the extra blocks of token 0 ask L2 for two
weight regions in ``PF_CHUNK``-byte pieces; the rest exit at once.
"""

from __future__ import annotations

from ....ir.types import DType
from ...family import CTYPES, ctype, threads_for
from ...kernel import GridDim, KernelSpec
from ...target import Target

#: the fused launch's parameters; ``kv_scale`` (f32[2, num_kv_heads], the FP8 cache's static K/V scales) is bound
#: to null for a cache stored without scales
PARAMS = [("qkv", "ptr"), ("positions", "ptr"), ("cos", "ptr"), ("sin", "ptr"), ("q", "ptr"), ("kv_cache", "ptr"),
          ("slot_mapping", "ptr"), ("kv_scale", "ptr"), ("num_tokens", "i64")]
#: the L2 prefetch's parameters (after ``PARAMS``): two regions (pointer, bytes; a multiple of 16, 0 for none)
PF_PARAMS = [("pf0", "ptr"), ("pf0_bytes", "i64"), ("pf1", "ptr"), ("pf1_bytes", "i64")]
#: bytes per ``cp.async.bulk.prefetch.L2`` (one per thread and round)
PF_CHUNK = 4096
#: launches of more tokens than this prefetch nothing (prefill and large batches: their GEMMs are not waiting on
#: DRAM the way a decode GEMV is, and their attention reads enough KV to evict what was prefetched)
PF_MAX_TOKENS = 8
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
                        target: Target, prefetch_ctas: int = 0) -> KernelSpec:
    """Params ``PARAMS``; grid one block per token. ``kv_scaled``: the cache is e4m3 written as ``x / kv_scale``
    (``paged_attention_fp8``); otherwise values are rounded to the cache type as ``cache_write.cu`` rounds them.
    ``prefetch_ctas``: blocks that prefetch weights into L2 at decode (params ``PARAMS + PF_PARAMS``, grid y
    ``1 + prefetch_ctas``); 0: none."""
    if prefetch_ctas < 0:
        raise ValueError(f"prefetch_ctas must be >= 0, got {prefetch_ctas}")
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
              "BLOCK_SIZE": block_size, "KV_SCALED": kv_scaled, "VEC": vec, "BLOCK": block, "PF_CTAS": prefetch_ctas,
              "PF_CHUNK": PF_CHUNK, "PF_MAX_TOKENS": PF_MAX_TOKENS}
    tag = (f"{dtype.value}_{cache_dtype.value}{'_scaled' if kv_scaled else ''}_{num_heads}x{num_kv_heads}x{head_dim}"
           f"_r{rotary_dim}{'i' if interleaved else ''}_b{block_size}{f'_pf{prefetch_ctas}' if prefetch_ctas else ''}")
    params = PARAMS + PF_PARAMS if prefetch_ctas else PARAMS
    doc = f"rope_qkv + KV cache write, {vec}-element units, {units} per token"
    if prefetch_ctas:
        doc += f"; {prefetch_ctas} blocks prefetch weights into L2 at <= {PF_MAX_TOKENS} tokens"
    return KernelSpec.make("rope", "qkv_cache.cu", f"rope_qkv_cache_{tag}", target.arch or "", values, params, block,
                           [GridDim("num_tokens"), GridDim(const=1 + prefetch_ctas)], doc=doc)


def with_prefetch(spec: KernelSpec, prefetch_ctas: int, target: Target) -> KernelSpec:
    """``spec`` (a ``rope_qkv_cache_spec``) with ``prefetch_ctas`` prefetching blocks."""
    v = dict(spec.values)
    by_ctype = {c: d for d, c in CTYPES.items()}
    dt, ct, kt = (by_ctype[str(v[n])] for n in ("DT", "CT", "KT"))
    return rope_qkv_cache_spec(dt, ct, kt, int(v["NQ"]), int(v["NKV"]), int(v["HEAD_DIM"]), int(v["ROT"]),
                               bool(v["INTERLEAVED"]), int(v["BLOCK_SIZE"]), bool(v["KV_SCALED"]), target,
                               prefetch_ctas)
