"""fuse-attention: Before/Expected and numerics."""

from __future__ import annotations

import numpy as np

from ingot.ir.text import parse_graph
from tests.helpers import rng
from tests.passes.common import assert_same_outputs, check_rewrite


def test_gqa_with_past_and_additive_mask() -> None:
    # q [B,4,S,8], k/v [B,2,S,8] with past; repeat_kv by unsqueeze/expand/reshape; q and k^T scaled by d^-1/4
    before = """graph @m(%q: f32[B,4,S,8], %k: f32[B,2,S,8], %v: f32[B,2,S,8], %pk: f32[B,2,P,8], %pv: f32[B,2,P,8],
                    %mask: f32[B,1,S,"(P+S)"]) {
          %kc = concat(%pk, %k) {axis=-2} : f32[B,2,"(P+S)",8]
          %vc = concat(%pv, %v) {axis=-2} : f32[B,2,"(P+S)",8]
          %ku = unsqueeze(%kc) {axes=[2]} : f32[B,2,1,"(P+S)",8]
          %ke = expand(%ku) {shape=[1, 2, 2, 1, 8]} : f32[B,2,2,"(P+S)",8]
          %kr = reshape(%ke) {shape=[0, 4, -1, 8]} : f32[B,4,"(P+S)",8]
          %vu = unsqueeze(%vc) {axes=[2]} : f32[B,2,1,"(P+S)",8]
          %ve = expand(%vu) {shape=[1, 2, 2, 1, 8]} : f32[B,2,2,"(P+S)",8]
          %vr = reshape(%ve) {shape=[0, 4, -1, 8]} : f32[B,4,"(P+S)",8]
          %kt = transpose(%kr) {perm=[0, 1, 3, 2]} : f32[B,4,8,"(P+S)"]
          %c = constant() {value=dense<f32[]>[0.5946035575013605]} : f32[]
          %qs = mul(%q, %c) : f32[B,4,S,8]
          %ks = mul(%kt, %c) : f32[B,4,8,"(P+S)"]
          %s = matmul(%qs, %ks) : f32[B,4,S,"(P+S)"]
          %l = add(%mask, %s) : f32[B,4,S,"(P+S)"]
          %p = softmax(%l) : f32[B,4,S,"(P+S)"]
          %y = matmul(%p, %vr) : f32[B,4,S,8]
          return %y, %kc, %vc
        }"""
    g = check_rewrite(
        before,
        """graph @m(%q: f32[B,4,S,8], %k: f32[B,2,S,8], %v: f32[B,2,S,8], %pk: f32[B,2,P,8], %pv: f32[B,2,P,8],
                    %mask: f32[B,1,S,"(P+S)"]) {
          %kc = concat(%pk, %k) {axis=-2} : f32[B,2,"(P+S)",8]
          %vc = concat(%pv, %v) {axis=-2} : f32[B,2,"(P+S)",8]
          %y = attention(%q, %kc, %vc, %mask) {scale=0.35355338, num_heads=4, num_kv_heads=2}
            : f32[B,4,S,8]
          return %y, %kc, %vc
        }""",
        ["fuse-attention"], numerics=False,
    )
    r = rng()
    feeds = {n: r.standard_normal(s).astype(np.float32) for n, s in [
        ("q", (2, 4, 3, 8)), ("k", (2, 2, 3, 8)), ("v", (2, 2, 3, 8)), ("pk", (2, 2, 4, 8)), ("pv", (2, 2, 4, 8)),
        ("mask", (2, 1, 3, 7))]}
    assert_same_outputs(parse_graph(before), g, feeds)


def test_div_scale_bool_where_mask_and_nan_guard() -> None:
    check_rewrite(
        """graph @m(%q: f32[B,2,S,8], %k: f32[B,2,S,8], %v: f32[B,2,S,8], %m: bool[B,1,S,S]) {
          %kt = transpose(%k) {perm=[0, 1, 3, 2]} : f32[B,2,8,S]
          %s = matmul(%q, %kt) : f32[B,2,S,S]
          %d = constant() {value=dense<f32[1]>[4.0]} : f32[1]
          %sd = div(%s, %d) : f32[B,2,S,S]
          %ninf = constant() {value=dense<f32[]>[-inf]} : f32[]
          %l = where(%m, %sd, %ninf) : f32[B,2,S,S]
          %p = softmax(%l) {axis=3} : f32[B,2,S,S]
          %bad = isnan(%p) : bool[B,2,S,S]
          %zero = constant() {value=dense<f32[]>[0.0]} : f32[]
          %pg = where(%bad, %zero, %p) : f32[B,2,S,S]
          %y = matmul(%pg, %v) : f32[B,2,S,8]
          return %y
        }""",
        """graph @m(%q: f32[B,2,S,8], %k: f32[B,2,S,8], %v: f32[B,2,S,8], %m: bool[B,1,S,S]) {
          %y = attention(%q, %k, %v, %m) {scale=0.25, num_heads=2, num_kv_heads=2} : f32[B,2,S,8]
          return %y
        }""",
        ["fuse-attention", "dce"],
    )


def test_wrong_transpose_is_not_fused() -> None:
    # k^T taken over the wrong axes (heads and dim): not attention
    text = """graph @m(%q: f32[B,8,S,8], %k: f32[B,8,S,8], %v: f32[B,8,S,8]) {
          %kt = transpose(%k) {perm=[0, 3, 1, 2]} : f32[B,8,8,S]
          %s = matmul(%q, %kt) : f32[B,8,S,S]
          %p = softmax(%s) : f32[B,8,S,S]
          %y = matmul(%p, %v) : f32[B,8,S,8]
          return %y
        }"""
    check_rewrite(text, text, ["fuse-attention"])
