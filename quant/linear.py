"""One linear layer under a ``LayerQuant``: its stored arrays, its op, its bytes, its output error."""

from __future__ import annotations

import numpy as np

from ..ir.op import Op
from ..ir.ops.llm import Linear
from ..ir.ops.quantized import QuantizedLinear
from ..ir.quant import formats as F
from ..ir.quant.packing import pack_e2m1
from ..ir.types import DType
from .config import LayerQuant


def quantize_weight(w: np.ndarray, q: LayerQuant) -> dict[str, np.ndarray]:
    """The stored arrays of weight [N, K] under ``q``: ``weight``, ``weight_scale`` (and
    ``weight_scale_2`` for NVFP4). ``bf16``: just ``weight`` in bfloat16."""
    w = np.asarray(w, np.float32)
    if q.weight == "bf16":
        return {"weight": w.astype(DType.bf16.np)}
    if q.weight == "fp8":
        codes, scale = F.quantize_fp8(w, q.granularity)
        return {"weight": codes, "weight_scale": scale}
    if q.weight == "nvfp4":
        gs = F.nvfp4_global_scale(np.abs(w).max())
        codes, sf = F.quantize_nvfp4(w, gs)
        return {"weight": pack_e2m1(codes), "weight_scale": sf, "weight_scale_2": np.asarray(gs, np.float32)}
    if q.weight == "mxfp4":
        codes, sf = F.quantize_mxfp4(w)
        return {"weight": pack_e2m1(codes), "weight_scale": sf}
    raise ValueError(f"{q.label}: nothing to quantize")


def static_input_scale(q: LayerQuant, amax: float) -> np.ndarray | None:
    """The calibrated static activation scale for ``q`` from the input's amax (None: not static)."""
    if not q.needs_static_scale():
        return None
    if q.act == "fp8":
        return np.asarray(F._safe_scale(amax, F.E4M3_MAX), np.float32).reshape(())
    return np.asarray(F.nvfp4_global_scale(amax), np.float32).reshape(())


def make_op(q: LayerQuant, in_features: int) -> Op:
    if q.weight in ("bf16", "none"):
        return Linear()
    return QuantizedLinear(weight_format=q.weight, weight_granularity=q.granularity,
                           block=(128, 128) if q.granularity == "block" and q.weight == "fp8" else (),
                           act_format=q.act, act_granularity=q.act_granularity, in_features=in_features)


def weight_nbytes(shape: tuple[int, int], q: LayerQuant) -> int:
    """Bytes the stored weight and its scales take."""
    n, k = shape
    if q.weight == "none":
        return 4 * n * k
    if q.weight == "bf16":
        return 2 * n * k
    if q.weight == "fp8":
        scales = {"tensor": 1, "channel": n, "block": -(-n // 128) * -(-k // 128)}[q.granularity]
        return n * k + 4 * scales
    vec = F.NVFP4_BLOCK if q.weight == "nvfp4" else F.MX_BLOCK
    return n * k // 2 + n * k // vec + (4 if q.weight == "nvfp4" else 0)


def layer_output(q: LayerQuant, x: np.ndarray, w: np.ndarray, arrays: dict[str, np.ndarray] | None = None,
                 input_scale: np.ndarray | None = None) -> np.ndarray:
    """``x @ w.T`` with the layer quantized as ``q`` (no bias: it cancels in the error)."""
    if q.weight == "none":
        return x @ w.T
    arrays = arrays if arrays is not None else quantize_weight(w, q)
    if q.weight == "bf16":
        return x @ arrays["weight"].astype(np.float32).T
    op = make_op(q, w.shape[1])
    return op.ref(x, arrays["weight"], arrays["weight_scale"], arrays.get("weight_scale_2"), input_scale)


def snr_db(reference: np.ndarray, approx: np.ndarray) -> float:
    """``10 log10(sum ref^2 / sum (ref - approx)^2)``; inf when identical."""
    ref = reference.astype(np.float64)
    err = float(((ref - approx.astype(np.float64)) ** 2).sum())
    sig = float((ref**2).sum())
    if err == 0.0:
        return float("inf")
    return 10.0 * float(np.log10(max(sig, 1e-300) / err))
