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
from collections.abc import Callable, Mapping
from typing import Any

#: the module globals the kernels read (prefill_wgmma.cu's KV cache map, gemv/skinny.cu's weight map)
SYMBOL = b"ingot_kv_tma"
W_SYMBOL = b"ingot_w_tma"
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


def _region_rows(base: int, nbytes: int, row_bytes: int, what: str) -> int:
    """Rows of ``row_bytes`` in ``[base, base + nbytes)``; ``ValueError`` naming ``what`` where TMA cannot view the
    region so (a base not 16-byte aligned, not whole rows, more rows than 32-bit coordinates)."""
    if base % 16 or nbytes <= 0 or nbytes % row_bytes:
        raise ValueError(f"{what} tensor map: region {base:#x} + {nbytes} bytes is not 16-byte aligned whole rows of "
                         f"{row_bytes} bytes")
    rows = nbytes // row_bytes
    if rows >= 2**31:
        raise ValueError(f"{what} tensor map: {rows} rows exceed TMA's 32-bit coordinates")
    return rows


def kv_region_rows(base: int, nbytes: int, head_dim: int, kv_heads: int) -> int:
    """The cache rows (``kv_heads x head_dim`` bf16 each) of the region ``[base, base + nbytes)``; ``ValueError``
    where TMA cannot view it so (a base not 16-byte aligned, not whole rows, more rows than 32-bit coordinates)."""
    return _region_rows(base, nbytes, kv_heads * head_dim * 2,
                        f"KV ({kv_heads} KV heads x head_dim {head_dim}, bf16)")


def _encode_tiled(base: int, dims: list[int], strides: list[int], box: list[int], what: str,
                 codes: int = 0) -> bytes:
    """The 128-byte CUtensorMap of a tensor at ``base`` (``dims`` innermost first, byte ``strides`` of the outer ones):
    bf16, tiles of ``box`` elements landing with the 128-byte swizzle, or bytes (``codes``: the box's row bytes, 64
    for e4m3 codes landing with the 64-byte swizzle, 32 for NVFP4 ones landing densely); zeros out of bounds."""
    from .cuda_driver import check, driver

    cu = driver()
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t
    dtype = cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8 if codes else \
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    swizzle = {0: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B, 64: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
               32: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE}[codes]
    tmap = check(cu.cuTensorMapEncodeTiled(
        dtype, len(dims), base, [u64(d) for d in dims],
        [u64(s) for s in strides], [u32(b) for b in box], [u32(1)] * len(dims),
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), f"cuTensorMapEncodeTiled({what})")
    words = [int(w) for w in tmap.opaque]
    if len(words) != 16:
        raise RuntimeError(f"CUtensorMap of {len(words)} words, expected 16")
    return struct.pack("<16Q", *words)


def encode_kv_map(base: int, nbytes: int, head_dim: int, kv_heads: int, box_rows: int) -> bytes:
    """The 128-byte CUtensorMap over ``nbytes`` of device memory at ``base`` as rows of ``kv_heads x head_dim``
    bf16 (the paged cache's ``[blocks, 2, block_size, kv_heads, head_dim]`` layout, every layer's one after
    another), a box of ``min(head_dim, 64) x 1 x box_rows`` elements, 128-byte swizzle, zeros out of bounds."""
    rows = kv_region_rows(base, nbytes, head_dim, kv_heads)
    return _encode_tiled(base, [head_dim, kv_heads, rows], [head_dim * 2, kv_heads * head_dim * 2],
                        [min(head_dim, 64), 1, box_rows], "KV cache")


def fill_w_tma(module: Any, spec: Any, base: int, nbytes: int) -> None:
    """Write ``ingot_w_tma`` of the loaded ``module`` for ``gemv/skinny.cu`` (``spec``: its ``K``, ``WGS`` and ``WB``)
    over the region ``[base, base + nbytes)`` holding its weight, viewed as rows of K bf16: dims ``{K, rows}``, a box
    of ``64 x (64 x WGS)`` with the 128-byte swizzle, zeros past the rows; with ``WB`` 1 as rows of K e4m3 codes, the
    box's 64-byte rows landing with the 64-byte swizzle (the kernel's lanes read them without bank conflicts); with
    ``WB`` 0 as rows of K / 2 bytes of NVFP4 codes, boxes of 32-byte rows landing densely."""
    from ..codegen.kernels.gemv.skinny_rule import row_bytes, stage_row_bytes

    v = dict(spec.values)
    k, box_rows, wb = int(v["K"]), 64 * int(v["WGS"]), int(v.get("WB", 2))
    pitch = row_bytes(v)
    rows = _region_rows(base, nbytes, pitch, f"weight (K {k}, {({2: 'bf16', 1: 'e4m3', 0: 'nvfp4'})[wb]})")
    if wb == 2:  # bf16 elements
        tmap = _encode_tiled(base, [k, rows], [pitch], [64, box_rows], "weight")
    else:  # code bytes
        box = stage_row_bytes(wb)
        tmap = _encode_tiled(base, [pitch, rows], [pitch], [box, box_rows], "weight", codes=box)
    _write_global(module, W_SYMBOL, spec, tmap + struct.pack("<2Q", base, nbytes))


def w_tma_region(region_bytes: int, room: int, pitch: int, weights: Mapping[str, tuple[int, int]]) -> int:
    """The bytes from the weights region's start that a skinny GEMM module's map views (``fill_w_tma``), as whole
    rows of ``pitch`` bytes: the region rounded up to a row where the arena has ``room`` for it, else down.
    ``weights``: name -> (offset in the region, bytes) of each weight the module is launched on; ``ValueError`` naming
    one that does not start a whole number of rows from the region's start or ends past the view (an artifact
    whose memory plan did not align it: ``skinny_rule.weight_pitches``)."""
    rows = -(-region_bytes // pitch)
    if rows * pitch > room:
        rows = region_bytes // pitch
    for name, (offset, nbytes) in weights.items():
        if offset % pitch or offset + nbytes > rows * pitch:
            raise ValueError(f"weight {name} at offset {offset} ({nbytes} bytes): the skinny GEMM's tensor map reads "
                             f"rows of {pitch} bytes from the weights region's start, so it must start at a multiple "
                             f"of {pitch} and end within {rows * pitch} bytes; recompile the artifact")
    return rows * pitch


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


def tensor_maps(spec: Any) -> list[tuple[str, Callable[[Any, Any, int, int], None]]]:
    """The tensor maps the kernel of ``spec`` reads, as (the launch argument whose buffer the map views, its fill
    function): for launchers that map a launch's own buffers (the tests, the benchmarks; the executor maps its whole
    KV region and weights region instead)."""
    maps = ((needs_kv_tma, "kv_cache", fill_kv_tma), (needs_w_tma, "weight", fill_w_tma))
    return [(arg, fill) for needs, arg, fill in maps if needs(spec)]
