"""fuse-split-rope: ``rope`` of q and k straight from a fused qkv projection's output, without the split.

Runs after fuse-qkv (it needs the fused ``linear`` + ``split``) and, in the serving form, after whatever
still reads that form's ``split`` (quantization, tensor-parallel sharding): it is the first step of the
GPU lowering (the ``serving-fuse`` pipeline, ``codegen/lower.py``). Needs nothing. Preserves values
exactly (``rope_qkv`` computes each rotated element as ``rope`` does; v is copied unchanged).

::

    q, k, v = split(qkv) {axis=-1, split=[H*D, KV*D, KV*D]}   (q, k each read only by its rope)
    q' = rope(q, pos, cos, sin) {head_dim=D, ...}
    k' = rope(k, pos, cos, sin) {the same attributes, the same pos/cos/sin}
      -> q', k', v = rope_qkv(qkv, pos, cos, sin) {num_heads=H, num_kv_heads=KV, head_dim=D, ...}

Any rope variant fuses (partial rotary, interleaved, scaled tables: the tables are inputs). The fused
node takes the place of the first of its outputs' users (its inputs are checked to exist there), and
its outputs keep the names of the values they replace.
"""

from __future__ import annotations

from ..ir.graph import Graph, Node, Value
from ..ir.ops.llm import RopeQKV
from ..ir.types import normalize_axis
from .manager import Pass, PassContext, register_pass


def _sole_rope(v: Value, users: dict[Value, list[Node]], outputs: set[Value]) -> Node | None:
    us = users.get(v, [])
    if len(us) != 1 or v in outputs or us[0].op.name != "rope" or us[0].inputs[0] is not v:
        return None
    return us[0]


def _fusion(split: Node, users: dict[Value, list[Node]], outputs: set[Value]) -> RopeQKV | None:
    """The ``rope_qkv`` replacing ``split`` and the ropes of its first two parts, or None."""
    op, x = split.op, split.inputs[0]
    if split.op.name != "split" or op.num_outputs != 3 or len(split.inputs) != 1 or x is None:  # type: ignore
        return None
    shape = x.type.shape
    if shape is None or len(shape) != 2 or normalize_axis(op.axis, 2) != 1:  # type: ignore[attr-defined]
        return None
    rq = _sole_rope(split.outputs[0], users, outputs)
    rk = _sole_rope(split.outputs[1], users, outputs)
    if rq is None or rk is None or rq.op != rk.op or any(a is not b for a, b in zip(rq.inputs[1:], rk.inputs[1:])):
        return None
    sizes = [o.type.shape[1] if o.type.shape is not None else None for o in split.outputs]
    d = rq.op.head_dim  # type: ignore[attr-defined]
    if not all(isinstance(s, int) and s > 0 and s % d == 0 for s in sizes) or sizes[1] != sizes[2]:
        return None
    return RopeQKV(num_heads=sizes[0] // d, num_kv_heads=sizes[1] // d, head_dim=d,  # type: ignore[operator]
                   rotary_dim=rq.op.rotary_dim, interleaved=rq.op.interleaved)  # type: ignore[attr-defined]


@register_pass
class FuseSplitRope(Pass):
    """``rope(split(qkv)[0])``, ``rope(split(qkv)[1])``, ``split(qkv)[2]`` -> ``rope_qkv(qkv)``. Runs after
    fuse-qkv (in the serving form: after quantization and sharding, at lowering); needs nothing; preserves
    values."""

    name = "fuse-split-rope"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        users = graph.users()
        outputs = set(graph.outputs)
        replaced: dict[Value, Value] = {}
        fused = 0
        for split in list(graph.nodes):
            if split.op.name != "split":
                continue
            op = _fusion(split, users, outputs)
            if op is None:
                continue
            rq, rk = users[split.outputs[0]][0], users[split.outputs[1]][0]
            old = [rq.outputs[0], rk.outputs[0], split.outputs[2]]
            at = min(graph.nodes.index(n) for v in old for n in users.get(v, [])) if any(
                users.get(v) for v in old) else graph.nodes.index(rk) + 1
            before = set(graph.nodes[:at])
            ins = [split.inputs[0], *rq.inputs[1:]]
            if any(v is not None and v.producer is not None and v.producer not in before for v in ins):
                continue  # positions or tables made after the first reader of the results: leave it
            new = graph.add(op, ins, source=rq.source or split.source)
            node = graph.nodes.pop()
            for v, o in zip(new, old):
                v.name = o.name
                replaced[o] = v
            graph.nodes.insert(at, node)
            for n in (split, rq, rk):
                graph.nodes.remove(n)
            fused += 1
        if not replaced:
            self.stats = {}
            return False
        graph.replace_uses(replaced)
        graph.remove_unused()
        self.stats = {"split-rope": fused}
        return True
