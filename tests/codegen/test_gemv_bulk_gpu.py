"""The bulk-copy decode GEMV (``codegen/kernels/gemv/bulk.cu``) against numpy on the GPU (``-m gpu``; skipped
without one).

As test_gemv_gpu.py: fresh random inputs, the 1B model's shapes and shapes with N off the tile and K off the slice
(the last slice's short last stage), token counts from 1 to the bucket (below it too), bias and residual
epilogues, outputs poisoned, each launch done twice (the split-K counter must be reset by the first). And a pair of
launches with programmatic dependent launch: the second GEMV reads the first's output as x (its ring filled before
its grid-dependency wait, its x copied after it)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.gemv.bulk_rule import bulk_config, bulk_spec
from tests.codegen.common import bf16_gemv_inputs, check_gemv, gpu_target
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16


@pytest.mark.parametrize("n,k,mb,ms", [
    (3072, 2048, 8, (1, 3, 8)), (2048, 2048, 16, (9, 16)), (16384, 2048, 8, (1,)), (2048, 8192, 32, (1, 17, 32)),
    (200, 96, 64, (1, 33, 64)), (1000, 4128, 16, (5, 16)), (1000, 4128, 32, (2, 32)), (576, 576, 8, (2,)),
    (3072, 2048, 64, (1, 40, 64)), (8192, 2048, 64, (33, 64)),  # the last: split-K over two waves of CTAs
])
@pytest.mark.parametrize("epilogue", ["plain", "bias+residual"])
def test_bulk_gemv_matches_numpy(gpu, n, k, mb, ms, epilogue):
    r = rng()
    tgt = gpu_target(gpu)
    has = epilogue != "plain"
    spec = bulk_spec(n, k, mb, tgt, bias=has, residual=has)
    assert spec is not None, bulk_config(n, k, mb, tgt.num_sms or 132)
    w = r.standard_normal((n, k), np.float32).astype(BF16)
    bias = r.standard_normal(n, np.float32).astype(BF16)
    check_gemv(gpu, spec, ms, w.astype(np.float64), {"weight": gpu.upload(w), "weight_scale": None},
               bias if has else None, lambda m: bf16_gemv_inputs(r, m, k, n), whole_bucket=True)


def _launch_pdl(gpu, spec, stream, **args) -> list:
    """``spec`` launched on ``stream`` with programmatic stream serialization (the runtime's launch); returns the
    packed arguments, which must live until the launch has run."""
    from ingot.runtime import cuda_driver

    vals = [ctypes.c_uint64(0 if args[p.name] is None else args[p.name].ptr) if p.ctype == "ptr"
            else ctypes.c_int64(int(args[p.name])) for p in spec.params]
    ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    cuda_driver.launch(gpu.function(spec), spec.grid_dims({"M": args["M"]}), spec.block, spec.smem,
                       SimpleNamespace(handle=stream), ctypes.addressof(ptrs), "bulk gemv", pdl=True)
    return [vals, ptrs]


@pytest.mark.parametrize("m,mb", [(1, 8), (8, 8), (20, 32)])
def test_pdl_pair(gpu, m, mb):
    """o (2048 x 2048, + residual) then gate_up's first half (8192 x 2048) reading o's output, back to back with PDL,
    three times: the second GEMV's weights stream before its wait, its x only after it."""
    from cuda.bindings import driver as cu

    from tests.codegen.cuda_launch import check

    r = rng()
    tgt = gpu_target(gpu)
    first, second = bulk_spec(2048, 2048, mb, tgt, residual=True), bulk_spec(8192, 2048, mb, tgt)
    assert first is not None and second is not None
    # scaled before the cast: a bf16 array times a Python float is float32 (uploaded as such, read as bf16)
    w1, w2 = ((r.standard_normal((n, 2048), np.float32) * 0.05).astype(BF16) for n in (2048, 8192))
    x = r.standard_normal((m, 2048), np.float32).astype(BF16)
    res = r.standard_normal((m, 2048), np.float32).astype(BF16)
    h = (x.astype(np.float64) @ w1.astype(np.float64).T + res).astype(np.float32).astype(BF16)
    ref = h.astype(np.float64) @ w2.astype(np.float64).T
    w1d, w2d, xd, rd = gpu.upload(w1), gpu.upload(w2), gpu.upload(x), gpu.upload(res)
    gpu.function(first), gpu.function(second)  # loaded before the first pair: module loads may synchronize
    stream = check(cu.cuStreamCreate(0))
    try:
        for attempt in range(3):
            hd, out = gpu.alloc((m, 2048), BF16), gpu.alloc((m, 8192), BF16)
            keep = _launch_pdl(gpu, first, stream, x=xd, weight=w1d, weight_scale=None, bias=None, residual=rd,
                               out=hd, M=m)
            keep += _launch_pdl(gpu, second, stream, x=hd, weight=w2d, weight_scale=None, bias=None, residual=None,
                                out=out, M=m)
            check(cu.cuStreamSynchronize(stream))
            hgot = gpu.download(hd).astype(np.float64)  # the first GEMV alone (which of the two failed)
            herr = np.abs(hgot - h.astype(np.float64)).max() / np.abs(h.astype(np.float64)).max()
            assert np.isfinite(hgot).all() and herr < 1e-2, f"M={m} pair {attempt}: first GEMV, error {herr:.2e}"
            got = gpu.download(out).astype(np.float64)
            assert np.isfinite(got).all(), f"M={m} pair {attempt}: unwritten or non-finite outputs"
            err = np.abs(got - ref).max() / np.abs(ref).max()
            assert err < 2e-2, f"M={m} pair {attempt}: relative error {err:.2e}"
    finally:
        check(cu.cuStreamDestroy(stream))
