"""qkv-rope fusion end to end on the GPU (``-m gpu``; skipped without one): the same checkpoint compiled with
``INGOT_QKV_ROPE_FUSION=1`` (``codegen/qkv_rope_fusion.py``: the qkv GEMV's decode variant rotates q and k and writes
the KV cache, the rope launch skipped in decode steps) and without gives bit-identical logits for every step and the
same KV cache bytes, with plain launches and with CUDA graphs (prefill, mixed and decode steps), for a bf16 model
(SmolLM2-shaped, GQA 3) and the tiny Llama with bf16 weights and an FP8 cache, FP8 weights (weight-only, and with
FP8 activations and cache) and NVFP4 weights; and the serving engine's greedy tokens are the same.

    python -m pytest tests/runtime/test_qkv_rope_fusion_gpu.py -m gpu -v
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ingot
from ingot.codegen.qkv_rope_fusion import ENV
from ingot.runtime.artifact import load_graph
from tests.codegen.test_lower_quant import compile_quant, quant_checkpoint
from tests.runtime.serving_models import drive_steps, run_requests
from tests.runtime.test_cuda_backend import _mixed_steps, assert_same_steps, smollm2_like

pytestmark = pytest.mark.gpu
#: quant configs: bf16 weights with an FP8 KV cache (static K/V scales); FP8 weight-only; FP8 weights and
#: activations with an FP8 cache; NVFP4 weight-only (quant.cu's rope epilogue)
QUANT = {"fp8-kv": {"default": "none", "kv_cache": "fp8"}, "fp8-wo": {"default": "fp8:wo"},
         "fp8-a8-kv": {"default": "fp8", "kv_cache": "fp8"}, "nvfp4": {"default": "nvfp4"}}


def _compile_both(tmp_path: Path, target: str, kind: str, monkeypatch) -> tuple[dict[str, Path], int]:
    """``{"1": fused, "0": as before}`` artifacts of one checkpoint, and its vocabulary size."""
    if kind == "bf16":
        ckpt, vocab = smollm2_like(tmp_path, 2), 49152
    else:
        ckpt, vocab = quant_checkpoint(tmp_path), 260
    paths = {}
    for flag in ("1", "0"):
        monkeypatch.setenv(ENV, flag if kind in ("bf16", "fp8-kv") or flag == "0" else "all")
        out = tmp_path / f"{kind}-{flag}.ingot"
        paths[flag] = (ingot.compile(ckpt, target=target, out=out) if kind == "bf16"
                       else compile_quant(ckpt, target, QUANT[kind], out))
    monkeypatch.delenv(ENV)
    return paths, vocab


@pytest.mark.parametrize("kind", ["bf16", *QUANT])
def test_qkv_rope_fusion_changes_no_logit(gpu_target, tmp_path, monkeypatch, kind):
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    paths, vocab = _compile_both(tmp_path, gpu_target, kind, monkeypatch)
    tables = {flag: load_graph(p)[1]["cuda"] for flag, p in paths.items()}
    layers = len(tables["0"]["memory_plan"]["kv_cache"]["inputs"])
    skipped = [ln for ln in tables["1"]["launches"] if ln["op"] == "rope_qkv" and "skip" in ln]
    assert len(skipped) == layers
    assert not any(ln["op"] == "rope_qkv" and "skip" in ln for ln in tables["0"]["launches"])
    steps = _mixed_steps(vocab, seed=31)
    r = np.random.default_rng(37)
    steps += [[(s, [int(t)]) for s, t in zip(range(3), r.integers(3, vocab, 3))] for _ in range(16)]
    steps += [[(1, [int(t)])] for t in r.integers(3, vocab, 10)]
    runs, caches = {}, {}
    for flag, path in paths.items():
        for graphs in (False, True):
            ex = CudaExecutor.from_artifact(path, num_blocks=32, cuda_graphs=graphs)
            runs[flag, graphs] = drive_steps(CudaPagedModel(ex), steps)
            caches[flag, graphs] = [ex.kv_cache(i) for i in range(len(ex.kv_inputs))]
            ex.close()
    assert_same_steps(runs, ("0", False), "the artifact without the fusion")
    for key, got in caches.items():
        assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(got, caches["0", False])), key


def test_engine_greedy_tokens_are_the_same(gpu_target, tmp_path, monkeypatch):
    from ingot.runtime.engine import EngineArgs, LLMEngine
    from ingot.runtime.sampling import SamplingParams

    paths, vocab = _compile_both(tmp_path, gpu_target, "bf16", monkeypatch)
    r = np.random.default_rng(41)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    requests = [(r.integers(3, vocab, int(n)).tolist(), params) for n in (5, 17, 40, 3)]
    tokens = {}
    for flag, path in paths.items():
        engine = LLMEngine(path, EngineArgs(num_blocks=64), device="cuda")
        try:
            tokens[flag] = [[c[0] for c in out] for out in run_requests(engine, requests)]
        finally:
            engine.close()
    assert tokens["1"] == tokens["0"]
    assert all(len(t[0]) == 24 for t in tokens["0"])
