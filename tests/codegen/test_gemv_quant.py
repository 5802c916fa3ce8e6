"""The quantized decode GEMV (``codegen/kernels/gemv/quant.cu``) without a GPU: configurations, which
``quantized_linear`` nodes it takes, and compile + SASS checks for sm_90a and sm_100a."""

from __future__ import annotations

import pytest

from ingot.codegen.kernel import GridDim
from ingot.codegen.kernels.gemv import skinny_rule
from ingot.codegen.kernels.gemv.quant_rule import (
    ANY_M_CHUNK,
    PARAMS,
    STEP_COLS,
    QuantGemvConfig,
    kw_fits,
    quant_config,
    quant_gemv_spec,
    quant_plan,
    smem_bytes,
    spec_config,
    workspace_floats,
)
from ingot.codegen.kernels.gemv.rule import (
    BUCKETS,
    FAMILY,
    KW_BUCKETS,
    KW_ENV,
    KW_SHAPE,
    NVFP4_SPLIT8_ROWS,
    SHAPE_BY_BUCKET,
    SMEM_BUDGET,
    variants,
)
from ingot.codegen.target import get_target
from ingot.ir.ops.quantized import QuantizedLinear
from ingot.ir.types import DType, TensorType
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    module_kernel_cache,
    needs_compiler,
    sass_opcodes,
)

#: the Llama-3.2-1B layer shapes of the benchmark, and smaller / odd-N ones
SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048), (200, 256), (1000, 4224)]
FORMATS = [("fp8", "none", "token"), ("fp8", "fp8", "token"), ("fp8", "fp8", "tensor"), ("nvfp4", "none", "token")]


def qtypes(fmt: str, n: int, k: int, act: str = "none", gran: str = "token", bias: bool = False,
           residual: bool = False, x_dtype: DType = DType.bf16) -> tuple[QuantizedLinear, list[TensorType | None]]:
    op = QuantizedLinear(weight_format=fmt, weight_granularity="channel", act_format=act, act_granularity=gran,
                         in_features=k)
    x = TensorType(x_dtype, ("T", k))
    if fmt == "fp8":
        w, s, s2 = TensorType(DType.f8e4m3fn, (n, k)), TensorType(DType.f32, (n,)), None
    else:
        w, s = TensorType(DType.u8, (n, k // 2)), TensorType(DType.f8e4m3fn, (n, k // 16))
        s2 = TensorType(DType.f32, ())
    xs = TensorType(DType.f32, ()) if gran == "tensor" and act != "none" else None
    b = TensorType(x_dtype, (n,)) if bias else None
    r = TensorType(x_dtype, ("T", n)) if residual else None
    ins = [x, w, s, s2, xs, b, r]
    op.infer(ins)  # the types are ones the op accepts
    return op, ins


@pytest.mark.parametrize("fmt,act,gran", FORMATS)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("mb", BUCKETS)
def test_config_covers_k_and_fits(fmt, act, gran, n, k, mb):
    if k % STEP_COLS[fmt]:
        pytest.skip("K not a whole number of steps")
    for any_m in (False, True):
        c = quant_config(n, k, mb, fmt, act, 132, any_m=any_m)
        sw = STEP_COLS[fmt]
        assert c.slice_k % (sw * c.stage_steps * c.kwarps) == 0  # each warp of a row group: whole stages
        assert smem_bytes(mb, c.slice_k, act) <= SMEM_BUDGET and kw_fits(mb, act, c)
        assert c.warps % c.kwarps == 0 and c.rows == 16 * c.tiles * c.warps // c.kwarps
        assert c.kwarps == 1 or (mb in KW_BUCKETS and not any_m)
        if any_m:
            assert c.splitk == 1 and -(-k // c.slice_k) * c.slice_k >= k
        else:
            assert c.splitk * c.slice_k >= k > (c.splitk - 1) * c.slice_k


def test_split_k_fills_the_gpu_for_small_n():
    for c in (quant_config(2048, 2048, 8, "fp8", "none", 132, kwarps=1),
              quant_config(2048, 2048, 16, "fp8", "none", 132)):
        blocks = -(-2048 // (16 * c.warps * c.tiles))
        assert c.kwarps == 1 and c.splitk > 1 and blocks * c.splitk >= 132
    assert quant_config(128256, 2048, 8, "fp8", "none", 132).splitk == 1  # N alone fills it


def test_grid_and_workspace_are_consistent():
    h200 = get_target("h200")
    for fmt, act, gran in FORMATS:
        for mb in BUCKETS:
            spec = quant_gemv_spec(3072, 2048, mb, h200, fmt, act, gran)
            cfg = quant_config(3072, 2048, mb, fmt, act, 132)
            assert spec.grid_dims({"M": mb}) == (-(-3072 // cfg.rows), cfg.splitk, 1)
            assert spec.block == (32 * cfg.warps, 1, 1)
            assert spec.smem == smem_bytes(mb, cfg.slice_k, act)
            assert spec.value("KW") == cfg.kwarps and spec_config(spec) == cfg
            gx = spec.grid[0].const
            want = cfg.splitk * gx * cfg.rows * mb if cfg.splitk > 1 else 1
            assert workspace_floats(spec) == want
        # a row-group configuration with split-K on top: the workspace holds a row group's tile per row block
        cfg = quant_config(3072, 2048, 8, fmt, act, 132, warps=8, tiles=1, stage_steps=2, splitk=2, kwarps=4)
        spec = quant_gemv_spec(3072, 2048, 8, h200, fmt, act, gran, config=cfg)
        assert (cfg.rows, cfg.splitk) == (32, 2) and spec.grid_dims({"M": 8}) == (96, 2, 1)
        assert workspace_floats(spec) == 2 * 96 * 32 * 8 and spec_config(spec) == cfg
        any_m = quant_gemv_spec(3072, 2048, ANY_M_CHUNK, h200, fmt, act, gran, any_m=True)
        assert any_m.grid[2] == GridDim("M", ANY_M_CHUNK)
        assert any_m.grid_dims({"M": 130})[1:] == (1, 3)


#: the 1B model's layer GEMVs (N, K) -> (warps a row group, split-K) in bucket 8 (1-8 tokens), per weight format /
#: activation mode: qkv and o (too few 64-row blocks for 1.5 CTAs an SM) get 16-row CTAs whose 4 warps split the whole
#: of K, no split-K; down's x slice (8192 columns) is over KW_MAX_X in bf16 (weight-only) but not as e4m3 codes
#: (FP8 activations: 8 x 8256 B), so only there it gets row groups too; gate_up and the lm_head have rows enough
ROW_GROUPS = {
    ("fp8", "none"): {(3072, 2048): (4, 1), (2048, 2048): (4, 1), (16384, 2048): (1, 1), (2048, 8192): (1, 8),
                      (128256, 2048): (1, 1)},
    ("fp8", "fp8"): {(3072, 2048): (4, 1), (2048, 2048): (4, 1), (16384, 2048): (1, 1), (2048, 8192): (4, 1),
                     (128256, 2048): (1, 1)},
    ("nvfp4", "none"): {(3072, 2048): (4, 1), (2048, 2048): (4, 1), (16384, 2048): (1, 1), (2048, 8192): (1, 8),
                        (128256, 2048): (1, 1)},
}
#: steps a stage of the row-group configurations: KW_SHAPE's 8, but NVFP4's K = 2048 is 16 steps (128 columns each),
#: 4 a warp: the stage shrinks to the warp's part (as it does to a short slice)
ROW_GROUP_STAGE = {"fp8": 8, "nvfp4": 4}
#: bucket 8's configurations before row groups (INGOT_GEMV_KW=0; the same for both FP8 activation modes):
#: (warps, tiles, split-K, steps a stage, slice)
KW_OFF = {
    "fp8": {(3072, 2048): QuantGemvConfig(4, 1, 8, 4, 256), (2048, 2048): QuantGemvConfig(4, 1, 8, 4, 256),
            (16384, 2048): QuantGemvConfig(4, 1, 1, 8, 2048), (2048, 8192): QuantGemvConfig(4, 1, 8, 8, 1024),
            (128256, 2048): QuantGemvConfig(4, 1, 1, 8, 2048)},
    "nvfp4": {(3072, 2048): QuantGemvConfig(4, 1, 4, 4, 512), (2048, 2048): QuantGemvConfig(4, 1, 4, 4, 512),
              (16384, 2048): QuantGemvConfig(4, 1, 1, 8, 2048), (2048, 8192): QuantGemvConfig(4, 1, 8, 8, 1024),
              (128256, 2048): QuantGemvConfig(4, 1, 1, 8, 2048)},
}


@pytest.mark.parametrize("fmt,act,gran", FORMATS)
@pytest.mark.parametrize("n,k", list(ROW_GROUPS[("fp8", "none")]))
def test_row_groups_for_the_small_matrices_only(fmt, act, gran, n, k, monkeypatch):
    h200 = get_target("h200")
    # by default (INGOT_GEMV_KW unset or 1) quant.cu has none yet: its row groups have not run on a GPU
    monkeypatch.delenv(KW_ENV, raising=False)
    for mb in BUCKETS:
        assert quant_config(n, k, mb, fmt, act, 132) == quant_config(n, k, mb, fmt, act, 132, kwarps=1)
    monkeypatch.setenv(KW_ENV, "all")
    kw, split = ROW_GROUPS[(fmt, act)][(n, k)]
    for mb in KW_BUCKETS:
        c = quant_config(n, k, mb, fmt, act, 132)
        assert (c.kwarps, c.splitk) == (kw, split), (mb, c)
        if kw > 1:
            assert (c.warps, c.tiles, c.stage_steps) == (*KW_SHAPE[:2], ROW_GROUP_STAGE[fmt]), (mb, c)
            assert c.slice_k == k and c.rows == 16  # the whole of K in each CTA, 4 parts of it
        else:
            assert (c.warps, c.tiles) == SHAPE_BY_BUCKET[mb][:2], (mb, c)
        spec = quant_gemv_spec(n, k, mb, h200, fmt, act, gran)
        assert spec.value("KW") == kw and spec_config(spec) == c
        assert spec.grid[0].const == -(-n // c.rows) and spec.grid[0].const * spec.grid[1].const >= 0.9 * 132
        assert ("warps a row group" in spec.doc) == (kw > 1)
    for mb in set(BUCKETS) - set(KW_BUCKETS):  # 16 to 64 tokens: as before row groups existed
        assert quant_config(n, k, mb, fmt, act, 132) == quant_config(n, k, mb, fmt, act, 132, kwarps=1)
    (any_m,) = quant_plan(*qtypes(fmt, n, k, act, gran), h200)  # the prefill launch: never
    assert any_m.value("KW") == 1
    monkeypatch.setenv(KW_ENV, "0")  # INGOT_GEMV_KW=0: none, the configuration the rule made before them
    off = quant_config(n, k, 8, fmt, act, 132)
    assert off == quant_config(n, k, 8, fmt, act, 132, kwarps=1) == KW_OFF[fmt][(n, k)]
    monkeypatch.setenv(KW_ENV, "yes")
    with pytest.raises(ValueError, match=KW_ENV):
        quant_config(n, k, 8, fmt, act, 132)


@pytest.mark.parametrize("fmt,act,gran", FORMATS)
def test_row_groups_off_restores_every_config(fmt, act, gran, monkeypatch):
    """``INGOT_GEMV_KW=0``: every configuration (all buckets, the any-M launch) is the ``kwarps=1`` one, the rule's
    before row groups existed; with quant.cu's row groups on (``all``), only bucket 8 (``KW_BUCKETS``) changes."""
    monkeypatch.setenv(KW_ENV, "all")
    shapes = SHAPES + [(576, 1024), (4096, 4096), (64, 128), (8192, 2048), (100, 640)]
    on = {}
    for n, k in shapes:
        if k % STEP_COLS[fmt]:
            continue
        for mb in BUCKETS:
            for any_m in (False, True):
                on[(n, k, mb, any_m)] = quant_config(n, k, mb, fmt, act, 132, any_m=any_m)
    monkeypatch.setenv(KW_ENV, "0")
    for (n, k, mb, any_m), c in on.items():
        off = quant_config(n, k, mb, fmt, act, 132, any_m=any_m)
        assert off.kwarps == 1 and off == quant_config(n, k, mb, fmt, act, 132, any_m=any_m, kwarps=1)
        if mb not in KW_BUCKETS or any_m or c.kwarps == 1:
            assert c == off, (n, k, mb, any_m)


def test_row_group_configs_are_checked():
    with pytest.raises(ValueError, match="divide"):
        quant_config(3072, 2048, 8, "fp8", "none", 132, warps=4, kwarps=3)
    with pytest.raises(ValueError, match="any-M"):
        quant_config(3072, 2048, 64, "fp8", "none", 132, any_m=True, kwarps=2)
    with pytest.raises(ValueError, match="any-M"):
        quant_gemv_spec(3072, 2048, 64, get_target("h200"), "fp8", any_m=True,
                        config=QuantGemvConfig(warps=4, tiles=1, splitk=1, stage_steps=8, slice_k=2048, kwarps=4))
    # 8 warps a row group, 2 tiles each, 64 tokens, K = 128: 7 partial tiles of 2 x 8 n-tiles (7 x 8 KB) do not fit
    # x's 64 x (512 + 64) B region of e4m3 codes (the slice rounds up to a step for each of the 8 warps)
    assert not kw_fits(64, "fp8", QuantGemvConfig(warps=8, tiles=2, splitk=1, stage_steps=1, slice_k=512, kwarps=8))
    with pytest.raises(ValueError, match="row group"):
        quant_config(200, 128, 64, "fp8", "fp8", 132, warps=8, tiles=2, stage_steps=1, kwarps=8)
    # explicit row groups: valid wherever they divide the warps (parts wholly past K load nothing)
    c = quant_config(200, 128, 8, "fp8", "none", 132, warps=8, tiles=1, stage_steps=4, kwarps=4)
    assert (c.kwarps, c.stage_steps, c.slice_k, c.splitk) == (4, 1, 256, 1)


def test_variants_and_plan_for_quantized_linear(monkeypatch):
    h200 = get_target("h200")
    monkeypatch.setenv(skinny_rule.FP8_ENV, "0")  # (FP8 weight-only on the skinny GEMM: test_gemv_skinny.py)
    for fmt, act, gran in FORMATS:
        op, ins = qtypes(fmt, 512, 1024, act, gran, bias=True, residual=True)
        found = variants(op, ins, h200)
        # NVFP4 weight-only with row groups at bucket 8 splits it (test_gemv_nvfp4.py's split8 tests)
        split = [NVFP4_SPLIT8_ROWS] if (fmt, act) == ("nvfp4", "none") else []
        assert [mb for mb, _ in found] == split + list(BUCKETS)
        # FP8 and NVFP4 weight-only buckets run kernel.cu by default (INGOT_GEMV_FP8 / INGOT_GEMV_NVFP4,
        # tests/codegen/test_gemv_fp8.py / test_gemv_nvfp4.py), with quant.cu's parameters by name
        template = "kernel.cu" if act == "none" else "quant.cu"
        assert all(s.template == template and [p.name for p in s.params] == [p[0] for p in PARAMS] for _, s in found)
        assert all(s.value("HAS_BIAS") and s.value("HAS_RESIDUAL") for _, s in found)
        (primary,) = quant_plan(op, ins, h200)
        assert primary.value("ANY_M") and primary.value("SPLITK") == 1
    assert "quantized_linear" in FAMILY.ops and FAMILY.plan(op, ins, h200) == quant_plan(op, ins, h200)


@pytest.mark.parametrize("case", ["mxfp4", "fp8-block-64", "fp8-block-k-part", "fp8-tensor-scale", "f32-x",
                                  "nvfp4-w4a4", "k-not-steps", "sm100-layout", "cpu"])
def test_not_taken(case):
    h200 = get_target("h200")
    if case == "mxfp4":
        op = QuantizedLinear(weight_format="mxfp4", in_features=256)
        ins = [TensorType(DType.bf16, ("T", 256)), TensorType(DType.u8, (64, 128)), TensorType(DType.f8e8m0, (64, 8))]
    elif case == "fp8-block-64":  # block scales other than 128 x 128 (fp8_block's)
        op = QuantizedLinear(weight_format="fp8", weight_granularity="block", block=(64, 64), in_features=256)
        ins = [TensorType(DType.bf16, ("T", 256)), TensorType(DType.f8e4m3fn, (64, 256)), TensorType(DType.f32, (1, 4))]
    elif case == "fp8-block-k-part":  # K not whole 128-column blocks
        op = QuantizedLinear(weight_format="fp8", weight_granularity="block", in_features=320)
        ins = [TensorType(DType.bf16, ("T", 320)), TensorType(DType.f8e4m3fn, (64, 320)), TensorType(DType.f32, (1, 3))]
    elif case == "fp8-tensor-scale":
        op = QuantizedLinear(weight_format="fp8", weight_granularity="tensor", in_features=256)
        ins = [TensorType(DType.bf16, ("T", 256)), TensorType(DType.f8e4m3fn, (64, 256)), TensorType(DType.f32, ())]
    elif case == "f32-x":
        op, ins = qtypes("fp8", 64, 256, x_dtype=DType.f32)
    elif case == "nvfp4-w4a4":
        op, ins = qtypes("nvfp4", 64, 256)
        op = QuantizedLinear(weight_format="nvfp4", act_format="nvfp4", in_features=256)
    elif case == "k-not-steps":
        op, ins = qtypes("nvfp4", 64, 96)
    elif case == "sm100-layout":
        op, ins = qtypes("nvfp4", 64, 256)
        op = QuantizedLinear(weight_format="nvfp4", scale_layout="sm100", in_features=256)
    else:
        op, ins = qtypes("fp8", 64, 256)
        h200 = get_target("cpu")
    assert variants(op, ins, h200) == []
    assert quant_plan(op, ins, h200) is None


#: (N, K, bucket, any-M, targets): the lm_head's shape for h200 only (its compiles are the slowest, 3-8 s each on
#: CI's cores, and the same template builds for b200 at every other shape)
COMPILED = [(3072, 2048, 8, False, ("h200", "b200")), (2048, 8192, 32, False, ("h200", "b200")),
            (200, 256, 64, False, ("h200", "b200")), (128256, 2048, 32, False, ("h200",)),
            (1000, 4224, 64, True, ("h200", "b200"))]


@needs_compiler
@pytest.mark.parametrize("fmt,act,gran", FORMATS)
@pytest.mark.parametrize("n,k,mb,any_m,target", [(n, k, mb, a, t) for n, k, mb, a, ts in COMPILED for t in ts])
def test_compiles_with_tensor_cores_and_wide_loads(target, fmt, act, gran, n, k, mb, any_m):
    if k % STEP_COLS[fmt]:
        pytest.skip("K not a whole number of steps")
    tgt = get_target(target)
    ops = sass_opcodes(quant_gemv_spec(n, k, mb, tgt, fmt, act, gran, bias=True, residual=True, any_m=any_m), tgt.arch)
    assert any(o.startswith("HMMA.16816.F32") for o in ops), sorted(ops)
    assert any(o.startswith("LDG") and ".128" in o for o in ops), sorted(ops)
    assert_no_local_memory(ops, "the quantized GEMV")


#: row-group configurations (N, K, bucket, format, (warps, tiles, steps a stage, split-K, warps a row group)) beyond
#: the rule's defaults: split-K on top, a partial last slice (K = 4224 = 66 steps: in slice 3 of 3 some warps' parts
#: lie wholly past K), 2 tiles a warp, NVFP4 (block scales from each warp's own columns), 64 tokens, FP8 activations
#: (token and tensor scales); tests/codegen/test_gemv_quant_gpu.py runs the same
KW_CASES = [(3072, 2048, 8, ("fp8", "none", "token"), (4, 1, 8, 1, 4)),
            (1000, 4224, 8, ("fp8", "fp8", "token"), (8, 1, 4, 3, 8)),
            (3072, 2048, 32, ("fp8", "none", "token"), (8, 2, 2, 1, 2)),
            (2048, 8192, 16, ("nvfp4", "none", "token"), (4, 1, 8, 4, 4)),
            (1000, 4224, 16, ("fp8", "fp8", "tensor"), (4, 1, 8, 2, 2)),
            (200, 256, 64, ("nvfp4", "none", "token"), (8, 1, 1, 1, 2)),
            (2048, 2048, 8, ("nvfp4", "none", "token"), (4, 1, 4, 1, 4))]


def kw_case_spec(n: int, k: int, mb: int, formats: tuple[str, str, str], c: tuple, target: str):
    fmt, act, gran = formats
    w, t, u, sk, kw = c
    cfg = quant_config(n, k, mb, fmt, act, 132, warps=w, tiles=t, stage_steps=u, splitk=sk, kwarps=kw)
    assert (cfg.splitk, cfg.kwarps) == (sk, kw), cfg
    return quant_gemv_spec(n, k, mb, get_target(target), fmt, act, gran, bias=True, residual=True, config=cfg)


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("n,k,mb,formats,c", KW_CASES)
def test_row_groups_compile_without_spills(target, n, k, mb, formats, c):
    tgt = get_target(target)
    ops = sass_opcodes(kw_case_spec(n, k, mb, formats, c, target), tgt.arch)
    assert any(o.startswith("HMMA") for o in ops), sorted(ops)
    assert any(o.startswith("BAR") for o in ops), sorted(ops)  # the row group's reduction through shared memory
    assert any(o.startswith("LDG") and ".128" in o for o in ops), sorted(ops)
    assert_no_local_memory(ops, "the quantized GEMV with row groups")


def block_types(n: int, k: int, act: str = "none") -> tuple[QuantizedLinear, list[TensorType | None]]:
    """A ``quantized_linear`` with FP8 weights in 128 x 128 blocks (scales [ceil(N/128)][K/128]), bias and residual."""
    op = QuantizedLinear(weight_format="fp8", weight_granularity="block", act_format=act, in_features=k)
    ins = [TensorType(DType.bf16, ("T", k)), TensorType(DType.f8e4m3fn, (n, k)),
           TensorType(DType.f32, (-(-n // 128), k // 128)), None, None, TensorType(DType.bf16, (n,)),
           TensorType(DType.bf16, ("T", n))]
    op.infer(ins)
    return op, ins


@pytest.mark.parametrize("act", ["none", "fp8"])
@pytest.mark.parametrize("n,k", [(n, k) for n, k in SHAPES if k % 128 == 0])
def test_fp8_block_scales_take_whole_blocks(act, n, k):
    """FP8 weights with 128 x 128 block scales (weight-only or W8A8 per token) run quant.cu's ``fp8_block`` variants
    (``WFMT`` 2) at every M, kernel.cu's FP8 path and the dequantize + GEMM pair being per-channel only: every warp's
    part of every K slice is whole 128-column blocks (an even number of 64-column steps, stages of an even number),
    which the template's per-block sums need."""
    h200 = get_target("h200")
    op, ins = block_types(n, k, act)
    found = variants(op, ins, h200)
    (primary,) = quant_plan(op, ins, h200)
    assert [mr for mr, _ in found] == list(BUCKETS)
    for spec in [s for _, s in found] + [primary]:
        assert spec.template == "quant.cu" and spec.value("WFMT") == 2, spec.entry
        assert spec.entry.startswith(f"gemv_fp8_block_{'a16' if act == 'none' else 'a8'}_")
        c = spec_config(spec)
        part = c.slice_k // c.kwarps
        assert c.slice_k % 128 == 0 and part % 128 == 0 and c.stage_steps % 2 == 0, (spec.entry, c)
        assert spec.value("HAS_BIAS") and spec.value("HAS_RESIDUAL")
    assert primary.value("ANY_M")
    # with row groups and split-K forced on top: still whole blocks a warp
    for mb in KW_BUCKETS:
        c = quant_config(n, k, mb, "fp8_block", act, 132, warps=8, kwarps=4, splitk=2 if k >= 2048 else 1)
        assert (c.slice_k // c.kwarps) % 128 == 0 and c.stage_steps % 2 == 0, c


@needs_compiler
@pytest.mark.parametrize("act", ["none", "fp8"])
@pytest.mark.parametrize("n,k,mb,any_m,target", [(3072, 2048, 8, False, "h200"), (1000, 4224, 64, True, "h200"),
                                                 (2048, 8192, 32, False, "b200")])
def test_fp8_block_compiles_without_spills(act, n, k, mb, any_m, target):
    """The per-block partial sums (a second accumulator set) stay in registers; tensor cores and 16-byte loads."""
    tgt = get_target(target)
    op, ins = block_types(n, k, act)
    spec = quant_gemv_spec(n, k, mb, tgt, "fp8_block", act, bias=True, residual=True, any_m=any_m)
    ops = sass_opcodes(spec, tgt.arch)
    assert any(o.startswith("HMMA") for o in ops), sorted(ops)
    assert any(o.startswith("LDG") and ".128" in o for o in ops), sorted(ops)
    assert_no_local_memory(ops, "the block-scaled FP8 GEMV")
