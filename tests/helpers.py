"""Shared test helpers: one tolerance table keyed by dtype, and ingot-vs-onnxruntime runners."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

#: (rtol, atol) by numpy dtype name; every numeric comparison in the tests takes its tolerance here.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-10, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1e-2),
    "float8_e4m3fn": (0.0, 0.0),
    "float8_e5m2": (0.0, 0.0),
    "float4_e2m1fn": (0.0, 0.0),
}


def tol(dtype: np.dtype | str) -> tuple[float, float]:
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    return TOLERANCES.get(name, (0.0, 0.0))


def assert_close(got: np.ndarray, expected: np.ndarray, rtol: float | None = None,
                 atol: float | None = None, what: str = "") -> None:
    """Every element checked; dtype and shape must match exactly; NaN equals NaN."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    r, a = tol(expected.dtype)
    r = r if rtol is None else rtol
    a = a if atol is None else atol
    if expected.dtype.kind in "biu" or expected.dtype == np.bool_:
        np.testing.assert_array_equal(got, expected, err_msg=what)
    else:
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64),
                                   rtol=r, atol=a, equal_nan=True, err_msg=what)


def run_ingot(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    from ingot.frontend.onnx import import_onnx
    from ingot.ir.verify import verify
    from ingot.runtime.cpu import run_graph

    g = import_onnx(model)
    verify(g)
    return run_graph(g, feeds)


def run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feeds))))


def make_model(node: onnx.NodeProto, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
               opset: int = 21, initializers: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    graph = onnx.helper.make_graph([node], "t", inputs, outputs, initializer=initializers or [])
    m = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


#: Per-test seed sequence, reset by the autouse fixture in tests/conftest.py from the session seed
#: (fresh each run unless ``INGOT_TEST_SEED`` pins it) and the test's node id.
_SEEDS: np.random.SeedSequence = np.random.SeedSequence(0)


def reset_seeds(session_seed: int, nodeid: str) -> None:
    import zlib

    global _SEEDS
    _SEEDS = np.random.SeedSequence([session_seed, zlib.crc32(nodeid.encode())])


def rng(seed: int | None = None) -> np.random.Generator:
    """A generator for one test's random inputs.

    Each call in a test draws a new stream from that test's seed sequence. The session seed is fresh
    every run (printed in the pytest header); ``INGOT_TEST_SEED=<that seed>`` replays a failing run's
    inputs exactly.
    """
    if seed is not None:
        return np.random.default_rng(seed)
    return np.random.default_rng(_SEEDS.spawn(1)[0])


def assert_text_roundtrip(graph) -> None:
    """The graph's text form parses back to a graph that prints identically and verifies."""
    from ingot.ir.text import parse_graph
    from ingot.ir.verify import verify

    text = str(graph)
    again = parse_graph(text)
    verify(again)
    assert str(again) == text, f"text form does not round-trip:\n{text}\n---\n{again}"


def session_cache_dir(tmp_path_factory) -> str:
    """The kernel cache the whole test session shares: ``$INGOT_TEST_KERNEL_CACHE`` where set (reruns instant), else
    ``kernel-cache`` under the session's base temporary directory (with pytest-xdist the root its workers share:
    a kernel one worker builds the others wait for, ``compile.entry_lock``). Whole-model compiles use it (their
    kernels are the same whichever module compiles them), and tests/conftest.py makes it every test's default."""
    base = Path(tmp_path_factory.getbasetemp())
    if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n: each worker has its own basetemp under one shared root
        base = base.parent
    return os.environ.get("INGOT_TEST_KERNEL_CACHE") or str(base / "kernel-cache")
