"""fuse-rms-norm: Before/Expected and numerics."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import rng
from tests.passes.common import check_rewrite


def _w(n: int = 8) -> dict[str, np.ndarray]:
    return {"w": rng(1).standard_normal(n).astype(np.float32)}


@pytest.mark.parametrize("square, inv", [
    ("%sq = pow(%x, %two) : f32[B,S,8]", "%r = reciprocal(%d) : f32[B,S,1]\n  %n = mul(%x, %r) : f32[B,S,8]"),
    ("%sq = mul(%x, %x) : f32[B,S,8]", "%r = div(%one, %d) : f32[B,S,1]\n  %n = mul(%r, %x) : f32[B,S,8]"),
    ("%sq = pow(%x, %two) : f32[B,S,8]", "%n = div(%x, %d) : f32[B,S,8]"),
])
def test_rms_norm_spellings(square: str, inv: str) -> None:
    check_rewrite(
        f"""graph @m(%x: f32[B,S,8]) weights(%w: f32[8]) {{
          %two = constant() {{value=dense<f32[]>[2.0]}} : f32[]
          %one = constant() {{value=dense<f32[1]>[1.0]}} : f32[1]
          %eps = constant() {{value=dense<f32[1]>[1e-06]}} : f32[1]
          {square}
          %ms = reduce_mean(%sq) {{axes=[-1]}} : f32[B,S,1]
          %a = add(%eps, %ms) : f32[B,S,1]
          %d = sqrt(%a) : f32[B,S,1]
          {inv}
          %y = mul(%w, %n) : f32[B,S,8]
          return %y
        }}""",
        """graph @m(%x: f32[B,S,8]) weights(%w: f32[8]) {
          %y = rms_norm(%x, %w) {eps=1e-06} : f32[B,S,8]
          return %y
        }""",
        ["fuse-rms-norm"], weights=_w(),
    )


def test_residual_add_stays_and_upcast_is_absorbed() -> None:
    # HF: h = x + r; norm computed in f32 on cast(h), cast back, times w; h is also returned
    check_rewrite(
        """graph @m(%x: f16[T,8], %r: f16[T,8]) weights(%w: f16[8]) {
          %h = add(%x, %r) : f16[T,8]
          %hf = cast(%h) {to=f32} : f32[T,8]
          %two = constant() {value=dense<f32[]>[2.0]} : f32[]
          %eps = constant() {value=dense<f32[]>[1e-05]} : f32[]
          %sq = pow(%hf, %two) : f32[T,8]
          %ms = reduce_mean(%sq) {axes=[1]} : f32[T,1]
          %a = add(%ms, %eps) : f32[T,1]
          %d = sqrt(%a) : f32[T,1]
          %r2 = reciprocal(%d) : f32[T,1]
          %n = mul(%hf, %r2) : f32[T,8]
          %nh = cast(%n) {to=f16} : f16[T,8]
          %y = mul(%nh, %w) : f16[T,8]
          return %y, %h
        }""",
        """graph @m(%x: f16[T,8], %r: f16[T,8]) weights(%w: f16[8]) {
          %h = add(%x, %r) : f16[T,8]
          %y = rms_norm(%h, %w) : f16[T,8]
          return %y, %h
        }""",
        ["fuse-rms-norm"], weights={"w": _w()["w"].astype(np.float16)}, numerics=False,
    )


def test_gemma_one_plus_w_and_cast_back() -> None:
    g = check_rewrite(
        """graph @m(%x: f16[T,8]) weights(%w: f32[8]) {
          %xf = cast(%x) {to=f32} : f32[T,8]
          %sq = mul(%xf, %xf) : f32[T,8]
          %ms = reduce_mean(%sq) {axes=[-1]} : f32[T,1]
          %eps = constant() {value=dense<f32[]>[1e-06]} : f32[]
          %a = add(%ms, %eps) : f32[T,1]
          %d = sqrt(%a) : f32[T,1]
          %r = reciprocal(%d) : f32[T,1]
          %n = mul(%xf, %r) : f32[T,8]
          %one = constant() {value=dense<f32[]>[1.0]} : f32[]
          %s = add(%one, %w) : f32[8]
          %y = mul(%n, %s) : f32[T,8]
          %yh = cast(%y) {to=f16} : f16[T,8]
          return %yh
        }""",
        """graph @m(%x: f16[T,8]) weights(%w: f32[8]) {
          %one = constant() {value=dense<f32[]>[1.0]} : f32[]
          %s = add(%one, %w) : f32[8]
          %yh = rms_norm(%x, %s) {eps=1e-06} : f16[T,8]
          return %yh
        }""",
        ["fuse-rms-norm"], weights=_w(), numerics=False,
    )
    assert g.op_histogram()["rms_norm"] == 1


def test_numerics_in_f16_within_tolerance() -> None:
    from ingot.ir.text import parse_graph
    from ingot.passes import run_passes
    from tests.passes.common import assert_same_outputs

    text = """graph @m(%x: f16[4,8]) weights(%w: f16[8]) {
      %xf = cast(%x) {to=f32} : f32[4,8]
      %two = constant() {value=dense<f32[]>[2.0]} : f32[]
      %sq = pow(%xf, %two) : f32[4,8]
      %ms = reduce_mean(%sq) {axes=[-1]} : f32[4,1]
      %eps = constant() {value=dense<f32[]>[1e-05]} : f32[]
      %a = add(%ms, %eps) : f32[4,1]
      %d = sqrt(%a) : f32[4,1]
      %n = div(%xf, %d) : f32[4,8]
      %nh = cast(%n) {to=f16} : f16[4,8]
      %y = mul(%w, %nh) : f16[4,8]
      return %y
    }"""
    w = {"w": _w()["w"].astype(np.float16)}
    before, after = parse_graph(text, weights=w), parse_graph(text, weights=w)
    run_passes(after, ["fuse-rms-norm"])
    assert after.op_histogram() == {"rms_norm": 1}
    assert_same_outputs(before, after)


def test_not_fused_when_mean_is_not_over_trailing_axes() -> None:
    text = """graph @m(%x: f32[4,8]) weights(%w: f32[8]) {
          %sq = mul(%x, %x) : f32[4,8]
          %ms = reduce_mean(%sq) {axes=[0]} : f32[1,8]
          %eps = constant() {value=dense<f32[]>[1e-05]} : f32[]
          %a = add(%ms, %eps) : f32[1,8]
          %d = sqrt(%a) : f32[1,8]
          %n = div(%x, %d) : f32[4,8]
          %y = mul(%w, %n) : f32[4,8]
          return %y
        }"""
    check_rewrite(text, text, ["fuse-rms-norm"], weights=_w())
