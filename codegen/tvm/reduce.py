"""Reductions (reduce_*), arg_max/arg_min, cumulative sums/products, softmax/log_softmax/hardmax and
the normalizations without a template (batch_norm in inference, lrn, layer_norm, rms_norm, lp_norm).
Floats accumulate in their own type (f32/f64), as the references do for f32/f64 inputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tvm import te, tirx, topi

from .common import Unsupported, builder, cast, const, norm_axis, static_shape


def _f(x: Any) -> bool:
    return str(x.dtype).startswith("float")


_prod = te.comm_reducer(lambda a, b: a * b, lambda t: tirx.const(1, t), name="prod")


def reduce_axes(x: te.Tensor, axes: Sequence[int], keepdims: bool,
                fn: Callable[[Any, list[Any]], Any], name: str) -> te.Tensor:
    """``fn(x[...], reduce_axes)`` over ``axes`` (normalized) of ``x``."""
    shape = [int(d) for d in x.shape]
    raxes = {a: te.reduce_axis((0, shape[a]), name=f"k{a}") for a in sorted(set(axes))}
    out_shape = [1 if i in raxes else d for i, d in enumerate(shape)] if keepdims else [
        d for i, d in enumerate(shape) if i not in raxes]

    def f(*idx: Any) -> Any:
        it = iter(idx)
        full = []
        for i in range(len(shape)):
            if i in raxes:
                full.append(raxes[i])
                if keepdims:
                    next(it)
            else:
                full.append(next(it))
        return fn(x(*full), [raxes[a] for a in sorted(raxes)])

    return te.compute(out_shape, f, name=name)


def _axes(op: Any, rank: int) -> tuple[int, ...] | None:
    if not op.axes:
        return None if op.noop_with_empty_axes else tuple(range(rank))
    return tuple(norm_axis(a, rank) for a in op.axes)


@builder("reduce_sum", "reduce_sum_square", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "reduce_l1",
         "reduce_l2", "reduce_log_sum", "reduce_log_sum_exp")
def reduce(op, ins, in_types, out_types):
    if len(ins) > 1 and ins[1] is not None:
        raise Unsupported("axes given as a runtime input")
    x = ins[0]
    if x.dtype == "bool":
        raise Unsupported("bool reduction")
    rank = len(x.shape)
    axes = _axes(op, rank)
    if axes is None:
        return [te.compute(x.shape, lambda *i: x(*i), name="out0")]
    n = 1
    for a in axes:
        n *= int(x.shape[a])
    kd = op.keepdims
    name = op.name
    if name == "reduce_sum":
        return [reduce_axes(x, axes, kd, lambda v, k: te.sum(v, axis=k), "out0")]
    if name == "reduce_sum_square":
        return [reduce_axes(x, axes, kd, lambda v, k: te.sum(v * v, axis=k), "out0")]
    if name == "reduce_l1":
        return [reduce_axes(x, axes, kd, lambda v, k: te.sum(tirx.abs(v), axis=k), "out0")]
    if name == "reduce_max":
        return [reduce_axes(x, axes, kd, lambda v, k: te.max(v, axis=k), "out0")]
    if name == "reduce_min":
        return [reduce_axes(x, axes, kd, lambda v, k: te.min(v, axis=k), "out0")]
    if name == "reduce_prod":
        return [reduce_axes(x, axes, kd, lambda v, k: _prod(v, axis=k), "out0")]
    if not _f(x):
        raise Unsupported(f"{name} on {x.dtype}")
    if name == "reduce_mean":
        s = reduce_axes(x, axes, kd, lambda v, k: te.sum(v, axis=k), "sum")
        return [te.compute(s.shape, lambda *i: s(*i) / const(n, x.dtype), name="out0")]
    if name == "reduce_l2":
        s = reduce_axes(x, axes, kd, lambda v, k: te.sum(v * v, axis=k), "sum")
        return [te.compute(s.shape, lambda *i: tirx.sqrt(s(*i)), name="out0")]
    if name == "reduce_log_sum":
        s = reduce_axes(x, axes, kd, lambda v, k: te.sum(v, axis=k), "sum")
        return [te.compute(s.shape, lambda *i: tirx.log(s(*i)), name="out0")]
    # log_sum_exp: max + log(sum(exp(x - max)))
    m = reduce_axes(x, axes, True, lambda v, k: te.max(v, axis=k), "maxelem")
    e = te.compute(x.shape, lambda *i: tirx.exp(x(*i) - m(*[0 if a in axes else j for a, j in enumerate(i)])),
                   name="e")
    s = reduce_axes(e, axes, True, lambda v, k: te.sum(v, axis=k), "sum")
    kshape = [int(d) for d in s.shape]

    def lse(*i: Any) -> Any:
        if kd:
            full = list(i)
        else:
            it = iter(i)
            full = [0 if a in axes else next(it) for a in range(rank)]
        return m(*full) + tirx.log(s(*full))

    out_shape = kshape if kd else [d for a, d in enumerate(kshape) if a not in axes]
    return [te.compute(out_shape, lse, name="out0")]


@builder("arg_max", "arg_min")
def arg_extreme(op, ins, in_types, out_types):
    x = ins[0]
    ax = norm_axis(op.axis, len(x.shape))
    f = topi.argmax if op.name == "arg_max" else topi.argmin
    r = f(x, axis=ax, keepdims=op.keepdims, select_last_index=op.select_last_index)
    return [te.compute(r.shape, lambda *i: cast(r(*i), "int64"), name="out0")]


@builder("cumulative")
def cumulative(op, ins, in_types, out_types):
    if len(ins) > 1 and ins[1] is not None or op.axis is None:
        raise Unsupported("axis given as a runtime input")
    x = ins[0]
    shape = static_shape(out_types[0])
    ax = norm_axis(op.axis, len(shape))
    n = shape[ax]
    k = te.reduce_axis((0, n), name="k")

    def f(*i: Any) -> Any:
        j, kv = i[ax], k.var
        if op.reverse:
            cond = kv > j if op.exclusive else kv >= j
        else:
            cond = kv < j if op.exclusive else kv <= j
        src = list(i)
        src[ax] = k
        if op.fn == "sum":
            return te.sum(tirx.Select(cond, x(*src), const(0, x.dtype)), axis=k)
        return _prod(tirx.Select(cond, x(*src), const(1, x.dtype)), axis=k)

    return [te.compute(shape, f, name="out0")]


def _coerce(op: Any, x: te.Tensor) -> tuple[te.Tensor, int, bool]:
    """(tensor, axis, reshaped): ``coerce_2d`` flattens to [outer, inner] around ``axis``."""
    rank = len(x.shape)
    ax = norm_axis(op.axis, rank)
    if not op.coerce_2d or ax == rank - 1:
        return x, ax, False
    outer, inner = 1, 1
    for i, d in enumerate(x.shape):
        if i < ax:
            outer *= int(d)
        else:
            inner *= int(d)
    return topi.reshape(x, (outer, inner)), 1, True


@builder("softmax", "log_softmax")
def softmax(op, ins, in_types, out_types):
    x = ins[0]
    if not _f(x):
        raise Unsupported(f"{op.name} on {x.dtype}")
    xr, ax, reshaped = _coerce(op, x)
    y = topi.nn.softmax(xr, axis=ax) if op.name == "softmax" else topi.nn.log_softmax(xr, axis=ax)
    if reshaped:
        y = topi.reshape(y, [int(d) for d in x.shape])
    return [y]


@builder("batch_norm")
def batch_norm(op, ins, in_types, out_types):
    x, scale, bias, mean, var = ins
    if not _f(x):
        raise Unsupported(f"batch_norm on {x.dtype}")
    shape = static_shape(out_types[0])
    dt = x.dtype

    def f(*i: Any) -> Any:
        c = i[1] if len(i) > 1 else 0
        y = (x(*i) - mean(c)) / tirx.sqrt(var(c) + const(op.eps, dt))
        return y * scale(c) + bias(c)

    return [te.compute(shape, f, name="out0")]


@builder("lrn")
def lrn(op, ins, in_types, out_types):
    (x,) = ins
    if not _f(x):
        raise Unsupported(f"lrn on {x.dtype}")
    shape = [int(d) for d in x.shape]
    c = shape[1]
    lo = (op.size - 1) // 2
    k = te.reduce_axis((0, op.size), name="k")
    dt = x.dtype

    def sq(*i: Any) -> Any:
        ch = i[1] - lo + k
        src = list(i)
        src[1] = ch
        v = x(*src)
        return te.sum(tirx.if_then_else(tirx.all(ch >= 0, ch < c), v * v, const(0, dt)), axis=k)

    acc = te.compute(shape, sq, name="acc")

    def f(*i: Any) -> Any:
        den = tirx.power(const(op.bias, dt) + const(op.alpha / op.size, dt) * acc(*i), const(op.beta, dt))
        return x(*i) / den

    return [te.compute(shape, f, name="out0")]


@builder("layer_norm", "rms_norm")
def row_norm(op, ins, in_types, out_types):
    if op.name == "layer_norm" and op.stats:
        raise Unsupported("layer_norm with statistics outputs")
    x = ins[0]
    if not _f(x):
        raise Unsupported(f"{op.name} on {x.dtype}")
    shape = [int(d) for d in x.shape]
    rank = len(shape)
    ax = norm_axis(op.axis, rank)
    axes = tuple(range(ax, rank))
    n = 1
    for a in axes:
        n *= shape[a]
    dt = "float64" if x.dtype == "float64" else "float32"
    xc = te.compute(shape, lambda *i: cast(x(*i), dt), name="xc")
    scale = ins[1] if len(ins) > 1 else None
    bias = ins[2] if len(ins) > 2 else None

    def pick(t: Any, i: Sequence[Any]) -> Any:
        r = len(t.shape)
        sub = list(i[rank - r:])
        return cast(t(*[0 if int(d) == 1 else j for d, j in zip(t.shape, sub)]), dt)

    kidx = lambda i: [0 if a in axes else j for a, j in enumerate(i)]  # noqa: E731
    if op.name == "rms_norm":
        ss = reduce_axes(xc, axes, True, lambda v, k: te.sum(v * v, axis=k), "ss")

        def f(*i: Any) -> Any:
            y = xc(*i) / tirx.sqrt(ss(*kidx(i)) / const(n, dt) + const(op.eps, dt))
            if scale is not None:
                y = y * pick(scale, i)
            return cast(y, x.dtype)

        return [te.compute(shape, f, name="out0")]
    s = reduce_axes(xc, axes, True, lambda v, k: te.sum(v, axis=k), "s")
    mean = te.compute(s.shape, lambda *i: s(*i) / const(n, dt), name="mean")
    d2 = te.compute(shape, lambda *i: (xc(*i) - mean(*kidx(i))) * (xc(*i) - mean(*kidx(i))), name="d2")
    var = reduce_axes(d2, axes, True, lambda v, k: te.sum(v, axis=k), "var")

    def g(*i: Any) -> Any:
        y = (xc(*i) - mean(*kidx(i))) / tirx.sqrt(var(*kidx(i)) / const(n, dt) + const(op.eps, dt))
        if scale is not None:
            y = y * pick(scale, i)
        if bias is not None:
            y = y + pick(bias, i)
        return cast(y, x.dtype)

    return [te.compute(shape, g, name="out0")]
