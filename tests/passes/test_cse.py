"""cse: equal nodes on equal inputs merge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ingot.ir.graph import Graph
from ingot.ir.ops.elementwise import BINARY_OPS
from ingot.ir.types import DType, TensorType
from ingot.passes import PassContext, run_passes
from tests.passes.common import check_rewrite


def test_merges_chains_and_constants():
    check_rewrite(
        """graph @m(%x: f32[2,3], %z: f32[2,3]) {
          %c1 = constant() {value=dense<f32[]>[2.0]} : f32[]
          %a1 = mul(%x, %c1) : f32[2,3]
          %e1 = exp(%a1) : f32[2,3]
          %c2 = constant() {value=dense<f32[]>[2.0]} : f32[]
          %a2 = mul(%x, %c2) : f32[2,3]
          %e2 = exp(%a2) : f32[2,3]
          %s = add(%e1, %e2) : f32[2,3]
          %d = sub(%x, %z) : f32[2,3]
          %d2 = sub(%z, %x) : f32[2,3]
          %y = add(%s, %d) : f32[2,3]
          return %y, %d2
        }""",
        """graph @m(%x: f32[2,3], %z: f32[2,3]) {
          %c1 = constant() {value=dense<f32[]>[2.0]} : f32[]
          %a1 = mul(%x, %c1) : f32[2,3]
          %e1 = exp(%a1) : f32[2,3]
          %s = add(%e1, %e1) : f32[2,3]
          %d = sub(%x, %z) : f32[2,3]
          %d2 = sub(%z, %x) : f32[2,3]
          %y = add(%s, %d) : f32[2,3]
          return %y, %d2
        }""",
        ["cse"],
    )


def test_attributes_distinguish():
    before = """graph @m(%x: f32[2,3]) {
      %a = transpose(%x) {perm=[1, 0]} : f32[3,2]
      %b = reduce_sum(%x) {axes=[0]} : f32[1,3]
      %c = reduce_sum(%x) {axes=[1]} : f32[2,1]
      return %a, %b, %c
    }"""
    check_rewrite(before, before, ["cse"])


def test_merged_outputs_keep_their_names():
    check_rewrite(
        """graph @m(%x: f32[4]) {
          %a = neg(%x) : f32[4]
          %b = neg(%x) : f32[4]
          return %a, %b as "other"
        }""",
        """graph @m(%x: f32[4]) {
          %a = neg(%x) : f32[4]
          return %a, %a as "other"
        }""",
        ["cse"],
    )


def test_side_effects_never_merge():
    @dataclass(frozen=True, eq=False)
    class EffectfulAdd(BINARY_OPS["add"]):
        has_side_effects: ClassVar[bool] = True

    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2,)))
    a = g.add1(EffectfulAdd(), [x, x])
    b = g.add1(EffectfulAdd(), [x, x])
    g.add_output(g.add1(BINARY_OPS["mul"](), [a, b]), "y")
    run_passes(g, ["cse"], PassContext(verify_each=True))
    assert len(g.nodes) == 3
