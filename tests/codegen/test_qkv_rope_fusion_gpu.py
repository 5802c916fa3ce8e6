"""The qkv GEMV's rope epilogue (``kernels/gemv/kernel.cu``, ``rule.RopeEpilogue``, ``codegen/qkv_rope_fusion.py``)
on the GPU (``-m gpu``; skipped without one): the variant with the epilogue writes q and the paged KV cache bit for
bit as the same variant without it followed by ``rope/qkv_cache.cu`` does (that pair is what decode steps ran
before), and leaves ``out`` unwritten. Cases: the Llama-3.2-1B qkv (32 / 8 heads of 64) at the rule's configuration
(row groups) and with split-K over CTAs, with and without the rms_norm prologue, the first weight stage before and
after the wait; interleaved pairs with an FP8 cache (saturating ``x / kv_scale``, bf16 tables); head_dim 128 with a
bias; 1, 3 and 8 tokens, slots of some tokens negative; each fused launch twice (split-K counters reused).

    python -m pytest tests/codegen/test_qkv_rope_fusion_gpu.py -m gpu -v
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.gemv.rule import Prologue, RopeEpilogue, gemv_config, gemv_spec, with_rope
from ingot.codegen.kernels.rope.cache_rule import rope_qkv_cache_spec
from ingot.ir.quant.formats import to_e4m3
from ingot.ir.types import DType
from tests.codegen.common import gpu_target
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16
CTYPE = {DType.bf16: "bf16", DType.f32: "float", DType.f8e4m3fn: "fp8e4m3"}

#: name -> (heads, kv heads, head_dim, K, interleaved, cache type, table type, FP8 scales, bias)
CASES = {
    "llama1b": (32, 8, 64, 2048, False, DType.bf16, DType.f32, False, False),
    "fp8-cache-interleaved": (8, 2, 64, 512, True, DType.f8e4m3fn, DType.bf16, True, False),
    "d128-bias": (16, 4, 128, 1024, False, DType.bf16, DType.f32, False, True),
}
BLOCK = 16


def _specs(gpu, case: str, config: str, prologue: str, weights_first: bool):
    nq, nkv, d, k, inter, kt, ct, scaled, bias = CASES[case]
    tgt = gpu_target(gpu)
    n = (nq + 2 * nkv) * d
    cfg = gemv_config(n, k, 8, tgt.num_sms or 132, kwarps=1) if config == "splitk" else None
    pro = Prologue("rms_norm", eps=1e-5) if prologue == "rms_norm" else None
    plain = gemv_spec(n, k, 8, tgt, bias=bias, config=cfg, prologue=pro, weights_first=weights_first)
    fused = with_rope(plain, RopeEpilogue(nq, nkv, d, inter, BLOCK, CTYPE[kt], CTYPE[ct], scaled), tgt)
    rope = rope_qkv_cache_spec(DType.bf16, ct, kt, nq, nkv, d, d, inter, BLOCK, scaled, tgt)
    return plain, fused, rope


@pytest.mark.parametrize("preload", ["0", "1"], ids=["", "preload"])
@pytest.mark.parametrize("weights_first", [False, True], ids=["wait-first", "weights-first"])
@pytest.mark.parametrize("prologue", ["none", "rms_norm"])
@pytest.mark.parametrize("config", ["rule", "splitk"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_rope_epilogue_writes_what_gemv_then_rope_write(gpu, case, config, prologue, weights_first, preload,
                                                        monkeypatch):
    """The variant with the rope epilogue writes q and the cache bit for bit as the plain variant then the rope
    kernel (``check_rope_epilogue``), its slots and cos / sin read where it stores or, with ``INGOT_ROPE_PRELOAD=1``,
    right after its grid-dependency wait."""
    monkeypatch.setenv("INGOT_ROPE_PRELOAD", preload)
    nq, nkv, d, k, inter, kt, ct, scaled, bias = CASES[case]
    plain, fused, rope = _specs(gpu, case, config, prologue, weights_first)
    assert fused.value("ROPE_PRELOAD") is (preload == "1")
    if config == "splitk":
        assert fused.value("SPLITK") > 1
    n = plain.value("N")
    r = rng()
    w = gpu.upload((r.standard_normal((n, k), np.float32) / np.sqrt(k)).astype(BF16))
    b = gpu.upload(r.standard_normal(n).astype(BF16)) if bias else None
    g = gpu.upload((1 + 0.2 * r.standard_normal(k)).astype(BF16)) if prologue == "rms_norm" else None
    extra = {"norm_weight": g} if prologue == "rms_norm" else {}
    check_rope_epilogue(gpu, r, case, plain, fused, rope, {"weight": w, "weight_scale": None, "bias": b}, extra)


def check_rope_epilogue(gpu, r: np.random.Generator, case: str, plain, fused, rope, inputs: dict,
                        extra: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """``fused`` (``plain`` with the rope epilogue of ``CASES[case]``) writes q and the paged cache bit for bit as
    ``plain`` followed by ``rope`` (``qkv_cache.cu``), and leaves ``out`` unwritten: M = 1, 3, 8, some slots negative,
    each fused launch twice. ``inputs``: the weight parameters' and the bias's buffers; ``extra``: the prologue's
    (``norm_weight``). Returns each M's x and ``plain``'s qkv output, for checks of the pair itself."""
    nq, nkv, d, k, inter, kt, ct, scaled, bias = CASES[case]
    n = plain.value("N")
    pairs = []
    max_pos = 4096
    ang = np.arange(max_pos)[:, None] * (10000.0 ** (-np.arange(d // 2) / (d // 2)))[None]
    tables = {"cos": np.cos(ang), "sin": np.sin(ang)}
    tables = {name: gpu.upload(t.astype(np.float32 if ct is DType.f32 else BF16)) for name, t in tables.items()}
    kv_scale = (gpu.upload((r.uniform(0.005, 0.02, (2, nkv))).astype(np.float32)) if scaled else None)
    for m in (1, 3, 8):
        x_host = (3.0 * r.standard_normal((m, k))).astype(BF16)
        x = gpu.upload(x_host)
        positions = gpu.upload(r.integers(0, max_pos, m).astype(np.int64))
        blocks = m // BLOCK + 3
        slot_host = r.permutation(blocks * BLOCK)[:m].astype(np.int64)
        slot_host[r.random(m) < 0.3] = -1
        slots = gpu.upload(slot_host)
        cache0 = r.standard_normal((blocks, 2, BLOCK, nkv, d))
        cache0 = to_e4m3(cache0 * 100.0) if kt is DType.f8e4m3fn else cache0.astype(BF16)
        # before: the variant without the epilogue, then the fused rope + cache write kernel
        qkv = gpu.alloc((m, n), BF16)
        gpu.launch(plain, x=x, **inputs, residual=None, out=qkv, M=m, **extra)
        q_want, cache_want = gpu.alloc((m, nq * d), BF16), gpu.upload(cache0)
        gpu.launch(rope, qkv=qkv, positions=positions, **tables, q=q_want, kv_cache=cache_want, slot_mapping=slots,
                   kv_scale=kv_scale, num_tokens=m)
        want_q, want_cache = gpu.download(q_want), gpu.download(cache_want)
        for attempt in range(2):
            out, q, cache = gpu.alloc((m, n), BF16), gpu.alloc((m, nq * d), BF16), gpu.upload(cache0)
            gpu.launch(fused, x=x, **inputs, residual=None, out=out, M=m, **extra, positions=positions, **tables,
                       q=q, kv_cache=cache, slot_mapping=slots, kv_scale=kv_scale)
            what = f"{fused.entry} M={m} launch {attempt + 1}"
            assert np.array_equal(gpu.download(q).view(np.uint16), want_q.view(np.uint16)), f"{what}: q"
            assert np.array_equal(gpu.download(cache).view(np.uint8), want_cache.view(np.uint8)), f"{what}: cache"
            assert np.isnan(gpu.download(out).astype(np.float32)).all(), f"{what}: out was written"
        assert np.isfinite(want_q.astype(np.float32)).all()
        written = slot_host >= 0
        if written.any():  # the reference itself wrote the cache at the tokens' slots
            changed = (want_cache.view(np.uint8) != cache0.view(np.uint8)).any(axis=(2, 3, 4)).sum()
            assert changed > 0
        pairs.append((x_host, gpu.download(qkv)))
    return pairs


#: quant.cu's rope epilogue (weight format, activations, granularity); the Llama-3.2-1B qkv at the rule's configuration
QUANT = [("fp8", "none", "token"), ("fp8", "fp8", "token"), ("nvfp4", "none", "token")]


@pytest.mark.parametrize("fmt", QUANT, ids=["-".join(f) for f in QUANT])
def test_quant_rope_epilogue_writes_what_gemv_then_rope_write(gpu, fmt):
    """``quant.cu`` with the rope epilogue (``quant_rule.with_rope``) against the same variant followed by
    ``qkv_cache.cu``: q and the cache bit for bit, FP8 per-channel row scales and NVFP4 block scales taken from the
    streamed (permuted) rows, with a bias."""
    from ingot.codegen.kernels.gemv import quant_rule
    from tests.codegen.test_gemv_quant_gpu import _u8, activations, quantized_weight

    wfmt, act, gran = fmt
    nq, nkv, d, k = 32, 8, 64, 2048
    n = (nq + 2 * nkv) * d
    tgt = gpu_target(gpu)
    plain = quant_rule.quant_gemv_spec(n, k, 8, tgt, wfmt, act, gran, bias=True)
    fused = quant_rule.with_rope(plain, RopeEpilogue(nq, nkv, d, False, BLOCK), tgt)
    rope = rope_qkv_cache_spec(DType.bf16, DType.f32, DType.bf16, nq, nkv, d, d, False, BLOCK, False, tgt)
    r = rng()
    wq = quantized_weight(r, wfmt, n, k)
    s2 = wq["weight_scale_2"]
    bufs = dict(weight=gpu.upload(_u8(wq["weight"])),
                weight_scale=gpu.upload(_u8(wq["weight_scale"]) if wq["weight_scale"].dtype != np.float32
                                        else wq["weight_scale"]),
                weight_scale_2=gpu.upload(np.asarray(s2, np.float32).reshape(1)) if s2 is not None else None,
                input_scale=None, bias=gpu.upload(r.standard_normal(n).astype(BF16)), residual=None)
    ang = np.arange(2048)[:, None] * (10000.0 ** (-np.arange(d // 2) / (d // 2)))[None]
    tables = {"cos": gpu.upload(np.cos(ang).astype(np.float32)), "sin": gpu.upload(np.sin(ang).astype(np.float32))}
    for m in (1, 5, 8):
        x = gpu.upload(activations(r, m, k))
        positions = gpu.upload(r.integers(0, 2048, m).astype(np.int64))
        slot_host = r.permutation(4 * BLOCK)[:m].astype(np.int64)
        slot_host[0] = -1
        slots = gpu.upload(slot_host)
        cache0 = r.standard_normal((4, 2, BLOCK, nkv, d)).astype(BF16)
        qkv = gpu.alloc((m, n), BF16)
        gpu.launch(plain, x=x, **bufs, out=qkv, M=m)
        q_want, cache_want = gpu.alloc((m, nq * d), BF16), gpu.upload(cache0)
        gpu.launch(rope, qkv=qkv, positions=positions, **tables, q=q_want, kv_cache=cache_want, slot_mapping=slots,
                   kv_scale=None, num_tokens=m)
        for attempt in range(2):
            out, q, cache = gpu.alloc((m, n), BF16), gpu.alloc((m, nq * d), BF16), gpu.upload(cache0)
            gpu.launch(fused, x=x, **bufs, out=out, M=m, positions=positions, **tables, q=q, kv_cache=cache,
                       slot_mapping=slots, kv_scale=None)
            what = f"{fused.entry} M={m} launch {attempt + 1}"
            assert np.array_equal(gpu.download(q).view(np.uint16), gpu.download(q_want).view(np.uint16)), f"{what}: q"
            assert np.array_equal(gpu.download(cache).view(np.uint16), gpu.download(cache_want).view(np.uint16)), \
                f"{what}: cache"
