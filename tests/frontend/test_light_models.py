"""The `light_*` CNN models in onnx's test data compile to artifacts and match their outputs.

Inputs follow onnx's backend test runner for these models (``arange(n) / n`` in the input's
shape); expected outputs are the ``*_output_0.pb`` files shipped beside each model; tolerances are
the runner's (densenet121 2e-3, others 1e-3 relative, 1e-7 absolute).
"""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import ingot

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = {
    "bvlc_alexnet": 1e-3, "densenet121": 2e-3, "inception_v1": 1e-3, "inception_v2": 1e-3,
    "resnet50": 1e-3, "shufflenet": 1e-3, "squeezenet": 1e-3, "vgg19": 1e-3, "zfnet512": 1e-3,
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_light_model(name, tmp_path):
    src = LIGHT / f"light_{name}.onnx"
    proto = onnx.load(str(src))
    inits = {t.name for t in proto.graph.initializer}
    (inp,) = [i for i in proto.graph.input if i.name not in inits]
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in inp.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    x = (np.arange(n).reshape(shape) / n).astype(np.float32)
    expected = numpy_helper.to_array(onnx.load_tensor(str(LIGHT / f"light_{name}_output_0.pb")))

    model = ingot.load(ingot.compile(src, target="cpu", out=tmp_path / f"{name}.ingot", mode="graph"))
    (got,) = model.run({inp.name: x}).values()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=MODELS[name], atol=1e-7)
