"""The generated long tail (``codegen/tvm``) on a CPU-only machine.

- every TE builder against its op's numpy reference, built by TVM for the CPU (``llvm``);
- onnx's nine light CNN models and the graph-mode tiny Llama (dims bound) compile for h200 and b200
  with every kernel's source, PTX and a cubin for the arch (densenet121 and the inceptions are
  ``slow``: hundreds of kernels);
- the kernel cache serves a machine without TVM; an unbound dim and a missing TVM are clear errors.

Everything skips where Apache TVM is not installed (``pip install 'ingot[tvm]'``; CI does not).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import ingot
from ingot.api import CompileError
from ingot.codegen.tvm import rule
from ingot.ir.ops.conv import Conv
from ingot.ir.ops.core import Cast
from ingot.ir.ops.elementwise import Cumulative, binary, compare, unary
from ingot.ir.ops.indexing import Gather, GatherND
from ingot.ir.ops.linalg import Gemm, MatMul
from ingot.ir.ops.norm import BatchNorm, LayerNorm, LogSoftmax, Lrn, RmsNorm, Softmax
from ingot.ir.ops.pool import AvgPool, GlobalAvgPool, MaxPool
from ingot.ir.ops.reduce import ReduceMax, ReduceMean, ReduceSum
from ingot.ir.ops.shape import Concat, Expand, Pad, Range, Reshape, Slice, Transpose
from ingot.ir.types import DType, TensorType
from tests.codegen.common import session_kernel_cache  # noqa: F401 (a fixture)
from tests.codegen.test_lower import check_kernels
from tests.helpers import rng

pytestmark = [pytest.mark.skipif(not rule.available(), reason="needs Apache TVM (pip install 'ingot[tvm]')"),
              pytest.mark.usefixtures("session_kernel_cache")]

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
HEAVY = ("densenet121", "inception_v1", "inception_v2")
LIGHT_MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
                "vgg19", "zfnet512")


@pytest.fixture(autouse=True)
def _kernel_cache(monkeypatch):
    monkeypatch.delenv("INGOT_TVM_CACHE_DIR", raising=False)


def test_ops_table_matches_the_builders():
    assert set(rule.OPS) == set(rule.builders())


def _f(r, *shape):
    return r.standard_normal(shape).astype(np.float32)


def _cases():
    r = np.random.default_rng(0)
    x4 = _f(r, 2, 6, 9, 7)
    return [
        ("relu", unary("relu"), [x4]),
        ("sigmoid", unary("sigmoid"), [_f(r, 5, 33) * 20]),
        ("erf", unary("erf"), [_f(r, 64)]),
        ("round", unary("round"), [np.array([0.5, 1.5, -2.5, 2.4], np.float32)]),
        ("isnan", unary("isnan"), [np.array([0.0, np.nan, 1.0], np.float32)]),
        ("add broadcast", binary("add"), [_f(r, 3, 1, 5), _f(r, 4, 1)]),
        ("div int", binary("div"), [np.array([7, -7, 5, 3], np.int64), np.array([2, 2, 0, -2], np.int64)]),
        ("mod float", binary("mod"), [np.array([5.5, -5.5, 3.0], np.float32), np.array([2.0, 2.0, -2.0], np.float32)]),
        ("pow", binary("pow"), [np.abs(_f(r, 8)) + 0.1, np.array(2.0, np.float32)]),
        ("less_equal", compare("less_equal"), [np.arange(6).reshape(2, 3), np.array([[1], [4]])]),
        ("cast f32->i64", Cast(to=DType.i64), [np.array([1.7, -1.7, 3.0], np.float32)]),
        ("cast bool->f32", Cast(to=DType.f32), [np.array([True, False])]),
        ("cumsum", Cumulative(fn="sum", axis=-1), [np.arange(12, dtype=np.int64).reshape(3, 4)]),
        ("cumsum rev excl", Cumulative(fn="sum", axis=0, exclusive=True, reverse=True), [_f(r, 5, 2)]),
        ("reduce_mean", ReduceMean(axes=(-1,), keepdims=True), [_f(r, 2, 3, 40)]),
        ("reduce_sum all", ReduceSum(keepdims=False), [_f(r, 3, 4)]),
        ("reduce_max", ReduceMax(axes=(0, 2), keepdims=False), [_f(r, 3, 4, 5)]),
        ("softmax", Softmax(axis=1), [_f(r, 2, 1000, 1, 1) * 5]),
        ("softmax 2d", Softmax(axis=1, coerce_2d=True), [_f(r, 2, 3, 4)]),
        ("log_softmax", LogSoftmax(axis=-1), [_f(r, 3, 17)]),
        ("layer_norm", LayerNorm(eps=1e-5), [_f(r, 4, 32), _f(r, 32), _f(r, 32)]),
        ("rms_norm", RmsNorm(eps=1e-6), [_f(r, 4, 32), _f(r, 32)]),
        ("batch_norm", BatchNorm(eps=1e-5), [x4, _f(r, 6), _f(r, 6), _f(r, 6), np.abs(_f(r, 6)) + 0.5]),
        ("lrn", Lrn(size=5, alpha=1e-4, beta=0.75, bias=1.0), [x4]),
        ("transpose", Transpose(perm=(0, 2, 3, 1)), [x4]),
        ("reshape", Reshape(shape=(2, -1)), [x4]),
        ("concat", Concat(axis=1), [_f(r, 2, 3, 4), _f(r, 2, 1, 4), _f(r, 2, 5, 4)]),
        ("slice", Slice(starts=(1, -1), ends=(9, -100), axes=(2, 3), steps=(2, -2)), [x4]),
        ("gather", Gather(axis=1), [_f(r, 3, 10), np.array([[0, -1], [4, 9]], np.int64)]),
        ("gather_nd", GatherND(), [_f(r, 4, 5, 3), np.array([[[1, 2]], [[3, -1]]], np.int64)]),
        ("expand", Expand(shape=(3, 4, 5)), [_f(r, 4, 1)]),
        ("pad reflect", Pad(mode="reflect", pads=(0, 0, 2, 1, 0, 0, 1, 2)), [_f(r, 2, 3, 5, 6)]),
        ("pad constant", Pad(mode="constant", pads=(0, 1, 1, 0)), [_f(r, 3, 4)]),
        ("range", Range(length=5), [np.array(2, np.int64), np.array(12, np.int64), np.array(2, np.int64)]),
        ("matmul batched", MatMul(), [_f(r, 2, 1, 5, 7), _f(r, 3, 7, 4)]),
        ("matmul vec", MatMul(), [_f(r, 7), _f(r, 2, 7, 4)]),
        ("gemm", Gemm(trans_b=True, alpha=0.5, beta=2.0), [_f(r, 3, 8), _f(r, 5, 8), _f(r, 5)]),
        ("conv groups", Conv(strides=(2, 1), pads=(1, 0, 2, 1), dilations=(1, 2), group=2),
         [_f(r, 1, 4, 9, 8), _f(r, 6, 2, 3, 2), _f(r, 6)]),
        ("conv same", Conv(auto_pad="SAME_UPPER", strides=(2, 2)), [_f(r, 2, 3, 7, 7), _f(r, 4, 3, 3, 3)]),
        ("max_pool ceil", MaxPool(kernel_shape=(3, 3), strides=(2, 2), ceil_mode=True), [x4]),
        ("avg_pool pads", AvgPool(kernel_shape=(3, 2), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=True), [x4]),
        ("avg_pool incl", AvgPool(kernel_shape=(3, 3), pads=(1, 1, 1, 1), count_include_pad=True), [x4]),
        ("global_avg_pool", GlobalAvgPool(), [x4]),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_builder_matches_reference_on_cpu(case):
    from ingot.codegen.tvm.check import run_llvm

    _, op, arrays = case
    want = op.run(*arrays)
    got = run_llvm(op, arrays)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6 * max(1.0, float(np.abs(w).max())))
        else:
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n for n in LIGHT_MODELS])
def test_light_model_compiles(name, target, tmp_path):
    path = ingot.compile(LIGHT / f"light_{name}.onnx", target=target, out=tmp_path / f"{name}.ingot", mode="graph")
    manifest = check_kernels(path, target)
    families = {k["spec"]["family"] for k in manifest["cuda"]["kernels"].values()}
    assert "tvm" in families
    src = next((path / k["source"]).read_text() for k in manifest["cuda"]["kernels"].values()
               if k["spec"]["family"] == "tvm")
    assert "Apache TVM" in src.splitlines()[0] and "#include" not in src


def _tiny_llama(target: str, out: Path, dims: dict[str, int] | None) -> Path:
    from ingot.passes import PassContext

    ctx = PassContext()
    if dims is not None:
        ctx.options["cuda"] = dims
    return ingot.compile(FIXTURES / "tiny_llama.onnx", target=target, out=out, mode="graph", pass_context=ctx)


@pytest.mark.parametrize("target", ["h200", "b200"])
def test_tiny_llama_graph_mode_compiles(target, tmp_path):
    path = _tiny_llama(target, tmp_path / "tiny.ingot", {"batch": 1, "seq": 8})
    manifest = check_kernels(path, target)
    assert manifest["cuda"]["launches"]
    # the artifact's graph is static now and still runs on the CPU backend
    cpu = ingot.load(path)
    assert cpu.inputs == [("input_ids", "i64[1,8]")]
    ids = rng().integers(0, 256, (1, 8)).astype(np.int64)
    assert cpu.run({"input_ids": ids})["logits"].shape == (1, 8, 256)


def test_unbound_dim_is_named(tmp_path):
    with pytest.raises(CompileError, match=r"(?s)'batch'.*'seq'.*static shapes"):
        _tiny_llama("h200", tmp_path / "tiny.ingot", None)
    assert not (tmp_path / "tiny.ingot").exists()


def test_cache_serves_a_machine_without_tvm(tmp_path, monkeypatch):
    monkeypatch.setenv("INGOT_TVM_CACHE_DIR", str(tmp_path / "tvm-cache"))
    x = TensorType(DType.f32, (3, 70))
    (spec,) = rule.plan(unary("tanh"), [x], ingot.codegen.target.get_target("h200"))
    rule._MEMORY.clear()
    monkeypatch.setattr(rule, "available", lambda: False)
    (again,) = rule.plan(unary("tanh"), [x], ingot.codegen.target.get_target("h200"))
    assert again == spec and spec.entry in rule.source(again)
    assert rule.plan(unary("tanh"), [TensorType(DType.f32, (3, 71))], ingot.codegen.target.get_target("h200")) is None
    assert "not installed" in rule.failure_hint(["tanh"])


@pytest.mark.slow
def test_tiny_llama_kernels_match_references_on_cpu(tmp_path):
    """Every node of the specialized tiny Llama through its TE builder (llvm) against the reference."""
    from ingot.codegen.tvm.check import compare_graph
    from ingot.runtime.artifact import load_graph

    path = _tiny_llama("h200", tmp_path / "tiny.ingot", {"batch": 1, "seq": 8})
    graph, _ = load_graph(path)
    ids = rng().integers(0, 256, (1, 8)).astype(np.int64)
    assert compare_graph(graph, {"input_ids": ids}) == []
