"""shape-fold: fold the shape subgraphs exporters emit, given the graph's symbolic dims.

Runs after the importer (canonicalize runs it with constant-fold and cse). Needs nothing. Computes,
for every small integer tensor it can, a symbolic value (``ShapeValues``: a list of dims such as
``[batch, seq, 4, 16]``) through shape, gather, slice, (un)squeeze, concat, reshape, cast, where,
arithmetic and comparisons, then rewrites the consumers:

- a small integer tensor whose value is all numbers becomes a ``constant`` (so the shape of a
  static tensor, or a gathered static dim, is folded);
- ``reshape(x, s)`` with ``s`` fully known becomes ``reshape(x) {shape=...}`` with a static
  attribute (0 copies a symbolic dim from the same position of ``x``, -1 stands for one remaining
  dim); when ``x`` is itself a view (reshape, squeeze, unsqueeze, flatten) of ``y`` and only ``y``
  lets the target be written that way, the new reshape reads ``y``;
- ``expand(x, s)`` likewise (a symbolic dim equal to ``x``'s aligned dim becomes 1);
- ``constant_of_shape``/``reshape``/``expand`` whose target stays symbolic get the symbolic value as
  their shape hint, and ``range(0, n, 1)`` gets ``length=n``, so their types become exact;
- finally declared ``"?"`` dims that inference now knows are filled in (``refine_types``).

Preserves every output's value; types only get sharper.
"""

from __future__ import annotations

import dataclasses

from ..ir.graph import Graph, Value
from ..ir.op import OPS, OpError
from ..ir.types import UNKNOWN, dims_compatible
from ._symbolic import ShapeValues, expand_attr, is_known, is_static, refine_types, reshape_attr, reshape_target
from .manager import Pass, PassContext, register_pass
from .rewrite import Builder, Match, P, Rule, rewrite

#: Single-data-input ops whose output is a pure reshape of their input (no runtime parameters).
VIEW_OPS = ("reshape", "squeeze", "unsqueeze", "flatten")


def view_source(v: Value) -> Value | None:
    """``y`` when ``v`` is a view op of ``y`` with no runtime parameter input; else None."""
    n = v.producer
    if n is None or n.op.name not in VIEW_OPS or any(i is not None for i in n.inputs[1:]):
        return None
    return n.inputs[0]


def static_reshape(x: Value, target: tuple, b: Builder, old: Value, two_step: bool = True) -> Value | None:
    """Build a reshape with a static attribute producing ``target`` (``old``'s shape) from ``x``.

    Tries ``x`` and the sources of the views it comes from. The attribute can only copy a symbolic
    dim from the same position (0) and infer one (-1); when that is not enough and ``two_step`` is
    set, a ``flatten`` (merging leading dims) or an ``unsqueeze`` (shifting dims right) first moves
    the symbolic dims to where the attribute can reach them.
    """
    from ..ir.ops.shape import Flatten, Reshape, Unsqueeze, numel_dim

    src: Value | None = x
    while src is not None:
        attr = reshape_attr(src.type.shape, target)
        if attr is not None:
            return _fits(b, Reshape(shape=attr), [src], old)
        src = view_source(src)
    shape = x.type.shape
    if not two_step or shape is None:
        return None
    candidates = []
    for k in range(1, len(shape)):
        candidates.append((Flatten(axis=k), (numel_dim(shape[:k]), numel_dim(shape[k:]))))
    for a in range(len(shape) + 1):
        for c in range(1, len(target) - len(shape) + 1):
            axes = tuple(range(a, a + c))
            candidates.append((Unsqueeze(axes=axes), tuple(shape[:a]) + (1,) * c + tuple(shape[a:])))
    for op, mid in candidates:
        attr = reshape_attr(mid, target)
        if attr is not None:
            return _fits(b, Reshape(shape=attr), [b.add(op, [x])], old)
    return None


def _fits(b: Builder, op, inputs: list, old: Value) -> Value | None:
    """Add ``op`` if its inferred type fits ``old``'s declared type exactly enough to replace it."""
    try:
        (t,) = op.infer([None if i is None else i.type for i in inputs])
    except (OpError, ValueError, TypeError, IndexError):
        return None
    if t.dtype != old.type.dtype or t.shape is None or old.type.shape is None:
        return None
    if len(t.shape) != len(old.type.shape) or not all(
        dims_compatible(a, c) for a, c in zip(t.shape, old.type.shape)
    ):
        return None
    return b.add(op, inputs)


def _unknowns(v: Value) -> int:
    return 10**6 if v.type.shape is None else sum(d == UNKNOWN for d in v.type.shape)


def _rules(sv: ShapeValues, graph: Graph) -> list[Rule]:
    def to_constant(m: Match, b: Builder):
        v = m.root.outputs[0]
        arr = sv.array(v)
        return None if arr is None else b.const(arr)

    def reshape(m: Match, b: Builder):
        node = m.root
        x, s = node.inputs[0], node.inputs[1]
        e = sv.get(s)
        if x is None or e is None:
            return None
        out = node.outputs[0]
        target = reshape_target(x.type.shape, e, node.op.allowzero) if is_known(e) else None
        if target is not None:
            new = static_reshape(x, target, b, out)
            if new is not None:
                return new
        return _hint(node.op, "shape", tuple(e), [x, s], b, out)

    def expand(m: Match, b: Builder):
        from ..ir.ops.shape import Expand

        node = m.root
        x, s = node.inputs[0], node.inputs[1]
        e = sv.get(s)
        if x is None or e is None:
            return None
        attr = expand_attr(x.type.shape, e)
        out = node.outputs[0]
        if attr is not None:
            new = _fits(b, Expand(shape=attr), [x], out)
            if new is not None:
                return new
        return _hint(node.op, "shape", tuple(e), [x, s], b, out)

    def constant_of_shape(m: Match, b: Builder):
        node = m.root
        e = sv.get(node.inputs[0])
        if e is None or any(isinstance(d, bool) for d in e):
            return None
        return _hint(node.op, "shape", tuple(e), list(node.inputs), b, node.outputs[0])

    def range_length(m: Match, b: Builder):
        node = m.root
        start, limit, delta = (sv.get(i) for i in node.inputs)
        if start is None or limit is None or delta is None or len(limit) != 1:
            return None
        if tuple(start) != (0,) or tuple(delta) != (1,) or limit[0] == UNKNOWN or isinstance(limit[0], bool):
            return None
        return _hint(node.op, "length", limit[0], list(node.inputs), b, node.outputs[0])

    shape_producers = tuple(
        n for n in OPS if n != "constant" and not OPS[n].has_side_effects
    )
    return [
        Rule("shape-to-constant", P(shape_producers, partial=True),
             to_constant,
             where=lambda m: len(m.root.outputs) == 1 and is_static(sv.get(m.root.outputs[0]))),
        Rule("reshape-static", P("reshape", partial=True), reshape,
             where=lambda m: len(m.root.inputs) == 2 and m.root.inputs[1] is not None),
        Rule("expand-static", P("expand", partial=True), expand,
             where=lambda m: len(m.root.inputs) == 2 and m.root.inputs[1] is not None),
        Rule("constant-of-shape-hint", P("constant_of_shape", partial=True), constant_of_shape,
             where=lambda m: len(m.root.inputs) == 1 and m.root.inputs[0] is not None),
        Rule("range-length", P("range", partial=True), range_length,
             where=lambda m: m.root.op.length in (None, UNKNOWN)),
    ]


def _hint(op, attr: str, value, inputs: list, b: Builder, old: Value) -> Value | None:
    """The same op with a sharper shape hint, if that makes the type strictly better."""
    if getattr(op, attr) == value:
        return None
    new_op = dataclasses.replace(op, **{attr: value})
    try:
        (t,) = new_op.infer([None if i is None else i.type for i in inputs])
    except (OpError, ValueError, TypeError, IndexError):
        return None
    if t.shape is None or old.type.shape is None or len(t.shape) != len(old.type.shape):
        return None
    if not all(dims_compatible(a, c) for a, c in zip(t.shape, old.type.shape)):
        return None
    if sum(d == UNKNOWN for d in t.shape) >= _unknowns(old):
        return None
    return b.add(new_op, inputs)


@register_pass
class ShapeFold(Pass):
    """Fold exporter shape chains (Shape/Gather/Concat -> Reshape/Expand/...) given symbolic dims.

    Runs after import, inside canonicalize. Needs nothing. Preserves values; types get sharper.
    """

    name = "shape-fold"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        self.stats = {}
        changed = False
        for _ in range(16):  # sharper types can expose more folds: repeat until neither changes
            sv = ShapeValues(graph)
            hits = rewrite(graph, _rules(sv, graph))
            refined = refine_types(graph)
            for k, v in [*hits.items(), ("types-refined", refined)]:
                if v:
                    self.stats[k] = self.stats.get(k, 0) + v
            if not hits and not refined:
                break
            changed = True
        return changed
