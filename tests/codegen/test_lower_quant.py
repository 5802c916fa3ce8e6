"""Quantized LLMs lowered for the GPU targets without a GPU: ``ingot.compile(ckpt, target="h200" | "b200",
quant=...)`` on a tiny random Llama (FP8 W8A8 per token, FP8 with static activation scales, NVFP4 weight-only,
FP8 KV caches) writes a kernel table whose ``quantized_linear`` launches are the quantized
GEMV (``codegen/kernels/gemv/quant.cu``: the any-M kernel as the launch, one variant per token bucket) and whose
``paged_attention_fp8`` launches are the FP8 cache write and the split-KV kernel, both bound to ``kv_scale``;
the f32 scales stay f32 and the FP8 / packed-FP4 codes keep their types in the weights file and the memory
plan; the artifact still runs on the CPU backend. The same model runs on a GPU in
``tests/runtime/test_quant_cuda.py``.

On b200, W4A4 NVFP4 / MXFP4 linears are the activation quantizer + the block-scaled CUTLASS GEMM
(``test_w4a4_lowers_for_b200``, slow: CUTLASS builds); weight-only MXFP4 there still has no kernel.

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
from ingot.codegen.kernel import KernelSpec
from ingot.codegen.kernels.gemm_cutlass import blockscaled_rule
from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp
from ingot.codegen.kernels.gemm_cutlass.build import cutlass_available
from ingot.codegen.memory_plan import plan_memory
from ingot.codegen.sass import disassemble, find_cuobjdump, opcodes, sass_arch
from ingot.codegen.target import get_target
from ingot.runtime.artifact import load_graph
from ingot.runtime.cuda_launch import CutlassLaunch, cutlass_nk
from ingot.runtime.paged import PagedModel
from ingot.runtime.safetensors_io import SafetensorsFile
from tests.codegen.common import assert_no_local_memory, session_kernel_cache  # noqa: F401 (a fixture)
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
    # 128 x 128 block scales (DeepSeek-V3's weights): quant.cu's fp8_block variants, the scales [ceil(N/128)][K/128]
    "fp8-block": {"default": "fp8:block"},
}
ARCH = {"h200": "sm_90a", "b200": "sm_100a"}
needs_cutlass = pytest.mark.skipif(not cutlass_available(),
                                   reason="needs nvcc and CUTLASS headers: pip install nvidia-cutlass nvidia-cuda-nvcc")


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


pytestmark = pytest.mark.usefixtures("session_kernel_cache")


@pytest.fixture(autouse=True)
def _kernel_cache(monkeypatch):
    # the quantized GEMV at every row count: the prefill dequantize + GEMM pairs (on by default) have their own tests
    # (tests/codegen/test_quant_prefill_gemm.py)
    monkeypatch.setenv("INGOT_QUANT_PREFILL_GEMM", "0")
    # the attention's own cache-write launch: rope-cache fusion (on by default) moves it into rope_qkv, checked with
    # the FP8 cache too in tests/codegen/test_rope_cache_fusion.py
    monkeypatch.setenv("INGOT_ROPE_CACHE_FUSION", "0")
    # NVFP4 weight-only decode buckets as quant.cu's: kernel.cu's by default (its lowering with the decode fusions:
    # tests/codegen/test_gemv_fp8.py, parametrized over FP8 and NVFP4)
    monkeypatch.setenv("INGOT_GEMV_NVFP4", "quant")


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
        else:  # bf16 cache: the tensor-core prefill kernel (wgmma on sm_90a), the split-KV decode kernel its variant
            prefill = "prefill_wgmma.cu" if cuda["arch"] == "sm_90a" else "prefill_flash.cu"
            assert cuda["kernels"][attend["kernel"]]["spec"]["template"] == prefill
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
    _check_quantized_linears(cuda, "fp8_block" if case == "fp8-block" else fmt, "a8" if fmt == "fp8" else "a16", static)
    _check_attention(cuda, kv_fp8)
    _check_weights(path, manifest, fmt, kv_fp8, static)
    if case == "fp8-block":  # WFMT 2, each scale the weight's [ceil(N / 128)][K / 128] blocks
        for ln in (ln for ln in cuda["launches"] if ln["op"] == "quantized_linear"):
            spec = cuda["kernels"][ln["kernel"]]["spec"]
            n, k = spec["values"]["N"], spec["values"]["K"]
            assert spec["values"]["WFMT"] == 2 and spec["values"]["KS"] % 128 == 0
            scale = manifest["weights"][ln["args"]["weight_scale"]["buffer"]]
            assert scale["shape"] == [-(-n // 128), k // 128], (ln["kernel"], scale)
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


#: W4A4 on b200: NVFP4 with the calibrated static activation global scale (the default there) or per token,
#: MXFP4 per block
W4A4 = {"nvfp4": {"default": "nvfp4"}, "nvfp4-dynamic": {"default": "nvfp4:dynamic"},
        "mxfp4": {"default": "mxfp4:w4a4"}}


#: CI builds the NVFP4 GEMMs (nvfp4-dynamic reuses them); MXFP4's builds (~2 min cold on 2 cores) need INGOT_SLOW=1
_SLOW_ONLY = pytest.mark.skipif(not os.environ.get("INGOT_SLOW"),
                                reason="set INGOT_SLOW=1 to build the MXFP4 GEMMs too")


@pytest.mark.slow
@needs_cutlass
@pytest.mark.parametrize("case", [pytest.param(c, marks=[_SLOW_ONLY] if c == "mxfp4" else []) for c in sorted(W4A4)])
def test_w4a4_lowers_for_b200(ckpt, tmp_path, case):
    """On b200 each W4A4 linear is the activation quantizer then the block-scaled CUTLASS GEMM (tcgen05 UTCOMMA),
    through memory-plan temporaries; compiled and SASS-checked here, nothing runs on a B200. Builds: one GEMM per
    epilogue (plain, residual) per format, cubin and Params probe each (minutes cold; the kernel cache keeps them)."""
    path = compile_quant(ckpt, "b200", W4A4[case], tmp_path / f"b200-{case}.ingot")
    manifest = _kernel_table(path, "b200")
    cuda = manifest["cuda"]
    fmt, static = case.split("-")[0], case == "nvfp4"
    if fmt == "nvfp4":
        _check_weights(path, manifest, "nvfp4", kv_fp8=False, static=static)
    qls = [ln for ln in cuda["launches"] if ln["op"] == "quantized_linear"]
    assert len(qls) == 16  # 2 layers x (qkv, o_proj, gate_up, down) x (quantizer, GEMM)
    quantizers, gemms = set(), set()
    for quant, gemm in zip(qls[::2], qls[1::2]):
        assert quant["node"] == gemm["node"] and "variants" not in gemm and "alternatives" not in gemm
        qk, gk = cuda["kernels"][quant["kernel"]], cuda["kernels"][gemm["kernel"]]
        assert qk["spec"]["family"] == "quant_act" and qk["spec"]["values"]["STATIC"] == static
        assert gk["spec"]["template"] == "sm100_blockscaled.cu" and "cutlass" in gk
        assert {t["tensor"] for t in gk["cutlass"]["tma"]} >= {"x_block_scale", "weight_block_scale"}
        quantizers.add(quant["kernel"])
        gemms.add(gemm["kernel"])
        out = gemm["args"]["out"]["buffer"]
        assert quant["args"]["x_fp4"] == gemm["args"]["x"] == {"buffer": f"{out}.x_fp4"}
        assert quant["args"]["x_block_scale"] == gemm["args"]["x_block_scale"] == {"buffer": f"{out}.x_block_scale"}
        assert gemm["args"]["weight_block_scale"]["buffer"].endswith(".weight_scale")
        assert quant["args"]["M"] == gemm["args"]["M"] == {"dim": "T"}
        if fmt == "nvfp4":  # the per-row scale: (input_scale or the row's amax / 2688) * weight_scale_2
            assert quant["args"]["x_scale"] == gemm["args"]["x_scale"] == {"buffer": f"{out}.x_scale"}
            if static:
                assert quant["args"]["input_scale"]["buffer"].endswith(".input_scale")
            else:
                assert quant["args"]["input_scale"] == {"null": True}
            assert quant["args"]["weight_scale_2"]["buffer"].endswith(".weight_scale_2")
        else:
            assert quant["args"]["x_scale"] == gemm["args"]["x_scale"] == {"null": True}
        plan = cuda["memory_plan"]["buffers"]
        assert plan[f"{out}.x_fp4"]["region"] == plan[f"{out}.x_block_scale"]["region"] == "scratch"
    assert len(quantizers) == 2  # K = 128 (qkv, gate_up), 256 (o_proj, down)
    assert len(gemms) == 2  # shape-generic: one plain, one with the residual epilogue (o_proj, down)
    assert sum("buffer" in ln["args"]["residual"] for ln in qls[1::2]) == 4
    _check_w4a4_binding(cuda)
    # the memory plan is the one the loaded graph gives with the rule's temporaries
    graph, _ = load_graph(path)
    temporaries = blockscaled_rule.temporaries(graph, get_target("b200"))
    assert len(temporaries) == (24 if fmt == "nvfp4" else 16)
    assert plan_memory(graph, cuda["memory_plan"]["bindings"], reads=variant_reads(cuda["launches"]),
                       temporaries=temporaries).to_dict() == cuda["memory_plan"]
    if find_cuobjdump() is not None:
        for entry in sorted(quantizers | gemms):
            sass = disassemble((path / cuda["kernels"][entry]["cubin"]).read_bytes())
            assert sass_arch(sass) == "sm_100a", entry
            ops = opcodes(sass)
            if entry in gemms:  # tcgen05 block-scaled MMA, TMA loads
                assert any(o.startswith("UTCOMMA") for o in ops), sorted(o for o in ops if "MMA" in o)
                assert any(o.startswith("UTMALDG") for o in ops)
            else:
                assert_no_local_memory(ops, entry)
    # the quantized graph still runs on the CPU backend (the reference a B200 run would be compared with)
    m = PagedModel(graph, num_blocks=8)
    ids = [int(t) for t in rng().integers(3, 259, 21)]
    logits = m.step([(m.add_sequence(), ids)])
    assert logits.shape == (1, 260) and np.isfinite(logits).all()


def _check_w4a4_binding(cuda: dict) -> None:
    """What the CUDA backend does with each block-scaled GEMM launch, up to the driver: ``CutlassLaunch``'s pointers
    from the arena, N and K from the weight (``cutlass_nk``: K twice the packed columns), the Params blob at the
    bound row count with the descriptors recorded instead of encoded: each over its argument's buffer, and the last
    byte it addresses inside that buffer's memory-plan bytes (the scale factors' 128-row padding included)."""
    buffers = cuda["memory_plan"]["buffers"]
    base = {"weights": 1 << 40, "io": 2 << 40, "scratch": 3 << 40}

    def address(name: str) -> int:
        return base[buffers[name]["region"]] + buffers[name]["offset"]

    rows = cuda["memory_plan"]["bindings"]["T"]
    bytes_per = {13: 0.5, 1: 2, 9: 2}  # TMA element types: 16U4_ALIGN8B (packed e2m1), UINT16, BFLOAT16
    for ln in cuda["launches"]:
        entry = cuda["kernels"][ln["kernel"]]
        if ln["op"] != "quantized_linear" or "cutlass" not in entry:
            continue
        spec, layout = KernelSpec.from_dict(entry["spec"]), entry["cutlass"]
        n, k = cutlass_nk(buffers[ln["args"]["weight"]["buffer"]])
        launch = CutlassLaunch(None, spec, ln["args"], address, ln["kernel"], [], layout, n, k, 148)
        seen: dict[str, tuple[dict, int, list, list]] = {}

        def record(t, addr, dims, strides, seen=seen):
            seen[t["tensor"]] = (t, addr, dims, strides)
            return bytes(cp.TMA_BYTES)

        cp.build_params(layout, launch.runner.pointers, rows, n, k, 148, encode=record)
        residual = {"residual"} if "buffer" in ln["args"]["residual"] else set()  # the epilogue's C operand
        assert set(seen) == {"x", "weight", "x_block_scale", "weight_block_scale", "out"} | residual
        for tensor, (t, addr, dims, strides) in seen.items():
            name = ln["args"][tensor]["buffer"]
            assert addr == address(name), (ln["kernel"], tensor)
            last = (dims[0] - 1) * bytes_per[t["dtype"]] + sum((d - 1) * s for d, s in zip(dims[1:], strides))
            assert last < buffers[name]["nbytes"], (ln["kernel"], tensor, dims, strides, buffers[name]["nbytes"])


@pytest.mark.parametrize("spec", ["mxfp4:wo"])
def test_weight_only_fp4_for_b200_names_the_missing_kernel(ckpt, tmp_path, spec):
    """Weight-only MXFP4 on b200 has sm100-swizzled scales (pack-sm100) and bf16 activations: no kernel reads that
    (the GEMV takes linear NVFP4 scales, the block-scaled GEMM W4A4): the compile fails saying so, and writes nothing.
    (Weight-only NVFP4 keeps linear scales there and lowers as on h200: tests/codegen/test_quant_prefill_gemm.py.)"""
    fmt = spec.split(":")[0]
    why = (rf"(?s)quantized_linear \(8 nodes\).*{fmt} weights .*sm100 layout.*none activations.*"
           rf"weight-only FP4 with sm100-swizzled scales has no kernel")
    with pytest.raises(CompileError, match=why):
        compile_quant(ckpt, "b200", {"default": spec}, tmp_path / "b200-fp4-wo.ingot")
    assert not (tmp_path / "b200-fp4-wo.ingot").exists()
