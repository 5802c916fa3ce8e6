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


def _with_random_weights(proto: onnx.ModelProto, r: np.random.Generator) -> onnx.ModelProto:
    """The light models build their weights with ConstantOfShape (constant fills); replace each by
    a random initializer of that shape, so the comparison exercises real convolutions."""
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    shapes = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    keep = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in shapes:
            shape = tuple(int(d) for d in shapes[n.input[0]])
            if len(shape) == 1:  # biases, batch-norm statistics: positive and near 1 keeps variances valid
                w = r.uniform(0.5, 1.5, shape)
            else:
                w = r.standard_normal(shape) * np.sqrt(2.0 / max(1, int(np.prod(shape[1:]))))
            m.graph.initializer.append(numpy_helper.from_array(w.astype(np.float32), n.output[0]))
        else:
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    return m


@pytest.mark.parametrize("name", ["bvlc_alexnet", "resnet50", "squeezenet", "inception_v1", "shufflenet"])
def test_light_model_with_random_weights_matches_onnxruntime(name):
    from tests.helpers import rng, run_ingot, run_ort

    r = rng()
    proto = _with_random_weights(onnx.load(str(LIGHT / f"light_{name}.onnx")), r)
    inits = {t.name for t in proto.graph.initializer}
    (inp,) = [i for i in proto.graph.input if i.name not in inits]
    x = r.standard_normal((1, 3, 224, 224)).astype(np.float32)
    got, want = run_ingot(proto, {inp.name: x}), run_ort(proto, {inp.name: x})
    for k in want:
        assert got[k].shape == want[k].shape
        np.testing.assert_allclose(got[k], want[k], rtol=1e-3, atol=1e-5 * float(np.abs(want[k]).max()),
                                   err_msg=f"{name}: {k}")
        assert np.abs(want[k]).max() > 0 and np.std(want[k]) > 0, "degenerate reference output"
