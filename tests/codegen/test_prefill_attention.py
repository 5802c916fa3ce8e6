"""Tensor-core paged prefill attention (``codegen/kernels/attention/prefill_flash.cu``) without a GPU: when
``plan_prefill`` takes an attention launch, the spec (parameters shared with the decode kernels, grid, shared
memory), the lowering (the prefill kernel as the launch's kernel, the decode kernel its variant by ``num_tokens``),
and compile checks for sm_90a and sm_100a (tensor-core MMA and ldmatrix in the SASS)."""

from __future__ import annotations

import json

import pytest

import ingot
from ingot.codegen.kernel import GridDim
from ingot.codegen.kernels.attention.prefill_rule import (
    DECODE_MAX_ROWS,
    ROWS_ARG,
    plan_prefill,
    prefill_spec,
    prefill_supported,
    smem_bytes,
    tokens_per_cta,
)
from ingot.codegen.kernels.attention.split_rule import ATTEND_PARAMS
from ingot.codegen.registry import plan_op
from ingot.codegen.target import get_target
from ingot.ir.ops.llm import PagedAttention
from ingot.ir.ops.quantized import PagedAttentionFp8
from ingot.ir.types import DType
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    compiled,
    module_kernel_cache,
    needs_compiler,
    sass_opcodes,
    session_kernel_cache,
)
from tests.codegen.test_decode_attention import attn_types
from tests.frontend.dense_llama import TINY_CONFIG, random_weights, write_checkpoint
from tests.helpers import rng

bf16, f32, f8 = DType.bf16, DType.f32, DType.f8e4m3fn
h200 = get_target("h200")


@pytest.fixture(autouse=True)
def _flash(monkeypatch):
    """This file is the flash kernel's; the default on sm_90a is the wgmma kernel (test_prefill_wgmma.py)."""
    monkeypatch.setenv("INGOT_PREFILL_ATTENTION", "flash")


def family_attend(T, S, max_blocks, H=32, KV=8, D=128, dtype=bf16, softcap=0.0, window=0):
    op = PagedAttention(num_heads=H, num_kv_heads=KV, head_dim=D, scale=D ** -0.5, softcap=softcap,
                        sliding_window=window)
    return plan_op(op, attn_types(T, S, max_blocks, H, KV, D, dtype=dtype, cache=dtype), h200)[1]


def test_plan_prefill_takes_bf16_prefill_steps():
    sym = family_attend("T", "S", "max_blocks")
    assert sym.template == "decode_split.cu"
    flash = plan_prefill(sym, "T", h200)
    assert flash is not None and flash.template == "prefill_flash.cu"
    assert dict(flash.values)["SCALE"] == dict(sym.values)["SCALE"]
    # a static batch of prefill tokens whose family kernel is the one-pass kernel
    one_pass = family_attend(4096, 1, 256)
    assert one_pass.template == "paged_attention.cu"
    assert plan_prefill(one_pass, 4096, h200).template == "prefill_flash.cu"
    # softcap and sliding window travel with it; head_dim 64 with GQA 32/8 (the 1B shape)
    soft = plan_prefill(family_attend("T", "S", "max_blocks", softcap=30.0, window=512), "T", h200)
    assert (dict(soft.values)["SOFTCAP"], dict(soft.values)["SLIDING_WINDOW"]) == (30.0, 512)
    assert plan_prefill(family_attend("T", "S", "max_blocks", D=64), "T", h200) is not None


def test_plan_prefill_declines():
    sym = family_attend("T", "S", "max_blocks")
    assert plan_prefill(sym, DECODE_MAX_ROWS, h200) is None  # a static decode-sized step keeps the decode kernel
    assert plan_prefill(family_attend("T", "S", "max_blocks", dtype=f32), "T", h200) is None
    assert plan_prefill(family_attend("T", "S", "max_blocks", H=16, KV=2, D=256), "T", h200) is None
    assert plan_prefill(family_attend("T", "S", "max_blocks", H=8, KV=2, D=80), "T", h200) is None
    fp8 = PagedAttentionFp8(num_heads=32, num_kv_heads=8, head_dim=128, scale=0.088)
    fp8_attend = plan_op(fp8, attn_types("T", "S", "max_blocks", cache=f8, fp8_scale=True), h200)[1]
    assert plan_prefill(fp8_attend, "T", h200) is None
    assert plan_prefill(plan_op(fp8, attn_types("T", "S", "max_blocks", cache=f8, fp8_scale=True), h200)[0],
                        "T", h200) is None  # a cache write is no attention launch
    assert not prefill_supported(bf16, bf16, 128, 1, 128, 16)  # a group larger than the CTA's 64 rows


def test_spec_shares_the_decode_parameters():
    spec = prefill_spec(bf16, bf16, 32, 8, 64, 16, 0.125, h200)
    assert [(p.name, p.ctype) for p in spec.params] == ATTEND_PARAMS  # one argument block for kernel and variant
    assert ROWS_ARG in {p.name for p in spec.params}
    assert tokens_per_cta(32, 8) == 16 and tokens_per_cta(32, 32) == 64 and tokens_per_cta(9, 3) == 21
    assert spec.grid == (GridDim("num_tokens", 16), GridDim(const=8), GridDim())
    assert spec.grid_dims({"num_tokens": 4096, "num_seqs": 1, "max_blocks": 256}) == (256, 8, 1)
    assert spec.block == (128, 1, 1) and spec.smem == smem_bytes(64) == 2 * (64 + 256) * 64
    big = prefill_spec(bf16, bf16, 32, 32, 128, 16, 0.088, h200, warps=8)
    assert big.smem == 2 * (128 + 256) * 128 and big.block == (256, 1, 1)
    assert big.smem <= 227 * 1024
    with pytest.raises(ValueError):
        prefill_spec(bf16, f8, 32, 8, 128, 16, 0.088, h200)


@pytest.mark.usefixtures("session_kernel_cache")  # whole-model compiles: see common.py
def test_lowering_makes_prefill_the_launch_and_decode_its_variant(tmp_path, monkeypatch):
    """A head_dim-64 GQA model in the serving form: the attention launch runs the prefill kernel, with the decode
    kernel the family picked as its variant for steps of at most DECODE_MAX_ROWS tokens."""
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")  # the linears' kernels are not this test's subject
    cfg = {**TINY_CONFIG, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
           "num_hidden_layers": 1}
    ckpt = write_checkpoint(tmp_path / "ckpt", cfg, random_weights(cfg, rng()))
    path = ingot.compile(ckpt, target="h200", out=tmp_path / "a.ingot")
    cuda = json.loads((path / "manifest.json").read_text())["cuda"]
    attends = [ln for ln in cuda["launches"] if ln["op"] == "paged_attention" and "query_start_loc" in ln["args"]]
    assert attends
    for ln in attends:
        kernel = cuda["kernels"][ln["kernel"]]
        assert kernel["spec"]["template"] == "prefill_flash.cu" and kernel["smem"] == smem_bytes(64)
        assert ln["rows_arg"] == ROWS_ARG and ln["args"][ROWS_ARG] == {"dim": "T"}
        [variant] = ln["variants"]
        assert variant["max_rows"] == DECODE_MAX_ROWS
        assert cuda["variant_kernels"][variant["kernel"]]["spec"]["template"] == "decode_split.cu"
    monkeypatch.setenv("INGOT_NO_PREFILL_FLASH", "1")
    plain = json.loads((ingot.compile(ckpt, target="h200", out=tmp_path / "b.ingot") / "manifest.json").read_text())
    for ln in plain["cuda"]["launches"]:
        assert "rows_arg" not in ln or "skip" in ln  # decode fusion's skipped launches name their row count
        assert plain["cuda"]["kernels"][ln["kernel"]]["spec"]["template"] != "prefill_flash.cu"


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("H,KV,D,bs,softcap,window,warps", [
    (32, 8, 64, 16, 0.0, 0, 4), (32, 32, 128, 16, 0.0, 0, 4), (8, 8, 128, 32, 0.0, 0, 8),
    (9, 3, 64, 16, 30.0, 700, 4)])
def test_compiles_to_tensor_core_code(target, H, KV, D, bs, softcap, window, warps):
    tgt = get_target(target)
    spec = prefill_spec(bf16, bf16, H, KV, D, bs, D ** -0.5, tgt, softcap, window, warps=warps)
    built = compiled(spec)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in built.ptx and "cp.async" in built.ptx
    ops = sass_opcodes(built, tgt.arch)
    assert any(o.startswith("HMMA.16816.F32.BF16") for o in ops), sorted(ops)
    assert any(o.startswith("LDSM") and ".MT88" in o for o in ops) and any(o.startswith("LDGSTS") for o in ops)
