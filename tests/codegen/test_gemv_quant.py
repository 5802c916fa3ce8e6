"""The quantized decode GEMV (``codegen/kernels/gemv/quant.cu``) without a GPU: configurations, which
``quantized_linear`` nodes it takes, and compile + SASS checks for sm_90a and sm_100a."""

from __future__ import annotations

import pytest

from ingot.codegen.kernel import GridDim
from ingot.codegen.kernels.gemv.quant_rule import (
    ANY_M_CHUNK,
    PARAMS,
    STEP_COLS,
    quant_config,
    quant_gemv_spec,
    quant_plan,
    smem_bytes,
    workspace_floats,
)
from ingot.codegen.kernels.gemv.rule import BUCKETS, FAMILY, SMEM_BUDGET, variants
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
        assert c.slice_k % (sw * c.stage_steps) == 0
        assert smem_bytes(mb, c.slice_k, act) <= SMEM_BUDGET
        if any_m:
            assert c.splitk == 1 and -(-k // c.slice_k) * c.slice_k >= k
        else:
            assert c.splitk * c.slice_k >= k > (c.splitk - 1) * c.slice_k


def test_split_k_fills_the_gpu_for_small_n():
    c = quant_config(2048, 2048, 8, "fp8", "none", 132)
    blocks = -(-2048 // (16 * c.warps * c.tiles))
    assert c.splitk > 1 and blocks * c.splitk >= 132
    assert quant_config(128256, 2048, 8, "fp8", "none", 132).splitk == 1  # N alone fills it


def test_grid_and_workspace_are_consistent():
    h200 = get_target("h200")
    for fmt, act, gran in FORMATS:
        for mb in BUCKETS:
            spec = quant_gemv_spec(3072, 2048, mb, h200, fmt, act, gran)
            cfg = quant_config(3072, 2048, mb, fmt, act, 132)
            assert spec.grid_dims({"M": mb}) == (-(-3072 // (16 * cfg.warps * cfg.tiles)), cfg.splitk, 1)
            assert spec.block == (32 * cfg.warps, 1, 1)
            assert spec.smem == smem_bytes(mb, cfg.slice_k, act)
            gx = spec.grid[0].const
            want = cfg.splitk * gx * 16 * cfg.tiles * cfg.warps * mb if cfg.splitk > 1 else 1
            assert workspace_floats(spec) == want
        any_m = quant_gemv_spec(3072, 2048, ANY_M_CHUNK, h200, fmt, act, gran, any_m=True)
        assert any_m.grid[2] == GridDim("M", ANY_M_CHUNK)
        assert any_m.grid_dims({"M": 130})[1:] == (1, 3)


def test_variants_and_plan_for_quantized_linear():
    h200 = get_target("h200")
    for fmt, act, gran in FORMATS:
        op, ins = qtypes(fmt, 512, 1024, act, gran, bias=True, residual=True)
        found = variants(op, ins, h200)
        assert [mb for mb, _ in found] == list(BUCKETS)
        assert all(s.template == "quant.cu" and [p.name for p in s.params] == [p[0] for p in PARAMS] for _, s in found)
        assert all(s.value("HAS_BIAS") and s.value("HAS_RESIDUAL") for _, s in found)
        (primary,) = quant_plan(op, ins, h200)
        assert primary.value("ANY_M") and primary.value("SPLITK") == 1
    assert "quantized_linear" in FAMILY.ops and FAMILY.plan(op, ins, h200) == quant_plan(op, ins, h200)


@pytest.mark.parametrize("case", ["mxfp4", "fp8-block", "fp8-tensor-scale", "f32-x", "nvfp4-w4a4", "k-not-steps",
                                  "sm100-layout", "cpu"])
def test_not_taken(case):
    h200 = get_target("h200")
    if case == "mxfp4":
        op = QuantizedLinear(weight_format="mxfp4", in_features=256)
        ins = [TensorType(DType.bf16, ("T", 256)), TensorType(DType.u8, (64, 128)), TensorType(DType.f8e8m0, (64, 8))]
    elif case == "fp8-block":
        op = QuantizedLinear(weight_format="fp8", weight_granularity="block", in_features=256)
        ins = [TensorType(DType.bf16, ("T", 256)), TensorType(DType.f8e4m3fn, (64, 256)), TensorType(DType.f32, (1, 2))]
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


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("fmt,act,gran", FORMATS)
@pytest.mark.parametrize("n,k,mb,any_m", [(3072, 2048, 8, False), (2048, 8192, 32, False), (200, 256, 64, False),
                                          (128256, 2048, 32, False), (1000, 4224, 64, True)])
def test_compiles_with_tensor_cores_and_wide_loads(target, fmt, act, gran, n, k, mb, any_m):
    if k % STEP_COLS[fmt]:
        pytest.skip("K not a whole number of steps")
    tgt = get_target(target)
    ops = sass_opcodes(quant_gemv_spec(n, k, mb, tgt, fmt, act, gran, bias=True, residual=True, any_m=any_m), tgt.arch)
    assert any(o.startswith("HMMA.16816.F32") for o in ops), sorted(ops)
    assert any(o.startswith("LDG") and ".128" in o for o in ops), sorted(ops)
    assert_no_local_memory(ops, "the quantized GEMV")
