"""The fused decode GEMVs (``codegen/decode_fusion.py``) on the GPU (``-m gpu``; skipped without one): bit-identical
to the launches they replace, the norm / activation kernel followed by the plain GEMV variant. Norm widths cover one
to four passes of the prologue (norm blocks of 96 to 1024 threads, rows that end inside a pass), every token count
at a bucket's edge, the residual epilogue, each fused launch done twice (split-K counters). The norm kernel's output
also matches the numpy emulation of ``test_decode_fusion.py`` bit for bit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.activation.rule import gated_spec
from ingot.codegen.kernels.gemv.rule import Prologue, fused_spec, gemv_spec
from ingot.codegen.kernels.norm.rule import norm_spec
from ingot.codegen.target import get_target
from ingot.ir.types import DType
from tests.codegen.test_decode_fusion import _normalized, fused_sumsq
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16
EPS = 1e-5


def _target(gpu):
    return get_target("h200" if gpu.arch == "sm_90a" else "b200")


def _gemv(gpu, spec, x, w, res, m, **extra):
    out = gpu.alloc((m, spec.value("N")), BF16)  # poisoned: NaN where nothing is written
    gpu.launch(spec, x=x, weight=w, weight_scale=None, bias=None, residual=res, out=out, M=m, **extra)
    return gpu.download(out)


@pytest.mark.parametrize("n,k", [(3072, 2048), (576, 576), (1000, 960), (1024, 4096), (512, 8192)])
@pytest.mark.parametrize("mb,ms", [(8, (1, 3, 8)), (16, (9, 16))])
def test_rms_norm_prologue_is_bit_identical(gpu, n, k, mb, ms):
    r = rng()
    tgt = _target(gpu)
    norm = norm_spec("rms", DType.bf16, DType.bf16, k, EPS, tgt)
    plain = gemv_spec(n, k, mb, tgt, residual=True)
    fused = fused_spec(plain, Prologue("rms_norm", EPS, norm.value("BLOCK"), norm.value("PER_THREAD")), tgt)
    w = gpu.upload((0.05 * r.standard_normal((n, k))).astype(BF16))
    nw_host = (1 + 0.2 * r.standard_normal(k)).astype(BF16)
    nw = gpu.upload(nw_host)
    for m in ms:
        x_host = (r.uniform(0.01, 40.0) * r.standard_normal((m, k))).astype(BF16)
        x, res = gpu.upload(x_host), gpu.upload(r.standard_normal((m, n)).astype(BF16))
        normed = gpu.alloc((m, k), BF16)
        gpu.launch(norm, x=x, weight=nw, bias=None, residual=None, residual_out=None, out=normed, rows=m)
        emulated = np.stack([_normalized(row.astype(np.float32), nw_host.astype(np.float32),
                                         fused_sumsq(row.astype(np.float32), norm.value("BLOCK"),
                                                     norm.value("PER_THREAD")), EPS) for row in x_host])
        assert gpu.download(normed).tobytes() == emulated.tobytes(), f"K={k} M={m}: norm kernel vs its emulation"
        want = _gemv(gpu, plain, normed, w, res, m)
        assert np.isfinite(want.astype(np.float32)).all()
        for attempt in range(2):
            got = _gemv(gpu, fused, x, w, res, m, norm_weight=nw)
            diff = np.flatnonzero(got.view(np.uint16) != want.view(np.uint16))
            assert diff.size == 0, f"{n}x{k} MB={mb} M={m} launch {attempt}: {diff.size} outputs differ"


@pytest.mark.parametrize("n,k", [(2048, 8192), (576, 1536), (1000, 4128)])
@pytest.mark.parametrize("mb,ms", [(8, (1, 5, 8)), (16, (16,))])
def test_swiglu_prologue_is_bit_identical(gpu, n, k, mb, ms):
    r = rng()
    tgt = _target(gpu)
    act = gated_spec("swiglu", DType.bf16, k, tgt, alpha=1.0, a_stride=2 * k, b_stride=2 * k, b_offset=k)
    plain = gemv_spec(n, k, mb, tgt, residual=True)
    fused = fused_spec(plain, Prologue("swiglu", alpha=1.0), tgt)
    w = gpu.upload((0.05 * r.standard_normal((n, k))).astype(BF16))
    for m in ms:
        gate_up = gpu.upload((3 * r.standard_normal((m, 2 * k))).astype(BF16))
        res = gpu.upload(r.standard_normal((m, n)).astype(BF16))
        a = gpu.alloc((m, k), BF16)
        gpu.launch(act, a=gate_up, b=gate_up, out=a, num_tokens=m)
        want = _gemv(gpu, plain, a, w, res, m)
        assert np.isfinite(want.astype(np.float32)).all()
        for attempt in range(2):
            got = _gemv(gpu, fused, gate_up, w, res, m)
            diff = np.flatnonzero(got.view(np.uint16) != want.view(np.uint16))
            assert diff.size == 0, f"{n}x{k} MB={mb} M={m} launch {attempt}: {diff.size} outputs differ"
