"""Converters for DFT, STFT, the window functions, MelWeightMatrix and Det."""

from __future__ import annotations

from ...ir.ops.signal import BlackmanWindow, Det, Dft, HammingWindow, HannWindow, MelWeightMatrix, Stft
from ..onnx import NodeContext, converter, dtype_from_onnx


@converter("DFT")
def _dft(ctx: NodeContext):
    axis = int(ctx.attr("axis", 1)) if ctx.opset < 20 else -2
    op = Dft(axis=axis, inverse=bool(ctx.attr("inverse", 0)), onesided=bool(ctx.attr("onesided", 0)))
    return ctx.add1(op, [ctx.input(0), ctx.input(1), ctx.input(2) if ctx.opset >= 20 else None])


@converter("STFT")
def _stft(ctx: NodeContext):
    op = Stft(onesided=bool(ctx.attr("onesided", 1)))
    return ctx.add1(op, [ctx.input(i) for i in range(4)])


def _window(cls):
    def conv(ctx: NodeContext):
        dt = dtype_from_onnx(int(ctx.attr("output_datatype", 1)), "output_datatype")
        return ctx.add1(cls(output_dtype=dt, periodic=bool(ctx.attr("periodic", 1))), [ctx.input(0)])

    return conv


converter("HannWindow")(_window(HannWindow))
converter("HammingWindow")(_window(HammingWindow))
converter("BlackmanWindow")(_window(BlackmanWindow))


@converter("MelWeightMatrix")
def _mel(ctx: NodeContext):
    dt = dtype_from_onnx(int(ctx.attr("output_datatype", 1)), "output_datatype")
    return ctx.add1(MelWeightMatrix(output_dtype=dt), [ctx.input(i) for i in range(5)])


@converter("Det")
def _det(ctx: NodeContext):
    return ctx.add1(Det(), [ctx.input(0)])
