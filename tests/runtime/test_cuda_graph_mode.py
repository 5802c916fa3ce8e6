"""Graph-mode models whose ops have no template kernel run on the GPU through generated (TVM) kernels,
matching the CPU backend: onnx's nine light CNN models with random weights (``_with_random_weights``:
real convolutions, not constant fills), f32, 1e-3 relative; the graph-mode tiny Llama
(``tests/fixtures/tiny_llama.onnx``, dims bound to batch 1, seq 8), logits 1e-4 relative.

Both the artifact's CPU run and its GPU run use the same specialized graph. Generating the kernels
needs Apache TVM, or a kernel cache holding them (``INGOT_TVM_CACHE_DIR``: the GPU machine has no
TVM, so the cache is generated on a CPU machine with ``python -m tests.runtime.test_cuda_graph_mode
DIR`` and carried); without either the tests skip. ``INGOT_CUDA_REPORT=path`` writes the errors as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import ingot
from ingot.api import CompileError
from ingot.passes import PassContext
from tests.helpers import rng

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
          "vgg19", "zfnet512")
LLAMA_DIMS = {"batch": 1, "seq": 8}
REPORT: dict[str, object] = {}


def light_model(name: str, dst: Path, seed: int) -> tuple[Path, str, tuple[int, ...]]:
    """The light model with random weights saved under ``dst``: (path, input name, input shape)."""
    from tests.frontend.test_light_models import _with_random_weights

    proto = _with_random_weights(onnx.load(str(LIGHT / f"light_{name}.onnx")), np.random.default_rng(seed))
    inits = {t.name for t in proto.graph.initializer}
    (inp,) = [i for i in proto.graph.input if i.name not in inits]
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in inp.type.tensor_type.shape.dim)
    last = proto.graph.node[-1]
    if last.op_type == "Softmax":  # random weights saturate the softmax: compare its input (the logits) too
        proto.graph.output.append(onnx.helper.make_tensor_value_info(last.input[0], onnx.TensorProto.FLOAT, None))
    path = dst / f"{name}.onnx"
    onnx.save(proto, str(path))
    return path, inp.name, shape


def compile_graph(src: Path, target: str, out: Path, dims: dict[str, int] | None = None) -> Path:
    ctx = PassContext()
    if dims:
        ctx.options["cuda"] = dict(dims)
    return ingot.compile(src, target=target, out=out, mode="graph", pass_context=ctx)


def _compile_or_skip(src: Path, target: str, out: Path, dims: dict[str, int] | None = None) -> Path:
    try:
        return compile_graph(src, target, out, dims)
    except CompileError as e:
        if "Apache TVM is not installed" in str(e):
            pytest.skip("the generated kernels need Apache TVM or a kernel cache holding them (INGOT_TVM_CACHE_DIR)")
        raise


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    path = os.environ.get("INGOT_CUDA_REPORT")
    if path and os.environ.get("PYTEST_XDIST_WORKER"):
        path = f"{path}.{os.environ['PYTEST_XDIST_WORKER']}"
    if path and REPORT:
        old = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
        Path(path).write_text(json.dumps({**old, **REPORT}, indent=1, default=float))


def _compare(key: str, got: np.ndarray, want: np.ndarray, rtol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = float(np.abs(want).max())
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    REPORT[key] = {"max_abs_err": float(err.max()), "max_rel_err_vs_max": float(err.max() / max(scale, 1e-30)),
                   "max_abs_ref": scale, "shape": list(want.shape)}
    assert np.all(np.isfinite(got)), f"{key}: non-finite GPU outputs"
    assert scale > 0 and float(np.std(want)) > 0, f"{key}: degenerate reference output"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=key)


@pytest.mark.gpu
@pytest.mark.parametrize("name", MODELS)
def test_light_model_matches_cpu(gpu_target, name, tmp_path):
    seed = int(np.random.SeedSequence().entropy % (1 << 31))
    src, inp, shape = light_model(name, tmp_path, seed)
    path = _compile_or_skip(src, gpu_target, tmp_path / f"{name}.ingot")
    manifest = json.loads((path / "manifest.json").read_text())
    assert any(k["spec"]["family"] == "tvm" for k in manifest["cuda"]["kernels"].values())
    x = np.random.default_rng(seed + 1).standard_normal(shape).astype(np.float32)
    want = ingot.load(path, device="cpu").run({inp: x})
    model = ingot.load(path, device="cuda")
    got = model.run({inp: x})
    assert set(got) == set(want)
    for k in want:
        _compare(f"{name}/{k} (seed {seed})", got[k], want[k], 1e-3)


@pytest.mark.gpu
def test_tiny_llama_graph_mode_matches_cpu(gpu_target, tmp_path):
    path = _compile_or_skip(FIXTURES / "tiny_llama.onnx", gpu_target, tmp_path / "tiny.ingot", LLAMA_DIMS)
    r = rng()
    model = ingot.load(path, device="cuda")
    cpu = ingot.load(path, device="cpu")
    for trial in range(3):
        ids = r.integers(0, 256, (LLAMA_DIMS["batch"], LLAMA_DIMS["seq"])).astype(np.int64)
        want = cpu.run({"input_ids": ids})["logits"]
        got = model.run({"input_ids": ids})["logits"]
        _compare(f"tiny_llama/logits/{trial}", got, want, 1e-4)
    with pytest.raises(ValueError, match="shape"):
        model.run({"input_ids": np.zeros((1, 5), np.int64)})  # the artifact is static: seq 8 only


def build_cache(target: str = "h200") -> None:
    """Generate every kernel these tests need into the TVM kernel cache (a machine with TVM)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name in MODELS:
            src, _, _ = light_model(name, d, 0)
            compile_graph(src, target, d / f"{name}.ingot")
            print("cached", name, flush=True)
        compile_graph(FIXTURES / "tiny_llama.onnx", target, d / "tiny.ingot", LLAMA_DIMS)
        print("cached tiny_llama", flush=True)


if __name__ == "__main__":  # python -m tests.runtime.test_cuda_graph_mode CACHE_DIR [target]
    os.environ["INGOT_TVM_CACHE_DIR"] = sys.argv[1]
    build_cache(sys.argv[2] if len(sys.argv) > 2 else "h200")
