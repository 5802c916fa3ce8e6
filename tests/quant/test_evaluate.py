"""The agreement measurement itself (``ingot.quant.evaluate``): a graph identical to the reference
scores exactly top-1 1.0 and KL 0 (both run at the same precision), and the figures respond to a
small perturbation in proportion (bf16 weights: KL tiny but nonzero; FP8 W8A8: larger)."""

from __future__ import annotations

import numpy as np
import pytest

from ingot.api import import_model
from ingot.passes import PassContext, run_passes
from ingot.quant.evaluate import Evaluator, compare_logits
from ingot.quant.gate import clone_graph
from tests.frontend.dense_llama import TINY_CONFIG, random_weights, write_checkpoint
from tests.helpers import rng

CFG = {**TINY_CONFIG, "vocab_size": 260, "hidden_size": 64, "intermediate_size": 128, "head_dim": 16,
       "max_position_embeddings": 1024}


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    weights = random_weights(CFG, np.random.default_rng(0))
    path = write_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", CFG, weights)
    return import_model(path)


def _with(graph, spec: str):
    g = clone_graph(graph)
    run_passes(g, ["quantize"], PassContext(options={"quantize": {"format": spec}}))
    return g


def test_null_quantization_scores_exactly_perfect(graph) -> None:
    ev = Evaluator(graph, np.random.default_rng(1).integers(3, 259, 700), seq_len=128, tokens_per_step=256)
    a = ev.score(clone_graph(graph))
    assert a.tokens == 700 and a.top1 == 1.0 and a.kl == 0.0
    bf16, fp8 = ev.score(_with(graph, "bf16")), ev.score(_with(graph, "fp8"))
    assert 0.0 < bf16.kl < 1e-4 and bf16.top1 > 0.97
    assert fp8.kl > 10 * bf16.kl


def test_compare_logits_matches_a_direct_computation() -> None:
    r = rng()
    ref, got = r.standard_normal((300, 50)) * 3, r.standard_normal((300, 50)) * 3
    agree, kl = compare_logits(ref.astype(np.float32), got.astype(np.float32), rows=64)
    p = np.exp(ref - ref.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    q = np.exp(got - got.max(1, keepdims=True))
    q /= q.sum(1, keepdims=True)
    assert agree == int((ref.argmax(1) == got.argmax(1)).sum())
    assert kl == pytest.approx(float((p * np.log(p / q)).sum()), rel=1e-5)
