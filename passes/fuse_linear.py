"""fuse-linear: matmuls and Gemms with a constant weight -> ``linear``, then its GEMM epilogues.

Runs after canonicalize. Needs nothing. Preserves every output's value (``linear`` computes in f32
and rounds once, so low-precision results may differ in the last bit).

::

    matmul(x, W)                    W a 2-D constant [K, N]   -> linear(x, W^T)
    matmul(x, transpose(W'))        W' a 2-D constant [N, K]  -> linear(x, W')
    gemm(a, B, c) {alpha=1}         B constant                -> linear(a, B^T or B, c)
    linear(x, w) + b                b a constant [N]          -> linear(x, w, b)
    linear(x, w, b?) + r            r shaped like the result  -> linear(x, w, b, r)

``W^T`` of a weight is a new lazy weight that transposes on load (one per weight, shared by every
matmul that reads it); of a small constant node, a transposed constant.
"""

from __future__ import annotations

from ..ir.graph import Graph, Value
from ..ir.ops.llm import Linear
from .fuse_util import is_constant, transposed
from .manager import Pass, PassContext, register_pass
from .rewrite import Builder, Match, P, Rule, Var, rewrite


def _weight_2d(v: Value, graph: Graph, x: Value) -> bool:
    t = v.type
    return (t.shape is not None and len(t.shape) == 2 and t.quant is None and t.dtype == x.type.dtype
            and is_constant(v, graph))


def _transpose_2d(v: Value) -> Value | None:
    """``W'`` if ``v = transpose(W', perm=[1, 0])``."""
    p = v.producer
    if p is None or p.op.name != "transpose" or p.inputs[0] is None or p.inputs[0].type.rank != 2:
        return None
    return p.inputs[0] if p.op.perm in (None, (1, 0)) else None  # type: ignore[attr-defined]


def _float_rank1(x: Value) -> bool:
    return x.type.dtype.is_float and x.type.rank is not None and x.type.rank >= 1


def _rules(graph: Graph) -> list[Rule]:
    cache: dict[Value, Value] = {}

    def matmul_weight(m: Match, b: Builder) -> Value | None:
        x, w = m["x"], m["w"]
        if not _float_rank1(x):
            return None
        wt = _transpose_2d(w)
        if wt is not None and _weight_2d(wt, graph, x):
            return b.add(Linear(), [x, wt])
        if _weight_2d(w, graph, x):
            return b.add(Linear(), [x, transposed(b, w, cache)])
        return None

    def gemm(m: Match, b: Builder) -> Value | None:
        op = m.root.op
        x, w = m["x"], m["w"]
        c = m.root.inputs[2] if len(m.root.inputs) > 2 else None
        if op.trans_a or op.alpha != 1.0 or x.type.rank != 2 or not _weight_2d(w, graph, x):  # type: ignore
            return None
        if c is not None and (op.beta != 1.0 or c.type.shape is None or len(c.type.shape) != 1  # type: ignore
                              or c.type.shape[0] != m.root.outputs[0].type.shape[1]):  # type: ignore[index]
            return None
        wn = w if op.trans_b else transposed(b, w, cache)  # type: ignore[attr-defined]
        return b.add(Linear(), [x, wn] + ([c] if c is not None else []))

    def bias_fits(m: Match) -> bool:
        lin, bias = m.node("lin"), m["b"]
        out = lin.outputs[0]
        n = lin.inputs[1].type.shape[0] if lin.inputs[1].type.shape else None  # type: ignore[union-attr]
        no_bias = len(lin.inputs) < 3 or all(v is None for v in lin.inputs[2:])
        return (no_bias and bias.type.shape == (n,) and bias.type.dtype == out.type.dtype
                and is_constant(bias, graph) and m.root.outputs[0].type.shape == out.type.shape)

    def residual_fits(m: Match) -> bool:
        lin, r = m.node("lin"), m["r"]
        out = lin.outputs[0]
        no_res = len(lin.inputs) < 4 or lin.inputs[3] is None
        return (no_res and r is not out and r.type.shape == out.type.shape and r.type.dtype == out.type.dtype
                and m.root.outputs[0].type.shape == out.type.shape)

    def with_inputs(m: Match, b: Builder, bias: Value | None, res: Value | None) -> Value:
        lin = m.node("lin")
        ins = list(lin.inputs) + [None] * (4 - len(lin.inputs))
        if bias is not None:
            ins[2] = bias
        if res is not None:
            ins[3] = res
        while ins and ins[-1] is None:
            ins.pop()
        return b.add(lin.op, ins)

    lin = P("linear", Var("x"), Var("w"), name="lin", one_use=True, partial=True)
    return [
        Rule("matmul-weight", P("matmul", Var("x"), Var("w")), matmul_weight),
        Rule("gemm-weight", P("gemm", Var("x"), Var("w"), partial=True), gemm),
        Rule("linear-bias", P("add", lin, Var("b"), commutative=True),
             lambda m, b: with_inputs(m, b, m["b"], None), bias_fits),
        Rule("linear-residual", P("add", lin, Var("r"), commutative=True),
             lambda m, b: with_inputs(m, b, None, m["r"]), residual_fits),
    ]


@register_pass
class FuseLinear(Pass):
    """Constant-weight matmul/Gemm -> ``linear``; bias and residual adds -> its epilogue.

    Runs after canonicalize; needs nothing; preserves values."""

    name = "fuse-linear"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        self.stats = rewrite(graph, _rules(graph))
        return bool(self.stats)
