"""GPTQ rounding (``ingot.quant.gptq``): exact round-to-nearest when there is nothing to compensate,
smaller layer-output error than round-to-nearest on correlated inputs, the stored layout unchanged,
and the compile path (``quant_rounding="gptq"``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ingot
from ingot.api import CompileError
from ingot.ir.quant import formats as F
from ingot.quant.config import QuantConfigError, load_config, parse_spec
from ingot.quant.gptq import gptq_quantize_weight
from ingot.quant.linear import layer_output, quantize_weight, snr_db
from tests.helpers import rng

SPECS = ["fp8:wo", "fp8:tensor:wo", "fp8:block:wo", "nvfp4:wo", "mxfp4:wo"]


def _correlated_inputs(r: np.random.Generator, tokens: int, k: int) -> np.ndarray:
    """Activations with strongly correlated channels and a few large ones, like an LLM's."""
    mix = r.standard_normal((k, k)) * 0.3 + np.eye(k)
    x = r.standard_normal((tokens, k)) @ mix
    x[:, r.choice(k, 4, replace=False)] *= 8.0
    return x.astype(np.float32)


def _same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        np.asarray(a[k]).dtype == np.asarray(b[k]).dtype and np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes()
        for k in a)


@pytest.mark.parametrize("spec", SPECS)
def test_identity_gram_is_round_to_nearest(spec: str) -> None:
    """With H = I no error is spread to other columns, so every code is round-to-nearest's."""
    q = parse_spec(spec, "cpu")
    w = (rng().standard_normal((96, 256)) * rng().uniform(0.01, 3.0, (96, 1))).astype(np.float32)
    for act_order in (True, False):
        got = gptq_quantize_weight(w, q, np.eye(256), act_order=act_order)
        assert _same_arrays(got, quantize_weight(w, q)), (spec, act_order)


@pytest.mark.parametrize("spec", SPECS)
def test_gptq_lowers_layer_output_error(spec: str) -> None:
    """On held-out inputs from the same distribution, the layer's output is closer to full precision
    than with round-to-nearest (same scales, same bytes)."""
    r = rng()
    q = parse_spec(spec, "cpu")
    k = 256
    mix = r.standard_normal((k, k)) * 0.3 + np.eye(k)
    loud = r.choice(k, 4, replace=False)

    def draw(tokens: int) -> np.ndarray:
        x = r.standard_normal((tokens, k)) @ mix
        x[:, loud] *= 8.0
        return x.astype(np.float32)

    calib, held_out = draw(4096), draw(2048)
    w = r.standard_normal((128, k)).astype(np.float32)
    gram = calib.astype(np.float64).T @ calib.astype(np.float64)
    got = gptq_quantize_weight(w, q, gram)
    rtn = quantize_weight(w, q)
    ref = held_out @ w.T
    gain = snr_db(ref, layer_output(q, held_out, w, got)) - snr_db(ref, layer_output(q, held_out, w, rtn))
    assert gain > 2.0, f"{spec}: GPTQ gained only {gain:.2f} dB over round-to-nearest"
    # the same layout, dtypes and scales as round-to-nearest: only the codes move
    for key in rtn:
        assert np.asarray(got[key]).shape == np.asarray(rtn[key]).shape and got[key].dtype == rtn[key].dtype
        if key != "weight":
            assert np.asarray(got[key]).tobytes() == np.asarray(rtn[key]).tobytes()


def test_fp8_codes_stay_in_range_and_decode_with_the_op() -> None:
    """Compensation can push a weight past the row's amax: it saturates to +-448, never NaN."""
    r = rng()
    q = parse_spec("fp8", "cpu")
    x = _correlated_inputs(r, 2048, 128)
    w = r.standard_normal((64, 128)).astype(np.float32)
    got = gptq_quantize_weight(w, q, x.astype(np.float64).T @ x.astype(np.float64))
    codes = got["weight"].astype(np.float32)
    assert np.isfinite(codes).all() and np.abs(codes).max() <= F.E4M3_MAX
    deq = F.dequantize_fp8(got["weight"], got["weight_scale"], "channel")
    y = layer_output(q, x, w, got)  # the quantized_linear reference (per-token FP8 activations)
    assert snr_db(x @ deq.T, y) > 25  # only the activation rounding separates the two


def test_blocked_updates_match_the_unblocked_algorithm() -> None:
    """Lazy batch updates (block 128) are an exact reordering of the one-column-at-a-time algorithm."""
    r = rng()
    q = parse_spec("nvfp4:wo", "cpu")
    x = _correlated_inputs(r, 1024, 192)
    w = r.standard_normal((48, 192)).astype(np.float32)
    gram = x.astype(np.float64).T @ x.astype(np.float64)
    a = gptq_quantize_weight(w, q, gram, block=128)["weight"]
    b = gptq_quantize_weight(w, q, gram, block=1)["weight"]
    assert np.mean(a == b) > 0.999  # float summation order may flip an exact tie, nothing more


def test_bad_inputs_are_named() -> None:
    q = parse_spec("fp8", "cpu")
    w = rng().standard_normal((8, 32)).astype(np.float32)
    with pytest.raises(ValueError, match="Gram matrix"):
        gptq_quantize_weight(w, q, np.eye(16))
    with pytest.raises(ValueError, match="damp"):
        gptq_quantize_weight(w, q, np.eye(32), damp=0.0)
    with pytest.raises(QuantConfigError, match="rounding"):
        load_config({"rounding": "stochastic"})
    with pytest.raises(QuantConfigError, match="gptq"):
        load_config({"rounding": "gptq", "gptq": {"dampening": 0.1}})


def test_compile_with_gptq_rounding(tmp_path, monkeypatch) -> None:
    from tests.frontend.dense_llama import random_weights, write_checkpoint
    from tests.quant.test_compile import CFG
    from tests.runtime.serving_models import write_byte_tokenizer

    monkeypatch.setenv("INGOT_CACHE_DIR", str(tmp_path / "cache"))
    ckpt = write_checkpoint(tmp_path / "ckpt", CFG, random_weights(CFG, rng()))
    write_byte_tokenizer(ckpt)
    lines: list[str] = []
    out = ingot.compile(ckpt, out=tmp_path / "g.ingot", quant="nvfp4", quant_rounding="gptq", quant_log=lines.append)
    near = ingot.compile(ckpt, out=tmp_path / "n.ingot", quant="nvfp4")
    report = json.loads((out / "quant_report.json").read_text())
    assert report["rounding"] == "gptq" and any("GPTQ" in line for line in lines)
    assert json.loads((near / "quant_report.json").read_text())["rounding"] == "nearest"
    from ingot.runtime.artifact import load_graph

    g, _ = load_graph(out)
    n, _ = load_graph(near)
    name = "model.layers.0.mlp.down_proj.weight"
    assert g.weights[name].load().tobytes() != n.weights[name].load().tobytes()  # codes moved
    assert g.weights[name.replace("weight", "weight_scale")].load().tobytes() == \
        n.weights[name.replace("weight", "weight_scale")].load().tobytes()  # scales did not
    ids = rng().integers(3, 259, 12).tolist()
    from ingot.runtime.paged import greedy_generate

    assert len(greedy_generate(g, ids, 4)) >= 1
    with pytest.raises(CompileError, match="rounding"):
        ingot.compile(ckpt, out=tmp_path / "bad.ingot", quant="fp8", quant_rounding="floor")
    assert not (tmp_path / "bad.ingot").exists()
