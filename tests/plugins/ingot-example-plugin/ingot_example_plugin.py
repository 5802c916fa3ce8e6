"""fuse-mul-add: ``a * b + c`` -> ``fma(a, b, c)``, a complete third-party fusion.

Runs after canonicalize (so constants are folded); needs nothing else; preserves every value.
Adds its own op (``fma``, with a numpy reference) and joins the O1/O2 pipelines when loaded.
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ingot.ir.op import Op, register
from ingot.ir.types import TensorType, broadcast_shapes
from ingot.passes import P, Pass, Rule, Var, extend_pipeline, rewrite


@register
@dataclass(frozen=True, eq=False)
class Fma(Op):
    name: ClassVar[str] = "fma"

    def infer(self, inputs):
        a, b, c = inputs
        return [TensorType(a.dtype, broadcast_shapes(a.shape, b.shape, c.shape))]

    def ref(self, a, b, c):
        return (a * b + c).astype(np.result_type(a, b, c))


RULE = Rule(
    "mul-add",
    P("add", P("mul", Var("a"), Var("b"), one_use=True), Var("c"), commutative=True),
    replace=lambda m, b: b.add(Fma(), [m["a"], m["b"], m["c"]]),
    where=lambda m: m["a"].type.dtype == m["b"].type.dtype == m["c"].type.dtype and m["a"].type.dtype.is_float,
)


class FuseMulAdd(Pass):
    name = "fuse-mul-add"

    def run(self, graph, ctx) -> bool:
        self.stats = rewrite(graph, [RULE])
        return bool(self.stats)


for _pipeline in ("O1", "O2"):
    extend_pipeline(_pipeline, FuseMulAdd.name)
