"""cast-elim: remove casts that change nothing, and shorten exact cast chains.

Runs anywhere; canonicalize runs it to a fixed point. Needs nothing. Rules:

- ``cast(x) {to=T}`` with ``x: T`` is ``x``;
- ``cast(cast(x: A) {to=B}) {to=C}`` where every ``A`` value is exactly representable in ``B``
  (``EXACT``: f32 -> f64, f16 -> f32, i32 -> i64, i8 -> f32, bool -> anything numeric, ...) is
  ``cast(x) {to=C}``, or ``x`` itself when ``C == A``: casts are value-based (round to nearest even,
  saturate, truncate toward zero), so an exact first step cannot change what the second computes.

Preserves every output's value and type.
"""

from __future__ import annotations

import dataclasses

from ..ir.graph import Graph
from ..ir.types import DType
from .manager import Pass, PassContext, register_pass
from .rewrite import Builder, Match, P, Rule, Var, rewrite

_D = DType
_SIGNED = [_D.i8, _D.i16, _D.i32, _D.i64]
_UNSIGNED = [_D.u8, _D.u16, _D.u32, _D.u64]


def _exact() -> dict[DType, set[DType]]:
    ex: dict[DType, set[DType]] = {
        _D.f16: {_D.f32, _D.f64},
        _D.bf16: {_D.f32, _D.f64},
        _D.f32: {_D.f64},
        _D.bool: {*_SIGNED, *_UNSIGNED, _D.f16, _D.bf16, _D.f32, _D.f64},
    }
    for i, s in enumerate(_SIGNED):
        ex.setdefault(s, set()).update(_SIGNED[i + 1:])
    for i, u in enumerate(_UNSIGNED):
        ex.setdefault(u, set()).update(_UNSIGNED[i + 1:], _SIGNED[i + 1:])
    for t in (_D.i8, _D.u8):
        ex[t] |= {_D.f16, _D.f32, _D.f64}
    for t in (_D.i16, _D.u16):
        ex[t] |= {_D.f32, _D.f64}
    for t in (_D.i32, _D.u32):
        ex[t] |= {_D.f64}
    return ex


#: ``EXACT[A]``: the dtypes that hold every value of ``A`` exactly (so A -> B -> A is the identity).
EXACT: dict[DType, set[DType]] = _exact()


def _chain(m: Match, b: Builder):
    x = m["x"]
    outer = m.node("outer").op
    if outer.to == x.type.dtype:
        return x
    return b.add(dataclasses.replace(outer), [x])


RULES = [
    Rule("same-dtype", P("cast", Var("x"), name="c"), lambda m, b: m["x"],
         where=lambda m: m.op("c").to == m["x"].type.dtype),
    Rule("exact-chain", P("cast", P("cast", Var("x"), name="inner"), name="outer"), _chain,
         where=lambda m: m.op("inner").to in EXACT.get(m["x"].type.dtype, ())),
]


@register_pass
class CastElim(Pass):
    """Drop casts to the same dtype and shorten exact cast chains (f32 -> f64 -> f32 is nothing).

    Runs anywhere. Needs nothing. Preserves values and types.
    """

    name = "cast-elim"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        self.stats = rewrite(graph, RULES)
        return bool(self.stats)
