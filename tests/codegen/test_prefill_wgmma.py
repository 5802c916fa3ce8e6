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

import numpy as np
import pytest

import ingot
from ingot.codegen.kernel import GridDim
from ingot.codegen.kernels.attention import prefill_rule
from ingot.codegen.kernels.attention.prefill_rule import KERNEL_ENV, plan_prefill, prefill_kernel
from ingot.codegen.kernels.attention.prefill_wgmma_rule import (
    MAX_SMEM,
    WgmmaConfig,
    default_config,
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
    # the default: a producer warpgroup beside the two consumers, three stages of 64-position tiles at head_dim 64
    assert cfg == WgmmaConfig(2, 64, 3, producer=True) and default_config(128) == WgmmaConfig(2, 128, 3, producer=True)
    assert spec.block == (384, 1, 1) and spec.smem == smem_bytes(64, cfg) == 1024 + 2 * 64 * (128 + 6 * 64) + 3 * 16
    one = wgmma_spec(bf16, bf16, 8, 8, 128, 32, 0.088, h200, cfg=WgmmaConfig(1, 64, 3))
    assert one.block == (128, 1, 1) and one.smem == 1024 + 2 * 128 * (64 + 6 * 64)
    ws = wgmma_spec(bf16, bf16, 32, 8, 128, 16, 0.088, h200, cfg=WgmmaConfig(2, 128, 2, producer=True))
    assert ws.block == (384, 1, 1) and ws.smem == 1024 + 2 * 128 * (128 + 4 * 128) + 2 * 2 * 8
    assert ws.grid == (GridDim("num_tokens", 32), GridDim(const=8), GridDim())
    for d in (64, 128):
        for cfg in (default_config(d), WgmmaConfig(2, 128, 3), WgmmaConfig(2, 64, 3), WgmmaConfig(1, 128, 2),
                    WgmmaConfig(2, 128, 3, True), WgmmaConfig(2, 128, 3, True, True)):
            assert smem_bytes(d, cfg) <= MAX_SMEM
    assert smem_bytes(128, default_config(128)) == 1024 + 2 * 128 * (128 + 6 * 128) + 3 * 16


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
    (32, 8, 64, 16, 0.0, 0, WgmmaConfig(1, 64, 3, True, True))])
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
    # the last tile's O += P V is issued again after the loop
    n_pv = cfg.block_n // 16 * (2 if cfg.overlap else 1)
    if qk == pv:
        assert hgmma == {qk: D // 16 + n_pv}, hgmma
    else:
        assert hgmma == {qk: D // 16, pv: n_pv}, hgmma
    assert ".tnspB" in sass  # V is the MN-major (transposed) B operand
    assert "WARPGROUP.ARRIVE" in sass and "WARPGROUP.DEPBAR" in sass
    assert not any(o.startswith("HMMA") for o in ops)  # no mma.sync left
    if cfg.producer:  # mbarriers, cp.async arriving on them; registers moved from the producer to the consumers
        assert "mbarrier.try_wait.parity" in built.ptx and "cp.async.mbarrier.arrive.noinc" in built.ptx
        assert ("setmaxnreg" in built.ptx) == (cfg.warpgroups == 2)
        assert spec.block == (128 * (cfg.warpgroups + 1), 1, 1)
        if cfg.warpgroups == 2:  # setmaxnreg only moves registers: the CTA must start with the 40 + 2 x 232 it
            # hands out (128 threads each), else the consumers' setmaxnreg.inc waits forever
            regs = _registers(built.cubin)
            assert regs * spec.block[0] >= 128 * (40 + 2 * 232), f"{regs} registers a thread at entry"


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
