"""Split-KV decode attention (``codegen/kernels/attention/decode_split.cu``) without a GPU: when the rule picks
it, the split arithmetic the kernel uses (mirrored by ``split_plan``), grid and workspace, and compile checks."""

from __future__ import annotations

import pytest

from ingot.codegen import compile as cc
from ingot.codegen.kernel import GridDim
from ingot.codegen.kernels.attention.split_rule import (
    FP8_ATTEND_PARAMS,
    FP8_WRITE_PARAMS,
    MAX_SPLITS,
    cache_write_fp8_spec,
    decode_split_spec,
    split_config,
    split_plan,
    use_split,
    workspace_bytes,
)
from ingot.codegen.registry import plan_op
from ingot.codegen.sass import disassemble, find_cuobjdump, opcodes, sass_arch
from ingot.codegen.target import get_target
from ingot.ir.ops.llm import PagedAttention
from ingot.ir.ops.quantized import PagedAttentionFp8
from ingot.ir.types import DType, TensorType
from tests.codegen.common import module_kernel_cache, needs_compiler  # noqa: F401 (autouse fixture)

bf16, f32, f8 = DType.bf16, DType.f32, DType.f8e4m3fn


def attn_types(T, S, max_blocks, H=32, KV=8, D=128, bs=16, dtype=bf16, cache=bf16, fp8_scale=False):
    ins = [TensorType(dtype, (T, H * D)), TensorType(dtype, (T, KV * D)), TensorType(dtype, (T, KV * D)),
           TensorType(cache, ("num_blocks", 2, bs, KV, D)), TensorType(DType.i32, (S, max_blocks)),
           TensorType(DType.i32, (S,)), TensorType(DType.i32, ("S+1",)), TensorType(DType.i64, (T,))]
    if fp8_scale:
        ins.append(TensorType(f32, (2, KV)))
    return ins


def test_rule_picks_split_for_long_or_symbolic_contexts():
    h200 = get_target("h200")

    def templates(ins, H=32, KV=8, D=128):
        o = PagedAttention(num_heads=H, num_kv_heads=KV, head_dim=D, scale=D ** -0.5)
        return [s.template for s in plan_op(o, ins, h200)]

    assert templates(attn_types("T", "S", "max_blocks")) == ["cache_write.cu", "decode_split.cu"]
    assert templates(attn_types(32, 32, 256)) == ["cache_write.cu", "decode_split.cu"]  # batch 32, 4k context
    assert templates(attn_types(32, 32, 16)) == ["cache_write.cu", "paged_attention.cu"]  # 256-token contexts
    assert templates(attn_types(2048, 64, 256)) == ["cache_write.cu", "paged_attention.cu"]  # the batch fills it
    assert templates(attn_types("T", "S", "max_blocks", dtype=f32, cache=f32)) == ["cache_write.cu",
                                                                                      "paged_attention.cu"]
    odd = attn_types("T", "S", "max_blocks", H=8, KV=2, D=80)
    assert templates(odd, H=8, KV=2, D=80) == ["cache_write.cu", "paged_attention.cu"]
    big_group = attn_types("T", "S", "max_blocks", H=64, KV=4)
    assert templates(big_group, H=64, KV=4) == ["cache_write.cu", "paged_attention.cu"]
    fp8 = PagedAttentionFp8(num_heads=32, num_kv_heads=8, head_dim=128, scale=0.088)
    write, attend = plan_op(fp8, attn_types("T", "S", "max_blocks", cache=f8, fp8_scale=True), h200)
    assert (write.template, attend.template) == ("cache_write_fp8.cu", "decode_split.cu")
    assert [p.name for p in attend.params] == [p[0] for p in FP8_ATTEND_PARAMS]
    assert [p.name for p in write.params] == [p[0] for p in FP8_WRITE_PARAMS]
    fp8_odd = PagedAttentionFp8(num_heads=8, num_kv_heads=2, head_dim=80, scale=0.1)
    assert plan_op(fp8_odd, attn_types("T", "S", "max_blocks", H=8, KV=2, D=80, cache=f8, fp8_scale=True), h200,
                   fallback=False) is None
    assert use_split(bf16, bf16, 32, 8, 128, 16, None, None, h200)


@pytest.mark.parametrize("D,G,bs", [(128, 4, 16), (64, 3, 16), (256, 2, 16), (128, 8, 32), (64, 4, 8)])
def test_split_arithmetic(D, G, bs):
    cfg = split_config(D, 8, G, bs, 132)
    assert bs % cfg.tile == 0 and cfg.iters >= 1
    for num_tokens in (1, 4, 32, 65, 66, 300):
        for first, qpos in ((0, 0), (0, 15), (0, 4095), (100, 4095), (3000, 3010), (0, 70000)):
            for token in (0, num_tokens - 1):
                nsplit, per = split_plan(cfg, first, qpos, num_tokens, token)
                nblk = qpos // bs - first // bs + 1
                assert 1 <= nsplit <= MAX_SPLITS and (nsplit - 1) * per < nblk <= nsplit * per
                if nsplit > 1:  # only tokens whose partials fit the workspace split, and only while the grid is small
                    assert token < cfg.token_cap and num_tokens * cfg.num_kv_heads < cfg.target_ctas
                    assert per * bs >= 256 or nsplit == -(-nblk // per)
    assert split_plan(cfg, 0, 4095, 32, 0)[0] > 1  # the benchmark's case splits


def test_grid_and_workspace():
    h200 = get_target("h200")
    spec = decode_split_spec(bf16, bf16, 32, 8, 128, 16, 0.088, h200)
    cfg = split_config(128, 8, 4, 16, 132)
    assert spec.grid == (GridDim("num_tokens"), GridDim(const=8), GridDim(const=MAX_SPLITS))
    assert spec.grid_dims({"num_tokens": 32, "num_seqs": 32, "max_blocks": 256}) == (32, 8, MAX_SPLITS)
    slots = cfg.token_cap * 8 * MAX_SPLITS * 4
    assert workspace_bytes(cfg) == 4 * (slots * 128 + slots * 2 + cfg.token_cap * 8)
    assert cfg.token_cap * 8 >= cfg.target_ctas
    assert workspace_bytes(cfg) < 64 << 20


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("cache,kv_scale,H,KV,D,bs,softcap,window", [
    (bf16, False, 32, 8, 128, 16, 0.0, 0), (f8, True, 32, 8, 128, 16, 0.0, 0), (bf16, False, 9, 3, 64, 16, 30.0, 64),
    (f8, False, 16, 2, 256, 16, 0.0, 0), (bf16, False, 64, 8, 128, 32, 0.0, 0)])
def test_compiles(target, cache, kv_scale, H, KV, D, bs, softcap, window):
    tgt = get_target(target)
    specs = [decode_split_spec(bf16, cache, H, KV, D, bs, D ** -0.5, tgt, softcap, window, kv_scale=kv_scale)]
    if kv_scale:
        specs.append(cache_write_fp8_spec(bf16, KV, D, bs, tgt))
    for spec in specs:
        built = cc.compile_spec(spec)
        assert built.cubin and spec.entry in built.ptx
        if find_cuobjdump() is None:
            continue
        sass = disassemble(built.cubin)
        assert sass_arch(sass) == tgt.arch
        ops = opcodes(sass)
        assert not any(o.startswith(("LDL", "STL")) for o in ops), f"{spec.entry}: local memory (spills)"
        if spec.template == "decode_split.cu":
            assert any(o.startswith("LDG") and (".128" in o or ".64" in o) for o in ops), sorted(ops)
