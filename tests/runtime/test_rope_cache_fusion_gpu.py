"""Rope-cache fusion end to end on the GPU (``-m gpu``; skipped without one): the same checkpoint compiled with
``INGOT_ROPE_CACHE_FUSION=1`` (the default; ``codegen/rope_cache_fusion.py``: ``rope_qkv`` writes k and v into the KV
cache, the attention's cache-write launch dropped) and without gives bit-identical logits for every step and the same KV
cache bytes afterwards, with plain launches and with CUDA graphs (prefill, mixed and decode steps, graph buckets 1 and
4), for a bf16 cache (SmolLM2-shaped, GQA 3) and an FP8 cache with static K/V scales; and the serving engine's greedy
tokens are the same.

    python -m pytest tests/runtime/test_rope_cache_fusion_gpu.py -m gpu -v
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ingot
from ingot.codegen.rope_cache_fusion import ENV
from ingot.runtime.artifact import load_graph
from tests.codegen.test_lower_quant import CASES, compile_quant, quant_checkpoint
from tests.runtime.serving_models import drive_steps, run_requests
from tests.runtime.test_cuda_backend import _mixed_steps, assert_same_steps, smollm2_like

pytestmark = pytest.mark.gpu


def _compile_both(tmp_path: Path, target: str, kv: str, monkeypatch) -> tuple[dict[str, Path], int]:
    """``{"1": fused, "0": two launches}`` artifacts of one checkpoint, and its vocabulary size."""
    if kv == "bf16":
        ckpt, vocab = smollm2_like(tmp_path, 2), 49152
    else:
        ckpt, vocab = quant_checkpoint(tmp_path), 260
    paths = {}
    for flag in ("1", "0"):
        monkeypatch.setenv(ENV, flag)
        out = tmp_path / f"{kv}-{flag}.ingot"
        paths[flag] = (ingot.compile(ckpt, target=target, out=out) if kv == "bf16"
                       else compile_quant(ckpt, target, CASES["fp8-kv"], out))
    monkeypatch.delenv(ENV)
    return paths, vocab


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_rope_cache_fusion_changes_no_logit(gpu_target, tmp_path, monkeypatch, kv):
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    paths, vocab = _compile_both(tmp_path, gpu_target, kv, monkeypatch)
    tables = {flag: load_graph(p)[1]["cuda"] for flag, p in paths.items()}
    layers = len(tables["0"]["memory_plan"]["kv_cache"]["inputs"])
    assert len(tables["1"]["launches"]) == len(tables["0"]["launches"]) - layers
    assert sum(k["spec"]["template"] == "qkv_cache.cu" for k in tables["1"]["kernels"].values()) == 1
    steps = _mixed_steps(vocab, seed=11)
    r = np.random.default_rng(13)
    steps += [[(s, [int(t)]) for s, t in zip(range(3), r.integers(3, vocab, 3))] for _ in range(20)]
    steps += [[(1, [int(t)])] for t in r.integers(3, vocab, 10)]
    runs, caches = {}, {}
    for flag, path in paths.items():
        for graphs in (False, True):
            ex = CudaExecutor.from_artifact(path, num_blocks=32, cuda_graphs=graphs)
            runs[flag, graphs] = drive_steps(CudaPagedModel(ex), steps)
            caches[flag, graphs] = [ex.kv_cache(i) for i in range(len(ex.kv_inputs))]
            if graphs:
                assert ex.stats["graph_steps"] == 3 + 20 + 10
            ex.close()
    assert_same_steps(runs, ("0", False), "the two-launch path")
    for key, got in caches.items():
        assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(got, caches["0", False])), key


def test_engine_greedy_tokens_are_the_same(gpu_target, tmp_path, monkeypatch):
    from ingot.runtime.engine import EngineArgs, LLMEngine
    from ingot.runtime.sampling import SamplingParams

    paths, vocab = _compile_both(tmp_path, gpu_target, "fp8", monkeypatch)
    r = np.random.default_rng(17)
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
