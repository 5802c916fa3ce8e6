"""fuse-split-swiglu: Before/Expected, numerics (CPU backend, fresh random inputs), and what it leaves alone."""

from __future__ import annotations

import numpy as np
import pytest

from ingot.ir.ops.attention import SwiGLU
from ingot.ir.text import parse_graph
from ingot.passes import PassContext, run_passes
from tests.helpers import assert_close, rng
from tests.passes.common import check_rewrite


@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_swiglu_over_gate_up(alpha: float) -> None:
    check_rewrite(
        f"""graph @m(%gu: f32[T,10], %h: f32[T,5]) {{
          %g, %u = split(%gu) {{axis=-1, split=[5, 5]}} : f32[T,5], f32[T,5]
          %y = swiglu(%g, %u) {{alpha={alpha}}} : f32[T,5]
          %z = add(%y, %h) : f32[T,5]
          return %z
        }}""",
        f"""graph @m(%gu: f32[T,10], %h: f32[T,5]) {{
          %y = swiglu(%gu) {{alpha={alpha}, packed=true}} : f32[T,5]
          %z = add(%y, %h) : f32[T,5]
          return %z
        }}""",
        ["fuse-split-swiglu"],
    )


def test_equal_split_without_sizes_and_axis_1() -> None:
    check_rewrite(
        """graph @m(%gu: f32[3,T,8]) {
          %g, %u = split(%gu) {axis=2} : f32[3,T,4], f32[3,T,4]
          %y = swiglu(%g, %u) : f32[3,T,4]
          return %y
        }""",
        """graph @m(%gu: f32[3,T,8]) {
          %y = swiglu(%gu) {packed=true} : f32[3,T,4]
          return %y
        }""",
        ["fuse-split-swiglu"],
    )


@pytest.mark.parametrize("body", [
    # up first: the packed form is gate first
    """%g, %u = split(%gu) {axis=-1, split=[4, 4]} : f32[T,4], f32[T,4]
       %y = swiglu(%u, %g) : f32[T,4]
       return %y""",
    # a half read elsewhere too
    """%g, %u = split(%gu) {axis=-1, split=[4, 4]} : f32[T,4], f32[T,4]
       %y = swiglu(%g, %u) : f32[T,4]
       %z = add(%y, %u) : f32[T,4]
       return %z""",
    # not the last axis
    """%g, %u = split(%gu) {axis=0, split=[2, 2]} : f32[2,8], f32[2,8]
       %y = swiglu(%g, %u) : f32[2,8]
       return %y""",
])
def test_left_alone(body: str) -> None:
    shape = "4,8" if "axis=0" in body else "T,8"
    text = f"graph @m(%gu: f32[{shape}]) {{\n{body}\n}}"
    g = parse_graph(text)
    run_passes(g, ["fuse-split-swiglu"], PassContext(verify_each=True))
    assert [n.op.name for n in g.nodes][:2] == ["split", "swiglu"] and not g.nodes[1].op.packed


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_packed_reference_is_the_two_input_one(dtype) -> None:
    x = (rng().standard_normal((7, 12)) * 3).astype(dtype)
    got = SwiGLU(alpha=1.3, packed=True).ref(x)
    want = SwiGLU(alpha=1.3).ref(x[:, :6], x[:, 6:])
    assert got.dtype == want.dtype and got.shape == (7, 6)
    assert_close(got, want, rtol=0.0, atol=0.0)
