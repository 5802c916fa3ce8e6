"""fuse-elementwise: chains of elementwise ops -> one ``fused_elementwise`` op carrying its body.

Runs last in ``fuse`` (after every pattern fusion, so it only takes what they left). Needs nothing.
Preserves values exactly: the body runs the same ops with the same references.

A producer joins its consumer's group when both are elementwise (unary, binary, comparisons,
``where``, ``cast``, activations) and the producer's result has that one user and is no graph
output. Each group of two or more nodes becomes one node whose inputs are the values the group
reads from outside (constants included) and whose ``body`` is the group as a text-IR graph.
"""

from __future__ import annotations

from ..ir.graph import Graph, Node, Value
from ..ir.ops.elementwise import BINARY_OPS, COMPARE_OPS, UNARY_OPS, _FloatActivation
from ..ir.ops.fused import FusedElementwise
from ..ir.text import print_graph
from .manager import Pass, PassContext, register_pass

_NAMED = {"where", "cast", "clip"}


def _elementwise(n: Node) -> bool:
    name = n.op.name
    if len(n.outputs) != 1 or n.outputs[0].type.shape is None:
        return False
    if name in UNARY_OPS or name in BINARY_OPS or name in COMPARE_OPS or name in _NAMED:
        return name != "clip" or len(n.inputs) == 1
    return isinstance(n.op, _FloatActivation)


def _body(nodes: list[Node], inputs: list[Value], root: Node) -> str:
    g = Graph("body")
    env: dict[Value, Value] = {}
    for i, v in enumerate(inputs):
        env[v] = g.add_input(f"a{i}", v.type)
    for j, n in enumerate(nodes):
        outs = g.add(n.op, [None if v is None else env[v] for v in n.inputs], [f"t{j}"])
        for o, new in zip(n.outputs, outs):
            new.type = o.type  # keep the outer (possibly sharper) types
            env[o] = new
    g.add_output(env[root.outputs[0]], "y")
    return print_graph(g)


@register_pass
class FuseElementwise(Pass):
    """Single-use elementwise chains -> ``fused_elementwise``. Runs last in fuse; needs nothing;
    preserves values."""

    name = "fuse-elementwise"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        users = graph.users()
        outputs = set(graph.outputs)
        group: dict[Node, Node] = {}  # node -> the root of its group (its final consumer)
        for n in reversed(graph.nodes):
            if not _elementwise(n):
                continue
            group.setdefault(n, n)
            out = n.outputs[0]
            us = users.get(out, [])
            if len(us) == 1 and out not in outputs and us[0] in group and _elementwise(us[0]):
                group[n] = group[us[0]]
        members: dict[Node, list[Node]] = {}
        for n in graph.nodes:
            if n in group:
                members.setdefault(group[n], []).append(n)
        new_nodes: dict[Node, Node] = {}
        for root, nodes in members.items():
            if len(nodes) < 2:
                continue
            inside = {o for m in nodes for o in m.outputs}
            inputs: list[Value] = []
            for m in nodes:
                for v in m.inputs:
                    if v is not None and v not in inside and v not in inputs:
                        inputs.append(v)
            op = FusedElementwise(body=_body(nodes, inputs, root))
            out = root.outputs[0]
            node = Node(op, list(inputs), [out], root.source)
            new_nodes[root] = node
        if not new_nodes:
            self.stats = {}
            return False
        fused = {m for r in new_nodes for m in members[r]}
        kept: list[Node] = []
        for n in graph.nodes:
            if n in new_nodes:
                node = new_nodes[n]
                node.outputs[0].producer = node
                kept.append(node)
            elif n not in fused:
                kept.append(n)
        graph.nodes = kept
        self.stats = {"groups": len(new_nodes), "ops": sum(len(members[r]) for r in new_nodes)}
        return True
