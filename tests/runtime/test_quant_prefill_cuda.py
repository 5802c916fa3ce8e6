"""Quantized artifacts compiled with the prefill GEMM (the default, ``codegen/quant_prefill.py``)
on the CUDA backend against the CPU backend running the same quantized graph (``-m gpu``; skipped without one).

The tiny Llama of ``tests/codegen/test_lower_quant.py`` with FP8 weight-only and NVFP4 weight-only weights (h200;
b200's default NVFP4 is W4A4: its weight-only form, ``nvfp4:wo``, lowers there as on h200 but has not run on a B200),
its GEMMs the CUTLASS ones where nvcc and CUTLASS are installed and the
template GEMM (``INGOT_NO_CUTLASS=1``); and W8A8 FP8 (per token, and with static activation scales), whose pair is
the activation quantizer + the FP8 CUTLASS GEMM (no template form: without CUTLASS it keeps the GEMV). Steps with more
rows than ``WO_GEMM_ROWS`` (64: 310 and 68 rows, the pair's first launch, then the GEMM) and with fewer (17 rows,
exactly 64 rows, decode: the GEMV buckets; the first launch skipped in all of them), as plain launches and with CUDA
graphs for the decode steps. W8A8 hands every step of more than 16 rows to its pair (``W8A8_GEMM_ROWS``: 310, 17, 64
and 68 rows here), the decode steps keep the GEMV.

Tolerance: weight-only, the same as the GEMV artifacts' weight-only bound in ``tests/runtime/test_quant_cuda.py``
(twice the bf16 rtol, relative to each step's largest logit). The prefill path computes the same products: the
scratch holds the codes' exact values (e4m3, and e2m1 x e4m3 block scale, fit bf16), the GEMM accumulates in f32 and
applies the per-channel scale to the accumulator in its epilogue, as the GEMV does; the scale is not folded into the
bf16 weights (that would round each weight by up to 2^-9 relative). Only the f32 summation order differs. W8A8: that
module's bound with FP8 activations (one e4m3 ulp, relative: a one-ulp bf16 difference in an activation moves its
code by a whole FP8 step), the quantizer's codes being the reference's bit for bit
(``tests/codegen/test_quant_act_fp8_gpu.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

from ingot.codegen import quant_prefill
from ingot.runtime.artifact import load_graph
from ingot.runtime.paged import PagedModel
from tests.codegen.test_lower_quant import CASES as QUANT_CASES
from tests.codegen.test_lower_quant import compile_quant, quant_checkpoint
from tests.helpers import rng
from tests.runtime.serving_models import drive_steps
from tests.runtime.test_quant_cuda import TOL, TOL_FP8_ACTIVATIONS, VOCAB, _rel

CASES = {"fp8-wo": {"default": "fp8:wo"}, "nvfp4": {"default": "nvfp4"}, "fp8": QUANT_CASES["fp8"],
         "fp8-static": QUANT_CASES["fp8-static"]}
#: the W8A8 cases: the activation quantizer + the FP8 CUTLASS GEMM (no template form)
W8A8 = ("fp8", "fp8-static")
NUM_BLOCKS = 64


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return quant_checkpoint(tmp_path_factory.mktemp("quant-llama"))


def _steps() -> list[list[tuple[int, list[int]]]]:
    r = rng()
    p = [[int(t) for t in r.integers(3, VOCAB - 1, n)] for n in (300, 21, 5, 129)]
    return [
        [(0, p[0]), (1, p[1][:10])],  # 310 rows: dequantize + GEMM
        [(1, p[1][10:]), (0, [7]), (2, p[2])],  # 17 rows: the GEMV's 32-row bucket
        [(3, p[3][:64])],  # exactly the largest bucket: still the GEMV
        [(3, p[3][64:]), (0, [11]), (1, [12]), (2, [13])],  # 68 rows: past the buckets, the pair (weight-only too)
        [(0, [14]), (1, [15]), (2, [16]), (3, [17])],  # decode (a CUDA graph with graphs on)
        [(2, [18])],
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("gemm", ["template", "cutlass"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_prefill_gemm_artifact_matches_cpu(gpu_target, ckpt, tmp_path, monkeypatch, case, gemm):
    from ingot.codegen.kernels.gemm_cutlass.build import cutlass_available
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    if case == "nvfp4" and gpu_target != "h200":
        pytest.skip("b200's default NVFP4 is W4A4 (the block-scaled GEMM, tests/runtime/test_quant_cuda.py)")
    if gemm == "cutlass" and not cutlass_available():
        pytest.skip("CUTLASS GEMMs need nvcc and the nvidia-cutlass wheel")
    if gemm == "template" and case in W8A8:
        pytest.skip("W8A8 has no template FP8 GEMM: without CUTLASS it keeps the GEMV (test_quant_cuda.py)")
    tol = TOL_FP8_ACTIVATIONS if case in W8A8 else TOL
    monkeypatch.setenv(quant_prefill.ENV, "1")
    if gemm == "template":
        monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    else:
        monkeypatch.delenv("INGOT_NO_CUTLASS", raising=False)
    path = compile_quant(ckpt, gpu_target, CASES[case], tmp_path / f"{case}-{gemm}.ingot")
    graph, manifest = load_graph(path)
    launches = manifest["cuda"]["launches"]
    first = "quant_act_fp8_" if case in W8A8 else "dequant_"  # the pair's first launch
    # the largest step the GEMV keeps: W8A8 hands steps of more than 16 rows to the FP8 GEMM
    gemv_rows = quant_prefill.W8A8_GEMM_ROWS if case in W8A8 else quant_prefill.WO_GEMM_ROWS
    dequant = [j for j, ln in enumerate(launches) if ln["kernel"].startswith(first)]
    assert len(dequant) == 8 and all(launches[j]["skip"]["max_rows"] == gemv_rows for j in dequant)
    gemms = [j + 1 for j in dequant]
    assert all(("cutlass" in launches[j]["kernel"]) == (gemm == "cutlass") for j in gemms)
    steps = _steps()
    ref = drive_steps(PagedModel(graph, NUM_BLOCKS), steps)
    prev: list[np.ndarray] = []
    for graphs in (False, True):
        ex = CudaExecutor.from_artifact(path, num_blocks=NUM_BLOCKS, cuda_graphs=graphs)
        seen: list[dict[str, np.ndarray]] = []
        run = ex.run

        def keep(feeds, *args, run=run, seen=seen, **kwargs):
            seen.append({k: np.array(v, copy=True) for k, v in feeds.items() if not k.startswith("kv_cache")})
            return run(feeds, *args, **kwargs)

        ex.run = keep  # type: ignore[method-assign]
        got = drive_steps(CudaPagedModel(ex), steps)
        errs = [_rel(g, r) for g, r in zip(got, ref)]
        print(f"{case} {gemm} graphs={graphs}: logits rel. errors {[f'{e:.2e}' for e in errs]}, {ex.stats}")
        assert all(np.isfinite(g).all() for g in got)
        assert max(errs) < tol, (case, gemm, graphs, errs)
        assert all(ex.launches[j].skips > 0 for j in dequant), "the dequantize launches were never skipped"
        assert sum(ex.launches[j].variant_launches for j in gemms) > 0, "the quantized GEMV variants never ran"
        if graphs:
            assert ex.stats["graph_steps"] == 2, ex.stats
            diffs = [_rel(a, b) for a, b in zip(got, prev)]
            assert max(diffs) < tol, f"CUDA-graph replay differs from plain launches: {diffs}"
        else:  # which kernels ran, per step: the pair above gemv_rows rows, the GEMV variants up to it
            for i, feeds in enumerate(seen[:4]):
                rows = ex.profile(feeds, repeats=1)
                ran = {r["launch"]: r for r in rows}
                big = len(feeds["input_ids"]) > gemv_rows
                assert all((j in ran) == big for j in dequant), (i, len(feeds["input_ids"]))
                for j in gemms:
                    assert (ran[j]["kernel"] == launches[j]["kernel"]) == big, (i, ran[j])
                if big:
                    us = {k: sum(r["us"] for r in rows if r["launch"] in js) for k, js in ((first.rstrip("_"), dequant),
                                                                                         ("gemm", gemms))}
                    print(f"{case} {gemm} step {i} ({len(feeds['input_ids'])} rows): {us}")
                again = run(feeds)["logits"]
                assert np.array_equal(again, got[i]), "the profiled step changed the step's results"
        prev = got
        ex.close()


@pytest.mark.gpu
def test_w8a8_decode_batches_past_16_run_the_pair_in_graphs(gpu_target, ckpt, tmp_path, monkeypatch):
    """A W8A8 decode batch of more than ``W8A8_GEMM_ROWS`` sequences (24: the 32-row CUDA-graph bucket) runs the
    quantizer + FP8 GEMM pair, captured in the decode graph, never the GEMV variants; its logits match the CPU
    backend's within the W8A8 bound, plain and replayed. (Written in the twenty-seventh session after its device time
    was spent: first run pending.)"""
    from ingot.codegen.kernels.gemm_cutlass.build import cutlass_available
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    if not cutlass_available():
        pytest.skip("the FP8 GEMM is a CUTLASS kernel: needs nvcc and the nvidia-cutlass wheel")
    monkeypatch.delenv(quant_prefill.ENV, raising=False)
    monkeypatch.delenv(quant_prefill.W8A8_ENV, raising=False)
    monkeypatch.delenv("INGOT_NO_CUTLASS", raising=False)
    path = compile_quant(ckpt, gpu_target, CASES["fp8"], tmp_path / "w8a8.ingot")
    graph, manifest = load_graph(path)
    launches = manifest["cuda"]["launches"]
    quantizers = [j for j, ln in enumerate(launches) if ln["kernel"].startswith("quant_act_fp8_")]
    gemms = [j + 1 for j in quantizers]
    assert len(quantizers) == 8
    r = rng()
    prompts = [[int(t) for t in r.integers(3, VOCAB - 1, 6)] for _ in range(24)]
    steps = [[(s, p) for s, p in enumerate(prompts)],  # 144 rows: the pair
             [(s, [int(r.integers(3, VOCAB - 1))]) for s in range(24)],  # decode, 24 sequences: the pair
             [(s, [int(r.integers(3, VOCAB - 1))]) for s in range(24)]]
    ref = drive_steps(PagedModel(graph, NUM_BLOCKS), steps)
    prev: list[np.ndarray] = []
    for graphs in (False, True):
        ex = CudaExecutor.from_artifact(path, num_blocks=NUM_BLOCKS, cuda_graphs=graphs)
        got = drive_steps(CudaPagedModel(ex), steps)
        errs = [_rel(g, w) for g, w in zip(got, ref)]
        print(f"W8A8 24-sequence decode, graphs={graphs}: logits rel. errors {[f'{e:.2e}' for e in errs]}, {ex.stats}")
        assert all(np.isfinite(g).all() for g in got)
        assert max(errs) < TOL_FP8_ACTIVATIONS, (graphs, errs)
        assert all(ex.launches[j].skips == 0 for j in quantizers), "a quantizer was skipped at more than 16 rows"
        assert sum(ex.launches[j].variant_launches for j in gemms) == 0, "a W8A8 GEMV ran at more than 16 rows"
        if graphs:
            assert ex.stats["graph_steps"] == 2, ex.stats
            diffs = [_rel(a, b) for a, b in zip(got, prev)]
            assert max(diffs) < TOL_FP8_ACTIVATIONS, f"CUDA-graph replay differs from plain launches: {diffs}"
        prev = got
        ex.close()
