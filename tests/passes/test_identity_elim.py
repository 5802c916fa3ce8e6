"""identity-elim: identities, identity transposes/reshapes, view chains, neutral elements."""

from __future__ import annotations

from tests.passes.common import check_rewrite


def test_identities_go():
    check_rewrite(
        """graph @m(%x: f32[2,3]) {
          %a = identity(%x) : f32[2,3]
          %b = transpose(%a) {perm=[0, 1]} : f32[2,3]
          %c = reshape(%b) {shape=[2, 3]} : f32[2,3]
          %d = concat(%c) : f32[2,3]
          %e = slice(%d) {starts=[0], ends=[9223372036854775807], axes=[1]} : f32[2,3]
          %f = expand(%e) {shape=[1, 3]} : f32[2,3]
          %y = exp(%f) : f32[2,3]
          return %y
        }""",
        """graph @m(%x: f32[2,3]) {
          %y = exp(%x) : f32[2,3]
          return %y
        }""",
        ["identity-elim"],
    )


def test_transpose_pairs_compose():
    check_rewrite(
        """graph @m(%x: f32[2,3,4]) {
          %a = transpose(%x) {perm=[1, 2, 0]} : f32[3,4,2]
          %b = transpose(%a) {perm=[0, 2, 1]} : f32[3,2,4]
          %c = transpose(%x) {perm=[2, 0, 1]} : f32[4,2,3]
          %d = transpose(%c) {perm=[1, 2, 0]} : f32[2,3,4]
          return %b, %d
        }""",
        """graph @m(%x: f32[2,3,4]) {
          %b = transpose(%x) {perm=[1, 0, 2]} : f32[3,2,4]
          return %b, %x as "d"
        }""",
        ["identity-elim"],
    )


def test_view_chains_merge_with_symbolic_dims():
    check_rewrite(
        """graph @m(%x: f32[B,6,4]) {
          %a = reshape(%x) {shape=[0, 24]} : f32[B,24]
          %b = unsqueeze(%a) {axes=[2]} : f32[B,24,1]
          %c = reshape(%b) {shape=[0, 2, 12]} : f32[B,2,12]
          %y = exp(%c) : f32[B,2,12]
          return %y
        }""",
        """graph @m(%x: f32[B,6,4]) {
          %c = reshape(%x) {shape=[0, 2, 12]} : f32[B,2,12]
          %y = exp(%c) : f32[B,2,12]
          return %y
        }""",
        ["identity-elim", "dce"],
    )


def test_runtime_reshape_with_known_type_loses_its_input():
    check_rewrite(
        """graph @m(%x: f32[B,S,64], %s: i64[4]) {
          %a = reshape(%x, %s) {shape=["B", "S", 4, 16]} : f32[B,S,4,16]
          return %a
        }""",
        """graph @m(%x: f32[B,S,64], %s: i64[4]) {
          %a = reshape(%x) {shape=[0, 0, 4, 16]} : f32[B,S,4,16]
          return %a
        }""",
        ["identity-elim"],
        numerics=False,  # %s is a free input here; the type claims its value
    )


def test_neutral_elements():
    check_rewrite(
        """graph @m(%x: f32[2,3], %i: i32[3], %p: bool[3]) {
          %one = constant() {value=dense<f32[3]>[1.0, 1.0, 1.0]} : f32[3]
          %a = mul(%one, %x) : f32[2,3]
          %b = div(%a, %one) : f32[2,3]
          %z = constant() {value=dense<i32[]>[0]} : i32[]
          %j = add(%i, %z) : i32[3]
          %t = constant() {value=dense<bool[]>[true]} : bool[]
          %q = and(%t, %p) : bool[3]
          return %b, %j, %q
        }""",
        """graph @m(%x: f32[2,3], %i: i32[3], %p: bool[3]) {
          return %x as "b", %i as "j", %p as "q"
        }""",
        ["identity-elim"],
    )


def test_broadcasting_and_float_zero_stay():
    before = """graph @m(%x: f32[3], %v: f32[3]) {
      %one = constant() {value=dense<f32[2,3]>[1.0, 1.0, 1.0, 1.0, 1.0, 1.0]} : f32[2,3]
      %a = mul(%x, %one) : f32[2,3]
      %z = constant() {value=dense<f32[]>[0.0]} : f32[]
      %b = add(%v, %z) : f32[3]
      return %a, %b
    }"""
    check_rewrite(before, before, ["identity-elim"])
