"""Split-KV decode attention (``codegen/kernels/attention/decode_split.cu``) without a GPU: when the rule picks
it, the split arithmetic the kernel uses (mirrored by ``split_plan``), grid and workspace, compile checks, and the
tensor-core loop's fragment data flow emulated in numpy."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernel import GridDim
from ingot.codegen.kernels.attention.split_rule import (
    CTAS_PER_SM,
    FP8_ATTEND_PARAMS,
    FP8_WRITE_PARAMS,
    MAX_SPLITS,
    MMA_TILE,
    PREFETCH_ROWS,
    cache_write_fp8_spec,
    decode_split_spec,
    mma_stage_bytes,
    resident_ctas,
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
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    compiled,
    module_kernel_cache,
    needs_compiler,
)
from tests.helpers import rng

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
                    if cfg.mma:  # the tensor-core loop splits only within one wave of resident CTAs
                        assert num_tokens * cfg.num_kv_heads * nsplit <= cfg.target_ctas
    if not cfg.mma:  # the benchmark's case (batch 32, 8 KV heads) splits on the CUDA-core loop
        assert split_plan(cfg, 0, 4095, 32, 0)[0] > 1
    if cfg.mma and cfg.target_ctas >= 8 * 8 * 4:  # batch 8 fills the wave with 4 splits (2 CTAs per SM)
        assert split_plan(cfg, 0, 4095, 8, 0)[0] == min(16, cfg.target_ctas // 64)


def test_sequence_search_mirrors_binary_search():
    """The kernel's 32-way search for a token's sequence (one ballot per round) finds what a binary search does:
    the last s with query_start_loc[s] <= t, empty sequences included, tokens past the end and before the start."""
    r = rng()

    def search(qsl, num_seqs, t):  # decode_split.cu, lane by lane
        lo, hi = 0, num_seqs
        while lo < hi:
            step = (hi - lo + 31) // 32
            cnt = sum(qsl[min(lo + step * (lane + 1), hi)] <= t for lane in range(32))
            hi = min(lo + step * (cnt + 1) - 1, hi)
            lo = min(lo + step * cnt, hi)
        return lo

    for num_seqs in (1, 2, 31, 32, 33, 100, 1024, 1500):
        lens = r.integers(0, 4, num_seqs) * (r.random(num_seqs) < 0.8)
        qsl = np.concatenate([[int(r.integers(0, 3))], int(r.integers(0, 3)) + np.cumsum(lens)]).astype(int)
        for t in range(0, int(qsl[-1]) + 3):
            want = max((s for s in range(num_seqs + 1) if qsl[s] <= t), default=0)
            assert search(qsl, num_seqs, t) == want, (num_seqs, t)


def test_loop_choice_and_shared_memory():
    """Caches with whole 16-position tiles per block take the tensor-core loop (bf16 or e4m3), whose rings fit two
    CTAs per SM for head_dim 64/128 (one for 256); 8-position blocks keep the CUDA-core loop (no dynamic smem)."""
    h200 = get_target("h200")
    for cache, esz in ((bf16, 2), (f8, 1)):
        for D, per_sm in ((64, 2), (128, 2), (256, 1)):
            cfg = split_config(D, 8, 4, 16, 132, cache_dtype=cache)
            assert cfg.mma and cfg.stages >= 2 and cfg.elem_bytes == esz and cfg.target_ctas == per_sm * 132
            assert resident_ctas(cfg.smem_bytes) == per_sm and cfg.smem_bytes <= h200.smem_per_block
            conv = mma_stage_bytes(D) if cache is f8 else 0  # the FP8 cache's f16 tile per warp
            assert cfg.smem_bytes == cfg.warps * (cfg.stages * mma_stage_bytes(D, esz) + conv)
            assert 8 * 4 * D <= cfg.stages * mma_stage_bytes(D, esz) + conv  # a warp's (G <= 8) x D state fits
            spec = decode_split_spec(bf16, cache, 32, 8, D, 16, D ** -0.5, h200, kv_scale=cache is f8)
            assert spec.smem == cfg.smem_bytes and dict(spec.values)["MMA"] is True
    assert split_config(128, 8, 4, 32, 132).mma
    for cache in (bf16, f8):
        cfg = split_config(64, 8, 4, 8, 132, cache_dtype=cache)
        assert not cfg.mma and cfg.smem_bytes == 0 and cfg.target_ctas == CTAS_PER_SM * 132
        spec = decode_split_spec(bf16, cache, 32, 8, 64, 8, 0.125, h200, kv_scale=cache is f8)
        assert spec.smem == 0 and dict(spec.values)["MMA"] is False
    with pytest.raises(ValueError):  # a bf16 configuration for an FP8 cache
        decode_split_spec(bf16, f8, 32, 8, 128, 16, 0.088, h200, config=split_config(128, 8, 4, 16, 132))
    # the benchmark's shape: 256 (token, KV head) pairs on 132 SMs x 2 -> one wave of whole contexts
    assert split_plan(split_config(128, 8, 4, 16, 132), 0, 4095, 32) == (1, 256)
    assert split_plan(split_config(128, 8, 4, 16, 132), 0, 4095, 16) == (2, 128)
    assert split_plan(split_config(128, 8, 4, 16, 132, cache_dtype=f8), 0, 4095, 32) == (1, 256)
    assert split_plan(split_config(64, 8, 4, 8, 132), 0, 4095, 32) == (3, 171)  # CUDA-core loop: ceil


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
    (f8, False, 16, 2, 256, 16, 0.0, 0), (bf16, False, 64, 8, 128, 32, 0.0, 0), (bf16, False, 16, 2, 256, 16, 0.0, 0),
    (bf16, False, 32, 8, 64, 16, 0.0, 0), (f8, True, 16, 4, 64, 16, 30.0, 300), (bf16, False, 32, 8, 64, 8, 0.0, 0),
    (f8, True, 32, 8, 64, 8, 0.0, 0)])
def test_compiles(target, cache, kv_scale, H, KV, D, bs, softcap, window):
    tgt = get_target(target)
    specs = [decode_split_spec(bf16, cache, H, KV, D, bs, D ** -0.5, tgt, softcap, window, kv_scale=kv_scale)]
    if kv_scale:
        specs.append(cache_write_fp8_spec(bf16, KV, D, bs, tgt))
    for spec in specs:
        built = compiled(spec)
        if find_cuobjdump() is None:
            continue
        sass = disassemble(built.cubin)
        assert sass_arch(sass) == tgt.arch
        ops = opcodes(sass)
        assert_no_local_memory(ops, spec.entry)
        if spec.template == "decode_split.cu" and dict(spec.values)["MMA"]:  # cp.async 16 B, tensor cores
            mma = "HMMA.16816.F32" if cache is f8 else "HMMA.16816.F32.BF16"  # FP8: e4m3 -> f16 (exact), f16 mma
            assert {"LDGSTS.E.BYPASS.128", mma, "LDSM.16.M88.4", "LDSM.16.MT88.4", "MOVM.16.MT88"} <= ops, sorted(ops)
            if cache is f8:
                assert "F2FP.F16.E4M3.UNPACK_B" in ops, sorted(ops)
        elif spec.template == "decode_split.cu":
            assert any(o.startswith("LDG.") and (".128" in o or ".64" in o) for o in ops), sorted(ops)


@needs_compiler
@pytest.mark.skipif(find_cuobjdump() is None, reason="needs cuobjdump")
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("cache,D,bs", [(bf16, 64, 16), (f8, 128, 16), (bf16, 64, 8)])
@pytest.mark.parametrize("trigger", ["", "early"])
def test_split_attention_waits_after_its_setup(target, cache, D, bs, trigger, monkeypatch):
    """decode_split.cu's header, "Before the wait": the step's inputs (non-coherent loads) and the L2 prefetches of
    the first K/V rows come before the grid-dependency wait (ACQBULK); every coherent global load (q, and the SIMT
    path's K/V rows: what the grid before writes) and every cp.async after it, the trigger (PREEXIT) right after
    the wait. With the early trigger (``INGOT_PDL_TRIGGER=early``) the wait is the kernel's first instruction
    among these: the inputs may then still be being written two launches back."""
    monkeypatch.setenv("INGOT_PDL_TRIGGER", trigger)
    spec = decode_split_spec(bf16, cache, 32, 8, D, bs, D ** -0.5, get_target(target), kv_scale=cache is f8)
    assert dict(spec.values)["PREFETCH_ROWS"] == PREFETCH_ROWS > 0
    sass = disassemble(compiled(spec).cubin)
    seq = re.findall(r"\b(ACQBULK|PREEXIT|CCTL\.E\.PF2|LDG\S*|LDGSTS\S*)\b", sass)
    assert seq.count("ACQBULK") == 1 and seq.count("PREEXIT") == 1, seq
    wait = seq.index("ACQBULK")
    before, after = seq[:wait], seq[wait + 1:]
    if trigger == "early":
        assert before == ["PREEXIT"], seq
        return
    assert after[0] == "PREEXIT" and "CCTL.E.PF2" in before, seq
    assert all(o == "CCTL.E.PF2" or o.startswith("LDG.E.CONSTANT") for o in before), before
    assert any(o == "LDG.E" or o.startswith("LDG.E.") and "CONSTANT" not in o for o in after), after  # q


# -- the tensor-core loop's fragments, emulated in numpy ------------------------------------------------------------
# The PTX ISA's layouts (lane = 4 g + t): ldmatrix gives lane row g, columns 2t, 2t + 1 of each 8x8 matrix (with
# .trans: of its transpose); mma.m16n8k16 A registers = (row g, k 2t..) (row g + 8, k 2t..) (row g, k 2t + 8..)
# (row g + 8, k 2t + 8..), B registers = (k 2t.., column g) (k 2t + 8.., column g), C = (row g, columns 2t, 2t + 1)
# (row g + 8, columns 2t, 2t + 1); movmatrix.trans moves an 8x8 matrix in the ldmatrix layout to its transpose.
# The kernel's own index arithmetic (decode_split.cu, MMA path) is written out below, so a wrong lane mapping
# in either shows up as a wrong attention output without a GPU.

def _bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def _ldmatrix_x4(mem, addrs, trans=False):
    """mem: float32 values of a b16 array indexed by byte offset // 2; addrs[32] byte addresses -> [32, 4, 2]."""
    regs = np.zeros((32, 4, 2), np.float32)
    for j in range(4):
        m = np.stack([mem[addrs[8 * j + r] // 2: addrs[8 * j + r] // 2 + 8] for r in range(8)])
        if trans:
            m = m.T
        for lane in range(32):
            regs[lane, j] = m[lane // 4, 2 * (lane % 4): 2 * (lane % 4) + 2]
    return regs


def _mma(c, a, b):
    """c [32, 4] += A (a [32, 4, 2]) @ B (b [32, 2, 2]), m16n8k16 fragments."""
    A, B, C = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for r, (row, k) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            A[row, k: k + 2] = a[lane, r]
        B[2 * t: 2 * t + 2, g], B[2 * t + 8: 2 * t + 10, g] = b[lane, 0], b[lane, 1]
        C[g, 2 * t: 2 * t + 2], C[g + 8, 2 * t: 2 * t + 2] = c[lane, 0:2], c[lane, 2:4]
    D = A @ B + C
    for lane in range(32):
        g, t = lane // 4, lane % 4
        c[lane, 0:2], c[lane, 2:4] = D[g, 2 * t: 2 * t + 2], D[g + 8, 2 * t: 2 * t + 2]


def _movmatrix_t(x):
    """x [32, 2]: an 8x8 matrix in the ldmatrix layout -> its transpose, same layout."""
    m = np.zeros((8, 8), np.float32)
    for lane in range(32):
        m[lane // 4, 2 * (lane % 4): 2 * (lane % 4) + 2] = x[lane]
    return np.stack([m.T[lane // 4, 2 * (lane % 4): 2 * (lane % 4) + 2] for lane in range(32)])


def _f16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def _ring_to_tile(k, v, p0, lo, hi, fp8):
    """The cp.async issue of one tile (lane -> row, 16-byte chunk; zero-fill outside [lo, hi]) into a ring stage, and
    for the FP8 cache the conversion pass into the warp's f16 tile: the 16-bit K+V tile the ldmatrix reads, as
    float32 values indexed by byte offset // 2; padding stays NaN and must never be read."""
    TQ, D = MMA_TILE, k.shape[1]
    esz = 1 if fp8 else 2
    chc, rsc, rs = D * esz // 16, D * esz + 16, 2 * D + 16
    ring = np.full((2 * TQ * rsc) // esz, np.nan, np.float32)  # indexed by byte offset // esz
    covered = set()
    for r0 in range(0, TQ, 32 // chc):
        for lane in range(32):
            row, c = r0 + lane // chc, lane % chc
            p, n = p0 + row, 16 // esz  # n elements per 16-byte chunk
            ok = lo <= p <= hi
            covered.add((row, c))
            for src, base in ((k, 0), (v, TQ * rsc)):
                off = (base + row * rsc + c * 16) // esz
                ring[off: off + n] = src[p, n * c: n * c + n] if ok else 0.0
    assert len(covered) == TQ * chc
    if not fp8:
        return ring
    tile = np.full(2 * TQ * rs // 2, np.nan, np.float32)
    for kk in range(2 * TQ * chc // 32):  # convert(): chunk of 16 codes -> two chunks of 8 f16
        for lane in range(32):
            row, c = (32 * kk + lane) // chc, lane % chc
            codes = ring[row * rsc + c * 16: row * rsc + c * 16 + 16]
            for half in range(2):
                off = (row * rs + (2 * c + half) * 16) // 2
                tile[off: off + 8] = _f16(codes[8 * half: 8 * half + 8])
    return tile


def _emulate_mma_cta(q, k, v, lo, hi, warps, fp8=False, ksc=1.0):
    """One CTA of the MMA loop for one (token, kv head): q [G, D] (bf16 values), k/v [positions, D] (bf16 values, or
    e4m3 codes with K = code * ksc), attending to positions [lo, hi]; returns the CTA's (M, L, A) per head as the
    kernel's epilogue computes them (A without the V scale)."""
    TQ = MMA_TILE
    G, D = q.shape
    RS = 2 * D + 16
    tile_b = TQ * RS
    qk = D ** -0.5 * np.log2(np.e) * ksc
    qpad = np.zeros((8, D), np.float32)
    qpad[:G] = q
    half = _bf16
    if fp8:  # the f16 query: scaled by 2^(141 - ex) (amax in [2^(ex-127), 2^(ex-126))), the scores by its inverse
        ex = int(np.frexp(np.float32(np.abs(qpad).max()))[1]) + 126 if np.abs(qpad).max() > 0 else 0
        qs = 2.0 ** (min(268 - ex, 254) - 127)
        qpad, qk, half = _f16(qpad * qs), qk / qs, _f16
    # B fragments of Q^T: words 8 ks + t and 8 ks + 4 + t of head g's row
    qb = [np.stack([np.stack([qpad[lane // 4, 2 * (8 * ks + lane % 4): 2 * (8 * ks + lane % 4) + 2],
                              qpad[lane // 4, 2 * (8 * ks + 4 + lane % 4): 2 * (8 * ks + 4 + lane % 4) + 2]])
                    for lane in range(32)]) for ks in range(D // 16)]
    j0, ntile = lo // TQ, hi // TQ - lo // TQ + 1
    states = []
    for warp in range(warps):
        o, m2, l2 = np.zeros((D // 16, 32, 4)), np.full((32, 2), -np.inf), np.zeros((32, 2))
        for i in range(max(0, -(-(ntile - warp) // warps))):
            p0 = (j0 + warp + warps * i) * TQ
            mem = _ring_to_tile(k, v, p0, lo, hi, fp8)
            sa, sb = np.zeros((32, 4)), np.zeros((32, 4))
            for ks in range(D // 16):
                addrs = [((ln & 7) + 8 * ((ln >> 3) & 1)) * RS + (2 * ks + (ln >> 4)) * 16 for ln in range(32)]
                _mma(sb if ks & 1 else sa, _ldmatrix_x4(mem, addrs), qb[ks])
            x = sa + sb
            pos = np.array([[p0 + ln // 4 + 8 * (e >> 1) for e in range(4)] for ln in range(32)])
            x = np.where((pos >= lo) & (pos <= hi), x * qk, -np.inf)
            for hh in range(2):
                mx = np.maximum(x[:, hh], x[:, hh + 2])
                for sh in (4, 8, 16):
                    mx = np.maximum(mx, mx[np.arange(32) ^ sh])
                mn = np.maximum(m2[:, hh], mx)
                mu = np.where(mn == -np.inf, 0.0, mn)
                corr = np.exp2(m2[:, hh] - mu)
                x[:, hh], x[:, hh + 2] = np.exp2(x[:, hh] - mu), np.exp2(x[:, hh + 2] - mu)
                m2[:, hh], l2[:, hh] = mn, l2[:, hh] * corr
                o[:, :, hh] *= corr
                o[:, :, hh + 2] *= corr
            plo, phi = half(x[:, 0:2]), half(x[:, 2:4])
            l2 += plo + phi
            pb = np.stack([_movmatrix_t(plo), _movmatrix_t(phi)], axis=1)
            for mt in range(D // 16):
                addrs = [((ln & 7) + 8 * (ln >> 4)) * RS + (2 * mt + ((ln >> 3) & 1)) * 16 + tile_b for ln in range(32)]
                _mma(o[mt], _ldmatrix_x4(mem, addrs, trans=True), pb)
        for sh in (4, 8, 16):
            l2 = l2 + l2[np.arange(32) ^ sh]
        m_s, l_s, a_s = np.full(G, -np.inf), np.zeros(G), np.zeros((G, D))
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for hh in range(2):
                h = 2 * t + hh
                if h >= G:
                    continue
                m_s[h], l_s[h] = m2[lane, hh], l2[lane, hh]
                for mt in range(D // 16):
                    a_s[h, 16 * mt + g], a_s[h, 16 * mt + g + 8] = o[mt, lane, hh], o[mt, lane, hh + 2]
        states.append((m_s, l_s, a_s))
    M = np.max([s[0] for s in states], axis=0)  # the epilogue's merge over warps, log2 units
    L = sum(s[1] * np.exp2(s[0] - M) for s in states)
    A = sum(s[2] * np.exp2(s[0] - M)[:, None] for s in states)
    return M, L, A


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("D,G,lo,hi,warps", [(128, 4, 0, 63, 4), (64, 3, 5, 50, 2), (256, 8, 17, 17, 4),
                                            (128, 1, 20, 130, 4), (64, 8, 31, 33, 1)])
def test_mma_fragments_emulated(D, G, lo, hi, warps, fp8):
    """The tensor-core loop's data flow (cp.async placement, the FP8 cache's f16 conversion and scaled query,
    ldmatrix/mma/movmatrix fragments, online softmax in log2 units, the warps' merge) against float64 attention
    over positions [lo, hi]."""
    r = rng()
    cache = f8 if fp8 else bf16
    assert split_config(D, 8, G, 16, cache_dtype=cache).mma
    n = hi // 16 * 16 + 16
    q = _bf16(r.standard_normal((G, D)) * 2.0)
    if fp8:  # e4m3 codes over their range, K = code * ksc, V = code * vsc
        k, v = (np.clip(r.standard_normal((n, D)) * 60.0, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
                for _ in range(2))
        ksc, vsc = 0.01, 0.02
    else:
        k, v = (_bf16(r.standard_normal((n, D)) * 2.0) for _ in range(2))
        ksc = vsc = 1.0
    M, L, A = _emulate_mma_cta(q, k, v, lo, hi, warps, fp8, ksc)
    s = (q.astype(np.float64) @ (k[lo: hi + 1].astype(np.float64) * ksc).T) * D ** -0.5
    p = np.exp(s - s.max(axis=1, keepdims=True))
    ref = p @ (v[lo: hi + 1] * vsc) / p.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(A / L[:, None] * vsc, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())
    np.testing.assert_allclose(M, s.max(axis=1) * np.log2(np.e), rtol=1e-5, atol=1e-5)  # the running max, log2


@pytest.mark.parametrize("D", [64, 128, 256])
def test_mma_ldmatrix_is_bank_conflict_free(D):
    """Every 8-row phase of the loop's ldmatrix reads (K and V^T) hits 32 distinct banks: rows padded by 16 bytes."""
    RS = 2 * D + 16
    for ks in range(D // 16):
        for addrs in ([((ln & 7) + 8 * ((ln >> 3) & 1)) * RS + (2 * ks + (ln >> 4)) * 16 for ln in range(32)],
                      [((ln & 7) + 8 * (ln >> 4)) * RS + (2 * ks + ((ln >> 3) & 1)) * 16 for ln in range(32)]):
            for j in range(4):
                banks = {(a // 4 + w) % 32 for a in addrs[8 * j: 8 * j + 8] for w in range(4)}
                assert len(banks) == 32, (D, ks, j)
