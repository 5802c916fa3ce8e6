import os
import sys
from pathlib import Path

import pytest

# tests import their shared helpers as `tests.helpers`
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _session_seed() -> tuple[int, bool]:
    """The session seed and whether the user pinned it (``INGOT_TEST_SEED=<int>``)."""
    raw = os.environ.get("INGOT_TEST_SEED", "random")
    if raw == "random":
        import secrets

        return secrets.randbits(32), False
    try:
        return int(raw), True
    except ValueError:
        raise pytest.UsageError(f"INGOT_TEST_SEED must be an integer or 'random', got {raw!r}") from None


# Compiles in the tests use the heuristics' kernel configurations, also on a GPU machine (where ingot.compile would
# otherwise autotune: codegen/autotune.py); tests of autotuning set INGOT_AUTOTUNE themselves.
os.environ.setdefault("INGOT_AUTOTUNE", "0")
# pytest -n N (CI: 2 workers on 2 cores): one CUTLASS nvcc job a worker (each takes a core and 3-5 GB), not two
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("INGOT_CUTLASS_JOBS", "1")

# Inputs are fresh random draws each run (STYLE.md); the header prints the seed, and setting
# INGOT_TEST_SEED to it replays exactly the same inputs (hypothesis prints its own reproducer).
SESSION_SEED, _ = _session_seed()

def pytest_report_header(config):
    return f"ingot test inputs: fresh draws; replay this run with INGOT_TEST_SEED={SESSION_SEED}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The seed again at the end: ``pytest -q`` (CI) prints no header, and a failure needs it to replay."""
    if exitstatus != 0:
        terminalreporter.write_line(f"replay this run's inputs with INGOT_TEST_SEED={SESSION_SEED}")


@pytest.fixture(autouse=True, scope="session")
def _session_kernel_cache(tmp_path_factory):
    """Compiles go to one kernel cache for the session (``$INGOT_TEST_KERNEL_CACHE``, else the one
    ``tests/codegen/common.py``'s ``session_kernel_cache`` names), not the user's ``~/.cache/ingot``: the runtime
    tests' artifacts reuse the kernels (CUTLASS's among them, minutes of nvcc cold on two cores) that the codegen
    tests built. An ``INGOT_CACHE_DIR`` set by the caller is kept; modules with their own cache set theirs."""
    from tests.helpers import session_cache_dir

    if os.environ.get("INGOT_CACHE_DIR"):
        yield
        return
    os.environ["INGOT_CACHE_DIR"] = session_cache_dir(tmp_path_factory)
    yield
    os.environ.pop("INGOT_CACHE_DIR", None)


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
