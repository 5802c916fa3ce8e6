"""The ``gpu`` fixture of the codegen GPU tests (modules that need another device check define their own)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    """A ``tests.codegen.cuda_launch.Gpu`` on an sm_90a / sm_100a device (skips otherwise); frees its buffers."""
    pytest.importorskip("cuda.bindings", reason="needs cuda-bindings (pip install 'ingot[cuda]')")
    os.environ.setdefault("INGOT_CACHE_DIR", str(tmp_path_factory.mktemp("kernel-cache")))
    from tests.codegen.cuda_launch import Gpu

    g = Gpu()
    if g.arch not in ("sm_90a", "sm_100a"):
        pytest.skip(f"kernels are built for sm_90a / sm_100a; this GPU is {g.arch}")
    yield g
    g.free_all()
