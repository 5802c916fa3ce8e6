"""Serving-form ops against independent dense numpy formulations."""

import numpy as np
import pytest

from ingot.ir.ops.core import cast_array
from ingot.ir.ops.llm import Embedding, Linear, PagedAttention, Rope
from ingot.ir.types import DType, TensorType
from tests.helpers import assert_close, rng


def test_embedding():
    r = rng()
    table = r.standard_normal((50, 8)).astype(np.float32)
    ids = r.integers(0, 50, (7,))
    (y,) = Embedding().run(table, ids)
    assert_close(y, np.stack([table[i] for i in ids]))
    assert Embedding().infer([TensorType.of(table), TensorType(DType.i64, ("T",))]) == [
        TensorType(DType.f32, ("T", 8))
    ]
    with pytest.raises(IndexError, match="out of range"):
        Embedding().run(table, np.array([50]))


@pytest.mark.parametrize("dtype", [np.float32, "bf16"])
def test_linear_with_bias_and_residual(dtype):
    r = rng()
    x, w = r.standard_normal((5, 16)), r.standard_normal((12, 16))
    b, res = r.standard_normal(12), r.standard_normal((5, 12))
    if dtype == "bf16":
        conv = [cast_array(a.astype(np.float32), DType.bf16) for a in (x, w, b, res)]
    else:
        conv = [a.astype(dtype) for a in (x, w, b, res)]
    (y,) = Linear().run(*conv)
    f = [c.astype(np.float64) for c in conv]
    expected = f[0] @ f[1].T + f[2] + f[3]
    assert y.dtype == conv[0].dtype
    assert_close(y.astype(np.float64), expected, rtol=1e-2 if dtype == "bf16" else 1e-5, atol=1e-2 if dtype == "bf16"
                 else 1e-5)
    with pytest.raises(ValueError, match="K=16"):
        Linear().infer([TensorType(DType.f32, (3, 16)), TensorType(DType.f32, (4, 15))])


def _tables(max_pos, rot, theta=10000.0):
    inv = 1.0 / theta ** (np.arange(0, rot, 2) / rot)
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_rope_matches_complex_rotation(interleaved, rotary_dim):
    """Rope rotates feature pairs by position * frequency: check against complex multiplication."""
    r = rng()
    T, H, D = 6, 3, 16
    x = r.standard_normal((T, H * D)).astype(np.float32)
    pos = r.integers(0, 40, T)
    cos, sin = _tables(64, rotary_dim)
    (y,) = Rope(head_dim=D, rotary_dim=rotary_dim, interleaved=interleaved).run(x, pos, cos, sin)
    xh = x.reshape(T, H, D).astype(np.float64)
    half = rotary_dim // 2
    if interleaved:
        z = xh[..., 0:rotary_dim:2] + 1j * xh[..., 1:rotary_dim:2]
    else:
        z = xh[..., :half] + 1j * xh[..., half:rotary_dim]
    ang = np.arctan2(sin[pos], cos[pos]).astype(np.float64)[:, None, :]
    zr = z * np.exp(1j * ang)
    exp = xh.copy()
    if interleaved:
        exp[..., 0:rotary_dim:2], exp[..., 1:rotary_dim:2] = zr.real, zr.imag
    else:
        exp[..., :half], exp[..., half:rotary_dim] = zr.real, zr.imag
    assert_close(y.astype(np.float64), exp.reshape(T, H * D), rtol=1e-5, atol=1e-5)


def _dense_causal(q, k, v, H, KV, D, scale):
    """softmax(q k^T * scale + causal) v for one sequence, heads grouped."""
    L = q.shape[0]
    qh = q.reshape(L, H, D)
    kh = np.repeat(k.reshape(L, KV, D), H // KV, axis=1)
    vh = np.repeat(v.reshape(L, KV, D), H // KV, axis=1)
    s = np.einsum("qhd,khd->hqk", qh, kh) * scale
    s = np.where(np.tril(np.ones((L, L), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, vh).reshape(L, H * D)


def test_paged_attention_prefill_chunks_and_decode_match_dense():
    """Three sequences, scattered cache blocks, chunked prefill and decode steps mixed in one batch."""
    r = rng()
    H, KV, D, BS = 4, 2, 8, 4
    scale = D ** -0.5
    op = PagedAttention(num_heads=H, num_kv_heads=KV, head_dim=D, scale=scale)
    lens = [11, 5, 9]
    seqs = [{"q": r.standard_normal((n, H * D)), "k": r.standard_normal((n, KV * D)),
             "v": r.standard_normal((n, KV * D))} for n in lens]
    num_blocks = 16
    cache = np.full((num_blocks, 2, BS, KV, D), np.nan, np.float32)  # poisoned: unwritten slots must not be read
    perm = r.permutation(num_blocks)
    tables, used = [], 0
    for n in lens:
        nb = -(-n // BS)
        tables.append(perm[used:used + nb])
        used += nb
    max_blocks = max(len(t) for t in tables)
    block_tables = np.zeros((3, max_blocks), np.int32)
    for i, t in enumerate(tables):
        block_tables[i, :len(t)] = t
    # steps: how many new tokens each sequence schedules per step
    plan = [[6, 5, 4], [3, 0, 3], [1, 0, 1], [1, 0, 1]]
    done = [0, 0, 0]
    got = [np.zeros((n, H * D)) for n in lens]
    for step in plan:
        qs, ks, vs, slots, qsl, seq_lens = [], [], [], [], [0], []
        for s, n_new in enumerate(step):
            a, b = done[s], done[s] + n_new
            qs.append(seqs[s]["q"][a:b])
            ks.append(seqs[s]["k"][a:b])
            vs.append(seqs[s]["v"][a:b])
            slots += [int(tables[s][p // BS]) * BS + p % BS for p in range(a, b)]
            qsl.append(qsl[-1] + n_new)
            seq_lens.append(b)
        args = [np.concatenate(x).astype(np.float32) for x in (qs, ks, vs)]
        (out,) = op.run(*args, cache, block_tables, np.array(seq_lens, np.int32), np.array(qsl, np.int32),
                        np.array(slots, np.int64))
        for s, n_new in enumerate(step):
            got[s][done[s]:done[s] + n_new] = out[qsl[s]:qsl[s + 1]]
            done[s] += n_new
    assert done == lens
    for s in range(3):
        exp = _dense_causal(seqs[s]["q"], seqs[s]["k"], seqs[s]["v"], H, KV, D, scale)
        assert_close(got[s], exp, rtol=1e-5, atol=1e-5, what=f"sequence {s}")


def test_paged_attention_rejects_bad_shapes():
    op = PagedAttention(num_heads=4, num_kv_heads=3, head_dim=8)
    t = TensorType(DType.f32, ("T", 32))
    i = TensorType(DType.i32, ("S",))
    with pytest.raises(ValueError, match="not a multiple"):
        op.infer([t, t, t, TensorType(DType.f32, (4, 2, 4, 3, 8)), i, i, i, i])
