"""The fused decode GEMVs (``codegen/decode_fusion.py``) on the GPU (``-m gpu``; skipped without one): against the
numpy references of the ops they replace (``rms_norm`` or packed ``swiglu``, then ``linear``) with the GEMV tests'
tolerance (the largest output's relative error below 1e-2), and against the launches they replace (the norm /
activation kernel followed by the plain variant) within the same tolerance; they are not bit-identical to them (the
norm factor multiplies the f32 sums, the sigmoid goes through ex2.approx / rcp.approx). Llama-3.2-1B's shapes (qkv,
gate_up, lm_head; down with its residual) and awkward ones (norm widths of 576 to 8192, K past the last slice, N off
the tiles), token counts at the buckets' edges (M = 1, 3, 8; 9, 16), the first weight stage before and after the
grid-dependency wait, each fused launch done twice (split-K counters and the sums-of-squares workspace reused).
The bulk-copy variants' prologues (``bulk.cu``, ``INGOT_GEMV_BULK=1``) the same way, against numpy and against the
norm / activation kernel followed by the plain bulk variant."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.activation.rule import gated_spec
from ingot.codegen.kernels.gemv.bulk_rule import bulk_spec
from ingot.codegen.kernels.gemv.rule import Prologue, fused_spec, gemv_spec
from ingot.codegen.kernels.norm.rule import norm_spec
from ingot.ir.ops.attention import SwiGLU
from ingot.ir.ops.norm import RmsNorm
from ingot.ir.types import DType
from tests.codegen.common import gpu_target
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16
EPS = 1e-5
#: the GEMV tests' bound on the largest output's relative error (tests/codegen/test_gemv_gpu.py)
TOL = 1e-2


def _gemv(gpu, spec, x, wbufs: dict, res, m, **extra) -> np.ndarray:
    """One launch of ``spec`` without bias (``wbufs``: its weight parameters' buffers) into a poisoned output; its
    output, checked finite."""
    out = gpu.alloc((m, spec.value("N")), BF16)  # poisoned: NaN where nothing is written
    gpu.launch(spec, x=x, **wbufs, bias=None, residual=res, out=out, M=m, **extra)
    got = gpu.download(out)
    assert np.isfinite(got.astype(np.float32)).all(), f"{spec.entry} M={m}: unwritten or non-finite outputs"
    return got


def _err(got: np.ndarray, want: np.ndarray) -> float:
    g, w = got.astype(np.float64), want.astype(np.float64)
    return float(np.abs(g - w).max() / np.abs(w).max())


#: (N, K, buckets): the 1B model's qkv, gate_up and lm_head, SmolLM2's 576 (norm block of 96), K off the 256-column
#: chunk, split-K with a 16-token bucket, a 8192-wide norm
RMS_SHAPES = [(3072, 2048, (8, 16)), (16384, 2048, (8,)), (128256, 2048, (8,)), (576, 576, (8, 16)),
              (1000, 960, (8,)), (1024, 4096, (16,)), (512, 8192, (8,))]
SWIGLU_SHAPES = [(2048, 8192, (8, 16)), (576, 1536, (8,)), (1000, 4128, (8, 16))]
TOKENS = {8: (1, 3, 8), 16: (9, 16)}


def _cases(shapes):
    return [(n, k, mb) for n, k, mbs in shapes for mb in mbs]


def bf16_weight(gpu, r: np.random.Generator, n: int, k: int):
    """(a random bf16 ``[n, k]`` weight's device buffers as the bf16 variants take them, the linear's numpy
    reference ``(x, residual or None) -> x @ w^T (+ residual)`` in f64)."""
    w_host = (0.05 * r.standard_normal((n, k), np.float32)).astype(BF16)
    w = w_host.astype(np.float64)

    def linear(x: np.ndarray, res: np.ndarray | None) -> np.ndarray:
        want = x.astype(np.float64) @ w.T
        return want if res is None else want + res.astype(np.float64)

    return {"weight": gpu.upload(w_host), "weight_scale": None}, linear


def check_rms_norm(gpu, plain, fused, residual: bool, what: str, weight=bf16_weight) -> None:
    """``fused`` (``plain`` with the rms_norm prologue) against numpy and against the norm kernel followed by
    ``plain``, each fused launch twice; ``what`` names the variants in the messages; ``weight``: the random weight's
    buffers and reference (``bf16_weight``'s signature; FP8 ones in tests/codegen/test_gemv_fp8_gpu.py)."""
    r = rng()
    n, k, mb = plain.value("N"), plain.value("K"), plain.value("MB")
    norm = norm_spec("rms", DType.bf16, DType.bf16, k, EPS, gpu_target(gpu))
    wbufs, linear = weight(gpu, r, n, k)
    g_host = (1 + 0.2 * r.standard_normal(k)).astype(BF16)
    g = gpu.upload(g_host)
    for m in TOKENS[mb]:
        x_host = (r.uniform(0.01, 40.0) * r.standard_normal((m, k))).astype(BF16)
        res_host = r.standard_normal((m, n)).astype(BF16) if residual else None
        want = linear(RmsNorm(eps=EPS).ref(x_host, g_host), res_host)
        x = gpu.upload(x_host)
        res = gpu.upload(res_host) if residual else None
        normed = gpu.alloc((m, k), BF16)
        gpu.launch(norm, x=x, weight=g, bias=None, residual=None, residual_out=None, out=normed, rows=m)
        unfused = _gemv(gpu, plain, normed, wbufs, res, m)
        assert _err(unfused, want) < TOL, f"{what} {n}x{k} M={m}: the unfused launches vs numpy"
        for attempt in range(2):
            got = _gemv(gpu, fused, x, wbufs, res, m, norm_weight=g)
            err = _err(got, want)
            assert err < TOL, f"{what} {n}x{k} MB={mb} M={m} launch {attempt}: {err:.2e} vs numpy"
            assert _err(got, unfused) < TOL, f"{what} {n}x{k} MB={mb} M={m} launch {attempt}: vs the unfused launches"


def check_swiglu(gpu, plain, fused, what: str, weight=bf16_weight) -> None:
    """``fused`` (``plain``, with a residual, with the packed swiglu prologue) against numpy and against the
    activation kernel followed by ``plain``, each fused launch twice; ``what`` names the variants in the messages;
    ``weight`` as ``check_rms_norm``'s."""
    r = rng()
    n, k, mb = plain.value("N"), plain.value("K"), plain.value("MB")
    act = gated_spec("swiglu", DType.bf16, k, gpu_target(gpu), alpha=1.0, a_stride=2 * k, b_stride=2 * k, b_offset=k)
    wbufs, linear = weight(gpu, r, n, k)
    for m in TOKENS[mb]:
        gate_up_host = (3 * r.standard_normal((m, 2 * k))).astype(BF16)
        gate_up_host[0, 0] = -100  # 2^(144) overflows to inf: silu 0
        res_host = r.standard_normal((m, n)).astype(BF16)
        want = linear(SwiGLU(packed=True).ref(gate_up_host), res_host)
        gate_up, res = gpu.upload(gate_up_host), gpu.upload(res_host)
        a = gpu.alloc((m, k), BF16)
        gpu.launch(act, a=gate_up, b=gate_up, out=a, num_tokens=m)
        unfused = _gemv(gpu, plain, a, wbufs, res, m)
        assert _err(unfused, want) < TOL, f"{what} {n}x{k} M={m}: the unfused launches vs numpy"
        for attempt in range(2):
            got = _gemv(gpu, fused, gate_up, wbufs, res, m)
            err = _err(got, want)
            assert err < TOL, f"{what} {n}x{k} MB={mb} M={m} launch {attempt}: {err:.2e} vs numpy"
            assert _err(got, unfused) < TOL, f"{what} {n}x{k} MB={mb} M={m} launch {attempt}: vs the unfused launches"


@pytest.mark.parametrize("weights_first", [True, False], ids=["weights-first", "wait-first"])
@pytest.mark.parametrize("n,k,mb", _cases(RMS_SHAPES))
def test_rms_norm_prologue_matches_numpy(gpu, n, k, mb, weights_first):
    tgt = gpu_target(gpu)
    residual = n != 128256  # the lm_head has none
    plain = gemv_spec(n, k, mb, tgt, residual=residual)
    fused = fused_spec(plain, Prologue("rms_norm", EPS), tgt, weights_first=weights_first)
    check_rms_norm(gpu, plain, fused, residual, "kernel.cu")


@pytest.mark.parametrize("weights_first", [True, False], ids=["weights-first", "wait-first"])
@pytest.mark.parametrize("n,k,mb", _cases(SWIGLU_SHAPES))
def test_swiglu_prologue_matches_numpy(gpu, n, k, mb, weights_first):
    tgt = gpu_target(gpu)
    plain = gemv_spec(n, k, mb, tgt, residual=True)
    fused = fused_spec(plain, Prologue("swiglu", alpha=1.0), tgt, weights_first=weights_first)
    check_swiglu(gpu, plain, fused, "kernel.cu")


def _bulk_pair(tgt, n: int, k: int, mb: int, residual: bool, prologue: Prologue):
    """(bulk.cu's plain variant, its fused variant): both bulk for these shapes (test_gemv_bulk.py's configs)."""
    plain = bulk_spec(n, k, mb, tgt, residual=residual)
    assert plain is not None, (n, k, mb)
    fused = fused_spec(plain, prologue, tgt)
    assert fused.template == "bulk.cu", (n, k, mb, fused.doc)
    return plain, fused


@pytest.mark.parametrize("n,k,mb", _cases(RMS_SHAPES))
def test_bulk_rms_norm_prologue_matches_numpy(gpu, n, k, mb):
    residual = n != 128256
    plain, fused = _bulk_pair(gpu_target(gpu), n, k, mb, residual, Prologue("rms_norm", EPS))
    check_rms_norm(gpu, plain, fused, residual, "bulk.cu")


@pytest.mark.parametrize("n,k,mb", _cases(SWIGLU_SHAPES))
def test_bulk_swiglu_prologue_matches_numpy(gpu, n, k, mb):
    plain, fused = _bulk_pair(gpu_target(gpu), n, k, mb, True, Prologue("swiglu", alpha=1.0))
    check_swiglu(gpu, plain, fused, "bulk.cu")
