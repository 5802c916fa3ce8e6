"""Convolutions: conv, conv_transpose, col2im, deform_conv.

Spatial attributes follow ONNX: ``strides``/``dilations`` per spatial axis (empty: all 1), ``pads``
as ``(begin_0, ..., begin_n, end_0, ..., end_n)`` (empty: no padding), ``auto_pad`` one of
``NOTSET``, ``SAME_UPPER``, ``SAME_LOWER``, ``VALID`` (resolved from the input shape when the
importer cannot resolve it statically). Convolutions are vectorized: the sliding windows are a
strided view of the padded input, copied once into an im2col matrix and multiplied with the
weights.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..types import UNKNOWN, Dim, TensorType

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


# -- geometry shared by conv and pool ----------------------------------------------------------------


def spatial_params(
    n: int, strides: Sequence[int], dilations: Sequence[int], pads: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    s = tuple(strides) or (1,) * n
    d = tuple(dilations) or (1,) * n
    p = tuple(pads) or (0,) * (2 * n)
    if len(s) != n or len(d) != n or len(p) != 2 * n:
        raise OpError(
            f"strides {tuple(strides)}, dilations {tuple(dilations)} and pads {tuple(pads)} do not "
            f"match {n} spatial dimension(s)"
        )
    if any(v <= 0 for v in s + d):
        raise OpError("strides and dilations must be positive")
    return s, d, p


def resolve_pads(
    auto_pad: str,
    in_shape: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads: Sequence[int],
) -> tuple[int, ...]:
    """Explicit pads (begin..., end...) for ``auto_pad`` on a static spatial shape."""
    n = len(in_shape)
    if auto_pad == "NOTSET":
        return tuple(pads)
    if auto_pad == "VALID":
        return (0,) * (2 * n)
    if auto_pad not in AUTO_PADS:
        raise OpError(f"auto_pad {auto_pad!r} is not one of {AUTO_PADS}")
    begin, end = [], []
    for i in range(n):
        out = -(-in_shape[i] // strides[i])
        total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_shape[i])
        small, big = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else big)
        end.append(big if auto_pad == "SAME_UPPER" else small)
    return tuple(begin + end)


def conv_out_dim(size: Dim, k: int, s: int, d: int, pb: int, pe: int, ceil: bool = False) -> Dim:
    if not isinstance(size, int):
        return UNKNOWN
    span = (k - 1) * d + 1
    num = size + pb + pe - span
    if num < 0:
        raise OpError(f"the kernel (extent {span}) is larger than the padded input ({size + pb + pe})")
    if not ceil:
        return num // s + 1
    out = -(-num // s) + 1
    if (out - 1) * s >= size + pb:  # the last window must start inside the input or left pad
        out -= 1
    return out


def windows(xp: np.ndarray, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
            out: Sequence[int]) -> np.ndarray:
    """A read-only view ``(N, C, *out, *kernel)`` of the sliding windows of a padded input."""
    n = len(kernel)
    st = xp.strides
    shape = tuple(xp.shape[:2]) + tuple(out) + tuple(kernel)
    strides_ = tuple(st[:2]) + tuple(st[2 + i] * strides[i] for i in range(n)) + tuple(
        st[2 + i] * dilations[i] for i in range(n)
    )
    return np.lib.stride_tricks.as_strided(xp, shape, strides_, writeable=False)


def pad_spatial(x: np.ndarray, pads: Sequence[int], value: float = 0.0) -> np.ndarray:
    n = x.ndim - 2
    if not any(pads):
        return x
    if any(p < 0 for p in pads):  # negative pads crop
        sl = [slice(None), slice(None)] + [
            slice(max(0, -pads[i]), x.shape[2 + i] - max(0, -pads[n + i])) for i in range(n)
        ]
        x = x[tuple(sl)]
        pads = [max(0, p) for p in pads]
    widths = [(0, 0), (0, 0)] + [(pads[i], pads[n + i]) for i in range(n)]
    return np.pad(x, widths, mode="constant", constant_values=value)


def acc_dtype(dtype: np.dtype) -> np.dtype:
    return dtype if dtype in (np.float32, np.float64) else np.dtype(np.float32)


def _float_input(t: TensorType | None, what: str) -> TensorType:
    t = require(t, what)
    if not t.dtype.is_float:
        raise OpError(f"{what} must be a float tensor, got {t}")
    return t


# -- conv ----------------------------------------------------------------------------------------------


def conv_nd(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, strides: Sequence[int],
            dilations: Sequence[int], pads: Sequence[int], group: int) -> np.ndarray:
    """Grouped N-d convolution in the accumulation dtype (im2col + batched matmul)."""
    n_sp = x.ndim - 2
    N, C = x.shape[:2]
    M = w.shape[0]
    kernel = w.shape[2:]
    G = group
    Cg, Mg = C // G, M // G
    xp = pad_spatial(x, pads)
    out = [
        (xp.shape[2 + i] - ((kernel[i] - 1) * dilations[i] + 1)) // strides[i] + 1 for i in range(n_sp)
    ]
    L = int(np.prod(out))
    K = int(np.prod(kernel))
    wg = w.reshape(G, Mg, Cg * K)
    if K == 1 and all(s == 1 for s in strides):
        cols = xp.reshape(N, G, Cg, L)
    else:
        win = windows(xp, kernel, strides, dilations, out)  # (N, C, *out, *k)
        perm = (0, 1, *range(2 + n_sp, 2 + 2 * n_sp), *range(2, 2 + n_sp))
        cols = np.ascontiguousarray(win.transpose(perm)).reshape(N, G, Cg * K, L)
    y = np.matmul(wg, cols)  # (N, G, Mg, L)
    y = y.reshape(N, M, *out)
    if b is not None:
        y += b.reshape((1, M) + (1,) * n_sp).astype(y.dtype)
    return y


@register
@dataclass(frozen=True, eq=False)
class Conv(Op):
    """ONNX Conv: ``x (N, C, *S)``, ``w (M, C/group, *k)``, optional bias ``(M,)``."""

    name: ClassVar[str] = "conv"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 3)
    strides: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    group: int = 1
    auto_pad: str = "NOTSET"

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = _float_input(inputs[0], "input X")
        w = _float_input(inputs[1], "weight W")
        if x.dtype != w.dtype:
            raise OpError(f"X is {x.dtype.value} but W is {w.dtype.value}")
        if x.shape is None or w.shape is None:
            return [TensorType(x.dtype, None)]
        n = len(x.shape) - 2
        if n < 1 or len(w.shape) != n + 2:
            raise OpError(f"X {x} and W {w} must both have rank >= 3 and equal ranks")
        s, d, p = spatial_params(n, self.strides, self.dilations, self.pads)
        if self.auto_pad not in AUTO_PADS:
            raise OpError(f"auto_pad {self.auto_pad!r} is not one of {AUTO_PADS}")
        if self.group < 1:
            raise OpError(f"group must be >= 1, got {self.group}")
        C, M = x.shape[1], w.shape[0]
        if isinstance(C, int) and isinstance(w.shape[1], int) and C != w.shape[1] * self.group:
            raise OpError(f"X has {C} channels but W expects {w.shape[1]} x group {self.group}")
        if isinstance(M, int) and M % self.group:
            raise OpError(f"{M} output channels are not divisible by group {self.group}")
        b = inputs[2] if len(inputs) > 2 else None
        if b is not None and b.shape is not None and (len(b.shape) != 1 or not _eq(b.shape[0], M)):
            raise OpError(f"bias {b} must be 1-d with {M} elements")
        kernel = w.shape[2:]
        spatial: list[Dim] = []
        for i in range(n):
            k, size = kernel[i], x.shape[2 + i]
            if not isinstance(k, int) or not isinstance(size, int):
                spatial.append(UNKNOWN)
            elif self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                spatial.append(-(-size // s[i]))
            elif self.auto_pad == "VALID":
                spatial.append(conv_out_dim(size, k, s[i], d[i], 0, 0))
            else:
                spatial.append(conv_out_dim(size, k, s[i], d[i], p[i], p[n + i]))
        return [TensorType(x.dtype, (x.shape[0], M, *spatial))]

    def ref(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        n = x.ndim - 2
        s, d, p = spatial_params(n, self.strides, self.dilations, self.pads)
        p = resolve_pads(self.auto_pad, x.shape[2:], w.shape[2:], s, d, p)
        acc = acc_dtype(x.dtype)
        y = conv_nd(x.astype(acc, copy=False), w.astype(acc, copy=False),
                    None if b is None else b.astype(acc), s, d, p, self.group)
        return y.astype(x.dtype, copy=False)


def _eq(a: Dim, b: Dim) -> bool:
    return a == b or not isinstance(a, int) or not isinstance(b, int)


# -- conv transpose ------------------------------------------------------------------------------------


def col2im_add(cols: np.ndarray, full: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
               dilations: Sequence[int], in_sp: Sequence[int]) -> np.ndarray:
    """Scatter-add ``cols (N, M, *kernel, *in_sp)`` into an output ``(N, M, *full)``."""
    n = len(kernel)
    out = np.zeros(cols.shape[:2] + tuple(full), dtype=cols.dtype)
    for kidx in itertools.product(*[range(k) for k in kernel]):
        sl = tuple(
            slice(kidx[i] * dilations[i], kidx[i] * dilations[i] + (in_sp[i] - 1) * strides[i] + 1,
                  strides[i])
            for i in range(n)
        )
        out[(slice(None), slice(None)) + sl] += cols[(slice(None), slice(None)) + kidx]
    return out


def crop_spatial(y: np.ndarray, begin: Sequence[int], size: Sequence[int]) -> np.ndarray:
    """``y[..., begin_i : begin_i + size_i]`` per spatial axis, zero-filling outside ``y``."""
    n = len(begin)
    if all(b == 0 for b in begin) and tuple(size) == y.shape[2:]:
        return y
    out = np.zeros(y.shape[:2] + tuple(size), y.dtype)
    src, dst = [slice(None)] * 2, [slice(None)] * 2
    for i in range(n):
        lo, hi = begin[i], begin[i] + size[i]
        s_lo, s_hi = max(lo, 0), min(hi, y.shape[2 + i])
        if s_hi <= s_lo:
            return out
        src.append(slice(s_lo, s_hi))
        dst.append(slice(s_lo - lo, s_hi - lo))
    out[tuple(dst)] = y[tuple(src)]
    return out


def _transpose_geometry(op: ConvTranspose, in_sp: Sequence[int], kernel: Sequence[int]
                        ) -> tuple[list[int], list[int], list[int]]:
    """(full size, crop begin, output size) per spatial axis."""
    n = len(in_sp)
    s, d, p = spatial_params(n, op.strides, op.dilations, op.pads)
    op_ = tuple(op.output_padding) or (0,) * n
    full = [(in_sp[i] - 1) * s[i] + (kernel[i] - 1) * d[i] + 1 + op_[i] for i in range(n)]
    if op.output_shape or op.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = list(op.output_shape[-n:]) if op.output_shape else [in_sp[i] * s[i] for i in range(n)]
        begin = []
        for i in range(n):
            total = full[i] - target[i]
            if op.auto_pad == "SAME_UPPER":
                begin.append(total // 2)
            elif op.auto_pad == "SAME_LOWER":
                begin.append(total - total // 2)
            elif op.pads:
                begin.append(p[i])
            else:
                begin.append(0)
        return full, begin, target
    if op.auto_pad == "VALID":
        p = (0,) * (2 * n)
    return full, [p[i] for i in range(n)], [full[i] - p[i] - p[n + i] for i in range(n)]


@register
@dataclass(frozen=True, eq=False)
class ConvTranspose(Op):
    """ONNX ConvTranspose: ``x (N, C, *S)``, ``w (C, M/group, *k)``, optional bias ``(M,)``."""

    name: ClassVar[str] = "conv_transpose"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 3)
    strides: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    group: int = 1
    auto_pad: str = "NOTSET"
    output_padding: tuple[int, ...] = ()
    output_shape: tuple[int, ...] = ()

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = _float_input(inputs[0], "input X")
        w = _float_input(inputs[1], "weight W")
        if x.dtype != w.dtype:
            raise OpError(f"X is {x.dtype.value} but W is {w.dtype.value}")
        if x.shape is None or w.shape is None:
            return [TensorType(x.dtype, None)]
        n = len(x.shape) - 2
        if n < 1 or len(w.shape) != n + 2:
            raise OpError(f"X {x} and W {w} must both have rank >= 3 and equal ranks")
        spatial_params(n, self.strides, self.dilations, self.pads)
        if self.auto_pad not in AUTO_PADS:
            raise OpError(f"auto_pad {self.auto_pad!r} is not one of {AUTO_PADS}")
        if self.output_padding and len(self.output_padding) != n:
            raise OpError(f"output_padding {self.output_padding} does not match {n} spatial dims")
        if not _eq(x.shape[1], w.shape[0]):
            raise OpError(f"X has {x.shape[1]} channels but W has {w.shape[0]}")
        M = w.shape[1] if not isinstance(w.shape[1], int) else w.shape[1] * self.group
        kernel, in_sp = w.shape[2:], x.shape[2:]
        if all(isinstance(v, int) for v in (*kernel, *in_sp)):
            _, _, size = _transpose_geometry(self, in_sp, kernel)  # type: ignore[arg-type]
            spatial: tuple[Dim, ...] = tuple(size)
        elif self.output_shape:
            spatial = tuple(self.output_shape[-n:])
        else:
            spatial = (UNKNOWN,) * n
        return [TensorType(x.dtype, (x.shape[0], M, *spatial))]

    def ref(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        n = x.ndim - 2
        s, d, _ = spatial_params(n, self.strides, self.dilations, self.pads)
        N, C = x.shape[:2]
        G = self.group
        Cg, Mg = C // G, w.shape[1]
        kernel, in_sp = w.shape[2:], x.shape[2:]
        K, L = int(np.prod(kernel)), int(np.prod(in_sp))
        acc = acc_dtype(x.dtype)
        wg = w.astype(acc, copy=False).reshape(G, Cg, Mg * K).transpose(0, 2, 1)
        cols = np.matmul(wg, x.astype(acc, copy=False).reshape(N, G, Cg, L))  # (N, G, Mg*K, L)
        cols = cols.reshape(N, G * Mg, *kernel, *in_sp)
        full, begin, size = _transpose_geometry(self, in_sp, kernel)
        y = crop_spatial(col2im_add(cols, full, kernel, s, d, in_sp), begin, size)
        if b is not None:
            y = y + b.astype(acc).reshape((1, -1) + (1,) * n)
        return y.astype(x.dtype, copy=False)


# -- col2im --------------------------------------------------------------------------------------------


@register
@dataclass(frozen=True, eq=False)
class Col2Im(Op):
    """ONNX Col2Im: ``x (N, C*prod(block), L)`` -> ``(N, C, *image_shape)``."""

    name: ClassVar[str] = "col2im"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 3)
    const_inputs: ClassVar[dict[int, str]] = {1: "image_shape", 2: "block_shape"}
    image_shape: tuple[int, ...] = ()
    block_shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "input")
        if x.shape is not None and len(x.shape) != 3:
            raise OpError(f"input must be 3-d (N, C*prod(block), L), got {x}")
        if not self.image_shape or not self.block_shape:
            if len(inputs) < 3 or inputs[1] is None or inputs[2] is None:
                raise OpError("image_shape and block_shape are required")
            n = inputs[1].shape[0] if inputs[1].shape else UNKNOWN
            rank = n + 2 if isinstance(n, int) else None
            return [TensorType(x.dtype, None if rank is None else (UNKNOWN,) * rank)]
        K = int(np.prod(self.block_shape))
        c: Dim = UNKNOWN
        if x.shape is not None and isinstance(x.shape[1], int):
            if x.shape[1] % K:
                raise OpError(f"dim 1 ({x.shape[1]}) is not divisible by prod(block_shape) {K}")
            c = x.shape[1] // K
        batch = x.shape[0] if x.shape is not None else UNKNOWN
        return [TensorType(x.dtype, (batch, c, *self.image_shape))]

    def ref(self, x: np.ndarray, image_shape: np.ndarray | None = None,
            block_shape: np.ndarray | None = None) -> np.ndarray:
        img = tuple(int(v) for v in (image_shape if image_shape is not None else self.image_shape))
        blk = tuple(int(v) for v in (block_shape if block_shape is not None else self.block_shape))
        n = len(img)
        s, d, p = spatial_params(n, self.strides, self.dilations, self.pads)
        in_sp = [conv_out_dim(img[i], blk[i], s[i], d[i], p[i], p[n + i]) for i in range(n)]
        N, CK, _ = x.shape
        K = int(np.prod(blk))
        cols = x.reshape(N, CK // K, *blk, *in_sp)  # type: ignore[misc]
        full = [img[i] + p[i] + p[n + i] for i in range(n)]
        y = col2im_add(cols, full, blk, s, d, in_sp)  # type: ignore[arg-type]
        return crop_spatial(y, p[:n], img).astype(x.dtype, copy=False)


# -- deformable conv -----------------------------------------------------------------------------------


def bilinear_sample_2d(img: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Bilinear samples of ``img (B, C, H, W)`` at float coords ``(B, *P)``; zero outside."""
    B, C, H, W = img.shape
    y0, x0 = np.floor(ys), np.floor(xs)
    out = np.zeros((B, C) + ys.shape[1:], dtype=img.dtype)
    flat = img.reshape(B, C, H * W)
    bidx = np.arange(B).reshape((B,) + (1,) * (ys.ndim - 1))
    for dy in (0, 1):
        for dx in (0, 1):
            yy, xx = y0 + dy, x0 + dx
            wgt = (1 - np.abs(ys - yy)) * (1 - np.abs(xs - xx))
            ok = (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
            idx = (np.clip(yy, 0, H - 1) * W + np.clip(xx, 0, W - 1)).astype(np.int64)
            vals = flat[bidx, :, idx]  # (B, *P, C)
            vals = np.moveaxis(vals, -1, 1)
            out += vals * np.where(ok, wgt, 0).astype(img.dtype)[:, None]
    return out


@register
@dataclass(frozen=True, eq=False)
class DeformConv(Op):
    """ONNX DeformConv (2-d): ``x, w, offset, bias?, mask?``."""

    name: ClassVar[str] = "deform_conv"
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 5)
    strides: tuple[int, ...] = ()
    pads: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    group: int = 1
    offset_group: int = 1

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = _float_input(inputs[0], "input X")
        w = _float_input(inputs[1], "weight W")
        off = require(inputs[2], "offset")
        if x.shape is None or w.shape is None:
            return [TensorType(x.dtype, None)]
        if len(x.shape) != 4 or len(w.shape) != 4:
            raise OpError("deform_conv supports 2-d inputs only")
        if off.shape is not None:
            return [TensorType(x.dtype, (x.shape[0], w.shape[0], *off.shape[2:]))]
        n = 2
        s, d, p = spatial_params(n, self.strides, self.dilations, self.pads)
        sp = [
            conv_out_dim(x.shape[2 + i], w.shape[2 + i], s[i], d[i], p[i], p[n + i])  # type: ignore[arg-type]
            for i in range(n)
        ]
        return [TensorType(x.dtype, (x.shape[0], w.shape[0], *sp))]

    def ref(self, x: np.ndarray, w: np.ndarray, offset: np.ndarray, b: np.ndarray | None = None,
            mask: np.ndarray | None = None) -> np.ndarray:
        s, d, p = spatial_params(2, self.strides, self.dilations, self.pads)
        N, C, H, W = x.shape
        M, Cg, kh, kw = w.shape
        oh, ow = offset.shape[2:]
        OG = self.offset_group
        acc = acc_dtype(x.dtype)
        xa = x.astype(acc)
        # base sampling positions (kh, kw, oh, ow)
        ki = np.arange(kh).reshape(kh, 1, 1, 1) * d[0]
        kj = np.arange(kw).reshape(1, kw, 1, 1) * d[1]
        oi = np.arange(oh).reshape(1, 1, oh, 1) * s[0] - p[0]
        oj = np.arange(ow).reshape(1, 1, 1, ow) * s[1] - p[1]
        off = offset.astype(acc).reshape(N, OG, kh, kw, 2, oh, ow)
        ys = ki + oi + off[:, :, :, :, 0]  # (N, OG, kh, kw, oh, ow)
        xs = kj + oj + off[:, :, :, :, 1]
        cpg = C // OG
        imgs = xa.reshape(N * OG, cpg, H, W)
        pts = (N * OG, kh, kw, oh, ow)
        samp = bilinear_sample_2d(imgs, ys.reshape(pts), xs.reshape(pts))
        samp = samp.reshape(N, C, kh, kw, oh, ow)
        if mask is not None:
            mk = mask.astype(acc).reshape(N, OG, 1, kh, kw, oh, ow)
            samp = (samp.reshape(N, OG, cpg, kh, kw, oh, ow) * mk).reshape(N, C, kh, kw, oh, ow)
        G = self.group
        cols = samp.reshape(N, G, Cg * kh * kw, oh * ow)
        y = np.matmul(w.astype(acc).reshape(G, M // G, Cg * kh * kw), cols).reshape(N, M, oh, ow)
        if b is not None:
            y = y + b.astype(acc).reshape(1, M, 1, 1)
        return y.astype(x.dtype, copy=False)


__all__ = [
    "Conv", "ConvTranspose", "Col2Im", "DeformConv", "conv_nd", "windows", "pad_spatial",
    "resolve_pads", "spatial_params", "conv_out_dim", "acc_dtype", "bilinear_sample_2d",
]
