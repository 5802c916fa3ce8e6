"""The decode GEMV's FP8-weight variants (``codegen/kernels/gemv/kernel.cu`` with ``WB`` 1: e4m3 weights, an f32
scale per output channel) without a GPU: their configurations (64-column steps), specs (``quantized_linear``'s
parameters, kept through the prologues and the rope epilogue), compile + SASS checks for sm_90a and sm_100a, which
``quantized_linear`` nodes ``INGOT_GEMV_FP8`` routes to them, what autotuning times them on, and the tiny quantized
Llama lowered for h200 with them (``fp8:wo``; and ``nvfp4:wo`` with ``INGOT_GEMV_NVFP4=kernel``, the same lowering
on kernel.cu's NVFP4 variants): its rms_norms, swiglus and rope launches fused into the quantized linears' decode
variants, in the default prefill path (dequantize + GEMM launch whose variants have their own arguments) and without
it (``INGOT_QUANT_PREFILL_GEMM=0``). GPU runs of the template: not here."""

from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np
import pytest

from ingot.codegen import autotune as at
from ingot.codegen import decode_fusion, quant_prefill
from ingot.codegen.kernels.gemv import bulk_rule, quant_rule, skinny_rule, tune
from ingot.codegen.kernels.gemv.rule import (
    BUCKETS,
    CLUSTER_ENV,
    F16_BUCKETS,
    FP8_SHAPE,
    FP8_SHAPE_ENV,
    KW_BUCKETS,
    KW_ENV,
    KW_SHAPE,
    MIN_SLICE,
    PARAMS,
    PROLOGUES,
    QUANT_PARAMS,
    ROPE_PARAMS,
    SHAPE_BY_BUCKET,
    SMEM_BUDGET,
    WB_NVFP4,
    WB_STEP_COLS,
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
from ingot.codegen.memory_plan import plan_memory
from ingot.codegen.target import get_target
from ingot.runtime.artifact import load_graph
from ingot.runtime.paged import PagedModel
from tests.codegen import test_lower_quant
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    compiled,
    disassembled,
    module_kernel_cache,
    needs_compiler,
    sass_opcodes,
)
from tests.codegen.test_decode_fusion import CP_ASYNC, W_FIRST, X_LOAD, check_pdl_order, sass_sequence
from tests.codegen.test_gemv_quant import qtypes
from tests.codegen.test_lower_quant import compile_quant
from tests.helpers import rng, session_cache_dir

H200 = get_target("h200")
#: the Llama-3.2-1B layer shapes (qkv, o, gate_up, down, lm_head), and awkward ones with K a whole number of 64-column
#: steps: K below a stage, N not a multiple of a CTA's rows, a partial last slice (4160 = 65 steps)
SHAPES_1B = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)]
SHAPES = SHAPES_1B + [(576, 576), (200, 192), (1000, 4160), (64, 64), (100, 640)]
#: the tiny quantized Llama's checkpoint (a module-scoped fixture)
ckpt = test_lower_quant.ckpt


@pytest.fixture(autouse=True)
def _switches(monkeypatch):
    """The rule's defaults whatever the developer's environment: row groups on, no bulk copies, ``INGOT_GEMV_FP8``
    unset (the tests that route set it themselves); kernel.cu's FP8 variants at every bucket (the skinny GEMM's FP8
    variants, the default from bucket 16 on sm_90a, are test_gemv_skinny.py's)."""
    for name in (KW_ENV, bulk_rule.ENV, quant_rule.FP8_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(skinny_rule.FP8_ENV, "0")
    # the workspace split-K and row groups these tests were written for (INGOT_GEMV_CLUSTER=0); the cluster
    # reduction, the default, has its own: test_gemv_cluster.py / test_gemv_cluster_gpu.py
    monkeypatch.setenv(CLUSTER_ENV, "0")


# -- configurations --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("mb", BUCKETS)
def test_config_covers_k_and_fits(n, k, mb):
    c = gemv_config(n, k, mb, 132, wb=1)
    cw = WB_STEP_COLS[1]
    assert cw == 64
    assert c.slice_k % (cw * c.stage_steps * c.kwarps) == 0  # each warp of a row group: whole stages of 64 columns
    assert c.splitk * c.slice_k >= k > (c.splitk - 1) * c.slice_k
    assert smem_bytes(mb, c.slice_k, wb=1) <= SMEM_BUDGET and kw_fits(mb, c, wb=1)
    assert c.warps % c.kwarps == 0 and c.rows == 16 * c.tiles * c.warps // c.kwarps
    # split slices are at least the bf16 rule's smallest slice in bytes of a row (MIN_SLICE bf16 columns)
    assert c.splitk == 1 or c.slice_k >= 2 * MIN_SLICE
    assert c.kwarps == 1 or mb in KW_BUCKETS


#: the 1B model's layer GEMVs with FP8 weights (N, K) -> (warps a row group, split-K) in bucket 8, as with bf16
#: weights: qkv and o get 16-row CTAs whose 4 warps split the whole of K; down's x slice (8192 columns, bf16) is over
#: KW_MAX_X, so split-K 8; gate_up and the lm_head have rows enough
ROW_GROUPS = {(3072, 2048): (4, 1), (2048, 2048): (4, 1), (2048, 8192): (1, 8), (16384, 2048): (1, 1),
              (128256, 2048): (1, 1)}


@pytest.mark.parametrize("n,k", SHAPES_1B)
def test_row_groups_as_with_bf16_weights(n, k, monkeypatch):
    monkeypatch.delenv(KW_ENV, raising=False)
    kw, split = ROW_GROUPS[(n, k)]
    c = gemv_config(n, k, 8, 132, wb=1)
    assert (c.kwarps, c.splitk) == (kw, split), c
    if kw > 1:
        assert (c.warps, c.tiles, c.stage_steps) == KW_SHAPE, c
    else:  # FP8_SHAPE (test_fp8_shape)
        assert (c.warps, c.tiles) == FP8_SHAPE[8][:2], c
    if kw > 1:
        assert c.slice_k == k and c.rows == 16
    spec = gemv_spec(n, k, 8, H200, wb=1)
    assert spec.value("KW") == kw and spec_config(spec) == c and spec.value("WB") == 1
    assert spec.grid[0].const * spec.grid[1].const >= 0.9 * 132  # CTAs: at least 0.9 an SM
    monkeypatch.setenv(KW_ENV, "0")  # none: the rule's configuration without row groups
    off = gemv_config(n, k, 8, 132, wb=1)
    assert off.kwarps == 1 and off == gemv_config(n, k, 8, 132, kwarps=1, wb=1)


#: the 1B model's FP8 GEMVs in bucket 8 with the cluster on (the default): (split-K, steps a stage, in a cluster) with
#: FP8_SHAPE's 8 warps. qkv and o: 24 / 16 row blocks of 128 rows, K in 4 slices of one 512-column stage; gate_up: 128
#: row blocks, no split; down: 16 x 8 slices of 1024; the lm_head: 1002 row blocks, 4 steps a stage
FP8_SHAPED = {(3072, 2048): (4, 8, True), (2048, 2048): (4, 8, True), (16384, 2048): (1, 8, False),
              (2048, 8192): (8, 8, True), (128256, 2048): (1, 4, False)}


@pytest.mark.parametrize("n,k", SHAPES_1B + [(576, 576), (1000, 4160), (64, 64)])
def test_fp8_shape(n, k, monkeypatch):
    """FP8 weights in bucket 8 without row groups take FP8_SHAPE: 8 warps, 8 steps a stage for at most one row block
    an SM (else 4), K split as the bucket's own shape splits it until the CTAs FP8_SHAPE aims at, in a cluster where
    one fits; INGOT_GEMV_FP8_SHAPE=0 gives the bucket's own shape back; bf16 weights and other buckets are not
    touched."""
    monkeypatch.delenv(CLUSTER_ENV)
    warps, tiles, per_sm = FP8_SHAPE[8]
    c = gemv_config(n, k, 8, 132, wb=1)
    assert (c.warps, c.tiles, c.kwarps) == (warps, tiles, 1), c
    blocks = -(-n // (16 * warps * tiles))
    assert c.stage_steps == (8 if blocks <= 132 else 4), c
    assert c.splitk * c.slice_k >= k > (c.splitk - 1) * c.slice_k and c.slice_k % (64 * c.stage_steps) == 0
    if c.splitk > 1:  # split only while short of the CTAs
        assert blocks * c.splitk // 2 < per_sm * 132
    if (n, k) in FP8_SHAPED:
        assert (c.splitk, c.stage_steps, c.cluster) == FP8_SHAPED[(n, k)], c
    spec = gemv_spec(n, k, 8, H200, wb=1)
    assert spec_config(spec) == c and spec.value("WARPS") == warps
    other, bf16 = gemv_config(n, k, 16, 132, wb=1), gemv_config(n, k, 8, 132)
    monkeypatch.setenv(FP8_SHAPE_ENV, "0")
    off = gemv_config(n, k, 8, 132, wb=1)
    assert (off.warps, off.tiles, off.stage_steps) == SHAPE_BY_BUCKET[8] and off != c
    assert gemv_config(n, k, 16, 132, wb=1) == other
    monkeypatch.setenv(FP8_SHAPE_ENV, "yes")
    with pytest.raises(ValueError, match=FP8_SHAPE_ENV):
        gemv_config(n, k, 8, 132, wb=1)
    assert gemv_config(n, k, 8, 132) == bf16  # bf16 weights: the switch is not read


def test_fp8_steps_are_64_columns():
    """A step is 16 bytes a lane (64 bytes of a row) with either weight type: FP8 slices, stages and the smallest
    split slice are in 64-column units where bf16's are in 32-column ones."""
    # qkv at 16 tokens: bf16 splits K 8 x 256 (its smallest slice), FP8 4 x 512 (the same 512 bytes a row)
    assert (gemv_config(3072, 2048, 16, 132).splitk, gemv_config(3072, 2048, 16, 132).slice_k) == (8, 256)
    c = gemv_config(3072, 2048, 16, 132, wb=1)
    assert (c.splitk, c.slice_k) == (4, 512)
    # a K of one step: the slice is one stage of 64-column steps (4 warps x 8 steps = 512 for bucket 8)
    assert gemv_config(64, 64, 8, 132, wb=1).slice_k == 64 * SHAPE_BY_BUCKET[8][2]
    assert gemv_config(64, 64, 8, 132).slice_k == 32 * SHAPE_BY_BUCKET[8][2]
    # explicit shapes: the stage is 64 x steps x warps a row group
    c = gemv_config(1000, 4160, 8, 132, warps=8, tiles=1, stage_steps=4, splitk=3, kwarps=8, wb=1)
    assert (c.splitk, c.slice_k, c.kwarps) == (3, 2048, 8)
    assert x_pad(1) == 8 and x_pad(2) == 32 and x_pad() == 32
    assert smem_bytes(8, 2048, wb=1) == 8 * (2048 + 8) * 2 and smem_bytes(8, 2048) == 8 * (2048 + 32) * 2
    assert smem_bytes(8, 2048, "swiglu", wb=1) == 2 * smem_bytes(8, 2048, wb=1)


# -- specs -----------------------------------------------------------------------------------------------------------


def test_fp8_spec_params_values_and_name():
    for mb in BUCKETS:
        s = gemv_spec(3072, 2048, mb, H200, bias=True, residual=True, wb=1)
        cfg = gemv_config(3072, 2048, mb, 132, wb=1)
        assert [(p.name, p.ctype) for p in s.params] == QUANT_PARAMS
        assert s.template == "kernel.cu" and s.value("WB") == 1 and s.value("PROLOGUE") == 0
        assert s.name.startswith(f"gemv_fp8w_n3072_k2048_m{mb}") and "fp8 weights" in s.doc
        assert spec_config(s) == cfg and s.smem == smem_bytes(mb, cfg.slice_k, wb=1)
        assert s.block == (32 * cfg.warps, 1, 1) and s.grid[0].const == -(-3072 // cfg.rows)
        assert s.grid[1].const == cfg.splitk
        # the configuration rebuilds the spec
        assert gemv_spec(3072, 2048, mb, H200, True, True, config=spec_config(s), wb=1).key == s.key
        bf16 = gemv_spec(3072, 2048, mb, H200, bias=True, residual=True)
        assert bf16.value("WB") == 2 and [(p.name, p.ctype) for p in bf16.params] == PARAMS
        assert bf16.name.startswith("gemv_bf16_") and bf16.key != s.key
    # the variants take the quantized_linear launch's arguments: quant.cu's parameters by name
    assert QUANT_PARAMS == quant_rule.PARAMS


def test_fp8_spec_rejects_what_it_cannot_run():
    assert gemv_spec(512, 96, 8, H200).value("K") == 96  # 3 bf16 steps
    for k in (96, 2080, 32):  # whole 32-column steps, not 64-column ones
        with pytest.raises(ValueError, match="multiple of 64"):
            gemv_spec(512, k, 8, H200, wb=1)
    for wb in (-1, 3, 4):  # 0 is NVFP4 (tests/codegen/test_gemv_nvfp4.py)
        with pytest.raises(ValueError, match="wb"):
            gemv_spec(512, 128, 8, H200, wb=wb)
    with pytest.raises(ValueError, match="mb"):
        gemv_spec(512, 128, 12, H200, wb=1)


def test_prologues_and_rope_keep_fp8_weights():
    plain = gemv_spec(3072, 2048, 8, H200, wb=1)
    rms = fused_spec(plain, Prologue("rms_norm", eps=1e-5), H200)
    swi = fused_spec(gemv_spec(2048, 8192, 8, H200, residual=True, wb=1), Prologue("swiglu", alpha=1.0), H200)
    for s in (rms, swi):
        assert s.template == "kernel.cu" and s.value("WB") == 1 and s.value("WEIGHTS_FIRST")
        assert s.name.startswith("gemv_fp8w_")
    assert [(p.name, p.ctype) for p in rms.params] == QUANT_PARAMS + [("norm_weight", "ptr")]
    assert [(p.name, p.ctype) for p in swi.params] == QUANT_PARAMS
    assert rms.value("PROLOGUE") == PROLOGUES["rms_norm"] and rms.value("EPS") == 1e-5
    assert swi.value("PROLOGUE") == PROLOGUES["swiglu"] and swi.value("HAS_RESIDUAL")
    assert spec_config(rms) == spec_config(plain) and spec_config(rms).kwarps == 4  # the plain variant's row groups
    assert "_rms_norm" in rms.name and "_swiglu" in swi.name
    down = gemv_spec(2048, 8192, 8, H200, residual=True, wb=1)
    assert swi.smem == 2 * down.smem == 2 * smem_bytes(8, spec_config(down).slice_k, wb=1)  # up beside x
    # a row-group configuration whose 8192-column slice leaves no room for gate's and up's x slices: the swiglu
    # variant takes the rule's FP8 configuration without row groups
    wide = gemv_spec(2048, 8192, 8, H200, residual=True, wb=1,
                     config=gemv_config(2048, 8192, 8, 132, warps=4, stage_steps=8, kwarps=4, wb=1))
    assert spec_config(wide).slice_k == 8192 and spec_config(wide).kwarps == 4
    fallback = fused_spec(wide, Prologue("swiglu"), H200)
    assert fallback.value("WB") == 1 and spec_config(fallback) == gemv_config(2048, 8192, 8, 132, kwarps=1, wb=1)
    assert spec_config(fused_spec(wide, Prologue("rms_norm", 1e-5), H200)) == spec_config(wide)
    # the rope epilogue: the same configuration, prologue and weight type; its parameters after the variant's own
    rope = RopeEpilogue(32, 8, 64, False, 16)
    for base, params in ((plain, QUANT_PARAMS), (rms, QUANT_PARAMS + [("norm_weight", "ptr")])):
        r = with_rope(base, rope, H200)
        assert r.value("WB") == 1 and r.value("ROPE") and r.value("PROLOGUE") == base.value("PROLOGUE")
        assert [(p.name, p.ctype) for p in r.params] == params + ROPE_PARAMS
        assert spec_config(r) == spec_config(base) and r.value("WEIGHTS_FIRST") == base.value("WEIGHTS_FIRST")
        assert r.name.startswith("gemv_fp8w_n3072_k2048_m8") and r.name.endswith("_rope")


def test_is_plain():
    plain = gemv_spec(3072, 2048, 8, H200, wb=1)
    assert is_plain(plain) and is_plain(gemv_spec(3072, 2048, 8, H200))
    assert not is_plain(fused_spec(plain, Prologue("rms_norm", 1e-5), H200))
    assert not is_plain(fused_spec(plain, Prologue("swiglu"), H200))
    assert not is_plain(with_rope(plain, RopeEpilogue(32, 8, 64, False, 16), H200))
    bulk_fp8 = bulk_rule.bulk_quant_spec(3072, 2048, 8, H200)
    assert bulk_fp8 is not None and bulk_fp8.template == "bulk.cu" and bulk_fp8.value("WB") == 1
    assert not is_plain(bulk_fp8)
    bulk_bf16 = bulk_rule.bulk_spec(3072, 2048, 8, H200)
    assert bulk_bf16 is not None and is_plain(bulk_bf16)
    assert not is_plain(quant_rule.quant_gemv_spec(3072, 2048, 8, H200, "fp8"))
    with pytest.raises(ValueError, match="not a plain"):
        fused_spec(bulk_fp8, Prologue("rms_norm", 1e-5), H200)


# -- compile + SASS --------------------------------------------------------------------------------------------------


def _case(name: str, target: str):
    tgt = get_target(target)
    if name == "split-k":  # the 1B down projection at 32 tokens: split-K 8 x 1024, bias and residual
        return gemv_spec(2048, 8192, 32, tgt, bias=True, residual=True, wb=1)
    if name == "row-groups":  # qkv at 8 tokens: 4 warps a row group over the whole of K
        return gemv_spec(3072, 2048, 8, tgt, wb=1)
    if name == "row-groups-split-k":  # 8 warps a row group, split-K 3, the last slice partly past K
        cfg = gemv_config(1000, 4160, 8, 132, warps=8, tiles=1, stage_steps=4, splitk=3, kwarps=8, wb=1)
        return gemv_spec(1000, 4160, 8, tgt, bias=True, residual=True, config=cfg, wb=1)
    if name == "awkward":  # N not whole CTAs, K shorter than a stage, 64 tokens
        return gemv_spec(200, 192, 64, tgt, bias=True, residual=True, wb=1)
    if name == "rms_norm":
        return fused_spec(gemv_spec(3072, 2048, 8, tgt, wb=1), Prologue("rms_norm", eps=1e-5), tgt)
    if name == "swiglu":
        return fused_spec(gemv_spec(2048, 8192, 8, tgt, residual=True, wb=1), Prologue("swiglu"), tgt)
    assert name == "rms_norm-rope"
    plain = gemv_spec(3072, 2048, 8, tgt, wb=1)
    return with_rope(fused_spec(plain, Prologue("rms_norm", eps=1e-5), tgt), RopeEpilogue(32, 8, 64, False, 16), tgt)


CASES = ["split-k", "row-groups", "row-groups-split-k", "awkward", "rms_norm", "swiglu", "rms_norm-rope"]


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("case", CASES)
def test_compiles_with_tensor_cores_and_wide_loads(target, case):
    tgt = get_target(target)
    spec = _case(case, target)
    assert spec.value("WB") == 1 and spec.value("F16") == (spec.value("MB") in F16_BUCKETS) and F16_BUCKETS == (8,)
    ops = sass_opcodes(spec, tgt.arch)
    assert any(o.startswith("LDG") and ".128" in o for o in ops), sorted(ops)  # 16-byte weight loads
    bf16_route = any(o.startswith(("HMUL2.BF16", "HFMA2.BF16")) for o in ops)
    if spec.value("F16"):  # bucket 8 (rule.F16_BUCKETS)
        # f16 MMAs (HMMA.16816.F32 is f16 x f16 -> f32; bf16's carries .BF16) on codes turned into f16 by the
        # hardware's conversion, x staged as f16; not the bf16 route's bit operations and exact 2^120 multiply
        assert "HMMA.16816.F32" in ops and not any(o.startswith("HMMA.16816.F32.BF16") for o in ops), sorted(ops)
        assert "F2FP.F16.E4M3.UNPACK_B" in ops and "F2FP.F16.F32.PACK_AB" in ops and not bf16_route, sorted(ops)
    else:
        # bf16 MMAs on the converted weights: the bytes spread by PRMT, one exact bf16x2 multiply by 2^120
        assert any(o.startswith("HMMA.16816.F32.BF16") for o in ops), sorted(ops)
        assert "PRMT" in ops and bf16_route and "F2FP.F16.E4M3.UNPACK_B" not in ops, sorted(ops)
    assert_no_local_memory(ops, f"the FP8 GEMV ({case})")
    if spec.value("KW") > 1:
        assert any(o.startswith("BAR") for o in ops), sorted(ops)  # the row group's reduction through shared memory
    if spec.value("SPLITK") > 1:
        assert any(o.startswith(("ATOMG", "RED")) for o in ops), sorted(ops)  # the split-K counter
    kind = {0: "none", 1: "rms_norm", 2: "swiglu"}[spec.value("PROLOGUE")]
    if kind != "none":  # the first weight stage before the wait, x staged by cp.async
        assert W_FIRST in ops and CP_ASYNC in ops, sorted(ops)
    assert ("MUFU.EX2" in ops) == (kind == "swiglu")
    if kind == "rms_norm":
        assert "SHFL.BFLY" in ops


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
def test_fused_fp8_variant_loads_its_first_weight_stage_before_the_wait(target):
    """As the bf16 fused variants (tests/codegen/test_decode_fusion.py): the first stage's 8 steps x rows g, g + 8 of
    16-byte e4m3 loads before the grid-dependency wait (the whole of a warp's part of K: one stage of 64-column
    steps), x (cp.async) and the norm weight (16-byte coherent loads) after it."""
    spec = _case("rms_norm", target)
    assert (spec.value("U"), spec.value("MT"), spec.value("KW")) == (8, 1, 4)
    seq = sass_sequence(disassembled(compiled(spec), get_target(target).arch))
    check_pdl_order(seq, 16, (CP_ASYNC, X_LOAD))


# -- routing: INGOT_GEMV_FP8 -----------------------------------------------------------------------------------------


def test_fp8_template_switch(monkeypatch):
    monkeypatch.delenv(quant_rule.FP8_ENV, raising=False)
    assert quant_rule.FP8_ENV == "INGOT_GEMV_FP8"
    assert quant_rule.fp8_template() == f"{quant_rule.FP8_DEFAULT}.cu" == "kernel.cu"  # measured faster: PERF.md
    for raw, want in (("", f"{quant_rule.FP8_DEFAULT}.cu"), ("kernel", "kernel.cu"), ("quant", "quant.cu"),
                      (" Kernel ", "kernel.cu")):
        monkeypatch.setenv(quant_rule.FP8_ENV, raw)
        assert quant_rule.fp8_template() == want, raw
    for bad in ("bulk", "1", "kernel.cu"):
        monkeypatch.setenv(quant_rule.FP8_ENV, bad)
        with pytest.raises(ValueError, match="INGOT_GEMV_FP8"):
            quant_rule.fp8_template()


@pytest.mark.parametrize("target", ["h200", "b200"])
def test_weight_only_fp8_routes_by_the_switch(target, monkeypatch):
    tgt = get_target(target)
    monkeypatch.delenv(bulk_rule.ENV, raising=False)
    op, ins = qtypes("fp8", 3072, 2048, bias=True, residual=True)
    monkeypatch.setenv(quant_rule.FP8_ENV, "kernel")
    found = variants(op, ins, tgt)
    assert [mb for mb, _ in found] == list(BUCKETS)
    for mb, s in found:
        assert s.template == "kernel.cu" and s.value("WB") == 1 and s.arch == tgt.arch
        assert s.key == gemv_spec(3072, 2048, mb, tgt, bias=True, residual=True, wb=1).key
        assert [p.name for p in s.params] == [p for p, _ in quant_rule.PARAMS]
    (any_m,) = quant_rule.quant_plan(op, ins, tgt)  # the node's own any-M launch stays quant.cu
    assert any_m.template == "quant.cu" and any_m.value("ANY_M")
    monkeypatch.setenv(quant_rule.FP8_ENV, "quant")
    found = variants(op, ins, tgt)
    assert [mb for mb, _ in found] == list(BUCKETS)
    assert all(s.template == "quant.cu" and s.value("WFMT") == 0 and s.value("AFMT") == 0 for _, s in found)
    monkeypatch.delenv(quant_rule.FP8_ENV)  # the default: kernel.cu
    assert [s.template for _, s in variants(op, ins, tgt)] == ["kernel.cu"] * len(BUCKETS)


@pytest.mark.parametrize("fmt,act,gran", [("fp8", "fp8", "token"), ("fp8", "fp8", "tensor"),
                                          ("nvfp4", "none", "token")])
def test_fp8_activations_and_nvfp4_stay_on_quant_cu(fmt, act, gran, monkeypatch):
    """``INGOT_GEMV_FP8`` leaves FP8 activations and NVFP4 weights where they are (NVFP4 with
    ``INGOT_GEMV_NVFP4=quant``: its own switch, tests/codegen/test_gemv_nvfp4.py)."""
    monkeypatch.delenv(bulk_rule.ENV, raising=False)
    monkeypatch.setenv(quant_rule.NVFP4_ENV, "quant")
    op, ins = qtypes(fmt, 3072, 2048, act, gran)
    got = {}
    for choice in ("kernel", "quant"):
        monkeypatch.setenv(quant_rule.FP8_ENV, choice)
        found = variants(op, ins, H200)
        assert [mb for mb, _ in found] == list(BUCKETS)
        assert all(s.template == "quant.cu" for _, s in found), [s.entry for _, s in found]
        got[choice] = [s.key for _, s in found]
    assert got["kernel"] == got["quant"]


def test_bulk_all_still_takes_fp8_weight_only(monkeypatch):
    """``INGOT_GEMV_BULK=all`` asks for bulk.cu's FP8 variants: it wins over ``INGOT_GEMV_FP8=kernel`` (quant.cu where
    no bulk configuration fits)."""
    op, ins = qtypes("fp8", 3072, 2048)
    monkeypatch.setenv(quant_rule.FP8_ENV, "kernel")
    monkeypatch.setenv(bulk_rule.ENV, "all")
    found = variants(op, ins, H200)
    assert [mb for mb, _ in found] == list(BUCKETS)
    assert all(s.template in ("bulk.cu", "quant.cu") for _, s in found), [s.entry for _, s in found]
    assert found[0][1].template == "bulk.cu"
    monkeypatch.setenv(bulk_rule.ENV, "1")  # bf16 buckets only: the FP8 ones are kernel.cu's again
    assert all(s.template == "kernel.cu" and s.value("WB") == 1 for _, s in variants(op, ins, H200))


# -- autotuning ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,k,mb", [(3072, 2048, 8), (2048, 8192, 16)])
def test_autotune_workloads_and_candidates(n, k, mb):
    spec = gemv_spec(n, k, mb, H200, bias=mb == 16, residual=mb == 16, wb=1)
    t = at.tunable_for(spec)
    assert t is not None and t.workloads is tune.workloads
    loads = tune.workloads(spec, {})
    lower = max([b for b in BUCKETS if b < mb], default=0) + 1
    assert [w.ints for w in loads] == [{"M": lower}, {"M": mb}]
    ptrs = {p.name for p in spec.params if p.ctype == "ptr"}
    for w in loads:
        m = w.ints["M"]
        assert w.buffers["weight"] == ("float8_e4m3fn", (n, k)) and w.buffers["weight_scale"] == ("float32", (n,))
        assert w.buffers["x"] == ("bfloat16", (m, k)) and w.buffers["out"] == ("bfloat16", (m, n))
        assert ("bias" in w.buffers) == ("residual" in w.buffers) == (mb == 16)
        assert set(w.buffers) <= ptrs and not {"weight_scale_2", "input_scale"} & set(w.buffers)
        assert w.rotate == ("weight",)
        arrays = w.fill(rng())
        assert {name: (a.dtype.name, a.shape) for name, a in arrays.items()} == dict(w.buffers)
        assert np.isfinite(arrays["weight"].astype(np.float32)).all() and (arrays["weight_scale"] > 0).all()
    # the bf16 variant of the same shape keeps its bf16 weights
    bf16 = tune.workloads(gemv_spec(n, k, mb, H200), {})[0]
    assert bf16.buffers["weight"] == ("bfloat16", (n, k)) and "weight_scale" not in bf16.buffers
    cands = tune.bf16_candidates(spec, H200)
    assert cands[0] == spec and len(at.dedupe(cands)) >= 3
    for c in cands:
        assert c.template == "kernel.cu" and c.value("WB") == 1 and c.params == spec.params
        assert spec_config(c) == gemv_config(n, k, mb, 132, warps=c.value("WARPS"), tiles=c.value("MT"),
                                             stage_steps=c.value("U"), splitk=c.value("SPLITK"),
                                             kwarps=c.value("KW"), wb=1)
        fixed = {key: v for key, v in c.values if key not in t.knobs}
        assert fixed == {key: v for key, v in spec.values if key not in t.knobs}
    assert [c.key for c in at.candidates(spec, H200)] == [c.key for c in at.dedupe(cands)]


# -- the tiny quantized Llama, fp8:wo and nvfp4:wo, lowered for h200 with kernel.cu's variants -----------------------


class WeightFormat(NamedTuple):
    """A weight-only format the lowering tests run: its quant config, its switch, ``WB`` and kernel name prefixes."""

    name: str
    #: the quant config's spec string
    config: str
    #: the switch that puts its decode variants on kernel.cu (set to ``kernel``)
    env: str
    #: kernel.cu's ``WB`` for it
    wb: int
    #: kernel.cu's variants (``gemv_{fp8,nvfp4}w_...``) and quant.cu's any-M launch (``gemv_{fp8,nvfp4}_a16_...``)
    variant: str
    any_m: str


FORMATS = {
    "fp8": WeightFormat("fp8", "fp8:wo", quant_rule.FP8_ENV, 1, "gemv_fp8w_", "gemv_fp8_a16_"),
    "nvfp4": WeightFormat("nvfp4", "nvfp4:wo", quant_rule.NVFP4_ENV, WB_NVFP4, "gemv_nvfp4w_", "gemv_nvfp4_a16_"),
}


class Lowered(NamedTuple):
    fmt: WeightFormat
    #: (artifact path, the manifest's ``cuda``) with the prefill GEMM (the default) and without it
    on: tuple
    off: tuple


@pytest.fixture(scope="module", params=list(FORMATS), ids=list(FORMATS))
def lowered(request, ckpt, tmp_path_factory) -> Lowered:
    """The tiny quantized Llama, ``fp8:wo`` or ``nvfp4:wo`` (the param; every K of its linears is 128 or 256, whole
    NVFP4 steps), lowered for h200 with that format's switch (``INGOT_GEMV_FP8`` / ``INGOT_GEMV_NVFP4``) at
    ``kernel`` and the other one unset, untuned: ``on`` the default prefill path (dequantize + GEMM launch whose
    variants have their own arguments), ``off`` with ``INGOT_QUANT_PREFILL_GEMM=0`` (the any-M GEMV launch, its
    variants taking its arguments). Without CUTLASS (``INGOT_NO_CUTLASS=1``: the template GEMM; a CUTLASS build takes
    minutes cold, and decode variants do not depend on it). Compiled through the session's kernel cache (common.py's
    ``session_kernel_cache``)."""
    fmt = FORMATS[request.param]
    out = tmp_path_factory.mktemp(f"{fmt.name}-kernel")
    found = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INGOT_CACHE_DIR", session_cache_dir(tmp_path_factory))
        for other in FORMATS.values():
            mp.delenv(other.env, raising=False)
        mp.setenv(fmt.env, "kernel")
        mp.setenv(skinny_rule.FP8_ENV, "0")  # kernel.cu at every bucket (the skinny FP8 variants: test_gemv_skinny.py)
        mp.setenv("INGOT_AUTOTUNE", "0")
        mp.setenv("INGOT_NO_CUTLASS", "1")
        mp.setenv(decode_fusion.ENV, "1")
        for name in (bulk_rule.ENV, KW_ENV, "INGOT_NO_GEMV", "INGOT_QKV_ROPE_FUSION", "INGOT_ROPE_CACHE_FUSION",
                     quant_prefill.ENV):
            mp.delenv(name, raising=False)
        for case in ("on", "off"):
            if case == "off":
                mp.setenv(quant_prefill.ENV, "0")
            path = compile_quant(ckpt, "h200", {"default": fmt.config}, out / f"{case}.ingot")
            found[case] = (path, json.loads((path / "manifest.json").read_text())["cuda"])
    return Lowered(fmt, found["on"], found["off"])


def _spec(cuda: dict, entry: str) -> dict:
    return cuda["variant_kernels"][entry]["spec"]


def _fused_into_quantized(cuda: dict) -> list[tuple[dict, dict]]:
    """(producer launch, consumer launch) of each skipped rms_norm / swiglu whose consumer is a quantized linear."""
    launches = cuda["launches"]
    return [(ln, launches[ln["skip"]["into"]]) for ln in launches
            if ln["op"] in ("rms_norm", "swiglu") and "skip" in ln
            and launches[ln["skip"]["into"]]["op"] == "quantized_linear"]


def _check_weight_args(fmt: WeightFormat, args: dict, base: dict) -> None:
    """A GEMV variant's quantized operands are the node's (``base``, the quantized launch's arguments without the
    prefill GEMM): the codes and their scale, and for NVFP4 the global scale (null for FP8)."""
    assert args["weight"] == base["weight"] and args["weight"]["buffer"].endswith("proj.weight")
    assert args["weight_scale"] == base["weight_scale"] and args["weight_scale"]["buffer"].endswith(".weight_scale")
    assert args["weight_scale_2"] == base["weight_scale_2"]
    if fmt.name == "nvfp4":
        assert args["weight_scale_2"]["buffer"].endswith(".weight_scale_2")
    else:
        assert args["weight_scale_2"] == {"null": True}


def _check_fusion(fmt: WeightFormat, cuda: dict, base_args: dict[int, dict]) -> None:
    """What both prefill paths share: every rms_norm and swiglu skipped up to 8 rows, those of the layers into the
    quantized linear's launch with variants, whose bucket-8 variant is the format's kernel.cu one with the prologue,
    reading the producer's input and the quantized weight; the rope launch skipped into the qkv projection's."""
    launches = cuda["launches"]
    producers = [ln for ln in launches if ln["op"] in ("rms_norm", "swiglu")]
    assert len(producers) == 7 and all(ln["skip"]["max_rows"] == 8 for ln in producers)  # 2 x (2 norms, swiglu) + 1
    pairs = _fused_into_quantized(cuda)
    assert sorted(p["op"] for p, _ in pairs) == ["rms_norm"] * 4 + ["swiglu"] * 2  # the final norm: the bf16 lm_head
    for producer, consumer in pairs:
        rows_arg = {"rms_norm": "rows", "swiglu": "num_tokens"}[producer["op"]]
        assert producer["rows_arg"] == rows_arg and producer["args"][rows_arg] == consumer["args"]["M"]
        first, *rest = consumer["variants"]
        assert first["max_rows"] == 8 and first["kernel"].startswith(fmt.variant)
        assert f"_m8_{producer['op']}" in first["kernel"]
        spec = _spec(cuda, first["kernel"])
        assert spec["template"] == "kernel.cu" and spec["values"]["WB"] == fmt.wb and spec["values"]["WEIGHTS_FIRST"]
        assert spec["values"]["PROLOGUE"] == PROLOGUES[producer["op"]]
        assert {p for p, _ in spec["params"]} == set(first["args"])
        assert cuda["variant_kernels"][first["kernel"]].get("pdl")
        own, base = first["args"], base_args[consumer["node"]]
        if producer["op"] == "rms_norm":
            assert own["x"] == producer["args"]["x"] and own["norm_weight"] == producer["args"]["weight"]
        else:
            assert own["x"] == producer["args"]["a"] and "norm_weight" not in own
        assert own["x"] != base["x"]
        # the quantized weight and its scales, not the dequantize launch's scratch
        _check_weight_args(fmt, own, base)
        assert "dequant" not in json.dumps(own)
        assert {k: v for k, v in own.items() if k not in ("x", "norm_weight") and k not in dict(ROPE_PARAMS)} == \
            {k: v for k, v in base.items() if k != "x"}
        assert all(not _spec(cuda, v["kernel"])["values"].get("PROLOGUE", 0) for v in rest)
    ropes = [ln for ln in launches if ln["op"] == "rope_qkv"]
    assert len(ropes) == 2
    for rope in ropes:
        assert rope["skip"]["max_rows"] == 8 and rope["rows_arg"] == "num_tokens"
        qkv = launches[rope["skip"]["into"]]
        assert qkv["op"] == "quantized_linear" and qkv["args"]["out"] == rope["args"]["qkv"]
        first = qkv["variants"][0]
        assert first["kernel"].startswith(fmt.variant) and "_m8_rms_norm_rope" in first["kernel"]
        spec = _spec(cuda, first["kernel"])
        assert spec["values"]["ROPE"] and spec["values"]["WB"] == fmt.wb and spec["values"]["PROLOGUE"] == 1
        for name in ("positions", "cos", "sin", "q", "kv_cache", "slot_mapping", "kv_scale"):
            assert first["args"][name] == rope["args"][name], name
    # every variant kernel of the table is used, compiled and its parameters bound
    used = {v["kernel"] for ln in launches for v in ln.get("variants", ())}
    assert used == set(cuda["variant_kernels"])


def _check_memory_plan(path, cuda: dict) -> None:
    """The plan is the one the loaded graph gives with the table's variant reads (and the dequantize scratch), and
    the fused variants' inputs (the skipped producers' inputs) share no bytes with their outputs."""
    graph, _ = load_graph(path)
    reads = decode_fusion.variant_reads(cuda["launches"])
    temps = quant_prefill.temporaries(graph, cuda["launches"])
    bindings = cuda["memory_plan"]["bindings"]
    assert plan_memory(graph, bindings, reads=reads, temporaries=temps).to_dict() == cuda["memory_plan"]
    index = {n.outputs[0].name: i for i, n in enumerate(graph.nodes)}
    # the attention norm's input, x of the qkv variant (with the prefill GEMM every variant has its own arguments:
    # o_proj's name it too, as its residual)
    assert reads["embed"] >= index["layers.0.qkv"]
    # the swiglu's input, x of the down variant: without that read it dies at the swiglu and down's output may take
    # its bytes
    assert reads["layers.0.gate_up"] == index["layers.0.mlp_out"]
    assert reads["layers.0.attn_out"] == index["layers.0.mlp_out"]  # x of the gate_up variant, down's residual

    def overlap(buffers: dict, a: str, b: str) -> bool:
        x, y = buffers[a], buffers[b]
        return x["region"] == y["region"] and x["offset"] < y["offset"] + y["nbytes"] and \
            y["offset"] < x["offset"] + x["nbytes"]

    for layer in (0, 1):
        norm_in = "embed" if layer == 0 else "layers.0.mlp_out"
        pairs = [(norm_in, f"layers.{layer}.qkv"), (f"layers.{layer}.attn_out", f"layers.{layer}.gate_up"),
                 (f"layers.{layer}.gate_up", f"layers.{layer}.mlp_out")]
        assert not any(overlap(cuda["memory_plan"]["buffers"], a, b) for a, b in pairs), layer
    # why the reads exist: without them the second layer's down projection writes over its fused variant's input
    unread = plan_memory(graph, bindings, temporaries=temps).to_dict()["buffers"]
    assert overlap(unread, "layers.1.gate_up", "layers.1.mlp_out")


@needs_compiler
def test_lowering_fuses_into_the_quantized_gemm_launch(lowered):
    fmt = lowered.fmt
    path, cuda = lowered.on
    _, off = lowered.off
    assert cuda["switches"][fmt.env] == "kernel" and cuda["arch"] == "sm_90a"
    assert not {f.env for f in FORMATS.values() if f != fmt} & set(cuda["switches"])
    launches = cuda["launches"]
    # the quantized launches' own arguments without the prefill GEMM: what the variants must take
    base_args = {ln["node"]: ln["args"] for ln in off["launches"] if ln["op"] == "quantized_linear"}
    assert len(base_args) == 8
    dequants = [j for j, ln in enumerate(launches) if ln["kernel"].startswith(f"dequant_{fmt.name}_")]
    gemms = [j for j, ln in enumerate(launches) if ln["op"] == "quantized_linear" and "variants" in ln]
    assert len(dequants) == 8 and gemms == [j + 1 for j in dequants]
    for j in gemms:
        ln, dq = launches[j], launches[j - 1]
        assert dq["skip"] == {"max_rows": quant_prefill.WO_GEMM_ROWS, "into": j} and dq["node"] == ln["node"]
        assert ln["args"]["weight"]["buffer"].endswith(quant_prefill.WEIGHT_SUFFIX)  # the GEMM reads the scratch
        assert ln["args"]["weight"] == dq["args"]["out"]
        _check_weight_args(fmt, dq["args"], base_args[ln["node"]])  # the dequantize reads the node's operands
        if fmt.name == "nvfp4":  # the scales multiplied into an f32 [N] scratch, the GEMM's column scale
            assert ln["args"]["weight_scale"] == dq["args"]["out_scale"]
            assert dq["args"]["out_scale"]["buffer"].endswith(quant_prefill.SCALE_SUFFIX)
        else:  # FP8's per-channel scale as it is
            assert ln["args"]["weight_scale"] == dq["args"]["weight_scale"]
            assert dq["args"]["out_scale"] == {"null": True}
        # the buckets only: steps past them take the pair (WO_GEMM_ROWS, not the any-M GEMV)
        assert [v["max_rows"] for v in ln["variants"]] == [*BUCKETS] and BUCKETS[-1] == quant_prefill.WO_GEMM_ROWS
        assert all("args" in v for v in ln["variants"])
        for v in ln["variants"]:
            spec = _spec(cuda, v["kernel"])
            assert v["kernel"].startswith(fmt.variant) and spec["template"] == "kernel.cu"
            assert spec["values"]["WB"] == fmt.wb and {p for p, _ in spec["params"]} == set(v["args"])
            _check_weight_args(fmt, v["args"], base_args[ln["node"]])
            if not spec["values"]["PROLOGUE"] and not spec["values"]["ROPE"]:  # unfused: the quantized arguments
                assert v["args"] == base_args[ln["node"]], v["kernel"]
    _check_fusion(fmt, cuda, base_args)
    _check_memory_plan(path, cuda)
    # the quantized graph still runs on the CPU backend
    graph, _ = load_graph(path)
    m = PagedModel(graph, num_blocks=8)
    logits = m.step([(m.add_sequence(), [int(t) for t in rng().integers(3, 259, 21)])])
    assert logits.shape == (1, 260) and np.isfinite(logits).all()


@needs_compiler
def test_lowering_without_the_prefill_gemm_fuses_into_the_gemv_launch(lowered):
    fmt = lowered.fmt
    path, cuda = lowered.off
    assert cuda["switches"][fmt.env] == "kernel" and cuda["switches"][quant_prefill.ENV] == "0"
    launches = cuda["launches"]
    qls = [ln for ln in launches if ln["op"] == "quantized_linear"]
    assert len(qls) == 8 and not any(ln["kernel"].startswith("dequant_") for ln in launches)
    for ln in qls:
        spec = cuda["kernels"][ln["kernel"]]["spec"]
        assert ln["kernel"].startswith(fmt.any_m) and spec["template"] == "quant.cu" and spec["values"]["ANY_M"]
        assert [v["max_rows"] for v in ln["variants"]] == list(BUCKETS)
        first, *rest = ln["variants"]
        assert all(v["kernel"].startswith(fmt.variant) for v in ln["variants"])
        assert all(_spec(cuda, v["kernel"])["values"]["WB"] == fmt.wb for v in ln["variants"])
        assert all("args" not in v and not _spec(cuda, v["kernel"])["values"]["PROLOGUE"] for v in rest)
        if "args" not in first:  # o_proj: nothing to fuse, its plain variant takes the launch's arguments
            assert [p for p, _ in _spec(cuda, first["kernel"])["params"]] == [p for p, _ in QUANT_PARAMS]
    assert sum("args" in ln["variants"][0] for ln in qls) == 6  # qkv, gate_up, down of both layers
    _check_fusion(fmt, cuda, {ln["node"]: ln["args"] for ln in qls})
    _check_memory_plan(path, cuda)
    # the same kernel.cu variants as with the prefill GEMM
    on = lowered.on[1]
    assert {k for k in cuda["variant_kernels"] if k.startswith(fmt.variant)} == \
        {k for k in on["variant_kernels"] if k.startswith(fmt.variant)}


@needs_compiler
def test_executor_runs_the_fused_variant_in_small_steps(lowered, monkeypatch):
    """The first layer's norm, dequantize, qkv GEMM and rope launches on the executor's ``Launch`` objects (built as
    ``CudaExecutor`` builds them; the driver's launch recorded, no GPU): up to 8 rows only the fused kernel.cu variant
    runs, with the norm's input, the norm weight and the quantized weight (and its scales); up to 64 the norm, the
    plain kernel.cu bucket and the rope launch; above (``WO_GEMM_ROWS``), the dequantize kernel and the GEMM."""
    from ingot.codegen.kernel import KernelSpec
    from ingot.runtime import cuda_driver
    from ingot.runtime import cuda_launch as cl

    fmt = lowered.fmt
    _, cuda = lowered.on
    buffers = cuda["memory_plan"]["buffers"]
    base = {"weights": 0, "io": 1 << 40, "scratch": 2 << 40, "kv": 3 << 40}
    address = {n: base[b["region"]] + b["offset"] for n, b in buffers.items()}.__getitem__
    specs = {e: KernelSpec.from_dict(k["spec"]) for e, k in {**cuda["kernels"], **cuda["variant_kernels"]}.items()}
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(cuda_driver, "launch", lambda fn, grid, block, smem, stream, params, what, pdl=False:
                        calls.append((fn, params)))
    table = cuda["launches"]
    j = next(j for j, ln in enumerate(table) if ln["op"] == "rms_norm")
    block = table[j:j + 4]
    assert [ln["op"] for ln in block] == ["rms_norm", "quantized_linear", "quantized_linear", "rope_qkv"]
    built = []
    for ln in block:
        variants = [(int(v["max_rows"]), v["kernel"], specs[v["kernel"]],
                     cl.Arguments(specs[v["kernel"]], v["args"], address) if "args" in v else None)
                    for v in ln.get("variants", ())]
        built.append(cl.Launch(ln["kernel"], specs[ln["kernel"]], ln["args"], address, ln["op"], variants,
                               ln.get("rows_arg", "M"), skip_rows=int(ln["skip"]["max_rows"]) if "skip" in ln else 0))
    norm, dq, gemm, rope = block
    fused = gemm["variants"][0]
    own = built[2].variants[0][3]
    names = [p.name for p in specs[fused["kernel"]].params]
    for t in (1, 8, 9, 64, 65, 256, 257):
        calls.clear()
        for launch in built:
            launch.enqueue({"T": t}, None)  # type: ignore[arg-type]
        ran = [c[0] for c in calls]
        if t <= 8:
            assert ran == [fused["kernel"]], (t, ran)
            assert calls[0][1] == own.addr and own.values[names.index("M")].value == t
            for name, buffer in (("x", norm["args"]["x"]), ("norm_weight", norm["args"]["weight"]),
                                 ("weight", dq["args"]["weight"]), ("weight_scale", dq["args"]["weight_scale"])):
                assert own.values[names.index(name)].value == address(buffer["buffer"]), name
            scale_2 = dq["args"]["weight_scale_2"]  # NVFP4's global scale; FP8's is null, a null pointer
            assert ("null" in scale_2) == (fmt.name == "fp8")
            assert own.values[names.index("weight_scale_2")].value == \
                (0 if "null" in scale_2 else address(scale_2["buffer"]))
        elif t <= quant_prefill.WO_GEMM_ROWS:
            bucket = next(v for v in gemm["variants"] if t <= v["max_rows"])
            assert ran == [norm["kernel"], bucket["kernel"], rope["kernel"]], (t, ran)
            assert bucket["kernel"].startswith(fmt.variant)
        else:
            assert ran == [norm["kernel"], dq["kernel"], gemm["kernel"], rope["kernel"]], (t, ran)
