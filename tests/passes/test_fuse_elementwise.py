"""fuse-elementwise: Before/Expected and numerics."""

from __future__ import annotations

from ingot.ir.text import parse_graph
from ingot.passes import run_passes
from tests.passes.common import assert_same_outputs


def test_chain_becomes_one_node_with_a_body() -> None:
    text = """graph @m(%x: f32[T,8], %y: f32[T,8]) {
      %c = constant() {value=dense<f32[]>[0.5]} : f32[]
      %a = mul(%x, %c) : f32[T,8]
      %b = tanh(%a) : f32[T,8]
      %d = add(%b, %y) : f32[T,8]
      %e = softmax(%d) : f32[T,8]
      %f = exp(%e) : f32[T,8]
      %g = neg(%f) : f32[T,8]
      %h = sigmoid(%y) : f32[T,8]
      return %g, %h, %d
    }"""
    before, after = parse_graph(text), parse_graph(text)
    run_passes(after, ["fuse-elementwise"])
    hist = after.op_histogram()
    # mul+tanh+add fuse (add's result is an output, so it ends its group); exp+neg fuse; sigmoid alone
    assert hist == {"constant": 1, "fused_elementwise": 2, "softmax": 1, "sigmoid": 1}, hist
    fe = [n for n in after.nodes if n.op.name == "fused_elementwise"]
    assert "tanh(" in fe[0].op.body and "neg(" in fe[1].op.body
    assert_same_outputs(before, after)
    again = parse_graph(str(after))  # the body survives the text form
    assert_same_outputs(before, again)
