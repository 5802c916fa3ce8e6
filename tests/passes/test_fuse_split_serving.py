"""The serving-fuse pipeline (fuse-split-swiglu, fuse-split-rope) on whole serving-form models: every layer's
split copies go, and the logits stay the same (CPU backend, a paged cache: prefill of two sequences of
different lengths, then a decode step of both). Checkpoints through the HF frontend (GQA, biases, partial
rotary, rope scaling) and the tiny Llama ONNX fixture through ``ingot.compile(..., target="cpu")``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ingot
from ingot.frontend.hf import import_hf
from ingot.ir.graph import Graph
from ingot.passes import PassContext, run_passes
from ingot.runtime.artifact import load_graph
from ingot.runtime.paged import PagedModel
from tests.frontend.dense_llama import TINY_CONFIG, random_weights, write_checkpoint
from tests.helpers import assert_close, rng

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _logits(graph: Graph, vocab: int) -> list[np.ndarray]:
    r = rng(7)
    model = PagedModel(graph, num_blocks=16)
    a, b = model.add_sequence(), model.add_sequence()
    pa, pb = [int(t) for t in r.integers(0, vocab, 19)], [int(t) for t in r.integers(0, vocab, 5)]
    out = [model.step([(a, pa), (b, pb)])]
    out.append(model.step([(a, [int(r.integers(0, vocab))]), (b, [int(r.integers(0, vocab))])]))
    return out


def _check_fused(before: Graph, after: Graph, layers: int, vocab: int) -> None:
    run_passes(after, "serving-fuse", PassContext(verify_each=True))
    hist = after.op_histogram()
    assert "split" not in hist and "rope" not in hist, hist
    assert hist["rope_qkv"] == layers and hist["swiglu"] == layers, hist
    assert all(n.op.packed for n in after.nodes if n.op.name == "swiglu")
    for got, want in zip(_logits(after, vocab), _logits(before, vocab)):
        assert_close(got, want)  # the same arithmetic: float rounding at most


@pytest.mark.parametrize("extra", [
    {},
    {"attention_bias": True, "partial_rotary_factor": 0.5},
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16}},
], ids=["gqa", "bias-partial-rotary", "llama3-scaling"])
def test_hf_checkpoint_logits_unchanged(tmp_path, extra) -> None:
    cfg = {**TINY_CONFIG, **extra}
    weights = random_weights(cfg, rng(), bias=bool(extra.get("attention_bias")))
    ckpt = write_checkpoint(tmp_path, cfg, weights)
    _check_fused(import_hf(ckpt), import_hf(ckpt), cfg["num_hidden_layers"], cfg["vocab_size"])


def test_hf_checkpoint_through_compile_cpu(tmp_path) -> None:
    weights = random_weights(TINY_CONFIG, rng())
    ckpt = write_checkpoint(tmp_path / "ckpt", TINY_CONFIG, weights)
    path = ingot.compile(ckpt, target="cpu", out=tmp_path / "m.ingot")
    _check_fused(load_graph(path)[0], load_graph(path)[0], TINY_CONFIG["num_hidden_layers"], TINY_CONFIG["vocab_size"])


def test_tiny_llama_onnx_through_compile_cpu(tmp_path) -> None:
    path = ingot.compile(FIXTURES / "tiny_llama_kv.onnx", target="cpu", out=tmp_path / "t.ingot", mode="llm")
    _check_fused(load_graph(path)[0], load_graph(path)[0], 2, 256)
