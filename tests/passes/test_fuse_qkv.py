"""fuse-qkv: Before/Expected and numerics."""

from __future__ import annotations

import numpy as np

from tests.helpers import rng
from tests.passes.common import check_rewrite


def test_three_linears_on_one_input() -> None:
    r = rng()
    w = {"wq": r.standard_normal((8, 6)).astype(np.float32), "wk": r.standard_normal((4, 6)).astype(np.float32),
         "wv": r.standard_normal((4, 6)).astype(np.float32), "wo": r.standard_normal((6, 6)).astype(np.float32)}
    g = check_rewrite(
        """graph @m(%x: f32[T,6], %h: f32[T,6]) weights(%wq: f32[8,6], %wk: f32[4,6], %wv: f32[4,6], %wo: f32[6,6]) {
          %q = linear(%x, %wq) : f32[T,8]
          %k = linear(%x, %wk) : f32[T,4]
          %o = linear(%x, %wo, _, %h) : f32[T,6]
          %v = linear(%x, %wv) : f32[T,4]
          %y = add(%k, %v) : f32[T,4]
          return %q, %y, %o
        }""",
        """graph @m(%x: f32[T,6], %h: f32[T,6]) weights(%wo: f32[6,6], %wq.cat3: f32[16,6]) {
          %qkv = linear(%x, %wq.cat3) : f32[T,16]
          %q, %k, %v = split(%qkv) {axis=-1, num_outputs=3, split=[8, 4, 4]} : f32[T,8], f32[T,4], f32[T,4]
          %o = linear(%x, %wo, _, %h) : f32[T,6]
          %y = add(%k, %v) : f32[T,4]
          return %q, %y, %o
        }""",
        ["fuse-qkv"], weights=w,
    )
    assert np.array_equal(g.weights["wq.cat3"].load(), np.concatenate([w["wq"], w["wk"], w["wv"]]))


def test_biases_are_concatenated_and_mixed_groups_stay_apart() -> None:
    r = rng()
    w = {k: r.standard_normal(s).astype(np.float32) for k, s in
         [("wg", (4, 6)), ("wu", (4, 6)), ("bg", (4,)), ("bu", (4,)), ("wz", (4, 6))]}
    check_rewrite(
        """graph @m(%x: f32[T,6]) weights(%wg: f32[4,6], %wu: f32[4,6], %bg: f32[4], %bu: f32[4], %wz: f32[4,6]) {
          %g = linear(%x, %wg, %bg) : f32[T,4]
          %u = linear(%x, %wu, %bu) : f32[T,4]
          %z = linear(%x, %wz) : f32[T,4]
          %y = swiglu(%g, %u) : f32[T,4]
          %s = add(%y, %z) : f32[T,4]
          return %s
        }""",
        """graph @m(%x: f32[T,6]) weights(%wz: f32[4,6], %wg.cat2: f32[8,6], %bg.cat2: f32[8]) {
          %gu = linear(%x, %wg.cat2, %bg.cat2) : f32[T,8]
          %g, %u = split(%gu) {axis=-1, split=[4, 4]} : f32[T,4], f32[T,4]
          %z = linear(%x, %wz) : f32[T,4]
          %y = swiglu(%g, %u) : f32[T,4]
          %s = add(%y, %z) : f32[T,4]
          return %s
        }""",
        ["fuse-qkv"], weights=w,
    )
