"""``ingot.compile(..., quant=...)`` end to end on a tiny random Llama with a byte tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ingot
from ingot.api import CompileError
from ingot.runtime.artifact import load_graph
from ingot.runtime.paged import greedy_generate
from tests.frontend.dense_llama import TINY_CONFIG, random_weights, write_checkpoint
from tests.runtime.serving_models import write_byte_tokenizer

CFG = {**TINY_CONFIG, "vocab_size": 260, "hidden_size": 64, "intermediate_size": 128, "head_dim": 16,
       "max_position_embeddings": 1024}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    path = write_checkpoint(d / "ckpt", CFG, random_weights(CFG, np.random.default_rng(0)))
    write_byte_tokenizer(path)
    return path


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("INGOT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ingot-cache"))


def test_fp8_artifact_has_report_and_runs(ckpt, tmp_path):
    out = ingot.compile(ckpt, out=tmp_path / "m.ingot", quant="fp8")
    report = json.loads((out / "quant_report.json").read_text())
    assert {r["spec"] for r in report["layers"]} == {"fp8"} and len(report["layers"]) == 8
    assert report["eval"]["tokens"] >= 4096 and report["eval"]["top1"] > 0.9
    assert all(r["snr_db"] > 20 for r in report["layers"])
    graph, manifest = load_graph(out)
    assert manifest["quantization"]["format"] == "fp8"
    assert graph.op_histogram()["quantized_linear"] == 8
    assert graph.weights["model.layers.0.self_attn.qkv_proj.weight"].type.dtype.value == "f8e4m3fn"
    assert len(greedy_generate(graph, [1, 50, 60, 70], 4)) >= 1


def test_nvfp4_budget_met_by_fallback_with_config_and_fp8_kv(ckpt, tmp_path):
    cfg = tmp_path / "quant.json"
    cfg.write_text(json.dumps({"default": "nvfp4", "layers": {"layers.1.mlp_out": "mxfp4"}, "kv_cache": "fp8:head"}))
    calib = tmp_path / "calib.npz"
    np.savez(calib, input_ids=np.random.default_rng(1).integers(3, 259, (4, 128)))
    lines: list[str] = []
    out = ingot.compile(ckpt, out=tmp_path / "m.ingot", quant="nvfp4", quant_config=cfg, calib=calib,
                        accuracy_budget="top1=0.9", quant_log=lines.append)
    report = json.loads((out / "quant_report.json").read_text())
    assert report["met"] and report["eval"]["top1"] >= 0.9 and report["eval"]["tokens"] == 20480
    assert report["fallbacks"] > 0 and any("missed" in line for line in lines)
    fell = [r for r in report["layers"] if r["fell_back"]]
    assert fell and all("SNR" in r["reason"] for r in fell)
    assert report["calibration"]["tokens"] == 512
    graph, manifest = load_graph(out)
    assert manifest["kv_cache"]["dtype"] == ("f8e4m3fn" if report["kv_cache"] else "f32")


def test_impossible_budget_fails_and_writes_nothing(ckpt, tmp_path):
    with pytest.raises(CompileError, match="cannot be met"):
        ingot.compile(ckpt, out=tmp_path / "m.ingot", quant="nvfp4", accuracy_budget="top1=1.0,kl=0")
    assert not (tmp_path / "m.ingot").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".m.ingot")]


def test_bad_budget_and_config_are_clear(ckpt, tmp_path):
    with pytest.raises(CompileError, match="top1=1.5 must be in"):
        ingot.compile(ckpt, out=tmp_path / "m.ingot", quant="fp8", accuracy_budget="top1=1.5")
    with pytest.raises(CompileError, match="unknown quantization format"):
        ingot.compile(ckpt, out=tmp_path / "m.ingot", quant_config={"default": "int3"})


def test_cli_compile_and_inspect_print_the_table(ckpt, tmp_path, capsys):
    from ingot.cli import main

    budget = "top1=0.5"
    assert main(["compile", str(ckpt), "-o", str(tmp_path / "m.ingot"), "--quant", "mxfp4",
                 "--accuracy-budget", budget]) == 0
    text = capsys.readouterr().out
    assert "quantization (mxfp4" in text and "layers.0.qkv" in text
    assert main(["inspect", str(tmp_path / "m.ingot")]) == 0
    assert "layers.1.mlp_out" in capsys.readouterr().out
    assert main(["compile", str(ckpt), "-o", str(tmp_path / "x.ingot"), "--quant", "fp8",
                 "--accuracy-budget", "top1=1.0,kl=0"]) == 2
    assert "cannot be met" in capsys.readouterr().err and not (tmp_path / "x.ingot").exists()
