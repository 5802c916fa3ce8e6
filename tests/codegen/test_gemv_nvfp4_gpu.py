"""The bf16 decode GEMV's template with NVFP4 weights (``codegen/kernels/gemv/kernel.cu``, ``WB`` 0: weight-only
``quantized_linear``, e2m1 codes ``u8[N, K/2]`` with an e4m3 scale per 16 columns ``u8[N, K/16]`` and the f32 global
scale ``weight_scale_2[1]``, bf16 x; ``rule.gemv_spec(..., wb=rule.WB_NVFP4)``) on the GPU (``-m gpu``; skipped
without one).

- The plain variants against ``QuantizedLinear.ref`` (test_gemv_quant_gpu.py's ``run_case``: weights quantized with
  an NVFP4 global scale that saturates block scales at 448 and codes at 6, tiny rows (subnormal e4m3 block scales)
  and an all-zero block (scale 0), activations with per-token outliers, outputs poisoned before each launch, each
  launch done twice so the split-K counters must be reset by the first): test_gemv_quant_gpu.py's shapes (all with K
  a multiple of 128; N off the tiles, K off the slice: a partial last slice), the rule's configuration, plain and
  bias + residual epilogues, token counts at the buckets' edges.
- x over the range its f16 staging (times 2^-4, as the FP8 variants' f16 route) holds, each token against its own
  reference.
- Explicit configurations (``gemv_config(..., wb=0)``, 128-column steps): row groups of 2, 4 and 8 warps, split-K
  over CTAs on top of them, 2 tiles a warp, a partial last slice (some warps' parts of it wholly past K), a single
  slice longer than K, 64 tokens; the first weight stage (and its block scales) before and after the
  grid-dependency wait.
- The rms_norm and packed swiglu prologues (``fused_spec``) against numpy (``RmsNorm`` / ``SwiGLU`` then
  ``QuantizedLinear``'s references) and against the launches they replace (the norm / activation kernel, then the
  plain NVFP4 variant), within the GEMV tolerance (not bit-identical, test_decode_fusion_gpu.py's docstring says why);
  weights first and wait first, each fused launch twice.
- The rope epilogue (``with_rope``): the NVFP4 variant with it writes q and the paged KV cache bit for bit as the
  same variant without it followed by ``rope/qkv_cache.cu``, and leaves ``out`` unwritten (test_qkv_rope_fusion_gpu.py's
  cases), at the rule's configuration and with split-K in slices of one stage, with and without the rms_norm prologue;
  the plain variant compared against is itself checked against numpy.

    python -m pytest tests/codegen/test_gemv_nvfp4_gpu.py -m gpu -v
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.gemv.rule import (
    NVFP4_SHAPE,
    QUANT_PARAMS,
    WB_NVFP4,
    WB_STEP_COLS,
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
from tests.codegen.test_gemv_fp8_gpu import check_x_range
from tests.codegen.test_gemv_quant_gpu import CASES as QUANT_CASES
from tests.codegen.test_gemv_quant_gpu import TOL, _u8, activations, quantized_weight, run_case
from tests.codegen.test_qkv_rope_fusion_gpu import BLOCK, CTYPE, check_rope_epilogue
from tests.codegen.test_qkv_rope_fusion_gpu import CASES as ROPE_CASES
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16
#: columns a step covers: K must be whole steps
STEP = WB_STEP_COLS[WB_NVFP4]
#: test_gemv_quant_gpu.py's (N, K, bucket, token counts), every K a whole number of 128-column steps
CASES = [c for c in QUANT_CASES if c[1] % STEP == 0]
#: test_qkv_rope_fusion_gpu.py's cases whose K is whole steps (all of them)
NVFP4_ROPE_CASES = sorted(name for name, c in ROPE_CASES.items() if c[3] % STEP == 0)


def _op(k: int) -> QuantizedLinear:
    """The op the NVFP4 variants compute: weight-only NVFP4, block scales in the linear layout."""
    return QuantizedLinear(weight_format="nvfp4", weight_granularity="channel", act_format="none",
                           act_granularity="token", in_features=k)


def _check_nvfp4_spec(spec, n: int, k: int, mb: int) -> None:
    """``spec`` is kernel.cu's NVFP4-weight variant for ``w[n, k]`` and ``M <= mb``, with the op's parameters."""
    assert spec.template == "kernel.cu" and spec.value("WB") == WB_NVFP4 == 0, spec.doc
    assert (spec.value("N"), spec.value("K"), spec.value("MB")) == (n, k, mb)
    assert [p.name for p in spec.params][:len(QUANT_PARAMS)] == [name for name, _ in QUANT_PARAMS]


def _nvfp4_weight(gpu, r: np.random.Generator, n: int, k: int) -> tuple[dict, dict]:
    """(``quantized_weight``'s NVFP4 inputs, their device buffers as the NVFP4 variants take them: the packed codes
    and the e4m3 block scales as bytes, the global scale as one f32)."""
    wq = quantized_weight(r, "nvfp4", n, k)
    assert wq["weight"].dtype == np.uint8 and wq["weight"].shape == (n, k // 2)
    assert wq["weight_scale"].dtype == ml_dtypes.float8_e4m3fn and wq["weight_scale"].shape == (n, k // 16)
    s2 = np.asarray(wq["weight_scale_2"], np.float32).reshape(1)
    bufs = {"weight": gpu.upload(_u8(wq["weight"])), "weight_scale": gpu.upload(_u8(wq["weight_scale"])),
            "weight_scale_2": gpu.upload(s2), "input_scale": None}
    return wq, bufs


def _ref(k: int, wq: dict, x: np.ndarray, bias=None, res=None) -> np.ndarray:
    return _op(k).ref(x, wq["weight"], wq["weight_scale"], wq["weight_scale_2"], None, bias, res)


# -- plain variants ---------------------------------------------------------------------------------------------


def _check_plain(gpu, spec, n: int, k: int, mb: int, ms, has: bool) -> None:
    """``spec`` (a plain NVFP4 variant, with bias and residual where ``has``) against the reference at each M of ms."""
    r = rng()
    _check_nvfp4_spec(spec, n, k, mb)
    wq = quantized_weight(r, "nvfp4", n, k)
    bias = (r.standard_normal(n) * 0.1).astype(BF16) if has else None
    for m in ms:
        x = activations(r, m, k)
        res = r.standard_normal((m, n)).astype(BF16) if has else None
        run_case(gpu, spec, _op(k), wq, x, bias, res, None, n)


@pytest.mark.parametrize("n,k,mb,ms", CASES)
@pytest.mark.parametrize("epilogue", ["plain", "bias+residual"])
def test_nvfp4_gemv_matches_reference(gpu, n, k, mb, ms, epilogue):
    has = epilogue != "plain"
    spec = gemv_spec(n, k, mb, gpu_target(gpu), bias=has, residual=has, wb=WB_NVFP4)
    _check_plain(gpu, spec, n, k, mb, ms, has)


#: rule.NVFP4_SHAPE's configurations (bucket 8 without row groups): the 1B model's gate_up (8 steps a stage, one CTA an
#: SM), down (split-K 8 through the workspace), lm_head (4 steps), a K off whole 8-step slices, a narrow N
NVFP4_SHAPE_CASES = [(16384, 2048, (1, 8)), (2048, 8192, (1, 5, 8)), (128256, 2048, (1,)), (1000, 4224, (1, 8)),
                     (512, 8192, (3,))]


@pytest.mark.parametrize("n,k,ms", NVFP4_SHAPE_CASES)
@pytest.mark.parametrize("epilogue", ["plain", "bias+residual"])
def test_nvfp4_shape_matches_reference(gpu, n, k, ms, epilogue):
    has = epilogue != "plain"
    spec = gemv_spec(n, k, 8, gpu_target(gpu), bias=has, residual=has, wb=WB_NVFP4)
    cfg = gemv_config(n, k, 8, gpu_target(gpu).num_sms or 132, wb=WB_NVFP4)
    assert cfg.warps == NVFP4_SHAPE[8][0] and cfg.kwarps == 1 and not cfg.cluster, cfg
    _check_plain(gpu, spec, n, k, 8, ms, has)


@pytest.mark.parametrize("n,k", [(3072, 2048), (2048, 8192)])
def test_nvfp4_gemv_x_range(gpu, n, k):
    """Tokens of very different magnitudes in one launch (X_MAGNITUDES: x is staged as f16 times 2^-4, as by the FP8
    variants' f16 route), each within the GEMV tolerance of its own reference (the shared tolerance, relative to the
    largest output of all tokens, would not see the small ones)."""
    r = rng()
    spec = gemv_spec(n, k, 8, gpu_target(gpu), wb=WB_NVFP4)
    _check_nvfp4_spec(spec, n, k, 8)
    wq, bufs = _nvfp4_weight(gpu, r, n, k)
    check_x_range(gpu, spec, r, bufs, lambda x: _ref(k, wq, x))


#: explicit configurations (N, K, bucket, (warps, tiles, steps a stage, split-K, warps a row group), token counts at
#: the bucket's edges); steps are 128 columns. 8 warps a row group with split-K 3 over CTAs and a partial last slice
#: (slices of 2048, a warp's part 256 columns: the third holds 128, half of warp 0's part, warps 1-7 wholly past K);
#: 2 tiles a warp; split-K 4 on top of row groups of 4 (each warp's part two stages of 2 steps); 64 tokens with N off
#: the tiles (each warp's part one step); KW_SHAPE's bucket-8 row groups of the 1B model's qkv (2 warps, one stage of
#: 8 steps each: the rule's before KW_SHAPE_NVFP4); one slice of 8192 for K = 4224 (warp 2's part one step into K,
#: warp 3's wholly past it)
KW_RUNS = [(1000, 4224, 8, (8, 1, 2, 3, 8), (1, 8)), (3072, 2048, 32, (8, 2, 2, 1, 2), (17, 32)),
           (2048, 8192, 16, (4, 1, 2, 4, 4), (9, 16)), (200, 256, 64, (8, 1, 1, 1, 2), (33, 64)),
           (3072, 2048, 8, (4, 1, 8, 1, 2), (1, 3, 8)), (1000, 4224, 8, (4, 1, 8, 1, 4), (1, 8))]


@pytest.mark.parametrize("n,k,mb,c,ms", KW_RUNS)
@pytest.mark.parametrize("weights_first", [False, True], ids=["wait-first", "weights-first"])
def test_nvfp4_row_groups_match_reference(gpu, n, k, mb, c, ms, weights_first):
    r = rng()
    w, t, u, sk, kw = c
    cfg = gemv_config(n, k, mb, 132, warps=w, tiles=t, stage_steps=u, splitk=sk, kwarps=kw, wb=WB_NVFP4)
    assert (cfg.warps, cfg.tiles, cfg.stage_steps, cfg.splitk, cfg.kwarps) == c, cfg
    spec = gemv_spec(n, k, mb, gpu_target(gpu), bias=True, residual=True, config=cfg, weights_first=weights_first,
                     wb=WB_NVFP4)
    _check_nvfp4_spec(spec, n, k, mb)
    assert (spec.value("KW"), spec.value("SPLITK"), spec.value("KS")) == (kw, sk, cfg.slice_k)
    assert spec.value("WEIGHTS_FIRST") == weights_first
    wq = quantized_weight(r, "nvfp4", n, k)
    bias = (r.standard_normal(n) * 0.1).astype(BF16)
    for m in ms:
        run_case(gpu, spec, _op(k), wq, activations(r, m, k), bias, r.standard_normal((m, n)).astype(BF16), None, n)


# -- prologues --------------------------------------------------------------------------------------------------

#: test_decode_fusion_gpu.py's shapes with K a multiple of 128 (N, K, buckets): the 1B model's qkv (row groups) and
#: gate_up, N = 576 with a 1152-wide norm, K = 896 off the prologue's 256-column chunks, split-K with a 16-token bucket,
#: a 8192-wide norm
RMS_SHAPES = [(3072, 2048, (8, 16)), (16384, 2048, (8,)), (576, 1152, (8, 16)), (1000, 896, (8,)),
              (1024, 4096, (16,)), (512, 8192, (8,))]
#: the 1B model's down, SmolLM2's, K = 4224 off the slice (4128 in the bf16 test is not a multiple of 128)
SWIGLU_SHAPES = [(2048, 8192, (8, 16)), (576, 1536, (8,)), (1000, 4224, (8, 16))]


def _nvfp4_pair(gpu, n: int, k: int, mb: int, residual: bool, prologue: Prologue, weights_first: bool):
    """(the rule's plain NVFP4 variant, its fused variant), both kernel.cu's with NVFP4 weights."""
    tgt = gpu_target(gpu)
    plain = gemv_spec(n, k, mb, tgt, residual=residual, wb=WB_NVFP4)
    fused = fused_spec(plain, prologue, tgt, weights_first=weights_first)
    _check_nvfp4_spec(plain, n, k, mb)
    _check_nvfp4_spec(fused, n, k, mb)
    assert fused.value("WEIGHTS_FIRST") == weights_first
    return plain, fused


def _nvfp4_linear(gpu, r: np.random.Generator, n: int, k: int):
    """test_decode_fusion_gpu.py's ``weight`` for NVFP4 variants: ``quantized_weight``'s NVFP4 weight as they take
    it, and ``QuantizedLinear``'s reference ``(x, residual or None) -> out``."""
    wq, bufs = _nvfp4_weight(gpu, r, n, k)
    return bufs, lambda x, res: _ref(k, wq, x, None, res)


@pytest.mark.parametrize("weights_first", [True, False], ids=["weights-first", "wait-first"])
@pytest.mark.parametrize("n,k,mb", _cases(RMS_SHAPES))
def test_nvfp4_rms_norm_prologue_matches_numpy(gpu, n, k, mb, weights_first):
    residual = n != 16384  # the gate_up has none
    plain, fused = _nvfp4_pair(gpu, n, k, mb, residual, Prologue("rms_norm", EPS), weights_first)
    assert [p.name for p in fused.params][-1] == "norm_weight"
    check_rms_norm(gpu, plain, fused, residual, "nvfp4", weight=_nvfp4_linear)


@pytest.mark.parametrize("weights_first", [True, False], ids=["weights-first", "wait-first"])
@pytest.mark.parametrize("n,k,mb", _cases(SWIGLU_SHAPES))
def test_nvfp4_swiglu_prologue_matches_numpy(gpu, n, k, mb, weights_first):
    plain, fused = _nvfp4_pair(gpu, n, k, mb, True, Prologue("swiglu", alpha=1.0), weights_first)
    check_swiglu(gpu, plain, fused, "nvfp4", weight=_nvfp4_linear)


# -- rope epilogue ----------------------------------------------------------------------------------------------

#: the split-K configuration's stage: 2 steps of 128 columns, a slice of one stage
ROPE_STAGE_STEPS = 2


def _rope_specs(gpu, case: str, config: str, prologue: str):
    """(the NVFP4 variant, it with the rope epilogue, qkv_cache.cu's launch) for a case of test_qkv_rope_fusion_gpu.py;
    ``config``: the rule's (row groups where it gives them) or split-K over CTAs in slices of one stage (2 steps of
    128 columns), no row groups. The first weight stage as the lowering loads it (the rule's default)."""
    nq, nkv, d, k, inter, kt, ct, scaled, bias = ROPE_CASES[case]
    tgt = gpu_target(gpu)
    n = (nq + 2 * nkv) * d
    stage = STEP * ROPE_STAGE_STEPS
    cfg = (gemv_config(n, k, 8, tgt.num_sms or 132, stage_steps=ROPE_STAGE_STEPS, splitk=k // stage, kwarps=1,
                       wb=WB_NVFP4) if config == "splitk" else None)
    if cfg is not None:
        assert cfg.slice_k == stage and cfg.splitk == k // stage, cfg
    pro = Prologue("rms_norm", eps=EPS) if prologue == "rms_norm" else None
    plain = gemv_spec(n, k, 8, tgt, bias=bias, config=cfg, prologue=pro, wb=WB_NVFP4)
    fused = with_rope(plain, RopeEpilogue(nq, nkv, d, inter, BLOCK, CTYPE[kt], CTYPE[ct], scaled), tgt)
    rope = rope_qkv_cache_spec(DType.bf16, ct, kt, nq, nkv, d, d, inter, BLOCK, scaled, tgt)
    return plain, fused, rope


@pytest.mark.parametrize("prologue", ["none", "rms_norm"])
@pytest.mark.parametrize("config", ["rule", "splitk"])
@pytest.mark.parametrize("case", NVFP4_ROPE_CASES)
def test_nvfp4_rope_epilogue_writes_what_gemv_then_rope_write(gpu, case, config, prologue):
    nq, nkv, d, k, inter, kt, ct, scaled, bias = ROPE_CASES[case]
    plain, fused, rope = _rope_specs(gpu, case, config, prologue)
    n = plain.value("N")
    _check_nvfp4_spec(fused, n, k, 8)
    for name in ("WARPS", "MT", "KS", "SPLITK", "U", "KW", "PROLOGUE", "WEIGHTS_FIRST"):
        assert fused.value(name) == plain.value(name), name
    if config == "splitk":
        assert fused.value("SPLITK") == k // (STEP * ROPE_STAGE_STEPS) > 1
    r = rng()
    wq, wbufs = _nvfp4_weight(gpu, r, n, k)
    b_host = r.standard_normal(n).astype(BF16) if bias else None
    b = gpu.upload(b_host) if bias else None
    g_host = (1 + 0.2 * r.standard_normal(k)).astype(BF16) if prologue == "rms_norm" else None
    extra = {"norm_weight": gpu.upload(g_host)} if prologue == "rms_norm" else {}
    for x_host, qkv in check_rope_epilogue(gpu, r, case, plain, fused, rope, {**wbufs, "bias": b}, extra):
        # the pair compared against is right: the plain NVFP4 variant's qkv against numpy
        xin = RmsNorm(eps=EPS).ref(x_host, g_host) if prologue == "rms_norm" else x_host
        want = _ref(k, wq, xin, b_host, None)
        err = _err(qkv, want)
        assert err < TOL, f"{plain.entry} M={x_host.shape[0]}: the variant without the epilogue, {err:.2e} vs numpy"
