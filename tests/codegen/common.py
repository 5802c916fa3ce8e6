"""What the codegen tests share: skip markers for the CUDA tools, a per-module kernel cache and the compile / SASS
checks (the GPU fixture is in conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen import compile as cc
from ingot.codegen.kernel import KernelSpec
from ingot.codegen.sass import disassemble, find_cuobjdump, opcodes, sass_arch
from ingot.codegen.target import Target, get_target
from tests.helpers import session_cache_dir

needs_compiler = pytest.mark.skipif(
    cc.nvrtc_version() is None and cc.nvcc_version() is None,
    reason="no CUDA compiler: pip install cuda-bindings nvidia-cuda-nvrtc (or a toolkit's nvcc)")
needs_cuobjdump = pytest.mark.skipif(find_cuobjdump() is None, reason="no cuobjdump: pip install nvidia-cuda-cuobjdump")


@pytest.fixture(autouse=True, scope="module")
def module_kernel_cache(tmp_path_factory):
    """One fresh kernel cache per test module (autouse where imported): the first compile of a spec is real,
    repeats hit."""
    old = os.environ.get("INGOT_CACHE_DIR")
    os.environ["INGOT_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernel-cache"))
    yield
    if old is None:
        os.environ.pop("INGOT_CACHE_DIR")
    else:
        os.environ["INGOT_CACHE_DIR"] = old


@pytest.fixture
def session_kernel_cache(tmp_path_factory, monkeypatch):
    """For one test (``@pytest.mark.usefixtures("session_kernel_cache")``), the session's kernel cache instead of the
    module's: the one test_lower.py, test_lower_quant.py and test_gemv.py compile into (``$INGOT_TEST_KERNEL_CACHE``
    where set). For whole-model compiles: the tiny Llama's kernels under one set of switches are the same whichever
    module compiles them, so a session builds each once (a repeat is a cache hit, keyed by source, options and
    compiler: the same cubin)."""
    monkeypatch.setenv("INGOT_CACHE_DIR", session_cache_dir(tmp_path_factory))


def compiled(spec: KernelSpec) -> cc.CompiledKernel:
    """``spec`` compiled: a cubin, and PTX that holds its entry."""
    built = cc.compile_spec(spec)
    assert built.cubin and spec.entry in built.ptx
    return built


def disassembled(built: cc.CompiledKernel, arch: str) -> str:
    """The SASS of ``built``, checked to be for ``arch`` (skips the test without cuobjdump)."""
    if find_cuobjdump() is None:
        pytest.skip("no cuobjdump for the SASS check: pip install nvidia-cuda-cuobjdump")
    sass = disassemble(built.cubin)
    assert sass_arch(sass) == arch
    return sass


def sass_opcodes(kernel: KernelSpec | cc.CompiledKernel, arch: str) -> set[str]:
    """The SASS opcodes of a kernel for ``arch``: a spec is compiled first (and checked as ``compiled`` does)."""
    return opcodes(disassembled(compiled(kernel) if isinstance(kernel, KernelSpec) else kernel, arch))


def assert_no_local_memory(ops: Iterable[str], what: str) -> None:
    """No local-memory loads or stores (spills, indexed register arrays) among the SASS opcodes ``ops``."""
    assert not any(o.startswith(("LDL", "STL")) for o in ops), f"local memory (spills) in {what}"


def gpu_target(gpu) -> Target:
    """The target of the ``gpu`` fixture's device."""
    return get_target("h200" if gpu.arch == "sm_90a" else "b200")


def bf16_gemv_inputs(r: np.random.Generator, m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A bf16 GEMV's x [m, k] and residual [m, n], from float32 standard normals (``check_gemv``'s ``inputs``)."""
    x = r.standard_normal((m, k), np.float32).astype(ml_dtypes.bfloat16)
    return x, r.standard_normal((m, n), np.float32).astype(ml_dtypes.bfloat16)


def check_gemv(gpu, spec: KernelSpec, ms: Iterable[int], w: np.ndarray, weights: dict, bias: np.ndarray | None,
               inputs: Callable[[int], tuple[np.ndarray, np.ndarray]], *, whole_bucket: bool,
               tol: float = 1e-2) -> None:
    """A decode GEMV variant (kernel.cu / quant.cu / bulk.cu parameters) against numpy on the GPU for each token count
    M in ``ms``, each launch done twice (the split-K counters must be reset by the first for the second to be right),
    into poisoned outputs (0xFF: NaN). ``w``: the reference weights [N, K] (float64); ``weights``: the launch's weight
    arguments; ``bias``: the bias and residual epilogue (None: plain); ``inputs(m)``: x [m, K] and the residual
    [m, N] (bf16); ``whole_bucket``: the output holds the bucket's MB rows, those past M must stay poisoned. The
    largest output's relative error must be below ``tol``."""
    n, k = w.shape
    mb, has = spec.value("MB"), bias is not None
    bd = gpu.upload(bias) if has else None
    for m in ms:
        x, res = inputs(m)
        ref = x.astype(np.float64) @ w.T
        if has:
            ref = ref + bias.astype(np.float64) + res.astype(np.float64)
        xd, rd = gpu.upload(x), gpu.upload(res)
        for attempt in range(2):
            out = gpu.alloc((mb if whole_bucket else m, n), ml_dtypes.bfloat16)
            gpu.launch(spec, x=xd, **weights, bias=bd, residual=rd if has else None, out=out, M=m)
            full = gpu.download(out)
            assert (full[m:].view(np.uint16) == 0xFFFF).all(), f"M={m} launch {attempt}: rows past M written"
            got = full[:m].astype(np.float64)
            assert np.isfinite(got).all(), f"M={m} launch {attempt}: unwritten or non-finite outputs"
            err = np.abs(got - ref).max() / np.abs(ref).max()
            assert err < tol, f"{n}x{k} MB={mb} M={m} launch {attempt}: relative error {err:.2e} ({spec.doc})"
