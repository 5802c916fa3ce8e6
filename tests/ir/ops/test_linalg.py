"""matmul, gemm, einsum, matmul_integer: ingot vs onnxruntime on random inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from ingot.frontend.onnx import import_onnx
from tests.helpers import assert_close, assert_text_roundtrip, make_model, rng, run_ingot, run_ort

F32 = TensorProto.FLOAT


def _vi(name: str, arr: np.ndarray) -> helper.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)


def _check(node, feeds: dict[str, np.ndarray], out_shape=None, out_type=F32, opset: int = 21) -> None:
    model = make_model(node, [_vi(k, v) for k, v in feeds.items()],
                       [helper.make_tensor_value_info("y", out_type, out_shape)], opset=opset)
    got, exp = run_ingot(model, feeds)["y"], run_ort(model, feeds)["y"]
    assert_close(got, exp, rtol=1e-4, atol=1e-5, what=node.op_type)
    assert_text_roundtrip(import_onnx(model))


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
                                   ((4,), (2, 4, 3)), ((2, 3, 4), (4,)), ((4,), (4,))])
def test_matmul(sa, sb) -> None:
    r = rng()
    feeds = {"a": r.standard_normal(sa).astype(np.float32), "b": r.standard_normal(sb).astype(np.float32)}
    _check(helper.make_node("MatMul", ["a", "b"], ["y"]), feeds)


def test_matmul_f16_accumulates_in_f32() -> None:
    r = rng()
    a, b = r.standard_normal((8, 64)).astype(np.float16), r.standard_normal((64, 8)).astype(np.float16)
    model = make_model(helper.make_node("MatMul", ["a", "b"], ["y"]), [_vi("a", a), _vi("b", b)],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)])
    got = run_ingot(model, {"a": a, "b": b})["y"]
    assert_close(got, (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16))


@pytest.mark.parametrize("ta,tb,alpha,beta,cshape", [
    (0, 0, 1.0, 1.0, None), (1, 0, 0.5, 2.0, (5,)), (0, 1, 1.0, 0.25, (3, 1)), (1, 1, 2.0, 1.0, (3, 5)),
    (0, 0, 1.0, 1.0, (1,)),
])
def test_gemm(ta, tb, alpha, beta, cshape) -> None:
    r = rng()
    a = r.standard_normal((4, 3) if ta else (3, 4)).astype(np.float32)
    b = r.standard_normal((5, 4) if tb else (4, 5)).astype(np.float32)
    feeds = {"a": a, "b": b}
    ins = ["a", "b"]
    if cshape:
        feeds["c"] = r.standard_normal(cshape).astype(np.float32)
        ins.append("c")
    node = helper.make_node("Gemm", ins, ["y"], transA=ta, transB=tb, alpha=alpha, beta=beta)
    _check(node, feeds, opset=13)


@pytest.mark.parametrize("eq,shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk", [(2, 3, 4), (1, 4, 5)]),
    ("ii->i", [(4, 4)]),
    ("ij->", [(3, 4)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("i,i", [(5,), (5,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
])
def test_einsum(eq, shapes) -> None:
    r = rng()
    feeds = {f"x{i}": r.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    _check(helper.make_node("Einsum", list(feeds), ["y"], equation=eq), feeds, opset=12)


def test_einsum_infers_static_shape() -> None:
    r = rng()
    feeds = {"a": r.standard_normal((2, 3, 4)).astype(np.float32),
             "b": r.standard_normal((4, 6)).astype(np.float32)}
    model = make_model(helper.make_node("Einsum", ["a", "b"], ["y"], equation="...j,jk->...k"),
                       [_vi(k, v) for k, v in feeds.items()], [helper.make_tensor_value_info("y", F32, None)])
    g = import_onnx(model)
    assert g.outputs[0].type.shape == (2, 3, 6)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("zp_kind", ["none", "scalar", "vector"])
def test_matmul_integer(dt, zp_kind) -> None:
    r = rng()
    info = np.iinfo(dt)
    a = r.integers(info.min, info.max, (2, 3, 4), endpoint=True).astype(dt)
    b = r.integers(info.min, info.max, (4, 5), endpoint=True).astype(dt)
    feeds = {"a": a, "b": b}
    ins = ["a", "b"]
    if zp_kind != "none":
        # onnxruntime takes a per-column zero point for b; a's stays a scalar
        bshape = (5,) if zp_kind == "vector" else ()
        feeds["azp"] = r.integers(info.min, info.max, (), endpoint=True).astype(dt)
        feeds["bzp"] = r.integers(info.min, info.max, bshape, endpoint=True).astype(dt)
        ins += ["azp", "bzp"]
    _check(helper.make_node("MatMulInteger", ins, ["y"]), feeds, out_type=TensorProto.INT32, opset=10)


def test_matmul_integer_per_row_a_zero_point() -> None:
    r = rng()
    a = r.integers(0, 255, (3, 4), endpoint=True).astype(np.uint8)
    b = r.integers(0, 255, (4, 5), endpoint=True).astype(np.uint8)
    azp = r.integers(0, 255, (3,), endpoint=True).astype(np.uint8)
    model = make_model(helper.make_node("MatMulInteger", ["a", "b", "azp"], ["y"]),
                       [_vi("a", a), _vi("b", b), _vi("azp", azp)],
                       [helper.make_tensor_value_info("y", TensorProto.INT32, None)], opset=10)
    got = run_ingot(model, {"a": a, "b": b, "azp": azp})["y"]
    assert_close(got, (a.astype(np.int32) - azp.astype(np.int32)[:, None]) @ b.astype(np.int32))
