"""What the codegen tests share: skip markers for the CUDA tools, a per-module kernel cache and the compile / SASS
checks (the GPU fixture is in conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterable

import pytest

from ingot.codegen import compile as cc
from ingot.codegen.kernel import KernelSpec
from ingot.codegen.sass import disassemble, find_cuobjdump, opcodes, sass_arch

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
