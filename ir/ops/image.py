"""Image ops: resize, grid_sample, affine_grid, roi_align, non_max_suppression.

``resize`` is separable: each resized axis is interpolated on its own, with per-output-index
neighbour indices and coefficients (nearest, linear, cubic, and their antialiased forms), as in
ONNX's reference. Computation is in float64, then cast back (integers round and saturate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..types import UNKNOWN, Dim, DType, TensorType

RESIZE_MODES = ("nearest", "linear", "cubic")
COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
               "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _saturate(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.round(x), info.min, info.max).astype(dtype)
    if dtype.kind == "b":
        return x != 0
    return x.astype(dtype)


# -- resize --------------------------------------------------------------------------------------------


def _coeffs(op: Resize, ratio: np.ndarray, integer: np.ndarray, scale: float) -> np.ndarray:
    """Interpolation coefficients ``(out, n)`` for the fractional positions ``ratio``."""
    r = np.where(integer, 1.0, ratio)[:, None]
    if op.mode == "nearest":
        nm = op.nearest_mode
        if nm == "round_prefer_floor":
            c = np.concatenate([r <= 0.5, r > 0.5], axis=1)
        elif nm == "round_prefer_ceil":
            c = np.concatenate([r < 0.5, r >= 0.5], axis=1)
        elif nm == "floor":
            c = np.concatenate([np.ones_like(r), np.zeros_like(r)], axis=1)
        else:
            c = np.concatenate([np.zeros_like(r), np.ones_like(r)], axis=1)
        c = np.where(integer[:, None], np.array([[0.0, 1.0]]), c.astype(np.float64))
        return c
    A = op.cubic_coeff_a
    if op.antialias:
        s = min(scale, 1.0)
        if op.mode == "linear":
            start = int(math.floor(-1 / s) + 1)
            args = (np.arange(start, start + 2 - 2 * start)[None, :] - r) * s
            c = np.clip(1 - np.abs(args), 0, 1)
        else:
            start = int(math.floor(-2 / s) + 1)
            args = np.abs(s * (np.arange(start, 2 - start)[None, :] - r))
            a2, a3 = args * args, args * args * args
            c = np.where(args <= 1, (A + 2) * a3 - (A + 3) * a2 + 1,
                         np.where(args < 2, A * a3 - 5 * A * a2 + 8 * A * args - 4 * A, 0.0))
        return c / c.sum(axis=1, keepdims=True)
    if op.mode == "linear":
        return np.concatenate([1 - r, r], axis=1)
    q = 1 - r
    return np.concatenate([
        ((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A,
        ((A + 2) * r - (A + 3)) * r * r + 1,
        ((A + 2) * q - (A + 3)) * q * q + 1,
        ((A * (q + 1) - 5 * A) * (q + 1) + 8 * A) * (q + 1) - 4 * A,
    ], axis=1)


def _source_coords(mode: str, y: np.ndarray, scale: float, in_w: int, out_w_int: int,
                   roi: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray | None]:
    out_w = scale * in_w
    extra = None
    if mode == "align_corners":
        x = np.zeros(out_w_int) if out_w == 1 else y * (in_w - 1) / (out_w - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        lo, hi = roi if roi is not None else (0.0, 1.0)
        if out_w == 1:
            x = np.full(out_w_int, (hi - lo) * (in_w - 1) / 2)
        else:
            x = y * (hi - lo) * (in_w - 1) / (out_w - 1)
        x = x + lo * (in_w - 1)
        extra = (x < 0) | (x > in_w - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out_w_int, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        adjustment = out_w_int / out_w
        offset = in_w / 2 * (1 - adjustment)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise OpError(f"coordinate_transformation_mode {mode!r} is not one of {COORD_MODES}")
    return x, extra


def _resize_axis(op: Resize, data: np.ndarray, axis: int, scale: float, out_n: int,
                 roi: tuple[float, float] | None) -> np.ndarray:
    in_w = data.shape[axis]
    if out_n == 0:
        shape = list(data.shape)
        shape[axis] = 0
        return np.empty(shape, data.dtype)
    y = np.arange(out_n, dtype=np.float64)
    x, extra = _source_coords(op.coordinate_transformation_mode, y, scale, in_w, out_n, roi)
    xi = np.floor(x)
    integer = x == xi
    coeffs = _coeffs(op, x - xi, integer, scale)
    n = coeffs.shape[1]
    pad = int(math.ceil(n / 2))
    xp = x + pad
    pp = np.floor(xp)
    frac = xp - pp
    if n % 2 == 0:
        off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        off = np.where(frac <= 0.5, base, base + 1)
    idx = (pp.astype(np.int64) + off)[:, None] + np.arange(n)[None, :] - pad
    if op.exclude_outside:
        coeffs = np.where((idx < 0) | (idx >= in_w), 0.0, coeffs)
        tot = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(tot == 0, 1.0, tot)
    idx = np.clip(idx, 0, in_w - 1)
    g = np.take(data, idx, axis=axis)  # (..., out, n, ...)
    shape = (1,) * axis + coeffs.shape + (1,) * (data.ndim - axis - 1)
    res = (g * coeffs.reshape(shape)).sum(axis=axis + 1)
    if extra is not None and extra.any():
        m = extra.reshape((1,) * axis + (out_n,) + (1,) * (data.ndim - axis - 1))
        res = np.where(m, op.extrapolation_value, res)
    return res


@register
@dataclass(frozen=True, eq=False)
class Resize(Op):
    """ONNX Resize (and Upsample). ``roi``/``scales``/``sizes`` fold into attributes when constant.

    ``axes`` lists the axes ``scales``/``sizes``/``roi`` refer to (empty: all axes).
    """

    name: ClassVar[str] = "resize"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 4)
    const_inputs: ClassVar[dict[int, str]] = {1: "roi", 2: "scales", 3: "sizes"}
    roi: tuple[float, ...] = ()
    scales: tuple[float, ...] = ()
    sizes: tuple[int, ...] = ()
    mode: str = "nearest"
    coordinate_transformation_mode: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    cubic_coeff_a: float = -0.75
    exclude_outside: bool = False
    extrapolation_value: float = 0.0
    antialias: bool = False
    keep_aspect_ratio_policy: str = "stretch"
    axes: tuple[int, ...] = ()

    def _check(self) -> None:
        if self.mode not in RESIZE_MODES:
            raise OpError(f"mode {self.mode!r} is not one of {RESIZE_MODES}")
        if self.coordinate_transformation_mode not in COORD_MODES:
            raise OpError(f"coordinate_transformation_mode {self.coordinate_transformation_mode!r} is "
                          f"not one of {COORD_MODES}")
        if self.nearest_mode not in NEAREST_MODES:
            raise OpError(f"nearest_mode {self.nearest_mode!r} is not one of {NEAREST_MODES}")
        if self.keep_aspect_ratio_policy not in ("stretch", "not_larger", "not_smaller"):
            raise OpError(f"keep_aspect_ratio_policy {self.keep_aspect_ratio_policy!r} is not supported")
        if self.scales and self.sizes:
            raise OpError("only one of scales and sizes may be given")

    def _plan(self, shape: Sequence[Dim], scales: Sequence[float], sizes: Sequence[int]
              ) -> tuple[list[int], list[float], list[Dim]]:
        """(axes, per-axis scales, output shape); dims not known statically are ``?``."""
        r = len(shape)
        axes = [a % r for a in self.axes] if self.axes else list(range(r))
        if len(set(axes)) != len(axes):
            raise OpError(f"axes {self.axes} has duplicates")
        full_scale = [1.0] * r
        out: list[Dim] = list(shape)
        if sizes:
            if len(sizes) != len(axes):
                raise OpError(f"sizes {tuple(sizes)} does not match {len(axes)} axes")
            sc = {a: (s / shape[a] if isinstance(shape[a], int) and shape[a] else math.nan)
                  for a, s in zip(axes, sizes)}
            if self.keep_aspect_ratio_policy != "stretch":
                vals = list(sc.values())
                one = min(vals) if self.keep_aspect_ratio_policy == "not_larger" else max(vals)
                for a in axes:
                    full_scale[a] = one
                    out[a] = int(one * shape[a] + 0.5) if isinstance(shape[a], int) and not math.isnan(one) \
                        else UNKNOWN
            else:
                for a, s in zip(axes, sizes):
                    full_scale[a] = sc[a]
                    out[a] = int(s)
        elif scales:
            if len(scales) != len(axes):
                raise OpError(f"scales {tuple(scales)} does not match {len(axes)} axes")
            for a, s in zip(axes, scales):
                if s <= 0:
                    raise OpError(f"scales must be positive, got {tuple(scales)}")
                full_scale[a] = float(s)
                out[a] = int(math.floor(s * shape[a])) if isinstance(shape[a], int) else UNKNOWN
        else:
            out = [UNKNOWN if i in axes else d for i, d in enumerate(shape)]
        return axes, full_scale, out

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "input X")
        self._check()
        if x.shape is None:
            return [TensorType(x.dtype, None)]
        if not self.scales and not self.sizes:
            dyn = [t for t in inputs[2:4] if t is not None and (t.shape is None or t.shape != (0,))]
            if not dyn:
                raise OpError("one of scales and sizes is required")
        _, _, out = self._plan(x.shape, self.scales, self.sizes)
        return [TensorType(x.dtype, tuple(out))]

    def ref(self, x: np.ndarray, roi: np.ndarray | None = None, scales: np.ndarray | None = None,
            sizes: np.ndarray | None = None) -> np.ndarray:
        sc = self.scales if scales is None or scales.size == 0 else tuple(float(v) for v in scales)
        sz = self.sizes if sizes is None or sizes.size == 0 else tuple(int(v) for v in sizes)
        ro = self.roi if roi is None or roi.size == 0 else tuple(float(v) for v in roi)
        axes, full_scale, out = self._plan(x.shape, sc, sz)
        r = x.ndim
        full_roi: list[tuple[float, float]] | None = None
        if ro:
            k = len(axes)
            full_roi = [(0.0, 1.0)] * r
            for i, a in enumerate(axes):
                full_roi[a] = (ro[i], ro[k + i])
        res = x.astype(np.float64)
        for a in axes:
            o = int(out[a])  # type: ignore[arg-type]
            rr = None if full_roi is None else full_roi[a]
            if math.isclose(full_scale[a], 1.0) and o == res.shape[a] and (rr is None or rr == (0.0, 1.0)):
                continue
            res = _resize_axis(self, res, a, full_scale[a], o, rr)
        return _saturate(res, x.dtype)



# -- grid sample / affine grid -------------------------------------------------------------------------


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    rng = hi - lo
    below, above = x < lo, x > hi
    dx = np.where(below, lo - x, x - hi)
    n = np.trunc(dx / rng) if rng > 0 else np.zeros_like(dx)
    r = dx - n * rng
    even = (n % 2) == 0
    return np.where(below, np.where(even, lo + r, hi - r), np.where(above, np.where(even, hi - r, lo + r), x))


def _cubic(t: np.ndarray, a: float = -0.75) -> list[np.ndarray]:
    t = np.abs(t)
    return [
        ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
        ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
    ]


GRID_MODES = ("nearest", "linear", "cubic")
GRID_PADDING = ("zeros", "border", "reflection")


@register
@dataclass(frozen=True, eq=False)
class GridSample(Op):
    """ONNX GridSample (2-d and 3-d): ``x (N, C, *S)``, ``grid (N, *out, n)`` in [-1, 1] (x, y, z order)."""

    name: ClassVar[str] = "grid_sample"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 2)
    mode: str = "linear"
    padding_mode: str = "zeros"
    align_corners: bool = False

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "input X")
        g = require(inputs[1], "grid")
        if self.mode not in GRID_MODES:
            raise OpError(f"mode {self.mode!r} is not one of {GRID_MODES}")
        if self.padding_mode not in GRID_PADDING:
            raise OpError(f"padding_mode {self.padding_mode!r} is not one of {GRID_PADDING}")
        if x.shape is None or g.shape is None:
            return [TensorType(x.dtype, None)]
        n = len(x.shape) - 2
        if n < 1 or len(g.shape) != n + 2 or (isinstance(g.shape[-1], int) and g.shape[-1] != n):
            raise OpError(f"grid {g} does not match input {x}")
        return [TensorType(x.dtype, (x.shape[0], x.shape[1], *g.shape[1:-1]))]

    def ref(self, x: np.ndarray, grid: np.ndarray) -> np.ndarray:
        N, C = x.shape[:2]
        dims = x.shape[2:]
        nd = len(dims)
        out_sp = grid.shape[1:-1]
        g = grid.reshape(N, -1, nd).astype(np.float64)[..., ::-1]  # spatial order
        coords, lo, hi = [], [], []
        for i, d in enumerate(dims):
            v = g[..., i]
            if self.align_corners:
                c, bl, bh = (v + 1) / 2 * (d - 1), 0.0, d - 1.0
            else:
                c, bl, bh = ((v + 1) * d - 1) / 2, -0.5, d - 0.5
            if self.mode == "nearest":
                c = np.rint(c)
            if self.padding_mode == "border":
                c = np.where((c < bl) | (c > bh), np.clip(c, 0, d - 1), c)
            elif self.padding_mode == "reflection":
                c = _reflect(c, bl, bh)
            coords.append(c)
            lo.append(bl)
            hi.append(bh)
        xf = x.reshape(N, C, -1).astype(np.float64)
        P = g.shape[1]
        bidx = np.arange(N)[:, None]

        def pixel(idx: list[np.ndarray]) -> np.ndarray:
            """Values ``(N, C, P)`` at integer coords, with the padding rule."""
            flat = np.zeros((N, P), np.int64)
            ok = np.ones((N, P), bool)
            for i, d in enumerate(dims):
                j = idx[i]
                if self.padding_mode == "zeros":
                    ok &= (j >= 0) & (j < d)
                    j = np.clip(j, 0, d - 1)
                elif self.padding_mode == "border":
                    j = np.clip(j, 0, d - 1)
                else:
                    j = np.clip(_reflect(j.astype(np.float64), lo[i], hi[i]).astype(np.int64), 0, d - 1)
                flat = flat * d + j
            vals = np.moveaxis(xf[bidx, :, flat], -1, 1)  # (N, C, P)
            return np.where(ok[:, None, :], vals, 0.0)

        if self.mode == "nearest":
            y = pixel([c.astype(np.int64) for c in coords])
        else:
            base = [np.floor(c) for c in coords]
            if self.mode == "linear":
                offs = [0, 1]
                ws = [[1 - (c - b), c - b] for c, b in zip(coords, base)]
            else:
                offs = [-1, 0, 1, 2]
                ws = [_cubic(c - b) for c, b in zip(coords, base)]
            y = np.zeros((N, C, P))
            for combo in np.ndindex(*(len(offs),) * nd):
                w = np.ones((N, P))
                idx = []
                for i, k in enumerate(combo):
                    w = w * ws[i][k]
                    idx.append(base[i].astype(np.int64) + offs[k])
                y += pixel(idx) * w[:, None, :]
        return y.reshape(N, C, *out_sp).astype(x.dtype)


@register
@dataclass(frozen=True, eq=False)
class AffineGrid(Op):
    """ONNX AffineGrid: ``theta (N, 2, 3)`` or ``(N, 3, 4)`` -> grid ``(N, *size[2:], 2|3)``."""

    name: ClassVar[str] = "affine_grid"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 2)
    const_inputs: ClassVar[dict[int, str]] = {1: "size"}
    size: tuple[int, ...] = ()
    align_corners: bool = False

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        t = require(inputs[0], "theta")
        if not t.dtype.is_float:
            raise OpError(f"theta must be float, got {t}")
        if not self.size:
            sz = inputs[1] if len(inputs) > 1 else None
            if sz is None:
                raise OpError("size is required")
            n = sz.shape[0] if sz.shape else UNKNOWN
            if not isinstance(n, int):
                return [TensorType(t.dtype, None)]
            return [TensorType(t.dtype, (UNKNOWN,) * (n - 1) + (n - 2,))]
        if len(self.size) not in (4, 5):
            raise OpError(f"size must have 4 or 5 elements, got {self.size}")
        nd = len(self.size) - 2
        return [TensorType(t.dtype, (self.size[0], *self.size[2:], nd))]

    def ref(self, theta: np.ndarray, size: np.ndarray | None = None) -> np.ndarray:
        sz = tuple(int(v) for v in size) if size is not None else self.size
        N, sp = sz[0], sz[2:]
        axes = []
        for d in sp:
            if self.align_corners:
                a = np.linspace(-1.0, 1.0, d) if d > 1 else np.zeros(1)
            else:
                a = (np.arange(d) * 2.0 + 1) / d - 1
            axes.append(a)
        mesh = np.meshgrid(*axes, indexing="ij")  # spatial order (D,) H, W
        pts = [m.reshape(-1) for m in mesh[::-1]]  # x, y, (z)
        base = np.stack(pts + [np.ones_like(pts[0])], axis=-1)  # (P, nd+1)
        th = theta.astype(np.float64)
        grid = np.einsum("pk,njk->npj", base, th)
        return grid.reshape(N, *sp, len(sp)).astype(theta.dtype)


# -- roi align -----------------------------------------------------------------------------------------


@register
@dataclass(frozen=True, eq=False)
class RoiAlign(Op):
    """ONNX RoiAlign: ``x (N, C, H, W)``, ``rois (R, 4)``, ``batch_indices (R,)``."""

    name: ClassVar[str] = "roi_align"
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 3)
    mode: str = "avg"
    output_height: int = 1
    output_width: int = 1
    sampling_ratio: int = 0
    spatial_scale: float = 1.0
    half_pixel: bool = True

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "input X")
        rois = require(inputs[1], "rois")
        require(inputs[2], "batch_indices")
        if self.mode not in ("avg", "max"):
            raise OpError(f"mode {self.mode!r} is not 'avg' or 'max'")
        if x.shape is not None and len(x.shape) != 4:
            raise OpError(f"input must be 4-d, got {x}")
        r = rois.shape[0] if rois.shape else UNKNOWN
        c = x.shape[1] if x.shape else UNKNOWN
        return [TensorType(x.dtype, (r, c, self.output_height, self.output_width))]

    def ref(self, x: np.ndarray, rois: np.ndarray, batch_indices: np.ndarray) -> np.ndarray:
        N, C, H, W = x.shape
        R = rois.shape[0]
        ph, pw = self.output_height, self.output_width
        out = np.zeros((R, C, ph, pw), np.float64)
        xf = x.reshape(N, C, H * W).astype(np.float64)
        off = 0.5 if self.half_pixel else 0.0
        for r in range(R):
            x0, y0, x1, y1 = (float(v) * self.spatial_scale - off for v in rois[r])
            rw, rh = x1 - x0, y1 - y0
            if not self.half_pixel:
                rw, rh = max(rw, 1.0), max(rh, 1.0)
            bh, bw = rh / ph, rw / pw
            gh = self.sampling_ratio if self.sampling_ratio > 0 else int(np.ceil(rh / ph))
            gw = self.sampling_ratio if self.sampling_ratio > 0 else int(np.ceil(rw / pw))
            count = max(gh * gw, 1)
            yy = y0 + np.arange(ph)[:, None] * bh + (np.arange(gh)[None, :] + 0.5) * bh / gh  # (ph, gh)
            xx = x0 + np.arange(pw)[:, None] * bw + (np.arange(gw)[None, :] + 0.5) * bw / gw  # (pw, gw)
            Y = np.broadcast_to(yy[:, None, :, None], (ph, pw, gh, gw))
            X = np.broadcast_to(xx[None, :, None, :], (ph, pw, gh, gw))
            valid = ~((Y < -1.0) | (Y > H) | (X < -1.0) | (X > W))
            Yc, Xc = np.maximum(Y, 0), np.maximum(X, 0)
            ylo, xlo = np.floor(Yc).astype(np.int64), np.floor(Xc).astype(np.int64)
            ytop, xtop = ylo >= H - 1, xlo >= W - 1
            ylo = np.where(ytop, H - 1, ylo)
            xlo = np.where(xtop, W - 1, xlo)
            yhi = np.where(ytop, H - 1, ylo + 1)
            xhi = np.where(xtop, W - 1, xlo + 1)
            Yc = np.where(ytop, ylo, Yc)
            Xc = np.where(xtop, xlo, Xc)
            ly, lx = Yc - ylo, Xc - xlo
            hy, hx = 1 - ly, 1 - lx
            img = xf[int(batch_indices[r])]  # (C, H*W)
            terms = []
            corners = ((hy * hx, ylo, xlo), (hy * lx, ylo, xhi), (ly * hx, yhi, xlo), (ly * lx, yhi, xhi))
            for w, yi, xi in corners:
                w = np.where(valid, w, 0.0)
                pos = np.where(valid, yi * W + xi, 0)
                terms.append(img[:, pos] * w)  # (C, ph, pw, gh, gw)
            if self.mode == "avg":
                out[r] = sum(terms).sum(axis=(-1, -2)) / count
            else:
                out[r] = np.maximum.reduce(terms).max(axis=(-1, -2))
        return out.astype(x.dtype)


# -- non-max suppression -------------------------------------------------------------------------------


@register
@dataclass(frozen=True, eq=False)
class NonMaxSuppression(Op):
    """ONNX NonMaxSuppression -> selected ``(K, 3)`` i64 triples ``[batch, class, box]``.

    ``max_output_boxes_per_class``, ``iou_threshold`` and ``score_threshold`` are attributes when
    constant (``None``: the input is absent or dynamic).
    """

    name: ClassVar[str] = "non_max_suppression"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 5)
    const_inputs: ClassVar[dict[int, str]] = {
        2: "max_output_boxes_per_class", 3: "iou_threshold", 4: "score_threshold"
    }
    center_point_box: bool = False
    max_output_boxes_per_class: int = 0
    iou_threshold: float = 0.0
    score_threshold: float | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        b = require(inputs[0], "boxes")
        require(inputs[1], "scores")
        if b.shape is not None and (len(b.shape) != 3 or b.shape[2] not in (4, UNKNOWN)):
            raise OpError(f"boxes must be (batch, boxes, 4), got {b}")
        return [TensorType(DType.i64, (UNKNOWN, 3))]

    def ref(self, boxes: np.ndarray, scores: np.ndarray, max_out: np.ndarray | None = None,
            iou: np.ndarray | None = None, score_th: np.ndarray | None = None) -> np.ndarray:
        mx = self.max_output_boxes_per_class if max_out is None else int(np.asarray(max_out).reshape(-1)[0])
        it = self.iou_threshold if iou is None else float(np.asarray(iou).reshape(-1)[0])
        st = self.score_threshold if score_th is None else float(np.asarray(score_th).reshape(-1)[0])
        b = boxes.astype(np.float64)
        if self.center_point_box:
            xc, yc, w, h = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
            y1, x1, y2, x2 = yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
        else:
            y1 = np.minimum(b[..., 0], b[..., 2])
            y2 = np.maximum(b[..., 0], b[..., 2])
            x1 = np.minimum(b[..., 1], b[..., 3])
            x2 = np.maximum(b[..., 1], b[..., 3])
        area = (y2 - y1) * (x2 - x1)
        out: list[tuple[int, int, int]] = []
        if mx <= 0:
            return np.zeros((0, 3), np.int64)
        for bi in range(scores.shape[0]):
            for ci in range(scores.shape[1]):
                sc = scores[bi, ci].astype(np.float64)
                order = np.argsort(-sc, kind="stable")
                if st is not None:
                    order = order[sc[order] > st]
                keep: list[int] = []
                for i in order:
                    if len(keep) >= mx:
                        break
                    ok = True
                    for j in keep:
                        ih = min(y2[bi, i], y2[bi, j]) - max(y1[bi, i], y1[bi, j])
                        iw = min(x2[bi, i], x2[bi, j]) - max(x1[bi, i], x1[bi, j])
                        inter = max(ih, 0.0) * max(iw, 0.0)
                        union = area[bi, i] + area[bi, j] - inter
                        if union > 0 and inter / union > it:
                            ok = False
                            break
                    if ok:
                        keep.append(int(i))
                out.extend((bi, ci, k) for k in keep)
        return np.array(out, np.int64).reshape(-1, 3)


__all__ = ["Resize", "GridSample", "AffineGrid", "RoiAlign", "NonMaxSuppression"]
