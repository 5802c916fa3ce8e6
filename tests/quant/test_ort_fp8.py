"""The FP8 weight path agrees with onnxruntime's QuantizeLinear/DequantizeLinear (E4M3, saturating)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ingot.ir.quant import formats as F
from tests.helpers import run_ort
from tests.quant.test_formats import hard_values


def qdq_model(shape: tuple[int, int], scale: np.ndarray, axis: int) -> onnx.ModelProto:
    zp = helper.make_tensor("zp", TensorProto.FLOAT8E4M3FN, list(scale.shape), [0.0] * scale.size)
    sc = helper.make_tensor("scale", TensorProto.FLOAT, list(scale.shape), scale.reshape(-1).tolist())
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], axis=axis),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], axis=axis)]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("q", TensorProto.FLOAT8E4M3FN, list(shape)),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], [sc, zp])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("granularity", ["tensor", "channel"])
def test_fp8_matches_onnxruntime(granularity):
    pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(7)
    w = hard_values(rng, 48, 96)
    q, s = F.quantize_fp8(w, granularity)
    # a scale from a smaller range too, so some values saturate
    for scale in (s, (s / 4).astype(np.float32)):
        got_q, _ = F.quantize_fp8(w, granularity, scale=scale)
        out = run_ort(qdq_model(w.shape, scale, axis=0), {"x": w})
        assert np.array_equal(out["q"].view(np.uint8), got_q.view(np.uint8))
        assert np.array_equal(out["y"], F.dequantize_fp8(got_q, scale, granularity))
