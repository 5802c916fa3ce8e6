"""Tensor maps in module globals: the KV cache's for kernels that load the paged cache by TMA (``prefill_wgmma.cu``
with ``tma``), a weight's for ``gemv/skinny.cu`` (``fill_w_tma``, same scheme: ``ingot_w_tma``).

Such a kernel's module holds a global ``ingot_kv_tma`` (18 words): a ``CUtensorMap`` (words 0-15) viewing a region
of device memory as rows of ``kv_heads x head_dim`` bf16 (dims ``{head_dim, kv_heads, rows}``, a box of ``64 x 1 x
box_rows`` with the 128-byte swizzle), then the region's base address (16) and size in bytes (17). The kernel
addresses its ``kv_cache`` argument's rows from the region's base and traps if the argument lies outside it, so the
loader fills the global once per module, before the first launch, over a region that holds every cache the module
will be launched on: ``CudaExecutor`` its whole KV region (all layers), the tests and benchmarks their cache buffer.

``fill_kv_tma(module, spec, base, nbytes)`` does it for a loaded module (a ``CUmodule``) and the kernel's spec
(``KernelSpec``: its ``TMA``, ``HEAD_DIM``, ``KV_HEADS``, ``BLOCK_SIZE`` and ``BLOCK_N`` values); ``needs_kv_tma``
says whether a spec asks for it. Needs cuda-python (``cuda.bindings``).
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

#: the module global the kernel reads (prefill_wgmma.cu)
SYMBOL = b"ingot_kv_tma"
#: its size: a 128-byte CUtensorMap, then the region's base and size (u64 each)
NBYTES = 128 + 16


def needs_w_tma(spec: Any) -> bool:
    """Whether the kernel of ``spec`` reads its weight through ``ingot_w_tma`` (``gemv/skinny.cu``)."""
    return bool(dict(spec.values).get("W_TMA", False))


def needs_kv_tma(spec: Any) -> bool:
    """Whether the kernel of ``spec`` (a ``KernelSpec``) reads the KV cache through ``ingot_kv_tma``."""
    return bool(dict(spec.values).get("TMA", False))


def _values(spec: Any) -> tuple[int, int, int]:
    v = dict(spec.values)
    d, kv, bs, bn = (int(v[k]) for k in ("HEAD_DIM", "KV_HEADS", "BLOCK_SIZE", "BLOCK_N"))
    return d, kv, min(bs, bn)


def kv_region_rows(base: int, nbytes: int, head_dim: int, kv_heads: int) -> int:
    """The cache rows (``kv_heads x head_dim`` bf16 each) of the region ``[base, base + nbytes)``; ``ValueError``
    where TMA cannot view it so (a base not 16-byte aligned, not whole rows, more rows than 32-bit coordinates)."""
    row_bytes = kv_heads * head_dim * 2
    if base % 16 or nbytes <= 0 or nbytes % row_bytes:
        raise ValueError(f"KV tensor map: region {base:#x} + {nbytes} bytes is not 16-byte aligned whole rows of "
                         f"{row_bytes} bytes ({kv_heads} KV heads x head_dim {head_dim}, bf16)")
    rows = nbytes // row_bytes
    if rows >= 2**31:
        raise ValueError(f"KV tensor map: {rows} cache rows exceed TMA's 32-bit coordinates")
    return rows


def encode_kv_map(base: int, nbytes: int, head_dim: int, kv_heads: int, box_rows: int) -> bytes:
    """The 128-byte CUtensorMap over ``nbytes`` of device memory at ``base`` as rows of ``kv_heads x head_dim``
    bf16 (the paged cache's ``[blocks, 2, block_size, kv_heads, head_dim]`` layout, every layer's one after
    another), a box of ``min(head_dim, 64) x 1 x box_rows`` elements, 128-byte swizzle, zeros out of bounds."""
    from .cuda_driver import check, driver

    rows = kv_region_rows(base, nbytes, head_dim, kv_heads)
    row_bytes = kv_heads * head_dim * 2
    cu = driver()
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t
    tmap = check(cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base,
        [u64(head_dim), u64(kv_heads), u64(rows)], [u64(head_dim * 2), u64(row_bytes)],
        [u32(min(head_dim, 64)), u32(1), u32(box_rows)], [u32(1), u32(1), u32(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled(KV cache)")
    words = [int(w) for w in tmap.opaque]
    if len(words) != 16:
        raise RuntimeError(f"CUtensorMap of {len(words)} words, expected 16")
    return struct.pack("<16Q", *words)


def fill_w_tma(module: Any, spec: Any, base: int, nbytes: int) -> None:
    """Write ``ingot_w_tma`` of the loaded ``module`` for ``gemv/skinny.cu`` (``spec``: its ``K`` and ``WGS``) over
    the region ``[base, base + nbytes)`` holding its weight, viewed as rows of K bf16: dims ``{K, rows}``, a box of
    ``64 x (64 x WGS)`` with the 128-byte swizzle, zeros past the rows."""
    from .cuda_driver import check, driver

    v = dict(spec.values)
    k, box_rows = int(v["K"]), 64 * int(v["WGS"])
    row_bytes = k * 2
    if base % 16 or nbytes <= 0 or nbytes % row_bytes or nbytes // row_bytes >= 2**31:
        raise ValueError(f"weight tensor map: region {base:#x} + {nbytes} bytes is not 16-byte aligned whole rows of "
                         f"{row_bytes} bytes (K {k}, bf16) within 32-bit row coordinates")
    cu = driver()
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t
    tmap = check(cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, [u64(k), u64(nbytes // row_bytes)],
        [u64(row_bytes)], [u32(64), u32(box_rows)], [u32(1), u32(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled(weight)")
    _write_global(module, b"ingot_w_tma", spec, struct.pack("<16Q", *[int(w) for w in tmap.opaque])
                  + struct.pack("<2Q", base, nbytes))


def _write_global(module: Any, symbol: bytes, spec: Any, blob: bytes) -> None:
    from .cuda_driver import check, driver

    cu = driver()
    ptr, size = check(cu.cuModuleGetGlobal(module, symbol), f"cuModuleGetGlobal({symbol.decode()}, {spec.entry})")
    if int(size) < len(blob):
        raise RuntimeError(f"{spec.entry}: {symbol.decode()} holds {int(size)} bytes, expected {len(blob)}")
    buf = ctypes.create_string_buffer(blob, len(blob))
    check(cu.cuMemcpyHtoD(int(ptr), ctypes.addressof(buf), len(blob)), f"cuMemcpyHtoD({symbol.decode()})")


def fill_kv_tma(module: Any, spec: Any, base: int, nbytes: int) -> None:
    """Write ``ingot_kv_tma`` of the loaded ``module`` (a ``CUmodule``) for the kernel of ``spec`` over the region
    ``[base, base + nbytes)`` (synchronous copy)."""
    d, kv, box_rows = _values(spec)
    _write_global(module, SYMBOL, spec, encode_kv_map(base, nbytes, d, kv, box_rows) + struct.pack("<2Q", base, nbytes))
