"""Converters for Resize, Upsample (and the other image ops)."""

from __future__ import annotations

import numpy as np

from ...ir.ops.image import AffineGrid, GridSample, NonMaxSuppression, Resize, RoiAlign
from ..onnx import NodeContext, Unsupported, converter


@converter("Resize")
def _resize(ctx: NodeContext):
    mode = str(ctx.attr("mode", "nearest"))
    if ctx.opset < 11:  # Resize-10: (X, scales), asymmetric coordinates
        op = Resize(mode=mode, coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        return ctx.add1(op, [ctx.input(0), None, ctx.input(1)])
    op = Resize(
        mode=mode,
        coordinate_transformation_mode=str(ctx.attr("coordinate_transformation_mode", "half_pixel")),
        nearest_mode=str(ctx.attr("nearest_mode", "round_prefer_floor")),
        cubic_coeff_a=float(ctx.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(ctx.attr("exclude_outside", 0)),
        extrapolation_value=float(ctx.attr("extrapolation_value", 0.0)),
        antialias=bool(ctx.attr("antialias", 0)),
        keep_aspect_ratio_policy=str(ctx.attr("keep_aspect_ratio_policy", "stretch")),
        axes=tuple(int(a) for a in (ctx.attr("axes") or ())),
    )
    if op.mode == "nearest" and op.antialias:
        raise Unsupported("antialias with mode 'nearest'")
    ins = [ctx.input(i) for i in range(4)]
    for i in (1, 2, 3):  # empty tensors stand for omitted inputs
        v = ctx.const_value(ins[i])
        if v is not None and v.size == 0:
            ins[i] = None
    return ctx.add1(op, ins)


@converter("Upsample")
def _upsample(ctx: NodeContext):
    mode = str(ctx.attr("mode", "nearest"))
    if mode == "bilinear":
        mode = "linear"
    op = Resize(mode=mode, coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    if ctx.opset < 9:
        scales = np.asarray(ctx.attr("scales"), np.float32)
        return ctx.add1(op, [ctx.input(0), None, ctx.const(scales)])
    return ctx.add1(op, [ctx.input(0), None, ctx.input(1)])


@converter("GridSample")
def _grid_sample(ctx: NodeContext):
    mode = str(ctx.attr("mode", "linear" if ctx.opset >= 20 else "bilinear"))
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    op = GridSample(mode=mode, padding_mode=str(ctx.attr("padding_mode", "zeros")),
                    align_corners=bool(ctx.attr("align_corners", 0)))
    return ctx.add1(op, [ctx.input(0), ctx.input(1)])


@converter("AffineGrid")
def _affine_grid(ctx: NodeContext):
    op = AffineGrid(align_corners=bool(ctx.attr("align_corners", 0)))
    return ctx.add1(op, [ctx.input(0), ctx.input(1)])


@converter("RoiAlign")
def _roi_align(ctx: NodeContext):
    default = "half_pixel" if ctx.opset >= 16 else "output_half_pixel"
    ctm = str(ctx.attr("coordinate_transformation_mode", default))
    op = RoiAlign(mode=str(ctx.attr("mode", "avg")), output_height=int(ctx.attr("output_height", 1)),
                  output_width=int(ctx.attr("output_width", 1)),
                  sampling_ratio=int(ctx.attr("sampling_ratio", 0)),
                  spatial_scale=float(ctx.attr("spatial_scale", 1.0)), half_pixel=ctm == "half_pixel")
    return ctx.add1(op, [ctx.input(0), ctx.input(1), ctx.input(2)])


@converter("NonMaxSuppression")
def _nms(ctx: NodeContext):
    op = NonMaxSuppression(center_point_box=bool(ctx.attr("center_point_box", 0)))
    ins = [ctx.input(i) for i in range(5)]
    return ctx.add1(op, ins)
