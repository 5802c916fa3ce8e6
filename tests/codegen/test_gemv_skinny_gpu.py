"""The wgmma skinny GEMM (``codegen/kernels/gemv/skinny.cu``) against numpy on the GPU (``-m gpu``;
sm_90a only). Fresh random inputs; N off the 128-row tiles (the last tile's rows past N arrive as zeros and are not
written), more row tiles than SMs (the persistent loop), K from one 64-column stage to many (the stages' ring wraps
across tiles), every token count at a bucket's edges; outputs poisoned before each launch and each launch done twice
(the tensor map filled again for another weight buffer in between)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.gemv.skinny_rule import skinny_spec
from tests.codegen.common import gpu_target
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16


@pytest.mark.parametrize("n,k,mb,ms,wgs,stages", [
    (1000, 64, 8, (1, 8), 2, 2), (4096, 2048, 32, (1, 17, 32), 2, None), (20000, 512, 16, (9, 16), 2, None),
    (300, 1024, 8, (3,), 1, 3), (16384, 2048, 16, (16,), 2, 4), (128 * 140, 256, 32, (32,), 2, 8),
])
def test_skinny_matches_numpy(gpu, n, k, mb, ms, wgs, stages):
    if gpu.arch != "sm_90a":
        pytest.skip(f"skinny.cu is sm_90a only (this GPU is {gpu.arch})")
    r = rng()
    spec = skinny_spec(n, k, mb, gpu_target(gpu), warpgroups=wgs, stages=stages)
    ws = [r.standard_normal((n, k), np.float32).astype(BF16) for _ in range(2)]
    wd = [gpu.upload(w) for w in ws]
    for m in ms:
        x = r.standard_normal((m, k), np.float32).astype(BF16)
        xd = gpu.upload(x)
        for attempt in range(2):  # the second over the other weight buffer: the map filled again
            w = ws[attempt]
            ref = x.astype(np.float64) @ w.astype(np.float64).T
            out = gpu.alloc((mb, n), BF16)  # poisoned (NaN): the rows past M must stay so
            gpu.launch(spec, x=xd, weight=wd[attempt], weight_scale=None, bias=None, residual=None, out=out, M=m)
            full = gpu.download(out)
            assert (full[m:].view(np.uint16) == 0xFFFF).all(), f"M={m}: rows past M written"
            got = full[:m].astype(np.float64)
            assert np.isfinite(got).all(), f"{n}x{k} M={m} launch {attempt}: unwritten or non-finite outputs"
            err = np.abs(got - ref).max() / np.abs(ref).max()
            assert err < 1e-2, f"{n}x{k} MB={mb} M={m} launch {attempt}: relative error {err:.2e} ({spec.doc})"
