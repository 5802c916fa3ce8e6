"""DFT, STFT, window functions, MelWeightMatrix and Det against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ingot.frontend.onnx import import_onnx
from tests.helpers import assert_close, assert_text_roundtrip, make_model, rng, run_ingot, run_ort

F = TensorProto.FLOAT


def _i64(name: str, v) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(v, np.int64), name)


def _check(model, feeds, atol=1e-4):
    got, exp = run_ingot(model, feeds)["y"], run_ort(model, feeds)["y"]
    assert_close(got, exp, rtol=1e-4, atol=atol)
    g = import_onnx(model)
    assert_text_roundtrip(g)
    assert g.outputs[0].type.shape == exp.shape


# (complex input, inverse, onesided); a onesided transform takes a real input
DFT_KINDS = [(False, 0, 0), (True, 0, 0), (False, 0, 1), (False, 1, 0), (True, 1, 0)]


@pytest.mark.parametrize("complex_in,inverse,onesided", DFT_KINDS)
@pytest.mark.parametrize("axis,length", [(1, None), (2, None), (1, 12)])
def test_dft(complex_in, inverse, onesided, axis, length):
    shape = [2, 8, 6, 2 if complex_in else 1]
    names = ["x", "n" if length else "", "axis"]
    inits = [_i64("axis", axis)] + ([_i64("n", length)] if length else [])
    node = helper.make_node("DFT", names, ["y"], inverse=inverse, onesided=onesided)
    model = make_model(node, [helper.make_tensor_value_info("x", F, shape)],
                       [helper.make_tensor_value_info("y", F, None)], opset=20, initializers=inits)
    _check(model, {"x": rng().standard_normal(shape).astype(np.float32)})


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("with_window", [False, True])
def test_stft(onesided, with_window):
    r = rng()
    names = ["x", "step"] + (["w"] if with_window else ["", "len"])
    inits = [_i64("step", 3)] + ([] if with_window else [_i64("len", 8)])
    ins = [helper.make_tensor_value_info("x", F, [2, 30, 1])]
    feeds = {"x": r.standard_normal((2, 30, 1)).astype(np.float32)}
    if with_window:
        ins.append(helper.make_tensor_value_info("w", F, [8]))
        feeds["w"] = r.uniform(0, 1, 8).astype(np.float32)
    node = helper.make_node("STFT", names, ["y"], onesided=onesided)
    model = make_model(node, ins, [helper.make_tensor_value_info("y", F, None)], opset=17, initializers=inits)
    _check(model, feeds)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op, periodic):
    size = int(rng().integers(5, 40))
    node = helper.make_node(op, ["n"], ["y"], periodic=periodic)
    model = make_model(node, [], [helper.make_tensor_value_info("y", F, None)], opset=17,
                       initializers=[_i64("n", size)])
    _check(model, {}, atol=1e-6)


def test_mel_weight_matrix():
    names = ["bins", "dft", "sr", "lo", "hi"]
    inits = [_i64("bins", 8), _i64("dft", 64), _i64("sr", 8000),
             onnx.numpy_helper.from_array(np.array(100.0, np.float32), "lo"),
             onnx.numpy_helper.from_array(np.array(3500.0, np.float32), "hi")]
    node = helper.make_node("MelWeightMatrix", names, ["y"])
    model = make_model(node, [], [helper.make_tensor_value_info("y", F, None)], opset=17, initializers=inits)
    _check(model, {}, atol=1e-6)


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 3)])
def test_det(shape):
    node = helper.make_node("Det", ["x"], ["y"])
    model = make_model(node, [helper.make_tensor_value_info("x", F, list(shape))],
                       [helper.make_tensor_value_info("y", F, None)])
    _check(model, {"x": rng().standard_normal(shape).astype(np.float32)})
