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

from ingot.codegen.kernels.activation.rule import gated_spec
from ingot.codegen.kernels.gemv.rule import (
    QUANT_PARAMS,
    Prologue,
    RopeEpilogue,
    fused_spec,
    gemv_config,
    gemv_spec,
    with_rope,
)
from ingot.codegen.kernels.norm.rule import norm_spec
from ingot.codegen.kernels.rope.cache_rule import rope_qkv_cache_spec
from ingot.ir.ops.attention import SwiGLU
from ingot.ir.ops.norm import RmsNorm
from ingot.ir.ops.quantized import QuantizedLinear
from ingot.ir.quant.formats import to_e4m3
from ingot.ir.types import DType
from tests.codegen.common import gpu_target
from tests.codegen.test_decode_fusion_gpu import EPS, TOKENS, _cases, _err
from tests.codegen.test_gemv_quant_gpu import CASES, TOL, _u8, activations, quantized_weight, run_case
from tests.codegen.test_qkv_rope_fusion_gpu import BLOCK, CTYPE
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


def _launch(gpu, spec, x, wbufs: dict, res, m: int, **extra) -> np.ndarray:
    """One launch of an FP8 variant without bias into a poisoned output; its output, checked finite."""
    out = gpu.alloc((m, spec.value("N")), BF16)  # poisoned: NaN where nothing is written
    gpu.launch(spec, x=x, **wbufs, bias=None, residual=res, out=out, M=m, **extra)
    got = gpu.download(out)
    assert np.isfinite(got.astype(np.float32)).all(), f"{spec.entry} M={m}: unwritten or non-finite outputs"
    return got


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


@pytest.mark.parametrize("weights_first", [True, False], ids=["weights-first", "wait-first"])
@pytest.mark.parametrize("n,k,mb", _cases(RMS_SHAPES))
def test_fp8_rms_norm_prologue_matches_numpy(gpu, n, k, mb, weights_first):
    r = rng()
    residual = n != 16384  # the gate_up has none
    plain, fused = _fp8_pair(gpu, n, k, mb, residual, Prologue("rms_norm", EPS), weights_first)
    assert [p.name for p in fused.params][-1] == "norm_weight"
    norm = norm_spec("rms", DType.bf16, DType.bf16, k, EPS, gpu_target(gpu))
    wq, wbufs = _fp8_weight(gpu, r, n, k)
    g_host = (1 + 0.2 * r.standard_normal(k)).astype(BF16)
    g = gpu.upload(g_host)
    for m in TOKENS[mb]:
        x_host = (r.uniform(0.01, 40.0) * r.standard_normal((m, k))).astype(BF16)
        res_host = r.standard_normal((m, n)).astype(BF16) if residual else None
        want = _op(k).ref(RmsNorm(eps=EPS).ref(x_host, g_host), wq["weight"], wq["weight_scale"], None, None, None,
                          res_host)
        x = gpu.upload(x_host)
        res = gpu.upload(res_host) if residual else None
        normed = gpu.alloc((m, k), BF16)
        gpu.launch(norm, x=x, weight=g, bias=None, residual=None, residual_out=None, out=normed, rows=m)
        unfused = _launch(gpu, plain, normed, wbufs, res, m)
        assert _err(unfused, want) < TOL, f"fp8 {n}x{k} M={m}: the unfused launches vs numpy"
        for attempt in range(2):
            got = _launch(gpu, fused, x, wbufs, res, m, norm_weight=g)
            err = _err(got, want)
            assert err < TOL, f"fp8 {n}x{k} MB={mb} M={m} launch {attempt}: {err:.2e} vs numpy"
            assert _err(got, unfused) < TOL, f"fp8 {n}x{k} MB={mb} M={m} launch {attempt}: vs the unfused launches"


@pytest.mark.parametrize("weights_first", [True, False], ids=["weights-first", "wait-first"])
@pytest.mark.parametrize("n,k,mb", _cases(SWIGLU_SHAPES))
def test_fp8_swiglu_prologue_matches_numpy(gpu, n, k, mb, weights_first):
    r = rng()
    plain, fused = _fp8_pair(gpu, n, k, mb, True, Prologue("swiglu", alpha=1.0), weights_first)
    act = gated_spec("swiglu", DType.bf16, k, gpu_target(gpu), alpha=1.0, a_stride=2 * k, b_stride=2 * k, b_offset=k)
    wq, wbufs = _fp8_weight(gpu, r, n, k)
    for m in TOKENS[mb]:
        gate_up_host = (3 * r.standard_normal((m, 2 * k))).astype(BF16)
        gate_up_host[0, 0] = -100  # 2^(144) overflows to inf: silu 0
        res_host = r.standard_normal((m, n)).astype(BF16)
        want = _op(k).ref(SwiGLU(packed=True).ref(gate_up_host), wq["weight"], wq["weight_scale"], None, None, None,
                          res_host)
        gate_up, res = gpu.upload(gate_up_host), gpu.upload(res_host)
        a = gpu.alloc((m, k), BF16)
        gpu.launch(act, a=gate_up, b=gate_up, out=a, num_tokens=m)
        unfused = _launch(gpu, plain, a, wbufs, res, m)
        assert _err(unfused, want) < TOL, f"fp8 {n}x{k} M={m}: the unfused launches vs numpy"
        for attempt in range(2):
            got = _launch(gpu, fused, gate_up, wbufs, res, m)
            err = _err(got, want)
            assert err < TOL, f"fp8 {n}x{k} MB={mb} M={m} launch {attempt}: {err:.2e} vs numpy"
            assert _err(got, unfused) < TOL, f"fp8 {n}x{k} MB={mb} M={m} launch {attempt}: vs the unfused launches"


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
    max_pos = 4096
    ang = np.arange(max_pos)[:, None] * (10000.0 ** (-np.arange(d // 2) / (d // 2)))[None]
    tables = {"cos": np.cos(ang), "sin": np.sin(ang)}
    tables = {name: gpu.upload(t.astype(np.float32 if ct is DType.f32 else BF16)) for name, t in tables.items()}
    kv_scale = (gpu.upload((r.uniform(0.005, 0.02, (2, nkv))).astype(np.float32)) if scaled else None)
    for m in (1, 3, 8):
        x_host = (3.0 * r.standard_normal((m, k))).astype(BF16)
        x = gpu.upload(x_host)
        positions = gpu.upload(r.integers(0, max_pos, m).astype(np.int64))
        blocks = m // BLOCK + 3
        slot_host = r.permutation(blocks * BLOCK)[:m].astype(np.int64)
        slot_host[r.random(m) < 0.3] = -1
        slots = gpu.upload(slot_host)
        cache0 = r.standard_normal((blocks, 2, BLOCK, nkv, d))
        cache0 = to_e4m3(cache0 * 100.0) if kt is DType.f8e4m3fn else cache0.astype(BF16)
        # before: the variant without the epilogue, then the fused rope + cache write kernel
        qkv = gpu.alloc((m, n), BF16)
        gpu.launch(plain, x=x, **wbufs, bias=b, residual=None, out=qkv, M=m, **extra)
        q_want, cache_want = gpu.alloc((m, nq * d), BF16), gpu.upload(cache0)
        gpu.launch(rope, qkv=qkv, positions=positions, **tables, q=q_want, kv_cache=cache_want, slot_mapping=slots,
                   kv_scale=kv_scale, num_tokens=m)
        want_q, want_cache = gpu.download(q_want), gpu.download(cache_want)
        for attempt in range(2):
            out, q, cache = gpu.alloc((m, n), BF16), gpu.alloc((m, nq * d), BF16), gpu.upload(cache0)
            gpu.launch(fused, x=x, **wbufs, bias=b, residual=None, out=out, M=m, **extra,
                       positions=positions, **tables, q=q, kv_cache=cache, slot_mapping=slots, kv_scale=kv_scale)
            what = f"{fused.entry} M={m} launch {attempt + 1}"
            assert np.array_equal(gpu.download(q).view(np.uint16), want_q.view(np.uint16)), f"{what}: q"
            assert np.array_equal(gpu.download(cache).view(np.uint8), want_cache.view(np.uint8)), f"{what}: cache"
            assert np.isnan(gpu.download(out).astype(np.float32)).all(), f"{what}: out was written"
        assert np.isfinite(want_q.astype(np.float32)).all()
        written = slot_host >= 0
        if written.any():  # the reference itself wrote the cache at the tokens' slots
            changed = (want_cache.view(np.uint8) != cache0.view(np.uint8)).any(axis=(2, 3, 4)).sum()
            assert changed > 0
        # the pair compared against is right: the plain FP8 variant's qkv against numpy
        xin = RmsNorm(eps=EPS).ref(x_host, g_host) if prologue == "rms_norm" else x_host
        want = _op(k).ref(xin, wq["weight"], wq["weight_scale"], None, None, b_host, None)
        err = _err(gpu.download(qkv), want)
        assert err < TOL, f"{plain.entry} M={m}: the variant without the epilogue, {err:.2e} vs numpy"
