"""Text form: printing and parsing round-trip; parse errors name the problem."""

import numpy as np
import pytest

from ingot.ir.graph import Graph, Weight
from ingot.ir.ops.core import Cast, Constant, Identity
from ingot.ir.text import ParseError, parse_graph, print_graph
from ingot.ir.types import DType, TensorType
from ingot.ir.verify import verify
from tests.helpers import assert_text_roundtrip, rng


def _graph() -> Graph:
    g = Graph("m")
    x = g.add_input("/model/input ids:0", TensorType(DType.f32, ("batch", 3, "?")))
    w = g.add_weight("w.0", Weight.from_array(rng().standard_normal((2, 3)).astype(np.float32)))
    c = g.add1(Constant(value=rng().standard_normal((2, 2)).astype(np.float16)), [])
    b = g.add1(Constant(value=np.array([1, -2, 3], np.int64)), [], name="ints")
    y = g.add1(Cast(to=DType.bf16, saturate=False), [x], name="12")
    z = g.add1(Identity(), [w])
    g.add_output(y, "y out")
    g.add_output(z)
    g.add_output(c)
    g.add_output(b, "b")
    return g


def test_round_trip_names_types_constants():
    g = _graph()
    verify(g)
    assert_text_roundtrip(g)
    text = print_graph(g)
    assert '%"/model/input ids:0": f32[batch,3,?]' in text
    assert "{to=bf16, saturate=false}" in text
    assert 'return %12 as "y out"' in text


def test_parse_values_and_constants_exactly():
    g = _graph()
    again = parse_graph(print_graph(g))
    consts = [n.op.value for n in again.nodes if n.op.name == "constant"]
    orig = [n.op.value for n in g.nodes if n.op.name == "constant"]
    for a, b in zip(consts, orig):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_parse_supplies_weights():
    text = """
    graph @g(%x: f32[2]) weights(%w: f32[2]) {
      %y = identity(%w) : f32[2]
      return %y, %x
    }"""
    w = rng().standard_normal(2).astype(np.float32)
    g = parse_graph(text, weights={"w": w})
    np.testing.assert_array_equal(g.weights["w"].load(), w)
    g2 = parse_graph(text)
    with pytest.raises(ValueError, match="has no data"):
        g2.weights["w"].load()


@pytest.mark.parametrize(
    "text, match",
    [
        ("graph @g(%x: f32[2]) { %y = nope(%x) : f32[2] return %y }", "unknown op 'nope'"),
        ("graph @g(%x: f32[2]) { %y = identity(%z) : f32[2] return %y }", "%z is not defined"),
        ("graph @g(%x: q32[2]) { return %x }", "unknown dtype 'q32'"),
        ("graph @g(%x: f32[2]) { %y = cast(%x) {to=1} : f32[2] return %y }", "cast.to"),
        ("graph @g(%x: f32[2]) { %y = cast(%x) {color=1} : f32[2] return %y }", "no attribute"),
        ("graph @g(%x: f32[2]) { return %q }", "%q is not defined"),
    ],
)
def test_parse_errors(text, match):
    with pytest.raises((ParseError, ValueError, TypeError), match=match):
        parse_graph(text)
