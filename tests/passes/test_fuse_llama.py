"""The fusion pipeline (O2) on the tiny Llama fixtures: the fused structure per layer, and the same
outputs as the unfused graph (logits and present K/V; prefill and a KV-cache decode step)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from ingot.frontend.onnx import import_onnx
from ingot.ir.graph import Graph
from ingot.passes import PassContext, run_passes
from ingot.runtime.cpu import run_graph
from tests.helpers import rng

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 2, 2, 16, 256  # tiny_llama_config.json
RTOL = 1e-5  # max abs error relative to the unfused output's max abs value


@functools.cache
def _fused(name: str) -> Graph:
    g = import_onnx(str(FIXTURES / f"{name}.onnx"))
    run_passes(g, "O2", PassContext(verify_each=True))
    return g


def _unfused(name: str) -> Graph:
    return import_onnx(str(FIXTURES / f"{name}.onnx"))


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_llama_kv", "tiny_llama_ts", "tiny_llama_kv_ts"])
def test_fused_structure(name: str) -> None:
    g = _fused(name)
    hist = g.op_histogram()
    want = {"rms_norm": 2 * LAYERS + 1, "linear": 4 * LAYERS + 1, "split": 2 * LAYERS, "rotary_embedding": 2 * LAYERS,
            "attention": LAYERS, "swiglu": LAYERS}
    assert {k: hist.get(k, 0) for k in want} == want, hist
    for gone in ("matmul", "softmax", "sigmoid", "pow", "sqrt", "reduce_mean"):
        assert gone not in hist, hist
    linears = [n for n in g.nodes if n.op.name == "linear"]
    with_residual = [n for n in linears if len(n.inputs) == 4 and n.inputs[3] is not None]
    assert len(with_residual) == 2 * LAYERS  # o_proj and down_proj
    splits = [n for n in g.nodes if n.op.name == "split"]
    assert sorted(n.op.num_outputs for n in splits) == [2] * LAYERS + [3] * LAYERS  # gate/up, q/k/v
    for n in g.nodes:
        if n.op.name == "attention":
            assert (n.op.num_heads, n.op.num_kv_heads) == (4, KV_HEADS)
            assert abs(n.op.scale - HEAD_DIM**-0.5) < 1e-7
            assert len(n.inputs) == 4  # the mask stays an input
            assert n.inputs[0].producer.op.name == "rotary_embedding"


def _close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k, w in want.items():
        assert got[k].shape == w.shape and got[k].dtype == w.dtype, k
        err = float(np.abs(got[k].astype(np.float64) - w).max())
        assert err <= RTOL * float(np.abs(w).max()), f"{k}: max abs error {err:.3g}"


def _feeds(g: Graph, ids: np.ndarray, mask: np.ndarray, past: dict[str, np.ndarray] | None) -> dict:
    names = {v.name for v in g.inputs}
    batch, seq = ids.shape
    past_len = 0 if past is None else past["present.0.key"].shape[2]
    feeds = {"input_ids": ids, "attention_mask": mask,
             "position_ids": np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, past_len:].astype(np.int64)}
    for i in range(LAYERS):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{i}.{kv}"] = (np.zeros((batch, KV_HEADS, 0, HEAD_DIM), np.float32) if past is None
                                                  else past[f"present.{i}.{kv}"])
    return {k: v for k, v in feeds.items() if k in names}


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_llama_ts"])
def test_same_outputs_without_cache(name: str) -> None:
    r = rng()
    ids = r.integers(0, VOCAB, (2, 6)).astype(np.int64)
    ref, g = _unfused(name), _fused(name)
    feeds = _feeds(ref, ids, np.ones((2, 6), np.int64), None)
    _close(run_graph(g, feeds), run_graph(ref, feeds))


@pytest.mark.parametrize("name", ["tiny_llama_kv", "tiny_llama_kv_ts"])
def test_same_outputs_prefill_then_decode(name: str) -> None:
    r = rng()
    ref, g = _unfused(name), _fused(name)
    ids = r.integers(0, VOCAB, (2, 6)).astype(np.int64)
    mask = np.ones((2, 6), np.int64)
    mask[1, :2] = 0  # left padding on the second sequence
    feeds = _feeds(ref, ids, mask, None)
    want = run_graph(ref, feeds)
    _close(run_graph(g, feeds), want)
    nxt = r.integers(0, VOCAB, (2, 1)).astype(np.int64)
    feeds = _feeds(ref, nxt, np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1), want)
    _close(run_graph(g, feeds), run_graph(ref, feeds))
