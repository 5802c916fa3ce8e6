"""Data movement: views as copies (reshape, flatten, squeeze, unsqueeze, identity-like), transpose,
concat, slice, split, gather, gather_nd, expand, pad, tile, trilu, and the generators (range,
shape, size, constant, constant_of_shape, dropout's outputs). Shapes are static; every kernel
writes its whole output."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import te, tirx

from ...ir.ops.shape import _clamp, slice_params
from .common import Unsupported, bload, builder, cast, const, flat_index, norm_axis, static_shape, tdtype, unflatten


@builder("reshape", "flatten", "squeeze", "unsqueeze")
def view_copy(op, ins, in_types, out_types):
    x = ins[0]
    in_shape = [int(d) for d in x.shape]
    shape = static_shape(out_types[0])
    if int(np.prod(in_shape)) != int(np.prod(shape)):
        raise Unsupported(f"{op.name}: {in_shape} -> {shape} changes the element count")
    return [te.compute(shape, lambda *i: x(*unflatten(flat_index(i, shape), in_shape)), name="out0")]


@builder("transpose")
def transpose(op, ins, in_types, out_types):
    x = ins[0]
    rank = len(x.shape)
    perm = list(op.perm) if op.perm is not None else list(reversed(range(rank)))
    perm = [norm_axis(p, rank) for p in perm]
    shape = static_shape(out_types[0])

    def f(*i: Any) -> Any:
        src = [None] * rank
        for o, p in enumerate(perm):
            src[p] = i[o]
        return x(*src)

    return [te.compute(shape, f, name="out0")]


@builder("concat")
def concat(op, ins, in_types, out_types):
    xs = [t for t in ins if t is not None]
    shape = static_shape(out_types[0])
    ax = norm_axis(op.axis, len(shape))
    xs = [t for t in xs if int(t.shape[ax]) > 0]
    offsets = []
    off = 0
    for t in xs:
        offsets.append(off)
        off += int(t.shape[ax])

    def f(*i: Any) -> Any:
        j = i[ax]
        val = None
        for k in range(len(xs) - 1, -1, -1):
            src = list(i)
            src[ax] = j - offsets[k]
            v = xs[k](*src)
            val = v if val is None else tirx.if_then_else(j < offsets[k + 1], v, val)
        return val

    return [te.compute(shape, f, name="out0")]


@builder("slice")
def slice_(op, ins, in_types, out_types):
    if any(t is not None for t in ins[1:]) or op.starts is None or op.ends is None:
        raise Unsupported("slice bounds given as runtime inputs")
    x = ins[0]
    in_shape = [int(d) for d in x.shape]
    shape = static_shape(out_types[0])
    begin = [0] * len(in_shape)
    step = [1] * len(in_shape)
    for a, s, _e, st in slice_params(op.starts, op.ends, op.axes, op.steps, len(in_shape)):
        d = in_shape[a]
        begin[a] = _clamp(s, d, st)
        step[a] = st
    return [te.compute(shape, lambda *i: x(*[b + j * s for b, j, s in zip(begin, i, step)]), name="out0")]


@builder("split")
def split(op, ins, in_types, out_types):
    x = ins[0]
    ax = norm_axis(op.axis, len(x.shape))
    outs = []
    off = 0
    for k, t in enumerate(out_types):
        shape = static_shape(t)
        outs.append(te.compute(shape, _shifted(x, ax, off), name=f"out{k}"))
        off += shape[ax]
    return outs


def _shifted(x: te.Tensor, ax: int, off: int) -> Any:
    def f(*i: Any) -> Any:
        src = list(i)
        src[ax] = i[ax] + off
        return x(*src)

    return f


def _norm_index(v: Any, dim: int) -> Any:
    v = cast(v, "int64")
    return tirx.Select(v < 0, v + dim, v)


@builder("gather")
def gather(op, ins, in_types, out_types):
    x, idx = ins
    rank = len(x.shape)
    ax = norm_axis(op.axis, rank)
    dim = int(x.shape[ax])
    shape = static_shape(out_types[0])
    q = len(idx.shape)

    def f(*i: Any) -> Any:
        j = _norm_index(idx(*i[ax:ax + q]), dim)
        return x(*i[:ax], j, *i[ax + q:])

    return [te.compute(shape, f, name="out0")]


@builder("gather_elements")
def gather_elements(op, ins, in_types, out_types):
    x, idx = ins
    ax = norm_axis(op.axis, len(x.shape))
    dim = int(x.shape[ax])
    shape = static_shape(out_types[0])

    def f(*i: Any) -> Any:
        src = list(i)
        src[ax] = _norm_index(idx(*i), dim)
        return x(*src)

    return [te.compute(shape, f, name="out0")]


@builder("gather_nd")
def gather_nd(op, ins, in_types, out_types):
    if op.batch_dims != 0:
        raise Unsupported("gather_nd with batch_dims")
    x, idx = ins
    m = int(idx.shape[-1])
    q = len(idx.shape) - 1
    shape = static_shape(out_types[0])
    dims = [int(d) for d in x.shape]

    def f(*i: Any) -> Any:
        lead = i[:q]
        src = [_norm_index(idx(*lead, k), dims[k]) for k in range(m)]
        return x(*src, *i[q:])

    return [te.compute(shape, f, name="out0")]


@builder("expand")
def expand(op, ins, in_types, out_types):
    return [te.compute(static_shape(out_types[0]), lambda *i: bload(ins[0], i), name="out0")]


@builder("tile")
def tile(op, ins, in_types, out_types):
    x = ins[0]
    dims = [int(d) for d in x.shape]
    return [te.compute(static_shape(out_types[0]), lambda *i: x(*[tirx.floormod(j, d) for j, d in zip(i, dims)]),
                       name="out0")]


@builder("pad")
def pad(op, ins, in_types, out_types):
    if len(ins) > 1 and ins[1] is not None or op.pads is None:
        raise Unsupported("pads given as a runtime input")
    if len(ins) > 3 and ins[3] is not None:
        raise Unsupported("pad axes given as a runtime input")
    x = ins[0]
    value = ins[2] if len(ins) > 2 else None
    dims = [int(d) for d in x.shape]
    rank = len(dims)
    axes = list(range(rank)) if op.axes is None else [norm_axis(a, rank) for a in op.axes]
    begin = [0] * rank
    for k, a in enumerate(axes):
        begin[a] = op.pads[k]
    shape = static_shape(out_types[0])

    def f(*i: Any) -> Any:
        src = [j - b for j, b in zip(i, begin)]
        if op.mode == "constant":
            inside = tirx.all(*[tirx.all(s >= 0, s < d) for s, d in zip(src, dims)]) if rank else tirx.const(True)
            fill = (value(*([0] * len(value.shape))) if value is not None and int(np.prod(
                [int(d) for d in value.shape])) > 0 else const(0, x.dtype))
            clamped = [tirx.max(tirx.min(s, d - 1), 0) for s, d in zip(src, dims)]
            return tirx.if_then_else(inside, x(*clamped), fill)
        if op.mode == "edge":
            return x(*[tirx.max(tirx.min(s, d - 1), 0) for s, d in zip(src, dims)])
        if op.mode == "wrap":
            return x(*[tirx.floormod(s, d) for s, d in zip(src, dims)])
        if op.mode == "reflect":
            out = []
            for s, d in zip(src, dims):
                if d == 1:
                    out.append(0)
                    continue
                p = 2 * (d - 1)
                r = tirx.floormod(s, p)
                out.append(tirx.Select(r < d, r, p - r))
            return x(*out)
        raise Unsupported(f"pad mode {op.mode}")

    if any(b < 0 for b in begin) or any(p < 0 for p in op.pads):
        if op.mode != "constant":
            raise Unsupported("negative pads with a non-constant mode")
    return [te.compute(shape, f, name="out0")]


@builder("trilu")
def trilu(op, ins, in_types, out_types):
    if len(ins) > 1 and ins[1] is not None:
        raise Unsupported("trilu k given as a runtime input")
    x = ins[0]

    def f(*i: Any) -> Any:
        d = i[-1] - i[-2]
        keep = d >= op.k if op.upper else d <= op.k
        return tirx.Select(keep, x(*i), const(0, x.dtype))

    return [te.compute(static_shape(out_types[0]), f, name="out0")]


@builder("range")
def range_(op, ins, in_types, out_types):
    start, _, delta = ins
    shape = static_shape(out_types[0])
    dt = tdtype(out_types[0].dtype)
    s = start(*([0] * len(start.shape)))
    d = delta(*([0] * len(delta.shape)))
    return [te.compute(shape, lambda i: cast(s + cast(i, dt) * d, dt), name="out0")]


def _table(values: np.ndarray, dt: str, shape: tuple[int, ...]) -> te.Tensor:
    """A tensor holding ``values`` (small: a select chain over the flat index)."""
    flat = values.reshape(-1)
    if flat.size > 256:
        raise Unsupported(f"constant of {flat.size} elements (turned into a weight by the lowering)")

    def f(*i: Any) -> Any:
        k = flat_index(i, shape)
        v = const(flat[-1].item(), dt)
        for n in range(flat.size - 2, -1, -1):
            v = tirx.Select(k == n, const(flat[n].item(), dt), v)
        return v

    return te.compute(shape, f, name="out0")


@builder("constant")
def constant(op, ins, in_types, out_types):
    shape = static_shape(out_types[0])
    dt = tdtype(out_types[0].dtype)
    return [_table(np.asarray(op.value), dt, shape)]


@builder("shape")
def shape_op(op, ins, in_types, out_types):
    dims = static_shape(in_types[0])
    start, end = op.start, op.end
    vals = np.array(dims[slice(start, end)], np.int64)
    return [_table(vals, "int64", static_shape(out_types[0]))]


@builder("size")
def size_op(op, ins, in_types, out_types):
    n = int(np.prod(static_shape(in_types[0])))
    return [te.compute(static_shape(out_types[0]), lambda *i: const(n, "int64"), name="out0")]


@builder("constant_of_shape")
def constant_of_shape(op, ins, in_types, out_types):
    shape = static_shape(out_types[0])
    dt = tdtype(out_types[0].dtype)
    v = np.asarray(op.value).reshape(-1)[0].item()
    return [te.compute(shape, lambda *i: const(v, dt), name="out0")]


@builder("dropout")
def dropout(op, ins, in_types, out_types):
    if any(t is not None for t in ins[1:]):
        raise Unsupported("dropout with ratio/training_mode inputs")
    x = ins[0]
    shape = static_shape(out_types[0])
    outs = [te.compute(shape, lambda *i: x(*i), name="out0")]
    if len(out_types) > 1:
        mdt = tdtype(out_types[1].dtype)
        outs.append(te.compute(static_shape(out_types[1]), lambda *i: const(1, mdt), name="out1"))
    return outs
