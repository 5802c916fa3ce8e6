"""Quantized GEMM/conv ops of pre-quantized (QDQ) ONNX models: ``qdq_linear`` and ``qdq_conv``.

``fuse-qdq`` makes them from ``DequantizeLinear(quantized constant weight)`` feeding a
MatMul/Gemm/Conv, optionally with a ``QuantizeLinear -> DequantizeLinear`` pair on the activation.
They keep the weight's quantized values and its scales and zero points as inputs (no dequantized
copy in the graph); their references dequantize exactly as ONNX's DequantizeLinear does
(``(w - zero_point) * scale`` in float32, per tensor, per axis or blocked) and quantize the
activation exactly as the QDQ pair would (``dequantize(quantize(x))`` with a static per-tensor
scale), then compute in float32 and round once to the activation's dtype.

These are separate from ``quantized_linear`` (ingot's own fp8/nvfp4/mxfp4 formats of the ``quantize``
pass): ONNX QDQ has integer types with zero points, any block size along any axis (a partial last
block included) and per-tensor activation quantization to any QuantizeLinear type.

Inputs (``_`` when absent)::

    qdq_linear(x [..., K], w [N, K] quantized, w_scale, w_zero_point?, bias [N]?, x_scale?, x_zero_point?)
    qdq_conv(x [N, C, *S], w [M, C/group, *k] quantized, w_scale, w_zero_point?, bias [M]?,
             x_scale?, x_zero_point?)

``axis``/``block_size`` describe the weight's scale layout as DequantizeLinear's attributes do, on
the weight as stored (``qdq_linear``'s is [N, K]: per output channel is ``axis=0``, blocks along K
are ``axis=1``). ``act_dtype`` is the activation's quantized type (``None``: no activation
quantization; then ``x_scale`` must be absent), ``act_saturate`` QuantizeLinear's ``saturate``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..types import DType, TensorType, dims_compatible
from .conv import Conv
from .core import cast_array
from .quant import QUANT_TYPES, _check_scale, dequantize_array, quantize_array


def _check_weight(op: _QdqBase, w: TensorType, s: TensorType, zp: TensorType | None) -> None:
    if w.dtype not in (*QUANT_TYPES, DType.i32):
        raise OpError(f"{op.name}: weight {w} is not a quantized type")
    if not s.dtype.is_float:
        raise OpError(f"{op.name}: weight scale must be a float, got {s}")
    if zp is not None and zp.dtype != w.dtype:
        raise OpError(f"{op.name}: weight zero point is {zp.dtype.value}, weight is {w.dtype.value}")
    _check_scale(w, s, op.axis, op.block_size, "weight scale")
    if zp is not None:
        _check_scale(w, zp, op.axis, op.block_size, "weight zero point")


def _check_act(op: _QdqBase, x: TensorType, s: TensorType | None, zp: TensorType | None) -> None:
    if op.act_dtype is None:
        if s is not None or zp is not None:
            raise OpError(f"{op.name}: x_scale/x_zero_point given without act_dtype")
        return
    if op.act_dtype not in QUANT_TYPES:
        raise OpError(f"{op.name}: act_dtype {op.act_dtype.value} is not a quantized type")
    if s is None:
        raise OpError(f"{op.name}: act_dtype {op.act_dtype.value} needs x_scale")
    if not s.dtype.is_float or (s.shape is not None and any(d != 1 for d in s.shape)):
        raise OpError(f"{op.name}: x_scale must be one float (static per-tensor), got {s}")
    if zp is not None and (zp.dtype != op.act_dtype or (zp.shape is not None and any(d != 1 for d in zp.shape))):
        raise OpError(f"{op.name}: x_zero_point must be one {op.act_dtype.value}, got {zp}")


@dataclass(frozen=True, eq=False)
class _QdqBase(Op):
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 7)
    axis: int = 0
    block_size: int = 0
    act_dtype: DType | None = None
    act_saturate: bool = True

    def weight(self, w: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None) -> np.ndarray:
        """The weight as DequantizeLinear gives it, in float32."""
        return dequantize_array(w, scale, zero_point, DType.f32, self.axis, self.block_size)

    def activation(self, x: np.ndarray, scale: np.ndarray | None, zero_point: np.ndarray | None) -> np.ndarray:
        """``x`` through the QuantizeLinear -> DequantizeLinear pair (as ``x``'s dtype), or ``x``."""
        if self.act_dtype is None or scale is None:
            return x
        q = quantize_array(x, scale.reshape(()), None if zero_point is None else zero_point.reshape(()),
                           self.act_dtype, saturate=self.act_saturate)
        zp = None if zero_point is None else zero_point.reshape(())
        return dequantize_array(q, scale.reshape(()), zp, DType.from_np(x.dtype))

    def _types(self, inputs: Sequence[TensorType | None]) -> tuple[TensorType, TensorType, TensorType | None]:
        ins = list(inputs) + [None] * (7 - len(inputs))
        x, w, s = require(ins[0], "x"), require(ins[1], "w"), require(ins[2], "w_scale")
        if not x.dtype.is_float:
            raise OpError(f"{self.name} needs a float input, got {x}")
        _check_weight(self, w, s, ins[3])
        _check_act(self, x, ins[5], ins[6])
        return x, w, ins[4]


def _back(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if y.dtype == dtype:
        return y
    if dtype in (np.float32, np.float64):
        return y.astype(dtype)
    return cast_array(y.astype(np.float32), DType.from_np(dtype), saturate=False)


@register
@dataclass(frozen=True, eq=False)
class QdqLinear(_QdqBase):
    """``qdq(x) @ dequantize(w).T (+ bias)``: x [..., K], w [N, K] quantized (see the module docstring)."""

    name: ClassVar[str] = "qdq_linear"

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x, w, bias = self._types(inputs)
        if w.rank is not None and w.rank != 2:
            raise OpError(f"qdq_linear weight must be 2-D [N, K], got {w}")
        if x.shape is None or w.shape is None:
            return [TensorType(x.dtype, None)]
        if not x.shape or not dims_compatible(x.shape[-1], w.shape[1]):
            raise OpError(f"qdq_linear: x {x} does not have K={w.shape[1]} of weight {w}")
        if bias is not None and bias.shape is not None and (
                len(bias.shape) != 1 or not dims_compatible(bias.shape[0], w.shape[0])):
            raise OpError(f"qdq_linear bias must be [{w.shape[0]}], got {bias}")
        return [TensorType(x.dtype, (*x.shape[:-1], w.shape[0]))]

    def ref(self, x: np.ndarray, w: np.ndarray, w_scale: np.ndarray, w_zero_point: np.ndarray | None = None,
            bias: np.ndarray | None = None, x_scale: np.ndarray | None = None,
            x_zero_point: np.ndarray | None = None) -> np.ndarray:
        xa = self.activation(x, x_scale, x_zero_point).astype(np.float32)
        y = xa @ self.weight(w, w_scale, w_zero_point).T
        if bias is not None:
            y = y + bias.astype(np.float32)
        return _back(y, x.dtype)


@register
@dataclass(frozen=True, eq=False)
class QdqConv(_QdqBase):
    """ONNX Conv of ``qdq(x)`` with ``dequantize(w)`` (+ bias); conv attributes as ``conv``'s."""

    name: ClassVar[str] = "qdq_conv"
    strides: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    group: int = 1
    auto_pad: str = "NOTSET"

    def conv(self) -> Conv:
        return Conv(strides=self.strides, pads=self.pads, dilations=self.dilations, group=self.group,
                    auto_pad=self.auto_pad)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x, w, bias = self._types(inputs)
        wf = TensorType(x.dtype, w.shape)
        return self.conv().infer([x, wf] + ([dataclasses.replace(bias, dtype=x.dtype)] if bias is not None else []))

    def ref(self, x: np.ndarray, w: np.ndarray, w_scale: np.ndarray, w_zero_point: np.ndarray | None = None,
            bias: np.ndarray | None = None, x_scale: np.ndarray | None = None,
            x_zero_point: np.ndarray | None = None) -> np.ndarray:
        xa = self.activation(x, x_scale, x_zero_point).astype(np.float32)
        b = None if bias is None else bias.astype(np.float32)
        y = self.conv().ref(xa, self.weight(w, w_scale, w_zero_point), b)
        return _back(y, x.dtype)


__all__ = ["QdqLinear", "QdqConv"]
