"""identity-elim: remove ops that return their input, and merge chains of views.

Runs anywhere; canonicalize runs it to a fixed point. Needs nothing. Rules:

- ``identity(x)``, a single-input ``concat(x)``, and a reshape, squeeze, unsqueeze, flatten, expand
  or step-1 slice whose output type equals its input's (fully known) are ``x``;
- ``transpose(x)`` with the identity permutation is ``x``; ``transpose(transpose(x, p), q)`` is
  ``transpose(x, p[q])`` (or ``x``);
- ``reshape(v)`` where ``v`` is a view (reshape, squeeze, unsqueeze, flatten) of ``y`` and the output
  shape is fully known is ``reshape(y) {shape=...}`` with a static attribute (0/-1 for symbolic
  dims), so view chains collapse to one reshape;
- a reshape with a runtime shape input whose output type is fully known gets that static attribute
  and loses the input (the declared type is a fact about the value);
- ``x * 1``, ``x / 1``, ``x - 0``, integer ``x + 0``, ``x and true``, ``x or false`` are ``x`` when the
  constant does not broadcast ``x`` to a larger shape.

Preserves every output's value and type.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Value
from ..ir.op import OPS
from ..ir.ops.elementwise import Binary
from ..ir.ops.shape import Transpose
from ..ir.types import UNKNOWN, normalize_axis
from .manager import Pass, PassContext, register_pass
from .rewrite import Builder, Match, P, Rule, Var, const_value, rewrite
from .shape_fold import static_reshape, view_source

_SAME_SHAPE_OPS = ("reshape", "squeeze", "unsqueeze", "flatten", "expand", "slice")


def _known(v: Value) -> bool:
    return v.type.shape is not None and all(d != UNKNOWN for d in v.type.shape)


def _same(m: Match) -> bool:
    node = m.root
    x, out = node.inputs[0], node.outputs[0]
    if x is None or not _known(out) or x.type != out.type:
        return False
    if node.op.name == "slice":
        steps = node.op.steps
        return all(i is None for i in node.inputs[1:]) and (steps is None or all(s == 1 for s in steps))
    return True


def _perm(op: Transpose, rank: int) -> list[int]:
    if op.perm is None:
        return list(range(rank))[::-1]
    return [normalize_axis(p, rank) for p in op.perm]


def _transpose_identity(m: Match) -> bool:
    x = m["x"]
    return x.type.shape is not None and _perm(m.op("t"), len(x.type.shape)) == list(range(len(x.type.shape)))


def _transpose_pair(m: Match, b: Builder) -> Value | None:
    x = m["x"]
    if x.type.shape is None:
        return None
    r = len(x.type.shape)
    p, q = _perm(m.op("inner"), r), _perm(m.op("outer"), r)
    composed = [p[i] for i in q]
    if composed == list(range(r)):
        return x
    return b.add(Transpose(perm=tuple(composed)), [x])


def _reshape_views(m: Match, b: Builder) -> Value | None:
    node = m.root
    x, out = node.inputs[0], node.outputs[0]
    if x is None or not _known(out) or out.type.shape is None:
        return None
    has_input = len(node.inputs) > 1 and node.inputs[1] is not None
    src = x if has_input else view_source(x)
    if src is None:
        return None
    return static_reshape(src, out.type.shape, b, out, two_step=has_input)


def _neutral(fn: str, arr: np.ndarray) -> bool:
    """Whether ``x fn arr == x`` for every x (arr on the right)."""
    if fn in ("mul", "div"):
        return bool(np.all(arr == 1))
    if fn == "sub":
        return bool(np.all(arr == 0))
    if fn == "add":  # -0.0 + 0.0 is +0.0: only exact for integers
        return arr.dtype.kind in "iub" and bool(np.all(arr == 0))
    if fn == "and":
        return arr.dtype == np.bool_ and bool(np.all(arr))
    if fn == "or":
        return arr.dtype == np.bool_ and not bool(np.any(arr))
    return False


def _algebraic(graph: Graph):
    def replace(m: Match, b: Builder) -> Value | None:
        node = m.root
        fn = node.op.fn
        out = node.outputs[0]
        a, c = node.inputs
        orders = [(a, c), (c, a)] if fn in ("mul", "add", "and", "or") else [(a, c)]
        for x, k in orders:
            if x is None or k is None or x.type != out.type or not _known(out):
                continue
            try:
                arr = const_value(k, graph, 1 << 16)
            except Exception:
                continue
            if arr is not None and _neutral(fn, np.asarray(arr)):
                return x
        return None

    return replace


def rules(graph: Graph) -> list[Rule]:
    binaries = tuple(n for n, cls in OPS.items() if issubclass(cls, Binary))
    return [
        Rule("identity", P("identity", Var("x")), lambda m, b: m["x"]),
        Rule("concat-one", P("concat", Var("x")), lambda m, b: m["x"]),
        Rule("same-shape", P(_SAME_SHAPE_OPS, partial=True), lambda m, b: m.root.inputs[0], where=_same),
        Rule("transpose-identity", P("transpose", Var("x"), name="t"), lambda m, b: m["x"],
             where=_transpose_identity),
        Rule("transpose-transpose", P("transpose", P("transpose", Var("x"), name="inner"), name="outer"),
             _transpose_pair),
        Rule("reshape-static", P("reshape", partial=True), _reshape_views),
        Rule("neutral-element", P(binaries, Var("a"), Var("b")), _algebraic(graph),
             where=lambda m: m.root.op.fn in ("mul", "div", "sub", "add", "and", "or")),
    ]


@register_pass
class IdentityElim(Pass):
    """Drop identities (same-shape reshapes, identity transposes, x*1, ...); merge view chains.

    Also merges transpose∘transpose and reshape∘reshape.
    Runs anywhere. Needs nothing. Preserves values and types.
    """

    name = "identity-elim"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        self.stats = rewrite(graph, rules(graph))
        return bool(self.stats)
