"""The wgmma skinny GEMM (``codegen/kernels/gemv/skinny.cu``) against numpy on the GPU (``-m gpu``;
sm_90a only). Fresh random inputs; N off the 128-row tiles (the last tile's rows past N arrive as zeros and are not
written), more row tiles than SMs (the persistent loop), K from one 64-column stage to many (the stages' ring wraps
across tiles), every token count at a bucket's edges; outputs poisoned before each launch and each launch done twice
(the tensor map filled again for another weight buffer in between); bias and residual in the epilogue; x streamed;
e4m3 weights (weight-only FP8) over their whole range, and x from 2e-4 to 6e5 (staged in f16 with them)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.gemv.rule import Prologue
from ingot.codegen.kernels.gemv.skinny_rule import skinny_spec
from tests.codegen.common import gpu_target
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16


@pytest.mark.parametrize("n,k,mb,ms,wgs,stages,norm,splitk,epi,xs", [
    (1000, 64, 8, (1, 8), 2, 2, False, 1, False, False), (4096, 2048, 32, (1, 17, 32), 2, None, False, 1, False, False),
    (20000, 512, 16, (9, 16), 2, None, False, 1, False, False), (300, 1024, 8, (3,), 1, 3, False, 1, False, False),
    (16384, 2048, 16, (16,), 2, 4, False, 1, False, False), (128 * 140, 256, 32, (32,), 2, 8, False, 1, False, False),
    # the rms_norm prologue (decode fusion): x is the norm's input, scaled far from 1 as a residual stream is
    (16384, 2048, 8, (1, 8), 2, None, True, 1, False, False), (4096, 2048, 32, (5, 32), 2, None, True, 1, False, False),
    (300, 64, 16, (16,), 1, 2, True, 1, False, False),
    # split-K in a cluster: the 1B model's qkv and down at 32 / 16 tokens, 64 tokens (x's slice fits), one warpgroup
    (3072, 2048, 32, (1, 32), 2, None, False, 4, False, False),
    (2048, 8192, 16, (16,), 2, None, False, 8, False, False),
    (1000, 256, 64, (33, 64), 2, None, False, 2, False, False),
    (16384, 2048, 64, (64,), 2, None, False, 2, False, False),
    (500, 1024, 32, (7,), 1, 3, False, 8, False, False),
    # bias and residual in the epilogue (o and down carry the residual stream): the rule's split-K variants of the
    # 1B model's o (64 tokens) and down (32), the persistent kernel, the rms_norm prologue with both
    (2048, 2048, 64, (1, 40, 64), 2, None, False, 4, True, False),
    (2048, 8192, 32, (17, 32), 2, None, False, 4, True, False),
    (4096, 512, 16, (16,), 2, None, False, 1, True, False), (1000, 256, 8, (5,), 2, 3, True, 1, True, False),
    # x streamed through a ring beside the weight stages: the 1B model's gate_up at 64 tokens, more row tiles than SMs
    # with a ring that wraps inside a tile (4 column panels, 4 stages), down's split-K at 64 with the residual, one
    # warpgroup with 4 stages (one panel ahead), one column panel a tile
    (16384, 2048, 64, (1, 33, 64), 2, None, False, 1, False, True),
    (128 * 140, 256, 64, (64,), 2, 4, False, 1, False, True),
    (2048, 8192, 64, (17, 64), 2, None, False, 4, True, True), (300, 1024, 32, (3,), 1, 4, False, 1, False, True),
    (1000, 64, 16, (16,), 2, 4, False, 1, False, True),
])
def test_skinny_matches_numpy(gpu, n, k, mb, ms, wgs, stages, norm, splitk, epi, xs):
    if gpu.arch != "sm_90a":
        pytest.skip(f"skinny.cu is sm_90a only (this GPU is {gpu.arch})")
    r = rng()
    eps = 1e-5
    spec = skinny_spec(n, k, mb, gpu_target(gpu), warpgroups=wgs, stages=stages,
                       prologue=Prologue("rms_norm", eps) if norm else None, splitk=splitk, bias=epi, residual=epi,
                       x_stream=xs)
    ws = [r.standard_normal((n, k), np.float32).astype(BF16) for _ in range(2)]
    wd = [gpu.upload(w) for w in ws]
    g = (r.standard_normal(k) * 0.5 + 1.0).astype(np.float32).astype(BF16)
    extra = {"norm_weight": gpu.upload(g)} if norm else {}
    bias = (r.standard_normal(n, np.float32) * 4.0).astype(BF16) if epi else None
    for m in ms:
        x = (r.standard_normal((m, k), np.float32) * (30.0 if norm else 1.0)).astype(BF16)
        xd = gpu.upload(x)
        xf = x.astype(np.float64)
        if norm:  # the norm in f64: x * rsqrt(mean(x^2) + eps) * g
            xf = xf / np.sqrt((xf * xf).mean(axis=1, keepdims=True) + eps) * g.astype(np.float64)
        for attempt in range(2):  # the second over the other weight buffer: the map filled again
            w = ws[attempt]
            ref = xf @ w.astype(np.float64).T
            _check(gpu, spec, r, ref, bias, f"launch {attempt}", x=xd, weight=wd[attempt], weight_scale=None,
                   **extra)


def _check(gpu, spec, r: np.random.Generator, ref: np.ndarray, bias: np.ndarray | None, what: str, **args) -> None:
    """Launch ``spec`` for ``M = len(ref)`` tokens into an output poisoned with NaN (its rows past M must stay so),
    with ``bias`` (or none) and then a fresh residual stream 20x the product's scale, as in a model, and compare with
    ``ref`` (f64, plus those) within 1e-2 of its largest value."""
    (m, n), mb = ref.shape, int(dict(spec.values)["MB"])
    epilogue = {"bias": None, "residual": None}
    if bias is not None:
        res = (r.standard_normal((m, n), np.float32) * 20.0).astype(BF16)
        ref = ref + bias.astype(np.float64) + res.astype(np.float64)
        epilogue = {"bias": gpu.upload(bias), "residual": gpu.upload(res)}
    out = gpu.alloc((max(mb, -(-m // mb) * mb + mb), n), BF16)  # any M: whole chunks, and one more
    gpu.launch(spec, out=out, M=m, **epilogue, **args)
    full = gpu.download(out)
    assert (full[m:].view(np.uint16) == 0xFFFF).all(), f"M={m}: rows past M written"
    got = full[:m].astype(np.float64)
    assert np.isfinite(got).all(), f"N={n} M={m} {what}: unwritten or non-finite outputs"
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < 1e-2, f"N={n} MB={mb} M={m} {what}: relative error {err:.2e} ({spec.doc})"


@pytest.mark.parametrize("n,k,ms,splitk,xs,epi,wb", [
    # the rule's any-M variants of the 1B model's qkv, o (residual) and down (x streamed, residual): 64-token chunks
    # on grid.z, every chunk count to 4 and partial last chunks
    (3072, 2048, (65, 128, 200), 4, False, False, 2), (2048, 2048, (1, 64, 129, 256), 4, False, True, 2),
    (2048, 8192, (100, 256), 4, True, True, 2),
    # a small matrix off the row tiles with 2 slices; e4m3 weights (weight-only FP8) with the residual
    (1000, 256, (65, 190), 2, False, False, 2), (3072, 2048, (66, 256), 4, False, True, 1),
])
def test_any_m_matches_numpy(gpu, n, k, ms, splitk, xs, epi, wb):
    """The any-M launch (``skinny_rule.any_m_spec``, ``CHUNKS``): the 64-token variant walking the step's tokens in
    chunks on grid.z, against numpy (rows past M poisoned and left so, the last chunk partial)."""
    if gpu.arch != "sm_90a":
        pytest.skip(f"skinny.cu is sm_90a only (this GPU is {gpu.arch})")
    r = rng()
    spec = skinny_spec(n, k, 64, gpu_target(gpu), splitk=splitk, x_stream=xs, bias=epi, residual=epi, wb=wb,
                       any_m=True)
    if wb == 1:
        c = r.integers(0, 256, (n, k), dtype=np.uint8)
        c[(c & 0x7F) == 0x7F] = 0x3F  # no NaN codes
        scale = (r.random(n, np.float32) * 0.02 + 0.001).astype(np.float32)
        w = c.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * scale.astype(np.float64)[:, None]
        args = {"weight": gpu.upload(c.view(ml_dtypes.float8_e4m3fn)), "weight_scale": gpu.upload(scale),
                "weight_scale_2": None, "input_scale": None}
    else:
        wq = r.standard_normal((n, k), np.float32).astype(BF16)
        w = wq.astype(np.float64)
        args = {"weight": gpu.upload(wq), "weight_scale": None}
    bias = (r.standard_normal(n, np.float32) * 4.0).astype(BF16) if epi else None
    for m in ms:
        x = r.standard_normal((m, k), np.float32).astype(BF16)
        _check(gpu, spec, r, x.astype(np.float64) @ w.T, bias, "any M", x=gpu.upload(x), **args)


@pytest.mark.parametrize("n,k,mb,ms,wgs,splitk,xs,epi", [
    (16384, 2048, 32, (1, 17, 32), 2, 1, False, False), (128 * 140, 256, 16, (16,), 2, 1, False, True),
    (3072, 2048, 32, (5, 32), 2, 4, False, False), (2048, 8192, 64, (1, 64), 2, 4, True, True),
    (16384, 2048, 64, (33,), 2, 1, True, False), (300, 1024, 16, (3,), 1, 1, False, True),
])
def test_fp8_weights_match_numpy(gpu, n, k, mb, ms, wgs, splitk, xs, epi):
    """Weight-only FP8 (``wb=1``): e4m3 codes over their whole range (subnormals, both signs, no NaN) and an f32 scale
    per row against numpy's f64 product of x and the dequantized weight (plus bias and residual), the weight map
    filled again for a second code buffer."""
    if gpu.arch != "sm_90a":
        pytest.skip(f"skinny.cu is sm_90a only (this GPU is {gpu.arch})")
    r = rng()
    spec = skinny_spec(n, k, mb, gpu_target(gpu), warpgroups=wgs, splitk=splitk, x_stream=xs, bias=epi, residual=epi,
                       wb=1)
    e4m3 = ml_dtypes.float8_e4m3fn
    codes = []
    for _ in range(2):
        c = r.integers(0, 256, (n, k), dtype=np.uint8)
        c[(c & 0x7F) == 0x7F] = 0x3F  # no NaN codes (S.1111.111)
        codes.append(c)
    scale = (r.random(n, np.float32) * 0.02 + 0.001).astype(np.float32)
    cd, sd = [gpu.upload(c.view(e4m3)) for c in codes], gpu.upload(scale)
    bias = (r.standard_normal(n, np.float32) * 4.0).astype(BF16) if epi else None
    for m in ms:
        x = r.standard_normal((m, k), np.float32).astype(BF16)
        xd = gpu.upload(x)
        for attempt in range(2):
            w = codes[attempt].view(e4m3).astype(np.float64) * scale.astype(np.float64)[:, None]
            ref = x.astype(np.float64) @ w.T
            _check(gpu, spec, r, ref, bias, f"launch {attempt}", x=xd, weight=cd[attempt], weight_scale=sd,
                   weight_scale_2=None, input_scale=None)


@pytest.mark.parametrize("n,k,mb,splitk,xs", [
    (16384, 2048, 32, 1, False), (3072, 2048, 16, 4, False), (2048, 8192, 64, 4, True), (16384, 2048, 64, 1, True)])
def test_fp8_weights_x_range(gpu, n, k, mb, splitk, xs):
    """x staged in f16 times 2^-4 (the template's header): tokens from 2e-4 to 6e5 in one launch, each within the
    tolerance of its own reference (``test_gemv_fp8_gpu.check_x_range``, kernel.cu's F16 route's check), staged whole,
    split-K and streamed."""
    from tests.codegen.test_gemv_fp8_gpu import _fp8_weight, _op, check_x_range

    if gpu.arch != "sm_90a":
        pytest.skip(f"skinny.cu is sm_90a only (this GPU is {gpu.arch})")
    r = rng()
    spec = skinny_spec(n, k, mb, gpu_target(gpu), splitk=splitk, x_stream=xs, wb=1)
    wq, bufs = _fp8_weight(gpu, r, n, k)
    check_x_range(gpu, spec, r, bufs,
                  lambda x: _op(k).ref(x, wq["weight"], wq["weight_scale"], None, None, None, None))


@pytest.mark.parametrize("n,k,mb,ms,wgs,splitk,epi", [
    (16384, 2048, 32, (1, 17, 32), 2, 1, False), (128 * 140, 256, 16, (16,), 2, 1, True),
    (3072, 2048, 32, (5, 32), 2, 4, False), (2048, 8192, 32, (1, 32), 2, 4, True),
    (2048, 2048, 64, (1, 40, 64), 2, 4, True), (300, 1024, 16, (3,), 1, 1, True),
])
def test_nvfp4_weights_match_numpy(gpu, n, k, mb, ms, wgs, splitk, epi):
    """Weight-only NVFP4 (``wb=0``, opt-in ``INGOT_GEMV_SKINNY_NVFP4``): ``quantized_weight``'s codes and block scales
    (saturated, subnormal-scaled and all-zero blocks) against ``QuantizedLinear.ref``, bias and residual, split-K,
    more row tiles than SMs (the scale groups prefetched across a CTA's tiles), one warpgroup; launched twice."""
    from ingot.ir.ops.quantized import QuantizedLinear
    from tests.codegen.test_gemv_quant_gpu import activations, quantized_weight, run_case

    if gpu.arch != "sm_90a":
        pytest.skip(f"skinny.cu is sm_90a only (this GPU is {gpu.arch})")
    r = rng()
    spec = skinny_spec(n, k, mb, gpu_target(gpu), warpgroups=wgs, splitk=splitk, bias=epi, residual=epi, wb=0)
    op = QuantizedLinear(weight_format="nvfp4", weight_granularity="channel", act_format="none",
                         act_granularity="token", in_features=k)
    wq = quantized_weight(r, "nvfp4", n, k)
    bias = (r.standard_normal(n) * 0.1).astype(BF16) if epi else None
    for m in ms:
        x = activations(r, m, k)
        res = r.standard_normal((m, n)).astype(BF16) if epi else None
        run_case(gpu, spec, op, wq, x, bias, res, None, n)


@pytest.mark.parametrize("n,k,mb,splitk", [(16384, 2048, 32, 1), (3072, 2048, 16, 4)])
def test_nvfp4_weights_x_range(gpu, n, k, mb, splitk):
    """x staged in f16 times 2^-4 in the NVFP4 fragments' order: tokens from 2e-4 to 6e5 in one launch
    (``check_x_range``)."""
    from tests.codegen.test_gemv_fp8_gpu import check_x_range
    from tests.codegen.test_gemv_nvfp4_gpu import _nvfp4_weight, _ref

    if gpu.arch != "sm_90a":
        pytest.skip(f"skinny.cu is sm_90a only (this GPU is {gpu.arch})")
    r = rng()
    spec = skinny_spec(n, k, mb, gpu_target(gpu), splitk=splitk, wb=0)
    wq, bufs = _nvfp4_weight(gpu, r, n, k)
    check_x_range(gpu, spec, r, bufs, lambda x: _ref(k, wq, x))
