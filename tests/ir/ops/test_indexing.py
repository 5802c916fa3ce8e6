"""Gather/scatter families, TensorScatter, OneHot, Compress, NonZero, TopK, Unique against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ingot.frontend.onnx import import_onnx
from ingot.ir.types import DType, TensorType
from tests.helpers import assert_close, assert_text_roundtrip, make_model, rng, run_ingot, run_ort

F = TensorProto.FLOAT
I64 = TensorProto.INT64
I32 = TensorProto.INT32


def vi(name: str, elem: int = F, shape=None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def check(model: onnx.ModelProto, feeds: dict, exact_shapes: bool = True, reference=None) -> None:
    got = run_ingot(model, feeds)
    exp = reference(model, feeds) if reference else run_ort(model, feeds)
    g = import_onnx(model)
    for name, e in exp.items():
        assert_close(got[name], e, what=name)
    if exact_shapes:
        for v, name in zip(g.outputs, g.output_names):
            assert v.type.shape == exp[name].shape, f"{name}: inferred {v.type}, real {exp[name].shape}"
    assert_text_roundtrip(g)


def run_onnx_reference(model: onnx.ModelProto, feeds: dict) -> dict:
    from onnx.reference import ReferenceEvaluator

    ref = ReferenceEvaluator(model)
    names = [o.name for o in model.graph.output]
    return dict(zip(names, ref.run(names, feeds)))


def f32(r: np.random.Generator, *shape: int) -> np.ndarray:
    return r.standard_normal(shape).astype(np.float32)


# -- gather ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "axis,ishape,idtype", [(0, [3], I64), (1, [2, 2], I64), (-1, [4], I32), (2, [], I64)]
)
def test_gather(axis, ishape, idtype):
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)
    m = make_model(node, [vi("x", F, [4, 5, 6]), vi("i", idtype, ishape)], [vi("y")])
    r = rng()
    dim = [4, 5, 6][axis]
    idx = r.integers(-dim, dim, ishape).astype(helper.tensor_dtype_to_np_dtype(idtype))
    check(m, {"x": f32(r, 4, 5, 6), "i": idx})


def test_gather_symbolic():
    node = helper.make_node("Gather", ["emb", "ids"], ["y"], axis=0)
    m = make_model(node, [vi("emb", F, [50, 16]), vi("ids", I64, ["B", "S"])], [vi("y")])
    g = import_onnx(m)
    assert g.outputs[0].type == TensorType(DType.f32, ("B", "S", 16))
    r = rng()
    check(m, {"emb": f32(r, 50, 16), "ids": r.integers(0, 50, (2, 7)).astype(np.int64)}, exact_shapes=False)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)
    m = make_model(node, [vi("x", F, [3, 4]), vi("i", I64, [2, 4])], [vi("y")])
    r = rng()
    dim = [3, 4][axis]
    check(m, {"x": f32(r, 3, 4), "i": r.integers(-dim, dim, (2, 4)).astype(np.int64)})


@pytest.mark.parametrize("batch_dims,xshape,ishape", [
    (0, [4, 5, 6], [3, 2]), (0, [4, 5], [2, 3, 2]), (1, [3, 4, 5], [3, 2, 1]), (1, [2, 3, 4], [2, 2]),
    (2, [2, 3, 4, 5], [2, 3, 1]),
])
def test_gather_nd(batch_dims, xshape, ishape):
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)
    m = make_model(node, [vi("x", F, xshape), vi("i", I64, ishape)], [vi("y")])
    r = rng()
    k = ishape[-1]
    dims = np.array(xshape[batch_dims : batch_dims + k])
    idx = (r.random(ishape) * dims).astype(np.int64)
    check(m, {"x": f32(r, *xshape), "i": idx})


# -- scatter ---------------------------------------------------------------------------------------


def _unique_rows(r: np.random.Generator, n: int, dim: int, rows: int) -> np.ndarray:
    """(rows, n) indices in [0, dim), each column a permutation prefix (no duplicates per column)."""
    return np.stack([r.permutation(dim)[:rows] for _ in range(n)], axis=1)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(reduction, axis):
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=axis, reduction=reduction)
    m = make_model(node, [vi("x", F, [4, 5]), vi("i", I64, [3, 5] if axis == 0 else [4, 3]),
                          vi("u", F, [3, 5] if axis == 0 else [4, 3])], [vi("y")], opset=18)
    r = rng()
    if axis == 0:
        idx = _unique_rows(r, 5, 4, 3)
    else:
        idx = _unique_rows(r, 4, 5, 3).T
    if reduction != "none":  # duplicates are well defined for reductions
        idx[0, 0] = idx[-1, 0] if axis == 0 else idx[0, -1]
    idx = idx - np.where(r.random(idx.shape) < 0.3, [4, 5][axis], 0)  # some negative indices
    check(m, {"x": f32(r, 4, 5), "i": idx.astype(np.int64), "u": f32(r, *idx.shape)})


def test_scatter_deprecated():
    node = helper.make_node("Scatter", ["x", "i", "u"], ["y"], axis=1)
    m = make_model(node, [vi("x", F, [3, 4]), vi("i", I64, [3, 2]), vi("u", F, [3, 2])], [vi("y")], opset=10)
    r = rng()
    idx = np.stack([r.permutation(4)[:2] for _ in range(3)])
    check(m, {"x": f32(r, 3, 4), "i": idx.astype(np.int64), "u": f32(r, 3, 2)})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_scatter_nd(reduction, k):
    xshape = [4, 3, 5]
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)
    n = 3
    ushape = [n] + xshape[k:]
    m = make_model(node, [vi("x", F, xshape), vi("i", I64, [n, k]), vi("u", F, ushape)], [vi("y")], opset=18)
    r = rng()
    flat = r.permutation(int(np.prod(xshape[:k])))[:n]
    idx = np.stack(np.unravel_index(flat, xshape[:k]), axis=1)
    if reduction != "none":
        idx[1] = idx[0]
    check(m, {"x": f32(r, *xshape), "i": idx.astype(np.int64), "u": f32(r, *ushape)})


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("with_indices", [False, True])
def test_tensor_scatter(mode, with_indices):
    names = ["past", "upd"] + (["w"] if with_indices else [])
    node = helper.make_node("TensorScatter", names, ["y"], axis=2, mode=mode)
    ins = [vi("past", F, [2, 3, 8, 4]), vi("upd", F, [2, 3, 3, 4])]
    ins += [vi("w", I64, [2])] if with_indices else []
    m = make_model(node, ins, [vi("y")], opset=24)
    r = rng()
    feeds = {"past": f32(r, 2, 3, 8, 4), "upd": f32(r, 2, 3, 3, 4)}
    if with_indices:
        feeds["w"] = r.integers(0, 8 if mode == "circular" else 6, 2).astype(np.int64)
    check(m, feeds, reference=run_onnx_reference)


# -- one_hot, compress, non_zero -------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    node = helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=axis)
    m = make_model(node, [vi("i", I64, [3, 4]), vi("v", F, [2])], [vi("y")],
                   initializers=[numpy_helper.from_array(np.array(6, np.int64), "d")])
    r = rng()
    idx = r.integers(-6, 8, (3, 4)).astype(np.int64)  # includes out-of-range indices
    check(m, {"i": idx, "v": f32(r, 2)})


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress(axis):
    attrs = {} if axis is None else {"axis": axis}
    node = helper.make_node("Compress", ["x", "c"], ["y"], **attrs)
    n = 12 if axis is None else [3, 4][axis]
    m = make_model(node, [vi("x", F, [3, 4]), vi("c", TensorProto.BOOL, [n - 1])], [vi("y")])
    r = rng()
    check(m, {"x": f32(r, 3, 4), "c": r.random(n - 1) < 0.5}, exact_shapes=False)


def test_non_zero():
    node = helper.make_node("NonZero", ["x"], ["y"])
    m = make_model(node, [vi("x", F, [3, 4, 2])], [vi("y", I64)])
    r = rng()
    x = np.where(r.random((3, 4, 2)) < 0.5, 0, f32(r, 3, 4, 2)).astype(np.float32)
    check(m, {"x": x}, exact_shapes=False)
    assert import_onnx(m).outputs[0].type == TensorType(DType.i64, (3, "?"))


# -- topk, unique ----------------------------------------------------------------------------------


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis,k", [(-1, 3), (0, 2), (1, 5)])
def test_topk(largest, axis, k):
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    m = make_model(node, [vi("x", F, [4, 5])], [vi("v"), vi("i", I64)],
                   initializers=[numpy_helper.from_array(np.array([k], np.int64), "k")])
    r = rng()
    x = r.integers(-3, 4, (4, 5)).astype(np.float32)  # many ties: the lower index comes first
    check(m, {"x": x})


def test_topk_old_opset_int():
    node = helper.make_node("TopK", ["x"], ["v", "i"], axis=1, k=2)
    m = make_model(node, [vi("x", I32, [3, 6])], [vi("v", I32), vi("i", I64)], opset=1)
    r = rng()
    x = r.integers(-100, 100, (3, 6)).astype(np.int32)
    got = run_ingot(m, {"x": x})
    order = np.argsort(-x.astype(np.int64), axis=1, kind="stable")[:, :2]
    assert_close(got["i"], order.astype(np.int64))
    assert_close(got["v"], np.take_along_axis(x, order, axis=1))


@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_unique(sorted_, axis):
    attrs = {"sorted": sorted_} if axis is None else {"sorted": sorted_, "axis": axis}
    node = helper.make_node("Unique", ["x"], ["y", "idx", "inv", "cnt"], **attrs)
    m = make_model(node, [vi("x", F, [4, 3])], [vi("y"), vi("idx", I64), vi("inv", I64), vi("cnt", I64)])
    r = rng()
    x = r.integers(0, 3, (4, 3)).astype(np.float32)
    if axis is not None:  # make some slices repeat
        x = np.take(x, [0, 1, 0, 2][: x.shape[axis]], axis=axis)
    check(m, {"x": x}, exact_shapes=False)
