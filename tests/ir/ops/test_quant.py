"""Quantization ops: ingot vs onnxruntime on random inputs, plus exact numpy checks."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from ingot.frontend.onnx import import_onnx
from tests.helpers import assert_close, assert_text_roundtrip, make_model, rng, run_ingot, run_ort


def _vi(name: str, arr: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)


def _run_both(node, feeds, outs, opset=21, inits=()):
    model = make_model(node, [_vi(k, v) for k, v in feeds.items()],
                       [helper.make_empty_tensor_value_info(n) for n in outs],
                       opset=opset, initializers=list(inits))
    return model, run_ingot(model, feeds), run_ort(model, feeds)


@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8, np.int16, ml_dtypes.int4, ml_dtypes.uint4,
                                      ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
@pytest.mark.parametrize("granularity", ["tensor", "axis", "block"])
def test_quantize_dequantize_vs_ort(zp_dtype, granularity) -> None:
    r = rng()
    x = (r.standard_normal((4, 6)) * 20).astype(np.float32)
    x[0, 0] = 1e6  # saturates
    if granularity == "tensor":
        scale, attrs = np.array(0.7, np.float32), {}
    elif granularity == "axis":
        scale, attrs = (r.random(6) + 0.2).astype(np.float32), {"axis": 1}
    else:
        scale, attrs = (r.random((4, 2)) + 0.2).astype(np.float32), {"axis": 1, "block_size": 3}
    is_float = np.dtype(zp_dtype).kind == "V" or "float" in np.dtype(zp_dtype).name
    zp = np.zeros(scale.shape, zp_dtype) if is_float else (r.integers(0, 3, scale.shape)).astype(zp_dtype)
    zp_t = onnx.numpy_helper.from_array(zp, "zp")
    # onnxruntime's Python API cannot return int4/fp8 tensors: compare quantize -> dequantize with it,
    # and the quantized values themselves with onnx's reference evaluator.
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], **attrs)]
    feeds = {"x": x, "scale": scale}
    g = helper.make_graph(nodes, "t", [_vi(k, v) for k, v in feeds.items()],
                          [helper.make_empty_tensor_value_info(n) for n in ("y", "q")],
                          initializer=[zp_t])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    got = run_ingot(model, feeds)
    exp_y = run_ort(model.__class__.FromString(_only_output(model, "y")), feeds)["y"]
    assert_close(got["y"], exp_y, what="quantize -> dequantize")
    exp_q = ReferenceEvaluator(model).run(["q"], feeds)[0]
    assert got["q"].dtype == exp_q.dtype
    np.testing.assert_array_equal(got["q"].astype(np.float32), exp_q.astype(np.float32))
    assert_text_roundtrip(import_onnx(model))


def _only_output(model: onnx.ModelProto, name: str) -> bytes:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [o for o in m.graph.output if o.name == name]
    del m.graph.output[:]
    m.graph.output.extend(keep)
    return m.SerializeToString()


def test_quantize_rounds_half_to_even_and_saturates() -> None:
    from ingot.ir.ops.quant import quantize_array
    from ingot.ir.types import DType

    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 300.0, -300.0], np.float32)
    y = quantize_array(x, np.array(1.0, np.float32), None, DType.i8)
    np.testing.assert_array_equal(y, np.array([0, 2, 2, 0, -2, 127, -128], np.int8))
    y8 = quantize_array(np.array([1e4, -1e4], np.float32), np.array(1.0, np.float32), None, DType.f8e4m3fn)
    np.testing.assert_array_equal(y8.astype(np.float32), [448.0, -448.0])


def test_dynamic_quantize_linear_vs_ort() -> None:
    r = rng()
    x = (r.standard_normal((3, 5)) * 4 + 1).astype(np.float32)
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "zp"])
    model, got, exp = _run_both(node, {"x": x}, ["y", "s", "zp"], opset=11)
    for n in ("y", "zp"):
        np.testing.assert_array_equal(got[n], exp[n])
    assert_close(got["s"], exp["s"])
    assert_text_roundtrip(import_onnx(model))


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_matmul_vs_ort(dt) -> None:
    r = rng()
    info = np.iinfo(dt)
    a = r.integers(info.min, info.max, (2, 3, 8), endpoint=True).astype(dt)
    b = r.integers(info.min, info.max, (8, 4), endpoint=True).astype(dt)
    feeds = {"a": a, "as": np.array(0.02, np.float32), "azp": np.array(3, dt), "b": b,
             "bs": np.array(0.03, np.float32), "bzp": np.array(-2 if dt == np.int8 else 5, dt),
             "ys": np.array(0.5, np.float32), "yzp": np.array(7, dt)}
    node = helper.make_node("QLinearMatMul", list(feeds), ["y"])
    model, got, exp = _run_both(node, feeds, ["y"])
    np.testing.assert_allclose(got["y"].astype(np.int32), exp["y"].astype(np.int32), atol=1)
    assert got["y"].dtype == exp["y"].dtype
    assert_text_roundtrip(import_onnx(model))


def test_conv_integer_vs_ort() -> None:
    r = rng()
    x = r.integers(0, 255, (1, 2, 6, 6), endpoint=True).astype(np.uint8)
    w = r.integers(0, 255, (3, 2, 3, 3), endpoint=True).astype(np.uint8)
    feeds = {"x": x, "w": w, "xzp": np.array(10, np.uint8), "wzp": np.array(100, np.uint8)}
    node = helper.make_node("ConvInteger", list(feeds), ["y"], pads=[1, 1, 0, 0], strides=[1, 2])
    model, got, exp = _run_both(node, feeds, ["y"], opset=10)
    np.testing.assert_array_equal(got["y"], exp["y"])
    assert_text_roundtrip(import_onnx(model))


def test_qlinear_conv_vs_ort() -> None:
    r = rng()
    x = r.integers(0, 255, (1, 4, 5, 5), endpoint=True).astype(np.uint8)
    # 7-bit weights: on an x86 CPU without VNNI onnxruntime's u8 x s8 kernel adds pairs of products in int16
    # (vpmaddubsw) and saturates above 32767 (255 * 100 * 2 did, 8 steps off: its docs' reduce_range advice);
    # 255 * 64 * 2 does not
    w = r.integers(-64, 64, (4, 2, 3, 3)).astype(np.int8)
    feeds = {"x": x, "xs": np.array(0.05, np.float32), "xzp": np.array(120, np.uint8), "w": w,
             "ws": (r.random(4) * 0.05 + 0.01).astype(np.float32), "wzp": np.zeros(4, np.int8),
             "ys": np.array(0.8, np.float32), "yzp": np.array(100, np.uint8),
             "bias": r.integers(-500, 500, (4,)).astype(np.int32)}
    node = helper.make_node("QLinearConv", list(feeds), ["y"], group=2, auto_pad="SAME_UPPER")
    model, got, exp = _run_both(node, feeds, ["y"], opset=10)
    np.testing.assert_allclose(got["y"].astype(np.int32), exp["y"].astype(np.int32), atol=1)
    assert got["y"].dtype == exp["y"].dtype
