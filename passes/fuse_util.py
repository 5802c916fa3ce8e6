"""Helpers shared by the fusion passes (``fuse-*``): scalar constants, casts, derived lazy weights.

Not a pass. Real exports spell one computation many ways (a scalar as a 0-d or a [1] array, Div
vs Mul by a reciprocal, casts around a subgraph); these helpers let a rule accept the family.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..ir.graph import Graph, Value, Weight
from ..ir.types import DType, TensorType
from .rewrite import Builder, const_value


def is_scalar(value: float | None = None, tol: float = 0.0) -> Callable[[np.ndarray], bool]:
    """A ``Const(where=...)`` predicate: one element (0-d or [1], [1,1], ...), equal to ``value`` if given."""

    def check(a: np.ndarray) -> bool:
        if a.size != 1 or a.dtype.kind not in "fiu" and not DType.from_np(a.dtype).is_float:
            return False
        return value is None or abs(float(a.reshape(-1)[0]) - value) <= tol * max(1.0, abs(value))

    return check


def scalar_of(a: np.ndarray) -> float:
    """The one number in ``a``; a narrow float reads as its shortest decimal (f32 1e-6 -> 1e-06)."""
    x = np.asarray(a).reshape(-1)[0]
    if isinstance(x, np.float32 | np.float16):
        return float(str(x))
    return float(x)


def scalar_value(v: Value, graph: Graph) -> float | None:
    """The number behind ``v`` if it is a one-element compile-time constant."""
    a = const_value(v, graph, limit=1)
    if a is None or a.size != 1:
        return None
    return scalar_of(a)


def is_constant(v: Value, graph: Graph) -> bool:
    """A ``constant`` node's result or a graph weight (of any size)."""
    if v.producer is not None:
        return v.producer.op.name == "constant"
    return graph.weight_values.get(v.name) is v


def is_weight(v: Value, graph: Graph) -> bool:
    return v.producer is None and graph.weight_values.get(v.name) is v


def uncast(v: Value, dtype: DType) -> Value | None:
    """``v`` itself if it has ``dtype``; the input of ``cast(v0 -> f32)`` if ``v0`` has ``dtype``."""
    if v.type.dtype == dtype:
        return v
    p = v.producer
    if p is not None and p.op.name == "cast" and p.inputs[0] is not None and p.inputs[0].type.dtype == dtype:
        return p.inputs[0]
    return None


def derived_weight(b: Builder, hint: str, type: TensorType, loader: Callable[[], np.ndarray],
                   source: str) -> Value:
    """A new lazy weight computed from existing ones on load (transposed, concatenated, ...)."""
    return b.graph.add_weight(hint, Weight(type, loader, source))


def weight_array_loader(v: Value, graph: Graph) -> Callable[[], np.ndarray]:
    """A loader for a constant value: a weight's lazy loader or a constant node's array."""
    if v.producer is not None:
        arr = v.producer.op.value  # type: ignore[attr-defined]
        return lambda: arr
    w = graph.weights[v.name]
    return w.load


def transposed(b: Builder, w: Value, cache: dict[Value, Value]) -> Value:
    """``w^T`` of a 2-D constant ``w``: a constant node for a constant, a lazy weight for a weight."""
    if w in cache:
        return cache[w]
    assert w.type.shape is not None and len(w.type.shape) == 2
    k, n = w.type.shape
    if w.producer is not None:
        out = b.const(np.ascontiguousarray(w.producer.op.value.T))  # type: ignore[attr-defined]
    else:
        load = b.graph.weights[w.name].load
        src = b.graph.weights[w.name].source
        out = derived_weight(b, f"{w.name}.T", TensorType(w.type.dtype, (n, k)),
                             lambda: np.ascontiguousarray(load().T), f"transpose({src or w.name})")
        cache[w] = out
    return out


def concatenated(g: Graph, ws: Sequence[Value], hint: str) -> Value:
    """The row-wise concatenation of 2-D (or 1-D) constants ``ws`` as one new lazy weight."""
    loaders = [weight_array_loader(w, g) for w in ws]
    shapes = [w.type.shape for w in ws]
    assert all(s is not None for s in shapes)
    rows = sum(int(s[0]) for s in shapes)  # type: ignore[index, misc]
    shape = (rows, *shapes[0][1:])  # type: ignore[index]
    srcs = ", ".join(g.weights[w.name].source if w.producer is None else "constant" for w in ws)
    w = Weight(TensorType(ws[0].type.dtype, shape), lambda: np.concatenate([ld() for ld in loaders], axis=0),
               f"concat({srcs})")
    return g.add_weight(hint, w)


def suffix_axis(axes: Sequence[int] | None, rank: int) -> int | None:
    """The first axis if ``axes`` are exactly ``[a, rank)`` (a reduction over trailing dims)."""
    if not axes or rank == 0:
        return None
    norm = sorted(a % rank for a in axes)
    if norm != list(range(norm[0], rank)):
        return None
    return norm[0] - rank


# -- view chains ---------------------------------------------------------------------------------

#: Ops that only move, copy or broadcast elements (simulated on index arrays by ``realizes``).
VIEW_OPS = ("reshape", "flatten", "transpose", "unsqueeze", "squeeze", "expand", "identity")
_PRIMES = (5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def _scale_operand(n, graph: Graph) -> tuple[Value, float] | None:  # noqa: ANN001 - a Node
    """``(x, factor)`` if node ``n`` is ``x * c``, ``c * x`` or ``x / c`` with a scalar constant ``c``."""
    if n.op.name not in ("mul", "div") or len(n.inputs) != 2:
        return None
    a, c = n.inputs
    for x, k, swap in ((a, c, False), (c, a, True)):
        if x is None or k is None or (swap and n.op.name == "div"):
            continue
        s = scalar_value(k, graph)
        if s is not None and s != 0 and x.type.shape == n.outputs[0].type.shape:
            return x, (1.0 / s if n.op.name == "div" else s)
    return None


def view_chain(v: Value, graph: Graph) -> list[tuple[Value, float]]:
    """``[(v, 1), (parent, f1), ...]``: the values ``v`` is a view of, back through view ops and
    scalar scalings, each with the product of the scale factors between it and ``v``."""
    out = [(v, 1.0)]
    scale = 1.0
    while True:
        n = v.producer
        if n is None or not n.inputs or n.inputs[0] is None:
            return out
        sc = _scale_operand(n, graph)
        if sc is not None:
            v, f = sc
            scale *= f
        elif n.op.name in VIEW_OPS and all(i is None for i in n.inputs[1:]):
            v = n.inputs[0]
        elif n.op.name in ("reshape", "expand") and getattr(n.op, "shape", None) is not None:
            v = n.inputs[0]  # the shape input is redundant with the attribute hint
        else:
            return out
        out.append((v, scale))


def realizes(v: Value, src: Value, graph: Graph, expected: Callable[[np.ndarray], np.ndarray]) -> bool:
    """Does the view chain from ``src`` to ``v`` compute ``expected(src)`` (up to scalar factors)?

    Simulated on an index array with distinct concrete sizes for the symbolic dims, with the ops' own
    references; ops whose attributes name dims other than ``src``'s plain symbols make it fail."""
    chain = [val for val, _ in view_chain(v, graph)]
    if src not in chain or src.type.shape is None:
        return False
    path = chain[: chain.index(src)][::-1]  # values after src, in order
    binding: dict[str, int] = {}
    primes = iter(_PRIMES)
    shape = []
    for d in src.type.shape:
        if isinstance(d, int):
            shape.append(d)
        else:
            if d not in binding:
                binding[d] = next(primes, 41)
            shape.append(binding[d])
    idx = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    arr = idx
    try:
        for val in path:
            n = val.producer
            assert n is not None
            if _scale_operand(n, graph) is not None:
                continue
            op = n.op
            attr = getattr(op, "shape", None)
            if n.op.name in ("reshape", "expand") and attr is not None:
                if any(isinstance(d, str) and d not in binding for d in attr):
                    return False
                import dataclasses

                op = dataclasses.replace(op, shape=tuple(binding[d] if isinstance(d, str) else d for d in attr))
            arr = op.run(arr)[0]
        want = expected(idx)
    except Exception:  # noqa: BLE001 - any failure to simulate means "not this form"
        return False
    return arr.shape == want.shape and bool(np.array_equal(arr, want))
