"""How quantized tensors are laid out in memory for the kernels.

**E2M1 packing.** Two E2M1 codes per byte along the last (K) axis: element ``2j`` in the low nibble
(bits 0-3), element ``2j + 1`` in the high nibble (bits 4-7); a code is ``sign << 3 | exp << 1 | man``.
This is CUTLASS's ``float_e2m1_t`` / ``nv_float4_t`` subbyte order (element 0 at the lowest bits) and
PyTorch's ``float4_e2m1fn_x2``. A packed weight [N, K] is ``u8[N, K / 2]``, K-major.

**Scale factors for sm_100 block-scaled MMA** (CUTLASS ``Sm1xxBlkScaledConfig``): the scale matrix
[rows, K / vec] is padded to multiples of (128, 4) and cut into 128x4 atoms; atoms are stored K-atom
fastest, and inside an atom scale (r, c) sits at byte ``(r % 32) * 16 + (r // 32) * 4 + c``, which is::

    sf.reshape(M/128, 4, 32, Kv/4, 4).transpose(0, 3, 2, 1, 4)

(``to_blocked`` in torchao / vLLM). Padding scales are zero.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

_E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)


def pack_e2m1(q: np.ndarray) -> np.ndarray:
    """float4_e2m1fn [..., K] (K even) -> u8 [..., K / 2], element 2j in the low nibble."""
    if q.dtype != _E2M1:
        raise TypeError(f"pack_e2m1 needs float4_e2m1fn values, got {q.dtype}")
    if q.shape[-1] % 2:
        raise ValueError(f"the last dimension ({q.shape[-1]}) must be even to pack two codes per byte")
    codes = q.view(np.uint8) & 0x0F
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    """u8 [..., K / 2] -> float4_e2m1fn [..., K] (inverse of ``pack_e2m1``)."""
    p = np.asarray(packed, np.uint8)
    out = np.empty((*p.shape[:-1], p.shape[-1] * 2), np.uint8)
    out[..., 0::2] = p & 0x0F
    out[..., 1::2] = p >> 4
    return out.view(_E2M1)


def _pad_to(n: int, m: int) -> int:
    return -(-n // m) * m


def swizzle_sm100_scales(sf: np.ndarray) -> np.ndarray:
    """Scale factors [rows, K / vec] -> the sm_100 atom layout, padded to [ceil128(rows), ceil4(K / vec)]."""
    rows, cols = sf.shape
    r, c = _pad_to(rows, 128), _pad_to(cols, 4)
    raw = np.zeros((r, c), np.uint8)
    raw[:rows, :cols] = np.asarray(sf).view(np.uint8)
    out = raw.reshape(r // 128, 4, 32, c // 4, 4).transpose(0, 3, 2, 1, 4).reshape(r, c)
    return np.ascontiguousarray(out).view(sf.dtype)


def unswizzle_sm100_scales(swizzled: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Inverse of ``swizzle_sm100_scales``: the [rows, cols] scale matrix back in row-major order."""
    r, c = swizzled.shape
    raw = np.asarray(swizzled).view(np.uint8).reshape(r // 128, c // 4, 32, 4, 4).transpose(0, 3, 2, 1, 4)
    return np.ascontiguousarray(raw.reshape(r, c)[:rows, :cols]).view(swizzled.dtype)


def sm100_scale_offset(row: int, col: int, cols: int) -> int:
    """Byte offset of scale (row, col) in the swizzled layout of a matrix with ``cols`` scale columns."""
    kt = _pad_to(cols, 4) // 4
    return ((row // 128) * kt + col // 4) * 512 + (row % 32) * 16 + ((row % 128) // 32) * 4 + col % 4
