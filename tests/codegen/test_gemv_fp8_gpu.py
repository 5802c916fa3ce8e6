"""The bf16 decode GEMV's template with FP8 weights (``codegen/kernels/gemv/kernel.cu``, ``WB`` 1: weight-only
``quantized_linear``, e4m3 weights with an f32 scale per output channel, bf16 x; ``rule.gemv_spec(..., wb=1)``) on the
GPU (``-m gpu``; skipped without one).

- The plain variants against ``QuantizedLinear.ref`` (test_gemv_quant_gpu.py's ``run_case``: weights quantized with
  saturated and tiny (subnormal-code) rows, activations with per-token outliers, outputs poisoned before each launch,
  each launch done twice so the split-K counters must be reset by the first): test_gemv_quant_gpu.py's shapes (N off
  the tiles, K off the slice: a partial last slice), the rule's configuration, plain and bias + residual epilogues,
  token counts at the buckets' edges.
- Explicit configurations (``gemv_config(..., wb=1)``): row groups of 2, 4 and 8 warps, split-K over CTAs on top of
  them, 2 tiles a warp, a partial last slice (some warps' parts of it wholly past K), a single slice longer than K,
  64 tokens; the first weight stage before and after the grid-dependency wait.
- The rms_norm and packed swiglu prologues (``fused_spec``) against numpy (``RmsNorm`` / ``SwiGLU`` then
  ``QuantizedLinear``'s references) and against the launches they replace (the norm / activation kernel, then the
  plain FP8 variant), within the GEMV tolerance (not bit-identical, test_decode_fusion_gpu.py's docstring says why);
  weights first and wait first, each fused launch twice.
- The rope epilogue (``with_rope``): the FP8 variant with it writes q and the paged KV cache bit for bit as the same
  variant without it followed by ``rope/qkv_cache.cu``, and leaves ``out`` unwritten (test_qkv_rope_fusion_gpu.py's
  cases: the Llama-3.2-1B qkv, an FP8 interleaved cache, head_dim 128 with a bias), at the rule's configuration and
  with split-K, with and without the rms_norm prologue; the plain variant compared against is itself checked against
  numpy.

    python -m pytest tests/codegen/test_gemv_fp8_gpu.py -m gpu -v
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.gemv.rule import (
    QUANT_PARAMS,
    Prologue,
    RopeEpilogue,
    fused_spec,
    gemv_config,
    gemv_spec,
    with_rope,
)
from ingot.codegen.kernels.rope.cache_rule import rope_qkv_cache_spec
from ingot.ir.ops.norm import RmsNorm
from ingot.ir.ops.quantized import QuantizedLinear
from ingot.ir.types import DType
from tests.codegen.common import gpu_target
from tests.codegen.test_decode_fusion_gpu import EPS, _cases, _err, check_rms_norm, check_swiglu
from tests.codegen.test_gemv_quant_gpu import CASES, TOL, _u8, activations, quantized_weight, run_case
from tests.codegen.test_qkv_rope_fusion_gpu import BLOCK, CTYPE, check_rope_epilogue
from tests.codegen.test_qkv_rope_fusion_gpu import CASES as ROPE_CASES
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16


def _op(k: int) -> QuantizedLinear:
    """The op the FP8 variants compute: weight-only FP8 with per-channel scales."""
    return QuantizedLinear(weight_format="fp8", weight_granularity="channel", act_format="none",
                           act_granularity="token", in_features=k)


def _check_fp8_spec(spec, n: int, k: int, mb: int) -> None:
    """``spec`` is kernel.cu's FP8-weight variant for ``w[n, k]`` and ``M <= mb``, with the op's parameters."""
    assert spec.template == "kernel.cu" and spec.value("WB") == 1, spec.doc
    assert (spec.value("N"), spec.value("K"), spec.value("MB")) == (n, k, mb)
    assert [p.name for p in spec.params][:len(QUANT_PARAMS)] == [name for name, _ in QUANT_PARAMS]


def _fp8_weight(gpu, r: np.random.Generator, n: int, k: int) -> tuple[dict, dict]:
    """(``quantized_weight``'s FP8 inputs, their device buffers as the FP8 variants take them)."""
    wq = quantized_weight(r, "fp8", n, k)
    assert wq["weight_scale"].dtype == np.float32 and wq["weight_scale"].shape == (n,)
    bufs = {"weight": gpu.upload(_u8(wq["weight"])), "weight_scale": gpu.upload(wq["weight_scale"]),
            "weight_scale_2": None, "input_scale": None}
    return wq, bufs


# -- plain variants ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,k,mb,ms", CASES)
@pytest.mark.parametrize("epilogue", ["plain", "bias+residual"])
def test_fp8_gemv_matches_reference(gpu, n, k, mb, ms, epilogue):
    r = rng()
    has = epilogue != "plain"
    spec = gemv_spec(n, k, mb, gpu_target(gpu), bias=has, residual=has, wb=1)
    _check_fp8_spec(spec, n, k, mb)
    wq = quantized_weight(r, "fp8", n, k)
    bias = (r.standard_normal(n) * 0.1).astype(BF16) if has else None
    for m in ms:
        x = activations(r, m, k)
        res = r.standard_normal((m, n)).astype(BF16) if has else None
        run_case(gpu, spec, _op(k), wq, x, bias, res, None, n)


#: per-token magnitudes of x for the range test: the FP8 variants stage x as f16 times 2^-4 (kernel.cu's header), exact
#: for 2^-13 <= |x| < 65504 * 16; 6e5 would be inf as f16 unscaled, 2e-4 puts half a token's values below 2^-13
X_MAGNITUDES = (2e-4, 1.0, 3e3, 6e5)


def check_x_range(gpu, spec, r: np.random.Generator, bufs: dict, ref) -> None:
    """Tokens of very different magnitudes (``X_MAGNITUDES``) in one launch of ``spec`` (weights ``bufs``), each within
    the GEMV tolerance of its own reference ``ref(x)`` (the shared tolerance, relative to the largest output of all
    tokens, would not see the small ones); launched twice, outputs poisoned."""
    n, k = spec.value("N"), spec.value("K")
    x = np.stack([r.uniform(-1.0, 1.0, k) * mag for mag in X_MAGNITUDES]).astype(BF16)
    m = x.shape[0]
    assert np.abs(x.astype(np.float32)).max() > 65504 and np.abs(x.astype(np.float32)).max() < 65504 * 16
    want = ref(x).astype(np.float64)
    for attempt in range(2):
        out = gpu.alloc((m, n), BF16)  # poisoned (0xFF: NaN)
        gpu.launch(spec, x=gpu.upload(x), **bufs, bias=None, residual=None, out=out, M=m)
        got = gpu.download(out).astype(np.float64)
        assert np.isfinite(got).all(), f"launch {attempt}: non-finite outputs (x overflowed as staged?)"
        for t, mag in enumerate(X_MAGNITUDES):
            err = np.abs(got[t] - want[t]).max() / np.abs(want[t]).max()
            assert err < TOL, f"launch {attempt}: token {t} (|x| up to {mag:g}): relative error {err:.2e}"


@pytest.mark.parametrize("n,k", [(3072, 2048), (2048, 8192)])
def test_fp8_gemv_x_range(gpu, n, k):
    """``check_x_range`` on the FP8 variant of bucket 8 (f16 fragments: x staged as f16 times 2^-4)."""
    r = rng()
    spec = gemv_spec(n, k, 8, gpu_target(gpu), wb=1)
    _check_fp8_spec(spec, n, k, 8)
    wq, bufs = _fp8_weight(gpu, r, n, k)
    check_x_range(gpu, spec, r, bufs,
                  lambda x: _op(k).ref(x, wq["weight"], wq["weight_scale"], None, None, None, None))


#: explicit configurations (N, K, bucket, (warps, tiles, steps a stage, split-K, warps a row group), token counts at
#: the bucket's edges); steps are 64 columns. 8 warps a row group with split-K 3 over CTAs and a partial last slice
#: (slices of 2048: the third holds 128 columns, half of warp 0's part, warps 1-7 wholly past K); 2 tiles a warp;
#: split-K 4 on top of row groups of 4; 64 tokens with N off the tiles; the rule's bucket-8 row groups of the 1B
#: model's qkv; one slice of 6144 for K = 4160 (warp 2's part partly past K, warp 3's wholly)
KW_RUNS = [(1000, 4224, 8, (8, 1, 4, 3, 8), (1, 8)), (3072, 2048, 32, (8, 2, 2, 1, 2), (17, 32)),
           (2048, 8192, 16, (4, 1, 8, 4, 4), (9, 16)), (200, 256, 64, (8, 1, 1, 1, 2), (33, 64)),
           (3072, 2048, 8, (4, 1, 8, 1, 4), (1, 3, 8)), (1000, 4160, 8, (4, 1, 8, 1, 4), (1, 8))]


@pytest.mark.parametrize("n,k,mb,c,ms", KW_RUNS)
@pytest.mark.parametrize("weights_first", [False, True], ids=["wait-first", "weights-first"])
def test_fp8_row_groups_match_reference(gpu, n, k, mb, c, ms, weights_first):
    r = rng()
    w, t, u, sk, kw = c
    cfg = gemv_config(n, k, mb, 132, warps=w, tiles=t, stage_steps=u, splitk=sk, kwarps=kw, wb=1)
    assert (cfg.warps, cfg.tiles, cfg.stage_steps, cfg.splitk, cfg.kwarps) == c, cfg
    spec = gemv_spec(n, k, mb, gpu_target(gpu), bias=True, residual=True, config=cfg, weights_first=weights_first,
                     wb=1)
    _check_fp8_spec(spec, n, k, mb)
    assert (spec.value("KW"), spec.value("SPLITK"), spec.value("KS")) == (kw, sk, cfg.slice_k)
    wq = quantized_weight(r, "fp8", n, k)
    bias = (r.standard_normal(n) * 0.1).astype(BF16)
    for m in ms:
        run_case(gpu, spec, _op(k), wq, activations(r, m, k), bias, r.standard_normal((m, n)).astype(BF16), None, n)


# -- prologues --------------------------------------------------------------------------------------------------

#: test_decode_fusion_gpu.py's shapes with K a multiple of 64 (N, K, buckets): the 1B model's qkv and gate_up,
#: SmolLM2's 576, K = 960 off the prologue's 256-column chunks, split-K with a 16-token bucket, a 8192-wide norm
RMS_SHAPES = [(3072, 2048, (8, 16)), (16384, 2048, (8,)), (576, 576, (8, 16)), (1000, 960, (8,)),
              (1024, 4096, (16,)), (512, 8192, (8,))]
#: the 1B model's down, SmolLM2's, K = 4160 off the slice (4128 in the bf16 test is not a multiple of 64)
SWIGLU_SHAPES = [(2048, 8192, (8, 16)), (576, 1536, (8,)), (1000, 4160, (8, 16))]


def _fp8_pair(gpu, n: int, k: int, mb: int, residual: bool, prologue: Prologue, weights_first: bool):
    """(the rule's plain FP8 variant, its fused variant), both kernel.cu's with FP8 weights."""
    tgt = gpu_target(gpu)
    plain = gemv_spec(n, k, mb, tgt, residual=residual, wb=1)
    fused = fused_spec(plain, prologue, tgt, weights_first=weights_first)
    _check_fp8_spec(plain, n, k, mb)
    _check_fp8_spec(fused, n, k, mb)
    assert fused.value("WEIGHTS_FIRST") == weights_first
    return plain, fused


def _fp8_linear(gpu, r: np.random.Generator, n: int, k: int):
    """test_decode_fusion_gpu.py's ``weight`` for FP8 variants: ``quantized_weight``'s FP8 weight as they take it, and
    ``QuantizedLinear``'s reference ``(x, residual or None) -> out``."""
    wq, bufs = _fp8_weight(gpu, r, n, k)
    return bufs, lambda x, res: _op(k).ref(x, wq["weight"], wq["weight_scale"], None, None, None, res)


@pytest.mark.parametrize("weights_first", [True, False], ids=["weights-first", "wait-first"])
@pytest.mark.parametrize("n,k,mb", _cases(RMS_SHAPES))
def test_fp8_rms_norm_prologue_matches_numpy(gpu, n, k, mb, weights_first):
    residual = n != 16384  # the gate_up has none
    plain, fused = _fp8_pair(gpu, n, k, mb, residual, Prologue("rms_norm", EPS), weights_first)
    assert [p.name for p in fused.params][-1] == "norm_weight"
    check_rms_norm(gpu, plain, fused, residual, "fp8", weight=_fp8_linear)


@pytest.mark.parametrize("weights_first", [True, False], ids=["weights-first", "wait-first"])
@pytest.mark.parametrize("n,k,mb", _cases(SWIGLU_SHAPES))
def test_fp8_swiglu_prologue_matches_numpy(gpu, n, k, mb, weights_first):
    plain, fused = _fp8_pair(gpu, n, k, mb, True, Prologue("swiglu", alpha=1.0), weights_first)
    check_swiglu(gpu, plain, fused, "fp8", weight=_fp8_linear)


# -- rope epilogue ----------------------------------------------------------------------------------------------


def _rope_specs(gpu, case: str, config: str, prologue: str):
    """(the FP8 variant, it with the rope epilogue, qkv_cache.cu's launch) for a case of test_qkv_rope_fusion_gpu.py;
    ``config``: the rule's (row groups where it gives them) or split-K over CTAs in slices of 256 columns (one stage
    of 4 steps), no row groups. The first weight stage as the lowering loads it: before the wait with the prologue."""
    nq, nkv, d, k, inter, kt, ct, scaled, bias = ROPE_CASES[case]
    tgt = gpu_target(gpu)
    n = (nq + 2 * nkv) * d
    cfg = (gemv_config(n, k, 8, tgt.num_sms or 132, stage_steps=4, splitk=k // 256, kwarps=1, wb=1)
           if config == "splitk" else None)
    pro = Prologue("rms_norm", eps=EPS) if prologue == "rms_norm" else None
    plain = gemv_spec(n, k, 8, tgt, bias=bias, config=cfg, prologue=pro, wb=1)
    fused = with_rope(plain, RopeEpilogue(nq, nkv, d, inter, BLOCK, CTYPE[kt], CTYPE[ct], scaled), tgt)
    rope = rope_qkv_cache_spec(DType.bf16, ct, kt, nq, nkv, d, d, inter, BLOCK, scaled, tgt)
    return plain, fused, rope


@pytest.mark.parametrize("prologue", ["none", "rms_norm"])
@pytest.mark.parametrize("config", ["rule", "splitk"])
@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_fp8_rope_epilogue_writes_what_gemv_then_rope_write(gpu, case, config, prologue):
    nq, nkv, d, k, inter, kt, ct, scaled, bias = ROPE_CASES[case]
    plain, fused, rope = _rope_specs(gpu, case, config, prologue)
    n = plain.value("N")
    _check_fp8_spec(fused, n, k, 8)
    for name in ("WARPS", "MT", "KS", "SPLITK", "U", "KW", "PROLOGUE", "WEIGHTS_FIRST"):
        assert fused.value(name) == plain.value(name), name
    if config == "splitk":
        assert fused.value("SPLITK") == k // 256 > 1
    r = rng()
    wq, wbufs = _fp8_weight(gpu, r, n, k)
    b_host = r.standard_normal(n).astype(BF16) if bias else None
    b = gpu.upload(b_host) if bias else None
    g_host = (1 + 0.2 * r.standard_normal(k)).astype(BF16) if prologue == "rms_norm" else None
    extra = {"norm_weight": gpu.upload(g_host)} if prologue == "rms_norm" else {}
    for x_host, qkv in check_rope_epilogue(gpu, r, case, plain, fused, rope, {**wbufs, "bias": b}, extra):
        # the pair compared against is right: the plain FP8 variant's qkv against numpy
        xin = RmsNorm(eps=EPS).ref(x_host, g_host) if prologue == "rms_norm" else x_host
        want = _op(k).ref(xin, wq["weight"], wq["weight_scale"], None, None, b_host, None)
        err = _err(qkv, want)
        assert err < TOL, f"{plain.entry} M={x_host.shape[0]}: the variant without the epilogue, {err:.2e} vs numpy"
