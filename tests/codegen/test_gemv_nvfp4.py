"""The decode GEMV's NVFP4-weight variants (``codegen/kernels/gemv/kernel.cu`` with ``WB`` 0, ``rule.WB_NVFP4``:
e2m1 codes two a byte, an e4m3 scale per 16 columns, an f32 global scale) without a GPU: their configurations
(128-column steps), specs (``quantized_linear``'s parameters, kept through the prologues and the rope epilogue), compile
+ SASS checks for sm_90a and sm_100a (f16 MMAs on codes turned into f16 and multiplied by their block's scale, the
scales' 16-bit loads beside the weights' 16-byte ones, the first weight stage and its scales before the PDL wait in
the fused variants), which ``quantized_linear`` nodes ``INGOT_GEMV_NVFP4`` routes to them, and what autotuning times
them on. GPU runs of the template: tests/codegen/test_gemv_nvfp4_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

from ingot.codegen import autotune as at
from ingot.codegen.kernels.gemv import bulk_rule, quant_rule, skinny_rule, tune
from ingot.codegen.kernels.gemv.rule import (
    BUCKETS,
    CLUSTER_ENV,
    KW_BUCKETS,
    KW_ENV,
    KW_SHAPE_NVFP4,
    MIN_SLICE,
    NVFP4_SHAPE,
    NVFP4_SHAPE_ENV,
    NVFP4_SHAPE_MIN_STEPS,
    PARAMS,
    PROLOGUES,
    QUANT_PARAMS,
    ROPE_PARAMS,
    SHAPE_BY_BUCKET,
    SMEM_BUDGET,
    WB_NVFP4,
    WB_STEP_COLS,
    WEIGHTS_FIRST_ENV,
    Prologue,
    RopeEpilogue,
    fused_spec,
    gemv_config,
    gemv_spec,
    is_plain,
    kw_fits,
    smem_bytes,
    spec_config,
    variants,
    with_rope,
    x_pad,
)
from ingot.codegen.target import get_target
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    compiled,
    disassembled,
    module_kernel_cache,
    needs_compiler,
    sass_opcodes,
)
from tests.codegen.test_decode_fusion import CP_ASYNC, W_FIRST, W_NC, WAIT, X_LOAD, check_pdl_order, sass_sequence
from tests.codegen.test_gemv_quant import qtypes
from tests.helpers import rng

H200 = get_target("h200")
#: the Llama-3.2-1B layer shapes (qkv, o, gate_up, down, lm_head), and awkward ones with K a whole number of 128-column
#: steps: K of one step, K below a stage, N not a multiple of a CTA's rows, a partial last slice (4224 = 33 steps)
SHAPES_1B = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)]
SHAPES = SHAPES_1B + [(576, 640), (200, 256), (1000, 4224), (128, 128), (100, 640)]
#: SASS: the block scales' 16-bit loads, coherent (the first stage, weights first) and streamed (.nc)
SF_FIRST, SF_NC = "LDG.E.NA.U16", "LDG.E.NA.U16.CONSTANT"


@pytest.fixture(autouse=True)
def _switches(monkeypatch):
    """The rule's defaults whatever the developer's environment: row groups on, no bulk copies, weights first as the
    rule's default, ``INGOT_GEMV_FP8`` and ``INGOT_GEMV_NVFP4`` unset (the tests that route set them themselves)."""
    for name in (KW_ENV, bulk_rule.ENV, quant_rule.FP8_ENV, quant_rule.NVFP4_ENV, WEIGHTS_FIRST_ENV):
        monkeypatch.delenv(name, raising=False)
    # FP8 weight-only buckets all kernel.cu's (the skinny GEMM's FP8 variants, the default from bucket 16 on sm_90a,
    # are test_gemv_skinny.py's)
    monkeypatch.setenv(skinny_rule.FP8_ENV, "0")
    # the workspace split-K and row groups these tests were written for (INGOT_GEMV_CLUSTER=0); the cluster
    # reduction, the default, has its own: test_gemv_cluster.py / test_gemv_cluster_gpu.py
    monkeypatch.setenv(CLUSTER_ENV, "0")


# -- configurations --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("mb", BUCKETS)
def test_config_covers_k_and_fits(n, k, mb):
    c = gemv_config(n, k, mb, 132, wb=WB_NVFP4)
    cw = WB_STEP_COLS[WB_NVFP4]
    assert WB_NVFP4 == 0 and cw == 128
    assert c.slice_k % (cw * c.stage_steps * c.kwarps) == 0  # each warp of a row group: whole stages of 128 columns
    assert c.splitk * c.slice_k >= k > (c.splitk - 1) * c.slice_k
    assert smem_bytes(mb, c.slice_k, wb=0) <= SMEM_BUDGET and kw_fits(mb, c, wb=0)
    assert c.warps % c.kwarps == 0 and c.rows == 16 * c.tiles * c.warps // c.kwarps
    # split slices are at least the bf16 rule's smallest slice in bytes of a row (MIN_SLICE bf16 columns: 2 bytes
    # each, where an NVFP4 column is half a byte)
    assert c.splitk == 1 or c.slice_k >= 4 * MIN_SLICE
    assert c.kwarps == 1 or mb in KW_BUCKETS


#: the 1B model's layer GEMVs with NVFP4 weights (N, K) -> (warps a row group, split-K) in bucket 8. Row groups take
#: KW_SHAPE_NVFP4 (8 warps x 4 steps a stage: with 128-column steps KW_SHAPE's 8-step stage would leave K = 2048 to 2
#: warps at most), so qkv and o get row groups of 4 warps, a 512-column part each, 96 and 64 CTAs (4 warps a group of
#: 8 gives 0.9 CTAs an SM with no more than the warps: 8 would need K = 4096); down's x slice (8192 columns, bf16) is
#: over KW_MAX_X, so split-K 8 (slices of 1024, 512 bytes a row as bf16's 256-column ones); gate_up and the lm_head
#: have rows enough
ROW_GROUPS = {(3072, 2048): (4, 1), (2048, 2048): (4, 1), (2048, 8192): (1, 8), (16384, 2048): (1, 1),
              (128256, 2048): (1, 1)}


@pytest.mark.parametrize("n,k", SHAPES_1B)
def test_row_groups(n, k, monkeypatch):
    kw, split = ROW_GROUPS[(n, k)]
    c = gemv_config(n, k, 8, 132, wb=0)
    assert (c.kwarps, c.splitk) == (kw, split), c
    if kw > 1:
        assert (c.warps, c.tiles, c.stage_steps) == KW_SHAPE_NVFP4, c
    else:  # NVFP4_SHAPE (test_nvfp4_shape)
        assert (c.warps, c.tiles) == NVFP4_SHAPE[8][:2] and not c.cluster, c
    if kw > 1:
        assert c.slice_k == k and c.rows == 16 * c.warps // kw
        assert k // kw == 128 * c.stage_steps  # each warp of a row group: one whole stage
    spec = gemv_spec(n, k, 8, H200, wb=0)
    assert spec.value("KW") == kw and spec_config(spec) == c and spec.value("WB") == 0
    monkeypatch.setenv(KW_ENV, "0")  # none: the rule's configuration without row groups
    off = gemv_config(n, k, 8, 132, wb=0)
    assert off.kwarps == 1 and off == gemv_config(n, k, 8, 132, kwarps=1, wb=0)


@pytest.mark.parametrize("n,k", SHAPES_1B + [(1000, 4224), (512, 8192), (256, 256), (40000, 1024)])
def test_nvfp4_shape(n, k, monkeypatch):
    """Bucket 8 without row groups takes NVFP4_SHAPE: its warps, split-K through the workspace until the grid has the
    CTAs an SM it aims at or a slice is down to NVFP4_SHAPE_MIN_STEPS steps, 8 steps a stage for at most one CTA an
    SM (else 4), never longer than a slice; INGOT_GEMV_NVFP4_SHAPE=0 gives the bucket's own shape back."""
    sms, cw = 132, WB_STEP_COLS[WB_NVFP4]
    c = gemv_config(n, k, 8, sms, wb=WB_NVFP4)
    if c.kwarps > 1:  # qkv and o: KW_SHAPE_NVFP4's row groups (test_row_groups)
        assert (n, k) in ((3072, 2048), (2048, 2048))
        return
    warps, tiles, per_sm = NVFP4_SHAPE[8]
    assert (c.warps, c.tiles, c.kwarps, c.cluster) == (warps, tiles, 1, False), c
    ctas = -(-n // (16 * warps * tiles)) * c.splitk
    assert c.splitk * c.slice_k >= k > (c.splitk - 1) * c.slice_k and c.slice_k % (cw * c.stage_steps) == 0
    if c.splitk > 1:  # split only while short of the CTAs, and never below the minimum slice
        assert ctas // 2 < per_sm * sms and c.slice_k >= cw * NVFP4_SHAPE_MIN_STEPS
    assert ctas >= per_sm * sms or c.splitk == 8 or k < 2 * c.splitk * cw * NVFP4_SHAPE_MIN_STEPS
    if k % (cw * 8 * c.splitk) == 0:  # (K off whole 8-step slices: fewer steps, slices rounded up to whole stages)
        assert c.stage_steps == (8 if ctas <= sms else 4) or c.stage_steps * cw == c.slice_k
    spec = gemv_spec(n, k, 8, H200, wb=WB_NVFP4)
    assert spec_config(spec) == c and spec.value("CLUSTER") in (0, None, False)
    other, bf16 = gemv_config(n, k, 16, sms, wb=WB_NVFP4), gemv_config(n, k, 8, sms)  # not theirs
    monkeypatch.setenv(NVFP4_SHAPE_ENV, "0")
    off = gemv_config(n, k, 8, sms, wb=WB_NVFP4)
    assert (off.warps, off.tiles, off.stage_steps) == SHAPE_BY_BUCKET[8] and off != c
    assert gemv_config(n, k, 16, sms, wb=WB_NVFP4) == other
    monkeypatch.setenv(NVFP4_SHAPE_ENV, "yes")
    with pytest.raises(ValueError, match=NVFP4_SHAPE_ENV):
        gemv_config(n, k, 8, sms, wb=WB_NVFP4)
    assert gemv_config(n, k, 8, sms) == bf16  # bf16 weights: the switch is not read


def test_nvfp4_steps_are_128_columns(monkeypatch):
    """A step is 16 bytes a lane (64 bytes of a row) with every weight type: NVFP4 slices, stages and the smallest
    split slice are in 128-column units where FP8's are in 64-column ones and bf16's in 32-column ones."""
    # qkv at 16 tokens: bf16 splits K 8 x 256 (its smallest slice), FP8 4 x 512, NVFP4 2 x 1024 (the same 512 bytes)
    for wb, (split, ks) in ((2, (8, 256)), (1, (4, 512)), (0, (2, 1024))):
        c = gemv_config(3072, 2048, 16, 132, wb=wb)
        assert (c.splitk, c.slice_k) == (split, ks), (wb, c)
        assert ks * max(wb, 0.5) == 2 * MIN_SLICE  # bytes of a row
    # a K of one step: NVFP4_SHAPE's stage is no longer than K; the bucket's own shape's slice is one stage of
    # 128-column steps (4 warps x 8 steps = 1024 for bucket 8)
    assert gemv_config(128, 128, 8, 132, wb=0).slice_k == 128
    monkeypatch.setenv(NVFP4_SHAPE_ENV, "0")
    assert gemv_config(128, 128, 8, 132, wb=0).slice_k == 128 * SHAPE_BY_BUCKET[8][2]
    monkeypatch.delenv(NVFP4_SHAPE_ENV)
    # explicit shapes: the stage is 128 x steps x warps a row group
    c = gemv_config(1000, 4224, 8, 132, warps=8, tiles=1, stage_steps=2, splitk=3, kwarps=8, wb=0)
    assert (c.splitk, c.slice_k, c.kwarps) == (3, 2048, 8)
    # x rows padded by 64 bytes as bf16's (the four lanes of a row read 64 contiguous bytes), not FP8's 16
    assert x_pad(0) == x_pad(2) == 32 and x_pad(1) == 8
    assert smem_bytes(8, 2048, wb=0) == 8 * (2048 + 32) * 2 == smem_bytes(8, 2048)
    assert smem_bytes(8, 2048, "swiglu", wb=0) == 2 * smem_bytes(8, 2048, wb=0)


# -- specs -----------------------------------------------------------------------------------------------------------


def test_nvfp4_spec_params_values_and_name():
    for mb in BUCKETS:
        s = gemv_spec(3072, 2048, mb, H200, bias=True, residual=True, wb=WB_NVFP4)
        cfg = gemv_config(3072, 2048, mb, 132, wb=0)
        assert [(p.name, p.ctype) for p in s.params] == QUANT_PARAMS
        assert s.template == "kernel.cu" and s.value("WB") == 0 and s.value("PROLOGUE") == 0
        assert s.value("F16") is False  # the FP8 weights' choice; NVFP4 fragments are always f16 (XH)
        assert s.name.startswith(f"gemv_nvfp4w_n3072_k2048_m{mb}") and "nvfp4 weights" in s.doc
        assert spec_config(s) == cfg and s.smem == smem_bytes(mb, cfg.slice_k, wb=0)
        assert s.block == (32 * cfg.warps, 1, 1) and s.grid[0].const == -(-3072 // cfg.rows)
        assert s.grid[1].const == cfg.splitk
        # the configuration rebuilds the spec
        assert gemv_spec(3072, 2048, mb, H200, True, True, config=spec_config(s), wb=0).key == s.key
        # not the FP8 or bf16 variant of the same shape
        fp8 = gemv_spec(3072, 2048, mb, H200, bias=True, residual=True, wb=1)
        bf16 = gemv_spec(3072, 2048, mb, H200, bias=True, residual=True)
        assert fp8.name.startswith("gemv_fp8w_") and len({s.key, fp8.key, bf16.key}) == 3
        assert bf16.value("WB") == 2 and [(p.name, p.ctype) for p in bf16.params] == PARAMS
    # the variants take the quantized_linear launch's arguments: quant.cu's parameters by name
    assert QUANT_PARAMS == quant_rule.PARAMS


@pytest.mark.parametrize("k", [64, 192, 2112, 4160, 32])
def test_nvfp4_spec_rejects_k_off_the_steps(k):
    """K must be whole 128-column steps: FP8's 64-column ones (and bf16's 32) are not."""
    assert gemv_spec(512, k, 8, H200).value("K") == k  # whole bf16 steps
    with pytest.raises(ValueError, match=rf"K must be a multiple of 128 \(got {k}\)"):
        gemv_spec(512, k, 8, H200, wb=0)


def test_nvfp4_spec_rejects_what_it_cannot_run():
    for wb in (3, 4, -1):
        with pytest.raises(ValueError, match="wb"):
            gemv_spec(512, 128, 8, H200, wb=wb)
    with pytest.raises(ValueError, match="mb"):
        gemv_spec(512, 128, 12, H200, wb=0)


def test_prologues_and_rope_keep_nvfp4_weights():
    plain = gemv_spec(3072, 2048, 8, H200, wb=0)
    rms = fused_spec(plain, Prologue("rms_norm", eps=1e-5), H200)
    swi = fused_spec(gemv_spec(2048, 8192, 8, H200, residual=True, wb=0), Prologue("swiglu", alpha=1.0), H200)
    for s in (rms, swi):
        assert s.template == "kernel.cu" and s.value("WB") == 0 and s.value("WEIGHTS_FIRST")
        assert s.name.startswith("gemv_nvfp4w_") and s.value("F16") is False
    assert [(p.name, p.ctype) for p in rms.params] == QUANT_PARAMS + [("norm_weight", "ptr")]
    assert [(p.name, p.ctype) for p in swi.params] == QUANT_PARAMS
    assert rms.value("PROLOGUE") == PROLOGUES["rms_norm"] and rms.value("EPS") == 1e-5
    assert swi.value("PROLOGUE") == PROLOGUES["swiglu"] and swi.value("HAS_RESIDUAL")
    assert spec_config(rms) == spec_config(plain) and spec_config(rms).kwarps > 1  # the plain variant's row groups
    assert "_rms_norm" in rms.name and "_swiglu" in swi.name
    down = gemv_spec(2048, 8192, 8, H200, residual=True, wb=0)
    assert swi.smem == 2 * down.smem == 2 * smem_bytes(8, spec_config(down).slice_k, wb=0)  # up beside x
    # a row-group configuration whose 8192-column slice leaves no room for gate's and up's x slices: the swiglu
    # variant takes the rule's NVFP4 configuration without row groups
    wide = gemv_spec(2048, 8192, 8, H200, residual=True, wb=0,
                     config=gemv_config(2048, 8192, 8, 132, warps=4, stage_steps=8, kwarps=4, wb=0))
    assert spec_config(wide).slice_k == 8192 and spec_config(wide).kwarps == 4
    fallback = fused_spec(wide, Prologue("swiglu"), H200)
    assert fallback.value("WB") == 0 and spec_config(fallback) == gemv_config(2048, 8192, 8, 132, kwarps=1, wb=0)
    assert spec_config(fused_spec(wide, Prologue("rms_norm", 1e-5), H200)) == spec_config(wide)
    # the rope epilogue: the same configuration, prologue and weight type; its parameters after the variant's own
    rope = RopeEpilogue(32, 8, 64, False, 16)
    for base, params in ((plain, QUANT_PARAMS), (rms, QUANT_PARAMS + [("norm_weight", "ptr")])):
        r = with_rope(base, rope, H200)
        assert r.value("WB") == 0 and r.value("ROPE") and r.value("PROLOGUE") == base.value("PROLOGUE")
        assert [(p.name, p.ctype) for p in r.params] == params + ROPE_PARAMS
        assert spec_config(r) == spec_config(base) and r.value("WEIGHTS_FIRST") == base.value("WEIGHTS_FIRST")
        assert r.name.startswith("gemv_nvfp4w_n3072_k2048_m8") and r.name.endswith("_rope")


def test_is_plain():
    plain = gemv_spec(3072, 2048, 8, H200, wb=0)
    assert is_plain(plain)
    assert not is_plain(fused_spec(plain, Prologue("rms_norm", 1e-5), H200))
    assert not is_plain(fused_spec(plain, Prologue("swiglu"), H200))
    assert not is_plain(with_rope(plain, RopeEpilogue(32, 8, 64, False, 16), H200))
    assert not is_plain(quant_rule.quant_gemv_spec(3072, 2048, 8, H200, "nvfp4"))


# -- compile + SASS --------------------------------------------------------------------------------------------------


def _case(name: str, target: str):
    tgt = get_target(target)
    if name == "split-k":  # the 1B down projection at 32 tokens: split-K 8 x 1024, bias and residual
        return gemv_spec(2048, 8192, 32, tgt, bias=True, residual=True, wb=0)
    if name == "row-groups":  # qkv at 8 tokens: the rule's row groups over the whole of K
        return gemv_spec(3072, 2048, 8, tgt, wb=0)
    if name == "row-groups-split-k":  # 8 warps a row group, split-K 3, the last slice partly past K
        cfg = gemv_config(1000, 4224, 8, 132, warps=8, tiles=1, stage_steps=2, splitk=3, kwarps=8, wb=0)
        return gemv_spec(1000, 4224, 8, tgt, bias=True, residual=True, config=cfg, wb=0)
    if name == "two-tiles":  # 2 tiles a warp, row groups of 2 at 32 tokens
        cfg = gemv_config(3072, 2048, 32, 132, warps=8, tiles=2, stage_steps=2, splitk=1, kwarps=2, wb=0)
        return gemv_spec(3072, 2048, 32, tgt, bias=True, residual=True, config=cfg, wb=0)
    if name == "awkward":  # N not whole CTAs, K shorter than a stage, 64 tokens
        return gemv_spec(200, 256, 64, tgt, bias=True, residual=True, wb=0)
    if name == "rms_norm":
        return fused_spec(gemv_spec(3072, 2048, 8, tgt, wb=0), Prologue("rms_norm", eps=1e-5), tgt)
    if name == "swiglu":
        return fused_spec(gemv_spec(2048, 8192, 8, tgt, residual=True, wb=0), Prologue("swiglu"), tgt)
    assert name == "rms_norm-rope"
    plain = gemv_spec(3072, 2048, 8, tgt, wb=0)
    return with_rope(fused_spec(plain, Prologue("rms_norm", eps=1e-5), tgt), RopeEpilogue(32, 8, 64, False, 16), tgt)


CASES = ["split-k", "row-groups", "row-groups-split-k", "two-tiles", "awkward", "rms_norm", "swiglu", "rms_norm-rope"]


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("case", CASES)
def test_compiles_with_tensor_cores_and_wide_loads(target, case):
    tgt = get_target(target)
    spec = _case(case, target)
    assert spec.value("WB") == 0 and spec.value("F16") is False
    ops = sass_opcodes(spec, tgt.arch)
    assert any(o.startswith("LDG") and ".128" in o for o in ops), sorted(ops)  # 16-byte weight loads
    # the block scales: a lane's two bytes of a step, one 16-bit no-allocate load beside its 16 bytes of codes
    assert any(o.startswith("LDG") and ".NA." in o and ".U16" in o for o in ops), sorted(ops)
    # f16 MMAs (HMMA.16816.F32 is f16 x f16 -> f32; bf16's carries .BF16) on codes turned into f16 by bit operations
    # and multiplied by their block's scale (HMUL2), converted by the hardware (e4m3 -> f16); x staged as f16
    assert "HMMA.16816.F32" in ops and not any(o.startswith("HMMA.16816.F32.BF16") for o in ops), sorted(ops)
    assert "HMUL2" in ops and "F2FP.F16.E4M3.UNPACK_B" in ops and "F2FP.F16.F32.PACK_AB" in ops, sorted(ops)
    assert not any(o.startswith(("HMUL2.BF16", "HFMA2.BF16")) for o in ops), sorted(ops)  # not bf16 arithmetic
    assert_no_local_memory(ops, f"the NVFP4 GEMV ({case})")
    if spec.value("KW") > 1:
        assert any(o.startswith("BAR") for o in ops), sorted(ops)  # the row group's reduction through shared memory
    if spec.value("SPLITK") > 1:
        assert any(o.startswith(("ATOMG", "RED")) for o in ops), sorted(ops)  # the split-K counter
    kind = {0: "none", 1: "rms_norm", 2: "swiglu"}[spec.value("PROLOGUE")]
    if kind != "none":  # the first weight stage (and its scales) before the wait, x staged by cp.async
        assert W_FIRST in ops and SF_FIRST in ops and CP_ASYNC in ops, sorted(ops)
    assert ("MUFU.EX2" in ops) == (kind == "swiglu")
    if kind == "rms_norm":
        assert "SHFL.BFLY" in ops


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
def test_fused_nvfp4_variant_loads_its_first_weight_stage_before_the_wait(target):
    """As the bf16 and FP8 fused variants (tests/codegen/test_decode_fusion.py): the first stage's U steps x MT
    tiles x rows g, g + 8 of 16-byte e2m1 loads, and as many 16-bit block-scale loads, before the grid-dependency
    wait, x (cp.async) and the norm weight (16-byte coherent loads) after it. With the wait first
    (``weights_first=False``) every weight and scale load is a streamed one after the wait."""
    arch = get_target(target).arch
    spec = _case("rms_norm", target)
    u, mt, kw = spec.value("U"), spec.value("MT"), spec.value("KW")
    first = 2 * u * mt
    assert spec.value("WEIGHTS_FIRST") and kw > 1
    seq = sass_sequence(disassembled(compiled(spec), arch))
    check_pdl_order(seq, first, (CP_ASYNC, X_LOAD))
    wait = seq.index(WAIT)
    assert seq[:wait].count(SF_FIRST) >= first and SF_FIRST not in seq[wait:], seq[: wait + 1]
    late_spec = fused_spec(gemv_spec(3072, 2048, 8, get_target(target), wb=0), Prologue("rms_norm", eps=1e-5),
                           get_target(target), weights_first=False)
    late = sass_sequence(disassembled(compiled(late_spec), arch))
    assert late.index(WAIT) < late.index(W_NC) and late.index(WAIT) < late.index(SF_NC)
    assert W_FIRST not in late and SF_FIRST not in late


# -- routing: INGOT_GEMV_NVFP4 ---------------------------------------------------------------------------------------


def test_nvfp4_template_switch(monkeypatch):
    monkeypatch.delenv(quant_rule.NVFP4_ENV, raising=False)
    assert quant_rule.NVFP4_ENV == "INGOT_GEMV_NVFP4"
    assert quant_rule.nvfp4_template() == f"{quant_rule.NVFP4_DEFAULT}.cu" == "kernel.cu"
    for raw, want in (("", f"{quant_rule.NVFP4_DEFAULT}.cu"), ("kernel", "kernel.cu"), ("quant", "quant.cu"),
                      (" Kernel ", "kernel.cu"), ("QUANT", "quant.cu")):
        monkeypatch.setenv(quant_rule.NVFP4_ENV, raw)
        assert quant_rule.nvfp4_template() == want, raw
    for bad in ("bulk", "1", "kernel.cu", "fp8"):
        monkeypatch.setenv(quant_rule.NVFP4_ENV, bad)
        with pytest.raises(ValueError, match="INGOT_GEMV_NVFP4"):
            quant_rule.nvfp4_template()


@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("epilogue", ["plain", "bias+residual"])
def test_weight_only_nvfp4_routes_by_the_switch(target, epilogue, monkeypatch):
    tgt = get_target(target)
    has = epilogue != "plain"
    op, ins = qtypes("nvfp4", 3072, 2048, bias=has, residual=has)
    assert quant_rule.quant_applies(op, ins, tgt) is not None
    monkeypatch.setenv(quant_rule.NVFP4_ENV, "kernel")
    found = variants(op, ins, tgt)
    assert [mb for mb, _ in found] == list(BUCKETS)
    for mb, s in found:
        assert s.template == "kernel.cu" and s.value("WB") == WB_NVFP4 and s.arch == tgt.arch
        assert s.key == gemv_spec(3072, 2048, mb, tgt, bias=has, residual=has, wb=WB_NVFP4).key
        assert [p.name for p in s.params] == [p for p, _ in quant_rule.PARAMS]
        assert is_plain(s)
    assert [s.key for _, s in quant_rule.quant_variants(op, ins, tgt)] == [s.key for _, s in found]
    (any_m,) = quant_rule.quant_plan(op, ins, tgt)  # the node's own any-M launch stays quant.cu
    assert any_m.template == "quant.cu" and any_m.value("ANY_M")
    monkeypatch.setenv(quant_rule.NVFP4_ENV, "quant")
    found = variants(op, ins, tgt)
    assert [mb for mb, _ in found] == list(BUCKETS)
    assert all(s.template == "quant.cu" and s.value("WFMT") == quant_rule.WEIGHT_FORMATS["nvfp4"]
               and s.value("AFMT") == 0 for _, s in found)
    monkeypatch.delenv(quant_rule.NVFP4_ENV)  # the default: kernel.cu
    assert [s.key for _, s in variants(op, ins, tgt)] == [s.key for _, s in quant_rule.quant_variants(op, ins, tgt)]
    assert all(s.template == "kernel.cu" and s.value("WB") == WB_NVFP4 for _, s in variants(op, ins, tgt))
    monkeypatch.setenv(quant_rule.NVFP4_ENV, "bad")
    with pytest.raises(ValueError, match="INGOT_GEMV_NVFP4"):
        variants(op, ins, tgt)


def test_the_switches_route_their_own_format(monkeypatch):
    """``INGOT_GEMV_NVFP4`` moves NVFP4 weight-only buckets only, ``INGOT_GEMV_FP8`` FP8 ones only; FP8 activations
    stay on quant.cu with either; ``INGOT_GEMV_BULK=all`` (bulk.cu's FP8 variants) leaves NVFP4 as the switch says."""
    nvfp4 = qtypes("nvfp4", 3072, 2048)
    fp8 = qtypes("fp8", 3072, 2048)
    fp8_act = qtypes("fp8", 3072, 2048, "fp8", "token")

    def templates(qt):
        return {s.template for _, s in variants(*qt, H200)}

    for fp8_choice in ("kernel", "quant"):
        monkeypatch.setenv(quant_rule.FP8_ENV, fp8_choice)
        for nvfp4_choice in ("kernel", "quant"):
            monkeypatch.setenv(quant_rule.NVFP4_ENV, nvfp4_choice)
            assert templates(nvfp4) == {f"{nvfp4_choice}.cu"}, (fp8_choice, nvfp4_choice)
            assert templates(fp8) == {f"{fp8_choice}.cu"}, (fp8_choice, nvfp4_choice)
            assert templates(fp8_act) == {"quant.cu"}
    monkeypatch.setenv(quant_rule.NVFP4_ENV, "kernel")
    monkeypatch.setenv(bulk_rule.ENV, "all")
    assert all(s.template == "kernel.cu" and s.value("WB") == 0 for _, s in variants(*nvfp4, H200))


@pytest.mark.parametrize("k", [2112, 4160])
def test_nvfp4_k_off_the_steps_is_not_routed(k, monkeypatch):
    """A K that is not whole 128-column steps: ``quant_applies`` declines the node (no variants at all), so
    ``INGOT_GEMV_NVFP4=kernel`` never asks ``gemv_spec`` for a variant it rejects."""
    op, ins = qtypes("nvfp4", 512, k)
    monkeypatch.setenv(quant_rule.NVFP4_ENV, "kernel")
    assert quant_rule.quant_applies(op, ins, H200) is None
    assert variants(op, ins, H200) == []


# -- autotuning ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,k,mb", [(3072, 2048, 8), (2048, 8192, 16), (1000, 4224, 32)])
def test_autotune_workloads_and_candidates(n, k, mb):
    spec = gemv_spec(n, k, mb, H200, bias=mb != 8, residual=mb != 8, wb=0)
    t = at.tunable_for(spec)
    assert t is not None and t.workloads is tune.workloads
    loads = tune.workloads(spec, {})
    lower = max([b for b in BUCKETS if b < mb], default=0) + 1
    assert [w.ints for w in loads] == [{"M": lower}, {"M": mb}]
    ptrs = {p.name for p in spec.params if p.ctype == "ptr"}
    for w in loads:
        m = w.ints["M"]
        assert w.buffers["weight"] == ("uint8", (n, k // 2))
        assert w.buffers["weight_scale"] == ("float8_e4m3fn", (n, k // 16))
        assert w.buffers["weight_scale_2"] == ("float32", (1,))
        assert w.buffers["x"] == ("bfloat16", (m, k)) and w.buffers["out"] == ("bfloat16", (m, n))
        assert ("bias" in w.buffers) == ("residual" in w.buffers) == (mb != 8)
        assert set(w.buffers) <= ptrs and "input_scale" not in w.buffers
        assert set(w.rotate) == {"weight", "weight_scale"}  # the block scales stream from HBM with the codes
        arrays = w.fill(rng())
        assert {name: (a.dtype.name, a.shape) for name, a in arrays.items()} == dict(w.buffers)
        assert np.isfinite(arrays["weight_scale"].astype(np.float32)).all() and (arrays["weight_scale_2"] > 0).all()
    # quant.cu's NVFP4 variant of the same shape takes the same buffers
    quant = quant_rule.quant_gemv_spec(n, k, mb, H200, "nvfp4", bias=mb != 8, residual=mb != 8)
    assert [w.buffers for w in tune.workloads(quant, {})] == [w.buffers for w in loads]
    cands = tune.bf16_candidates(spec, H200)
    assert cands[0] == spec and len(at.dedupe(cands)) >= 3
    for c in cands:
        assert c.template == "kernel.cu" and c.value("WB") == 0 and c.params == spec.params
        assert spec_config(c) == gemv_config(n, k, mb, 132, warps=c.value("WARPS"), tiles=c.value("MT"),
                                             stage_steps=c.value("U"), splitk=c.value("SPLITK"),
                                             kwarps=c.value("KW"), wb=0)
        fixed = {key: v for key, v in c.values if key not in t.knobs}
        assert fixed == {key: v for key, v in spec.values if key not in t.knobs}
    assert [c.key for c in at.candidates(spec, H200)] == [c.key for c in at.dedupe(cands)]


# -- the conversion's arithmetic, emulated ------------------------------------------------------------------------


def _byte_perm_spread(x: np.ndarray, hi: bool) -> np.ndarray:
    """``__byte_perm(x, 0, 0x1404)`` (``hi``: ``0x3424``): bytes 0, 1 (2, 3) of x into the high bytes of two f16
    halves, low bytes zero."""
    b0, b1 = (x >> (16 if hi else 0)) & 0xFF, (x >> (24 if hi else 8)) & 0xFF
    return ((b0 << 8) | (b1 << 24)).astype(np.uint32)


def _e2m1x8_f16(v: np.ndarray, sf: np.ndarray) -> np.ndarray:
    """kernel.cu's ``gemv_e2m1x8_f16`` in numpy, word by word: [n] u32 words, [n] f16 block scales -> [n, 8] f16 in
    the fragments' order (n0, n2, n4, n6, n1, n3, n5, n7); ``mul.rn.f16x2`` as numpy's f16 multiply (both IEEE
    round to nearest even, subnormals kept)."""
    v = v.astype(np.uint32)
    e = ((v << 1) & 0x0E0E0E0E) | ((v << 4) & 0x80808080)
    d = ((v >> 3) & 0x0E0E0E0E) | (v & 0x80808080)
    words = [_byte_perm_spread(e, False), _byte_perm_spread(e, True), _byte_perm_spread(d, False),
             _byte_perm_spread(d, True)]
    halves = np.stack(words, axis=1).view(np.uint16).reshape(len(v), 8)  # little-endian: low half first
    return halves.view(np.float16) * sf.astype(np.float16)[:, None]


def test_e2m1_to_f16_is_exact_for_every_code_and_scale():
    """Every e2m1 code in every nibble of a word, under every finite e4m3 block scale (subnormals and 448 included):
    the emulated conversion gives e2m1 * sf * 2^-14 exactly (the claim kernel.cu's header makes), in the pairs'
    order the staged x follows."""
    import ml_dtypes

    from ingot.ir.quant.packing import unpack_e2m1

    r = rng()
    words = [r.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)]
    for pos in range(8):  # each code at each nibble, the rest random
        base = r.integers(0, 2**32, 16, dtype=np.uint64).astype(np.uint32)
        words.append((base & ~np.uint32(0xF << (4 * pos))) | (np.arange(16, dtype=np.uint32) << (4 * pos)))
    v = np.concatenate(words)
    codes = np.arange(256, dtype=np.uint8)
    sf_all = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    finite = np.isfinite(sf_all)
    assert finite.sum() == 254 and sf_all[finite].max() == 448 and sf_all[1] == 2.0 ** -9  # NaNs: 0x7F, 0xFF
    values = unpack_e2m1(v.view(np.uint8).reshape(len(v), 4)).astype(np.float64)  # [n, 8]: n0..n7
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    for code in codes[finite]:
        sf = np.full(len(v), sf_all[code])
        got = _e2m1x8_f16(v, sf).astype(np.float64)
        want = values[:, order] * sf_all[code] * 2.0 ** -14
        assert np.array_equal(got, want), f"scale code {code:#04x} ({sf_all[code]})"
