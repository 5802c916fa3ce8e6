"""fuse-rms-norm: the decomposed RMSNorm of exporters -> ``rms_norm(x, w) {eps, axis}``.

Runs after canonicalize (constants folded, axes as attributes). Needs nothing. Preserves every
output's value (up to rounding: the fused op computes in f32 and rounds once).

Recognized (every commutative operand order, scalars as 0-d or [1] constants)::

    ms  = reduce_mean(pow(x, 2) | mul(x, x), axes=trailing)
    inv = reciprocal(sqrt(ms + eps)) | div(1, sqrt(ms + eps))
    y   = (x * inv | x / sqrt(ms + eps)) [-> cast] * w        # w may be (1 + w) (Gemma)

With ``x = cast(x0 -> f32)`` and the result cast back to ``x0``'s dtype (HF's upcast), the fused op
reads ``x0`` directly; the Gemma order ``cast(norm(x) * w)`` becomes one ``rms_norm`` too. A residual
add before the norm stays a separate node (its result is the next residual).
"""

from __future__ import annotations

from collections.abc import Iterator

from ..ir.graph import Graph, Value
from ..ir.ops.norm import RmsNorm
from ..ir.types import DType
from .fuse_util import is_scalar, scalar_of, suffix_axis, uncast
from .manager import Pass, PassContext, register_pass
from .rewrite import Builder, Const, Match, P, Rule, Var, rewrite


def _normalized(x: Var) -> Iterator[P]:
    """Every spelling of ``x / sqrt(mean(x^2) + eps)``."""
    for sq in (P("pow", x, Const("two", where=is_scalar(2.0)), one_use=True), P("mul", x, x, one_use=True)):
        ms = P("reduce_mean", sq, name="mean", one_use=True)
        den = P("sqrt", P("add", ms, Const("eps", where=is_scalar()), commutative=True, one_use=True),
                one_use=True)
        yield P("mul", x, P("reciprocal", den, one_use=True), commutative=True, one_use=True)
        yield P("mul", x, P("div", Const("one", where=is_scalar(1.0)), den, one_use=True), commutative=True,
                one_use=True)
        yield P("div", x, den, one_use=True)


def _fits(m: Match) -> bool:
    x, w, out = m["x"], m["w"], m.root.outputs[0]
    mean = m.op("mean")
    if x.type.shape is None or w.type.shape is None or out.type.shape != x.type.shape or not mean.keepdims:
        return False
    axis = suffix_axis(mean.axes, len(x.type.shape))
    return axis is not None and len(w.type.shape) <= -axis and w.type.dtype.is_float


def _replace(m: Match, b: Builder) -> Value | None:
    out = m.root.outputs[0]
    x = uncast(m["x"], out.type.dtype)
    if x is None:
        return None
    axis = suffix_axis(m.op("mean").axes, len(m["x"].type.shape or ()))
    assert axis is not None
    return b.add(RmsNorm(eps=scalar_of(m.const("eps")), axis=axis), [x, m["w"]])


def _rules() -> list[Rule]:
    rules = []
    for i, norm in enumerate(_normalized(Var("x"))):
        for cast in (False, True):
            n = P("cast", norm, one_use=True) if cast else norm
            rules.append(Rule(f"rms-norm-{i}{'-cast' if cast else ''}", P("mul", n, Var("w"), commutative=True),
                              _replace, _fits))
    # Gemma: cast(rms_norm(cast(x0 -> f32), w) -> x0.dtype) -> rms_norm(x0, w)  (w stays f32)
    rules.append(Rule(
        "rms-norm-cast-back",
        P("cast", P("rms_norm", P("cast", Var("x0")), Var("w"), name="rms", one_use=True)),
        lambda m, b: b.add(m.op("rms"), [m["x0"], m["w"]]),
        lambda m: m["x0"].type.dtype == m.root.outputs[0].type.dtype and m.op("rms").stash_type == DType.f32
        and m.node("rms").inputs[0].type.dtype == DType.f32,
    ))
    return rules


@register_pass
class FuseRmsNorm(Pass):
    """Decomposed RMSNorm -> ``rms_norm``. Runs after canonicalize; needs nothing; preserves values."""

    name = "fuse-rms-norm"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        self.stats = rewrite(graph, _rules())
        return bool(self.stats)
