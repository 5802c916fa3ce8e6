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
    (1000, 4128, 16, (5, 16)), (16384, 2048, 8, (1,)), (576, 576, 8, (2,)), (16384, 2048, 16, (9, 16)),
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


#: row-group configurations beyond the rule's defaults (tests/codegen/test_gemv.py's KW_CASES, which compile them):
#: split-K over CTAs on top of the row groups' in-CTA sum, 2 tiles a warp, a partial last slice (4128 = 2 x 2048 +
#: 32), 64 tokens; with the token counts of each bucket's edges
KW_RUNS = [(1000, 4128, 8, (8, 1, 4, 3, 8), (1, 8)), (3072, 2048, 32, (8, 2, 2, 1, 2), (9, 32)),
           (2048, 8192, 16, (4, 1, 8, 4, 4), (1, 16)), (200, 96, 64, (8, 1, 1, 1, 2), (33, 64)),
           (3072, 2048, 8, (4, 1, 8, 1, 4), (1, 3, 8))]


@pytest.mark.parametrize("n,k,mb,c,ms", KW_RUNS)
@pytest.mark.parametrize("weights_first", [False, True], ids=["wait-first", "weights-first"])
def test_row_groups_match_numpy(gpu, n, k, mb, c, ms, weights_first):
    from ingot.codegen.kernels.gemv.rule import gemv_config

    r = rng()
    w_, t, u, sk, kw = c
    cfg = gemv_config(n, k, mb, 132, warps=w_, tiles=t, stage_steps=u, splitk=sk, kwarps=kw)
    spec = gemv_spec(n, k, mb, gpu_target(gpu), bias=True, residual=True, config=cfg, weights_first=weights_first)
    w = r.standard_normal((n, k), np.float32).astype(BF16)
    bias = r.standard_normal(n, np.float32).astype(BF16)
    check_gemv(gpu, spec, ms, w.astype(np.float64), {"weight": gpu.upload(w), "weight_scale": None},
               bias, lambda m: bf16_gemv_inputs(r, m, k, n), whole_bucket=False)
