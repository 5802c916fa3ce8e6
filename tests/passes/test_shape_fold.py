"""shape-fold: exporter shape chains fold given symbolic dims."""

from __future__ import annotations

from ingot.ir.text import parse_graph
from ingot.passes import PassContext, run_passes
from tests.passes.common import assert_same_outputs, check_rewrite


def test_shape_gather_concat_reshape():
    # the TorchScript exporter's multi-head split: Shape -> Gather -> Unsqueeze -> Concat -> Reshape
    check_rewrite(
        """graph @m(%x: f32[batch,seq,64]) {
          %s = shape(%x) : i64[3]
          %i0 = constant() {value=dense<i64[]>[0]} : i64[]
          %d0 = gather(%s, %i0) : i64[]
          %i1 = constant() {value=dense<i64[]>[1]} : i64[]
          %d1 = gather(%s, %i1) : i64[]
          %u0 = unsqueeze(%d0) {axes=[0]} : i64[1]
          %u1 = unsqueeze(%d1) {axes=[0]} : i64[1]
          %c = constant() {value=dense<i64[2]>[-1, 16]} : i64[2]
          %t = concat(%u0, %u1, %c) : i64[4]
          %y = reshape(%x, %t) : f32[?,?,?,?]
          return %y
        }""",
        """graph @m(%x: f32[batch,seq,64]) {
          %y = reshape(%x) {shape=[0, 0, 4, 16]} : f32[batch,seq,4,16]
          return %y
        }""",
        ["shape-fold", "dce"],
    )


def test_shape_of_static_tensor_and_arithmetic():
    check_rewrite(
        """graph @m(%x: f32[2,12], %z: i64[2]) {
          %s = shape(%x) : i64[2]
          %two = constant() {value=dense<i64[]>[2]} : i64[]
          %h = div(%s, %two) : i64[2]
          %y = add(%z, %h) : i64[2]
          return %y
        }""",
        """graph @m(%x: f32[2,12], %z: i64[2]) {
          %h = constant() {value=dense<i64[2]>[1, 6]} : i64[2]
          %y = add(%z, %h) : i64[2]
          return %y
        }""",
        ["shape-fold", "dce"],
    )


def test_expand_with_minus_one_normalization():
    # torch's expand(-1, ...) export: where(shape == -1, 1, shape); symbolic dims are never -1
    check_rewrite(
        """graph @m(%x: f32[B,2,1,T,16]) {
          %s = shape(%x) : i64[5]
          %i0 = constant() {value=dense<i64[1]>[0]} : i64[1]
          %b = gather(%s, %i0) : i64[1]
          %sl = slice(%s) {starts=[3], ends=[4]} : i64[1]
          %k = constant() {value=dense<i64[3]>[2, 2, -1]} : i64[3]
          %c = constant() {value=dense<i64[1]>[16]} : i64[1]
          %t = concat(%b, %k, %c) : i64[5]
          %m = constant() {value=dense<i64[5]>[-1, -1, -1, -1, -1]} : i64[5]
          %one = constant() {value=dense<i64[5]>[1, 1, 1, 1, 1]} : i64[5]
          %e = equal(%t, %m) : bool[5]
          %w = where(%e, %one, %t) : i64[5]
          %y = expand(%x, %w) : f32[?,?,?,?,?]
          %four = constant() {value=dense<i64[1]>[4]} : i64[1]
          %f = concat(%b, %four, %sl, %c) : i64[4]
          %r = reshape(%y, %f) : f32[?,?,?,?]
          return %r
        }""",
        """graph @m(%x: f32[B,2,1,T,16]) {
          %y = expand(%x) {shape=[1, 2, 2, 1, 16]} : f32[B,2,2,T,16]
          %r = reshape(%y) {shape=[0, 4, -1, 16]} : f32[B,4,T,16]
          return %r
        }""",
        ["shape-fold", "dce"],
    )


def test_symbolic_hints_and_range_length():
    check_rewrite(
        """graph @m(%x: f32[B,S]) {
          %s = shape(%x) : i64[2]
          %i1 = constant() {value=dense<i64[]>[1]} : i64[]
          %n = gather(%s, %i1) : i64[]
          %z = constant() {value=dense<i64[]>[0]} : i64[]
          %r = range(%z, %n, %i1) : i64[?]
          %c = constant_of_shape(%s) {value=dense<f32[1]>[0.5]} : f32[?,?]
          %y = add(%x, %c) : f32[B,S]
          return %r, %y
        }""",
        """graph @m(%x: f32[B,S]) {
          %s = shape(%x) : i64[2]
          %i1 = constant() {value=dense<i64[]>[1]} : i64[]
          %n = gather(%s, %i1) : i64[]
          %z = constant() {value=dense<i64[]>[0]} : i64[]
          %r = range(%z, %n, %i1) {length="S"} : i64[S]
          %c = constant_of_shape(%s) {shape=["B", "S"], value=dense<f32[1]>[0.5]} : f32[B,S]
          %y = add(%x, %c) : f32[B,S]
          return %r, %y
        }""",
        ["shape-fold", "dce"],
    )


def test_sum_of_symbols():
    # (past+seq) - seq folds back to past; a gathered sum reaches the reshape
    check_rewrite(
        """graph @m(%k: f32[B,P,8], %q: f32[B,S,8]) {
          %c = concat(%k, %q) {axis=1} : f32[B,"(P+S)",8]
          %s = shape(%c) : i64[3]
          %t = shape(%q) : i64[3]
          %d = sub(%s, %t) : i64[3]
          %i = constant() {value=dense<i64[1]>[1]} : i64[1]
          %p = gather(%d, %i) : i64[1]
          %h = constant() {value=dense<i64[2]>[-1, 8]} : i64[2]
          %target = concat(%h, %p) : i64[3]
          %y = reshape(%k, %target) : f32[?,?,?]
          return %y
        }""",
        """graph @m(%k: f32[B,P,8], %q: f32[B,S,8]) {
          %y = reshape(%k) {shape=[0, 8, -1]} : f32[B,8,P]
          return %y
        }""",
        ["shape-fold", "dce"],
    )


def test_two_step_reshapes():
    # [B,4,T,16] -> [B*4, T, 16] and back: the attribute alone cannot move T, a flatten or an
    # unsqueeze first puts it where 0 (copy) or -1 reaches it
    check_rewrite(
        """graph @m(%x: f32[B,4,T,16]) {
          %s = shape(%x) : i64[4]
          %t = slice(%s) {starts=[2], ends=[3]} : i64[1]
          %m = constant() {value=dense<i64[1]>[-1]} : i64[1]
          %c = constant() {value=dense<i64[1]>[16]} : i64[1]
          %a = concat(%m, %t, %c) : i64[3]
          %y = reshape(%x, %a) : f32[?,?,?]
          %z = transpose(%y) {perm=[0, 2, 1]} : f32[?,?,?]
          %h = slice(%s) {starts=[0], ends=[2]} : i64[2]
          %b = concat(%h, %c, %t) : i64[4]
          %w = reshape(%z, %b) : f32[?,?,?,?]
          return %w
        }""",
        """graph @m(%x: f32[B,4,T,16]) {
          %f = flatten(%x) {axis=2} : f32["(B*4)","(T*16)"]
          %y = reshape(%f) {shape=[0, -1, 16]} : f32["(B*4)",T,16]
          %z = transpose(%y) {perm=[0, 2, 1]} : f32["(B*4)",16,T]
          %u = unsqueeze(%z) {axes=[0]} : f32[1,"(B*4)",16,T]
          %w = reshape(%u) {shape=[-1, 4, 16, 0]} : f32[B,4,16,T]
          return %w
        }""",
        ["shape-fold", "dce"],
    )


def test_unknown_values_stay():
    before = """graph @m(%x: f32[B,S], %t: i64[2]) {
      %y = reshape(%x, %t) : f32[?,?]
      %s = shape(%y) : i64[2]
      %z = reshape(%x, %s) : f32[?,?]
      return %z
    }"""
    check_rewrite(before, before, ["shape-fold"], numerics=False)


def test_numerics_on_random_sizes():
    text = """graph @m(%x: f32[B,S,12]) {
      %s = shape(%x) : i64[3]
      %h = slice(%s) {starts=[0], ends=[2]} : i64[2]
      %c = constant() {value=dense<i64[2]>[3, 4]} : i64[2]
      %t = concat(%h, %c) : i64[4]
      %y = reshape(%x, %t) : f32[?,?,?,?]
      %u = transpose(%y) {perm=[0, 2, 1, 3]} : f32[?,?,?,?]
      %b = shape(%u) : i64[4]
      %p = reshape(%u, %s) : f32[?,?,?]
      return %p, %b
    }"""
    g = parse_graph(text)
    run_passes(g, ["shape-fold", "dce"], PassContext(verify_each=True))
    assert all(len(n.inputs) == 1 for n in g.nodes if n.op.name == "reshape")
    assert str(g.outputs[0].type) == "f32[B,S,12]"
    for _ in range(3):
        assert_same_outputs(parse_graph(text), g)
