"""cse: merge nodes that compute the same thing.

Runs anywhere; canonicalize runs it after the folds (equal constants merge too). Needs nothing.
Two nodes merge when their ops have equal ``key()`` (name and attributes) and their inputs are the
same values; the later one's outputs are replaced by the earlier one's, so chains of duplicates
collapse in one sweep. Ops with side effects are never merged. Preserves every output's value and
type (the kept node's declared type is the sharper of the two).
"""

from __future__ import annotations

from ..ir.graph import Graph, Node, Value
from ._symbolic import sharper_type
from .manager import Pass, PassContext, register_pass


@register_pass
class CommonSubexpressionElimination(Pass):
    """Merge nodes with equal ``op.key()`` and identical inputs (never side-effecting ops).

    Runs anywhere. Needs nothing. Preserves values and types.
    """

    name = "cse"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        replaced: dict[Value, Value] = {}
        seen: dict[tuple, Node] = {}

        def resolve(v: Value | None) -> Value | None:
            return None if v is None else replaced.get(v, v)

        kept: list[Node] = []
        for n in graph.nodes:
            n.inputs = [resolve(v) for v in n.inputs]
            if n.op.has_side_effects:
                kept.append(n)
                continue
            k = (n.op.key(), tuple(id(v) if v is not None else None for v in n.inputs))
            first = seen.get(k)
            if first is None or len(first.outputs) != len(n.outputs):
                seen.setdefault(k, n)
                kept.append(n)
                continue
            for old, new in zip(n.outputs, first.outputs):
                # equal ops on equal inputs agree; one declared type may know a dim the other doesn't
                new.type = sharper_type(new.type, old.type) or new.type
                replaced[old] = new
        graph.nodes = kept
        graph.outputs = [replaced.get(v, v) for v in graph.outputs]
        self.stats = {"merged": len({v.producer for v in replaced})} if replaced else {}
        return bool(replaced)
