import os
import sys
from pathlib import Path

import pytest

# tests import their shared helpers as `tests.helpers`
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _has_gpu() -> bool:
    if os.environ.get("INGOT_FORCE_NO_GPU"):
        return False
    try:
        import ctypes

        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU and driver (libcuda.so.1 not found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
