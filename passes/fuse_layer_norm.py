"""fuse-layer-norm: the decomposed LayerNorm of older exports -> ``layer_norm(x, w, b) {eps, axis}``.

Runs after canonicalize. Needs nothing. Preserves values (the fused op computes in f32).

::

    d = x - reduce_mean(x, axes=trailing)
    v = reduce_mean(pow(d, 2) | mul(d, d), same axes)
    n = d / sqrt(v + eps) | d * reciprocal(sqrt(v + eps))
    y = n * w [+ b]                                       -> layer_norm(x, w[, b])
"""

from __future__ import annotations

from ..ir.graph import Graph, Value
from ..ir.ops.norm import LayerNorm
from .fuse_util import is_scalar, scalar_of, suffix_axis
from .manager import Pass, PassContext, register_pass
from .rewrite import Builder, Const, Match, P, Rule, Var, rewrite


def _patterns() -> list[P]:
    x = Var("x")
    d = P("sub", x, P("reduce_mean", x, name="mean", one_use=True), name="d")
    out = []
    for sq in (P("pow", d, Const("two", where=is_scalar(2.0)), one_use=True), P("mul", d, d, one_use=True)):
        var = P("reduce_mean", sq, name="var", one_use=True)
        den = P("sqrt", P("add", var, Const("eps", where=is_scalar()), commutative=True, one_use=True), one_use=True)
        for norm in (P("div", d, den, one_use=True),
                     P("mul", d, P("reciprocal", den, one_use=True), commutative=True, one_use=True)):
            out.append(P("mul", norm, Var("w"), commutative=True))
    return out


def _fits(m: Match) -> bool:
    x, w, out = m["x"], m["w"], m.root.outputs[0]
    if x.type.shape is None or w.type.shape is None or out.type.shape != x.type.shape:
        return False
    mean, var = m.op("mean"), m.op("var")
    axis = suffix_axis(mean.axes, len(x.type.shape))
    return (axis is not None and axis == suffix_axis(var.axes, len(x.type.shape)) and mean.keepdims and var.keepdims
            and len(w.type.shape) <= -axis and w.type.dtype == x.type.dtype)


def _fuse(m: Match, b: Builder) -> Value:
    axis = suffix_axis(m.op("mean").axes, len(m["x"].type.shape or ()))
    return b.add(LayerNorm(eps=scalar_of(m.const("eps")), axis=axis or -1), [m["x"], m["w"]])


def _bias_fits(m: Match) -> bool:
    ln, bias = m.node("ln"), m["b"]
    return (len(ln.inputs) == 2 and bias.type.shape is not None and ln.inputs[1] is not None
            and bias.type.shape == ln.inputs[1].type.shape and bias.type.dtype == ln.outputs[0].type.dtype
            and m.root.outputs[0].type.shape == ln.outputs[0].type.shape)


def _rules() -> list[Rule]:
    rules = [Rule(f"layer-norm-{i}", p, _fuse, _fits) for i, p in enumerate(_patterns())]
    rules.append(Rule("layer-norm-bias", P("add", P("layer_norm", Var("x"), Var("w"), name="ln", one_use=True),
                                           Var("b"), commutative=True),
                      lambda m, b: b.add(m.op("ln"), [m["x"], m["w"], m["b"]]), _bias_fits))
    return rules


@register_pass
class FuseLayerNorm(Pass):
    """Decomposed LayerNorm -> ``layer_norm``. Runs after canonicalize; needs nothing; preserves values."""

    name = "fuse-layer-norm"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        self.stats = rewrite(graph, _rules())
        return bool(self.stats)
