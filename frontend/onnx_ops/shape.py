"""Converters for shape and data-movement ops (Reshape, Shape, Concat, Slice, Pad, ...).

Besides mapping each ONNX variant onto one core op, these converters keep shapes exact through the
``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` chains that exporters emit:

- a node whose inputs are all small constants is evaluated at import (``emit``);
- ``symbolic_value`` reads the content of a small integer tensor from the graph that computes it
  (``shape(x: f32[B,S,64])`` holds ``[B, S, 64]``); a result that is fully static becomes a constant,
  and a partly symbolic target becomes the symbolic ``shape`` hint of ``reshape``/``expand``/
  ``constant_of_shape`` (the runtime input stays and gives the exact values).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import numpy as np

from ...ir.graph import Value
from ...ir.op import Op, fold_const_input
from ...ir.ops.shape import (
    CenterCropPad,
    Concat,
    ConstantOfShape,
    DepthToSpace,
    Expand,
    EyeLike,
    Flatten,
    Pad,
    Range,
    Reshape,
    ReverseSequence,
    ShapeOf,
    Size,
    Slice,
    SpaceToDepth,
    Split,
    Squeeze,
    Tile,
    Transpose,
    Trilu,
    Unsqueeze,
)
from ...ir.types import UNKNOWN, Dim, DType, dim_add, dim_mul
from ..onnx import FOLD_LIMIT, NodeContext, Unsupported, converter, dtype_from_onnx

#: Integer tensors up to this many elements are tracked symbolically.
SYM_LIMIT = 64


# -- symbolic contents of small integer tensors ----------------------------------------------------


def _sym_binary(fn: str, a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        if fn == "add":
            return a + b
        if fn == "sub":
            return a - b
        if fn == "mul":
            return a * b
        if fn == "div" and b != 0:
            q = abs(a) // abs(b)  # integer Div truncates toward zero
            return q if (a >= 0) == (b >= 0) else -q
        return UNKNOWN
    if fn == "add":
        return dim_add(a, b)
    if fn == "mul":
        return dim_mul(a, b)
    if fn == "sub" and b == 0:
        return a
    if fn == "div" and b != 0 and a != UNKNOWN and b != UNKNOWN:
        from ...ir.ops.shape import dim_div

        if b == 1:
            return a
        q = dim_div(a, b)
        return UNKNOWN if q is None else q
    return UNKNOWN


#: Values never change once built, so their symbolic contents are cached.
_SYM_CACHE: weakref.WeakKeyDictionary[Value, list[Dim] | None] = weakref.WeakKeyDictionary()


def symbolic_value(ctx: NodeContext, v: Value | None, depth: int = 0) -> list[Dim] | None:
    """The flattened content of a small integer tensor: ints, symbols, or ``"?"`` where unknown."""
    if v is None or not (v.type.dtype.is_int or v.type.dtype is DType.bool) or v.type.shape is None:
        return None
    if depth > 48:  # too deep to follow (not cached: a shallower query may get further)
        n = v.type.numel()
        return None if n is None or n > SYM_LIMIT else [UNKNOWN] * n
    if v in _SYM_CACHE:
        cached = _SYM_CACHE[v]
        return None if cached is None else list(cached)
    out = _symbolic_value(ctx, v, depth)
    _SYM_CACHE[v] = out
    return None if out is None else list(out)


def _symbolic_value(ctx: NodeContext, v: Value, depth: int) -> list[Dim] | None:
    numel = v.type.numel()
    if numel is None or numel > SYM_LIMIT:
        return None
    arr = ctx.const_value(v)
    if arr is not None:
        return [int(x) for x in np.asarray(arr).reshape(-1)]
    unknown: list[Dim] = [UNKNOWN] * numel
    node = v.producer
    if node is None:
        return unknown
    op = node.op
    ins = node.inputs

    def sub(i: int) -> list[Dim] | None:
        return symbolic_value(ctx, ins[i], depth + 1) if i < len(ins) else None

    out: list[Dim] | None = None
    if op.name == "shape" and ins[0] is not None and ins[0].type.shape is not None:
        out = list(op.dims(ins[0].type.shape))  # type: ignore[attr-defined]
    elif op.name == "size" and ins[0] is not None and ins[0].type.shape is not None:
        from ...ir.ops.shape import numel_dim

        out = [numel_dim(ins[0].type.shape)]
    elif op.name in ("identity", "reshape", "unsqueeze", "squeeze", "flatten") or (
        op.name == "cast" and getattr(op, "to", None) is not None and op.to.is_int  # type: ignore
    ):
        out = sub(0)
    elif op.name == "concat":
        parts = [symbolic_value(ctx, x, depth + 1) for x in ins]
        if all(p is not None for p in parts) and v.type.rank == 1:
            out = [d for p in parts for d in p]  # type: ignore[union-attr]
    elif op.name == "gather" and getattr(op, "axis", None) in (0, -1) and ins[0] is not None:
        data = sub(0)
        idx = ctx.const_value(ins[1])
        if data is not None and idx is not None and ins[0].type.rank == 1:
            n = len(data)
            flat = [int(i) for i in np.asarray(idx).reshape(-1)]
            if all(-n <= i < n for i in flat):
                out = [data[i] for i in flat]
    elif op.name == "slice" and ins[0] is not None and ins[0].type.rank == 1 and all(
        x is None for x in ins[1:]
    ):
        data = sub(0)
        if data is not None:
            try:
                picks = op.ref(np.arange(len(data)))
                out = [data[int(i)] for i in np.asarray(picks).reshape(-1)]
            except Exception:
                out = None
    elif _fn(op) in ("add", "sub", "mul", "div") and len(ins) == 2:
        a, b = _bcast(sub(0), sub(1))
        if a is not None and b is not None:
            out = [_sym_binary(_fn(op), p, q) for p, q in zip(a, b)]
    elif _fn(op) in _COMPARE_FNS and len(ins) == 2:
        a, b = _bcast(sub(0), sub(1))
        if a is not None and b is not None:
            out = [_sym_compare(_COMPARE_FNS[_fn(op)], p, q) for p, q in zip(a, b)]
    elif op.name == "where":
        c = sub(0)
        a, b = _bcast(sub(1), sub(2))
        if c is not None and a is not None and b is not None:
            c, a = _bcast(c, a)
            _, b = _bcast(c, b)
        if c is not None and a is not None and b is not None:
            out = [p if k == 1 else q if k == 0 else (p if p == q else UNKNOWN) for k, p, q in zip(c, a, b)]
    if out is None or len(out) != numel:
        return unknown
    return out


#: Comparison ops by name (or ``fn``) -> the short name used here.
_COMPARE_FNS = {"equal": "eq", "less": "lt", "greater": "gt", "less_equal": "le", "greater_equal": "ge",
                "eq": "eq", "lt": "lt", "gt": "gt", "le": "le", "ge": "ge"}


def _fn(op: Op) -> str:
    """The elementwise function of an op (ops are named by it, or carry it as ``fn``)."""
    fn = getattr(op, "fn", None)
    return fn if isinstance(fn, str) and fn else op.name


def _bcast(a: list[Dim] | None, b: list[Dim] | None) -> tuple[list[Dim] | None, list[Dim] | None]:
    """Flat contents of equal length, a one-element side repeated; (None, None) otherwise."""
    if a is None or b is None:
        return None, None
    if len(a) == 1:
        a = a * len(b)
    elif len(b) == 1:
        b = b * len(a)
    return (a, b) if len(a) == len(b) else (None, None)


def _sym_compare(fn: str, a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return int({"eq": a == b, "lt": a < b, "gt": a > b, "le": a <= b, "ge": a >= b}[fn])
    if a == UNKNOWN or b == UNKNOWN or fn != "eq":
        return UNKNOWN
    if a == b:
        return 1
    if isinstance(a, int) and a < 0 or isinstance(b, int) and b < 0:
        return 0  # a symbolic dim is never negative
    return UNKNOWN


def _all_int(vals: Sequence[Dim] | None) -> bool:
    return vals is not None and all(isinstance(d, int) for d in vals)


def sym_hint(ctx: NodeContext, v: Value | None) -> tuple[int | str, ...] | None:
    """A symbolic hint for a shape-like input that is not a constant (None if it adds nothing)."""
    if v is None or ctx.const_value(v) is not None:
        return None
    vals = symbolic_value(ctx, v)
    if vals is None or all(d == UNKNOWN for d in vals) or v.type.rank != 1:
        return None
    return tuple(vals)


def constify(ctx: NodeContext, v: Value | None) -> Value | None:
    """``v`` as a constant when its symbolic content is fully static."""
    if v is None or ctx.const_value(v) is not None:
        return v
    vals = symbolic_value(ctx, v)
    if _all_int(vals) and v.type.is_static:
        arr = np.array(vals, dtype=v.type.dtype.np).reshape(v.type.shape)  # type: ignore[arg-type]
        return ctx.const(arr)
    return v


def emit(ctx: NodeContext, op: Op, inputs: Sequence[Value | None]) -> list[Value]:
    """Add ``op``: evaluated now when all its inputs are small constants, and replaced by a constant
    when its output is a small integer tensor whose content is fully static."""
    ins = list(inputs)
    for i in op.const_inputs:
        if i < len(ins):
            ins[i] = constify(ctx, ins[i])
    arrays = [None if x is None else ctx.const_value(x) for x in ins]
    if all(a is not None for a, x in zip(arrays, ins) if x is not None):
        folded, fins = op, list(ins)  # constant parameters into attributes, so the types are exact
        for i in op.const_inputs:
            if i < len(fins) and fins[i] is not None:
                folded = fold_const_input(folded, i, arrays[i])  # type: ignore[arg-type]
                fins[i] = arrays[i] = None
        try:
            types = folded.infer([None if x is None else x.type for x in fins])
        except Exception:
            types = []
        sizes = [t.numel() for t in types]
        if types and all(n is not None for n in sizes) and sum(sizes) <= FOLD_LIMIT:  # type: ignore
            outs = folded.run(*arrays)
            return [ctx.const(np.asarray(o)) for o in outs]
    outs = ctx.add(op, ins)
    if len(outs) == 1 and outs[0].type.dtype.is_int and outs[0].type.is_static:
        vals = symbolic_value(ctx, outs[0])
        if _all_int(vals):
            arr = np.array(vals, dtype=outs[0].type.dtype.np).reshape(outs[0].type.shape)  # type: ignore
            return [ctx.const(arr)]
    return outs


def emit1(ctx: NodeContext, op: Op, inputs: Sequence[Value | None]) -> Value:
    return emit(ctx, op, inputs)[0]


def _ints(v: object) -> tuple[int, ...] | None:
    if v is None:
        return None
    return tuple(int(x) for x in np.asarray(v).reshape(-1))


# -- converters -------------------------------------------------------------------------------------


@converter("Reshape")
def _reshape(ctx: NodeContext):
    allowzero = bool(ctx.attr("allowzero", 0))
    if ctx.opset < 5:
        return emit1(ctx, Reshape(shape=_ints(ctx.attr("shape")), allowzero=allowzero), [ctx.input(0)])
    s = ctx.input(1)
    return emit1(ctx, Reshape(shape=sym_hint(ctx, s), allowzero=allowzero), [ctx.input(0), s])


@converter("Shape")
def _shape(ctx: NodeContext):
    end = ctx.attr("end")
    return emit1(ctx, ShapeOf(start=int(ctx.attr("start", 0)), end=None if end is None else int(end)),
                 [ctx.input(0)])


@converter("Size")
def _size(ctx: NodeContext):
    return emit1(ctx, Size(), [ctx.input(0)])


@converter("Transpose")
def _transpose(ctx: NodeContext):
    return emit1(ctx, Transpose(perm=_ints(ctx.attr("perm"))), [ctx.input(0)])


@converter("Concat")
def _concat(ctx: NodeContext):
    axis = int(ctx.attr("axis", 1 if ctx.opset < 4 else 0))
    ins = [x for x in ctx.inputs if x is not None]
    return emit1(ctx, Concat(axis=axis), ins)


@converter("Split")
def _split(ctx: NodeContext):
    axis = int(ctx.attr("axis", 0))
    n = ctx.num_outputs
    if ctx.attr("num_outputs") is not None and int(ctx.attr("num_outputs")) != n:
        raise Unsupported(f"num_outputs={ctx.attr('num_outputs')} but the node has {n} outputs")
    if ctx.opset < 13:
        split = _ints(ctx.attr("split"))
        return emit(ctx, Split(axis=axis, num_outputs=n, split=split or None), [ctx.input(0)])
    return emit(ctx, Split(axis=axis, num_outputs=n), [ctx.input(0), ctx.input(1)])


@converter("Slice")
def _slice(ctx: NodeContext):
    if ctx.opset < 10:
        op = Slice(
            starts=_ints(ctx.attr("starts")), ends=_ints(ctx.attr("ends")), axes=_ints(ctx.attr("axes"))
        )
        return emit1(ctx, op, [ctx.input(0)])
    ins = [ctx.input(i) for i in range(5)]
    ins[2] = _whole_axis_ends(ctx, ins)
    return emit1(ctx, Slice(), ins)


_INT64_MAX = 2**63 - 1


def _whole_axis_ends(ctx: NodeContext, ins: list[Value | None]) -> Value | None:
    """Runtime ``ends`` that equal the sliced dims (``x[:, :x.shape[1]]``) become "to the end"."""
    x, ends = ins[0], ins[2]
    if x is None or x.type.shape is None or ends is None or ctx.const_value(ends) is not None:
        return ends
    e = symbolic_value(ctx, ends)
    n = len(e) if e is not None else 0
    axes = list(range(n)) if ins[3] is None else symbolic_value(ctx, ins[3])
    steps = [1] * n if ins[4] is None else symbolic_value(ctx, ins[4])
    if e is None or axes is None or steps is None or not _all_int(axes) or not _all_int(steps):
        return ends
    rank = len(x.type.shape)
    new: list[int] = []
    for end, a, st in zip(e, axes, steps):
        if not isinstance(a, int) or not -rank <= a < rank:
            return ends
        if isinstance(end, int):
            new.append(end)
        elif end == x.type.shape[a] and end != UNKNOWN and isinstance(st, int) and st > 0:
            new.append(_INT64_MAX)
        else:
            return ends
    return ctx.const(np.array(new, dtype=ends.type.dtype.np))


@converter("Squeeze")
def _squeeze(ctx: NodeContext):
    if ctx.opset < 13:
        return emit1(ctx, Squeeze(axes=_ints(ctx.attr("axes"))), [ctx.input(0)])
    return emit1(ctx, Squeeze(), [ctx.input(0), ctx.input(1)])


@converter("Unsqueeze")
def _unsqueeze(ctx: NodeContext):
    if ctx.opset < 13:
        return emit1(ctx, Unsqueeze(axes=_ints(ctx.attr("axes"))), [ctx.input(0)])
    return emit1(ctx, Unsqueeze(), [ctx.input(0), ctx.input(1)])


@converter("Flatten")
def _flatten(ctx: NodeContext):
    return emit1(ctx, Flatten(axis=int(ctx.attr("axis", 1))), [ctx.input(0)])


@converter("Expand")
def _expand(ctx: NodeContext):
    s = ctx.input(1)
    return emit1(ctx, Expand(shape=sym_hint(ctx, s)), [ctx.input(0), s])


@converter("Tile")
def _tile(ctx: NodeContext):
    if ctx.opset < 6:
        raise Unsupported("Tile-1 (tiles/axis inputs)")
    return emit1(ctx, Tile(), [ctx.input(0), ctx.input(1)])


@converter("Pad")
def _pad(ctx: NodeContext):
    mode = str(ctx.attr("mode", "constant"))
    x = ctx.input(0)
    assert x is not None
    if ctx.opset < 11:
        pads = _ints(ctx.attr("pads", ctx.attr("paddings")))
        value = ctx.const(np.array(float(ctx.attr("value", 0.0))).astype(x.type.dtype.np))
        return emit1(ctx, Pad(mode=mode, pads=pads), [x, None, value])
    return emit1(ctx, Pad(mode=mode), [x, ctx.input(1), ctx.input(2), ctx.input(3)])


@converter("ConstantOfShape")
def _constant_of_shape(ctx: NodeContext):
    value = ctx.attr("value")
    value = np.zeros((1,), np.float32) if value is None else np.asarray(value).reshape(1)
    s = ctx.input(0)
    return emit1(ctx, ConstantOfShape(shape=sym_hint(ctx, s), value=value), [s])


@converter("Range")
def _range(ctx: NodeContext):
    start, limit, delta = ctx.input(0), ctx.input(1), ctx.input(2)
    length: int | str | None = None
    s, lim, d = (symbolic_value(ctx, v) for v in (start, limit, delta))
    if s is not None and lim is not None and d is not None and len(s) == len(lim) == len(d) == 1:
        if s[0] == 0 and d[0] == 1 and lim[0] != UNKNOWN:
            length = lim[0]
        elif _all_int(s + lim + d) and d[0] != 0:
            length = max(-(-(lim[0] - s[0]) // d[0]), 0)  # type: ignore[operator]
    return emit1(ctx, Range(length=length), [start, limit, delta])


@converter("Trilu")
def _trilu(ctx: NodeContext):
    return emit1(ctx, Trilu(upper=bool(ctx.attr("upper", 1))), [ctx.input(0), ctx.input(1)])


@converter("EyeLike")
def _eye_like(ctx: NodeContext):
    dt = ctx.attr("dtype")
    dtype: DType | None = None if dt is None else dtype_from_onnx(int(dt), "EyeLike's dtype")
    return emit1(ctx, EyeLike(k=int(ctx.attr("k", 0)), dtype=dtype), [ctx.input(0)])


@converter("DepthToSpace")
def _depth_to_space(ctx: NodeContext):
    op = DepthToSpace(blocksize=int(ctx.attr("blocksize")), mode=str(ctx.attr("mode", "DCR")))
    return emit1(ctx, op, [ctx.input(0)])


@converter("SpaceToDepth")
def _space_to_depth(ctx: NodeContext):
    op = SpaceToDepth(blocksize=int(ctx.attr("blocksize")), mode=str(ctx.attr("mode", "DCR")))
    return emit1(ctx, op, [ctx.input(0)])


@converter("CenterCropPad")
def _center_crop_pad(ctx: NodeContext):
    return emit1(ctx, CenterCropPad(axes=_ints(ctx.attr("axes"))), [ctx.input(0), ctx.input(1)])


@converter("ReverseSequence")
def _reverse_sequence(ctx: NodeContext):
    op = ReverseSequence(batch_axis=int(ctx.attr("batch_axis", 1)), time_axis=int(ctx.attr("time_axis", 0)))
    return emit1(ctx, op, [ctx.input(0), ctx.input(1)])
