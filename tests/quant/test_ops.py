"""quantized_linear and paged_attention_fp8 references; the sm_100 scale layout round trip."""

from __future__ import annotations

import numpy as np
import pytest

from ingot.ir.graph import Graph, Weight
from ingot.ir.ops.llm import Linear, PagedAttention
from ingot.ir.ops.quantized import PagedAttentionFp8, quantize_activation
from ingot.ir.quant import formats as F
from ingot.ir.quant.packing import sm100_scale_offset, swizzle_sm100_scales, unswizzle_sm100_scales
from ingot.ir.text import parse_graph, print_graph
from ingot.ir.types import DType, TensorType
from ingot.passes import PassContext, run_passes
from ingot.passes.fp8_channel_scales import Fp8ChannelScales
from ingot.quant.config import parse_spec
from ingot.quant.linear import layer_output, make_op, quantize_weight
from ingot.runtime.cpu import run_graph

SPECS = ["fp8", "fp8:tensor", "fp8:block", "fp8:wo", "nvfp4", "nvfp4:w4a4:dynamic", "mxfp4", "mxfp4:w4a4"]


@pytest.mark.parametrize("spec", SPECS)
def test_quantized_linear_is_dequantize_then_matmul(spec):
    rng = np.random.default_rng(0)
    q = parse_spec(spec)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    w = rng.standard_normal((40, 64)).astype(np.float32) * 0.1
    arrays = quantize_weight(w, q)
    op = make_op(q, 64)
    y = op.ref(x, arrays["weight"], arrays["weight_scale"], arrays.get("weight_scale_2"))
    w_dq = op.weight_f32(arrays["weight"], arrays["weight_scale"], arrays.get("weight_scale_2"))
    xq = quantize_activation(q.act, q.act_granularity, x)
    np.testing.assert_allclose(y, xq @ w_dq.T, rtol=1e-5, atol=1e-5)
    rel = np.abs(y - x @ w.T).max() / np.abs(x @ w.T).max()
    assert rel < {"fp8": 0.08, "nvfp4": 0.3, "mxfp4": 0.5}[q.weight]


def test_sm100_scale_swizzle_round_trip_and_offsets():
    rng = np.random.default_rng(1)
    sf = F.to_e4m3(rng.random((200, 9)).astype(np.float32) * 100)
    sw = swizzle_sm100_scales(sf)
    assert sw.shape == (256, 12)
    assert np.array_equal(unswizzle_sm100_scales(sw, 200, 9).view(np.uint8), sf.view(np.uint8))
    flat = sw.view(np.uint8).reshape(-1)
    for r, c in [(0, 0), (1, 0), (31, 3), (32, 0), (127, 3), (128, 4), (199, 8)]:
        assert flat[sm100_scale_offset(r, c, 9)] == sf.view(np.uint8)[r, c]
    assert flat[(0 * 3 + 0) * 512 + 1 * 16] == sf.view(np.uint8)[1, 0]  # row 1 is 16 bytes in (32x16B rows)


@pytest.mark.parametrize("spec", ["nvfp4:w4a4:dynamic", "mxfp4"])
def test_quantize_then_pack_sm100_keeps_values(spec):
    rng = np.random.default_rng(2)
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, ("T", 64)))
    w_f32 = rng.standard_normal((136, 64)).astype(np.float32)
    w = g.add_weight("fc.weight", Weight.from_array(w_f32))
    g.add_output(g.add1(Linear(), [x, w], "fc"), "y")
    feeds = {"x": rng.standard_normal((3, 64)).astype(np.float32)}
    ctx = PassContext(options={"quantize": {"format": spec, "config": {"default": spec}}})
    run_passes(g, ["quantize"], ctx)
    assert g.nodes[0].op.name == "quantized_linear"
    before = run_graph(g, feeds)["y"]
    run_passes(g, ["pack-sm100"], PassContext(target="b200"))
    assert g.nodes[0].op.scale_layout == "sm100" and g.weights["fc.weight_scale"].type.shape == (256, 4)
    assert np.array_equal(run_graph(g, feeds)["y"], before)
    assert np.array_equal(before, layer_output(parse_spec(spec), feeds["x"], w_f32))
    text = print_graph(g)
    assert "quantized_linear" in text and parse_graph(text).nodes[0].op == g.nodes[0].op


def test_pack_sm100_leaves_weight_only_nvfp4_linear():
    """Weight-only NVFP4 keeps linear scales on b200 (the GEMV and the dequantize launch read them); W4A4 beside it in
    the same graph is swizzled."""
    rng = np.random.default_rng(4)
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, ("T", 64)))
    h = x
    for name in ("a", "b"):
        w = g.add_weight(f"{name}.weight", Weight.from_array(rng.standard_normal((64, 64)).astype(np.float32)))
        h = g.add1(Linear(), [h, w], name)
    g.add_output(h, "y")
    cfg = {"default": "nvfp4:wo", "layers": {"b": "nvfp4:w4a4:dynamic"}}
    run_passes(g, ["quantize"], PassContext(options={"quantize": {"format": "nvfp4:wo", "config": cfg}}))
    ops = {n.outputs[0].name: n.op for n in g.nodes}
    assert ops["a"].act_format == "none" and ops["b"].act_format == "nvfp4"
    shape = g.weights["a.weight_scale"].type.shape
    run_passes(g, ["pack-sm100"], PassContext(target="b200"))
    ops = {n.outputs[0].name: n.op for n in g.nodes}
    assert ops["a"].scale_layout == "linear" and g.weights["a.weight_scale"].type.shape == shape
    assert ops["b"].scale_layout == "sm100" and g.weights["b.weight_scale"].type.shape == (128, 4)


@pytest.mark.parametrize("spec", ["fp8:tensor", "fp8:tensor:wo"])
def test_fp8_channel_scales_keeps_values(spec):
    """``fp8-channel-scales``: an FP8 weight quantized per tensor gets its scale broadcast to [N] and channel
    granularity, the graph's output bit for bit the same (CPU reference); per-channel and block-scaled FP8 linears
    beside it and a weight-only NVFP4 one are left as they are. (Static activation scales: compiled models in
    tests/codegen/test_quant_prefill_gemm.py and the GPU test of tests/runtime/test_quant_cuda.py.)"""
    rng = np.random.default_rng(5)
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, ("T", 128)))
    h = x
    for name in ("a", "b", "c", "d"):
        w = g.add_weight(f"{name}.weight", Weight.from_array(rng.standard_normal((128, 128)).astype(np.float32)))
        h = g.add1(Linear(), [h, w], name)
    g.add_output(h, "y")
    cfg = {"default": spec, "layers": {"b": "fp8", "c": "fp8:block", "d": "nvfp4:wo"}}
    run_passes(g, ["quantize"], PassContext(options={"quantize": {"format": spec, "config": cfg}}))
    ops = {n.outputs[0].name: n.op for n in g.nodes}
    assert ops["a"].weight_granularity == "tensor" and g.weights["a.weight_scale"].type.shape == ()
    feeds = {"x": rng.standard_normal((5, 128)).astype(np.float32)}
    before = run_graph(g, feeds)["y"]
    scale = float(g.weights["a.weight_scale"].load())
    others = {k: (g.weights[f"{k}.weight_scale"].type, ops[k]) for k in ("b", "c", "d")}
    ctx = PassContext(target="h200")
    run_passes(g, ["fp8-channel-scales"], ctx)
    ops = {n.outputs[0].name: n.op for n in g.nodes}
    assert ops["a"].weight_granularity == "channel" and g.weights["a.weight_scale"].type.shape == (128,)
    assert g.nodes[0].inputs[2].type.shape == (128,)
    assert np.array_equal(g.weights["a.weight_scale"].load(), np.full(128, scale, np.float32))
    assert {k: (g.weights[f"{k}.weight_scale"].type, ops[k]) for k in ("b", "c", "d")} == others
    assert np.array_equal(run_graph(g, feeds)["y"], before)
    text = print_graph(g)
    assert parse_graph(text).nodes[0].op == g.nodes[0].op
    assert Fp8ChannelScales().run(g, ctx) is False  # nothing left to do


@pytest.mark.parametrize("granularity", ["tensor", "head"])
def test_paged_attention_fp8_is_attention_on_decoded_cache(granularity):
    rng = np.random.default_rng(3)
    H, KV, D, bs, T = 4, 2, 16, 4, 7
    q = rng.standard_normal((T, H * D)).astype(np.float32)
    k = rng.standard_normal((T, KV * D)).astype(np.float32)
    v = rng.standard_normal((T, KV * D)).astype(np.float32)
    scale = np.array([[0.02, 0.01], [0.03, 0.015]], np.float32)
    if granularity == "tensor":
        scale[:] = scale.max()
    tables = np.array([[3, 1]], np.int32)
    slots = np.array([12, 13, 14, 15, 4, 5, 6], np.int64)
    args = (tables, np.array([T], np.int32), np.array([0, T], np.int32), slots)
    cache8 = np.zeros((5, 2, bs, KV, D), DType.f8e4m3fn.np)
    op = PagedAttentionFp8(num_heads=H, num_kv_heads=KV, head_dim=D, scale=D**-0.5, kv_granularity=granularity)
    out = op.ref(q, k, v, cache8, *args, scale)
    kq = F.to_e4m3(k.reshape(T, KV, D) / scale[0][None, :, None]).astype(np.float32) * scale[0][None, :, None]
    vq = F.to_e4m3(v.reshape(T, KV, D) / scale[1][None, :, None]).astype(np.float32) * scale[1][None, :, None]
    cache32 = np.zeros((5, 2, bs, KV, D), np.float32)
    ref = PagedAttention(num_heads=H, num_kv_heads=KV, head_dim=D, scale=D**-0.5).ref(
        q, kq.reshape(T, -1), vq.reshape(T, -1), cache32, *args)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    assert np.array_equal(cache8[3, 0, 0].astype(np.float32), F.to_e4m3(k[0].reshape(KV, D) / scale[0][:, None])
                          .astype(np.float32))
