"""Quantized LLM artifacts on the CUDA backend against the CPU backend running the same quantized graph.

The tiny random Llama of ``tests/codegen/test_lower_quant.py`` (head_dim 64, K of 128/256) compiled for the
device's target with FP8 (W8A8 per token), FP8 with an FP8 KV cache, NVFP4 (weight-only on h200; W4A4 on b200:
the activation quantizer + the block-scaled CUTLASS GEMM, not yet run), and, to cover every mode of the quantized
GEMV, FP8 weight-only and FP8 with static activation and KV scales. The CPU backend runs the artifact's own (bf16,
quantized) graph through the ops' references, so the two differ only by f32 summation order.

Steps over 3 sequences exercise every kernel path: a 310-token batched prefill (the prefill GEMMs of
``codegen/quant_prefill.py``: dequantize + bf16 GEMM, or for W8A8 the activation quantizer + the FP8 GEMM; the
one-split attention), mixed prefill/decode, then decode (the GEMV variants, split-KV attention with
2 splits for the 300-token context), as plain launches and as CUDA graphs. The logits match relative to each
step's largest logit (as ``tests/runtime/test_cuda_backend.py`` compares): weight-only formats within twice the
bf16 rtol of ``tests/helpers.TOLERANCES``; with FP8 activations (and FP8 KV) within one e4m3 ulp (2^-3),
because a one-ulp bf16 difference in an activation (f32 summation order, where a kernel rounds) moves its e4m3 code
by a whole FP8 step: on the CPU alone, accumulating the matmuls in f64 moves the FP8 W8A8 logits by up to 2.4e-2
(the weight-only ones by 5e-3), and moving two thirds of the activations by one bf16 ulp before their quantizers
moves them by 0.049-0.094 (8 input seeds, 3 draws each). The GPU measured 0.042-0.063 over the same 8 seeds (the
twentieth session; half an e4m3 ulp, the bound before, failed one of them). Greedy tokens of 3 prompts equal the
CPU's, a divergence accepted only where the CPU's top-2 logits are closer than the logits may differ.
"""

from __future__ import annotations

import numpy as np
import pytest

from ingot.runtime.artifact import load_graph
from ingot.runtime.paged import PagedModel, iter_greedy
from tests.codegen.test_lower_quant import CASES, compile_quant, quant_checkpoint
from tests.helpers import TOLERANCES, rng
from tests.runtime.serving_models import drive_steps

#: the normalized logits error allowed, max |gpu - cpu| / max |cpu| (module docstring): weight-only formats (the
#: bf16 bound test_cuda_backend uses), and with FP8 activations (an e4m3 ulp, relative: what one-ulp bf16 differences
#: of the activations make on the CPU alone; layout or scale mistakes give errors of the logits' own size)
TOL = 2 * TOLERANCES["bfloat16"][0]
TOL_FP8_ACTIVATIONS = 2.0**-3
#: W4A4 (b200), E2M1 activation codes (one mantissa bit): half an e2m1 ulp, relative. A guess
#: until the first B200 run measures it; layout or scale mistakes give errors of the logits' own size
TOL_FP4_ACTIVATIONS = 2.0**-2
#: (per-tensor FP8 weights: their scales broadcast to per-channel ones for the CUDA kernels, fp8-channel-scales)
GPU_CASES = {**CASES, "fp8-wo": {"default": "fp8:wo"}, "fp8-tensor": {"default": "fp8:tensor"},
             "fp8-tensor-wo": {"default": "fp8:tensor:wo"}, "fp8-block-wo": {"default": "fp8:block:wo"}}
WEIGHT_ONLY = ("fp8-wo", "fp8-tensor-wo", "fp8-block-wo", "nvfp4")
NUM_BLOCKS = 48
VOCAB = 260


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return quant_checkpoint(tmp_path_factory.mktemp("quant-llama"))


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def _steps() -> list[list[tuple[int, list[int]]]]:
    r = rng()
    p = [[int(t) for t in r.integers(3, VOCAB - 1, n)] for n in (300, 21, 5)]
    return [
        [(0, p[0]), (1, p[1][:10])],  # 310 tokens: the any-M GEMV, 5 chunks of 64
        [(1, p[1][10:]), (0, [7]), (2, p[2])],
        [(0, [11]), (1, [12]), (2, [13])],  # decode: GEMV variants, split-KV (2 splits for sequence 0)
        [(0, [14]), (1, [15]), (2, [16])],
        [(2, [17])],
    ]


def _greedy_ref(graph, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    m = PagedModel(graph, NUM_BLOCKS)
    seq = m.add_sequence()
    logits = m.step([(seq, prompt)])
    tokens, rows = [], []
    for _ in range(n):
        t = int(np.argmax(logits[0]))
        tokens.append(t)
        rows.append(logits[0])
        logits = m.step([(seq, [t])])
    return tokens, rows


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_quantized_artifact_matches_cpu(gpu_target, ckpt, tmp_path, case):
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    w4a4 = case.startswith("nvfp4") and gpu_target == "b200"  # quantizer + block-scaled CUTLASS GEMM
    path = compile_quant(ckpt, gpu_target, GPU_CASES[case], tmp_path / f"{case}.ingot")
    tol = TOL_FP4_ACTIVATIONS if w4a4 else TOL if case in WEIGHT_ONLY else TOL_FP8_ACTIVATIONS
    graph, manifest = load_graph(path)
    launches = [ln for ln in manifest["cuda"]["launches"] if ln["op"] == "quantized_linear"]
    kernels = {ln["kernel"] for ln in launches}
    if w4a4:
        assert kernels and all(k.startswith(("quant_act_nvfp4_", "linear_cutlass_nvfp4")) for k in kernels)
    else:
        # weight-only: long steps dequantize + bf16 GEMM (codegen/quant_prefill.py, on by default), steps of at
        # most WO_GEMM_ROWS (64) rows run the quantized GEMV variants of the GEMM launch (the dequantize is skipped)
        variants = {v["kernel"] for ln in launches for v in ln.get("variants", [])}
        # (W8A8: the activation quantizer + the FP8 CUTLASS GEMM, where CUTLASS is installed)
        assert kernels and all(k.startswith(("dequant_", "quant_act_fp8_", "linear_", "gemv_")) for k in kernels), \
            kernels
        # (FP8 weights: the skinny GEMM's from bucket 16 on, sm_90a)
        fp8_wo = case in ("fp8-wo", "fp8-tensor-wo")
        prefixes = ("gemv_", "skinny_fp8w_") if fp8_wo and gpu_target == "h200" else ("gemv_",)
        assert variants and all(k.startswith(prefixes) for k in variants), variants
    steps = _steps()
    ref = drive_steps(PagedModel(graph, NUM_BLOCKS), steps)
    errors = {}
    prev: list[np.ndarray] = []
    for graphs in (False, True):
        ex = CudaExecutor.from_artifact(path, num_blocks=NUM_BLOCKS, cuda_graphs=graphs)
        got = drive_steps(CudaPagedModel(ex), steps)
        errs = [_rel(g, r) for g, r in zip(got, ref)]
        errors[f"graphs={graphs}"] = errs
        print(f"{case} graphs={graphs}: logits rel. errors {[f'{e:.2e}' for e in errs]}, {ex.stats}")
        assert all(np.isfinite(g).all() for g in got)
        assert max(errs) < tol, (case, graphs, errs)
        assert sum(ln.variant_launches for ln in ex.launches) > 0, "the decode GEMV variants never ran"
        if graphs:
            assert ex.stats["graph_steps"] == 3, ex.stats  # the decode steps (buckets 4, 4, 1)
            diffs = [_rel(a, b) for a, b in zip(got, prev)]
            assert max(diffs) < tol, f"CUDA-graph replay differs from plain launches: {diffs}"
        prev = got
        ex.close()

    # greedy: 3 prompts (one longer than a GEMV bucket), 12 tokens each, one at a time
    ex = CudaExecutor.from_artifact(path, num_blocks=NUM_BLOCKS)
    r = rng()
    prompts = [[int(t) for t in r.integers(3, VOCAB - 1, n)] for n in (7, 19, 70)]
    for i, p in enumerate(prompts):
        want, rows = _greedy_ref(graph, p, 12)
        got = list(iter_greedy(graph, p, 12, stop_ids=(), model=CudaPagedModel(ex)))
        assert len(got) == 12
        for j, (a, b) in enumerate(zip(got, want)):
            if a != b:
                top2 = np.sort(rows[j])[-2:]
                gap = float(top2[1] - top2[0])
                bound = 2 * tol * float(np.abs(rows[j]).max())
                assert gap < bound, f"{case} prompt {i}: token {j} is {a} on the GPU, {b} on the CPU (top-2 gap {gap})"
                print(f"{case} prompt {i}: diverged at token {j}, where the CPU top-2 gap is {gap:.2e} < {bound:.2e}")
                break
    ex.close()
