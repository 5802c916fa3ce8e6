"""The serving-fuse kernels on the GPU (``-m gpu``; skipped without an sm_90a / sm_100a one): ``rope_qkv`` and
the packed ``swiglu`` against their numpy references, and bit for bit against the unfused kernels (``split``
then ``rope`` / two-input ``swiglu``) they replace. Fresh random inputs, outputs poisoned before each launch."""

from __future__ import annotations

import numpy as np
import pytest

from ingot.codegen.kernels.activation.rule import gated_spec
from ingot.codegen.kernels.rope.rule import rope_spec
from ingot.codegen.registry import plan_op
from ingot.codegen.target import get_target
from ingot.ir.ops.attention import SwiGLU
from ingot.ir.ops.core import cast_array
from ingot.ir.ops.llm import RopeQKV
from ingot.ir.types import DType, TensorType
from tests.helpers import assert_close, rng

pytestmark = pytest.mark.gpu

bf16, f32 = DType.bf16, DType.f32


def _target(gpu):
    return get_target({"sm_90a": "h200", "sm_100a": "b200"}[gpu.arch])


def _rand(r: np.random.Generator, shape, dtype: DType, scale: float = 1.0) -> np.ndarray:
    x = (r.standard_normal(shape) * scale).astype(np.float32)
    return cast_array(x, dtype) if dtype is not f32 else x


def _tt(a: np.ndarray) -> TensorType:
    return TensorType(DType.from_np(a.dtype), a.shape)


@pytest.mark.parametrize("dtype,nh,kv,d,rot,inter,tokens", [
    (bf16, 32, 8, 64, 64, False, 9), (bf16, 32, 8, 64, 64, False, 300), (f32, 4, 2, 80, 32, True, 3),
    (bf16, 8, 1, 128, 64, False, 130), (bf16, 6, 6, 64, 32, True, 1)])
def test_rope_qkv(gpu, dtype, nh, kv, d, rot, inter, tokens):
    tgt, r = _target(gpu), rng()
    qkv = _rand(r, (tokens, (nh + 2 * kv) * d), dtype)
    pos = r.integers(0, 512, tokens).astype(np.int64)
    ang = np.arange(512)[:, None] * (10000.0 ** (-np.arange(rot // 2) / (rot // 2)))[None]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    op = RopeQKV(num_heads=nh, num_kv_heads=kv, head_dim=d, rotary_dim=rot, interleaved=inter)
    (spec,) = plan_op(op, [_tt(qkv), _tt(pos), _tt(cos), _tt(sin)], tgt)
    outs = {n: gpu.alloc((tokens, w * d), qkv.dtype) for n, w in (("q", nh), ("k", kv), ("v", kv))}
    src = gpu.upload(qkv)
    tables = {"positions": gpu.upload(pos), "cos": gpu.upload(cos), "sin": gpu.upload(sin)}
    gpu.launch(spec, qkv=src, **tables, **outs, num_tokens=tokens)
    got = {n: gpu.download(b) for n, b in outs.items()}
    for n, want in zip("qkv", op.ref(qkv, pos, cos, sin)):
        assert_close(got[n], want, what=n)
    assert np.array_equal(got["v"], qkv[:, (nh + kv) * d:])
    for n, lo, heads in (("q", 0, nh), ("k", nh * d, kv)):  # the unfused rope kernel, bit for bit
        part = np.ascontiguousarray(qkv[:, lo:lo + heads * d])
        out = gpu.alloc(part.shape, part.dtype)
        gpu.launch(rope_spec(dtype, f32, heads, d, rot, inter, tgt), x=gpu.upload(part), **tables, out=out,
                   num_tokens=tokens)
        assert np.array_equal(gpu.download(out).view(np.uint8), got[n].view(np.uint8)), n


@pytest.mark.parametrize("dtype,width,tokens,alpha", [(bf16, 8192, 3, 1.0), (bf16, 2048, 257, 1.0),
                                                      (f32, 300, 2, 1.702)])
def test_packed_swiglu(gpu, dtype, width, tokens, alpha):
    tgt, r = _target(gpu), rng()
    gu = _rand(r, (tokens, 2 * width), dtype, 4.0)
    op = SwiGLU(alpha=alpha, packed=True)
    (spec,) = plan_op(op, [_tt(gu)], tgt)
    src, out = gpu.upload(gu), gpu.alloc((tokens, width), gu.dtype)
    gpu.launch(spec, a=src, b=src, out=out, num_tokens=tokens)
    got = gpu.download(out)
    assert_close(got, op.ref(gu))
    a, b = np.ascontiguousarray(gu[:, :width]), np.ascontiguousarray(gu[:, width:])
    plain = gpu.alloc((tokens, width), gu.dtype)
    gpu.launch(gated_spec("swiglu", dtype, width, tgt, alpha=alpha), a=gpu.upload(a), b=gpu.upload(b), out=plain,
               num_tokens=tokens)
    assert np.array_equal(gpu.download(plain).view(np.uint8), got.view(np.uint8))
