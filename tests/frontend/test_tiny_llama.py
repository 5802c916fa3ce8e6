"""ingot vs onnxruntime on the tiny Llama exports in ``tests/fixtures/`` (torch.onnx, both exporters).

The fixtures are committed .onnx files (made by ``tests/fixtures/make_tiny_llama.py``); these tests
need neither torch nor transformers. Each test draws fresh random token ids (the seed is in every
failure message; pass it to ``helpers.rng`` to reproduce).

Tolerance: an output matches when ``max|ingot - ort| <= 1e-4 * max|ort|`` (max-abs error relative to
the reference's max-abs value, per output tensor), checked for the logits and every present K/V.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.helpers import rng, run_ingot, run_ort

pytest.importorskip("onnxruntime")

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NO_CACHE = ["tiny_llama.onnx", "tiny_llama_ts.onnx"]  # dynamo, TorchScript
WITH_CACHE = ["tiny_llama_kv.onnx", "tiny_llama_kv_ts.onnx"]  # dynamo, TorchScript
RTOL = 1e-4

NUM_LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 2, 2, 16, 256  # tiny_llama_config.json
BATCH, SEQ = 2, 7


@functools.cache
def load(name: str) -> onnx.ModelProto:
    return onnx.load(str(FIXTURES / name))


def new_seed() -> int:
    return int(np.random.SeedSequence().generate_state(1)[0])


def input_names(model: onnx.ModelProto) -> list[str]:
    inits = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def assert_matches(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], what: str) -> None:
    assert set(got) == set(ref), f"{what}: outputs {sorted(got)} != {sorted(ref)}"
    for name, expected in ref.items():
        actual = np.asarray(got[name])
        assert actual.dtype == expected.dtype, f"{what}: {name}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{what}: {name}: shape {actual.shape} != {expected.shape}"
        assert np.isnan(actual).sum() == np.isnan(expected).sum(), f"{what}: {name}: NaNs differ"
        ok = ~np.isnan(expected)
        err = np.abs(actual[ok].astype(np.float64) - expected[ok])
        scale = float(np.abs(expected[ok]).max()) if ok.any() else 0.0
        worst = float(err.max()) if err.size else 0.0
        assert worst <= RTOL * scale + 1e-6, (
            f"{what}: {name}: max abs error {worst:.3g} > {RTOL} * max abs reference {scale:.3g}"
            f" (at {np.unravel_index(np.argmax(np.where(ok, np.abs(actual - expected), -1)), actual.shape)})"
        )


def kv_feeds(ids: np.ndarray, mask: np.ndarray, past: dict[str, np.ndarray] | None = None) -> dict:
    """Feeds for a KV model: ``past`` holds present.{i}.key/value of an earlier step (or nothing)."""
    batch, seq = ids.shape
    past_len = 0 if past is None else past["present.0.key"].shape[2]
    assert mask.shape == (batch, past_len + seq)
    # positions count the real (unmasked) tokens before each one, as HF's generate does
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, past_len:].astype(np.int64)
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64),
             "position_ids": positions}
    empty = np.zeros((batch, KV_HEADS, 0, HEAD_DIM), np.float32)
    for i in range(NUM_LAYERS):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{i}.{kv}"] = empty if past is None else past[f"present.{i}.{kv}"]
    return feeds


# -- the fixtures themselves ------------------------------------------------------------------------


@pytest.mark.parametrize("name", NO_CACHE + WITH_CACHE)
def test_fixture_signature(name):
    """Inputs/outputs and their symbolic dims survive import as the LLM lowering expects them."""
    from ingot.frontend.onnx import import_onnx

    model = load(name)
    assert len(model.functions) == 0 and all(
        t.data_location != onnx.TensorProto.EXTERNAL for t in model.graph.initializer
    )
    g = import_onnx(model)
    ins = {v.name: v.type for v in g.inputs}
    outs = dict(zip(g.output_names, (v.type for v in g.outputs)))
    assert ins["input_ids"].shape == ("batch", "seq")
    assert outs["logits"].shape == ("batch", "seq", VOCAB)
    if name in WITH_CACHE:
        for i in range(NUM_LAYERS):
            for kv in ("key", "value"):
                assert ins[f"past_key_values.{i}.{kv}"].shape == ("batch", KV_HEADS, "past_seq", HEAD_DIM)
                shape = outs[f"present.{i}.{kv}"].shape
                assert shape[:2] == ("batch", KV_HEADS) and shape[3] == HEAD_DIM, shape


def test_fixtures_agree_under_ort():
    """All four files hold the same weights: ORT gives the same logits for each (a regeneration check)."""
    r = rng(seed := new_seed())
    ids = r.integers(0, VOCAB, (BATCH, SEQ), dtype=np.int64)
    ref = run_ort(load("tiny_llama.onnx"), {"input_ids": ids})["logits"]
    ones = np.ones_like(ids)
    others = {
        "tiny_llama_ts.onnx": run_ort(load("tiny_llama_ts.onnx"), {"input_ids": ids, "attention_mask": ones}),
        **{n: run_ort(load(n), kv_feeds(ids, ones)) for n in WITH_CACHE},
    }
    for name, out in others.items():
        assert_matches({"logits": out["logits"]}, {"logits": ref}, f"{name} vs tiny_llama.onnx, seed {seed}")


# -- ingot vs onnxruntime ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NO_CACHE)
def test_no_cache(name):
    model = load(name)
    r = rng(seed := new_seed())
    ids = r.integers(0, VOCAB, (BATCH, SEQ), dtype=np.int64)
    feeds = {"input_ids": ids}
    if "attention_mask" in input_names(model):
        feeds["attention_mask"] = np.ones_like(ids)
    assert_matches(run_ingot(model, feeds), run_ort(model, feeds), f"{name}, seed {seed}")


@pytest.mark.parametrize("name", WITH_CACHE)
def test_prefill_then_decode(name):
    """Prefill (empty past) and then one decode step per sequence, the past being the prefill's present."""
    model = load(name)
    r = rng(seed := new_seed())
    ids = r.integers(0, VOCAB, (BATCH, SEQ), dtype=np.int64)
    feeds = kv_feeds(ids, np.ones((BATCH, SEQ), np.int64))
    ref = run_ort(model, feeds)
    assert_matches(run_ingot(model, feeds), ref, f"{name} prefill, seed {seed}")

    nxt = r.integers(0, VOCAB, (BATCH, 1), dtype=np.int64)
    feeds = kv_feeds(nxt, np.ones((BATCH, SEQ + 1), np.int64), past=ref)
    ref2 = run_ort(model, feeds)
    assert ref2["present.0.key"].shape == (BATCH, KV_HEADS, SEQ + 1, HEAD_DIM)
    assert_matches(run_ingot(model, feeds), ref2, f"{name} decode, seed {seed}")


@pytest.mark.parametrize("name", WITH_CACHE)
def test_decode_with_padding(name):
    """A left-padded batch: row 1 has two padding tokens; prefill then a decode step, mask carried on."""
    model = load(name)
    r = rng(seed := new_seed())
    ids = r.integers(0, VOCAB, (BATCH, SEQ), dtype=np.int64)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, :2] = 0
    feeds = kv_feeds(ids, mask)
    ref = run_ort(model, feeds)
    assert_matches(run_ingot(model, feeds), ref, f"{name} padded prefill, seed {seed}")

    nxt = r.integers(0, VOCAB, (BATCH, 1), dtype=np.int64)
    feeds = kv_feeds(nxt, np.concatenate([mask, np.ones((BATCH, 1), np.int64)], axis=1), past=ref)
    assert_matches(run_ingot(model, feeds), run_ort(model, feeds), f"{name} padded decode, seed {seed}")
