"""fuse-layer-norm: Before/Expected and numerics."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import rng
from tests.passes.common import check_rewrite


@pytest.mark.parametrize("square, norm", [
    ("%sq = pow(%d, %two) : f32[B,8]", "%n = div(%d, %s) : f32[B,8]"),
    ("%sq = mul(%d, %d) : f32[B,8]", "%r = reciprocal(%s) : f32[B,1]\n  %n = mul(%r, %d) : f32[B,8]"),
])
def test_layer_norm_with_bias(square: str, norm: str) -> None:
    r = rng()
    w = {"w": r.standard_normal(8).astype(np.float32), "b": r.standard_normal(8).astype(np.float32)}
    check_rewrite(
        f"""graph @m(%x: f32[B,8]) weights(%w: f32[8], %b: f32[8]) {{
          %two = constant() {{value=dense<f32[]>[2.0]}} : f32[]
          %eps = constant() {{value=dense<f32[1]>[1e-05]}} : f32[1]
          %mu = reduce_mean(%x) {{axes=[-1]}} : f32[B,1]
          %d = sub(%x, %mu) : f32[B,8]
          {square}
          %v = reduce_mean(%sq) {{axes=[1]}} : f32[B,1]
          %a = add(%v, %eps) : f32[B,1]
          %s = sqrt(%a) : f32[B,1]
          {norm}
          %y = mul(%n, %w) : f32[B,8]
          %z = add(%b, %y) : f32[B,8]
          return %z
        }}""",
        """graph @m(%x: f32[B,8]) weights(%w: f32[8], %b: f32[8]) {
          %z = layer_norm(%x, %w, %b) : f32[B,8]
          return %z
        }""",
        ["fuse-layer-norm"], weights=w,
    )


def test_mismatched_axes_are_not_fused() -> None:
    text = """graph @m(%x: f32[4,8]) weights(%w: f32[8]) {
      %mu = reduce_mean(%x) {axes=[0]} : f32[1,8]
      %d = sub(%x, %mu) : f32[4,8]
      %sq = mul(%d, %d) : f32[4,8]
      %v = reduce_mean(%sq) {axes=[-1]} : f32[4,1]
      %eps = constant() {value=dense<f32[]>[1e-05]} : f32[]
      %a = add(%v, %eps) : f32[4,1]
      %s = sqrt(%a) : f32[4,1]
      %n = div(%d, %s) : f32[4,8]
      %y = mul(%n, %w) : f32[4,8]
      return %y
    }"""
    check_rewrite(text, text, ["fuse-layer-norm"], weights={"w": rng().standard_normal(8).astype(np.float32)})
