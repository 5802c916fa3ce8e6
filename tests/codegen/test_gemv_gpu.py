"""The decode GEMV family against numpy on the GPU (``-m gpu``; skipped without one).

Fresh random inputs, shapes with N and K off the tile sizes, every token count of a bucket's edge
(M = 1 .. MB), bias and residual epilogues, outputs poisoned before each launch, each launch done
twice (the split-K counters must be reset by the first for the second to be right); the first weight stage loaded
after the grid-dependency wait (as the lowering makes plain variants) and before it (``weights_first``)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.gemv.rule import gemv_spec
from ingot.codegen.target import get_target
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16


@pytest.mark.parametrize("n,k,mb,ms", [
    (3072, 2048, 8, (1, 3, 8)), (2048, 8192, 32, (1, 17, 32)), (200, 96, 64, (1, 33, 64)),
    (1000, 4128, 16, (5, 16)), (16384, 2048, 8, (1,)), (576, 576, 8, (2,)),
])
@pytest.mark.parametrize("epilogue", ["plain", "bias+residual"])
@pytest.mark.parametrize("weights_first", [False, True], ids=["wait-first", "weights-first"])
def test_gemv_matches_numpy(gpu, n, k, mb, ms, epilogue, weights_first):
    r = rng()
    tgt = get_target("h200" if gpu.arch == "sm_90a" else "b200")
    has = epilogue != "plain"
    spec = gemv_spec(n, k, mb, tgt, bias=has, residual=has, weights_first=weights_first)
    w = r.standard_normal((n, k), np.float32).astype(BF16)
    wd = gpu.upload(w)
    bias = r.standard_normal(n, np.float32).astype(BF16)
    bd = gpu.upload(bias) if has else None
    for m in ms:
        x = r.standard_normal((m, k), np.float32).astype(BF16)
        res = r.standard_normal((m, n), np.float32).astype(BF16)
        ref = x.astype(np.float64) @ w.astype(np.float64).T
        if has:
            ref = ref + bias.astype(np.float64) + res.astype(np.float64)
        xd, rd = gpu.upload(x), gpu.upload(res)
        for attempt in range(2):
            out = gpu.alloc((m, n), BF16)  # poisoned (0xFF: NaN)
            gpu.launch(spec, x=xd, weight=wd, weight_scale=None, bias=bd, residual=rd if has else None, out=out,
                    M=m)
            got = gpu.download(out).astype(np.float64)
            assert np.isfinite(got).all(), f"M={m} launch {attempt}: unwritten or non-finite outputs"
            err = np.abs(got - ref).max() / np.abs(ref).max()
            assert err < 1e-2, f"{n}x{k} MB={mb} M={m} launch {attempt}: relative error {err:.2e}"
