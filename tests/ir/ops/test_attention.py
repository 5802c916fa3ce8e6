"""attention, rotary_embedding, swiglu and the com.microsoft attention converters: ingot vs
onnxruntime and vs a decomposed numpy softmax(QK^T)V."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ingot.frontend.onnx import import_onnx
from tests.helpers import assert_close, assert_text_roundtrip, make_model, rng, run_ingot, run_ort

F32 = TensorProto.FLOAT


def _vi(name: str, arr: np.ndarray) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape)


def _outs(names: list[str]) -> list[onnx.ValueInfoProto]:
    return [helper.make_tensor_value_info(n, F32, None) for n in names]


def _ms_model(node: onnx.NodeProto, feeds: dict[str, np.ndarray], outs: list[str]) -> onnx.ModelProto:
    g = helper.make_graph([node], "t", [_vi(k, v) for k, v in feeds.items()], _outs(outs))
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 10
    return m


def naive_attention(q, k, v, mask=None, causal=False, scale=None, softcap=0.0, offset=0):
    """softmax(scale * q k^T + bias) v on (B, H, S, D) float64, GQA by repeating KV heads."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) * (scale if scale is not None else 1 / np.sqrt(q.shape[-1]))
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        s = s + (np.where(mask, 0, -np.inf) if mask.dtype == np.bool_ else mask)
    if causal:
        i, j = np.arange(q.shape[2])[:, None], np.arange(k.shape[2])[None, :]
        s = np.where(j <= i + offset, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


CASES = [
    dict(),
    dict(is_causal=1),
    dict(hq=8, hkv=2),
    dict(hq=8, hkv=2, is_causal=1, scale=0.3),
    dict(mask="bool"),
    dict(mask="float", softcap=2.0),
    dict(past=3, is_causal=1, hq=4, hkv=2),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_attention_4d_vs_ort_and_numpy(case: dict) -> None:
    r = rng()
    b, hq, hkv, sq, d = 2, case.get("hq", 4), case.get("hkv", 4), 5, 8
    skv = sq
    feeds = {"Q": r.standard_normal((b, hq, sq, d)).astype(np.float32),
             "K": r.standard_normal((b, hkv, skv, d)).astype(np.float32),
             "V": r.standard_normal((b, hkv, skv, d)).astype(np.float32)}
    ins = ["Q", "K", "V"]
    mask = None
    past = case.get("past", 0)
    if case.get("mask") == "bool":
        mask = r.random((sq, skv)) > 0.3
        mask[:, 0] = True
    elif case.get("mask") == "float":
        mask = r.standard_normal((b, 1, sq, skv)).astype(np.float32)
    ins.append("mask" if mask is not None else "")
    if mask is not None:
        feeds["mask"] = mask
    if past:
        feeds["pk"] = r.standard_normal((b, hkv, past, d)).astype(np.float32)
        feeds["pv"] = r.standard_normal((b, hkv, past, d)).astype(np.float32)
        ins += ["pk", "pv"]
    attrs = {k: v for k, v in case.items() if k in ("is_causal", "scale", "softcap")}
    outs = ["Y", "present_key", "present_value"] if past else ["Y"]
    node = helper.make_node("Attention", ins, outs, **attrs)
    model = make_model(node, [_vi(k, v) for k, v in feeds.items()], _outs(outs), opset=23)
    got, exp = run_ingot(model, feeds), run_ort(model, feeds)
    for n in outs:
        assert_close(got[n], exp[n], rtol=1e-4, atol=1e-5, what=n)
    k, v = feeds["K"], feeds["V"]
    if past:
        k, v = np.concatenate([feeds["pk"], k], 2), np.concatenate([feeds["pv"], v], 2)
    ref = naive_attention(feeds["Q"], k, v, mask, bool(case.get("is_causal")), case.get("scale"),
                          case.get("softcap", 0.0), offset=past)
    assert_close(got["Y"], ref.astype(np.float32), rtol=1e-4, atol=1e-5, what="numpy")
    assert_text_roundtrip(import_onnx(model))


def test_attention_3d_gqa_vs_numpy() -> None:
    r = rng()
    b, s, hq, hkv, d = 2, 6, 6, 2, 4
    q = r.standard_normal((b, s, hq * d)).astype(np.float32)
    k = r.standard_normal((b, s, hkv * d)).astype(np.float32)
    v = r.standard_normal((b, s, hkv * d)).astype(np.float32)
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], q_num_heads=hq, kv_num_heads=hkv,
                            is_causal=1)
    feeds = {"Q": q, "K": k, "V": v}
    model = make_model(node, [_vi(n, a) for n, a in feeds.items()], _outs(["Y"]), opset=23)
    got = run_ingot(model, feeds)["Y"]
    assert_close(got, run_ort(model, feeds)["Y"], rtol=1e-4, atol=1e-5)

    def split(x, h):
        return x.reshape(b, s, h, d).transpose(0, 2, 1, 3)

    ref = naive_attention(split(q, hq), split(k, hkv), split(v, hkv), causal=True)
    assert_close(got, ref.transpose(0, 2, 1, 3).reshape(b, s, -1).astype(np.float32), rtol=1e-4, atol=1e-5)


def test_attention_fully_masked_row_is_zero() -> None:
    from ingot.ir.ops.attention import Attention

    r = rng()
    q, k, v = (r.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    mask = np.ones((3, 3), bool)
    mask[1] = False
    y = Attention().ref(q, k, v, mask)
    assert np.all(y[:, :, 1] == 0) and np.all(np.isfinite(y))
    ref = naive_attention(q, k, v, mask)
    assert_close(y[:, :, [0, 2]], ref[:, :, [0, 2]].astype(np.float32), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary_dim", [0, 4])
def test_rotary_embedding_vs_ort(interleaved: int, rotary_dim: int) -> None:
    r = rng()
    b, h, s, d = 2, 3, 5, 8
    half = (rotary_dim or d) // 2
    x = r.standard_normal((b, h, s, d)).astype(np.float32)
    ang = r.random((16, half)).astype(np.float32) * 3
    pos = r.integers(0, 16, (b, s)).astype(np.int64)
    feeds = {"x": x, "cos": np.cos(ang), "sin": np.sin(ang), "pos": pos}
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], interleaved=interleaved,
                            rotary_embedding_dim=rotary_dim)
    model = make_model(node, [_vi(n, a) for n, a in feeds.items()], _outs(["y"]), opset=23)
    got = run_ingot(model, feeds)["y"]
    assert_close(got, run_ort(model, feeds)["y"], rtol=1e-5, atol=1e-5)
    assert_text_roundtrip(import_onnx(model))


def test_swiglu_vs_numpy() -> None:
    r = rng()
    a, b = r.standard_normal((3, 7)).astype(np.float32), r.standard_normal((3, 7)).astype(np.float32)
    node = helper.make_node("SwiGLU", ["a", "b"], ["y"], alpha=1.5)
    model = make_model(node, [_vi("a", a), _vi("b", b)], _outs(["y"]), opset=28)
    got = run_ingot(model, {"a": a, "b": b})["y"]
    assert_close(got, (a / (1 + np.exp(-1.5 * a)) * b).astype(np.float32), rtol=1e-5, atol=1e-6)
    assert_text_roundtrip(import_onnx(model))


@pytest.mark.parametrize("past", [0, 4])
def test_ms_group_query_attention_vs_ort(past: int) -> None:
    r = rng()
    b, s, hq, hkv, d = 1, 3, 4, 2, 8
    total = past + s
    feeds = {"q": r.standard_normal((b, s, hq * d)).astype(np.float32),
             "k": r.standard_normal((b, s, hkv * d)).astype(np.float32),
             "v": r.standard_normal((b, s, hkv * d)).astype(np.float32),
             "pk": r.standard_normal((b, hkv, past, d)).astype(np.float32),
             "pv": r.standard_normal((b, hkv, past, d)).astype(np.float32),
             "seqlens_k": np.full((b,), total - 1, np.int32),
             "total": np.array(total, np.int32)}
    node = helper.make_node("GroupQueryAttention", list(feeds), ["y", "present_k", "present_v"],
                            domain="com.microsoft", num_heads=hq, kv_num_heads=hkv)
    model = _ms_model(node, feeds, ["y", "present_k", "present_v"])
    got, exp = run_ingot(model, feeds), run_ort(model, feeds)
    for n in ("y", "present_k", "present_v"):
        assert_close(got[n], exp[n], rtol=1e-4, atol=1e-5, what=n)


def test_ms_multi_head_attention_vs_ort() -> None:
    r = rng()
    b, s, t, h, d = 2, 3, 5, 2, 4
    feeds = {"q": r.standard_normal((b, s, h * d)).astype(np.float32),
             "k": r.standard_normal((b, t, h * d)).astype(np.float32),
             "v": r.standard_normal((b, t, h * d)).astype(np.float32),
             "bias": r.standard_normal((b, 1, s, t)).astype(np.float32)}
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "bias"], ["y"],
                            domain="com.microsoft", num_heads=h)
    model = _ms_model(node, feeds, ["y"])
    assert_close(run_ingot(model, feeds)["y"], run_ort(model, feeds)["y"], rtol=1e-4, atol=1e-5)


def test_ms_rotary_embedding_vs_ort() -> None:
    r = rng()
    b, s, h, d = 2, 4, 3, 8
    ang = r.random((16, d // 2)).astype(np.float32) * 3
    feeds = {"x": r.standard_normal((b, s, h * d)).astype(np.float32),
             "pos": r.integers(0, 16, (b, s)).astype(np.int64),
             "cos": np.cos(ang), "sin": np.sin(ang)}
    node = helper.make_node("RotaryEmbedding", list(feeds), ["y"], domain="com.microsoft", num_heads=h)
    model = _ms_model(node, feeds, ["y"])
    assert_close(run_ingot(model, feeds)["y"], run_ort(model, feeds)["y"], rtol=1e-5, atol=1e-5)


def test_ms_skip_simplified_layer_norm_vs_ort() -> None:
    r = rng()
    feeds = {"x": r.standard_normal((2, 3, 16)).astype(np.float32),
             "skip": r.standard_normal((2, 3, 16)).astype(np.float32),
             "gamma": r.standard_normal((16,)).astype(np.float32)}
    node = helper.make_node("SkipSimplifiedLayerNormalization", list(feeds), ["y", "", "", "sum"],
                            domain="com.microsoft", epsilon=1e-5)
    model = _ms_model(node, feeds, ["y", "sum"])
    got, exp = run_ingot(model, feeds), run_ort(model, feeds)
    for n in ("y", "sum"):
        assert_close(got[n], exp[n], rtol=1e-4, atol=1e-5, what=n)


def test_simplified_layer_norm_vs_ort() -> None:
    r = rng()
    feeds = {"x": r.standard_normal((2, 3, 16)).astype(np.float32),
             "gamma": r.standard_normal((16,)).astype(np.float32)}
    node = helper.make_node("SimplifiedLayerNormalization", list(feeds), ["y"], epsilon=1e-5, axis=-1)
    model = _ms_model(node, feeds, ["y"])
    assert_close(run_ingot(model, feeds)["y"], run_ort(model, feeds)["y"], rtol=1e-4, atol=1e-5)
