"""What the codegen tests share: skip markers for the CUDA tools and a per-module kernel cache (the GPU fixture
is in conftest.py)."""

from __future__ import annotations

import os

import pytest

from ingot.codegen import compile as cc
from ingot.codegen.sass import find_cuobjdump

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

