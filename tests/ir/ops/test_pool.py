"""Pooling ops and Dropout against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from ingot.frontend.onnx import import_onnx
from tests.helpers import assert_close, assert_text_roundtrip, make_model, rng, run_ingot, run_ort

F = TensorProto.FLOAT


def _model(op: str, shape, n_out: int = 1, dtype=F, **attrs):
    outs = ["y", "i"][:n_out]
    node = helper.make_node(op, ["x"], outs, **attrs)
    return make_model(node, [helper.make_tensor_value_info("x", dtype, list(shape))],
                      [helper.make_tensor_value_info(o, dtype if o == "y" else TensorProto.INT64, None)
                       for o in outs])


def _check(model, x):
    got = run_ingot(model, {"x": x})
    exp = run_ort(model, {"x": x})
    for k in exp:
        assert_close(got[k], exp[k], what=k)
    g = import_onnx(model)
    assert_text_roundtrip(g)
    assert g.outputs[0].type.shape == exp["y"].shape


POOL_CASES = [
    ((2, 3, 9), dict(kernel_shape=[3])),
    ((1, 2, 7, 8), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1])),
    ((1, 2, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ((1, 2, 8, 9), dict(kernel_shape=[2, 3], strides=[3, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    ((1, 2, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 7, 8), dict(kernel_shape=[2, 2], strides=[2, 3], auto_pad="SAME_LOWER")),
    ((1, 2, 7, 8), dict(kernel_shape=[2, 2], auto_pad="VALID")),
    ((1, 2, 9, 9), dict(kernel_shape=[2, 2], dilations=[2, 3])),
    ((1, 2, 5, 6, 7), dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 1])),
]


@pytest.mark.parametrize("shape,attrs", POOL_CASES)
def test_max_pool(shape, attrs):
    x = rng().standard_normal(shape).astype(np.float32)
    _check(_model("MaxPool", shape, **attrs), x)


@pytest.mark.parametrize("shape,attrs", [c for c in POOL_CASES if len(c[0]) == 4 and "dilations" not in c[1]])
@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices(shape, attrs, storage_order):
    x = rng().standard_normal((2,) + shape[1:]).astype(np.float32)
    _check(_model("MaxPool", (2,) + shape[1:], n_out=2, storage_order=storage_order, **attrs), x)


def test_max_pool_uint8():
    x = rng().integers(0, 255, (1, 3, 6, 6), dtype=np.uint8)
    _check(_model("MaxPool", x.shape, dtype=TensorProto.UINT8, kernel_shape=[3, 3], pads=[1, 1, 1, 1]), x)


@pytest.mark.parametrize("shape,attrs", [c for c in POOL_CASES if "dilations" not in c[1]])
@pytest.mark.parametrize("cip", [0, 1])
def test_average_pool(shape, attrs, cip):
    x = rng().standard_normal(shape).astype(np.float32)
    _check(_model("AveragePool", shape, count_include_pad=cip, **attrs), x)


@pytest.mark.parametrize("shape,attrs", [c for c in POOL_CASES
                                         if "dilations" not in c[1] and "ceil_mode" not in c[1]])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(shape, attrs, p):
    x = rng().standard_normal(shape).astype(np.float32)
    _check(_model("LpPool", shape, p=p, **attrs), x)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 5, 6), (1, 2, 3, 4, 5)])
def test_global_pools(op, shape):
    x = rng().standard_normal(shape).astype(np.float32)
    _check(_model(op, shape), x)


def test_max_unpool_roundtrip():
    r = rng()
    x = r.standard_normal((1, 2, 6, 8)).astype(np.float32)
    pool = _model("MaxPool", x.shape, n_out=2, kernel_shape=[2, 2], strides=[2, 2])
    pooled = run_ort(pool, {"x": x})
    node = helper.make_node("MaxUnpool", ["v", "idx"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    model = make_model(node, [helper.make_tensor_value_info("v", F, [1, 2, 3, 4]),
                              helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 2, 3, 4])],
                       [helper.make_tensor_value_info("y", F, None)])
    feeds = {"v": pooled["y"], "idx": pooled["i"]}
    got, exp = run_ingot(model, feeds)["y"], run_ort(model, feeds)["y"]
    assert_close(got, exp)
    assert np.count_nonzero(got) == 24
    assert_text_roundtrip(import_onnx(model))


@pytest.mark.parametrize("opset", [12, 13])
def test_dropout_inference(opset):
    x = rng().standard_normal((3, 4)).astype(np.float32)
    node = helper.make_node("Dropout", ["x"], ["y", "m"], **({"ratio": 0.3} if opset < 12 else {}))
    model = make_model(node, [helper.make_tensor_value_info("x", F, [3, 4])],
                       [helper.make_tensor_value_info("y", F, None),
                        helper.make_tensor_value_info("m", TensorProto.BOOL, None)], opset=opset)
    got, exp = run_ingot(model, {"x": x}), run_ort(model, {"x": x})
    assert_close(got["y"], exp["y"])
    assert_close(got["m"], exp["m"])
    assert_text_roundtrip(import_onnx(model))


def test_dropout_training_mode_false_input():
    x = rng().standard_normal((3, 4)).astype(np.float32)
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "m"])
    model = make_model(node, [helper.make_tensor_value_info("x", F, [3, 4]),
                              helper.make_tensor_value_info("r", F, []),
                              helper.make_tensor_value_info("t", TensorProto.BOOL, [])],
                       [helper.make_tensor_value_info("y", F, None),
                        helper.make_tensor_value_info("m", TensorProto.BOOL, None)])
    feeds = {"x": x, "r": np.array(0.7, np.float32), "t": np.array(False)}
    got, exp = run_ingot(model, feeds), run_ort(model, feeds)
    assert_close(got["y"], exp["y"])
    assert_close(got["m"], exp["m"])
    with pytest.raises(RuntimeError, match="training-mode"):
        run_ingot(model, {**feeds, "t": np.array(True)})
