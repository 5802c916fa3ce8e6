"""fuse-split-rope: Before/Expected, numerics (CPU backend, fresh random inputs), and what it leaves alone."""

from __future__ import annotations

import numpy as np
import pytest

from ingot.ir.ops.llm import Rope, RopeQKV
from ingot.ir.text import parse_graph
from ingot.passes import PassContext, run_passes
from tests.helpers import assert_close, rng
from tests.passes.common import check_rewrite

_SIG = "graph @m(%x: f32[T,6], %qkv0: f32[T,48], %pos: i64[T], %cos: f32[16,R], %sin: f32[16,R])"


def _graph(rot: int, inter: bool, v_user: str = "") -> str:
    attrs = f"head_dim=8, rotary_dim={rot}" + (", interleaved=true" if inter else "")
    return f"""{_SIG.replace("R", str(rot // 2))} {{
      %qkv = add(%qkv0, %qkv0) : f32[T,48]
      %q, %k, %v = split(%qkv) {{axis=1, num_outputs=3, split=[32, 8, 8]}} : f32[T,32], f32[T,8], f32[T,8]
      {v_user}
      %qr = rope(%q, %pos, %cos, %sin) {{{attrs}}} : f32[T,32]
      %kr = rope(%k, %pos, %cos, %sin) {{{attrs}}} : f32[T,8]
      %s = mul(%kr, %v) : f32[T,8]
      return %qr, %s
    }}"""


@pytest.mark.parametrize("rot,inter", [(8, False), (4, False), (8, True), (4, True)])  # GQA 4:1, partial rotary
def test_rope_over_qkv(rot: int, inter: bool) -> None:
    attrs = f"num_heads=4, num_kv_heads=1, head_dim=8, rotary_dim={rot}" + (", interleaved=true" if inter else "")
    check_rewrite(
        _graph(rot, inter),
        f"""{_SIG.replace("R", str(rot // 2))} {{
          %qkv = add(%qkv0, %qkv0) : f32[T,48]
          %qr, %kr, %v = rope_qkv(%qkv, %pos, %cos, %sin) {{{attrs}}} : f32[T,32], f32[T,8], f32[T,8]
          %s = mul(%kr, %v) : f32[T,8]
          return %qr, %s
        }}""",
        ["fuse-split-rope"],
    )


def test_fused_node_goes_before_an_early_reader_of_v() -> None:
    g = parse_graph(_graph(8, False, "%w = neg(%v) : f32[T,8]").replace("return %qr, %s", "return %qr, %s, %w"))
    run_passes(g, ["fuse-split-rope"], PassContext(verify_each=True))
    assert [n.op.name for n in g.nodes] == ["add", "rope_qkv", "neg", "mul"]
    assert [o.name for o in g.nodes[1].outputs] == ["qr", "kr", "v"]  # the replaced values' names


@pytest.mark.parametrize("change", [
    ("%kr = rope(%k, %pos, %cos, %sin)", "%kr = rope(%k, %pos, %sin, %cos)"),  # other tables
    ("%s = mul(%kr, %v) : f32[T,8]", "%s = mul(%kr, %k) : f32[T,8]"),  # k read unrotated too
    ("split=[32, 8, 8]} : f32[T,32], f32[T,8], f32[T,8]", "split=[24, 16, 8]} : f32[T,24], f32[T,16], f32[T,8]"),
])
def test_left_alone(change: tuple[str, str]) -> None:
    text = _graph(8, False).replace(*change)
    if "[24, 16, 8]" in text:  # keep the graph valid: 3 q heads, 2 k heads, v of one head
        text = text.replace("%qr = rope(%q, %pos, %cos, %sin) {head_dim=8, rotary_dim=8} : f32[T,32]",
                            "%qr = rope(%q, %pos, %cos, %sin) {head_dim=8, rotary_dim=8} : f32[T,24]")
        text = text.replace("%kr = rope(%k, %pos, %cos, %sin) {head_dim=8, rotary_dim=8} : f32[T,8]",
                            "%kr0 = rope(%k, %pos, %cos, %sin) {head_dim=8, rotary_dim=8} : f32[T,16]\n"
                            "%kr, %kx = split(%kr0) {axis=1, split=[8, 8]} : f32[T,8], f32[T,8]")
    g = parse_graph(text)
    run_passes(g, ["fuse-split-rope"], PassContext(verify_each=True))
    assert "rope_qkv" not in g.op_histogram() and g.op_histogram()["rope"] == 2


def test_reference_is_split_then_rope() -> None:
    r = rng()
    qkv = r.standard_normal((5, (6 + 2 * 2) * 16)).astype(np.float32)
    pos = r.integers(0, 32, 5).astype(np.int64)
    cos, sin = r.standard_normal((32, 6)).astype(np.float32), r.standard_normal((32, 6)).astype(np.float32)
    op = RopeQKV(num_heads=6, num_kv_heads=2, head_dim=16, rotary_dim=12, interleaved=True)
    q, k, v = op.ref(qkv, pos, cos, sin)
    rope = Rope(head_dim=16, rotary_dim=12, interleaved=True)
    assert_close(q, rope.ref(qkv[:, :96], pos, cos, sin), rtol=0.0, atol=0.0)
    assert_close(k, rope.ref(qkv[:, 96:128], pos, cos, sin), rtol=0.0, atol=0.0)
    assert np.array_equal(v, qkv[:, 128:])
