"""Error-compensating weight rounding (GPTQ, Frantar et al. 2022) onto ingot's FP8 and FP4 grids.

Round-to-nearest rounds every weight on its own. GPTQ rounds one input column at a time and spreads
each column's rounding error over the columns not yet rounded, weighted by the inverse of the
layer's input Gram matrix ``H = X^T X`` (calibration activations), so the layer's *output* error
``||X W^T - X Q^T||`` shrinks rather than the weight error. The scales are those round-to-nearest
would pick from the original weights (per channel, per block, NVFP4's two levels, MXFP4's E8M0), and
the stored arrays have exactly ``linear.quantize_weight``'s layout and dtypes: only which grid point
each weight lands on changes, so kernels and the op reference need nothing new.

Columns are processed in blocks of ``block`` with lazy batch updates; ``act_order`` takes columns in
decreasing ``diag(H)`` (largest input energy first); ``damp`` adds ``damp * mean(diag(H))`` to the
diagonal before inversion. With ``H`` the identity no error is spread and the result is exactly
round-to-nearest (a test checks it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ir.quant import formats as F
from ..ir.quant.packing import pack_e2m1
from .config import LayerQuant
from .linear import quantize_weight

_F32 = np.float32

#: (codes for column j given its values [N]) and (the values those codes decode to)
ColumnQuant = tuple[Callable[[np.ndarray, int], np.ndarray], Callable[[np.ndarray, int], np.ndarray]]


def _column_quantizer(w: np.ndarray, q: LayerQuant, stored: dict[str, np.ndarray]) -> ColumnQuant:
    """Per-column encode/decode with the scales round-to-nearest chose (``stored``), using the same f32
    operations as the format's quantize function, so ``encode`` of an unmodified column gives RTN's codes."""
    n, k = w.shape
    if q.weight == "fp8":
        block = (128, 128) if q.granularity == "block" else F.FP8_BLOCK
        s = F.expand_fp8_scale(stored["weight_scale"], (n, k), q.granularity, block)
        s = np.broadcast_to(s, (n, k)).astype(_F32)
        return (lambda x, j: F.to_e4m3(x.astype(_F32) / s[:, j]),
                lambda c, j: c.astype(_F32) * s[:, j])
    if q.weight == "nvfp4":
        sf, gs = stored["weight_scale"], np.asarray(stored["weight_scale_2"], _F32)
        enc = (_F32(1) / gs).astype(_F32)
        denom = (sf.astype(_F32) * (_F32(1) / enc)).astype(_F32)
        out = np.zeros(denom.shape, _F32)
        np.divide(_F32(1), denom, out=out, where=denom != 0)
        sf32 = sf.astype(_F32)
        b = F.NVFP4_BLOCK
        return (lambda x, j: F.to_e2m1(x.astype(_F32) * out[:, j // b]),
                lambda c, j: (c.astype(_F32) * sf32[:, j // b]) * gs)
    if q.weight == "mxfp4":
        scale = F.e8m0_to_f32(stored["weight_scale"])
        shared = np.asarray(stored["weight_scale"]).view(np.uint8).astype(np.int32) - 127
        b = F.MX_BLOCK
        return (lambda x, j: F.to_e2m1(np.ldexp(x.astype(_F32), -shared[:, j // b]).astype(_F32)),
                lambda c, j: c.astype(_F32) * scale[:, j // b])
    raise ValueError(f"{q.label}: GPTQ rounding applies to fp8, nvfp4 and mxfp4 weights")


def gptq_quantize_weight(w: np.ndarray, q: LayerQuant, gram: np.ndarray, *, damp: float = 0.01, block: int = 128,
                         act_order: bool = True) -> dict[str, np.ndarray]:
    """``quantize_weight(w, q)`` with GPTQ rounding against the input Gram matrix ``gram`` [K, K].

    Returns the same arrays (``weight`` codes, packed for FP4, ``weight_scale``, ``weight_scale_2``).
    """
    w = np.asarray(w, _F32)
    n, k = w.shape
    gram = np.asarray(gram, np.float64)
    if gram.shape != (k, k):
        raise ValueError(f"{q.label}: Gram matrix {gram.shape} does not match the weight's K = {k}")
    if not damp > 0:
        raise ValueError(f"GPTQ damp must be positive, got {damp}")
    stored = quantize_weight(w, q)
    if q.weight == "bf16":
        return stored
    encode, decode = _column_quantizer(w, q, stored)

    h = gram.copy()
    work = w.astype(np.float64)
    dead = np.diag(h) == 0  # inputs never seen: nothing to compensate with; round them as they are
    h[dead, dead] = 1.0
    perm = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(k)
    work, h = work[:, perm], h[perm][:, perm]
    h[np.diag_indices(k)] += damp * float(np.mean(np.diag(h)))
    try:
        hinv = np.linalg.cholesky(np.linalg.inv(h)).T  # upper triangular: H^-1 = U^T U
    except np.linalg.LinAlgError as e:
        raise ValueError(f"{q.label}: GPTQ: the damped Gram matrix is not positive definite ({e}); "
                         "raise the damping") from None

    codes = np.zeros((n, k), encode(np.zeros(n, _F32), 0).dtype)
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        w1 = work[:, b0:b1].copy()
        err = np.zeros_like(w1)
        hb = hinv[b0:b1, b0:b1]
        for i in range(b1 - b0):
            j = int(perm[b0 + i])
            c = encode(w1[:, i], j)
            codes[:, j] = c
            e = (w1[:, i] - decode(c, j).astype(np.float64)) / hb[i, i]
            w1[:, i:] -= np.outer(e, hb[i, i:])
            err[:, i] = e
        work[:, b1:] -= err @ hinv[b0:b1, b1:]

    out = dict(stored)
    out["weight"] = codes if q.weight == "fp8" else pack_e2m1(codes)
    return out
