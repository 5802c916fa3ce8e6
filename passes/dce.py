"""dce: remove nodes whose results nothing uses, and unused weights.

Runs anywhere. Needs nothing. Preserves every graph output's value.
"""

from ..ir.graph import Graph
from .manager import Pass, PassContext, register_pass


@register_pass
class DeadCodeElimination(Pass):
    name = "dce"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        before = (len(graph.nodes), len(graph.weights))
        graph.remove_unused()
        removed = before[0] - len(graph.nodes)
        self.stats = {"nodes-removed": removed, "weights-removed": before[1] - len(graph.weights)}
        return (len(graph.nodes), len(graph.weights)) != before
