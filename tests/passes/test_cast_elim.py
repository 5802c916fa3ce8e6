"""cast-elim: same-dtype casts and exact cast chains."""

from __future__ import annotations

import numpy as np

from ingot.ir.types import DType
from ingot.passes.cast_elim import EXACT
from tests.passes.common import check_rewrite


def test_same_dtype_and_roundtrip():
    check_rewrite(
        """graph @m(%x: f32[2,3], %i: i32[3]) {
          %a = cast(%x) {to=f32} : f32[2,3]
          %b = cast(%a) {to=f64} : f64[2,3]
          %c = cast(%b) {to=f32} : f32[2,3]
          %j = cast(%i) {to=i64} : i64[3]
          %k = cast(%j) {to=i32} : i32[3]
          return %c, %k
        }""",
        """graph @m(%x: f32[2,3], %i: i32[3]) {
          return %x as "c", %i as "k"
        }""",
        ["cast-elim"],
    )


def test_lossy_roundtrip_stays():
    before = """graph @m(%x: f32[4]) {
      %a = cast(%x) {to=f16} : f16[4]
      %b = cast(%a) {to=f32} : f32[4]
      %i = cast(%x) {to=i32} : i32[4]
      %c = cast(%i) {to=f32} : f32[4]
      return %b, %c
    }"""
    check_rewrite(before, before, ["cast-elim"])


def test_exact_first_step_is_skipped():
    check_rewrite(
        """graph @m(%x: i8[5]) {
          %a = cast(%x) {to=i32} : i32[5]
          %b = cast(%a) {to=f16} : f16[5]
          %u = neg(%b) : f16[5]
          return %u
        }""",
        """graph @m(%x: i8[5]) {
          %b = cast(%x) {to=f16} : f16[5]
          %u = neg(%b) : f16[5]
          return %u
        }""",
        ["cast-elim"],
    )


def test_exact_table_roundtrips():
    # every A -> B -> A the table calls exact is the identity on a spread of A's values
    from ingot.ir.ops.core import cast_array

    for a, bs in EXACT.items():
        if a is DType.bool:
            vals = np.array([True, False])
        elif a.is_float:
            info = np.finfo(a.np) if a is not DType.bf16 else None
            top = float(info.max) if info is not None else 3.0e38
            vals = np.array([0.0, -0.0, 1.5, -2.25, 1e-3, top, -top, np.inf, -np.inf, np.nan]).astype(a.np)
        else:
            ii = np.iinfo(a.np)
            vals = np.array([ii.min, ii.max, 0, 1, ii.max // 3], dtype=a.np)
        for b in bs:
            back = cast_array(cast_array(vals, b), a)
            assert back.dtype == vals.dtype
            wide = np.float64 if a.is_float else np.int64  # ml_dtypes NaNs compare unequal
            np.testing.assert_array_equal(back.astype(wide), vals.astype(wide),
                                          err_msg=f"{a.value} -> {b.value} -> {a.value}")
