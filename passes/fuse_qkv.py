"""fuse-qkv: horizontal fusion of ``linear``s that read one input with constant weights.

Runs after fuse-linear (and after the epilogue fusions, so linears with a residual stay apart).
Needs nothing. Preserves values exactly (the same dot products, one GEMM).

::

    q = linear(x, Wq)  k = linear(x, Wk)  v = linear(x, Wv)
      -> qkv = linear(x, concat(Wq, Wk, Wv)); q, k, v = split(qkv, axis=-1, [Nq, Nk, Nv])

(the same for gate/up). The concatenated weight (and bias) is a new lazy weight that concatenates
on load. Linears join a group when they share ``x``, have no residual, and either all or none have a
constant bias; the fused node sits where the group's first linear was.
"""

from __future__ import annotations

from ..ir.graph import Graph, Node, Value
from ..ir.ops.llm import Linear
from ..ir.ops.shape import Split
from .fuse_util import concatenated, is_constant
from .manager import Pass, PassContext, register_pass


def _key(n: Node, graph: Graph) -> tuple | None:
    if n.op.name != "linear" or n.op != Linear():
        return None
    ins = list(n.inputs) + [None] * (4 - len(n.inputs))
    x, w, bias, res = ins
    if x is None or w is None or res is not None or not is_constant(w, graph) or w.type.quant is not None:
        return None
    if w.type.shape is None or not all(isinstance(d, int) for d in w.type.shape):
        return None
    if bias is not None and not is_constant(bias, graph):
        return None
    return (x, bias is not None, w.type.dtype, w.type.shape[1])


@register_pass
class FuseQKV(Pass):
    """Linears sharing an input -> one linear + split. Runs after fuse-linear; needs nothing;
    preserves values."""

    name = "fuse-qkv"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        groups: dict[tuple, list[Node]] = {}
        for n in graph.nodes:
            k = _key(n, graph)
            if k is not None:
                groups.setdefault(k, []).append(n)
        replaced: dict[Value, Value] = {}
        fused = 0
        for (x, has_bias, _, _), nodes in groups.items():
            if len(nodes) < 2:
                continue
            ws = [n.inputs[1] for n in nodes]
            w = concatenated(graph, ws, f"{ws[0].name}.cat{len(ws)}")  # type: ignore[arg-type]
            ins: list[Value | None] = [x, w]
            if has_bias:
                bs = [n.inputs[2] for n in nodes]
                ins.append(concatenated(graph, bs, f"{bs[0].name}.cat{len(bs)}"))  # type: ignore[arg-type]
            sizes = tuple(int(v.type.shape[0]) for v in ws)  # type: ignore[union-attr, index]
            src = nodes[0].source
            (y,) = graph.add(Linear(), ins, source=src)
            parts = graph.add(Split(axis=-1, num_outputs=len(nodes), split=sizes), [y], source=src)
            new = graph.nodes[-2:]
            del graph.nodes[-2:]
            at = graph.nodes.index(nodes[0])
            graph.nodes[at:at] = new
            for n, part in zip(nodes, parts):
                replaced[n.outputs[0]] = part
            fused += 1
        if not replaced:
            self.stats = {}
            return False
        graph.replace_uses(replaced)
        graph.remove_unused()
        self.stats = {"groups": fused, "linears": len(replaced)}
        return True
