"""fuse-split-swiglu: ``swiglu`` straight over a fused gate_up projection's output, without the split.

Runs after fuse-qkv / fuse-swiglu (it needs their ``split`` + ``swiglu``) and, in the serving form, after
whatever still reads that form's ``split`` (quantization's smoothing, tensor-parallel sharding): it is
the first step of the GPU lowering (the ``serving-fuse`` pipeline, ``codegen/lower.py``). Needs
nothing. Preserves values exactly (the same elementwise arithmetic, no copy in between).

::

    gate, up = split(gu) {axis=-1, split=[I, I]}      (each half read only by the swiglu)
    y = swiglu(gate, up) {alpha}
      -> y = swiglu(gu) {alpha, packed=true}          (gate = first half of gu's last axis, up = second)
"""

from __future__ import annotations

from ..ir.graph import Graph, Value
from ..ir.ops.attention import SwiGLU
from ..ir.types import normalize_axis
from .manager import Pass, PassContext, register_pass
from .rewrite import Builder, Match, P, Rule, Var, rewrite

_x = Var("x")
_PATTERN = P("swiglu", P("split", _x, name="split", out=0, one_use=True),
             P("split", _x, name="split", out=1, one_use=True), name="act", attrs={"packed": False})


def _halves_of_last_axis(m: Match) -> bool:
    """The split cuts ``x``'s static last axis into two equal halves (gate first)."""
    split, x = m.op("split"), m["x"]
    shape = x.type.shape
    if split.num_outputs != 2 or shape is None or not shape or len(m.node("split").inputs) != 1:
        return False
    last = shape[-1]
    if not isinstance(last, int) or last % 2 or normalize_axis(split.axis, len(shape)) != len(shape) - 1:
        return False
    return split.split is None or tuple(split.split) == (last // 2, last // 2)


def _packed(m: Match, b: Builder) -> Value:
    return b.add(SwiGLU(alpha=m.op("act").alpha, packed=True), [m["x"]])


RULE = Rule("split-swiglu", _PATTERN, _packed, _halves_of_last_axis)


@register_pass
class FuseSplitSwiGLU(Pass):
    """``swiglu(split(gu))`` -> ``swiglu(gu) {packed}``. Runs after fuse-swiglu and fuse-qkv (in the serving
    form: after quantization and sharding, at lowering); needs nothing; preserves values."""

    name = "fuse-split-swiglu"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        self.stats = rewrite(graph, [RULE])
        return bool(self.stats)
