"""Quantized LLMs lowered for the GPU targets without a GPU: ``ingot.compile(ckpt, target="h200" | "b200",
quant=...)`` on a tiny random Llama (FP8 W8A8 per token, FP8 with static activation scales, NVFP4 weight-only,
FP8 KV caches) writes a kernel table whose ``quantized_linear`` launches are the quantized
GEMV (``codegen/kernels/gemv/quant.cu``: the any-M kernel as the launch, one variant per token bucket) and whose
``paged_attention_fp8`` launches are the FP8 cache write and the split-KV kernel, both bound to ``kv_scale``;
the f32 scales stay f32 and the FP8 / packed-FP4 codes keep their types in the weights file and the memory
plan; the artifact still runs on the CPU backend. The same model runs on a GPU in
``tests/runtime/test_quant_cuda.py``.

The model's shapes suit the kernels: head_dim 64 (the split-KV kernel takes 64, 128, 256) and every K a
multiple of 128 (NVFP4 GEMV steps).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import ingot
from ingot.api import CompileError
from ingot.codegen.decode_fusion import variant_reads
from ingot.codegen.memory_plan import plan_memory
from ingot.codegen.sass import disassemble, find_cuobjdump, opcodes, sass_arch
from ingot.runtime.artifact import load_graph
from ingot.runtime.paged import PagedModel
from ingot.runtime.safetensors_io import SafetensorsFile
from tests.frontend.dense_llama import TINY_CONFIG, random_weights, write_checkpoint
from tests.helpers import rng
from tests.runtime.serving_models import write_byte_tokenizer

#: hidden 128, 4 query / 2 KV heads of 64, MLP 256: K is 128 or 256 for every linear
QUANT_LLAMA = {**TINY_CONFIG, "vocab_size": 260, "hidden_size": 128, "intermediate_size": 256,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 1024}
#: quant configs: short calibration, no eval run (the report's figures are tests/quant's business)
FAST = {"eval_tokens": 0, "calibration": {"tokens": 256}}
CASES = {
    "fp8": {"default": "fp8"},
    "fp8-kv": {"default": "fp8", "kv_cache": "fp8"},
    "nvfp4": {"default": "nvfp4"},
    "fp8-static": {"default": "fp8:static", "kv_cache": "fp8:tensor"},
}
ARCH = {"h200": "sm_90a", "b200": "sm_100a"}


def quant_checkpoint(directory: Path, seed: int = 0) -> Path:
    """The tiny Llama (``QUANT_LLAMA``) with random weights from ``seed`` and a byte tokenizer."""
    path = write_checkpoint(directory / "ckpt", QUANT_LLAMA, random_weights(QUANT_LLAMA, np.random.default_rng(seed)))
    write_byte_tokenizer(path)
    return path


def compile_quant(ckpt: Path, target: str, config: dict, out: Path) -> Path:
    """``ckpt`` quantized by ``config`` (a quant config, e.g. one of ``CASES``) and lowered for ``target``."""
    return ingot.compile(ckpt, target=target, out=out, quant_config={**config, **FAST})


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return quant_checkpoint(tmp_path_factory.mktemp("quant-llama"))


@pytest.fixture(autouse=True)
def _kernel_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("INGOT_CACHE_DIR", os.environ.get("INGOT_TEST_KERNEL_CACHE")
                       or str(tmp_path_factory.getbasetemp() / "kernel-cache"))


def _kernel_table(path: Path, target: str) -> dict:
    manifest = json.loads((path / "manifest.json").read_text())
    cuda = manifest["cuda"]
    assert cuda["arch"] == ARCH[target]
    assert {ln["kernel"] for ln in cuda["launches"]} == set(cuda["kernels"])
    variants = {v["kernel"] for ln in cuda["launches"] for v in ln.get("variants", ())}
    assert variants == set(cuda["variant_kernels"])
    for k in (*cuda["kernels"].values(), *cuda["variant_kernels"].values()):
        assert (path / k["cubin"]).read_bytes()[:4] == b"\x7fELF"
    return manifest


def _check_quantized_linears(cuda: dict, weight_format: str, act: str, static: bool = False) -> None:
    tag = f"gemv_{weight_format}_{act}_"
    qls = [ln for ln in cuda["launches"] if ln["op"] == "quantized_linear"]
    assert len(qls) == 8  # 2 layers x (qkv, o_proj, gate_up, down)
    for ln in qls:
        spec = cuda["kernels"][ln["kernel"]]["spec"]
        assert ln["kernel"].startswith(tag) and spec["template"] == "quant.cu" and spec["values"]["ANY_M"], ln
        assert [p for p, _ in spec["params"]] == ["x", "weight", "weight_scale", "weight_scale_2", "input_scale",
                                                  "bias", "residual", "out", "M"]
        assert ln["args"]["M"] == {"dim": "T"} and ln["args"]["bias"] == {"null": True}
        assert ln["args"]["weight"]["buffer"].endswith(".weight")
        assert ln["args"]["weight_scale"]["buffer"].endswith(".weight_scale")
        if weight_format == "nvfp4":
            assert ln["args"]["weight_scale_2"]["buffer"].endswith(".weight_scale_2")
        else:
            assert ln["args"]["weight_scale_2"] == {"null": True}
        if static:  # the calibrated activation scale, AFMT 2
            assert ln["args"]["input_scale"]["buffer"].endswith(".input_scale") and spec["values"]["AFMT"] == 2
        else:
            assert ln["args"]["input_scale"] == {"null": True}
        assert [v["max_rows"] for v in ln["variants"]] == [8, 16, 32, 64]
        assert all(v["kernel"].startswith(tag) for v in ln["variants"])
    # the residual adds of o_proj and down_proj are fused into the GEMV's epilogue
    assert sum("buffer" in ln["args"]["residual"] for ln in qls) == 4


def _check_weights(path: Path, manifest: dict, weight_format: str, kv_fp8: bool, static: bool = False) -> None:
    """Codes keep their types and f32 scales stay f32: in the manifest, the weights file and the memory plan."""
    want = {".weight_scale_2": "f32"} if weight_format == "nvfp4" else {}
    if weight_format == "fp8":
        want.update({".weight_scale": "f32", "proj.weight": "f8e4m3fn"})
    else:
        want.update({".weight_scale": "f8e4m3fn", "proj.weight": "u8"})
    if kv_fp8:
        want["attn.kv_scale"] = "f32"
    if static:
        want[".input_scale"] = "f32"
    weights = manifest["weights"]
    stored = SafetensorsFile(path / "weights.safetensors")
    plan = manifest["cuda"]["memory_plan"]["buffers"]
    seen = set()
    for name, w in weights.items():
        suffix = next((s for s in want if name.endswith(s)), None)
        dtype = want[suffix] if suffix else ("f32" if name.startswith("rope.") else "bf16")
        seen.add(suffix)
        assert w["dtype"] == dtype, (name, w)
        assert stored.info(name)[0].value == dtype and list(stored.info(name)[1]) == w["shape"], name
        assert plan[name]["dtype"] == dtype and plan[name]["region"] == "weights", name
        numel = int(np.prod(w["shape"], dtype=np.int64))
        assert plan[name]["nbytes"] == numel * (4 if dtype == "f32" else 2 if dtype == "bf16" else 1), name
    assert seen >= set(want), f"missing weights for {set(want) - seen}"
    if weight_format == "nvfp4":
        qkv = weights["model.layers.0.self_attn.qkv_proj.weight"]["shape"]
        assert qkv == [512, 64]  # u8[N, K/2]: two E2M1 codes a byte
    cache = "f8e4m3fn" if kv_fp8 else "bf16"
    assert manifest["kv_cache"]["dtype"] == cache
    for name in ("kv_cache.0", "kv_cache.1"):
        assert plan[name]["dtype"] == cache and plan[name]["region"] == "kv"
        assert plan[name]["nbytes"] == 2 * 16 * 2 * 64 * (1 if kv_fp8 else 2)


def _check_attention(cuda: dict, kv_fp8: bool) -> None:
    attn = [ln for ln in cuda["launches"] if ln["op"].startswith("paged_attention")]
    assert len(attn) == 4  # 2 layers x (cache write, attention)
    for write, attend in zip(attn[::2], attn[1::2]):
        assert write["op"] == attend["op"] == ("paged_attention_fp8" if kv_fp8 else "paged_attention")
        if kv_fp8:
            assert cuda["kernels"][attend["kernel"]]["spec"]["template"] == "decode_split.cu"
        else:  # bf16 cache: the tensor-core prefill kernel, the split-KV decode kernel its small-step variant
            assert cuda["kernels"][attend["kernel"]]["spec"]["template"] == "prefill_flash.cu"
            assert attend["rows_arg"] == "num_tokens"
            variant = cuda["variant_kernels"][attend["variants"][0]["kernel"]]
            assert variant["spec"]["template"] == "decode_split.cu"
        wt = cuda["kernels"][write["kernel"]]["spec"]["template"]
        assert wt == ("cache_write_fp8.cu" if kv_fp8 else "cache_write.cu")
        if kv_fp8:
            layer = write["source"] or ""
            assert write["args"]["kv_scale"] == attend["args"]["kv_scale"]
            assert write["args"]["kv_scale"]["buffer"].endswith(".attn.kv_scale"), layer
            assert write["kernel"].startswith("kv_cache_write_fp8_")
            assert "_f8e4m3fn_" in attend["kernel"]
        else:
            assert "kv_scale" not in write["args"] and "kv_scale" not in attend["args"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_quantized_llama_lowers_for_h200(ckpt, tmp_path, case):
    path = compile_quant(ckpt, "h200", CASES[case], tmp_path / f"{case}.ingot")
    manifest = _kernel_table(path, "h200")
    cuda = manifest["cuda"]
    fmt, kv_fp8, static = case.split("-")[0], "kv_cache" in CASES[case], case.endswith("-static")
    _check_quantized_linears(cuda, fmt, "a8" if fmt == "fp8" else "a16", static)
    _check_attention(cuda, kv_fp8)
    _check_weights(path, manifest, fmt, kv_fp8, static)
    lm_head = [ln for ln in cuda["launches"] if ln["op"] == "linear"]
    assert len(lm_head) == 1 and cuda["kernels"][lm_head[0]["kernel"]]["spec"]["family"] == "gemm"
    # the memory plan the runtime reads is the one the loaded graph gives
    graph, _ = load_graph(path)
    reads = variant_reads(cuda["launches"])  # fused decode variants (codegen/decode_fusion.py)
    assert plan_memory(graph, cuda["memory_plan"]["bindings"], reads=reads).to_dict() == cuda["memory_plan"]
    # the bf16 quantized graph is complete: the CPU backend runs it (the GPU test's reference)
    m = PagedModel(graph, num_blocks=8)
    ids = [int(t) for t in rng().integers(3, 259, 21)]
    logits = m.step([(m.add_sequence(), ids)])
    assert logits.shape == (1, 260) and logits.dtype == np.float32 and np.isfinite(logits).all()


def test_fp8_with_fp8_kv_lowers_for_b200(ckpt, tmp_path):
    path = compile_quant(ckpt, "b200", CASES["fp8-kv"], tmp_path / "b200.ingot")
    manifest = _kernel_table(path, "b200")
    cuda = manifest["cuda"]
    _check_quantized_linears(cuda, "fp8", "a8")
    _check_attention(cuda, True)
    _check_weights(path, manifest, "fp8", True)
    if find_cuobjdump() is None:
        pytest.skip("no cuobjdump for the SASS check")
    gemv = next(ln for ln in cuda["launches"] if ln["op"] == "quantized_linear")
    attend = next(ln for ln in cuda["launches"] if ln["op"] == "paged_attention_fp8" and "split" in ln["kernel"])
    for entry in (gemv["kernel"], gemv["variants"][0]["kernel"], attend["kernel"]):
        table = cuda["kernels"] if entry in cuda["kernels"] else cuda["variant_kernels"]
        sass = disassemble((path / table[entry]["cubin"]).read_bytes())
        assert sass_arch(sass) == "sm_100a", entry
        if entry.startswith("gemv_"):  # tensor-core products (mma.sync)
            assert any(o.startswith(("HMMA", "QMMA")) for o in opcodes(sass)), sorted(opcodes(sass))


def test_nvfp4_for_b200_names_the_missing_kernel(ckpt, tmp_path):
    """On b200 NVFP4 is W4A4 with sm_100-swizzled scales (CUTLASS's layout), which the decode GEMV does not
    read yet: the compile fails naming the node's formats, and writes nothing."""
    why = r"(?s)quantized_linear \(8 nodes\).*nvfp4 weights .*sm100 layout.*nvfp4 activations"
    with pytest.raises(CompileError, match=why):
        compile_quant(ckpt, "b200", CASES["nvfp4"], tmp_path / "b200-nvfp4.ingot")
    assert not (tmp_path / "b200-nvfp4.ingot").exists()
