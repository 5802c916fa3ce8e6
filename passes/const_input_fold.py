"""const-input-fold: move constant parameter inputs (shapes, axes, pads, ...) into attributes.

Runs anywhere; canonicalize runs it first, so later passes see attribute forms. Needs nothing. An
op lists such inputs in ``const_inputs`` (input index -> attribute); when the input is a compile-time
constant (a ``constant`` node or a small weight) it becomes the attribute (``fold_const_input``)
and the input slot becomes empty (trailing empty slots are dropped), so type inference is exact.
Empty arrays are left as inputs (for some ops an empty list and an absent one mean different
things). Preserves every output's value; types only get sharper.
"""

from __future__ import annotations

from ..ir.graph import Graph, Value
from ..ir.op import OPS, OpError, fold_const_input
from ..ir.types import shapes_compatible
from .manager import Pass, PassContext, register_pass
from .rewrite import Builder, Match, P, Rule, const_value, rewrite

#: Largest constant moved into an attribute.
MAX_ELEMENTS = 1 << 12


def _fold(graph: Graph):
    def replace(m: Match, b: Builder) -> list[Value] | None:
        node = m.root
        op = node.op
        inputs = list(node.inputs)
        for i in sorted(op.const_inputs):
            v = inputs[i] if i < len(inputs) else None
            if v is None:
                continue
            try:
                arr = const_value(v, graph, MAX_ELEMENTS)
            except Exception:  # a weight without data: not a constant
                continue
            if arr is None or arr.size == 0:
                continue
            try:
                op = fold_const_input(op, i, arr)
            except (TypeError, ValueError, StopIteration):
                continue
            inputs[i] = None
        if op is node.op:
            return None
        while inputs and inputs[-1] is None:
            inputs.pop()
        try:
            types = op.infer([None if v is None else v.type for v in inputs])
        except (OpError, ValueError, TypeError, IndexError):
            return None
        if len(types) != len(node.outputs) or any(
            t.dtype != o.type.dtype or not shapes_compatible(t.shape, o.type.shape)
            for t, o in zip(types, node.outputs)
        ):
            return None
        return b.add_multi(op, inputs)

    return replace


@register_pass
class ConstInputFold(Pass):
    """Move constant shape/axes/pads/... inputs into the op's attributes (``const_inputs``).

    Runs anywhere. Needs nothing. Preserves values; types only get sharper.
    """

    name = "const-input-fold"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        roots = tuple(n for n, cls in OPS.items() if cls.const_inputs)
        rule = Rule("const-input", P(roots, partial=True), _fold(graph),
                    where=lambda m: any(
                        i < len(m.root.inputs) and m.root.inputs[i] is not None
                        for i in m.root.op.const_inputs))
        self.stats = rewrite(graph, [rule])
        return bool(self.stats)
