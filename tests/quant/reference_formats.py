"""An independent bit-level reference of the formats, written from their definitions (OCP MX 1.0,
section 5.3.3 for E2M1 and 5.4.1 for E8M0; OCP FP8 for E4M3; NVIDIA's NVFP4: E2M1 with E4M3 scales
per 16 and an FP32 global scale). Codes are decoded by hand from sign/exponent/mantissa fields;
rounding is to the nearest representable value, ties to the even code (mantissa LSB 0); values
beyond the largest finite one saturate to it. No ml_dtypes."""

from __future__ import annotations

import math

import numpy as np


def decode_e2m1(code: int) -> float:
    s, e, m = (code >> 3) & 1, (code >> 1) & 3, code & 1
    mag = m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
    return -mag if s else mag


def decode_e4m3(code: int) -> float:
    s, e, m = (code >> 7) & 1, (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return math.nan
    mag = m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -mag if s else mag


def _table(decode, nbits: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative finite values (ascending) and their codes."""
    vals = [(decode(c), c) for c in range(1 << (nbits - 1)) if not math.isnan(decode(c))]
    vals.sort()
    return np.array([v for v, _ in vals]), np.array([c for _, c in vals])


E2M1 = _table(decode_e2m1, 4)
E4M3 = _table(decode_e4m3, 8)


def round_to(x: float, table: tuple[np.ndarray, np.ndarray]) -> tuple[float, int]:
    """(value, code) of ``x`` rounded to nearest-even with saturation; sign carried separately."""
    vals, codes = table
    sign = math.copysign(1.0, x)
    a = abs(x)
    if a >= vals[-1]:
        i = len(vals) - 1
    else:
        j = int(np.searchsorted(vals, a))  # vals[j-1] < a <= vals[j]
        if vals[j] == a:
            i = j
        else:
            lo, hi = vals[j - 1], vals[j]
            if a - lo < hi - a:
                i = j - 1
            elif hi - a < a - lo:
                i = j
            else:
                i = j - 1 if codes[j - 1] % 2 == 0 else j
    return sign * float(vals[i]), int(codes[i])


def e2m1(x: float) -> float:
    return round_to(x, E2M1)[0]


def e4m3(x: float) -> float:
    return round_to(x, E4M3)[0]


def f32(x: float) -> float:
    return float(np.float32(x))


def nvfp4_block(xs: list[float], global_scale: float) -> tuple[list[float], float]:
    """One block of 16: (E2M1 values, E4M3 scale) with the documented f32 operation order."""
    enc = f32(1.0 / global_scale)
    vmax = max(abs(v) for v in xs)
    sf = e4m3(f32(enc * f32(vmax * f32(1.0 / 6.0))))
    denom = f32(sf * f32(1.0 / enc))
    out = 0.0 if denom == 0 else f32(1.0 / denom)
    return [e2m1(f32(v * out)) for v in xs], sf


def floor_log2(a: float) -> int:
    """Exact floor(log2(a)) for a finite a > 0 (Python floats scale by 2 exactly)."""
    e = 0
    while a >= 2.0:
        a, e = a / 2, e + 1
    while a < 1.0:
        a, e = a * 2, e - 1
    return e


def mxfp4_block(xs: list[float]) -> tuple[list[float], int]:
    """One block of 32: (E2M1 values, E8M0 code = shared exponent + 127)."""
    amax = max(abs(v) for v in xs)
    shared = -127 if amax == 0 else max(-127, min(127, floor_log2(amax) - 2))
    return [e2m1(math.ldexp(v, -shared)) for v in xs], shared + 127
