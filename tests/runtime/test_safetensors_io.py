"""The streaming safetensors writer produces files the reference library reads identically."""

import numpy as np
import pytest
from safetensors import safe_open

from ingot.ir.ops.core import cast_array
from ingot.ir.types import DType
from ingot.runtime import safetensors_io
from tests.helpers import rng


def _tensors():
    r = rng()
    std = {
        "a": r.standard_normal((3, 5)).astype(np.float32),
        "b.weight": r.standard_normal((7,)).astype(np.float16),
        "c": r.integers(-100, 100, (2, 2, 2)).astype(np.int64),
        "scalar": np.array(r.standard_normal(), np.float64),
        "mask": r.random((4,)) > 0.5,
        "bf": cast_array(r.standard_normal((3, 3)).astype(np.float32), DType.bf16),
        "empty": np.zeros((0, 4), np.float32),
    }
    narrow = {
        "f8": cast_array(r.standard_normal((4, 8)).astype(np.float32) * 10, DType.f8e4m3fn),
        "f4": cast_array(r.standard_normal((2, 16)).astype(np.float32), DType.f4e2m1fn),
        "e8m0": cast_array(np.exp2(r.integers(-10, 10, (5,))).astype(np.float32), DType.f8e8m0),
    }
    return std, narrow


def _write(path, tensors):
    entries = [(k, (DType.from_np(v.dtype), v.shape), lambda v=v: v) for k, v in tensors.items()]
    safetensors_io.write(path, entries, metadata={"k": "v"})


def test_reference_library_reads_our_file(tmp_path):
    std, narrow = _tensors()
    p = tmp_path / "w.safetensors"
    _write(p, {**std, **narrow})
    with safe_open(str(p), framework="np") as f:
        assert set(f.keys()) == set(std) | set(narrow)
        assert f.metadata()["k"] == "v"
        for k, v in std.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and got.shape == v.shape
            np.testing.assert_array_equal(got, v)
        for k, v in narrow.items():  # stored as raw bytes
            np.testing.assert_array_equal(f.get_tensor(k), v.view(np.uint8).reshape(-1))


def test_our_reader_restores_every_dtype(tmp_path):
    std, narrow = _tensors()
    p = tmp_path / "w.safetensors"
    _write(p, {**std, **narrow})
    st = safetensors_io.SafetensorsFile(p)
    for k, v in {**std, **narrow}.items():
        got = st.get(k)
        assert got.dtype == v.dtype and got.shape == v.shape
        np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), v.reshape(-1).view(np.uint8))


def test_declared_type_must_match(tmp_path):
    with pytest.raises(safetensors_io.SafetensorsError, match="declared f32"):
        safetensors_io.write(tmp_path / "x", [("t", (DType.f32, (2,)), lambda: np.zeros(3, np.float32))])


def test_truncated_file_is_reported(tmp_path):
    std, _ = _tensors()
    p = tmp_path / "w.safetensors"
    _write(p, std)
    data = p.read_bytes()
    p.write_bytes(data[:-20])
    st = safetensors_io.SafetensorsFile(p)
    with pytest.raises(safetensors_io.SafetensorsError, match="past the end"):
        for k in st.keys():
            st.get(k)
    p.write_bytes(data[:5])
    with pytest.raises(safetensors_io.SafetensorsError, match="too short"):
        safetensors_io.SafetensorsFile(p)
