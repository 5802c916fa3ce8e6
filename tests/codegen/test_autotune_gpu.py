"""Autotuning on the GPU (``-m gpu``; skipped without an H200/H100): the decode GEMV, the split-KV attention and
one CUTLASS GEMM shape are tuned with the real timer (``CudaTimer``), the chosen kernels match the numpy references,
and timed again independently the chosen configuration is no slower than the heuristic's (within 5%: timing
noise). The CUTLASS test builds the kind's six sm_90a candidates (cubin and Params probe each; minutes cold:
``INGOT_CUTLASS_JOBS=8`` on a 16-core machine) into ``$INGOT_CACHE_DIR``."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen import autotune as at
from ingot.codegen.kernels.attention.split_rule import decode_split_spec
from ingot.codegen.kernels.gemv.rule import gemv_spec
from ingot.codegen.target import get_target
from ingot.ir.ops.core import cast_array
from ingot.ir.ops.llm import PagedAttention
from ingot.ir.types import DType
from tests.codegen.cuda_launch import check as gpu_check
from tests.helpers import assert_close, rng

pytestmark = pytest.mark.gpu
H200 = get_target("h200")


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    pytest.importorskip("cuda.bindings", reason="needs cuda-bindings (pip install 'ingot[cuda]')")
    os.environ.setdefault("INGOT_CACHE_DIR", str(tmp_path_factory.mktemp("kernel-cache")))
    from tests.codegen.cuda_launch import Gpu

    g = Gpu()
    if g.arch != "sm_90a":
        pytest.skip(f"tunes for h200 (sm_90a); this GPU is {g.arch}")
    yield g
    g.free_all()


@pytest.fixture(scope="module")
def timer(gpu):
    t = at.CudaTimer()
    yield t
    t.release()


def _tune(spec, timer, bounds):
    info = at.detect_gpu()
    assert info is not None and info.sm == 90
    res = at.autotune([spec], H200, timer, info, bounds=bounds, use_cache=False)[spec.key]
    assert res.heuristic_s is not None and res.chosen_s is not None, res.times
    assert res.record()["timed"] == res.record()["candidates"], res.times  # no candidate failed on the H200
    loads = at.tunable_for(spec).workloads(spec, bounds)
    # the timed candidates of the heuristic and the chosen kernel (a shaped spec stands for its compiled kernel)
    timed = {at.kernel_for(c).key: c for c in at.candidates(spec, H200)}
    again = {k: sum(timer(timed[k], w) for w in loads) for k in (res.heuristic.key, res.chosen.key)}
    print(f"{spec.name}: heuristic {res.heuristic_s * 1e6:.2f} us, chosen {res.chosen_s * 1e6:.2f} us "
          f"({res.record()['config']}); again {again[res.heuristic.key] * 1e6:.2f} / "
          f"{again[res.chosen.key] * 1e6:.2f} us")
    assert again[res.chosen.key] <= again[res.heuristic.key] * 1.05
    return res


@pytest.mark.parametrize("n,k,mb", [(3072, 2048, 8), (2048, 8192, 32)])
def test_tuned_gemv_is_correct_and_not_slower(gpu, timer, n, k, mb):
    spec = gemv_spec(n, k, mb, H200, bias=True)
    res = _tune(spec, timer, {})

    r = rng()
    bf16 = ml_dtypes.bfloat16
    w = r.standard_normal((n, k), np.float32).astype(bf16)
    bias = r.standard_normal(n, np.float32).astype(bf16)
    wd, bd = gpu.upload(w), gpu.upload(bias)
    for m in (1, mb):
        x = r.standard_normal((m, k), np.float32).astype(bf16)
        ref = x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64)
        xd = gpu.upload(x)
        for attempt in range(2):
            out = gpu.alloc((m, n), bf16)
            gpu.launch(res.chosen, x=xd, weight=wd, weight_scale=None, bias=bd, residual=None, out=out, M=m)
            got = gpu.download(out).astype(np.float64)
            assert np.isfinite(got).all(), f"M={m} launch {attempt}: unwritten outputs"
            err = np.abs(got - ref).max() / np.abs(ref).max()
            assert err < 1e-2, f"{res.chosen.entry} M={m} launch {attempt}: relative error {err:.2e}"


def test_tuned_attention_is_correct_and_not_slower(gpu, timer):
    H, KV, D, bs = 32, 8, 128, 16
    scale = D ** -0.5
    spec = decode_split_spec(DType.bf16, DType.bf16, H, KV, D, bs, scale, H200)
    res = _tune(spec, timer, {"S": 32, "max_blocks": 4096 // bs})
    from tests.codegen.test_decode_attention_gpu import paged_step

    r = rng()
    seqs = [(int(c), 1) for c in (4095, 3000, 17, 0, 2047, 1500, 600, 4000)]
    block_tables, seq_lens, qsl, slots, q, k, v, T, num_blocks, max_blocks = paged_step(r, seqs, bs, H, KV, D)
    bf16 = DType.bf16
    cache = cast_array(r.standard_normal((num_blocks, 2, bs, KV, D)).astype(np.float32), bf16)
    op = PagedAttention(num_heads=H, num_kv_heads=KV, head_dim=D, scale=scale)
    ref_cache = cache.copy()
    ref = op.ref(q, k, v, ref_cache, block_tables, seq_lens, qsl, slots)
    args = dict(q=gpu.upload(q), kv_cache=gpu.upload(ref_cache), block_tables=gpu.upload(block_tables),
                seq_lens=gpu.upload(seq_lens), query_start_loc=gpu.upload(qsl), num_tokens=T, num_seqs=len(seqs),
                max_blocks=max_blocks)
    for attempt in range(2):
        out = gpu.alloc(q.shape, q.dtype)
        gpu.launch(res.chosen, out=out, **args)
        got = gpu.download(out)
        assert np.isfinite(got.astype(np.float32)).all(), f"launch {attempt}: unwritten outputs"
        assert_close(got, ref, what=f"{res.chosen.entry} out, launch {attempt}")


def test_tuned_cutlass_gemm_is_correct_and_not_slower(gpu, timer):
    """One prefill linear (a 1B model's down projection with a residual and a bias, at a 2048-token step): its six
    bf16 candidates timed, then the chosen shape-generic kernel launched as the runtime does (Params blob from the
    layout, cluster launch) for the tuned M and an M that is no tile multiple, against numpy."""
    from cuda.bindings import driver as drv

    from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp
    from ingot.codegen.kernels.gemm_cutlass.build import cutlass_available
    from ingot.codegen.kernels.gemm_cutlass.rule import shape_config

    if not cutlass_available():
        pytest.skip("needs nvcc and CUTLASS headers: pip install nvidia-cutlass")
    n, k, rows = 2048, 8192, 2048
    generic = cp.generic_linear_spec("bf16", H200, residual=True, config=shape_config("bf16", n, k, H200))
    spec = cp.shaped(generic, n, k, "T", True)
    res = _tune(spec, timer, {"T": rows})
    assert res.heuristic == generic and res.chosen.value("N") == 0 and cp.is_generic(res.chosen)

    kernel, layout = cp.build_linear(res.chosen)
    module = gpu_check(drv.cuModuleLoadData(kernel.cubin))
    fn = gpu_check(drv.cuModuleGetFunction(module, res.chosen.entry.encode()))
    attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    gpu_check(drv.cuFuncSetAttribute(fn, attr, int(layout["smem"])))
    sms = gpu_check(drv.cuDeviceGetAttribute(drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                             gpu.device))
    r = rng()
    bf16 = ml_dtypes.bfloat16
    w = (r.standard_normal((n, k), np.float32) * 0.05).astype(bf16)
    bias = r.standard_normal(n, np.float32).astype(bf16)
    wd, bd = gpu.upload(w), gpu.upload(bias)
    for m in (rows, 777):
        x = r.standard_normal((m, k), np.float32).astype(bf16)
        residual = r.standard_normal((m, n), np.float32).astype(bf16)
        ref = (x.astype(np.float64) @ w.astype(np.float64).T + bias.astype(np.float64)
               + residual.astype(np.float64))
        xd, rd = gpu.upload(x), gpu.upload(residual)
        for attempt in range(2):
            out = gpu.alloc((m, n), bf16)  # poisoned: NaN where the kernel writes nothing
            blob, config = cp.build_params(layout, {"x": xd.ptr, "weight": wd.ptr, "bias": bd.ptr,
                                                    "residual": rd.ptr, "out": out.ptr}, m, n, k, sms)
            cp.launch(fn, blob, config)
            gpu_check(drv.cuCtxSynchronize())
            got = gpu.download(out).astype(np.float64)
            assert np.isfinite(got).all(), f"M={m} launch {attempt}: unwritten outputs (grid {config['grid']})"
            err = np.abs(got - ref).max() / np.abs(ref).max()
            assert err < 1e-2, f"{res.chosen.entry} M={m} launch {attempt}: relative error {err:.2e}"
    gpu_check(drv.cuModuleUnload(module))
