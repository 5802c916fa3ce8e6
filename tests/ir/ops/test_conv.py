"""Conv, ConvTranspose, Col2Im, DeformConv against onnxruntime (and ONNX's reference for DeformConv)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ingot.frontend.onnx import import_onnx
from tests.helpers import assert_close, assert_text_roundtrip, make_model, rng, run_ingot, run_ort

F = TensorProto.FLOAT


def _conv_model(op: str, xs, ws, with_bias: bool, out_rank: int, **attrs) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info("x", F, xs), helper.make_tensor_value_info("w", F, ws)]
    names = ["x", "w"]
    if with_bias:
        m = ws[0] if op == "Conv" else ws[1] * attrs.get("group", 1)
        ins.append(helper.make_tensor_value_info("b", F, [m]))
        names.append("b")
    node = helper.make_node(op, names, ["y"], **attrs)
    return make_model(node, ins, [helper.make_tensor_value_info("y", F, None)])


def _check(model: onnx.ModelProto, feeds: dict) -> None:
    got = run_ingot(model, feeds)["y"]
    exp = run_ort(model, feeds)["y"]
    assert_close(got, exp, rtol=1e-4, atol=1e-4)
    g = import_onnx(model)
    assert_text_roundtrip(g)
    assert g.outputs[0].type.shape == exp.shape  # static shape inference is exact


CONV_CASES = [
    # x shape, w shape, attrs
    ((2, 3, 9), (4, 3, 3), {}),
    ((1, 4, 10, 9), (6, 2, 3, 3), dict(group=2, strides=[2, 1], pads=[1, 0, 2, 1])),
    ((1, 3, 11, 12), (5, 3, 3, 2), dict(dilations=[2, 3], strides=[1, 2])),
    ((1, 3, 7, 8), (4, 3, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    ((1, 3, 7, 8), (4, 3, 4, 4), dict(auto_pad="SAME_LOWER", strides=[2, 3])),
    ((1, 3, 7, 8), (4, 3, 3, 3), dict(auto_pad="VALID", strides=[2, 2])),
    ((2, 6, 8, 8), (6, 1, 3, 3), dict(group=6, pads=[1, 1, 1, 1])),  # depthwise
    ((1, 8, 5, 5), (4, 8, 1, 1), {}),  # pointwise fast path
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), dict(strides=[1, 2, 2], pads=[1, 0, 1, 0, 1, 1])),
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv(xs, ws, attrs, bias):
    r = rng()
    model = _conv_model("Conv", list(xs), list(ws), bias, len(xs), **attrs)
    feeds = {"x": r.standard_normal(xs).astype(np.float32), "w": r.standard_normal(ws).astype(np.float32)}
    if bias:
        feeds["b"] = r.standard_normal(ws[0]).astype(np.float32)
    _check(model, feeds)


CONVT_CASES = [
    ((1, 2, 5), (2, 3, 3), {}),
    ((1, 2, 4, 5), (2, 3, 3, 3), dict(strides=[2, 3])),
    ((1, 2, 4, 5), (2, 3, 3, 3), dict(strides=[2, 2], pads=[1, 0, 1, 2], output_padding=[1, 1])),
    ((1, 4, 3, 3), (4, 2, 2, 3), dict(group=2, dilations=[2, 1], strides=[2, 1])),
    ((1, 1, 3, 3), (1, 2, 3, 3), dict(strides=[3, 2], output_shape=[10, 8])),
    ((1, 1, 3, 3), (1, 2, 3, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 2, 3, 4, 3), (2, 2, 2, 2, 2), dict(strides=[2, 1, 2])),
]


@pytest.mark.parametrize("xs,ws,attrs", CONVT_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose(xs, ws, attrs, bias):
    r = rng()
    model = _conv_model("ConvTranspose", list(xs), list(ws), bias, len(xs), **attrs)
    feeds = {"x": r.standard_normal(xs).astype(np.float32), "w": r.standard_normal(ws).astype(np.float32)}
    if bias:
        feeds["b"] = r.standard_normal(ws[1] * attrs.get("group", 1)).astype(np.float32)
    _check(model, feeds)


def test_conv_float16_and_dynamic_batch():
    r = rng()
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    model = make_model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["N", 3, 6, 6]),
                              helper.make_tensor_value_info("w", TensorProto.FLOAT16, [2, 3, 3, 3])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)])
    g = import_onnx(model)
    assert g.outputs[0].type.shape == ("N", 2, 6, 6)
    feeds = {"x": r.standard_normal((3, 3, 6, 6)).astype(np.float16),
             "w": r.standard_normal((2, 3, 3, 3)).astype(np.float16)}
    assert_close(run_ingot(model, feeds)["y"], run_ort(model, feeds)["y"], rtol=1e-2, atol=1e-2)


def test_col2im():
    r = rng()
    node = helper.make_node("Col2Im", ["x", "img", "blk"], ["y"], strides=[1, 2], pads=[1, 0, 0, 1],
                            dilations=[1, 2])
    img = np.array([5, 6], np.int64)
    blk = np.array([2, 2], np.int64)
    # number of blocks: ((5+1-2)//1+1) * ((6+1-3)//2+1) = 5 * 3
    model = make_model(node, [helper.make_tensor_value_info("x", F, [2, 3 * 4, 15])],
                       [helper.make_tensor_value_info("y", F, None)],
                       initializers=[onnx.numpy_helper.from_array(img, "img"),
                                     onnx.numpy_helper.from_array(blk, "blk")])
    feeds = {"x": r.standard_normal((2, 12, 15)).astype(np.float32)}
    _check(model, feeds)


@pytest.mark.parametrize("with_mask", [False, True])
def test_deform_conv(with_mask):
    from onnx.reference import ReferenceEvaluator

    r = rng()
    names = ["x", "w", "off", "b"] + (["mask"] if with_mask else [])
    node = helper.make_node("DeformConv", names, ["y"], pads=[1, 1, 1, 1], offset_group=2, group=2,
                            strides=[1, 2])
    oh, ow = 6, 4
    shapes = {"x": [1, 4, 5, 6], "w": [4, 2, 2, 2], "off": [1, 2 * 2 * 4, oh, ow], "b": [4],
              "mask": [1, 2 * 4, oh, ow]}
    model = make_model(node, [helper.make_tensor_value_info(n, F, shapes[n]) for n in names],
                       [helper.make_tensor_value_info("y", F, None)], opset=22)
    feeds = {n: r.standard_normal(shapes[n]).astype(np.float32) for n in names}
    got = run_ingot(model, feeds)["y"]
    exp = ReferenceEvaluator(model).run(None, feeds)[0]
    assert_close(got, exp.astype(np.float32), rtol=1e-4, atol=1e-4)
    assert_text_roundtrip(import_onnx(model))
