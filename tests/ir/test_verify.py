"""The verifier catches broken graphs and names the problem."""

import pytest

from ingot.ir.graph import Graph, Node, Value
from ingot.ir.ops.core import Cast, Identity
from ingot.ir.types import DType, TensorType
from ingot.ir.verify import VerifyError, verify


def _g():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, ("B", 4)))
    y = g.add1(Cast(to=DType.f16), [x], name="y")
    g.add_output(y)
    return g, x, y


def test_valid_graph_passes():
    g, _, _ = _g()
    verify(g)


def test_wrong_declared_type():
    g, _, y = _g()
    y.type = TensorType(DType.f32, ("B", 4))
    with pytest.raises(VerifyError, match=r"%y is declared f32\[B,4\], inferred f16\[B,4\]"):
        verify(g)


def test_use_before_definition():
    g, x, y = _g()
    orphan = Value("ghost", TensorType(DType.f32, (1,)))
    node = Node(Identity(), [orphan], [])
    node.outputs.append(Value("z", TensorType(DType.f32, (1,)), node, 0))
    g.nodes.insert(0, node)
    with pytest.raises(VerifyError, match="%ghost is used before it is defined"):
        verify(g)


def test_duplicate_names_and_undefined_output():
    g, x, y = _g()
    y.name = "x"
    g.outputs.append(Value("nowhere", TensorType(DType.f32, (1,))))
    g.output_names.append("nowhere")
    with pytest.raises(VerifyError) as e:
        verify(g)
    assert "defined twice" in str(e.value) and "graph output %nowhere is not defined" in str(e.value)


def test_symbolic_dims_are_not_silently_equal():
    g, _, y = _g()
    y.type = TensorType(DType.f16, ("S", 4))
    with pytest.raises(VerifyError, match="inferred"):
        verify(g)
    y.type = TensorType(DType.f16, ("B", "?"))
    verify(g)  # "?" is compatible with anything
