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
from tests.codegen.common import bf16_gemv_inputs, check_gemv, gpu_target
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
    has = epilogue != "plain"
    spec = gemv_spec(n, k, mb, gpu_target(gpu), bias=has, residual=has, weights_first=weights_first)
    w = r.standard_normal((n, k), np.float32).astype(BF16)
    bias = r.standard_normal(n, np.float32).astype(BF16)
    check_gemv(gpu, spec, ms, w.astype(np.float64), {"weight": gpu.upload(w), "weight_scale": None},
               bias if has else None, lambda m: bf16_gemv_inputs(r, m, k, n), whole_bucket=False)
