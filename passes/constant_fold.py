"""constant-fold: evaluate nodes whose inputs are all compile-time constants.

Runs anywhere; canonicalize runs it to a fixed point with the other canonicalizations. Needs
nothing. A node whose every input is a ``constant`` node or a small weight (``const_value``) and
whose outputs hold at most ``max_elements`` elements each becomes one ``constant`` per output,
computed with the op's numpy reference (exactly what the CPU backend would compute). Ops with side
effects are never folded; a node whose reference fails, or disagrees with its declared type, is
left alone; so is ``dequantize_linear`` of rank >= 2 (a pre-quantized weight stays quantized for
fuse-qdq). Option: ``ctx.option("constant-fold", "max_elements", 1 << 16)``. Preserves every
output's value; types only get sharper (a folded ``?`` dim becomes static).
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Value
from ..ir.op import OPS
from ..ir.types import TensorType, shapes_compatible
from .manager import Pass, PassContext, register_pass
from .rewrite import Builder, Match, P, Rule, const_value, rewrite


def constant_inputs(graph: Graph, inputs: list[Value | None], limit: int) -> list[np.ndarray | None] | None:
    """The arrays behind ``inputs`` (None for an omitted optional input), or None if one is not
    a compile-time constant of at most ``limit`` elements."""
    out: list[np.ndarray | None] = []
    for v in inputs:
        if v is None:
            out.append(None)
            continue
        try:
            arr = const_value(v, graph, limit)
        except Exception:  # a weight whose data cannot be loaded (parsed text): not a constant
            return None
        if arr is None or arr.size > limit:
            return None
        out.append(arr)
    return out


def fold_rule(graph: Graph, limit: int) -> Rule:
    roots = tuple(n for n, cls in OPS.items() if n != "constant" and not cls.has_side_effects)

    def small_outputs(m: Match) -> bool:
        if m.root.op.has_side_effects:
            return False
        for v in m.root.outputs:
            n = v.type.numel()
            if n is not None and n > limit:
                return False
        return True

    def fold(m: Match, b: Builder) -> list[Value] | None:
        node = m.root
        if node.op.name == "dequantize_linear" and (node.inputs[0].type.rank or 0) >= 2:  # type: ignore[union-attr]
            return None  # a quantized weight stays quantized (fuse-qdq keeps its bytes and scales)
        args = constant_inputs(graph, node.inputs, limit)
        if args is None:
            return None
        try:
            with np.errstate(all="ignore"):
                outs = node.op.run(*args)
        except Exception:  # the reference rejects these inputs: leave the node for run time
            return None
        if len(outs) < len(node.outputs):
            return None
        new = []
        for v, a in zip(node.outputs, outs):
            a = np.asarray(a)
            if a.size > limit or a.dtype != v.type.dtype.np:
                return None
            if not shapes_compatible(v.type.shape, TensorType.of(a).shape):
                return None
            new.append(b.const(a))
        return new

    return Rule("fold", P(roots, partial=True), fold, where=small_outputs)


@register_pass
class ConstantFold(Pass):
    """Evaluate nodes whose inputs are all constants (constant nodes, small weights) into constants.

    Runs anywhere. Needs nothing. Preserves values; never folds ops with side effects.
    """

    name = "constant-fold"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        limit = int(ctx.option(self.name, "max_elements", 1 << 16))
        hits = rewrite(graph, [fold_rule(graph, limit)])
        self.stats = hits
        return bool(hits)
