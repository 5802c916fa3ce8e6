import os
import sys
from pathlib import Path

import pytest

# tests import their shared helpers as `tests.helpers`
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _session_seed() -> int:
    raw = os.environ.get("INGOT_TEST_SEED", "0")
    if raw == "random":
        import secrets

        return secrets.randbits(32)
    try:
        return int(raw)
    except ValueError:
        raise pytest.UsageError(f"INGOT_TEST_SEED must be an integer or 'random', got {raw!r}") from None


SESSION_SEED = _session_seed()

try:  # property tests: reproducible draws unless exploring with INGOT_TEST_SEED=random
    from hypothesis import settings as _hsettings

    _hsettings.register_profile("ingot", derandomize=os.environ.get("INGOT_TEST_SEED") != "random")
    _hsettings.load_profile("ingot")
except ImportError:  # pragma: no cover - hypothesis is in the dev extra
    pass


def pytest_report_header(config):
    return f"ingot test seed: INGOT_TEST_SEED={SESSION_SEED} (set it to reproduce; 'random' for fresh draws)"


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    from tests.helpers import reset_seeds

    reset_seeds(SESSION_SEED, request.node.nodeid)


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
