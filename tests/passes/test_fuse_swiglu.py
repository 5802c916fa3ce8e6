"""fuse-swiglu: Before/Expected and numerics."""

from __future__ import annotations

import numpy as np
import pytest

from ingot.ir.ops.fused import GeGLU
from tests.helpers import assert_close, rng
from tests.passes.common import check_rewrite


@pytest.mark.parametrize("silu", [
    "%s = sigmoid(%g) : f32[T,8]\n  %a = mul(%s, %g) : f32[T,8]",
    "%s = swish(%g) : f32[T,8]\n  %a = identity(%s) : f32[T,8]",
    "%n = neg(%g) : f32[T,8]\n  %e = exp(%n) : f32[T,8]\n  %d = add(%e, %one) : f32[T,8]\n"
    "  %a = div(%g, %d) : f32[T,8]",
])
def test_swiglu_spellings(silu: str) -> None:
    if "identity" in silu:
        silu = silu.replace("\n  %a = identity(%s) : f32[T,8]", "").replace("%s = swish", "%a = swish")
    check_rewrite(
        f"""graph @m(%g: f32[T,8], %u: f32[T,8]) {{
          %one = constant() {{value=dense<f32[1]>[1.0]}} : f32[1]
          {silu}
          %y = mul(%u, %a) : f32[T,8]
          return %y
        }}""",
        """graph @m(%g: f32[T,8], %u: f32[T,8]) {
          %y = swiglu(%g, %u) : f32[T,8]
          return %y
        }""",
        ["fuse-swiglu", "dce"],
    )


def test_swiglu_alpha_and_geglu() -> None:
    check_rewrite(
        """graph @m(%g: f32[T,8], %u: f32[T,8]) {
          %k = constant() {value=dense<f32[]>[1.702]} : f32[]
          %gk = mul(%g, %k) : f32[T,8]
          %s = sigmoid(%gk) : f32[T,8]
          %a = mul(%g, %s) : f32[T,8]
          %y = mul(%a, %u) : f32[T,8]
          %ge = gelu(%g) {approximate="tanh"} : f32[T,8]
          %z = mul(%ge, %u) : f32[T,8]
          return %y, %z
        }""",
        """graph @m(%g: f32[T,8], %u: f32[T,8]) {
          %y = swiglu(%g, %u) {alpha=1.702} : f32[T,8]
          %z = geglu(%g, %u) {approximate="tanh"} : f32[T,8]
          return %y, %z
        }""",
        ["fuse-swiglu"],
    )


def test_not_fused_when_shapes_broadcast_or_silu_is_reused() -> None:
    text = """graph @m(%g: f32[T,8], %u: f32[1,8], %v: f32[T,8]) {
      %s = sigmoid(%g) : f32[T,8]
      %a = mul(%g, %s) : f32[T,8]
      %y = mul(%a, %u) : f32[T,8]
      %z = mul(%a, %v) : f32[T,8]
      return %y, %z
    }"""
    check_rewrite(text, text, ["fuse-swiglu"])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_geglu_reference(approximate: str) -> None:
    from ingot.ir.ops.elementwise import Gelu

    r = rng()
    a, b = r.standard_normal((3, 8)).astype(np.float32), r.standard_normal((3, 8)).astype(np.float32)
    want = Gelu(approximate=approximate).run(a)[0] * b
    assert_close(GeGLU(approximate=approximate).run(a, b)[0], want)
