"""Fixtures shared by the runtime tests."""

import pytest


@pytest.fixture(scope="module")
def gpu_target() -> str:
    """The ingot target of this machine's GPU (``h200`` for sm_90, ``b200`` for sm_100); skips without one."""
    from tests.runtime.test_cuda_backend import _has_gpu

    if not _has_gpu():
        pytest.skip("needs an NVIDIA GPU and driver")
    from ingot.runtime.cuda_driver import Context

    sm = Context(0).sm
    if sm not in (90, 100):
        pytest.skip(f"kernels are built for sm_90a / sm_100a; this GPU is sm_{sm}")
    return "h200" if sm == 90 else "b200"
