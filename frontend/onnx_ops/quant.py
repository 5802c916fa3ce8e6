"""Converters for QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul,
QLinearConv, ConvInteger."""

from __future__ import annotations

from collections.abc import Sequence

from ...ir.graph import Value
from ...ir.ops.quant import (
    ConvInteger,
    DequantizeLinear,
    DynamicQuantizeLinear,
    QLinearConv,
    QLinearMatMul,
    QuantizeLinear,
)
from ...ir.types import DType
from ..onnx import NodeContext, Unsupported, converter, dtype_from_onnx


@converter("QuantizeLinear")
def _quantize_linear(ctx: NodeContext) -> Value:
    zp = ctx.input(2)
    out_attr = int(ctx.attr("output_dtype", 0))
    if zp is not None:
        to = zp.type.dtype
        if out_attr and dtype_from_onnx(out_attr, "output_dtype") != to:
            raise Unsupported("output_dtype differs from the zero point's type")
    elif out_attr:
        to = dtype_from_onnx(out_attr, "output_dtype")
    else:
        to = DType.u8
    prec = int(ctx.attr("precision", 0))
    op = QuantizeLinear(
        to=to,
        axis=int(ctx.attr("axis", 1)),
        block_size=int(ctx.attr("block_size", 0)),
        saturate=bool(ctx.attr("saturate", 1)),
        precision=dtype_from_onnx(prec, "precision") if prec else None,
    )
    return ctx.add1(op, [ctx.input(0), ctx.input(1), zp])


@converter("DequantizeLinear")
def _dequantize_linear(ctx: NodeContext) -> Value:
    scale = ctx.input(1)
    assert scale is not None
    out_attr = int(ctx.attr("output_dtype", 0))
    to = dtype_from_onnx(out_attr, "output_dtype") if out_attr else scale.type.dtype
    op = DequantizeLinear(to=to, axis=int(ctx.attr("axis", 1)), block_size=int(ctx.attr("block_size", 0)))
    return ctx.add1(op, [ctx.input(0), scale, ctx.input(2)])


@converter("DynamicQuantizeLinear")
def _dynamic_quantize_linear(ctx: NodeContext) -> list[Value]:
    return ctx.add(DynamicQuantizeLinear(), [ctx.input(0)])


@converter("QLinearMatMul")
def _qlinear_matmul(ctx: NodeContext) -> Value:
    return ctx.add1(QLinearMatMul(), [ctx.input(i) for i in range(8)])


def _conv_attrs(ctx: NodeContext) -> dict:
    def ints(name: str) -> tuple[int, ...]:
        v: Sequence[int] | None = ctx.attr(name)
        return tuple(int(x) for x in v) if v else ()

    return dict(
        kernel_shape=ints("kernel_shape"),
        strides=ints("strides"),
        pads=ints("pads"),
        dilations=ints("dilations"),
        group=int(ctx.attr("group", 1)),
        auto_pad=str(ctx.attr("auto_pad", "NOTSET")),
    )


@converter("ConvInteger")
def _conv_integer(ctx: NodeContext) -> Value:
    return ctx.add1(ConvInteger(**_conv_attrs(ctx)), [ctx.input(i) for i in range(4)])


@converter("QLinearConv")
def _qlinear_conv(ctx: NodeContext) -> Value:
    return ctx.add1(QLinearConv(**_conv_attrs(ctx)), [ctx.input(i) for i in range(9)])
