"""Symbolic values of small integer tensors (shape vectors), shared by the canonicalization passes.

Exporters compute reshape targets at run time: ``Shape -> Gather -> Unsqueeze -> Concat``. Given
the graph's symbolic dims, most of those tensors have a value known at compile time *as a list of
dims*: ``[batch, seq, 4, 16]``. ``ShapeValues`` computes that list for every small i64/i32/bool
tensor it can (entries: ``int``, ``bool``, a symbol such as ``"seq"`` or ``"(past_seq+seq)"``, or
``"?"`` where an entry is not known). Data-movement ops (gather, slice, concat, reshape, where, ...)
are evaluated by running the op's own reference on *index arrays* into the entries, so the analysis
needs no per-op copy of their semantics; arithmetic on symbols uses ``dim_add``/``dim_mul``/
``dim_div`` and the fact that a dim is never negative.

Also here: ``reshape_attr`` (write a target shape as a static reshape attribute relative to an
input, with 0 = copy and -1 = the one remaining dim) and ``refine_types`` (sharpen declared types
where inference now knows more).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..ir.graph import Graph, Value
from ..ir.op import Op, OpError
from ..ir.ops.core import cast_array
from ..ir.ops.elementwise import Binary, Compare
from ..ir.ops.shape import dim_div, numel_dim, reshape_dims
from ..ir.types import UNKNOWN, Dim, DType, Shape, TensorType, dim_add, dim_mul
from .rewrite import const_value

#: Tensors of at most this many elements get a symbolic value.
MAX_ENTRIES = 64
_TRACKED = (DType.i64, DType.i32, DType.bool)
#: Ops whose outputs are entries of their data inputs, picked by the op's reference applied to
#: index arrays. Value: which inputs are data (None: all); the rest must be known integers.
_MOVEMENT: dict[str, tuple[int, ...] | None] = {
    "identity": (0,), "reshape": (0,), "squeeze": (0,), "unsqueeze": (0,), "flatten": (0,),
    "gather": (0,), "slice": (0,), "expand": (0,), "transpose": (0,), "tile": (0,),
    "concat": None, "where": (1, 2),
}
#: Comparison names, old (``eq``) and new (``equal``) spellings, to one short form.
_CMP = {"eq": "eq", "equal": "eq", "lt": "lt", "less": "lt", "gt": "gt", "greater": "gt",
        "le": "le", "less_equal": "le", "ge": "ge", "greater_equal": "ge"}

Entry = Any  # int | bool | str


def is_known(entries: Sequence[Entry] | None) -> bool:
    """Every entry is an int, a bool or a symbol (no ``"?"``)."""
    return entries is not None and all(e != UNKNOWN for e in entries)


def is_static(entries: Sequence[Entry] | None) -> bool:
    """Every entry is a plain number."""
    return entries is not None and all(isinstance(e, int | bool | np.integer | np.bool_) for e in entries)


def _small(t: TensorType) -> bool:
    n = t.numel()
    return t.dtype in _TRACKED and t.shape is not None and len(t.shape) <= 1 and n is not None and (
        n <= MAX_ENTRIES
    )


class ShapeValues:
    """Memoized symbolic values: ``get(v)`` is a tuple of entries (row-major) or None."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.memo: dict[Value, tuple[Entry, ...] | None] = {}
        for n in graph.nodes:  # in order, so get() never recurses deeply
            for o in n.outputs:
                self.get(o)

    def get(self, v: Value | None) -> tuple[Entry, ...] | None:
        if v is None:
            return None
        if v not in self.memo:
            self.memo[v] = None
            try:
                self.memo[v] = self._compute(v)
            except (OpError, ValueError, TypeError, IndexError, KeyError, ZeroDivisionError):
                self.memo[v] = None
        return self.memo[v]

    def array(self, v: Value | None) -> np.ndarray | None:
        """The value as an array of its dtype, when every entry is a number."""
        e = self.get(v)
        if v is None or not is_static(e):
            return None
        assert e is not None and v.type.shape is not None
        return np.array([int(x) for x in e], dtype=np.int64).astype(v.type.dtype.np).reshape(v.type.shape)

    # -- the transfer functions -------------------------------------------------------------------
    def _compute(self, v: Value) -> tuple[Entry, ...] | None:
        t = v.type
        node = v.producer
        if node is None or node.op.name == "constant":
            if not _small(t):
                return None
            try:
                arr = const_value(v, self.graph, MAX_ENTRIES)
            except Exception:  # a weight without data (parsed text): not a constant
                return None
            return None if arr is None else _entries(arr)
        op = node.op
        if op.has_side_effects:
            return None
        name = op.name
        if name == "range" and t.shape is not None and len(t.shape) == 1:
            return self._range(node.inputs)
        if not _small(t):
            return None
        if name == "shape":
            x = node.inputs[0]
            if x is None or x.type.shape is None:
                return None
            return tuple(op.dims(x.type.shape))  # type: ignore[attr-defined]
        if name == "size":
            x = node.inputs[0]
            return None if x is None or x.type.shape is None else (numel_dim(x.type.shape),)
        ins = [self.get(i) for i in node.inputs]
        if all(i is None or is_static(e) for i, e in zip(node.inputs, ins)) and node.inputs:
            return self._evaluate(op, node.inputs, v.index)
        if name == "cast":
            return self._cast(op, node.inputs[0], ins[0])
        if name in _MOVEMENT:
            return self._move(op, node.inputs, ins, v)
        if isinstance(op, Binary):
            return self._elementwise(op.fn, node.inputs, ins, _binary)
        if isinstance(op, Compare):
            return self._elementwise(_CMP.get(op.fn, ""), node.inputs, ins, _compare)
        return None

    def _evaluate(self, op: Op, inputs: Sequence[Value | None], index: int) -> tuple[Entry, ...] | None:
        args = [None if i is None else self.array(i) for i in inputs]
        if any(a is None for i, a in zip(inputs, args) if i is not None):
            return None
        with np.errstate(all="ignore"):
            out = op.run(*args)[index]
        return _entries(out) if out.size <= MAX_ENTRIES else None

    def _range(self, inputs: Sequence[Value | None]) -> tuple[Entry, ...] | None:
        vals = [self.get(i) for i in inputs]
        if not all(is_static(x) and len(x) == 1 for x in vals):  # type: ignore[arg-type]
            return None
        s, lim, d = (int(x[0]) for x in vals)  # type: ignore[index]
        if d == 0 or max(-(-(lim - s) // d), 0) > MAX_ENTRIES or inputs[0] is None:
            return None
        if inputs[0].type.dtype not in (DType.i64, DType.i32):
            return None
        return tuple(range(s, lim, d))

    def _cast(self, op: Op, x: Value | None, e: tuple[Entry, ...] | None) -> tuple[Entry, ...] | None:
        if x is None or e is None:
            return None
        to = op.to  # type: ignore[attr-defined]
        if to is DType.bool:
            return tuple(UNKNOWN if isinstance(a, str) else bool(a) for a in e)
        if to not in (DType.i64, DType.i32) or x.type.dtype not in _TRACKED:
            return None
        out: list[Entry] = []
        for a in e:
            if isinstance(a, str):
                out.append(a)  # a dim fits any index type
            else:
                out.append(int(cast_array(np.array(int(a), dtype=x.type.dtype.np), to)))
        return tuple(out)

    def _move(
        self, op: Op, inputs: Sequence[Value | None], ins: Sequence[tuple[Entry, ...] | None], v: Value
    ) -> tuple[Entry, ...] | None:
        data = _MOVEMENT[op.name]
        data_idx = range(len(inputs)) if data is None else data
        pool: list[Entry] = []
        args: list[np.ndarray | None] = []
        for i, (x, e) in enumerate(zip(inputs, ins)):
            if x is None:
                args.append(None)
            elif i in data_idx:
                if e is None or x.type.shape is None:
                    return None
                args.append(np.arange(len(pool), len(pool) + len(e), dtype=np.int64).reshape(x.type.shape))
                pool.extend(e)
            else:
                a = self.array(x)
                if a is None:
                    if op.name == "where" and e is not None:  # a condition with a few unknowns
                        return self._where(inputs, ins)
                    return None
                args.append(a)
        idx = op.run(*args)[v.index]
        return tuple(pool[int(i)] for i in idx.reshape(-1))

    def _where(
        self, inputs: Sequence[Value | None], ins: Sequence[tuple[Entry, ...] | None]
    ) -> tuple[Entry, ...] | None:
        c, a, b = ins
        if c is None or a is None or b is None or any(i is None or i.type.shape is None for i in inputs):
            return None
        shapes = [i.type.shape for i in inputs]  # type: ignore[union-attr]
        ci, ai, bi = np.broadcast_arrays(*(np.arange(len(e)).reshape(s) for e, s in zip(ins, shapes)))
        out = []
        for x, y, z in zip(ci.reshape(-1), ai.reshape(-1), bi.reshape(-1)):
            cond = c[int(x)]
            out.append(UNKNOWN if isinstance(cond, str) else (a[int(y)] if cond else b[int(z)]))
        return tuple(out)

    def _elementwise(
        self, fn: str, inputs: Sequence[Value | None], ins: Sequence[tuple[Entry, ...] | None], f: Any
    ) -> tuple[Entry, ...] | None:
        a, b = ins
        if a is None or b is None or any(i is None or i.type.shape is None for i in inputs):
            return None
        sa, sb = (i.type.shape for i in inputs)  # type: ignore[union-attr]
        ia, ib = np.broadcast_arrays(np.arange(len(a)).reshape(sa), np.arange(len(b)).reshape(sb))
        out = tuple(f(fn, a[int(x)], b[int(y)]) for x, y in zip(ia.reshape(-1), ib.reshape(-1)))
        return None if all(o == UNKNOWN for o in out) else out


def _entries(arr: np.ndarray) -> tuple[Entry, ...]:
    flat = np.asarray(arr).reshape(-1)
    if flat.dtype == np.bool_:
        return tuple(bool(x) for x in flat)
    return tuple(int(x) for x in flat)


def _dim_sub(a: Dim, b: Dim) -> Dim:
    if b == 0:
        return a
    if a == b:
        return 0
    if isinstance(a, str) and a.startswith("(") and a.endswith(")"):
        # "(past_seq+seq)" - "seq" -> "past_seq": only for a flat sum of symbols
        terms = a[1:-1].split("+")
        if all(t.isidentifier() for t in terms) and b in terms:
            terms.remove(b)  # type: ignore[arg-type]
            rest: Dim = 0
            for t in terms:
                rest = dim_add(rest, t)
            return rest
    return UNKNOWN


def _int_binary(fn: str, a: int, b: int) -> Entry:
    """Integer arithmetic as the ``binary`` reference computes it (division truncates toward 0)."""
    if fn == "add":
        return a + b
    if fn == "sub":
        return a - b
    if fn == "mul":
        return a * b
    if fn == "div" and b != 0:
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    if fn == "max":
        return max(a, b)
    if fn == "min":
        return min(a, b)
    return UNKNOWN


def _binary(fn: str, a: Entry, b: Entry) -> Entry:
    """One entry of an arithmetic op where an operand is a dim (never negative)."""
    if a == UNKNOWN or b == UNKNOWN or isinstance(a, bool) or isinstance(b, bool):
        return UNKNOWN
    if isinstance(a, int) and isinstance(b, int):
        return _int_binary(fn, a, b)
    if fn == "add":
        return dim_add(a, b)
    if fn == "mul":
        return dim_mul(a, b)
    if fn == "sub":
        return _dim_sub(a, b)
    if fn == "div":
        if b == 1:
            return a
        q = dim_div(a, b) if b != 0 else None
        return UNKNOWN if q is None else q
    if fn in ("max", "min"):
        if a == b:
            return a
        if isinstance(b, int) and b <= 0 or isinstance(a, int) and a <= 0:
            small, big = (b, a) if isinstance(b, int) and b <= 0 else (a, b)
            return big if fn == "max" else small
    return UNKNOWN


def _compare(fn: str, a: Entry, b: Entry) -> Entry:
    """One entry of a comparison: equal symbols are equal; a dim is larger than a negative int."""
    if a == UNKNOWN or b == UNKNOWN or isinstance(a, bool) or isinstance(b, bool):
        return UNKNOWN
    if isinstance(a, int) and isinstance(b, int):
        ops = {"eq": a == b, "lt": a < b, "gt": a > b, "le": a <= b, "ge": a >= b}
        return ops.get(fn, UNKNOWN)
    if a == b:
        return fn in ("eq", "le", "ge")
    neg_b = isinstance(b, int) and b < 0
    neg_a = isinstance(a, int) and a < 0
    if isinstance(a, str) and neg_b:  # a > b
        return fn == "gt" or fn == "ge"
    if isinstance(b, str) and neg_a:  # a < b
        return fn == "lt" or fn == "le"
    return UNKNOWN


# -- consumers --------------------------------------------------------------------------------------


def reshape_target(x: Shape | None, entries: Sequence[Entry], allowzero: bool) -> Shape | None:
    """The output shape of ``reshape(x, entries)`` when every dim of it is known."""
    if any(isinstance(e, bool) or e == UNKNOWN for e in entries):
        return None
    try:
        out = reshape_dims(x, list(entries), allowzero)
    except (OpError, ValueError):
        return None
    return None if any(d == UNKNOWN for d in out) else out


def reshape_attr(src: Shape | None, target: Shape) -> tuple[int, ...] | None:
    """A static reshape attribute turning ``src`` into ``target``: ints stay, a symbolic dim at the
    same position as in ``src`` becomes 0 (copy), and at most one other dim becomes -1."""
    if src is None or any(d == UNKNOWN for d in target):
        return None
    attr: list[int] = []
    free = -1
    for i, d in enumerate(target):
        if isinstance(d, int):
            if d == 0:
                return None  # 0 would mean "copy"; empty tensors are left alone
            attr.append(d)
        elif i < len(src) and src[i] == d:
            attr.append(0)
        elif free < 0:
            free = i
            attr.append(-1)
        else:
            return None
    try:
        got = reshape_dims(src, attr, False)
    except (OpError, ValueError):
        return None
    return tuple(attr) if tuple(got) == tuple(target) else None


def expand_attr(src: Shape | None, entries: Sequence[Entry]) -> tuple[int, ...] | None:
    """A static expand attribute: ints stay, a symbolic dim equal to the aligned input dim becomes 1."""
    if src is None or not is_known(entries) or any(isinstance(e, bool) for e in entries):
        return None
    off = len(entries) - len(src)
    attr = []
    for i, e in enumerate(entries):
        if isinstance(e, int):
            attr.append(int(e))
        elif 0 <= i - off < len(src) and src[i - off] == e:
            attr.append(1)
        else:
            return None
    return tuple(attr)


def sharper_type(declared: TensorType, inferred: TensorType) -> TensorType | None:
    """``declared`` with its unknown dims filled from ``inferred``; None if nothing is gained."""
    if declared.dtype != inferred.dtype or inferred.shape is None:
        return None
    if declared.shape is None:
        return TensorType(declared.dtype, inferred.shape, declared.quant)
    if len(declared.shape) != len(inferred.shape):
        return None
    dims = tuple(b if a == UNKNOWN and b != UNKNOWN else a for a, b in zip(declared.shape, inferred.shape))
    return None if dims == declared.shape else TensorType(declared.dtype, dims, declared.quant)


def refine_types(graph: Graph) -> int:
    """Re-run type inference in order and fill declared ``"?"`` dims that inference now knows.

    Only unknown dims change (a known dim is never overwritten), so every type stays compatible
    with what it was. Returns how many values got a sharper type.
    """
    changed = 0
    for n in graph.nodes:
        try:
            inferred = n.op.infer([None if v is None else v.type for v in n.inputs])
        except (OpError, ValueError, TypeError, IndexError):
            continue
        for v, t in zip(n.outputs, inferred):
            s = sharper_type(v.type, t)
            if s is not None:
                v.type = s
                changed += 1
    return changed
