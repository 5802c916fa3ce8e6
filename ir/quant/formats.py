"""The quantized number formats, defined by how a float32 tensor becomes codes plus scales and back.

Every rounding is round-to-nearest-even; every cast saturates to the format's largest finite value
(ml_dtypes alone turns out-of-range values into NaN, so values are clipped first). Divisions,
reciprocals and products are single IEEE float32 operations in the order written here, so a kernel
that performs the same operations produces the same bits.

=========  ==================  =================================================================
format     element             scale
=========  ==================  =================================================================
fp8        E4M3 (max 448)      f32 ``amax / 448`` per tensor, per output channel (row) or per
                               128x128 block; ``q = sat_rne(x / scale)``
nvfp4      E2M1 (max 6)        one E4M3 scale per 16 consecutive elements along K, times one f32
                               global scale ``amax / (448 * 6)`` (the TensorRT-LLM recipe below)
mxfp4      E2M1 (max 6)        one E8M0 scale (a power of two) per 32 elements along K (OCP MX 1.0)
=========  ==================  =================================================================
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

E4M3_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
MX_BLOCK = 32
#: Largest exponent of an E2M1 normal number (6 = 1.5 * 2**2): the OCP MX scale subtracts it.
E2M1_EMAX = 2
FP8_BLOCK = (128, 128)

_F32 = np.float32
_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
_E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """float32 -> float8_e4m3fn, RNE, saturating at +-448 (NaN stays NaN)."""
    x = np.asarray(x, _F32)
    return np.where(np.isnan(x), x, np.clip(x, -E4M3_MAX, E4M3_MAX)).astype(_E4M3)


def to_e2m1(x: np.ndarray) -> np.ndarray:
    """float32 -> float4_e2m1fn, RNE, saturating at +-6. E2M1 has no NaN: callers keep NaN out."""
    x = np.asarray(x, _F32)
    return np.clip(x, -E2M1_MAX, E2M1_MAX).astype(_E2M1)


def _safe_scale(amax: np.ndarray, fmax: float) -> np.ndarray:
    """``amax / fmax`` in f32; an all-zero group gets scale 1 (its codes are all zero anyway)."""
    amax = np.asarray(amax, _F32)
    s = amax / _F32(fmax)
    return np.where(s > 0, s, _F32(1)).astype(_F32)


# -- FP8 ------------------------------------------------------------------------------------------


def _block_view(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    n, k = shape
    return -(-n // block[0]), -(-k // block[1])


def _expand_block(scale: np.ndarray, shape: tuple[int, int], block: tuple[int, int]) -> np.ndarray:
    return np.repeat(np.repeat(scale, block[0], axis=0), block[1], axis=1)[: shape[0], : shape[1]]


def fp8_scale(w: np.ndarray, granularity: str, block: tuple[int, int] = FP8_BLOCK) -> np.ndarray:
    """The f32 scale of a 2-D weight [N, K]: [] per tensor, [N] per channel, [ceil(N/bn), ceil(K/bk)] per block."""
    a = np.abs(np.asarray(w, _F32))
    if granularity == "tensor":
        return _safe_scale(a.max(), E4M3_MAX).reshape(())
    if granularity == "channel":
        return _safe_scale(a.max(axis=1), E4M3_MAX)
    if granularity == "block":
        nb, kb = _block_view(a.shape, block)
        pad = np.zeros((nb * block[0], kb * block[1]), _F32)
        pad[: a.shape[0], : a.shape[1]] = a
        amax = pad.reshape(nb, block[0], kb, block[1]).max(axis=(1, 3))
        return _safe_scale(amax, E4M3_MAX)
    raise ValueError(f"unknown fp8 granularity {granularity!r} (tensor, channel, block)")


def expand_fp8_scale(scale: np.ndarray, shape: tuple[int, int], granularity: str,
                     block: tuple[int, int] = FP8_BLOCK) -> np.ndarray:
    """A weight scale made broadcastable to ``shape`` [N, K]."""
    if granularity == "tensor":
        return np.asarray(scale, _F32).reshape(1, 1)
    if granularity == "channel":
        return np.asarray(scale, _F32).reshape(-1, 1)
    return _expand_block(np.asarray(scale, _F32), shape, block)


def quantize_fp8(w: np.ndarray, granularity: str = "channel", block: tuple[int, int] = FP8_BLOCK,
                 scale: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Weight [N, K] -> (E4M3 codes [N, K], f32 scale); ``q = sat_rne(w / scale)``."""
    w = np.asarray(w, _F32)
    s = fp8_scale(w, granularity, block) if scale is None else np.asarray(scale, _F32)
    return to_e4m3(w / expand_fp8_scale(s, w.shape, granularity, block)), s


def dequantize_fp8(q: np.ndarray, scale: np.ndarray, granularity: str = "channel",
                   block: tuple[int, int] = FP8_BLOCK) -> np.ndarray:
    return q.astype(_F32) * expand_fp8_scale(scale, q.shape, granularity, block)


def quantize_fp8_per_token(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic per-token activations: x [..., K] -> (E4M3 codes, f32 scale [..., 1] = amax_row / 448)."""
    x = np.asarray(x, _F32)
    s = _safe_scale(np.abs(x).max(axis=-1, keepdims=True), E4M3_MAX)
    return to_e4m3(x / s), s


def quantize_fp8_static(x: np.ndarray, scale: float | np.ndarray) -> np.ndarray:
    """Static per-tensor activations with a calibrated scale: ``sat_rne(x / scale)``."""
    return to_e4m3(np.asarray(x, _F32) / np.asarray(scale, _F32))


# -- NVFP4 ----------------------------------------------------------------------------------------


def nvfp4_global_scale(amax: float | np.ndarray) -> np.ndarray:
    """The f32 global (second-level) scale ``amax / (448 * 6)``; what dequantization multiplies by."""
    return _safe_scale(amax, E4M3_MAX * E2M1_MAX)


def _blocks(x: np.ndarray, size: int) -> np.ndarray:
    if x.shape[-1] % size:
        raise ValueError(f"the last dimension ({x.shape[-1]}) must be a multiple of the block size {size}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // size, size)


def quantize_nvfp4(x: np.ndarray, global_scale: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [..., K] -> (E2M1 values [..., K], E4M3 block scales [..., K/16]).

    With ``enc = 1 / global_scale`` (the scale that maps the tensor's amax to 448 * 6), per block of 16::

        sf      = e4m3(enc * (vmax * (1 / 6)))             vmax = max |x| over the block
        out     = sf != 0 ? 1 / (f32(sf) * (1 / enc)) : 0
        q       = e2m1(x * out)

    which is TensorRT-LLM's ``cvt_warp_fp16_to_fp4`` with correctly rounded reciprocals.
    ``global_scale`` broadcasts against x's leading dims ([..., 1] for per-token global scales).
    """
    x = np.asarray(x, _F32)
    xb = _blocks(x, NVFP4_BLOCK)
    enc = (_F32(1) / np.asarray(global_scale, _F32)).astype(_F32)  # () or [..., 1]: broadcasts over blocks
    vmax = np.abs(xb).max(axis=-1)
    sf = to_e4m3(enc * (vmax * (_F32(1) / _F32(6))))
    denom = (sf.astype(_F32) * (_F32(1) / enc)).astype(_F32)
    out = np.zeros(denom.shape, _F32)
    np.divide(_F32(1), denom, out=out, where=denom != 0)
    q = to_e2m1(xb * out[..., None])
    return q.reshape(x.shape), sf


def dequantize_nvfp4(q: np.ndarray, block_scale: np.ndarray, global_scale: float | np.ndarray) -> np.ndarray:
    """``(e2m1 * f32(sf)) * global_scale`` (the first product is exact)."""
    qb = _blocks(q.astype(_F32), NVFP4_BLOCK)
    y = qb * block_scale.astype(_F32)[..., None]
    gs = np.asarray(global_scale, _F32)
    return (y.reshape(q.shape) * gs).astype(_F32)


# -- MXFP4 ----------------------------------------------------------------------------------------


def quantize_mxfp4(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [..., K] -> (E2M1 values [..., K], E8M0 scales [..., K/32]) per the OCP MX 1.0 spec (section 6.3).

    ``shared_exp = floor(log2(amax)) - emax_elem`` (emax of E2M1 is 2), clamped to E8M0's range
    [-127, 127]; ``q = e2m1(x / 2**shared_exp)``, so the block's amax lands in [4, 8) and saturates
    to 6 when above it. An all-zero block gets the smallest scale 2**-127; a block holding NaN or
    infinity gets the NaN scale (0xFF).
    """
    x = np.asarray(x, _F32)
    xb = _blocks(x, MX_BLOCK)
    amax = np.abs(xb).max(axis=-1)
    finite = np.isfinite(amax)
    _, e = np.frexp(np.where(finite & (amax > 0), amax, _F32(1)))  # amax = m * 2**e, m in [0.5, 1)
    shared = np.where(amax > 0, e.astype(np.int32) - 1 - E2M1_EMAX, -127)
    shared = np.clip(shared, -127, 127)
    code = np.where(finite, shared + 127, 255).astype(np.uint8)
    scaled = np.ldexp(xb, -np.where(finite, shared, 0)[..., None]).astype(_F32)
    q = to_e2m1(np.where(np.isfinite(scaled), scaled, _F32(0)))
    return q.reshape(x.shape), code.view(_E8M0)


def e8m0_to_f32(scale: np.ndarray) -> np.ndarray:
    """E8M0 codes -> f32 ``2**(code - 127)`` (code 0 is 2**-127, a float32 subnormal; 0xFF is NaN)."""
    code = np.asarray(scale).view(np.uint8).astype(np.int32)
    return np.where(code == 255, _F32(np.nan), np.ldexp(_F32(1), code - 127)).astype(_F32)


def dequantize_mxfp4(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    qb = _blocks(q.astype(_F32), MX_BLOCK)
    return (qb * e8m0_to_f32(scale)[..., None]).reshape(q.shape).astype(_F32)
