"""fuse-rope: Before/Expected and numerics."""

from __future__ import annotations

from tests.passes.common import check_rewrite

_TABLES = """
          %pos = cast(%p) {to=f32} : f32[B,S,1]
          %f = mul(%pos, %inv) : f32[B,S,4]
          %ff = concat(%f, %f) {axis=-1} : f32[B,S,8]
          %c3 = cos(%ff) : f32[B,S,8]
          %s3 = sin(%ff) : f32[B,S,8]
          %c = unsqueeze(%c3) {axes=[1]} : f32[B,1,S,8]
          %s = unsqueeze(%s3) {axes=[1]} : f32[B,1,S,8]"""

_HEAD = """graph @m(%q: f32[B,2,S,8], %p: i64[B,S,1]) {
          %inv = constant() {value=dense<f32[4]>[1.0, 0.1, 0.01, 0.001]} : f32[4]"""


def test_rotate_half() -> None:
    check_rewrite(
        _HEAD + _TABLES + """
          %a = mul(%c, %q) : f32[B,2,S,8]
          %lo = slice(%q) {starts=[0], ends=[4], axes=[-1]} : f32[B,2,S,4]
          %hi = slice(%q) {starts=[4], ends=[9223372036854775807], axes=[3]} : f32[B,2,S,4]
          %n = neg(%hi) : f32[B,2,S,4]
          %r = concat(%n, %lo) {axis=-1} : f32[B,2,S,8]
          %rs = mul(%s, %r) : f32[B,2,S,8]
          %y = add(%rs, %a) : f32[B,2,S,8]
          return %y
        }""",
        _HEAD + """
          %pos = cast(%p) {to=f32} : f32[B,S,1]
          %f = mul(%pos, %inv) : f32[B,S,4]
          %ff = concat(%f, %f) {axis=-1} : f32[B,S,8]
          %c3 = cos(%ff) : f32[B,S,8]
          %s3 = sin(%ff) : f32[B,S,8]
          %ch = slice(%c3) {starts=[0], ends=[4], axes=[-1]} : f32[B,S,4]
          %sh = slice(%s3) {starts=[0], ends=[4], axes=[-1]} : f32[B,S,4]
          %y = rotary_embedding(%q, %ch, %sh) : f32[B,2,S,8]
          return %y
        }""",
        ["fuse-rope"],
    )


def test_partial_rotary() -> None:
    tables = _TABLES.replace("S,8]", "S,8]")
    check_rewrite(
        """graph @m(%q: f32[B,2,S,12], %p: i64[B,S,1]) {
          %inv = constant() {value=dense<f32[4]>[1.0, 0.1, 0.01, 0.001]} : f32[4]""" + tables + """
          %qr = slice(%q) {starts=[0], ends=[8], axes=[-1]} : f32[B,2,S,8]
          %qp = slice(%q) {starts=[8], ends=[12], axes=[-1]} : f32[B,2,S,4]
          %a = mul(%qr, %c) : f32[B,2,S,8]
          %lo = slice(%qr) {starts=[0], ends=[4], axes=[-1]} : f32[B,2,S,4]
          %hi = slice(%qr) {starts=[4], ends=[8], axes=[-1]} : f32[B,2,S,4]
          %n = neg(%hi) : f32[B,2,S,4]
          %r = concat(%n, %lo) {axis=-1} : f32[B,2,S,8]
          %rs = mul(%r, %s) : f32[B,2,S,8]
          %y0 = add(%a, %rs) : f32[B,2,S,8]
          %y = concat(%y0, %qp) {axis=-1} : f32[B,2,S,12]
          return %y
        }""",
        """graph @m(%q: f32[B,2,S,12], %p: i64[B,S,1]) {
          %inv = constant() {value=dense<f32[4]>[1.0, 0.1, 0.01, 0.001]} : f32[4]
          %pos = cast(%p) {to=f32} : f32[B,S,1]
          %f = mul(%pos, %inv) : f32[B,S,4]
          %ff = concat(%f, %f) {axis=-1} : f32[B,S,8]
          %c3 = cos(%ff) : f32[B,S,8]
          %s3 = sin(%ff) : f32[B,S,8]
          %ch = slice(%c3) {starts=[0], ends=[4], axes=[-1]} : f32[B,S,4]
          %sh = slice(%s3) {starts=[0], ends=[4], axes=[-1]} : f32[B,S,4]
          %y = rotary_embedding(%q, %ch, %sh) {rotary_dim=8} : f32[B,2,S,12]
          return %y
        }""",
        ["fuse-rope"],
    )


def test_interleaved() -> None:
    check_rewrite(
        """graph @m(%q: f32[B,2,S,8], %p: i64[B,S,1]) {
          %inv = constant() {value=dense<f32[4]>[1.0, 0.1, 0.01, 0.001]} : f32[4]
          %pos = cast(%p) {to=f32} : f32[B,S,1]
          %f = mul(%pos, %inv) : f32[B,S,4]
          %fu = unsqueeze(%f) {axes=[-1]} : f32[B,S,4,1]
          %fe = expand(%fu) {shape=[1, 1, 1, 2]} : f32[B,S,4,2]
          %ff = reshape(%fe) {shape=[0, 0, 8]} : f32[B,S,8]
          %c3 = cos(%ff) : f32[B,S,8]
          %s3 = sin(%ff) : f32[B,S,8]
          %c = unsqueeze(%c3) {axes=[1]} : f32[B,1,S,8]
          %s = unsqueeze(%s3) {axes=[1]} : f32[B,1,S,8]
          %a = mul(%q, %c) : f32[B,2,S,8]
          %ev = slice(%q) {starts=[0], ends=[8], axes=[-1], steps=[2]} : f32[B,2,S,4]
          %od = slice(%q) {starts=[1], ends=[8], axes=[-1], steps=[2]} : f32[B,2,S,4]
          %n = neg(%od) : f32[B,2,S,4]
          %nu = unsqueeze(%n) {axes=[-1]} : f32[B,2,S,4,1]
          %eu = unsqueeze(%ev) {axes=[-1]} : f32[B,2,S,4,1]
          %st = concat(%nu, %eu) {axis=-1} : f32[B,2,S,4,2]
          %r = reshape(%st) {shape=[0, 0, 0, 8]} : f32[B,2,S,8]
          %rs = mul(%r, %s) : f32[B,2,S,8]
          %y = add(%a, %rs) : f32[B,2,S,8]
          return %y
        }""",
        """graph @m(%q: f32[B,2,S,8], %p: i64[B,S,1]) {
          %inv = constant() {value=dense<f32[4]>[1.0, 0.1, 0.01, 0.001]} : f32[4]
          %pos = cast(%p) {to=f32} : f32[B,S,1]
          %f = mul(%pos, %inv) : f32[B,S,4]
          %fu = unsqueeze(%f) {axes=[-1]} : f32[B,S,4,1]
          %fe = expand(%fu) {shape=[1, 1, 1, 2]} : f32[B,S,4,2]
          %ff = reshape(%fe) {shape=[0, 0, 8]} : f32[B,S,8]
          %c3 = cos(%ff) : f32[B,S,8]
          %s3 = sin(%ff) : f32[B,S,8]
          %ch = slice(%c3) {starts=[0], ends=[9223372036854775807], axes=[-1], steps=[2]} : f32[B,S,4]
          %sh = slice(%s3) {starts=[0], ends=[9223372036854775807], axes=[-1], steps=[2]} : f32[B,S,4]
          %y = rotary_embedding(%q, %ch, %sh) {interleaved=true} : f32[B,2,S,8]
          return %y
        }""",
        ["fuse-rope"],
    )


def test_tables_without_duplicated_halves_are_left_alone() -> None:
    text = """graph @m(%q: f32[B,2,S,8], %c: f32[B,1,S,8], %s: f32[B,1,S,8]) {
          %a = mul(%q, %c) : f32[B,2,S,8]
          %lo = slice(%q) {starts=[0], ends=[4], axes=[-1]} : f32[B,2,S,4]
          %hi = slice(%q) {starts=[4], ends=[8], axes=[-1]} : f32[B,2,S,4]
          %n = neg(%hi) : f32[B,2,S,4]
          %r = concat(%n, %lo) {axis=-1} : f32[B,2,S,8]
          %rs = mul(%r, %s) : f32[B,2,S,8]
          %y = add(%a, %rs) : f32[B,2,S,8]
          return %y
        }"""
    check_rewrite(text, text, ["fuse-rope"])
