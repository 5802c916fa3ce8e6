"""Small ONNX models built in the tests (no files, no downloads)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tests.helpers import rng


def cast_model(weight: np.ndarray | None = None) -> onnx.ModelProto:
    """y = cast(x, f16); w_out = identity(w): a graph with one input, one weight, two outputs."""
    if weight is None:
        weight = rng().standard_normal((4, 3)).astype(np.float32)
    x = helper.make_tensor_value_info("x", T.FLOAT, ["B", 3])
    nodes = [
        helper.make_node("Cast", ["x"], ["y"], to=T.FLOAT16, name="cast_x"),
        helper.make_node("Identity", ["w"], ["w_out"], name="copy_w"),
    ]
    g = helper.make_graph(
        nodes, "cast_model", [x],
        [helper.make_tensor_value_info("y", T.FLOAT16, ["B", 3]),
         helper.make_tensor_value_info("w_out", T.FLOAT, list(weight.shape))],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def save(model: onnx.ModelProto, path: Path, external: bool = False) -> Path:
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=0)
    else:
        onnx.save_model(model, str(path))
    return path
