"""FP8 W8A8 through the ``quantize`` pass against an independent numpy computation: per-row weight
scales (also on fused matrices whose parts differ in magnitude), per-token activation scales, and a
tied embedding / lm_head table left untouched (the SmolLM2 investigation in docs/QUANTIZATION.md)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ingot.ir.graph import Graph, Weight
from ingot.ir.ops.llm import Embedding, Linear
from ingot.ir.types import DType, TensorType
from ingot.passes import PassContext, run_passes
from ingot.runtime.cpu import run_graph


def _fp8_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Independent E4M3 quantize-dequantize along the last axis: scale = amax / 448, one f32 division."""
    s = (np.abs(a).max(axis=-1, keepdims=True) / np.float32(448)).astype(np.float32)
    q = np.clip(a / s, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return q, s


def test_fp8_w8a8_matches_numpy_per_row_per_token_and_skips_the_tied_table():
    rng = np.random.default_rng(0)
    V, H = 50, 32
    table = rng.standard_normal((V, H)).astype(np.float32)
    # a fused QKV-like weight: three parts of very different magnitude (one scale per row, not per matrix)
    w_fused = np.concatenate([rng.standard_normal((16, H)) * m for m in (1.0, 1e-3, 1e3)]).astype(np.float32)
    w_down = rng.standard_normal((H, 48)).astype(np.float32) * 0.05
    g = Graph()
    ids = g.add_input("input_ids", TensorType(DType.i64, ("T",)))
    emb = g.add_weight("model.embed_tokens.weight", Weight.from_array(table))
    wf = g.add_weight("model.layers.0.self_attn.qkv_proj.weight", Weight.from_array(w_fused))
    wd = g.add_weight("model.layers.0.mlp.down_proj.weight", Weight.from_array(w_down))
    x = g.add1(Embedding(), [emb, ids], "embed")
    qkv = g.add1(Linear(), [x, wf], "layers.0.qkv")
    h = g.add1(Linear(), [qkv, wd], "layers.0.mlp_out")
    g.add_output(g.add1(Linear(), [h, emb], "logits"), "logits")  # tied lm_head
    feeds = {"input_ids": rng.integers(0, V, 7).astype(np.int64)}

    run_passes(g, ["quantize"], PassContext(options={"quantize": {"config": {"default": "fp8"}}}))
    ops = {n.outputs[0].name: n for n in g.nodes}
    assert ops["layers.0.qkv"].op.name == "quantized_linear" and ops["layers.0.mlp_out"].op.name == "quantized_linear"
    assert ops["logits"].op.name == "linear" and ops["embed"].op.name == "embedding"
    assert ops["logits"].inputs[1] is ops["embed"].inputs[0]  # still shared, still f32, unchanged
    assert np.array_equal(g.weights["model.embed_tokens.weight"].load(), table)

    codes, scale = _fp8_rows(w_fused)
    stored = g.weights["model.layers.0.self_attn.qkv_proj.weight_scale"].load()
    assert stored.shape == (48,) and np.array_equal(stored, scale[:, 0])
    assert np.array_equal(g.weights["model.layers.0.self_attn.qkv_proj.weight"].load().view(np.uint8),
                          codes.view(np.uint8))

    def w8a8(a: np.ndarray, w: np.ndarray) -> np.ndarray:
        qa, sa = _fp8_rows(a)
        qw, sw = _fp8_rows(w)
        return (qa.astype(np.float32) * sa) @ (qw.astype(np.float32) * sw).T

    want = w8a8(w8a8(table[feeds["input_ids"]], w_fused), w_down) @ table.T
    np.testing.assert_allclose(run_graph(g, feeds)["logits"], want, rtol=1e-5, atol=1e-5)
