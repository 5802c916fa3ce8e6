"""The decode L2 prefetch end to end on the GPU (``-m gpu``; skipped without one): the same checkpoint compiled with
``INGOT_L2_PREFETCH`` (``codegen/l2_prefetch.py``: the fused rope + cache-write launch's extra blocks ask L2 for the
next GEMVs' weights) and without gives bit-identical logits for every step and the same KV cache bytes, with plain
launches and with CUDA graphs (prefill, mixed and decode steps), for a bf16 model (SmolLM2-shaped) and an FP8-weight,
FP8-cache one; the budget is larger than a layer's weights, so every prefetch is clipped to its buffer.

    python -m pytest tests/runtime/test_l2_prefetch_gpu.py -m gpu -v
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ingot
from ingot.codegen.l2_prefetch import ENV
from ingot.runtime.artifact import load_graph
from tests.codegen.test_lower_quant import CASES, compile_quant, quant_checkpoint
from tests.runtime.serving_models import drive_steps
from tests.runtime.test_cuda_backend import _mixed_steps, assert_same_steps, smollm2_like

pytestmark = pytest.mark.gpu


def _compile_both(tmp_path: Path, target: str, kind: str, monkeypatch) -> tuple[dict[str, Path], int]:
    """``{"64": with the prefetch, "0": without}`` artifacts of one checkpoint, and its vocabulary size."""
    if kind == "bf16":
        ckpt, vocab = smollm2_like(tmp_path, 2), 49152
    else:
        ckpt, vocab = quant_checkpoint(tmp_path), 260
    paths = {}
    for flag in ("64", "0"):
        monkeypatch.setenv(ENV, flag)
        out = tmp_path / f"{kind}-{flag}.ingot"
        paths[flag] = (ingot.compile(ckpt, target=target, out=out) if kind == "bf16"
                       else compile_quant(ckpt, target, CASES["fp8-kv"], out))
    monkeypatch.delenv(ENV)
    return paths, vocab


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_l2_prefetch_changes_no_logit(gpu_target, tmp_path, monkeypatch, kind):
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    paths, vocab = _compile_both(tmp_path, gpu_target, kind, monkeypatch)
    tables = {flag: load_graph(p)[1]["cuda"] for flag, p in paths.items()}
    pf = [ln for ln in tables["64"]["launches"] if "pf0" in ln["args"]]
    assert pf and all(ln["args"]["pf0_bytes"]["value"] > 0 for ln in pf)
    assert not any("pf0" in ln["args"] for ln in tables["0"]["launches"])
    steps = _mixed_steps(vocab, seed=21)
    r = np.random.default_rng(23)
    steps += [[(s, [int(t)]) for s, t in zip(range(3), r.integers(3, vocab, 3))] for _ in range(12)]
    steps += [[(1, [int(t)])] for t in r.integers(3, vocab, 10)]
    runs, caches = {}, {}
    for flag, path in paths.items():
        for graphs in (False, True):
            ex = CudaExecutor.from_artifact(path, num_blocks=32, cuda_graphs=graphs)
            runs[flag, graphs] = drive_steps(CudaPagedModel(ex), steps)
            caches[flag, graphs] = [ex.kv_cache(i) for i in range(len(ex.kv_inputs))]
            ex.close()
    assert_same_steps(runs, ("0", False), "the artifact without the prefetch")
    for key, got in caches.items():
        assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(got, caches["0", False])), key
