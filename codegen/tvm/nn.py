"""Matmul/gemm (plain, one thread per output) and the CNN ops: conv (N-d, NCHW..., groups, strides,
pads, dilations, auto_pad), max/avg/lp pooling (ceil_mode, count_include_pad) and the global pools.
Windows follow ``ir/ops/pool.py`` (ONNX): ceil-mode overhang never counts."""

from __future__ import annotations

from typing import Any

from tvm import te, tirx

from ...ir.ops.conv import resolve_pads, spatial_params
from ...ir.ops.pool import _geometry
from .common import Unsupported, bload, builder, const, static_shape
from .reduce import reduce_axes


def _f(x: Any) -> bool:
    return str(x.dtype).startswith("float")


@builder("matmul")
def matmul(op, ins, in_types, out_types):
    a, b = ins
    if not _f(a) or a.dtype != b.dtype:
        raise Unsupported(f"matmul on {a.dtype} x {b.dtype}")
    shape = static_shape(out_types[0])
    ra, rb = len(a.shape), len(b.shape)
    K = int(a.shape[-1])
    k = te.reduce_axis((0, K), name="k")

    def f(*i: Any) -> Any:
        if ra == 1 and rb == 1:
            return te.sum(a(k) * b(k), axis=k)
        if ra == 1:  # [K] x [..., K, N] -> [..., N]
            batch, n = i[:-1], i[-1]
            return te.sum(a(k) * bload_b(b, batch, k, n), axis=k)
        if rb == 1:  # [..., M, K] x [K] -> [..., M]
            batch, m = i[:-1], i[-1]
            return te.sum(bload_b(a, batch, m, k) * b(k), axis=k)
        batch, m, n = i[:-2], i[-2], i[-1]
        return te.sum(bload_b(a, batch, m, k) * bload_b(b, batch, k, n), axis=k)

    return [te.compute(shape, f, name="out0")]


def bload_b(t: te.Tensor, batch: tuple, r: Any, c: Any) -> Any:
    """``t[batch..., r, c]`` with ``t``'s batch dims broadcast against ``batch``."""
    nb = len(t.shape) - 2
    sub = list(batch[len(batch) - nb:]) if nb else []
    idx = [0 if int(d) == 1 else j for d, j in zip(t.shape[:nb], sub)]
    return t(*idx, r, c)


@builder("gemm")
def gemm(op, ins, in_types, out_types):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    if not _f(a):
        raise Unsupported(f"gemm on {a.dtype}")
    shape = static_shape(out_types[0])
    K = int(a.shape[0] if op.trans_a else a.shape[1])
    k = te.reduce_axis((0, K), name="k")
    dt = a.dtype

    def mm(m: Any, n: Any) -> Any:
        av = a(k, m) if op.trans_a else a(m, k)
        bv = b(n, k) if op.trans_b else b(k, n)
        return te.sum(av * bv, axis=k)

    ab = te.compute(shape, mm, name="ab")

    def f(m: Any, n: Any) -> Any:
        y = ab(m, n)
        if op.alpha != 1.0:
            y = y * const(op.alpha, dt)
        if c is not None:
            cv = bload(c, (m, n))
            y = y + (cv * const(op.beta, dt) if op.beta != 1.0 else cv)
        return y

    return [te.compute(shape, f, name="out0")]


def _inside(pos: Any, size: int) -> Any:
    return tirx.all(pos >= 0, pos < size)


@builder("conv")
def conv(op, ins, in_types, out_types):
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    if not _f(x):
        raise Unsupported(f"conv on {x.dtype}")
    xs = [int(d) for d in x.shape]
    ws = [int(d) for d in w.shape]
    n_sp = len(xs) - 2
    s, d, p = spatial_params(n_sp, op.strides, op.dilations, op.pads)
    kernel = ws[2:]
    p = resolve_pads(op.auto_pad, xs[2:], kernel, s, d, p)
    shape = static_shape(out_types[0])
    G = op.group
    cin_g = ws[1]
    cout_g = ws[0] // G
    rc = te.reduce_axis((0, cin_g), name="rc")
    rk = [te.reduce_axis((0, kk), name=f"r{i}") for i, kk in enumerate(kernel)]
    dt = x.dtype

    def f(*i: Any) -> Any:
        n, oc = i[0], i[1]
        ic = tirx.floordiv(oc, cout_g) * cin_g + rc if G > 1 else rc
        pos = [i[2 + j] * s[j] - p[j] + rk[j] * d[j] for j in range(n_sp)]
        ok = tirx.all(*[_inside(q, xs[2 + j]) for j, q in enumerate(pos)]) if n_sp else tirx.const(True)
        xv = tirx.if_then_else(ok, x(n, ic, *pos), const(0, dt))
        return te.sum(xv * w(oc, rc, *rk), axis=[rc, *rk])

    y = te.compute(shape, f, name="conv")
    if bias is None:
        return [y]
    return [te.compute(shape, lambda *i: y(*i) + bias(i[1]), name="out0")]


def _window_count(o: Any, k: int, s: int, d: int, pb: int, lo: int, hi: int) -> Any:
    """How many of the window's k taps at output ``o`` fall in [lo, hi) (input coordinates)."""
    start = o * s - pb
    kmin = tirx.max(tirx.floordiv(lo - start + d - 1, d), 0)
    kmax = tirx.min(tirx.floordiv(hi - 1 - start, d), k - 1)
    return tirx.max(kmax - kmin + 1, 0)


@builder("max_pool", "avg_pool", "lp_pool")
def pool(op, ins, in_types, out_types):
    if op.name == "max_pool" and (op.return_indices or len(out_types) > 1):
        raise Unsupported("max_pool indices")
    (x,) = ins
    xs = [int(v) for v in x.shape]
    n_sp = len(xs) - 2
    s, d, p, out_sp = _geometry(op, xs[2:])
    kernel = list(op.kernel_shape)
    shape = static_shape(out_types[0])
    rk = [te.reduce_axis((0, kk), name=f"r{i}") for i, kk in enumerate(kernel)]
    dt = x.dtype

    def taps(i: tuple) -> tuple[list[Any], Any]:
        pos = [i[2 + j] * s[j] - p[j] + rk[j] * d[j] for j in range(n_sp)]
        ok = tirx.all(*[_inside(q, xs[2 + j]) for j, q in enumerate(pos)])
        return pos, ok

    if op.name == "max_pool":
        low = tirx.min_value(dt)

        def fmax(*i: Any) -> Any:
            pos, ok = taps(i)
            return te.max(tirx.if_then_else(ok, x(i[0], i[1], *pos), low), axis=rk)

        return [te.compute(shape, fmax, name="out0")]
    if not _f(x):
        raise Unsupported(f"{op.name} on {x.dtype}")
    if op.name == "lp_pool":
        pw = float(op.p)

        def flp(*i: Any) -> Any:
            pos, ok = taps(i)
            v = tirx.if_then_else(ok, x(i[0], i[1], *pos), const(0, dt))
            return te.sum(tirx.power(tirx.abs(v), const(pw, dt)), axis=rk)

        acc = te.compute(shape, flp, name="acc")
        return [te.compute(shape, lambda *i: tirx.power(acc(*i), const(1.0 / pw, dt)), name="out0")]

    def fsum(*i: Any) -> Any:
        pos, ok = taps(i)
        return te.sum(tirx.if_then_else(ok, x(i[0], i[1], *pos), const(0, dt)), axis=rk)

    acc = te.compute(shape, fsum, name="acc")

    def favg(*i: Any) -> Any:
        cnt = None
        for j in range(n_sp):
            lo, hi = (-p[j], xs[2 + j] + p[n_sp + j]) if op.count_include_pad else (0, xs[2 + j])
            c = _window_count(i[2 + j], kernel[j], s[j], d[j], p[j], lo, hi)
            cnt = c if cnt is None else cnt * c
        return acc(*i) / cnt.astype(dt)

    return [te.compute(shape, favg, name="out0")]


@builder("global_avg_pool", "global_max_pool")
def global_pool(op, ins, in_types, out_types):
    (x,) = ins
    axes = tuple(range(2, len(x.shape)))
    if op.name == "global_max_pool":
        return [reduce_axes(x, axes, True, lambda v, k: te.max(v, axis=k), "out0")]
    if not _f(x):
        raise Unsupported(f"global_avg_pool on {x.dtype}")
    n = 1
    for a in axes:
        n *= int(x.shape[a])
    acc = reduce_axes(x, axes, True, lambda v, k: te.sum(v, axis=k), "acc")
    return [te.compute(acc.shape, lambda *i: acc(*i) / const(n, x.dtype), name="out0")]
