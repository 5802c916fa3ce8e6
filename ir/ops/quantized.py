"""Quantized ops of the serving form: ``quantized_linear`` and ``paged_attention_fp8`` (FP8 KV cache).

Their references emulate the formats of ``ir/quant`` bit for bit: weights are decoded from the stored
codes and scales exactly as a kernel decodes them, activations are quantized per token (or with a
calibrated static scale) with the same float32 operations a kernel performs; only the matmul itself
is a float32 product (a kernel's accumulation order differs within float32 rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..quant import formats as F
from ..quant.packing import unpack_e2m1, unswizzle_sm100_scales
from ..types import DType, TensorType, dims_compatible
from .llm import PagedAttention, _back, _compute

WEIGHT_FORMATS = ("fp8", "nvfp4", "mxfp4")
ACT_FORMATS = ("none", "fp8", "nvfp4", "mxfp4")
_SCALE_DTYPE = {"fp8": DType.f32, "nvfp4": DType.f8e4m3fn, "mxfp4": DType.f8e8m0}
_VEC = {"nvfp4": F.NVFP4_BLOCK, "mxfp4": F.MX_BLOCK}


def dequantize_weight(fmt: str, granularity: str, block: tuple[int, ...], scale_layout: str, k: int,
                      weight: np.ndarray, scale: np.ndarray, scale_2: np.ndarray | None = None) -> np.ndarray:
    """The float32 weight [N, K] that a stored quantized weight stands for."""
    if fmt == "fp8":
        blk = (int(block[0]), int(block[1])) if block else F.FP8_BLOCK
        return F.dequantize_fp8(weight, scale, granularity, blk)
    q = unpack_e2m1(weight)
    n = q.shape[0]
    if scale_layout == "sm100":
        scale = unswizzle_sm100_scales(scale, n, k // _VEC[fmt])
    if fmt == "nvfp4":
        return F.dequantize_nvfp4(q, scale, np.float32(1) if scale_2 is None else scale_2)
    if fmt == "mxfp4":
        return F.dequantize_mxfp4(q, scale)
    raise OpError(f"unknown weight format {fmt!r}")


def quantize_activation(fmt: str, granularity: str, x: np.ndarray, input_scale: np.ndarray | None = None
                        ) -> np.ndarray:
    """What the kernel's activation-quantization prologue turns ``x`` [..., K] into, as float32.

    ``fp8``: per token ``scale = amax_t / 448``, or the calibrated static ``input_scale``.
    ``nvfp4``: 16-element E4M3 block scales under a global scale ``amax / 2688`` that is per token or
    the calibrated static ``input_scale``. ``mxfp4``: 32-element E8M0 block scales (no global scale).
    """
    x = np.asarray(x, np.float32)
    if fmt == "none":
        return x
    if fmt == "fp8":
        if granularity == "tensor":
            s = np.asarray(input_scale, np.float32)
            return F.quantize_fp8_static(x, s).astype(np.float32) * s
        q, s = F.quantize_fp8_per_token(x)
        return q.astype(np.float32) * s
    if fmt == "nvfp4":
        if granularity == "tensor":
            gs = np.asarray(input_scale, np.float32)
        else:
            gs = F.nvfp4_global_scale(np.abs(x).max(axis=-1, keepdims=True))
        q, sf = F.quantize_nvfp4(x, gs)
        return F.dequantize_nvfp4(q, sf, gs)
    if fmt == "mxfp4":
        return F.dequantize_mxfp4(*F.quantize_mxfp4(x))
    raise OpError(f"unknown activation format {fmt!r}")


@register
@dataclass(frozen=True, eq=False)
class QuantizedLinear(Op):
    """``quant(x) @ dequant(w).T (+ bias) (+ residual)`` with a quantized weight [N, K].

    Inputs: ``x`` [..., K], ``weight``, ``weight_scale``, ``weight_scale_2`` (NVFP4's f32 global
    scale; ``_`` otherwise), ``input_scale`` (the calibrated static activation scale: FP8's per-tensor
    scale or NVFP4's activation global scale; ``_`` for dynamic per-token), ``bias`` [N], ``residual``.

    ===========  ===================  ==============================================================
    format       weight               weight_scale
    ===========  ===================  ==============================================================
    fp8          f8e4m3fn[N, K]       f32: [] tensor, [N] channel, [ceil(N/bn), ceil(K/bk)] block
    nvfp4        u8[N, K/2] (packed)  f8e4m3fn[N, K/16]; ``scale_layout="sm100"``: swizzled, padded
    mxfp4        u8[N, K/2] (packed)  f8e8m0[N, K/32]; same layouts
    ===========  ===================  ==============================================================

    ``act_format`` ``none`` is weight-only; otherwise activations are quantized per token
    (``act_granularity="token"``) or with ``input_scale`` (``"tensor"``) as ``quantize_activation``
    says. Packing and layouts: ``ir/quant/packing.py``.
    """

    name: ClassVar[str] = "quantized_linear"
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 7)
    weight_format: str = "fp8"
    weight_granularity: str = "channel"
    block: tuple[int, ...] = ()
    act_format: str = "none"
    act_granularity: str = "token"
    scale_layout: str = "linear"
    in_features: int = 0

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x, w, s = require(inputs[0], "x"), require(inputs[1], "weight"), require(inputs[2], "weight_scale")
        s2, xs, bias, res = (inputs[i] if len(inputs) > i else None for i in range(3, 7))
        fmt, K = self.weight_format, self.in_features
        if fmt not in WEIGHT_FORMATS or self.act_format not in ACT_FORMATS:
            raise OpError(f"unknown format: weight {fmt!r}, activations {self.act_format!r}")
        if self.act_granularity not in ("token", "tensor") or self.scale_layout not in ("linear", "sm100"):
            raise OpError(f"bad act_granularity {self.act_granularity!r} or scale_layout {self.scale_layout!r}")
        if not x.dtype.is_float:
            raise OpError(f"quantized_linear needs a float input, got {x}")
        want_w = DType.f8e4m3fn if fmt == "fp8" else DType.u8
        if w.dtype != want_w or (w.rank is not None and w.rank != 2):
            raise OpError(f"{fmt} weight must be {want_w.value}[N, K{'' if fmt == 'fp8' else '/2'}], got {w}")
        if s.dtype != _SCALE_DTYPE[fmt]:
            raise OpError(f"{fmt} weight_scale must be {_SCALE_DTYPE[fmt].value}, got {s}")
        if fmt == "nvfp4" and s2 is None:
            raise OpError("nvfp4 needs weight_scale_2 (the f32 global scale)")
        if self.act_format != "none" and self.act_granularity == "tensor" and xs is None:
            raise OpError(f"static {self.act_format} activations need input_scale")
        if self.act_format == "mxfp4" and self.act_granularity == "tensor":
            raise OpError("mxfp4 activations have no static scale (act_granularity must be token)")
        if x.shape is None or w.shape is None:
            return [TensorType(x.dtype, None)]
        N = w.shape[0]
        k_stored = K if fmt == "fp8" else K // 2
        if K <= 0 or not dims_compatible(w.shape[1], k_stored) or not dims_compatible(x.shape[-1], K):
            raise OpError(f"quantized_linear: x {x}, weight {w} do not fit in_features={K}")
        if fmt != "fp8" and K % _VEC[fmt]:
            raise OpError(f"{fmt}: in_features {K} must be a multiple of {_VEC[fmt]}")
        if self.act_format in ("nvfp4", "mxfp4") and K % _VEC[self.act_format]:
            raise OpError(f"{self.act_format} activations: in_features {K} must be a multiple of "
                          f"{_VEC[self.act_format]}")
        out = TensorType(x.dtype, (*x.shape[:-1], N))
        if bias is not None and bias.shape is not None and (
            len(bias.shape) != 1 or not dims_compatible(bias.shape[0], N)
        ):
            raise OpError(f"quantized_linear bias must be [{N}], got {bias}")
        if res is not None and res.shape is not None and (
            len(res.shape) != len(out.shape) or not all(map(dims_compatible, res.shape, out.shape))  # type: ignore
        ):
            raise OpError(f"quantized_linear residual must be {out}, got {res}")
        return [out]

    def weight_f32(self, weight: np.ndarray, scale: np.ndarray, scale_2: np.ndarray | None = None) -> np.ndarray:
        return dequantize_weight(self.weight_format, self.weight_granularity, self.block, self.scale_layout,
                                 self.in_features, weight, scale, scale_2)

    def ref(self, x: np.ndarray, weight: np.ndarray, weight_scale: np.ndarray,
            weight_scale_2: np.ndarray | None = None, input_scale: np.ndarray | None = None,
            bias: np.ndarray | None = None, residual: np.ndarray | None = None) -> np.ndarray:
        w = self.weight_f32(weight, weight_scale, weight_scale_2)
        xq = quantize_activation(self.act_format, self.act_granularity, _compute(x), input_scale)
        y = xq @ w.T
        if bias is not None:
            y = y + _compute(bias)
        if residual is not None:
            y = y + _compute(residual)
        return _back(y, x.dtype)


@register
@dataclass(frozen=True, eq=False)
class PagedAttentionFp8(PagedAttention):
    """``paged_attention`` over an FP8 (E4M3) KV cache with static scales.

    A ninth input ``kv_scale`` f32 [2, num_kv_heads] holds the K (row 0) and V (row 1) scales per KV
    head; ``kv_granularity="tensor"`` means every head has the same scale. New K/V are written as
    ``sat_rne(k / scale)`` and read back as ``f32(code) * scale``; everything else is
    ``paged_attention``'s reference (on the decoded values).
    """

    name: ClassVar[str] = "paged_attention_fp8"
    num_inputs: ClassVar[tuple[int, int | None]] = (9, 9)
    kv_granularity: str = "head"

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        out = super().infer(inputs[:8])
        cache, sc = require(inputs[3], "kv_cache"), require(inputs[8], "kv_scale")
        if cache.dtype != DType.f8e4m3fn:
            raise OpError(f"paged_attention_fp8 needs an f8e4m3fn kv_cache, got {cache}")
        if sc.dtype != DType.f32 or (sc.shape is not None and sc.shape != (2, self.num_kv_heads)):
            raise OpError(f"kv_scale must be f32[2, {self.num_kv_heads}], got {sc}")
        if self.kv_granularity not in ("tensor", "head"):
            raise OpError(f"kv_granularity must be tensor or head, got {self.kv_granularity!r}")
        return out

    def ref(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, kv_cache: np.ndarray,  # type: ignore[override]
            block_tables: np.ndarray, seq_lens: np.ndarray, query_start_loc: np.ndarray,
            slot_mapping: np.ndarray, kv_scale: np.ndarray) -> np.ndarray:
        KV, D = self.num_kv_heads, self.head_dim
        T, bs = q.shape[0], kv_cache.shape[2]
        sk, sv = (np.asarray(kv_scale, np.float32)[i].reshape(1, KV, 1) for i in (0, 1))
        keep = slot_mapping >= 0
        slots = slot_mapping[keep].astype(np.int64)
        blk, off = slots // bs, slots % bs
        kv_cache[blk, 0, off] = F.to_e4m3(_compute(k.reshape(T, KV, D)[keep]) / sk)
        kv_cache[blk, 1, off] = F.to_e4m3(_compute(v.reshape(T, KV, D)[keep]) / sv)
        # decode only the blocks this step reads (renumbered 0..n-1), then attend as paged_attention does
        S = len(seq_lens)
        used = np.unique(np.concatenate(
            [block_tables[i, : -(-int(seq_lens[i]) // bs)].astype(np.int64) for i in range(S)] + [np.zeros(0, np.int64)]
        ))
        dec = np.zeros((max(len(used), 1), 2, bs, KV, D), np.float32)
        dec[: len(used), 0] = kv_cache[used, 0].astype(np.float32) * sk[None]
        dec[: len(used), 1] = kv_cache[used, 1].astype(np.float32) * sv[None]
        tables = np.clip(np.searchsorted(used, block_tables), 0, max(len(used) - 1, 0)).astype(np.int32)
        no_write = np.full_like(slot_mapping, -1)
        base = PagedAttention(num_heads=self.num_heads, num_kv_heads=KV, head_dim=D, scale=self.scale,
                              softcap=self.softcap, sliding_window=self.sliding_window)
        return base.ref(q, k, v, dec, tables, seq_lens, query_start_loc, no_write)
