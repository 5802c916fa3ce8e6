"""fuse-swiglu: gated activations -> ``swiglu(g, u) {alpha}`` and ``geglu(g, u) {approximate}``.

Runs after canonicalize; after fuse-qkv is fine too (the gate and up halves are then ``split``
results). Needs nothing. Preserves values (the fused ops compute in f32 and round once).

::

    silu(g) = g * sigmoid(g) | g * sigmoid(g * a) | swish(g) {alpha} | g / (1 + exp(-g))
    silu(g) * u                                       -> swiglu(g, u)   (g, u of one shape)
    gelu(g) * u                                       -> geglu(g, u)
"""

from __future__ import annotations

from ..ir.graph import Graph, Value
from ..ir.ops.attention import SwiGLU
from ..ir.ops.fused import GeGLU
from .fuse_util import is_scalar, scalar_of
from .manager import Pass, PassContext, register_pass
from .rewrite import Builder, Const, Match, P, Rule, Var, rewrite

_g, _u = Var("g"), Var("u")

#: (pattern of silu(g) with alpha captured as "a" or the swish node "act", rule name)
_SILU = [
    (P("mul", _g, P("sigmoid", _g, one_use=True), commutative=True, one_use=True), "mul-sigmoid"),
    (P("mul", _g, P("sigmoid", P("mul", _g, Const("a", where=is_scalar()), commutative=True, one_use=True),
                    one_use=True), commutative=True, one_use=True), "mul-sigmoid-alpha"),
    (P("swish", _g, name="act", one_use=True), "swish"),
    (P("div", _g, P("add", Const("one", where=is_scalar(1.0)), P("exp", P("neg", _g, one_use=True), one_use=True),
                    commutative=True, one_use=True), one_use=True), "div-exp"),
]


def _same_shape(m: Match) -> bool:
    g, u = m["g"], m["u"]
    return g.type.shape is not None and g.type.shape == u.type.shape and g.type.dtype == u.type.dtype


def _swiglu(m: Match, b: Builder) -> Value:
    if "a" in m.consts:
        alpha = scalar_of(m.const("a"))
    elif "act" in m.nodes:
        alpha = m.op("act").alpha
    else:
        alpha = 1.0
    return b.add(SwiGLU(alpha=alpha), [m["g"], m["u"]])


def _rules() -> list[Rule]:
    rules = [Rule(f"swiglu-{name}", P("mul", silu, _u, commutative=True), _swiglu, _same_shape)
             for silu, name in _SILU]
    rules.append(Rule("geglu", P("mul", P("gelu", _g, name="act", one_use=True), _u, commutative=True),
                      lambda m, b: b.add(GeGLU(approximate=m.op("act").approximate), [m["g"], m["u"]]), _same_shape))
    return rules


@register_pass
class FuseSwiGLU(Pass):
    """``silu(g) * u`` -> ``swiglu``, ``gelu(g) * u`` -> ``geglu``. Runs after canonicalize; needs
    nothing; preserves values."""

    name = "fuse-swiglu"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        self.stats = rewrite(graph, _rules())
        return bool(self.stats)
