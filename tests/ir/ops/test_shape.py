"""Shape and data-movement ops against onnxruntime, symbolic-dim type inference, text round-trip."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ingot.frontend.onnx import import_onnx
from ingot.ir.graph import Graph
from ingot.ir.ops.shape import Reshape, Slice, dim_div, reshape_dims
from ingot.ir.text import parse_graph
from ingot.ir.types import DType, TensorType
from ingot.ir.verify import verify
from tests.helpers import assert_close, assert_text_roundtrip, make_model, rng, run_ingot, run_ort

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def vi(name: str, elem: int = F, shape=None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def i64(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def graph_model(nodes, inputs, outputs, inits=(), opset: int = 21) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "t", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def check(model: onnx.ModelProto, feeds: dict, exact_shapes: bool = True) -> Graph:
    """ingot == onnxruntime on every output; static inferred shapes equal the real ones; text round-trips."""
    got = run_ingot(model, feeds)
    exp = run_ort(model, feeds)
    g = import_onnx(model)
    for name, e in exp.items():
        assert_close(got[name], e, what=name)
    if exact_shapes:
        for v, name in zip(g.outputs, g.output_names):
            assert v.type.shape == exp[name].shape, f"{name}: inferred {v.type}, real {exp[name].shape}"
    assert_text_roundtrip(g)
    return g


def f32(r: np.random.Generator, *shape: int) -> np.ndarray:
    return r.standard_normal(shape).astype(np.float32)


# -- reshape ---------------------------------------------------------------------------------------

RESHAPES = [
    ((2, 3, 4), [4, 6], 0),
    ((2, 3, 4), [0, -1], 0),
    ((2, 3, 4), [-1], 0),
    ((2, 3, 4), [2, 0, 2, 2], 0),
    ((2, 3, 4), [4, 3, 2], 0),
    ((0, 3, 4), [3, 4, 0], 1),  # allowzero: 0 is a real zero dim
    ((2, 1, 4), [1, -1, 2], 0),
]


@pytest.mark.parametrize("shape,target,allowzero", RESHAPES)
def test_reshape_constant_shape(shape, target, allowzero):
    node = helper.make_node("Reshape", ["x", "s"], ["y"], allowzero=allowzero)
    m = make_model(node, [vi("x", F, list(shape))], [vi("y")], initializers=[i64("s", target)])
    g = check(m, {"x": f32(rng(), *shape)})
    assert [n.op.name for n in g.nodes] == ["reshape"] and g.nodes[0].op.shape == tuple(target)


def test_reshape_dynamic_shape_input():
    node = helper.make_node("Reshape", ["x", "s"], ["y"])
    m = make_model(node, [vi("x", F, [2, 3, 4]), vi("s", I64, [3])], [vi("y")])
    g = check(m, {"x": f32(rng(), 2, 3, 4), "s": np.array([4, -1, 2], np.int64)}, exact_shapes=False)
    assert g.outputs[0].type == TensorType(DType.f32, ("?", "?", "?"))


def test_reshape_old_opset_attribute():
    node = helper.make_node("Reshape", ["x"], ["y"], shape=[3, -1])
    m = make_model(node, [vi("x", F, [2, 3, 2])], [vi("y")], opset=1)
    x = f32(rng(), 2, 3, 2)
    assert_close(run_ingot(m, {"x": x})["y"], x.reshape(3, 4))


def test_reshape_symbolic_constant_target():
    node = helper.make_node("Reshape", ["x", "s"], ["y"])
    m = make_model(node, [vi("x", F, ["B", "S", 64])], [vi("y")], initializers=[i64("s", [0, 0, 4, 16])])
    g = import_onnx(m)
    assert g.outputs[0].type == TensorType(DType.f32, ("B", "S", 4, 16))
    check(m, {"x": f32(rng(), 3, 5, 64)}, exact_shapes=False)


def test_reshape_symbolic_minus_one():
    assert reshape_dims(("B", "S", 4, 16), (0, 0, -1), False) == ("B", "S", 64)
    assert reshape_dims(("B", "S", 64), (-1, 64), False) == ("(B*S)", 64)
    assert reshape_dims(("(B*S)", 64), (0, 8, -1), False) == ("(B*S)", 8, 8)
    assert reshape_dims(("B", "?", 64), (0, -1), False) == ("B", "?")
    assert dim_div("((B*S)*4)", "S") == "(B*4)"
    assert dim_div("B", "S") is None
    with pytest.raises(ValueError):
        reshape_dims((2, 3), (4, 2), False)


def test_llm_shape_chain_infers_symbolic_reshape():
    """torch.onnx's Shape -> Gather -> Unsqueeze -> Concat -> Reshape chain keeps B and S."""
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Gather", ["sh", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["sh", "i1"], ["s"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["s1"]),
        helper.make_node("Concat", ["b1", "s1", "heads", "hd"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]),
        helper.make_node("Shape", ["x"], ["last"], start=-1),
    ]
    inits = [i64("i0", 0), i64("i1", 1), i64("ax0", [0]), i64("heads", [4]), i64("hd", [-1])]
    m = graph_model(nodes, [vi("x", F, ["B", "S", 64])], [vi("yt"), vi("last", I64)], inits)
    g = import_onnx(m)
    assert g.outputs[0].type == TensorType(DType.f32, ("B", 4, "S", 16))
    assert g.outputs[1].type == TensorType(DType.i64, (1,))
    assert g.outputs[1].producer.op.name == "constant"  # Shape of the static last dim folds to [64]
    reshape = next(n for n in g.nodes if n.op.name == "reshape")
    assert reshape.op.shape == ("B", "S", 4, -1) and reshape.inputs[1] is not None
    r = rng()
    for b, s in [(1, 3), (2, 7)]:
        check(m, {"x": f32(r, b, s, 64)}, exact_shapes=False)


def test_static_shape_chain_folds_to_constants():
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Slice", ["sh", "st", "en"], ["hw"]),
        helper.make_node("Concat", ["one", "hw"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [i64("st", [2]), i64("en", [4]), i64("one", [-1])]
    m = graph_model(nodes, [vi("x", F, [2, 3, 4, 5])], [vi("y")], inits)
    g = check(m, {"x": f32(rng(), 2, 3, 4, 5)})
    assert g.op_histogram() == {"reshape": 1} and g.nodes[0].op.shape == (-1, 4, 5)
    assert g.outputs[0].type.shape == (6, 4, 5)


# -- shape, size, transpose, concat ----------------------------------------------------------------


@pytest.mark.parametrize("start,end", [(0, None), (1, None), (-1, None), (0, -1), (1, 2), (-10, 10), (3, 1)])
def test_shape(start, end):
    attrs = {"start": start} if end is None else {"start": start, "end": end}
    node = helper.make_node("Shape", ["x"], ["y"], **attrs)
    m = make_model(node, [vi("x", F, ["B", 3, 4])], [vi("y", I64)])
    g = check(m, {"x": f32(rng(), 2, 3, 4)})
    assert g.outputs[0].type.dtype is DType.i64


def test_size():
    node = helper.make_node("Size", ["x"], ["y"])
    m = make_model(node, [vi("x", F, ["B", 3, 4])], [vi("y", I64)])
    g = check(m, {"x": f32(rng(), 5, 3, 4)})
    assert g.outputs[0].type == TensorType(DType.i64, ())


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1], [1, 0, 2]])
def test_transpose(perm):
    attrs = {} if perm is None else {"perm": perm}
    node = helper.make_node("Transpose", ["x"], ["y"], **attrs)
    m = make_model(node, [vi("x", F, [2, 3, 4])], [vi("y")])
    check(m, {"x": f32(rng(), 2, 3, 4)})


def test_transpose_symbolic():
    node = helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0, 2])
    g = import_onnx(make_model(node, [vi("x", F, ["B", "S", 8])], [vi("y")]))
    assert g.outputs[0].type.shape == ("S", "B", 8)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_concat(axis):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for k in range(3):
        shapes[k][axis] = k + 1
    node = helper.make_node("Concat", ["a", "b", "c"], ["y"], axis=axis)
    m = make_model(node, [vi(n, F, s) for n, s in zip("abc", shapes)], [vi("y")])
    r = rng()
    check(m, {n: f32(r, *s) for n, s in zip("abc", shapes)})


def test_concat_symbolic_axis():
    node = helper.make_node("Concat", ["past", "new"], ["y"], axis=1)
    m = make_model(node, [vi("past", F, ["B", "P", 8]), vi("new", F, ["B", "S", 8])], [vi("y")])
    g = import_onnx(m)
    assert g.outputs[0].type.shape == ("B", "(P+S)", 8)
    r = rng()
    check(m, {"past": f32(r, 2, 5, 8), "new": f32(r, 2, 1, 8)}, exact_shapes=False)
    node = helper.make_node("Concat", ["a", "b"], ["y"], axis=1)
    m = make_model(node, [vi("a", F, ["B", 3]), vi("b", F, ["?", 4])], [vi("y")])
    assert import_onnx(m).outputs[0].type.shape == ("B", 7)


# -- split -----------------------------------------------------------------------------------------


SPLITS = [
    # opset, shape, axis, split, num outputs, num_outputs attr
    (11, (6, 4), 0, [2, 4], 2, None),
    (11, (6, 4), 1, None, 2, None),
    (13, (6, 4), 0, [1, 2, 3], 3, None),
    (13, (6, 6), -1, None, 3, None),
    (18, (7, 4), 0, None, 3, 3),  # uneven: 3, 3, 1
    (18, (5, 4), 0, [2, 0, 3], 3, None),
]


@pytest.mark.parametrize("opset,shape,axis,split,n,num_outputs", SPLITS)
def test_split(opset, shape, axis, split, n, num_outputs):
    outs = [f"y{i}" for i in range(n)]
    attrs: dict = {"axis": axis}
    inputs, inits = ["x"], []
    if split is not None and opset < 13:
        attrs["split"] = split
    elif split is not None:
        inputs.append("s")
        inits.append(i64("s", split))
    if num_outputs is not None:
        attrs["num_outputs"] = num_outputs
    node = helper.make_node("Split", inputs, outs, **attrs)
    m = make_model(node, [vi("x", F, list(shape))], [vi(o) for o in outs], opset=opset, initializers=inits)
    check(m, {"x": f32(rng(), *shape)})


def test_split_symbolic():
    node = helper.make_node("Split", ["x"], ["a", "b"], axis=2, num_outputs=2)
    g = import_onnx(make_model(node, [vi("x", F, ["B", "S", 128])], [vi("a"), vi("b")], opset=18))
    assert [v.type.shape for v in g.outputs] == [("B", "S", 64)] * 2


# -- slice -----------------------------------------------------------------------------------------

SLICES = [
    # starts, ends, axes, steps
    ([0, 1], [2, 3], None, None),
    ([1], [1000], [1], None),
    ([-3], [-1], [-1], None),
    ([-1], [-1000], [2], [-1]),
    ([10], [1], [0], [-2]),
    ([0, 0, 3], [9223372036854775807, 2, -9223372036854775807], [0, 1, 2], [2, 1, -1]),
    ([100], [200], [1], None),  # empty after clamping
    ([-100], [100], [0], [3]),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice_input_form(starts, ends, axes, steps):
    names, inits = ["x", "st", "en"], [i64("st", starts), i64("en", ends)]
    if axes is not None or steps is not None:
        names.append("ax" if axes is not None else "")
        if axes is not None:
            inits.append(i64("ax", axes))
    if steps is not None:
        names.append("sp")
        inits.append(i64("sp", steps))
    node = helper.make_node("Slice", names, ["y"])
    m = make_model(node, [vi("x", F, [5, 6, 7])], [vi("y")], initializers=inits)
    g = check(m, {"x": f32(rng(), 5, 6, 7)})
    assert isinstance(g.nodes[0].op, Slice) and len(g.nodes[0].inputs) == 1  # params became attributes


def test_slice_dynamic_starts():
    node = helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])
    m = make_model(node, [vi("x", F, [5, 6, 7]), vi("st", I64, [1])], [vi("y")],
                   initializers=[i64("en", [100]), i64("ax", [1])])
    g = check(m, {"x": f32(rng(), 5, 6, 7), "st": np.array([-4], np.int64)}, exact_shapes=False)
    assert g.outputs[0].type.shape == (5, "?", 7)


def test_slice_attribute_form():
    node = helper.make_node("Slice", ["x"], ["y"], starts=[1, -3], ends=[100, -1], axes=[0, 2])
    m = make_model(node, [vi("x", F, [4, 5, 6])], [vi("y")], opset=9)
    g = check(m, {"x": f32(rng(), 4, 5, 6)})
    assert g.outputs[0].type.shape == (3, 5, 2)


def test_slice_symbolic():
    node = helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])
    inits = [i64("st", [0, 2]), i64("en", [9223372036854775807, 4]), i64("ax", [1, 2])]
    g = import_onnx(make_model(node, [vi("x", F, ["B", "S", 8])], [vi("y")], initializers=inits))
    assert g.outputs[0].type.shape == ("B", "S", 2)


# -- squeeze, unsqueeze, flatten -------------------------------------------------------------------


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [[0], [2, 0], [-1], None])
def test_squeeze(opset, axes):
    attrs, names, inits = {}, ["x"], []
    if axes is not None and opset < 13:
        attrs["axes"] = axes
    elif axes is not None:
        names.append("ax")
        inits.append(i64("ax", axes))
    node = helper.make_node("Squeeze", names, ["y"], **attrs)
    shape = [1, 3, 1, 4, 1] if axes != [-1] else [2, 3, 1]
    m = make_model(node, [vi("x", F, shape)], [vi("y")], opset=opset, initializers=inits)
    check(m, {"x": f32(rng(), *shape)})


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [[0], [1, 3], [-1], [4, 0, 2]])
def test_unsqueeze(opset, axes):
    attrs, names, inits = {}, ["x"], []
    if opset < 13:
        attrs["axes"] = axes
    else:
        names.append("ax")
        inits.append(i64("ax", axes))
    node = helper.make_node("Unsqueeze", names, ["y"], **attrs)
    m = make_model(node, [vi("x", F, [3, 4])], [vi("y")], opset=opset, initializers=inits)
    check(m, {"x": f32(rng(), 3, 4)})


def test_squeeze_unsqueeze_symbolic():
    nodes = [helper.make_node("Unsqueeze", ["x", "ax"], ["u"]),
             helper.make_node("Squeeze", ["u", "ax"], ["y"])]
    m = graph_model(nodes, [vi("x", F, ["B", "S"])], [vi("u"), vi("y")], [i64("ax", [1])])
    g = import_onnx(m)
    assert [v.type.shape for v in g.outputs] == [("B", 1, "S"), ("B", "S")]
    check(m, {"x": f32(rng(), 2, 3)}, exact_shapes=False)


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    node = helper.make_node("Flatten", ["x"], ["y"], axis=axis)
    m = make_model(node, [vi("x", F, [2, 3, 4])], [vi("y")])
    check(m, {"x": f32(rng(), 2, 3, 4)})


def test_flatten_then_reshape_symbolic():
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=2),
             helper.make_node("Reshape", ["f", "s"], ["y"])]
    m = graph_model(nodes, [vi("x", F, ["B", "S", 4, 16])], [vi("f"), vi("y")], [i64("s", [-1, 4, 16])])
    g = import_onnx(m)
    assert [v.type.shape for v in g.outputs] == [("(B*S)", 64), ("(B*S)", 4, 16)]
    check(m, {"x": f32(rng(), 2, 3, 4, 16)}, exact_shapes=False)


# -- expand, tile, pad -----------------------------------------------------------------------------


@pytest.mark.parametrize("xshape,target", [((3, 1), (2, 3, 4)), ((1, 4), (3, 1)), ((2, 1, 5), (2, 3, 1))])
def test_expand(xshape, target):
    node = helper.make_node("Expand", ["x", "s"], ["y"])
    m = make_model(node, [vi("x", F, list(xshape))], [vi("y")], initializers=[i64("s", target)])
    check(m, {"x": f32(rng(), *xshape)})


def test_expand_to_shape_of_other_input():
    """The usual mask broadcast: Expand(m, Shape(x)) keeps x's symbolic dims."""
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Expand", ["m", "sh"], ["y"]),
             helper.make_node("ConstantOfShape", ["sh"], ["z"],
                              value=numpy_helper.from_array(np.array([1], np.int32), "v"))]
    m = graph_model(nodes, [vi("x", F, ["B", "S", 8]), vi("m", F, [1, "S", 1])],
                    [vi("y"), vi("z", TensorProto.INT32)])
    g = import_onnx(m)
    assert g.outputs[0].type.shape == ("B", "S", 8)
    assert g.outputs[1].type == TensorType(DType.i32, ("B", "S", 8))
    r = rng()
    check(m, {"x": f32(r, 2, 5, 8), "m": f32(r, 1, 5, 1)}, exact_shapes=False)


@pytest.mark.parametrize("repeats", [[1, 1], [2, 3], [3, 1]])
def test_tile(repeats):
    node = helper.make_node("Tile", ["x", "r"], ["y"])
    m = make_model(node, [vi("x", F, [2, 3])], [vi("y")], initializers=[i64("r", repeats)])
    check(m, {"x": f32(rng(), 2, 3)})


PADS = [
    ("constant", [1, 0, 2, 3], None),
    ("reflect", [2, 1, 1, 2], None),
    ("edge", [0, 3, 2, 0], None),
    ("wrap", [1, 2, 3, 1], None),
    ("constant", [2, 1], [1]),
    ("constant", [1, 1], [-2]),
    ("constant", [-1, 2, 1, -2], None),  # negative pads crop
]


@pytest.mark.parametrize("mode,pads,axes", PADS)
def test_pad(mode, pads, axes):
    names, inits = ["x", "p", "v"], [i64("p", pads)]
    if axes is not None:
        names.append("ax")
        inits.append(i64("ax", axes))
    node = helper.make_node("Pad", names, ["y"], mode=mode)
    m = make_model(node, [vi("x", F, [4, 5]), vi("v", F, [])], [vi("y")], initializers=inits)
    r = rng()
    check(m, {"x": f32(r, 4, 5), "v": np.array(r.standard_normal(), np.float32)})


def test_pad_old_opset_and_symbolic():
    node = helper.make_node("Pad", ["x"], ["y"], pads=[0, 1, 0, 2], value=1.5)
    m = make_model(node, [vi("x", F, ["B", 3])], [vi("y")], opset=2)
    g = check(m, {"x": f32(rng(), 2, 3)}, exact_shapes=False)
    assert g.outputs[0].type.shape == ("B", 6)


# -- generators ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, np.array([2.5], np.float32), np.array([7], np.int64)])
def test_constant_of_shape(value):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value, "v")}
    node = helper.make_node("ConstantOfShape", ["s"], ["y"], **attrs)
    elem = F if value is None else helper.np_dtype_to_tensor_dtype(value.dtype)
    m = make_model(node, [vi("s", I64, [3])], [vi("y", elem)])
    check(m, {"s": rng().integers(0, 4, 3).astype(np.int64)}, exact_shapes=False)


@pytest.mark.parametrize("dtype,start,limit,delta", [
    (np.int64, 0, 10, 3), (np.int32, 10, -3, -4), (np.float32, 0.5, 3.7, 0.4), (np.float64, 1.0, -2.0, -0.3),
    (np.int64, 5, 2, 1),
])
def test_range(dtype, start, limit, delta):
    node = helper.make_node("Range", ["a", "b", "c"], ["y"])
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    m = make_model(node, [vi(n, elem, []) for n in "abc"], [vi("y", elem)])
    feeds = {n: np.array(v, dtype) for n, v in zip("abc", (start, limit, delta))}
    check(m, feeds, exact_shapes=False)


def test_range_symbolic_length():
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "i1"], ["s"]),
             helper.make_node("Range", ["zero", "s", "one"], ["pos"])]
    m = graph_model(nodes, [vi("x", F, ["B", "S", 8])], [vi("pos", I64)],
                    [i64("i1", 1), i64("zero", 0), i64("one", 1)])
    g = import_onnx(m)
    assert g.outputs[0].type == TensorType(DType.i64, ("S",))
    check(m, {"x": f32(rng(), 2, 5, 8)}, exact_shapes=False)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1, -7])
def test_trilu(upper, k):
    names, inits = ["x"], []
    if k is not None:
        names.append("k")
        inits.append(i64("k", k))
    node = helper.make_node("Trilu", names, ["y"], upper=upper)
    m = make_model(node, [vi("x", F, [2, 4, 5])], [vi("y")], initializers=inits)
    check(m, {"x": f32(rng(), 2, 4, 5)})


@pytest.mark.parametrize("k,dtype", [(0, None), (1, TensorProto.INT32), (-2, TensorProto.DOUBLE)])
def test_eye_like(k, dtype):
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    node = helper.make_node("EyeLike", ["x"], ["y"], **attrs)
    m = make_model(node, [vi("x", F, [4, 5])], [vi("y", dtype or F)])
    check(m, {"x": f32(rng(), 4, 5)})


# -- rearrangements --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    node = helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode)
    m = make_model(node, [vi("x", F, [2, 8, 3, 4])], [vi("y")], opset=13)
    check(m, {"x": f32(rng(), 2, 8, 3, 4)})


def test_space_to_depth():
    node = helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)
    m = make_model(node, [vi("x", F, [2, 3, 4, 6])], [vi("y")], opset=13)
    check(m, {"x": f32(rng(), 2, 3, 4, 6)})
    node = helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)
    g = import_onnx(make_model(node, [vi("x", F, ["N", 3, "(2*H)", 8])], [vi("y")], opset=13))
    assert g.outputs[0].type.shape == ("N", 12, "H", 4)


@pytest.mark.parametrize("shape,target,axes", [
    ((5, 6), [3, 8], None), ((4, 7, 3), [6, 4], [0, 1]), ((4, 7, 3), [2, 9], [-3, -2]),
])
def test_center_crop_pad(shape, target, axes):
    attrs = {} if axes is None else {"axes": axes}
    node = helper.make_node("CenterCropPad", ["x", "s"], ["y"], **attrs)
    m = make_model(node, [vi("x", F, list(shape))], [vi("y")], opset=18, initializers=[i64("s", target)])
    check(m, {"x": f32(rng(), *shape)})


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis, time_axis):
    node = helper.make_node("ReverseSequence", ["x", "l"], ["y"], batch_axis=batch_axis, time_axis=time_axis)
    shape = [5, 4, 3] if batch_axis == 1 else [4, 5, 3]
    m = make_model(node, [vi("x", F, shape), vi("l", I64, [4])], [vi("y")])
    r = rng()
    check(m, {"x": f32(r, *shape), "l": r.integers(1, 6, 4).astype(np.int64)})


# -- text form -------------------------------------------------------------------------------------


def test_symbolic_hint_text_roundtrip():
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, ("B", "S", 64)))
    s = g.add_input("s", TensorType(DType.i64, (4,)))
    y = g.add1(Reshape(shape=("B", "S", 4, -1)), [x, s])
    g.add_output(y)
    assert y.type.shape == ("B", "S", 4, 16)
    verify(g)
    assert_text_roundtrip(g)
    again = parse_graph(str(g))
    assert again.nodes[0].op == Reshape(shape=("B", "S", 4, -1))
    with pytest.raises(ValueError, match="symbolic"):
        g.add1(Reshape(shape=("B", 4)), [x])  # a symbolic target needs the runtime shape input


def test_llm_attention_shape_arithmetic_and_causal_mask():
    """Head split with Div on a shape value, position ids, and a causal mask built from S."""
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Slice", ["sh", "z1", "two"], ["bs"]),  # [B, S]
        helper.make_node("Gather", ["sh", "i2"], ["hidden"]),
        helper.make_node("Div", ["hidden", "heads"], ["hd"]),  # 64 / 4 via another family's op
        helper.make_node("Unsqueeze", ["hd", "z1"], ["hd1"]),
        helper.make_node("Concat", ["bs", "heads1", "hd1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Gather", ["sh", "i1"], ["s"]),
        helper.make_node("Unsqueeze", ["s", "z1"], ["s1"]),
        helper.make_node("Concat", ["s1", "s1"], ["ss"], axis=0),
        helper.make_node("ConstantOfShape", ["ss"], ["ones"],
                         value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Trilu", ["ones"], ["mask"], upper=0),
        helper.make_node("Concat", ["bs", "s1"], ["bss"], axis=0),
        helper.make_node("Slice", ["bss", "z1", "one"], ["b1"]),
        helper.make_node("Concat", ["b1", "one", "ss"], ["mshape"], axis=0),
        helper.make_node("Expand", ["mask", "mshape"], ["mask4"]),
    ]
    inits = [i64("z1", [0]), i64("one", [1]), i64("two", [2]), i64("i1", 1), i64("i2", 2), i64("heads", 4),
             i64("heads1", [4])]
    m = graph_model(nodes, [vi("x", F, ["B", "S", 64])], [vi("y"), vi("mask4")], inits)
    g = import_onnx(m)
    assert g.outputs[0].type == TensorType(DType.f32, ("B", "S", 4, 16))
    assert g.outputs[1].type == TensorType(DType.f32, ("B", 1, "S", "S"))
    r = rng()
    for b, s in [(1, 1), (2, 6)]:
        check(m, {"x": f32(r, b, s, 64)}, exact_shapes=False)


def test_torch_expand_pattern_with_where():
    """torch.onnx's expand(B, -1, -1): Where(Equal(shape, -1), 1, shape) feeding Expand."""
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Gather", ["sh", "i0"], ["b"]),
        helper.make_node("Unsqueeze", ["b", "z1"], ["b1"]),
        helper.make_node("Concat", ["b1", "m1", "m1"], ["target"], axis=0),
        helper.make_node("Shape", ["target"], ["tl"]),
        helper.make_node("ConstantOfShape", ["tl"], ["ones"],
                         value=numpy_helper.from_array(np.ones(1, np.int64))),
        helper.make_node("Mul", ["ones", "neg"], ["negs"]),
        helper.make_node("Equal", ["target", "negs"], ["eq"]),
        helper.make_node("Where", ["eq", "ones", "target"], ["fixed"]),
        helper.make_node("Expand", ["table", "fixed"], ["y"]),
    ]
    inits = [i64("i0", 0), i64("z1", [0]), i64("m1", [-1]), i64("neg", -1)]
    m = graph_model(nodes, [vi("x", F, ["B", "S"]), vi("table", F, [1, 5, 8])], [vi("y")], inits)
    g = import_onnx(m)
    assert g.outputs[0].type == TensorType(DType.f32, ("B", 5, 8))
    r = rng()
    check(m, {"x": f32(r, 3, 2), "table": f32(r, 1, 5, 8)}, exact_shapes=False)


def test_slice_to_own_symbolic_dim_and_reshape_with_unknown_entry():
    """x[:, :x.shape[1]] keeps S; a reshape target with one runtime-only entry still infers it."""
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Slice", ["sh", "one", "two"], ["s1"]),
        helper.make_node("Slice", ["x", "zero", "s1", "one"], ["y"]),
        helper.make_node("Gather", ["sh", "i0"], ["b"]),
        helper.make_node("Unsqueeze", ["b", "zero"], ["b1"]),
        helper.make_node("Concat", ["b1", "n", "c"], ["target"], axis=0),  # n: a runtime input
        helper.make_node("Reshape", ["x", "target"], ["z"]),
    ]
    inits = [i64("zero", [0]), i64("one", [1]), i64("two", [2]), i64("i0", 0), i64("c", [4])]
    m = graph_model(nodes, [vi("x", F, ["B", "S", 8]), vi("n", I64, [1])], [vi("y"), vi("z")], inits)
    g = import_onnx(m)
    assert g.outputs[0].type.shape == ("B", "S", 8)
    assert g.outputs[1].type.shape == ("B", "(S*2)", 4)
    r = rng()
    for n in (-1, 6):  # the runtime entry may be -1 or the value itself
        check(m, {"x": f32(r, 2, 3, 8), "n": np.array([n], np.int64)}, exact_shapes=False)
