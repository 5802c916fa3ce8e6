"""The quantized decode GEMV (``codegen/kernels/gemv/quant.cu``) against ``quantized_linear``'s numpy reference on
the GPU (``-m gpu``; skipped without one).

Fresh random inputs with per-token outliers, weights quantized by ``ir/quant/formats.py`` including saturated
codes (FP8 rows with a halved scale, an NVFP4 global scale that saturates block scales at 448 and codes at 6),
tiny rows (subnormal E4M3 block scales) and an all-zero block (scale 0); static FP8 activation scales that
saturate; bias and residual epilogues; every token count at a bucket's edges; outputs poisoned before each
launch, each launch done twice (the split-K counters must be reset by the first)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.gemv.quant_rule import ANY_M_CHUNK, quant_gemv_spec
from ingot.codegen.target import get_target
from ingot.ir.ops.quantized import QuantizedLinear
from ingot.ir.quant import formats as F
from ingot.ir.quant.packing import pack_e2m1
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16
FORMATS = [("fp8", "none", "token"), ("fp8", "fp8", "token"), ("fp8", "fp8", "tensor"), ("nvfp4", "none", "token")]
#: (N, K, bucket, token counts)
CASES = [(3072, 2048, 8, (1, 3, 8)), (2048, 8192, 32, (1, 17, 32)), (200, 256, 64, (1, 33, 64)),
         (1000, 4224, 16, (5, 16)), (16384, 2048, 8, (1,)), (2048, 2048, 32, (32,))]
TOL = 1e-2  # max |error| / max |reference|: bf16 output rounding plus f32 summation order


def quantized_weight(r: np.random.Generator, fmt: str, n: int, k: int) -> dict[str, np.ndarray | None]:
    """The stored weight inputs of ``quantized_linear`` for a random [n, k] weight, with saturated and tiny parts."""
    w = (r.standard_normal((n, k)) * 0.05).astype(np.float32)
    w[1::7] *= 1e-3  # tiny rows: subnormal e4m3 (block) scales
    w[0, :32] = 0.0  # an all-zero block: nvfp4 scale 0
    if fmt == "fp8_block":  # 128 x 128 blocks, a third of the block rows' scales halved: those saturate at 448
        s = F.fp8_scale(w, "block")
        s[::3] *= np.float32(0.5)
        q, s = F.quantize_fp8(w, "block", scale=s)
        return {"weight": q, "weight_scale": s, "weight_scale_2": None}
    if fmt == "fp8":
        s = F.fp8_scale(w, "channel")
        s = np.where(np.arange(n) % 3 == 0, s * np.float32(0.5), s).astype(np.float32)  # these rows saturate at 448
        q, s = F.quantize_fp8(w, "channel", scale=s)
        return {"weight": q, "weight_scale": s, "weight_scale_2": None}
    gs = F.nvfp4_global_scale(np.abs(w).max()) * np.float32(0.25)  # block scales saturate at 448, codes at 6
    q, sf = F.quantize_nvfp4(w, gs)
    return {"weight": pack_e2m1(q), "weight_scale": sf, "weight_scale_2": np.asarray(gs, np.float32).reshape(())}


def activations(r: np.random.Generator, m: int, k: int) -> np.ndarray:
    x = r.standard_normal((m, k)).astype(np.float32)
    cols = r.integers(0, k, size=3)
    x[:, cols] *= 40.0  # per-token outliers set the fp8 scales
    return x.astype(BF16)


def _u8(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def run_case(gpu, spec, op: QuantizedLinear, wq: dict, x: np.ndarray, bias, res, input_scale, n: int,
             launch_x: np.ndarray | None = None, extra: dict | None = None) -> None:
    """``spec`` launched on the buffers of ``op``'s inputs (x: ``launch_x`` where given, e.g. a norm prologue's input,
    plus ``extra`` buffers) against ``op.ref`` on ``x``."""
    m = x.shape[0]
    ref = op.ref(x, wq["weight"], wq["weight_scale"], wq["weight_scale_2"], input_scale, bias, res)
    assert np.isfinite(ref.astype(np.float32)).all()
    s2 = wq["weight_scale_2"]
    bufs = dict(x=gpu.upload(x if launch_x is None else launch_x), weight=gpu.upload(_u8(wq["weight"])),
                weight_scale=gpu.upload(_u8(wq["weight_scale"]) if wq["weight_scale"].dtype != np.float32
                                        else wq["weight_scale"]),
                weight_scale_2=gpu.upload(np.asarray(s2, np.float32).reshape(1)) if s2 is not None else None,
                input_scale=gpu.upload(np.asarray(input_scale, np.float32).reshape(1)) if input_scale is not None
                else None,
                bias=gpu.upload(bias) if bias is not None else None,
                residual=gpu.upload(res) if res is not None else None, **(extra or {}))
    for attempt in range(2):
        out = gpu.alloc((m, n), BF16)  # poisoned (0xFF: NaN)
        gpu.launch(spec, **bufs, out=out, M=m)
        got = gpu.download(out).astype(np.float64)
        assert np.isfinite(got).all(), f"{spec.entry} M={m} launch {attempt}: unwritten or non-finite outputs"
        want = ref.astype(np.float64)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < TOL, f"{spec.entry} M={m} launch {attempt}: relative error {err:.2e}"


@pytest.mark.parametrize("fmt,act,gran", FORMATS)
@pytest.mark.parametrize("n,k,mb,ms", CASES)
@pytest.mark.parametrize("epilogue", ["plain", "bias+residual"])
def test_quant_gemv_matches_reference(gpu, fmt, act, gran, n, k, mb, ms, epilogue):
    r = rng()
    tgt = get_target("h200" if gpu.arch == "sm_90a" else "b200")
    has = epilogue != "plain"
    spec = quant_gemv_spec(n, k, mb, tgt, fmt, act, gran, bias=has, residual=has)
    op = QuantizedLinear(weight_format=fmt, weight_granularity="channel", act_format=act, act_granularity=gran,
                         in_features=k)
    wq = quantized_weight(r, fmt, n, k)
    bias = (r.standard_normal(n) * 0.1).astype(BF16) if has else None
    for m in ms:
        x = activations(r, m, k)
        res = r.standard_normal((m, n)).astype(BF16) if has else None
        input_scale = None
        if act == "fp8" and gran == "tensor":  # half the calibrated scale: the outliers saturate at 448
            input_scale = np.float32(np.abs(x.astype(np.float32)).max() / 448.0 * 0.5)
        run_case(gpu, spec, op, wq, x, bias, res, input_scale, n)


@pytest.mark.parametrize("fmt,act,gran", FORMATS)
def test_quant_gemv_any_m(gpu, fmt, act, gran):
    """The node's own launch (any M, 64-token chunks on grid.z), for a prefill-sized M."""
    r = rng()
    tgt = get_target("h200" if gpu.arch == "sm_90a" else "b200")
    n, k = 1000, 4224
    spec = quant_gemv_spec(n, k, ANY_M_CHUNK, tgt, fmt, act, gran, bias=True, residual=True, any_m=True)
    op = QuantizedLinear(weight_format=fmt, weight_granularity="channel", act_format=act, act_granularity=gran,
                         in_features=k)
    wq = quantized_weight(r, fmt, n, k)
    for m in (1, 130):
        x = activations(r, m, k)
        input_scale = np.float32(np.abs(x.astype(np.float32)).max() / 448.0) if gran == "tensor" and act == "fp8" \
            else None
        run_case(gpu, spec, op, wq, x, (r.standard_normal(n) * 0.1).astype(BF16),
                 r.standard_normal((m, n)).astype(BF16), input_scale, n)


#: row-group configurations (tests/codegen/test_gemv_quant.py's KW_CASES, which compile them): (N, K, bucket,
#: formats, (warps, tiles, steps a stage, split-K, warps a row group), token counts at the bucket's edges). Split-K
#: over CTAs on top of the row groups' in-CTA sum, a partial last slice (K = 4224: some warps' parts wholly past K),
#: 2 tiles a warp, NVFP4 (each warp's own block scales), 64 tokens, both FP8 activation modes
KW_RUNS = [(3072, 2048, 8, ("fp8", "none", "token"), (4, 1, 8, 1, 4), (1, 3, 8)),
           (1000, 4224, 8, ("fp8", "fp8", "token"), (8, 1, 4, 3, 8), (1, 8)),
           (3072, 2048, 32, ("fp8", "none", "token"), (8, 2, 2, 1, 2), (17, 32)),
           (2048, 8192, 16, ("nvfp4", "none", "token"), (4, 1, 8, 4, 4), (9, 16)),
           (1000, 4224, 16, ("fp8", "fp8", "tensor"), (4, 1, 8, 2, 2), (9, 16)),
           (200, 256, 64, ("nvfp4", "none", "token"), (8, 1, 1, 1, 2), (33, 64)),
           (2048, 2048, 8, ("nvfp4", "none", "token"), (4, 1, 4, 1, 4), (1, 8))]
#: the rule's own row-group variants (bucket 8) of the 1B model: qkv and o in every mode, down with FP8 activations
KW_DEFAULTS = [(n, k, f) for n, k in ((3072, 2048), (2048, 2048)) for f in FORMATS] + [(2048, 8192, FORMATS[1])]


def _run_row_groups(gpu, spec, n: int, k: int, formats: tuple[str, str, str], ms) -> None:
    fmt, act, gran = formats
    r = rng()
    op = QuantizedLinear(weight_format=fmt, weight_granularity="channel", act_format=act, act_granularity=gran,
                         in_features=k)
    wq = quantized_weight(r, fmt, n, k)
    bias = (r.standard_normal(n) * 0.1).astype(BF16)
    for m in ms:
        x = activations(r, m, k)
        input_scale = np.float32(np.abs(x.astype(np.float32)).max() / 448.0 * 0.5) if gran == "tensor" and \
            act == "fp8" else None
        run_case(gpu, spec, op, wq, x, bias, r.standard_normal((m, n)).astype(BF16), input_scale, n)


@pytest.mark.parametrize("n,k,mb,formats,c,ms", KW_RUNS)
def test_row_groups_match_reference(gpu, n, k, mb, formats, c, ms):
    from ingot.codegen.kernels.gemv.quant_rule import quant_config

    fmt, act, gran = formats
    w, t, u, sk, kw = c
    cfg = quant_config(n, k, mb, fmt, act, 132, warps=w, tiles=t, stage_steps=u, splitk=sk, kwarps=kw)
    assert (cfg.splitk, cfg.kwarps) == (sk, kw), cfg
    tgt = get_target("h200" if gpu.arch == "sm_90a" else "b200")
    spec = quant_gemv_spec(n, k, mb, tgt, fmt, act, gran, bias=True, residual=True, config=cfg)
    _run_row_groups(gpu, spec, n, k, formats, ms)


@pytest.mark.parametrize("n,k,formats", KW_DEFAULTS)
def test_rule_row_groups_match_reference(gpu, n, k, formats, monkeypatch):
    """The rule's bucket-8 variants with row groups (the 1B model's qkv / o, down with FP8 activations), on this
    GPU's target."""
    monkeypatch.setenv("INGOT_GEMV_KW", "all")  # quant.cu's row groups are opt-in until this has passed
    fmt, act, gran = formats
    tgt = get_target("h200" if gpu.arch == "sm_90a" else "b200")
    spec = quant_gemv_spec(n, k, 8, tgt, fmt, act, gran, bias=True, residual=True)
    assert spec.value("KW") > 1  # (the H200: no split-K; the B200's 148 SMs add split-K 2 to some)
    _run_row_groups(gpu, spec, n, k, formats, (1, 3, 8))


#: FP8 weights with 128 x 128 block scales (quant.cu's ``fp8_block``), weight-only and W8A8 per token
BLOCK_FORMATS = [("fp8_block", "none", "token"), ("fp8_block", "fp8", "token")]


def _block_op(act: str, k: int) -> QuantizedLinear:
    return QuantizedLinear(weight_format="fp8", weight_granularity="block", act_format=act, in_features=k)


@pytest.mark.parametrize("fmt,act,gran", BLOCK_FORMATS)
@pytest.mark.parametrize("n,k,mb,ms", [c for c in CASES if c[1] % 128 == 0])
def test_fp8_block_gemv_matches_reference(gpu, fmt, act, gran, n, k, mb, ms):
    """Each 128-column block's products times its block's scale (rows of 16 split over two block rows where N is not
    a multiple of 128, split-K slices of whole blocks), bias and residual, against the reference's dequantized
    weight; then the any-M launch at a prefill-sized M."""
    r = rng()
    tgt = get_target("h200" if gpu.arch == "sm_90a" else "b200")
    spec = quant_gemv_spec(n, k, mb, tgt, fmt, act, gran, bias=True, residual=True)
    assert spec.value("WFMT") == 2
    wq = quantized_weight(r, fmt, n, k)
    bias = (r.standard_normal(n) * 0.1).astype(BF16)
    for m in ms:
        run_case(gpu, spec, _block_op(act, k), wq, activations(r, m, k), bias,
                 r.standard_normal((m, n)).astype(BF16), None, n)
    if (n, k) == (1000, 4224):
        any_m = quant_gemv_spec(n, k, ANY_M_CHUNK, tgt, fmt, act, gran, bias=True, residual=True, any_m=True)
        for m in (1, 130):
            run_case(gpu, any_m, _block_op(act, k), wq, activations(r, m, k), bias,
                     r.standard_normal((m, n)).astype(BF16), None, n)


@pytest.mark.parametrize("act", ["none", "fp8"])
@pytest.mark.parametrize("n,k,mb,c,ms", [(1000, 4224, 8, (8, 1, 4, 3, 8), (1, 8)),
                                         (3072, 2048, 32, (8, 2, 2, 1, 2), (17, 32))])
def test_fp8_block_row_groups_match_reference(gpu, act, n, k, mb, c, ms):
    """Row groups (each warp's part of the slice whole blocks, summed in shared memory) with split-K on top."""
    from ingot.codegen.kernels.gemv.quant_rule import quant_config

    w, t, u, sk, kw = c
    cfg = quant_config(n, k, mb, "fp8_block", act, 132, warps=w, tiles=t, stage_steps=u, splitk=sk, kwarps=kw)
    assert (cfg.splitk, cfg.kwarps) == (sk, kw), cfg
    tgt = get_target("h200" if gpu.arch == "sm_90a" else "b200")
    spec = quant_gemv_spec(n, k, mb, tgt, "fp8_block", act, "token", bias=True, residual=True, config=cfg)
    r = rng()
    wq = quantized_weight(r, "fp8_block", n, k)
    bias = (r.standard_normal(n) * 0.1).astype(BF16)
    for m in ms:
        run_case(gpu, spec, _block_op(act, k), wq, activations(r, m, k), bias,
                 r.standard_normal((m, n)).astype(BF16), None, n)
