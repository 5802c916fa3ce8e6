"""fuse-linear: Before/Expected and numerics."""

from __future__ import annotations

import numpy as np

from ingot.ir.text import parse_graph
from ingot.passes import run_passes
from tests.helpers import rng
from tests.passes.common import assert_same_outputs, check_rewrite


def _weights(**shapes: tuple[int, ...]) -> dict[str, np.ndarray]:
    r = rng()
    return {k: r.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def test_matmul_bias_residual() -> None:
    g = check_rewrite(
        """graph @m(%x: f32[B,S,8], %h: f32[B,S,4]) weights(%w: f32[8,4], %b: f32[4]) {
          %y = matmul(%x, %w) : f32[B,S,4]
          %yb = add(%b, %y) : f32[B,S,4]
          %z = add(%h, %yb) : f32[B,S,4]
          return %z
        }""",
        """graph @m(%x: f32[B,S,8], %h: f32[B,S,4]) weights(%b: f32[4], %w.T: f32[4,8]) {
          %z = linear(%x, %w.T, %b, %h) : f32[B,S,4]
          return %z
        }""",
        ["fuse-linear"], weights=_weights(w=(8, 4), b=(4,)),
    )
    wt = g.weights["w.T"]
    assert "transpose" in wt.source and wt.load().shape == (4, 8)


def test_numerics_and_shared_transposed_weight() -> None:
    text = """graph @m(%x: f32[B,S,8], %x2: f32[B,8]) weights(%w: f32[8,4], %b: f32[4]) {
      %y = matmul(%x, %w) : f32[B,S,4]
      %yb = add(%y, %b) : f32[B,S,4]
      %y2 = matmul(%x2, %w) : f32[B,4]
      return %yb, %y2
    }"""
    w = _weights(w=(8, 4), b=(4,))
    before, after = parse_graph(text, weights=w), parse_graph(text, weights=w)
    run_passes(after, ["fuse-linear"])
    assert after.op_histogram() == {"linear": 2}
    assert len(after.weights) == 2  # one transposed copy of w, shared
    assert_same_outputs(before, after)


def test_transposed_weight_is_used_directly_and_gemm() -> None:
    check_rewrite(
        """graph @m(%x: f32[S,8], %a: f32[3,8]) weights(%w: f32[4,8], %c: f32[4]) {
          %t = transpose(%w) {perm=[1, 0]} : f32[8,4]
          %y = matmul(%x, %t) : f32[S,4]
          %g = gemm(%a, %w, %c) {trans_b=true} : f32[3,4]
          return %y, %g
        }""",
        """graph @m(%x: f32[S,8], %a: f32[3,8]) weights(%w: f32[4,8], %c: f32[4]) {
          %y = linear(%x, %w) : f32[S,4]
          %g = linear(%a, %w, %c) : f32[3,4]
          return %y, %g
        }""",
        ["fuse-linear"], weights=_weights(w=(4, 8), c=(4,)),
    )


def test_not_fused_activation_matmul_and_broadcasting_residual() -> None:
    text = """graph @m(%x: f32[S,8], %k: f32[8,S], %r: f32[1,4]) weights(%w: f32[8,4]) {
      %s = matmul(%x, %k) : f32[S,S]
      %y = matmul(%x, %w) : f32[S,4]
      %z = add(%y, %r) : f32[S,4]
      return %s, %z
    }"""
    g = check_rewrite(text, """graph @m(%x: f32[S,8], %k: f32[8,S], %r: f32[1,4]) weights(%w.T: f32[4,8]) {
      %s = matmul(%x, %k) : f32[S,S]
      %y = linear(%x, %w.T) : f32[S,4]
      %z = add(%y, %r) : f32[S,4]
      return %s, %z
    }""", ["fuse-linear"], weights=_weights(w=(8, 4)))
    assert g.op_histogram()["matmul"] == 1
