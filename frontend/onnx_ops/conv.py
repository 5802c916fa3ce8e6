"""Converters for Conv, ConvTranspose, Col2Im, DeformConv."""

from __future__ import annotations

from ...ir.ops.conv import Col2Im, Conv, ConvTranspose, DeformConv, resolve_pads, spatial_params
from ..onnx import NodeContext, Unsupported, converter


def _ints(ctx: NodeContext, key: str) -> tuple[int, ...]:
    return tuple(int(v) for v in (ctx.attr(key) or ()))


def static_auto_pad(
    ctx: NodeContext, kernel: tuple[int, ...] | None, dilated: bool = True
) -> tuple[str, tuple[int, ...]]:
    """(auto_pad, pads): SAME_* resolved to explicit pads when the spatial shape is static."""
    auto_pad = str(ctx.attr("auto_pad", "NOTSET")) or "NOTSET"
    pads = _ints(ctx, "pads")
    x = ctx.input(0)
    if auto_pad == "NOTSET" or x is None or x.type.shape is None or kernel is None:
        return auto_pad, pads
    sp = x.type.shape[2:]
    if not all(isinstance(v, int) for v in sp) or len(kernel) != len(sp):
        return auto_pad, pads
    n = len(sp)
    s, d, _ = spatial_params(n, _ints(ctx, "strides"), _ints(ctx, "dilations") if dilated else (), ())
    return "NOTSET", resolve_pads(auto_pad, sp, kernel, s, d, ())  # type: ignore[arg-type]


def _kernel(ctx: NodeContext) -> tuple[int, ...] | None:
    ks = _ints(ctx, "kernel_shape")
    if ks:
        return ks
    w = ctx.input(1)
    if w is not None and w.type.shape is not None and all(isinstance(v, int) for v in w.type.shape[2:]):
        return tuple(int(v) for v in w.type.shape[2:])  # type: ignore[arg-type]
    return None


@converter("Conv")
def _conv(ctx: NodeContext):
    auto_pad, pads = static_auto_pad(ctx, _kernel(ctx))
    op = Conv(strides=_ints(ctx, "strides"), pads=pads, dilations=_ints(ctx, "dilations"),
              group=int(ctx.attr("group", 1)), auto_pad=auto_pad)
    return ctx.add1(op, [ctx.input(0), ctx.input(1), ctx.input(2)])


@converter("ConvTranspose")
def _conv_transpose(ctx: NodeContext):
    op = ConvTranspose(
        strides=_ints(ctx, "strides"), pads=_ints(ctx, "pads"), dilations=_ints(ctx, "dilations"),
        group=int(ctx.attr("group", 1)), auto_pad=str(ctx.attr("auto_pad", "NOTSET")) or "NOTSET",
        output_padding=_ints(ctx, "output_padding"), output_shape=_ints(ctx, "output_shape"),
    )
    return ctx.add1(op, [ctx.input(0), ctx.input(1), ctx.input(2)])


@converter("Col2Im")
def _col2im(ctx: NodeContext):
    op = Col2Im(strides=_ints(ctx, "strides"), pads=_ints(ctx, "pads"), dilations=_ints(ctx, "dilations"))
    return ctx.add1(op, [ctx.input(0), ctx.input(1), ctx.input(2)])


@converter("DeformConv")
def _deform_conv(ctx: NodeContext):
    x = ctx.input(0)
    if x is not None and x.type.shape is not None and len(x.type.shape) != 4:
        raise Unsupported("DeformConv is supported for 2-d inputs only")
    op = DeformConv(strides=_ints(ctx, "strides"), pads=_ints(ctx, "pads"), dilations=_ints(ctx, "dilations"),
                    group=int(ctx.attr("group", 1)), offset_group=int(ctx.attr("offset_group", 1)))
    return ctx.add1(op, [ctx.input(i) for i in range(5)])
