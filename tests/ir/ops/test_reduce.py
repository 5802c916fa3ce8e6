"""Reductions and arg_max/arg_min: ingot vs onnxruntime on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as oh

from ingot.frontend.onnx import ImportError_, import_onnx
from ingot.ir.op import OpError
from ingot.ir.ops.reduce import ReduceSum
from ingot.ir.types import UNKNOWN, DType, TensorType
from tests.helpers import rng
from tests.ir.ops._ort_check import build, check

REDUCE_OPS = [
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
]


def _data(op: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    r = rng()
    mag = r.uniform(0.5, 1.5, shape)
    if op != "ReduceLogSum":  # log of a sum needs positive sums
        mag = mag * r.choice([-1.0, 1.0], shape)
    return mag.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("axes,keepdims", [(None, 1), ((1,), 0), ((0, -1), 1), ((-2,), 0)])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_const_axes(op: str, axes: tuple[int, ...] | None, keepdims: int, dtype: type) -> None:
    x = _data(op, (3, 4, 5), dtype)
    consts = {} if axes is None else {"axes": np.array(axes, np.int64)}
    node = oh.make_node(op, ["x", "axes"] if axes else ["x"], ["y"], keepdims=keepdims)
    got, model = check(node, {"x": x}, [dtype], opset=18, consts=consts)
    # the constant axes became an attribute: exact static output shape, no axes input
    g = import_onnx(model)
    (n,) = g.nodes
    assert len(n.inputs) == 1 and n.op.axes == axes
    assert n.outputs[0].type.shape == got["y"].shape


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceLogSumExp", "ReduceL2"])
def test_reduce_dynamic_axes(op: str, keepdims: int) -> None:
    x = _data(op, (2, 3, 4), np.float32)
    axes = np.array([rng().integers(-3, 3)], np.int64)
    node = oh.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
    _, model = check(node, {"x": x, "axes": axes}, [np.float32], opset=18)
    g = import_onnx(model)
    (n,) = g.nodes
    assert n.op.axes is None and n.inputs[1] is not None
    # inference cannot know which dims go; it knows the rank
    expected_rank = 3 if keepdims else 2
    assert g.outputs[0].type.rank == expected_rank
    inferred = n.op.infer([TensorType(DType.f32, (2, 3, 4)), TensorType(DType.i64, (1,))])[0]
    assert inferred.shape == (UNKNOWN,) * expected_rank


ATTR_FORM = [
    ("ReduceMean", 13), ("ReduceMax", 13), ("ReduceL1", 11), ("ReduceSum", 11), ("ReduceLogSumExp", 13),
    ("ReduceProd", 13),
]


@pytest.mark.parametrize("op,opset", ATTR_FORM)
def test_reduce_attribute_axes(op: str, opset: int) -> None:
    x = _data(op, (3, 2, 4), np.float32)
    node = oh.make_node(op, ["x"], ["y"], axes=[0, 2], keepdims=0)
    got, _ = check(node, {"x": x}, [np.float32], opset=opset)
    assert got["y"].shape == (2,)


@pytest.mark.parametrize("noop", [0, 1])
def test_reduce_empty_axes(noop: int) -> None:
    x = _data("ReduceSum", (3, 2, 2), np.float32)
    node = oh.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1, noop_with_empty_axes=noop)
    got, _ = check(node, {"x": x}, [np.float32], opset=13, consts={"axes": np.zeros(0, np.int64)})
    if noop:
        np.testing.assert_array_equal(got["y"], x)
    else:
        assert got["y"].shape == (1, 1, 1)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2",
                                "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"])
def test_reduce_empty_set_is_identity(op: str) -> None:
    x = np.zeros((2, 0, 4), np.float32)
    node = oh.make_node(op, ["x", "axes"], ["y"], keepdims=1)
    got, _ = check(node, {"x": x}, [np.float32], opset=20, consts={"axes": np.array([1], np.int64)})
    identity = {"ReduceProd": 1.0, "ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceLogSum": -np.inf,
                "ReduceLogSumExp": -np.inf}.get(op, 0.0)
    np.testing.assert_array_equal(got["y"], np.full((2, 1, 4), identity, np.float32))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceL1",
                                "ReduceSumSquare"])
def test_reduce_ints(op: str, dtype: type) -> None:
    x = rng().integers(-9, 10, (3, 4, 2)).astype(dtype)
    node = oh.make_node(op, ["x", "axes"], ["y"], keepdims=0)
    check(node, {"x": x}, [dtype], opset=18, consts={"axes": np.array([1], np.int64)})


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_bool(op: str) -> None:
    x = rng().integers(0, 2, (4, 3)).astype(bool)
    node = oh.make_node(op, ["x", "axes"], ["y"], keepdims=1)
    check(node, {"x": x}, [np.bool_], opset=20, consts={"axes": np.array([1], np.int64)})


def test_reduce_rejects_bad_inputs() -> None:
    with pytest.raises(OpError, match="bool"):
        ReduceSum().infer([TensorType(DType.bool, (2, 3))])
    with pytest.raises((OpError, ValueError), match="out of range"):
        ReduceSum(axes=(3,)).infer([TensorType(DType.f32, (2, 3))])
    with pytest.raises(OpError, match="repeat"):
        ReduceSum(axes=(1, -1)).infer([TensorType(DType.f32, (2, 3))])
    node = oh.make_node("ReduceMean", ["x", "axes"], ["y"])
    model = build(node, {"x": np.ones((2, 3), np.float32)}, [np.float32], 18,
                  consts={"axes": np.array([2], np.int64)})
    with pytest.raises(ImportError_, match="out of range"):
        import_onnx(model)


# -- arg_max / arg_min ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
@pytest.mark.parametrize("axis,keepdims,last", [(0, 1, 0), (1, 0, 0), (-1, 1, 1), (-2, 0, 1)])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_reduce(op: str, axis: int, keepdims: int, last: int, dtype: type) -> None:
    # few distinct values, so ties are common and select_last_index matters
    x = rng().integers(-3, 4, (3, 4, 5)).astype(dtype)
    node = oh.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)
    got, _ = check(node, {"x": x}, [np.int64], opset=13)
    assert got["y"].dtype == np.int64


@pytest.mark.parametrize("op", ["ReduceLogSumExp"])
def test_log_sum_exp_large_values_are_stable(op: str) -> None:
    x = (_data(op, (3, 4), np.float32) + np.float32(200)).astype(np.float32)  # exp(200) overflows f32
    got, _ = check(oh.make_node(op, ["x"], ["y"], keepdims=0), {"x": x}, [np.float32], opset=18)
    assert np.isfinite(got["y"]).all()


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL2"])
def test_f16_accumulates_in_f32(op: str) -> None:
    # a long f16 reduction (sum ~8000): an f16 running sum would stall at 4096, where its ulp (4)
    # exceeds twice the addends; accumulating in float32 and rounding once matches the reference
    x = rng().uniform(0.5, 1.5, (2, 8192)).astype(np.float16)
    node = oh.make_node(op, ["x", "axes"], ["y"], keepdims=0)
    check(node, {"x": x}, [np.float16], opset=18, consts={"axes": np.array([1], np.int64)})
