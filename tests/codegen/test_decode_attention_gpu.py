"""Split-KV decode attention (``codegen/kernels/attention/decode_split.cu``) and the FP8 cache write against the
numpy references of ``paged_attention`` / ``paged_attention_fp8`` on the GPU (``-m gpu``; skipped without one).

Fresh random caches and queries; long contexts (several splits), short ones (one), a batch large enough that no
token splits, prefill chunks mixed with decode tokens, softcap and a sliding window, padding tokens past
``query_start_loc[-1]``; FP8 caches with per-head and per-tensor scales, half of them smaller than the values need
(the write saturates at 448). Outputs poisoned before each launch; the attention is launched twice (the split
counters must be reset by the first launch); the cache bytes must equal the reference's exactly."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from ingot.codegen.kernels.attention.rule import paged_attention_specs
from ingot.codegen.kernels.attention.split_rule import cache_write_fp8_spec, decode_split_spec, split_config, split_plan
from ingot.codegen.target import get_target
from ingot.ir.ops.core import cast_array
from ingot.ir.ops.llm import PagedAttention
from ingot.ir.ops.quantized import PagedAttentionFp8
from ingot.ir.types import DType
from tests.helpers import assert_close, rng

pytestmark = pytest.mark.gpu
bf16, f8 = DType.bf16, DType.f8e4m3fn


def attention_case(r, seqs, block_size, num_blocks, max_blocks):
    """Index inputs for sequences given as (cached, new) token counts; blocks drawn without reuse."""
    perm = r.permutation(num_blocks)
    block_tables = np.zeros((len(seqs), max_blocks), np.int32)
    qsl, seq_lens, slots = [0], [], []
    used = 0
    for s, (cached, new) in enumerate(seqs):
        total = cached + new
        nb = -(-total // block_size)
        block_tables[s, :nb] = perm[used:used + nb]
        block_tables[s, nb:] = perm[0]
        used += nb
        for p in range(cached, total):
            slots.append(int(block_tables[s, p // block_size]) * block_size + p % block_size)
        qsl.append(qsl[-1] + new)
        seq_lens.append(total)
    return block_tables, np.array(seq_lens, np.int32), np.array(qsl, np.int32), np.array(slots, np.int64)


class PagedStep(NamedTuple):
    """A step's paged-attention inputs but the cache: indices (``attention_case``), ``padding`` tokens past the
    sequences' (slot -1), and bf16 q, k, v of ``T`` tokens drawn at scale 2."""

    block_tables: np.ndarray
    seq_lens: np.ndarray
    qsl: np.ndarray
    slots: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    T: int
    num_blocks: int
    max_blocks: int


def paged_step(r, seqs, block_size, H, KV, D, padding=0, spare_columns=1, spare_blocks=3) -> PagedStep:
    """``seqs`` as ``attention_case`` takes them; block tables ``spare_columns`` wider than the longest sequence
    needs, a cache ``spare_blocks`` larger than all of them need."""
    max_blocks = max(-(-(c + n) // block_size) for c, n in seqs) + spare_columns
    num_blocks = sum(-(-(c + n) // block_size) for c, n in seqs) + spare_blocks
    block_tables, seq_lens, qsl, slots = attention_case(r, seqs, block_size, num_blocks, max_blocks)
    T = int(qsl[-1]) + padding
    slots = np.concatenate([slots, np.full(padding, -1, np.int64)])
    q, k, v = (cast_array(r.standard_normal((T, w * D)).astype(np.float32) * 2.0, bf16) for w in (H, KV, KV))
    return PagedStep(block_tables, seq_lens, qsl, slots, q, k, v, T, num_blocks, max_blocks)


CASES = {
    # name: (heads, kv heads, head_dim, block_size, softcap, window, fp8 scales, [(cached, new), ...], padding)
    "long-decode-gqa": (32, 8, 128, 16, 0.0, 0, None, [(c, 1) for c in (4095, 3000, 17, 0, 2047, 1500, 600, 4000)], 0),
    "prefill-mixed-softcap-window": (9, 3, 64, 16, 30.0, 700, None, [(1200, 5), (0, 40), (2000, 1), (33, 1)], 0),
    "many-tokens-no-split": (32, 8, 128, 16, 0.0, 0, None, [(int(c), 1) for c in np.arange(70) * 9 + 300], 0),
    "d256-group8": (16, 2, 256, 16, 0.0, 0, None, [(2500, 1), (5, 1), (800, 3)], 0),
    "block32-padding": (32, 8, 128, 32, 0.0, 0, None, [(1000, 1), (3000, 1)], 3),
    "fp8-head": (32, 8, 128, 16, 0.0, 0, "head", [(c, 1) for c in (4095, 100, 2500, 1)], 0),
    "fp8-tensor-window": (16, 4, 64, 16, 0.0, 300, "tensor", [(1500, 1), (200, 7), (0, 1)], 0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_split_attention_matches_reference(gpu, case):
    H, KV, D, bs, softcap, window, fp8, seqs, padding = CASES[case]
    r = rng()
    tgt = get_target("h200" if gpu.arch == "sm_90a" else "b200")
    block_tables, seq_lens, qsl, slots, q, k, v, T, num_blocks, max_blocks = paged_step(r, seqs, bs, H, KV, D, padding)
    scale = float(D ** -0.5)
    cache_dt = f8 if fp8 else bf16
    cache = cast_array(r.standard_normal((num_blocks, 2, bs, KV, D)).astype(np.float32) * (60.0 if fp8 else 1.0),
                       cache_dt)
    attrs = dict(num_heads=H, num_kv_heads=KV, head_dim=D, scale=scale, softcap=softcap, sliding_window=window)
    ins = [q, k, v, cache, block_tables, seq_lens, qsl, slots]
    if fp8:
        amax = np.abs(np.stack([k, v]).astype(np.float32).reshape(2, T, KV, D)).max(axis=(1, 3))
        kv_scale = (amax / 448.0).astype(np.float32)
        kv_scale[:, ::2] *= 0.5  # these heads' new K/V saturate at 448 when written
        if fp8 == "tensor":
            kv_scale[:] = kv_scale.mean()
        op = PagedAttentionFp8(**attrs, kv_granularity=fp8)
        ins.append(kv_scale)
        write = cache_write_fp8_spec(bf16, KV, D, bs, tgt)
    else:
        op = PagedAttention(**attrs)
        write = paged_attention_specs(bf16, bf16, H, KV, D, bs, scale, tgt, softcap, window)[0]
    attend = decode_split_spec(bf16, cache_dt, H, KV, D, bs, scale, tgt, softcap, window, kv_scale=bool(fp8))
    cfg = split_config(D, KV, H // KV, bs, tgt.num_sms)
    splits = [split_plan(cfg, 0, int(L) - 1, T, t)[0] for t, L in enumerate(seq_lens)]
    print(f"{case}: T={T}, splits per sequence (first token) {splits}")

    ref_cache = cache.copy()
    ref = op.ref(q, k, v, ref_cache, block_tables, seq_lens, qsl, slots, *(ins[8:]))
    cache_buf = gpu.upload(cache)
    extra = {"kv_scale": gpu.upload(ins[8])} if fp8 else {}
    gpu.launch(write, k=gpu.upload(k), v=gpu.upload(v), kv_cache=cache_buf, slot_mapping=gpu.upload(slots),
               num_tokens=T, **extra)
    got_cache = gpu.download(cache_buf)
    assert_close(got_cache.view(np.uint8), ref_cache.view(np.uint8), what="kv_cache bytes")
    args = dict(q=gpu.upload(q), kv_cache=cache_buf, block_tables=gpu.upload(block_tables),
                seq_lens=gpu.upload(seq_lens), query_start_loc=gpu.upload(qsl), num_tokens=T, num_seqs=len(seqs),
                max_blocks=max_blocks, **extra)
    for attempt in range(2):
        out = gpu.alloc(q.shape, q.dtype)  # poisoned
        gpu.launch(attend, out=out, **args)
        got = gpu.download(out)
        assert np.isfinite(got.astype(np.float32)).all(), f"launch {attempt}: unwritten or non-finite outputs"
        assert_close(got, ref, what=f"attention out, launch {attempt}")
