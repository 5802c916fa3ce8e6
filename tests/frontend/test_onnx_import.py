"""ONNX importer: errors that name the problem, external data, function inlining, const folding."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from ingot.frontend.onnx import ImportError_, UnsupportedOpsError, import_onnx
from ingot.ir.verify import verify
from ingot.runtime.cpu import run_graph
from tests.helpers import assert_close, rng
from tests.model_factory import cast_model, save


def test_truncated_file(tmp_path):
    p = save(cast_model(), tmp_path / "m.onnx")
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImportError_, match=r"m\.onnx: not a valid ONNX model \(truncated or corrupt"):
        import_onnx(p)


def test_missing_file(tmp_path):
    with pytest.raises(ImportError_, match="nothing.onnx: no such file"):
        import_onnx(tmp_path / "nothing.onnx")


def test_every_unsupported_op_is_listed():
    x = helper.make_tensor_value_info("x", T.FLOAT, [2])
    nodes = [
        helper.make_node("FrobnicateA", ["x"], ["a"], name="first_bad", domain="acme"),
        helper.make_node("Identity", ["a"], ["b"], name="fine"),
        helper.make_node("FrobnicateB", ["b"], ["y"], name="second_bad", domain="acme"),
    ]
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 3)])
    with pytest.raises(UnsupportedOpsError) as e:
        import_onnx(m)
    msg = str(e.value)
    assert "2 unsupported op(s) (FrobnicateA, FrobnicateB) in 2 node(s)" in msg
    assert "FrobnicateA (domain acme, opset 3) at node 'first_bad'" in msg
    assert "FrobnicateB (domain acme, opset 3) at node 'second_bad'" in msg
    assert [p[0] for p in e.value.problems] == ["first_bad", "second_bad"]


def test_missing_external_data_file(tmp_path):
    p = save(cast_model(), tmp_path / "ext.onnx", external=True)
    (tmp_path / "ext.onnx.data").unlink()
    with pytest.raises(ImportError_, match=r"initializer 'w': external data file .*ext\.onnx\.data.* does not exist"):
        import_onnx(p)


def test_short_external_data_file(tmp_path):
    p = save(cast_model(), tmp_path / "ext.onnx", external=True)
    data = tmp_path / "ext.onnx.data"
    data.write_bytes(data.read_bytes()[:10])
    with pytest.raises(ImportError_, match="too short"):
        import_onnx(p)


def test_external_weights_are_lazy_memory_maps(tmp_path):
    w = rng().standard_normal((16, 3)).astype(np.float32)
    p = save(cast_model(w), tmp_path / "ext.onnx", external=True)
    g = import_onnx(p)
    weight = next(iter(g.weights.values()))
    assert weight._array is None, "external weight was read at import"
    arr = weight.load()
    assert not arr.flags.owndata and not arr.flags.writeable, "expected a read-only view of the mapped file"
    assert_close(np.asarray(arr), w)


def test_model_local_function_is_inlined():
    # f(a, b) = Cast<to=attr>(Identity(a)); called twice, with different attribute values
    fn = helper.make_function(
        "local", "castfn", ["a"], ["out"],
        [helper.make_node("Identity", ["a"], ["t"]),
         helper.make_node("Cast", ["t"], ["out"], to=0)],
        opset_imports=[helper.make_opsetid("", 17)], attributes=["to"],
    )
    fn.node[1].attribute[0].ref_attr_name = "to"
    x = helper.make_tensor_value_info("x", T.FLOAT, [3])
    nodes = [
        helper.make_node("castfn", ["x"], ["h"], domain="local", name="call1", to=T.FLOAT16),
        helper.make_node("castfn", ["h"], ["y"], domain="local", name="call2", to=T.DOUBLE),
    ]
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", T.DOUBLE, [3])])
    m = helper.make_model(g, functions=[fn], opset_imports=[helper.make_opsetid("", 17),
                                                            helper.make_opsetid("local", 1)])
    graph = import_onnx(m)
    verify(graph)
    assert [n.op.name for n in graph.nodes] == ["identity", "cast", "identity", "cast"]
    xv = rng().standard_normal(3).astype(np.float32)
    assert_close(run_graph(graph, {"x": xv})["y"], xv.astype(np.float16).astype(np.float64))


def test_undefined_input_is_named():
    x = helper.make_tensor_value_info("x", T.FLOAT, [2])
    g = helper.make_graph([helper.make_node("Identity", ["ghost"], ["y"], name="n1")], "g", [x],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ImportError_, match="node 'n1' \\(Identity\\): input 'ghost' is not defined"):
        import_onnx(m)


def test_unsupported_element_type_is_named():
    x = helper.make_tensor_value_info("s", T.STRING, [2])
    g = helper.make_graph([helper.make_node("Identity", ["s"], ["y"])], "g", [x],
                          [helper.make_tensor_value_info("y", T.STRING, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ImportError_, match="graph input 's': element type STRING"):
        import_onnx(m)


def test_symbolic_dims_are_kept():
    g = import_onnx(cast_model())
    assert str(g.inputs[0].type) == "f32[B,3]"
    assert str(g.outputs[0].type) == "f16[B,3]"


def test_onnx_model_round_trip_through_save(tmp_path):
    m = cast_model()
    onnx.checker.check_model(m)
    p = save(m, tmp_path / "m.onnx")
    g = import_onnx(p)
    assert g.name == "main" and g.meta["source_format"] == "onnx"


def _if_model(cond_value: bool, as_input: bool = False):
    x = helper.make_tensor_value_info("x", T.FLOAT, [3])
    then_g = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["t_out"], to=T.DOUBLE)], "then", [],
        [helper.make_tensor_value_info("t_out", T.DOUBLE, [3])])
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["k"], ["e_out"])], "else", [],
        [helper.make_tensor_value_info("e_out", T.DOUBLE, [3])],
        initializer=[onnx.numpy_helper.from_array(np.array([7.0, 8.0, 9.0]), "k")])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="branchy")]
    inputs = [x]
    if as_input:
        inputs.append(helper.make_tensor_value_info("c", T.BOOL, []))
    else:
        nodes.insert(0, helper.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(
            np.array(cond_value))))
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", T.DOUBLE, [3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("cond", [True, False])
def test_if_with_constant_condition_inlines_the_taken_branch(cond):
    graph = import_onnx(_if_model(cond))
    verify(graph)
    xv = rng().standard_normal(3).astype(np.float32)
    got = run_graph(graph, {"x": xv})["y"]
    assert_close(got, xv.astype(np.float64) if cond else np.array([7.0, 8.0, 9.0]))
    assert "if" not in graph.op_histogram()


def test_if_with_data_dependent_condition_is_reported():
    with pytest.raises(UnsupportedOpsError, match="If .* at node 'branchy': the condition is not a compile-time"):
        import_onnx(_if_model(True, as_input=True))
