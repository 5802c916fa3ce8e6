"""canonicalize: the canonicalization passes, repeated until none changes the graph.

Runs first (O1, O2) and again after fusion (O2). Needs nothing. Each round runs, in order::

    const-input-fold   constant shape/axes/pads inputs become attributes
    constant-fold      nodes of constants become constants
    shape-fold         exporter shape chains fold given symbolic dims
    cast-elim          same-dtype casts and exact cast chains go
    identity-elim      identities, identity transposes/reshapes, view chains merge
    cse                equal nodes merge
    dce                dead nodes and weights go

until a round changes nothing (at most ``max_rounds``, default 16;
``ctx.option("canonicalize", "max_rounds", 16)``). Options of the inner passes apply as usual
(``ctx.option("constant-fold", "max_elements", ...)``). Preserves every output's value; types only
get sharper. ``stats`` counts rule hits as ``"<pass>/<rule>"`` summed over rounds, plus ``rounds``.
"""

from __future__ import annotations

from ..ir.graph import Graph
from .manager import Pass, PassContext, get_pass, register_pass

#: One round, in order.
ROUND = ["const-input-fold", "constant-fold", "shape-fold", "cast-elim", "identity-elim", "cse", "dce"]


@register_pass
class Canonicalize(Pass):
    """The canonicalization passes (folds, shape-fold, cast/identity-elim, cse, dce) to a fixed point.

    Runs first in every pipeline and after fusion. Needs nothing. Preserves values.
    """

    name = "canonicalize"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        max_rounds = int(ctx.option(self.name, "max_rounds", 16))
        passes = [get_pass(n)() for n in ROUND]
        stats: dict[str, int] = {}
        changed_any = False
        rounds = 0
        for rounds in range(1, max_rounds + 1):  # noqa: B007 - reported in stats
            changed = False
            for p in passes:
                p.stats = {}
                if p.run(graph, ctx):
                    changed = True
                for k, v in p.stats.items():
                    if v:
                        stats[f"{p.name}/{k}"] = stats.get(f"{p.name}/{k}", 0) + v
            changed_any |= changed
            if not changed:
                break
        stats["rounds"] = rounds
        self.stats = stats
        return changed_any
