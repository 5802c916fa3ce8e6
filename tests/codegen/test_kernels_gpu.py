"""Every kernel family against its numpy reference on the GPU (``-m gpu``; skipped without one).

Fresh random inputs (never zeros), several shapes including ones that are not multiples of the
tile sizes, outputs poisoned before each launch, every CUDA call checked (``cuda_launch.check``).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ingot.codegen.kernels.activation.rule import gated_spec
from ingot.codegen.kernels.attention.rule import paged_attention_specs
from ingot.codegen.kernels.gemm.rule import linear_spec
from ingot.codegen.kernels.norm.rule import norm_spec
from ingot.codegen.kernels.rope.rule import rope_spec
from ingot.codegen.kernels.sampling.rule import greedy_spec
from ingot.codegen.registry import plan_op
from ingot.codegen.target import Target, get_target
from ingot.ir.ops.attention import SwiGLU
from ingot.ir.ops.core import cast_array
from ingot.ir.ops.llm import Embedding, Linear, PagedAttention, Rope
from ingot.ir.ops.norm import LayerNorm, RmsNorm
from ingot.ir.ops.reduce import ArgMax
from ingot.ir.types import DType, TensorType
from tests.helpers import assert_close, rng

pytestmark = pytest.mark.gpu

bf16, f32, f8 = DType.bf16, DType.f32, DType.f8e4m3fn
#: wider than the table's float32 entry: reductions over thousands of terms in another order
F32_REDUCTION = (1e-4, 2e-5)


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    pytest.importorskip("cuda.bindings", reason="needs cuda-bindings (pip install 'ingot[cuda]')")
    os.environ.setdefault("INGOT_CACHE_DIR", str(tmp_path_factory.mktemp("kernel-cache")))
    from tests.codegen.cuda_launch import Gpu

    g = Gpu()
    yield g
    g.free_all()


@pytest.fixture(scope="module")
def target(gpu) -> Target:
    by_arch = {"sm_90a": get_target("h200"), "sm_100a": get_target("b200")}
    if gpu.arch not in by_arch:
        pytest.skip(f"kernels are built for sm_90a / sm_100a; this GPU is {gpu.arch}")
    return by_arch[gpu.arch]


#: test id -> {output: (max abs error, max error relative to the output's largest magnitude)}
ERRORS: dict[str, dict[str, tuple[float, float]]] = {}
_current = [""]


@pytest.fixture(autouse=True)
def _record_test_id(request):
    _current[0] = request.node.name
    yield


@pytest.fixture(scope="module", autouse=True)
def _write_error_report():
    """With INGOT_KERNEL_REPORT=path, the largest errors per test go there as JSON."""
    yield
    path = os.environ.get("INGOT_KERNEL_REPORT")
    if path and ERRORS:
        with open(path, "w") as f:
            json.dump(ERRORS, f, indent=1, sort_keys=True)


def check_close(got: np.ndarray, ref: np.ndarray, what: str = "out", **tol) -> None:
    """``assert_close`` (every element), recording the largest errors for the report."""
    if got.shape == ref.shape and (ref.dtype.kind == "f" or ref.dtype.name in ("bfloat16", "float8_e4m3fn")):
        g, e = got.astype(np.float64), ref.astype(np.float64)
        err = float(np.nanmax(np.abs(g - e))) if e.size else 0.0
        ERRORS.setdefault(_current[0], {})[what] = (err, err / max(float(np.nanmax(np.abs(e))), 1e-30))
    assert_close(got, ref, what=what, **tol)


def rand(r: np.random.Generator, shape, dtype: DType, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    x = (r.standard_normal(shape) * scale + shift).astype(np.float32)
    return cast_array(x, dtype) if dtype is not f32 else x


def tt(a: np.ndarray) -> TensorType:
    return TensorType(DType.from_np(a.dtype), a.shape)


def reduction_tol(dtype: DType) -> dict:
    return dict(zip(("rtol", "atol"), F32_REDUCTION)) if dtype is f32 else {}


# -- embedding ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,hidden,tokens", [(bf16, 2048, 1), (bf16, 2048, 300), (f32, 100, 7)])
def test_embedding(gpu, target, dtype, hidden, tokens):
    r = rng()
    table = rand(r, (1000, hidden), dtype)
    ids = r.integers(0, 1000, tokens).astype(np.int64)
    op = Embedding()
    (spec,) = plan_op(op, [tt(table), tt(ids)], target)
    out = gpu.alloc((tokens, hidden), table.dtype)
    gpu.launch(spec, table=gpu.upload(table), ids=gpu.upload(ids), out=out, num_tokens=tokens, vocab=1000)
    check_close(gpu.download(out), op.ref(table, ids), rtol=0, atol=0)


# -- norms ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,hidden,rows", [(bf16, 2048, 1), (bf16, 4096, 33), (f32, 1000, 257), (f32, 8192, 3)])
def test_rms_norm(gpu, target, dtype, hidden, rows):
    r = rng()
    x, w = rand(r, (rows, hidden), dtype, 3.0), rand(r, (hidden,), dtype)
    op = RmsNorm(eps=1e-6)
    (spec,) = plan_op(op, [tt(x), tt(w)], target)
    out = gpu.alloc(x.shape, x.dtype)
    gpu.launch(spec, x=gpu.upload(x), weight=gpu.upload(w), bias=None, residual=None, residual_out=None,
               out=out, rows=rows)
    check_close(gpu.download(out), op.ref(x, w))


@pytest.mark.parametrize("dtype,hidden,rows", [(bf16, 2048, 5), (f32, 1000, 40)])
def test_add_rms_norm(gpu, target, dtype, hidden, rows):
    r = rng()
    x, res, w = rand(r, (rows, hidden), dtype), rand(r, (rows, hidden), dtype), rand(r, (hidden,), dtype)
    spec = norm_spec("rms", dtype, dtype, hidden, 1e-5, target, residual=True)
    out, res_out = gpu.alloc(x.shape, x.dtype), gpu.alloc(x.shape, x.dtype)
    gpu.launch(spec, x=gpu.upload(x), weight=gpu.upload(w), bias=None, residual=gpu.upload(res),
               residual_out=res_out, out=out, rows=rows)
    h = x.astype(np.float32) + res.astype(np.float32)
    h = h.astype(x.dtype) if dtype is f32 else cast_array(h, dtype)
    check_close(gpu.download(res_out), h, rtol=0, atol=0, what="residual_out")
    check_close(gpu.download(out), RmsNorm(eps=1e-5).ref(h, w), what="out")


@pytest.mark.parametrize("dtype,hidden,rows,bias", [(f32, 1000, 17, True), (bf16, 768, 4, False)])
def test_layer_norm(gpu, target, dtype, hidden, rows, bias):
    r = rng()
    x, w = rand(r, (rows, hidden), dtype, 2.0, shift=1.5), rand(r, (hidden,), dtype)
    b = rand(r, (hidden,), dtype) if bias else None
    op = LayerNorm(eps=1e-5)
    ins = [x, w] + ([b] if bias else [])
    (spec,) = plan_op(op, [tt(a) for a in ins], target)
    out = gpu.alloc(x.shape, x.dtype)
    gpu.launch(spec, x=gpu.upload(x), weight=gpu.upload(w), bias=gpu.upload(b) if bias else None, residual=None,
               residual_out=None, out=out, rows=rows)
    check_close(gpu.download(out), op.ref(*ins)[0], **reduction_tol(dtype))


# -- rope -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,heads,head_dim,rot,inter,tokens", [
    (bf16, 32, 64, 64, False, 9), (f32, 4, 80, 32, True, 3), (f32, 8, 128, 64, False, 130), (bf16, 2, 64, 64, True, 1)])
def test_rope(gpu, target, dtype, heads, head_dim, rot, inter, tokens):
    r = rng()
    x = rand(r, (tokens, heads * head_dim), dtype)
    pos = r.integers(0, 512, tokens).astype(np.int64)
    ang = np.arange(512)[:, None] * (10000.0 ** (-np.arange(rot // 2) / (rot // 2)))[None]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    op = Rope(head_dim=head_dim, rotary_dim=rot, interleaved=inter)
    (spec,) = plan_op(op, [tt(x), tt(pos), tt(cos), tt(sin)], target)
    out = gpu.alloc(x.shape, x.dtype)
    gpu.launch(spec, x=gpu.upload(x), positions=gpu.upload(pos), cos=gpu.upload(cos), sin=gpu.upload(sin),
               out=out, num_tokens=tokens)
    check_close(gpu.download(out), op.ref(x, pos, cos, sin))


def test_rope_in_place(gpu, target):
    r = rng()
    x = rand(r, (5, 4 * 64), f32)
    pos = r.integers(0, 64, 5).astype(np.int64)
    cos, sin = rand(r, (64, 32), f32), rand(r, (64, 32), f32)
    spec = rope_spec(f32, f32, 4, 64, 64, False, target)
    buf = gpu.upload(x)
    gpu.launch(spec, x=buf, positions=gpu.upload(pos), cos=gpu.upload(cos), sin=gpu.upload(sin), out=buf,
               num_tokens=5)
    check_close(gpu.download(buf), Rope(head_dim=64, rotary_dim=64).ref(x, pos, cos, sin))


# -- activation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,width,tokens,alpha", [(bf16, 8192, 3, 1.0), (f32, 1000, 37, 1.0), (f32, 300, 2, 1.702),
                                                      (bf16, 1001, 5, 1.0)])  # 16-byte vectors, and not (1001)
def test_swiglu(gpu, target, dtype, width, tokens, alpha):
    r = rng()
    a, b = rand(r, (tokens, width), dtype, 4.0), rand(r, (tokens, width), dtype)
    op = SwiGLU(alpha=alpha)
    (spec,) = plan_op(op, [tt(a), tt(b)], target)
    out = gpu.alloc(a.shape, a.dtype)
    gpu.launch(spec, a=gpu.upload(a), b=gpu.upload(b), out=out, num_tokens=tokens)
    check_close(gpu.download(out), op.ref(a, b))


def test_geglu_fused_buffer(gpu, target):
    """gate and up as the two halves of one [T, 2I] buffer (strided rows)."""
    r = rng()
    t, width = 6, 700
    gu = rand(r, (t, 2 * width), f32, 2.0)
    spec = gated_spec("geglu", f32, width, target, a_stride=2 * width, b_stride=2 * width)
    src = gpu.upload(gu)
    up = type(src)(src.ptr + width * 4, (t, width), src.dtype)
    out = gpu.alloc((t, width), np.float32)
    gpu.launch(spec, a=src, b=up, out=out, num_tokens=t)
    a, b = gu[:, :width].astype(np.float64), gu[:, width:].astype(np.float64)
    ref = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3))) * b
    check_close(gpu.download(out), ref.astype(np.float32), rtol=1e-5, atol=1e-5)


# -- gemm -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,m,n,k,bias,residual", [
    (bf16, 1, 256, 256, False, False), (bf16, 37, 1000, 520, True, False), (bf16, 130, 2048, 2048, True, True),
    (f32, 5, 96, 100, False, True), (f32, 77, 1000, 520, True, True), (bf16, 300, 64, 40, False, False)])
def test_linear(gpu, target, dtype, m, n, k, bias, residual):
    r = rng()
    x, w = rand(r, (m, k), dtype), rand(r, (n, k), dtype, 1 / np.sqrt(k))
    b = rand(r, (n,), dtype) if bias else None
    res = rand(r, (m, n), dtype) if residual else None
    ins = [x, w, b, res]
    (spec,) = plan_op(Linear(), [tt(a) if a is not None else None for a in ins], target)
    out = gpu.alloc((m, n), x.dtype)
    gpu.launch(spec, x=gpu.upload(x), weight=gpu.upload(w), weight_scale=None, bias=gpu.upload(b) if bias else None,
               residual=gpu.upload(res) if residual else None, out=out, M=m)
    check_close(gpu.download(out), Linear().ref(x, w, b, res), **reduction_tol(dtype))


@pytest.mark.parametrize("xdt,m,n,k", [(bf16, 3, 1000, 520), (bf16, 70, 256, 2048), (f32, 9, 130, 96)])
def test_linear_fp8_weight(gpu, target, xdt, m, n, k):
    r = rng()
    x = rand(r, (m, k), xdt)
    w32 = r.standard_normal((n, k)).astype(np.float32)
    scale = (np.abs(w32).max(axis=1) / 448.0 / np.sqrt(k)).astype(np.float32)
    w = cast_array(w32 / np.abs(w32).max(axis=1, keepdims=True) * 448.0, f8)
    spec = linear_spec(xdt, f8, n, k, target, bias=True)
    b = rand(r, (n,), xdt)
    out = gpu.alloc((m, n), x.dtype)
    gpu.launch(spec, x=gpu.upload(x), weight=gpu.upload(w), weight_scale=gpu.upload(scale), bias=gpu.upload(b),
               residual=None, out=out, M=m)
    ref = x.astype(np.float32) @ (w.astype(np.float32) * scale[:, None]).T + b.astype(np.float32)
    ref = ref.astype(x.dtype) if xdt is f32 else cast_array(ref, xdt)
    check_close(gpu.download(out), ref, **reduction_tol(xdt))


# -- paged attention ------------------------------------------------------------------------------


def _attention_case(r, seqs, block_size, num_blocks, max_blocks):
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
    return (block_tables, np.array(seq_lens, np.int32), np.array(qsl, np.int32), np.array(slots, np.int64))


ATTENTION_CASES = {
    # name: (dtype, cache dtype, heads, kv heads, head_dim, block_size, softcap, window, [(cached, new), ...])
    "gqa-mixed-bf16": (bf16, bf16, 32, 8, 64, 16, 0.0, 0, [(0, 37), (100, 1), (15, 17), (0, 1), (250, 1)]),
    "mha-f32-d80": (f32, f32, 4, 4, 80, 16, 0.0, 0, [(3, 5), (0, 16), (33, 1)]),
    "decode-only-bf16": (bf16, bf16, 16, 2, 128, 32, 0.0, 0, [(c, 1) for c in (0, 5, 31, 32, 200, 511)]),
    "fp8-cache-softcap-window": (f32, f8, 8, 2, 128, 16, 30.0, 20, [(10, 30), (60, 1), (0, 9)]),
    "empty-seq-and-skipped-slot": (f32, f32, 6, 3, 64, 8, 0.0, 0, [(4, 6), (9, 0), (0, 3)]),
}


@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
def test_paged_attention(gpu, target, case):
    dtype, cdt, H, KV, D, bs, softcap, window, seqs = ATTENTION_CASES[case]
    r = rng()
    max_blocks = max(-(-(c + n) // bs) for c, n in seqs) + 1
    num_blocks = sum(-(-(c + n) // bs) for c, n in seqs) + 3
    block_tables, seq_lens, qsl, slots = _attention_case(r, seqs, bs, num_blocks, max_blocks)
    T = int(qsl[-1])
    if case == "empty-seq-and-skipped-slot":
        slots[1] = -1  # this token's K/V is not written; it still attends to what the cache holds
    q, k, v = rand(r, (T, H * D), dtype), rand(r, (T, KV * D), dtype), rand(r, (T, KV * D), dtype)
    cache = rand(r, (num_blocks, 2, bs, KV, D), cdt)
    scale = 1 / np.sqrt(D)
    op = PagedAttention(num_heads=H, num_kv_heads=KV, head_dim=D, scale=float(scale), softcap=softcap,
                        sliding_window=window)
    ins = [q, k, v, cache, block_tables, seq_lens, qsl, slots]
    write, attend = plan_op(op, [tt(a) for a in ins], target)
    cache_buf, out = gpu.upload(cache), gpu.alloc(q.shape, q.dtype)
    gpu.launch(write, k=gpu.upload(k), v=gpu.upload(v), kv_cache=cache_buf, slot_mapping=gpu.upload(slots),
               num_tokens=T)
    gpu.launch(attend, q=gpu.upload(q), kv_cache=cache_buf, block_tables=gpu.upload(block_tables),
               seq_lens=gpu.upload(seq_lens), query_start_loc=gpu.upload(qsl), out=out, num_tokens=T,
               num_seqs=len(seqs), max_blocks=max_blocks)
    ref_cache = cache.copy()
    ref = op.ref(q, k, v, ref_cache, block_tables, seq_lens, qsl, slots)
    got_cache = gpu.download(cache_buf)
    check_close(got_cache.view(np.uint8), ref_cache.view(np.uint8), what="kv_cache bytes")
    check_close(gpu.download(out), ref, **reduction_tol(dtype), what="attention out")


def test_paged_attention_unowned_tokens_are_zero(gpu, target):
    """Tokens past query_start_loc[-1] (padding) get zeros, as in the reference."""
    r = rng()
    H, KV, D, bs = 4, 2, 64, 16
    block_tables = np.array([[0, 1]], np.int32)
    seq_lens, qsl = np.array([5], np.int32), np.array([0, 3], np.int32)
    q = rand(r, (4, H * D), f32)
    cache = rand(r, (2, 2, bs, KV, D), f32)
    (_, attend) = paged_attention_specs(f32, f32, H, KV, D, bs, 0.125, target)
    out = gpu.alloc(q.shape, q.dtype)
    gpu.launch(attend, q=gpu.upload(q), kv_cache=gpu.upload(cache), block_tables=gpu.upload(block_tables),
               seq_lens=gpu.upload(seq_lens), query_start_loc=gpu.upload(qsl), out=out, num_tokens=4,
               num_seqs=1, max_blocks=2)
    op = PagedAttention(num_heads=H, num_kv_heads=KV, head_dim=D, scale=0.125)
    k = v = np.zeros((4, KV * D), np.float32)
    ref = op.ref(q, k, v, cache.copy(), block_tables, seq_lens, qsl, np.full(4, -1, np.int64))
    check_close(gpu.download(out), ref, **reduction_tol(f32))


# -- sampling -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,rows,vocab", [(f32, 5, 128256), (bf16, 3, 1000), (f32, 1, 7), (f32, 64, 32000)])
def test_greedy(gpu, target, dtype, rows, vocab):
    r = rng()
    logits = rand(r, (rows, vocab), dtype, 3.0)
    logits[0, vocab // 3] = logits[0, vocab - 1] = np.asarray(50.0).astype(logits.dtype)  # a tie: first wins
    op = ArgMax(axis=-1, keepdims=False)
    (spec,) = plan_op(op, [tt(logits)], target)
    tokens = gpu.alloc((rows,), np.int64)
    gpu.launch(spec, logits=gpu.upload(logits), tokens=tokens, num_rows=rows)
    check_close(gpu.download(tokens), op.ref(logits))


def test_greedy_spec_params(target):
    assert [p.name for p in greedy_spec(f32, 10, target).params] == ["logits", "tokens", "num_rows"]

