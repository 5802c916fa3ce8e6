import ml_dtypes
import numpy as np
import pytest

from ingot.ir.types import DType, broadcast_shapes, dim_add, dim_mul


def test_broadcast_symbolic():
    assert broadcast_shapes(("B", 1, 4), (3, 1)) == ("B", 3, 4)
    assert broadcast_shapes(("B", "S"), ("B", 1)) == ("B", "S")
    assert broadcast_shapes((), (2,)) == (2,)
    assert broadcast_shapes(("B",), ("S",)) == ("?",)
    assert broadcast_shapes(None, (2,)) is None
    with pytest.raises(ValueError, match="do not broadcast"):
        broadcast_shapes((2, 3), (4, 3))


def test_dim_arithmetic():
    assert dim_add(2, 3) == 5 and dim_mul(2, 3) == 6
    assert dim_add("T", 0) == "T" and dim_mul("T", 1) == "T"
    assert dim_add("T", 1) == "(T+1)" and dim_mul("?", 2) == "?"


def test_dtype_numpy_mapping_round_trips():
    for dt in DType:
        assert DType.from_np(dt.np) is dt
    assert DType.f8e4m3fn.np == np.dtype(ml_dtypes.float8_e4m3fn)
    assert DType.f4e2m1fn.itemsize_bits == 4 and DType.bf16.itemsize_bits == 16
    with pytest.raises(TypeError, match="no ingot equivalent"):
        DType.from_np(np.complex64)
