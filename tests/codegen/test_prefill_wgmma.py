"""The wgmma paged prefill attention kernel (``codegen/kernels/attention/prefill_wgmma.cu``) without a GPU: what
``prefill_wgmma_rule`` takes and declines, its spec (the flash kernel's parameters, grid, shared memory), the
the selection through ``INGOT_PREFILL_ATTENTION`` (``prefill_rule.plan_prefill`` and the lowering), compile
checks for sm_90a (warpgroup MMA, ``HGMMA``, with the V operand transposed in the SASS; no local memory), and a
numpy model of one tile through the kernel's shared-memory layout, descriptors and fragments as the PTX ISA
describes wgmma's reads (what a GPU run would show first if the kernel and that description disagreed)."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

import ingot
from ingot.codegen.kernel import GridDim
from ingot.codegen.kernels.attention import prefill_rule
from ingot.codegen.kernels.attention.prefill_rule import KERNEL_ENV, plan_prefill, prefill_kernel
from ingot.codegen.kernels.attention.prefill_wgmma_rule import (
    MAX_SMEM,
    WgmmaConfig,
    config_name,
    default_config,
    parse_config,
    smem_bytes,
    supported,
    tokens_per_cta,
    wgmma_spec,
)
from ingot.codegen.kernels.attention.split_rule import ATTEND_PARAMS
from ingot.codegen.target import get_target
from ingot.ir.types import DType
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    compiled,
    disassembled,
    module_kernel_cache,
    needs_compiler,
    session_kernel_cache,
)
from tests.codegen.test_prefill_attention import family_attend
from tests.frontend.dense_llama import TINY_CONFIG, random_weights, write_checkpoint
from tests.helpers import rng

bf16, f32, f16, f8 = DType.bf16, DType.f32, DType.f16, DType.f8e4m3fn
h200, b200 = get_target("h200"), get_target("b200")


def test_supported_and_declined():
    assert supported(bf16, bf16, 32, 8, 64, 16, h200) and supported(bf16, bf16, 32, 32, 128, 16, h200)
    assert supported(bf16, bf16, 9, 3, 64, 16, h200)  # a group that does not divide the CTA's 128 rows
    assert not supported(bf16, bf16, 32, 8, 128, 16, b200)  # no wgmma on sm_100a
    assert not supported(bf16, bf16, 32, 8, 128, 16, get_target("cpu"))
    assert not supported(f32, f32, 32, 8, 128, 16, h200) and not supported(f16, f16, 32, 8, 128, 16, h200)
    assert not supported(bf16, f8, 32, 8, 128, 16, h200)  # FP8 cache
    for d in (80, 96, 256):
        assert not supported(bf16, bf16, 32, 8, d, 16, h200)
    assert not supported(bf16, bf16, 256, 1, 128, 16, h200)  # a group larger than the CTA's 128 rows
    assert not supported(bf16, bf16, 128, 1, 128, 16, h200, WgmmaConfig(1, 128, 2))  # ... or 64 rows
    assert not supported(bf16, bf16, 32, 8, 128, 16, h200, WgmmaConfig(2, 96, 2))
    assert not supported(bf16, bf16, 32, 8, 128, 16, h200, WgmmaConfig(2, 128, 4))
    assert not supported(bf16, bf16, 32, 8, 128, 16, h200, WgmmaConfig(2, 128, 2, overlap=True))  # needs 3 stages
    assert supported(bf16, bf16, 32, 8, 128, 16, h200, WgmmaConfig(2, 128, 3, overlap=True, producer=True))
    assert supported(bf16, bf16, 32, 8, 128, 16, h200, WgmmaConfig(2, 128, 3, overlap=True))
    assert not supported(bf16, bf16, 32, 5, 128, 16, h200)  # heads not a multiple of the KV heads
    # ping-pong turns are between two consumer warpgroups beside a producer; the other knobs go anywhere
    assert supported(bf16, bf16, 32, 8, 128, 16, h200, WgmmaConfig(2, 128, 3, producer=True, pingpong=True))
    assert supported(bf16, bf16, 32, 8, 64, 16, h200, WgmmaConfig(2, 64, 3, True, True, pingpong=True))
    assert not supported(bf16, bf16, 32, 8, 128, 16, h200, WgmmaConfig(2, 128, 3, pingpong=True))
    assert not supported(bf16, bf16, 32, 8, 128, 16, h200, WgmmaConfig(1, 128, 3, producer=True, pingpong=True))
    # TMA copies are the producer's, of whole 8k-row parts of blocks that tile the K/V tile
    assert supported(bf16, bf16, 32, 8, 128, 16, h200, WgmmaConfig(2, 128, 3, producer=True, tma=True))
    assert supported(bf16, bf16, 32, 8, 128, 256, h200, WgmmaConfig(2, 64, 3, producer=True, tma=True))
    assert not supported(bf16, bf16, 32, 8, 128, 16, h200, WgmmaConfig(2, 128, 3, tma=True))
    # zeroing the V rows past the context is the TMA producer's (its copies brought them)
    assert supported(bf16, bf16, 32, 8, 128, 16, h200, WgmmaConfig(2, 128, 3, producer=True, tma=True, v_zero=True))
    assert not supported(bf16, bf16, 32, 8, 128, 16, h200, WgmmaConfig(2, 128, 3, producer=True, v_zero=True))
    for bs in (4, 12, 24, 48):
        assert not supported(bf16, bf16, 32, 8, 128, bs, h200, WgmmaConfig(2, 128, 3, producer=True, tma=True))
        assert supported(bf16, bf16, 32, 8, 128, bs, h200, WgmmaConfig(2, 128, 3, producer=True))
    for knobs in ({"heavy_first": True}, {"lean_mask": True}):
        assert supported(bf16, bf16, 32, 8, 64, 16, h200, WgmmaConfig(1, 64, 2, **knobs))
        assert supported(bf16, bf16, 32, 8, 128, 16, h200, WgmmaConfig(2, 128, 3, True, True, **knobs))
    with pytest.raises(ValueError):
        wgmma_spec(bf16, bf16, 32, 8, 128, 16, 0.088, b200)


def test_spec_shares_the_flash_parameters():
    spec = wgmma_spec(bf16, bf16, 32, 8, 64, 16, 0.125, h200)
    assert spec.template == "prefill_wgmma.cu" and spec.arch == "sm_90a"
    assert [(p.name, p.ctype) for p in spec.params] == ATTEND_PARAMS
    cfg = default_config(64)
    assert tokens_per_cta(32, 8, cfg) == 32 and tokens_per_cta(32, 32, cfg) == 128 and tokens_per_cta(9, 3, cfg) == 42
    assert spec.grid == (GridDim("num_tokens", 32), GridDim(const=8), GridDim())
    assert spec.grid_dims({"num_tokens": 4096, "num_seqs": 1, "max_blocks": 256}) == (128, 8, 1)
    # the default (2x128x3wshflmtmvz): a producer warpgroup (loading K/V by TMA, zeroing the V rows past the context)
    # beside the two consumers, three stages of 128-position tiles, the heaviest CTAs first, the mask only where it
    # cuts; at head_dim 128 with ping-pong consumers; caches of blocks TMA copies cannot tile load by cp.async (which
    # zero-fills), without ping-pong
    assert cfg == default_config(64, 16) == WgmmaConfig(2, 128, 3, producer=True, heavy_first=True, lean_mask=True,
                                                        tma=True, v_zero=True)
    assert default_config(128) == default_config(128, 256) == replace(cfg, pingpong=True)
    assert default_config(128, 12) == default_config(64, 4) == replace(cfg, tma=False, v_zero=False)
    assert dict(wgmma_spec(bf16, bf16, 32, 8, 64, 12, 0.125, h200).values)["TMA"] is False
    assert spec.block == (384, 1, 1) and spec.smem == smem_bytes(64, cfg) == 1024 + 2 * 64 * (128 + 6 * 128) + 3 * 24
    one = wgmma_spec(bf16, bf16, 8, 8, 128, 32, 0.088, h200, cfg=WgmmaConfig(1, 64, 3))
    assert one.block == (128, 1, 1) and one.smem == 1024 + 2 * 128 * (64 + 6 * 64)
    ws = wgmma_spec(bf16, bf16, 32, 8, 128, 16, 0.088, h200, cfg=WgmmaConfig(2, 128, 2, producer=True))
    assert ws.block == (384, 1, 1) and ws.smem == 1024 + 2 * 128 * (128 + 4 * 128) + 2 * 2 * 8
    assert ws.grid == (GridDim("num_tokens", 32), GridDim(const=8), GridDim())
    for d in (64, 128):
        for cfg in (default_config(d), WgmmaConfig(2, 128, 3), WgmmaConfig(2, 64, 3), WgmmaConfig(1, 128, 2),
                    WgmmaConfig(2, 128, 3, True), WgmmaConfig(2, 128, 3, True, True)):
            assert smem_bytes(d, cfg) <= MAX_SMEM
    assert smem_bytes(128, default_config(128)) == 1024 + 2 * 128 * (128 + 6 * 128) + 3 * 24


def test_knobs_are_opt_in_and_tagged():
    """heavy_first, lean_mask, pingpong and tma are off in a plain WgmmaConfig (default_config turns the first two on,
    as measured), each reaches the template as a value and tags the kernel name; none changes shared memory or the
    launch."""
    assert not (WgmmaConfig().heavy_first or WgmmaConfig().lean_mask or WgmmaConfig().pingpong)
    assert not default_config(64).pingpong and default_config(128).pingpong and not default_config(128, 12).pingpong
    base = WgmmaConfig(2, 128, 3, producer=True)
    plain = wgmma_spec(bf16, bf16, 32, 8, 128, 16, 0.088, h200, cfg=base)

    def tag(spec) -> str:  # the entry without its hash of the values
        return spec.entry.rsplit("_", 1)[0]

    assert tag(plain).endswith("_wg2_n128_s3_ws")
    values = dict(plain.values)
    assert (values["HEAVY_FIRST"], values["LEAN_MASK"], values["PINGPONG"], values["TMA"]) == (False,) * 4
    for knob, suffix, key in (("heavy_first", "_hf", "HEAVY_FIRST"), ("lean_mask", "_lm", "LEAN_MASK"),
                              ("pingpong", "_pp", "PINGPONG"), ("tma", "_tm", "TMA")):
        spec = wgmma_spec(bf16, bf16, 32, 8, 128, 16, 0.088, h200, cfg=replace(base, **{knob: True}))
        assert tag(spec) == tag(plain) + suffix and dict(spec.values)[key] is True
        assert (spec.smem, spec.block, spec.grid) == (plain.smem, plain.block, plain.grid)
    every = replace(base, overlap=True, heavy_first=True, lean_mask=True, pingpong=True, tma=True)
    assert tag(wgmma_spec(bf16, bf16, 32, 8, 128, 16, 0.088, h200, cfg=every)).endswith("_s3_ov_ws_hf_lm_pp_tm")
    # v_zero (with tma): a third mbarrier per stage, the only change to the launch
    vz = wgmma_spec(bf16, bf16, 32, 8, 128, 16, 0.088, h200, cfg=replace(every, v_zero=True))
    assert tag(vz).endswith("_pp_tm_vz") and dict(vz.values)["VZ"] is True and not dict(plain.values)["VZ"]
    tm = wgmma_spec(bf16, bf16, 32, 8, 128, 16, 0.088, h200, cfg=every)
    assert vz.smem == tm.smem + 3 * 8 and (vz.block, vz.grid) == (tm.block, tm.grid)
    assert parse_config("2x128x3wshflmpptmvz") == default_config(128)
    assert config_name(default_config(64)) == "2x128x3wshflmtmvz"


def heavy_first_order(grid_x: int, kv: int) -> list[tuple[int, int]]:
    """(token range b, KV head) of CTA after CTA in launch order (x fastest, then y) under HEAVY_FIRST, as the
    kernel computes them from blockIdx (gridDim.y == KV)."""
    return [(grid_x - 1 - lin // kv, lin % kv) for lin in (y * grid_x + x for y in range(kv) for x in range(grid_x))]


@pytest.mark.parametrize("grid_x,kv", [(32, 32), (512, 8), (7, 3), (1, 1)])
def test_heavy_first_covers_the_grid_longest_first(grid_x, kv):
    """Every (token range, KV head) once, and the token ranges (causally: the later, the more K/V tiles) never
    increase along the launch order: every head's last range first, the first ranges in the grid's last wave."""
    order = heavy_first_order(grid_x, kv)
    assert sorted(order) == [(b, h) for b in range(grid_x) for h in range(kv)]
    ranges = [b for b, _ in order]
    assert ranges == sorted(ranges, reverse=True)


def test_selection_is_the_default(monkeypatch):
    sym = family_attend("T", "S", "max_blocks")
    monkeypatch.setenv(KERNEL_ENV, "flash")
    assert prefill_kernel() == "flash" and plan_prefill(sym, "T", h200).template == "prefill_flash.cu"
    monkeypatch.delenv(KERNEL_ENV)
    assert prefill_kernel() == "wgmma"
    chosen = plan_prefill(sym, "T", h200)
    assert chosen.template == "prefill_wgmma.cu"
    assert dict(chosen.values)["SCALE"] == dict(sym.values)["SCALE"]
    soft = plan_prefill(family_attend("T", "S", "max_blocks", softcap=30.0, window=512), "T", h200)
    assert soft.template == "prefill_wgmma.cu"
    assert (dict(soft.values)["SOFTCAP"], dict(soft.values)["SLIDING_WINDOW"]) == (30.0, 512)
    assert plan_prefill(family_attend("T", "S", "max_blocks", D=64), "T", h200).template == "prefill_wgmma.cu"
    # what the wgmma kernel declines keeps the flash kernel (b200) or the family's kernel (f32, head_dim 256)
    assert plan_prefill(sym, "T", b200).template == "prefill_flash.cu"
    assert plan_prefill(family_attend("T", "S", "max_blocks", dtype=f32), "T", h200) is None
    assert plan_prefill(family_attend("T", "S", "max_blocks", H=16, KV=2, D=256), "T", h200) is None
    assert plan_prefill(sym, prefill_rule.DECODE_MAX_ROWS, h200) is None
    # an explicit choice wins over the environment
    assert plan_prefill(sym, "T", h200, kernel="flash").template == "prefill_flash.cu"
    monkeypatch.setenv(KERNEL_ENV, "fa3")
    with pytest.raises(ValueError):
        prefill_kernel()


@pytest.mark.usefixtures("session_kernel_cache")  # whole-model compiles: see common.py
def test_lowering_takes_wgmma_unless_told_otherwise(tmp_path, monkeypatch):
    """The serving form of a head_dim-64 GQA model: by default the attention launch runs the wgmma kernel (the decode
    kernel still its variant); with ``INGOT_PREFILL_ATTENTION=flash``, the flash kernel."""
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")  # the linears' kernels are not this test's subject
    cfg = {**TINY_CONFIG, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
           "num_hidden_layers": 1}
    ckpt = write_checkpoint(tmp_path / "ckpt", cfg, random_weights(cfg, rng()))

    def attention_templates(out: str) -> list[tuple[str, int, list[str]]]:
        cuda = json.loads((ingot.compile(ckpt, target="h200", out=tmp_path / out) / "manifest.json").read_text())
        cuda = cuda["cuda"]
        found = []
        for ln in cuda["launches"]:
            if ln["op"] == "paged_attention" and "query_start_loc" in ln["args"]:
                assert ln["rows_arg"] == prefill_rule.ROWS_ARG
                kernel = cuda["kernels"][ln["kernel"]]
                variants = [cuda["variant_kernels"][v["kernel"]]["spec"]["template"] for v in ln["variants"]]
                found.append((kernel["spec"]["template"], kernel["smem"], variants))
        assert found
        return found

    monkeypatch.delenv(KERNEL_ENV, raising=False)
    for template, smem, variants in attention_templates("wgmma.ingot"):
        assert template == "prefill_wgmma.cu" and smem == smem_bytes(64, default_config(64))
        assert variants == ["decode_split.cu"]
    monkeypatch.setenv(KERNEL_ENV, "flash")
    assert {t for t, _, _ in attention_templates("flash.ingot")} == {"prefill_flash.cu"}


def sass_counts(sass: str) -> Counter:
    """Opcode counts of a listing, by full opcode with modifiers (``HGMMA.64x128x16.F32.BF16``)."""
    return Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.x]*)", sass))


@needs_compiler
@pytest.mark.parametrize("H,KV,D,bs,softcap,window,cfg", [
    (32, 32, 128, 16, 0.0, 0, None), (32, 8, 64, 16, 0.0, 0, None), (8, 8, 128, 32, 0.0, 0, WgmmaConfig(2, 64, 3)),
    (32, 8, 64, 16, 0.0, 0, WgmmaConfig(1, 64, 2)), (9, 3, 64, 16, 30.0, 700, WgmmaConfig(2, 128, 2)),
    (16, 4, 128, 32, 0.0, 0, WgmmaConfig(1, 128, 3)), (32, 32, 128, 16, 0.0, 0, WgmmaConfig(2, 128, 3, True)),
    (32, 8, 64, 16, 0.0, 0, WgmmaConfig(2, 64, 3, True)), (9, 3, 64, 16, 30.0, 700, WgmmaConfig(2, 128, 3, True)),
    (32, 32, 128, 16, 0.0, 0, WgmmaConfig(2, 128, 2, producer=True)),
    (32, 8, 64, 16, 0.0, 0, WgmmaConfig(1, 128, 3, producer=True)),
    (9, 3, 128, 16, 30.0, 700, WgmmaConfig(2, 64, 3, producer=True)),
    (32, 32, 128, 16, 0.0, 0, WgmmaConfig(2, 128, 3, True, True)),
    (32, 8, 64, 16, 0.0, 0, WgmmaConfig(1, 64, 3, True, True)),
    # the opt-in knobs, alone and together, with and without overlap, softcap and window
    (32, 32, 128, 16, 0.0, 0, WgmmaConfig(2, 128, 3, producer=True, heavy_first=True)),
    (32, 8, 64, 16, 0.0, 0, WgmmaConfig(1, 64, 2, lean_mask=True)),
    (32, 32, 128, 16, 0.0, 0, WgmmaConfig(2, 128, 3, producer=True, lean_mask=True)),
    (9, 3, 64, 16, 30.0, 700, WgmmaConfig(2, 64, 3, producer=True, lean_mask=True)),
    (32, 32, 128, 16, 0.0, 0, WgmmaConfig(2, 128, 3, True, True, lean_mask=True)),
    (32, 32, 128, 16, 0.0, 0, WgmmaConfig(2, 128, 3, producer=True, pingpong=True)),
    (32, 8, 64, 16, 0.0, 0, WgmmaConfig(2, 64, 3, producer=True, pingpong=True)),
    (32, 32, 128, 16, 0.0, 0, WgmmaConfig(2, 128, 3, True, True, pingpong=True)),
    (9, 3, 128, 16, 30.0, 700, WgmmaConfig(2, 64, 3, True, True, lean_mask=True, pingpong=True)),
    (32, 32, 128, 16, 0.0, 0, WgmmaConfig(2, 128, 3, producer=True, heavy_first=True, lean_mask=True, pingpong=True)),
    (32, 8, 64, 16, 0.0, 0, WgmmaConfig(2, 64, 3, producer=True, heavy_first=True, lean_mask=True, pingpong=True)),
    # K/V by TMA: the default's knobs, one consumer, blocks larger than the tile, overlap + ping-pong + window
    (32, 32, 128, 16, 0.0, 0, WgmmaConfig(2, 128, 3, producer=True, heavy_first=True, lean_mask=True, tma=True)),
    (32, 8, 64, 32, 0.0, 0, WgmmaConfig(1, 64, 3, producer=True, tma=True)),
    (16, 4, 128, 256, 0.0, 0, WgmmaConfig(2, 128, 2, producer=True, tma=True)),
    (9, 3, 128, 16, 30.0, 700, WgmmaConfig(2, 64, 3, True, True, lean_mask=True, pingpong=True, tma=True)),
    # ... with the V rows past the context zeroed by the producer's second warp
    (32, 32, 128, 16, 0.0, 0, WgmmaConfig(2, 128, 3, producer=True, heavy_first=True, lean_mask=True, pingpong=True,
                                          tma=True, v_zero=True)),
    (32, 8, 64, 32, 0.0, 0, WgmmaConfig(1, 64, 3, producer=True, tma=True, v_zero=True)),
    (9, 3, 64, 16, 30.0, 700, WgmmaConfig(2, 64, 3, True, True, lean_mask=True, pingpong=True, tma=True,
                                          v_zero=True))])
def test_compiles_to_warpgroup_mma(H, KV, D, bs, softcap, window, cfg):
    spec = wgmma_spec(bf16, bf16, H, KV, D, bs, D ** -0.5, h200, softcap, window, cfg=cfg)
    cfg = cfg or default_config(D)
    built = compiled(spec)
    assert f"wgmma.mma_async.sync.aligned.m64n{cfg.block_n}k16.f32.bf16.bf16" in built.ptx  # S = Q K^T
    assert f"wgmma.mma_async.sync.aligned.m64n{D}k16.f32.bf16.bf16" in built.ptx  # O += P V
    assert "fence.proxy.async" in built.ptx and "cp.async" in built.ptx
    assert not re.search(r"\.local\b", built.ptx), "local memory (a spill or an indexed register array) in PTX"
    sass = disassembled(built, "sm_90a")
    ops = sass_counts(sass)
    assert_no_local_memory(ops, "the SASS")
    qk = f"HGMMA.64x{cfg.block_n}x16.F32.BF16"
    pv = f"HGMMA.64x{D}x16.F32.BF16"
    hgmma = {o: n for o, n in ops.items() if o.startswith("HGMMA")}
    # one instruction per 16 head_dim elements (S) and per 16 positions (O), unrolled once per tile; with overlap
    # the last tile's O += P V is issued again after the loop, with ping-pong (no overlap) the first tile's S before
    n_pv = cfg.block_n // 16 * (2 if cfg.overlap else 1)
    n_qk = D // 16 * (2 if cfg.pingpong and not cfg.overlap else 1)
    if qk == pv:
        assert hgmma == {qk: n_qk + n_pv}, hgmma
    else:
        assert hgmma == {qk: n_qk, pv: n_pv}, hgmma
    # the wgmmas pipelined, not serialized (ptxas's C7512 "serialized due to insufficient register resources" puts
    # a wait after every one): one wait per group
    assert ops["WARPGROUP.DEPBAR.LE"] <= 3, ops["WARPGROUP.DEPBAR.LE"]
    assert ".tnspB" in sass  # V is the MN-major (transposed) B operand
    assert "WARPGROUP.ARRIVE" in sass and "WARPGROUP.DEPBAR" in sass
    assert not any(o.startswith("HMMA") for o in ops)  # no mma.sync left
    if not softcap:  # (tanhf has exp2s of its own)
        # lean_mask: the softmax compiled twice (tiles with and without the mask), so twice the exp2s of a tile
        # (BN / 2 and the 2 row corrections each), and the exponent's argument one FFMA per score
        exps = ops["MUFU.EX2"]
        assert exps >= cfg.block_n if cfg.lean_mask else exps < cfg.block_n, exps
        assert (ops["FFMA"] >= cfg.block_n) == cfg.lean_mask, ops["FFMA"]
    if cfg.pingpong:  # turns: named barriers of 256 threads, bar.sync for its own, bar.arrive for the other's
        assert "bar.arrive" in built.ptx and "BAR.ARV" in sass
        assert re.search(r"BAR\.SYNC\S* R\d+, 0x100", sass) and re.search(r"BAR\.ARV R\d+, 0x100", sass)
    else:
        assert "bar.arrive" not in built.ptx
    if cfg.producer:  # mbarriers, cp.async (or TMA) arriving on them; registers moved from producer to consumers
        assert "mbarrier.try_wait.parity" in built.ptx
        assert ("cp.async.mbarrier.arrive.noinc" in built.ptx) != cfg.tma
        # TMA: tensor copies completing the stage's transaction bytes, lane 0 arriving with their count
        assert ("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in built.ptx
                and "mbarrier.arrive.expect_tx" in built.ptx and "UTMALDG.3D" in ops) == cfg.tma
        # v_zero: the second warp's 16-byte zero stores into the V tile, fenced for the async proxy
        if cfg.v_zero:
            assert "st.shared.v4.u32" in built.ptx and "STS.128" in ops
        assert ("setmaxnreg" in built.ptx) == (cfg.warpgroups == 2)
        assert spec.block == (128 * (cfg.warpgroups + 1), 1, 1)
        if cfg.warpgroups == 2:  # setmaxnreg only moves registers: the CTA must start with the 40 + 2 x 232 it
            # hands out (128 threads each), else the consumers' setmaxnreg.inc waits forever
            regs = _registers(built.cubin)
            assert regs * spec.block[0] >= 128 * (40 + 2 * 232), f"{regs} registers a thread at entry"


def pingpong_turns(subtiles: list[int], wg: int, overlap: bool) -> list[tuple[str, int]]:
    """The named-barrier operations consumer ``wg`` runs under PINGPONG for a CTA whose sub-tiles have these many
    K/V tiles, in prefill_wgmma.cu's order: ("sync", id) for bar.sync, ("arrive", id) for bar.arrive."""
    own, other, ops = 3 + wg, 4 - wg, []
    for j, ntiles in enumerate(subtiles):
        if wg == 1 and j == 0:
            ops.append(("arrive", 3))  # consumer 0's first turn
        give_last = wg == 0 or j + 1 < len(subtiles)
        if overlap:  # a turn per tile (S of it, O += P V of it - 1), then the last O += P V
            for _ in range(ntiles):
                ops += [("sync", own), ("arrive", other)]
            ops += [("sync", own)] + ([("arrive", other)] if give_last else [])
        else:  # S of the first tile, then a turn per tile (O += P V of it, S of the next)
            ops += [("sync", own), ("arrive", other)]
            for it in range(ntiles):
                ops += [("sync", own)] + ([("arrive", other)] if it + 1 < ntiles or give_last else [])
    return ops


def run_named_barriers(programs: list[list[tuple[str, int]]]) -> tuple[list[str], dict[int, int]]:
    """Run warpgroups' barrier operations as the hardware does with 256-thread barriers of two warpgroups (a phase
    completes at two arrivals; bar.sync arrives, then waits for its phase): the order the turns were taken in
    (a warpgroup's index per completed sync) and the arrivals left in unfinished phases. Raises on a deadlock and
    on a warpgroup arriving twice in one phase (its 256 threads would complete the phase alone)."""
    pc, waiting = [0] * len(programs), [None] * len(programs)  # waiting: (barrier, phase) a sync waits for
    count, phase, members, turns = Counter(), Counter(), {}, []
    while any(pc[w] < len(p) for w, p in enumerate(programs)):
        moved = False
        for w, prog in enumerate(programs):
            if waiting[w] is not None:
                bar, ph = waiting[w]
                if phase[bar] > ph:
                    waiting[w], moved = None, True
                    turns.append(str(w))
                continue
            if pc[w] == len(prog):
                continue
            kind, bar = prog[pc[w]]
            pc[w], moved = pc[w] + 1, True
            assert w not in members.setdefault(bar, set()), f"warpgroup {w} arrived twice at barrier {bar}"
            members[bar].add(w)
            count[bar] += 1
            if kind == "sync":
                waiting[w] = (bar, phase[bar])
            if count[bar] == 2:
                count[bar], phase[bar], members[bar] = 0, phase[bar] + 1, set()
        if not moved:
            raise AssertionError(f"deadlock at {pc} (waiting {waiting})")
    return turns, {b: n for b, n in count.items() if n}


@pytest.mark.parametrize("overlap", [False, True])
def test_pingpong_turns_alternate_and_leave_no_barrier_half_arrived(overlap):
    """The consumers' turns under PINGPONG (a model of the kernel's sequence of bar.sync / bar.arrive): for CTAs of
    no, one and several sub-tiles of 1.. many tiles, every sync completes, turns alternate consumer 0, 1, 0, 1, ..
    and no phase is left half-arrived when the CTA exits."""
    r = rng()
    shapes = [[], [1], [2], [5], [1, 1], [3, 1, 4]] + [list(r.integers(1, 9, r.integers(1, 6))) for _ in range(20)]
    for subtiles in shapes:
        turns, left = run_named_barriers([pingpong_turns(subtiles, wg, overlap) for wg in (0, 1)])
        per_consumer = sum(n + 1 for n in subtiles)
        assert turns == ["0", "1"] * per_consumer, (subtiles, turns)
        assert left == {}, (subtiles, left)


def _registers(cubin: bytes) -> int:
    """Registers per thread of the one kernel in ``cubin`` (``cuobjdump --dump-resource-usage``)."""
    import subprocess
    import tempfile

    from ingot.codegen.sass import find_cuobjdump

    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump for the resource usage: pip install nvidia-cuda-cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
    found = re.findall(r"REG:(\d+)", out)
    assert len(found) == 1, out
    return int(found[0])


# -- the shared-memory layout and descriptors, modelled on the CPU ------------------------------------------------
#
# What wgmma reads through a descriptor (PTX ISA "Shared Memory Matrix Layout", CUTLASS's GmmaDescriptor): the
# canonical SWIZZLE_128B layouts in bytes, then the swizzle applied to the whole address (bits [4, 7) ^= bits
# [7, 10)). K-major (A or B not transposed): element (row, k) of a 16-wide k-step at start + (row % 8) * 128 +
# (row // 8) * SBO + 2 k (LBO unused). MN-major (B transposed): element (k, n) at start + 2 (n % 64) +
# (n // 64) * LBO + (k % 8) * 128 + (k // 8) * SBO. The kernel's side below mirrors prefill_wgmma.cu: pw_off for
# where cp.async puts (row, 16-byte chunk), pw_qk / pw_pv for the descriptors, the m64nNk16 accumulator layout
# (register 4 i + e of thread t: row 16 (t // 32) + (t % 32) // 4 + 8 (e // 2), column 8 i + 2 (t % 4) + e % 2) and
# pw_pack_p for P. A wrong offset on either side shows as S or O differing from numpy.


def swizzle128(addr: np.ndarray) -> np.ndarray:
    return addr ^ (((addr >> 7) & 7) << 4)


def decode_desc(desc: int) -> tuple[int, int, int, int]:
    """(start address, LBO, SBO, layout) from a descriptor's bits."""
    return ((desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4, desc >> 62)


def read_k_major(smem: np.ndarray, desc: int, rows: int) -> np.ndarray:
    """The rows x 16 bf16 (as uint16) operand a K-major SWIZZLE_128B descriptor names."""
    start, _, sbo, layout = decode_desc(desc)
    assert layout == 1
    r, k = np.meshgrid(np.arange(rows), np.arange(16), indexing="ij")
    return smem[swizzle128(start + (r % 8) * 128 + (r // 8) * sbo + 2 * k) // 2]


def read_mn_major(smem: np.ndarray, desc: int, n: int) -> np.ndarray:
    """The 16 x n operand (k, n) an MN-major SWIZZLE_128B descriptor names."""
    start, lbo, sbo, layout = decode_desc(desc)
    assert layout == 1
    k, c = np.meshgrid(np.arange(16), np.arange(n), indexing="ij")
    return smem[swizzle128(start + 2 * (c % 64) + (c // 64) * lbo + (k % 8) * 128 + (k // 8) * sbo) // 2]


def pw_desc(addr: int, lbo: int, sbo: int) -> int:
    return ((addr & 0x3FFFF) >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (1 << 62)


def pw_off(row: int, c: int, rows: int) -> int:
    return (c >> 3) * rows * 128 + row * 128 + (((c & 7) ^ (row & 7)) << 4)


def store_tile(smem: np.ndarray, base: int, tile: np.ndarray) -> None:
    """cp.async of a [rows][D] bf16 tile into the swizzled layout at byte address base, 16-byte chunk by chunk."""
    rows, d = tile.shape
    for row in range(rows):
        for c in range(d // 8):
            at = (base + pw_off(row, c, rows)) // 2
            smem[at:at + 8] = tile[row, 8 * c:8 * c + 8]


def bf16_bits(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def bits_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("D,BN,WGS", [(64, 64, 1), (64, 128, 2), (128, 64, 2), (128, 128, 2)])
def test_layout_model_reproduces_a_tile(D, BN, WGS):
    rows = 64 * WGS
    r = rng()
    q, k, v = (bf16_bits(r.standard_normal(shape)) for shape in ((rows, D), (BN, D), (BN, D)))
    base = 3072  # 1024-aligned, not 0: the descriptors' start addresses must carry it
    sq, sk = base, base + rows * D * 2
    sv = sk + BN * D * 2
    smem = np.zeros((sv + BN * D * 2) // 2, np.uint16)
    for at, tile in ((sq, q), (sk, k), (sv, v)):
        store_tile(smem, at, tile)
    qf, kf, vf = bits_f32(q), bits_f32(k), bits_f32(v)
    for wg in range(WGS):
        qa = sq + wg * 64 * 128
        # S = Q K^T as pw_qk issues it: the hardware's view of each k-step's operands, accumulated
        s = np.zeros((64, BN), np.float32)
        for ks in range(D // 16):
            a = read_k_major(smem, pw_desc(qa + (ks >> 2) * (rows * 128) + (ks & 3) * 32, 16, 1024), 64)
            b = read_k_major(smem, pw_desc(sk + (ks >> 2) * (BN * 128) + (ks & 3) * 32, 16, 1024), BN)
            np.testing.assert_array_equal(a, q[64 * wg:64 * wg + 64, 16 * ks:16 * ks + 16])
            s += bits_f32(a) @ bits_f32(b).T
        np.testing.assert_allclose(s, qf[64 * wg:64 * wg + 64] @ kf.T, rtol=1e-5, atol=1e-4)
        # S in the accumulator layout, P = bf16(S) packed as pw_pack_p does, read back as the A fragment
        # (register j of thread t: rows g, g + 8, g, g + 8 and k 2 t4 + {0, 1} (+ 8 for j >= 2))
        acc = np.zeros((128, BN // 2), np.float32)
        for t in range(128):
            for i in range(BN // 8):
                for e in range(4):
                    row = 16 * (t // 32) + (t % 32) // 4 + 8 * (e // 2)
                    acc[t, 4 * i + e] = s[row, 8 * i + 2 * (t % 4) + e % 2]
        p = np.zeros((64, BN), np.float32)
        for t in range(128):
            g, t4 = 16 * (t // 32) + (t % 32) // 4, t % 4
            for kk in range(BN // 16):
                pairs = [acc[t, 8 * kk + 2 * j:8 * kk + 2 * j + 2] for j in range(4)]  # pw_pack_p's four registers
                for j, (row, col) in enumerate(((g, 0), (g + 8, 0), (g, 8), (g + 8, 8))):
                    p[row, 16 * kk + col + 2 * t4:16 * kk + col + 2 * t4 + 2] = pairs[j]
        np.testing.assert_array_equal(p, s)
        # O += P V as pw_pv issues it: V MN-major through the transposed descriptor
        o = np.zeros((64, D), np.float32)
        for kk in range(BN // 16):
            b = read_mn_major(smem, pw_desc(sv + kk * 2048, BN * 128, 1024), D)
            np.testing.assert_array_equal(b, v[16 * kk:16 * kk + 16])
            o += p[:, 16 * kk:16 * kk + 16] @ bits_f32(b)
        np.testing.assert_allclose(o, s @ vf, rtol=1e-4, atol=1e-3)


def test_config_names_and_the_environment_override(monkeypatch):
    from ingot.codegen.kernels.attention.prefill_wgmma_rule import CONFIG_ENV, config_name, parse_config

    cfg = parse_config("2x128x3ovwspp")
    assert cfg == WgmmaConfig(2, 128, 3, overlap=True, producer=True, pingpong=True)
    assert config_name(cfg) == "2x128x3ovwspp" and parse_config("2x64x3lmwshf") == parse_config("2x64x3wshflm")
    assert config_name(parse_config("2x128x3tmwslmhf")) == "2x128x3wshflmtm"
    for bad in ("2x128", "2x128x3zz", "fast"):
        with pytest.raises(ValueError, match="WxNxS"):
            parse_config(bad)
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    plain = default_config(64), default_config(128)
    monkeypatch.setenv(CONFIG_ENV, "2x64x2ws")
    assert default_config(64) == default_config(128) == WgmmaConfig(2, 64, 2, producer=True)
    monkeypatch.setenv(CONFIG_ENV, "128:2x128x3wspp")
    assert (default_config(64), default_config(128)) == (plain[0], WgmmaConfig(2, 128, 3, producer=True, pingpong=True))
    monkeypatch.setenv(CONFIG_ENV, "64:2x64x3wshf, 128:1x128x2")
    assert (default_config(64), default_config(128)) == (WgmmaConfig(2, 64, 3, producer=True, heavy_first=True),
                                                         WgmmaConfig(1, 128, 2))
