"""The pattern rewriter: captures, commutativity, predicates, one-use, fixed point, type checks."""

import numpy as np
import pytest

from ingot.ir.ops.elementwise import Swish, binary, unary
from ingot.ir.text import parse_graph, print_graph
from ingot.ir.verify import verify
from ingot.passes.rewrite import Const, P, RewriteError, Rule, Var, rewrite
from ingot.runtime.cpu import run_graph
from tests.helpers import assert_close, rng


def same(before: str, expected: str, rules, **kw) -> dict:
    g = parse_graph(before, **kw)
    hits = rewrite(g, rules)
    verify(g)
    assert print_graph(g) == print_graph(parse_graph(expected, **kw))
    return hits


# x * sigmoid(x) -> swish(x), written as a pattern with a repeated capture
SILU = Rule(
    "silu",
    P("mul", Var("x"), P("sigmoid", Var("x")), commutative=True),
    replace=lambda m, b: b.add(Swish(), [m["x"]]),
)


def test_repeated_capture_and_commutativity():
    before = """graph @g(%x: f32[4], %y: f32[4]) {
      %s = sigmoid(%x) : f32[4]
      %a = mul(%s, %x) : f32[4]
      %t = sigmoid(%y) : f32[4]
      %b = mul(%x, %t) : f32[4]
      %c = add(%a, %b) : f32[4]
      return %c
    }"""
    expected = """graph @g(%x: f32[4], %y: f32[4]) {
      %0 = swish(%x) : f32[4]
      %t = sigmoid(%y) : f32[4]
      %b = mul(%x, %t) : f32[4]
      %c = add(%0, %b) : f32[4]
      return %c
    }"""
    feeds = {"x": rng().standard_normal(4).astype(np.float32), "y": rng().standard_normal(4).astype(np.float32)}
    want = run_graph(parse_graph(before), feeds)["c"]
    # mul(x, sigmoid(y)) must not match: the two captures of x differ
    assert same(before, expected, [SILU]) == {"silu": 1}
    g = parse_graph(before)
    rewrite(g, [SILU])
    assert_close(run_graph(g, feeds)["c"], want, rtol=1e-6, atol=1e-6)


def test_fixed_point_and_constants():
    # (x + 0) + 0 -> x, through two sweeps; Const captures the array
    zero = Rule("add-zero", P("add", Var("x"), Const("z", where=lambda a: not np.any(a)), commutative=True),
                replace=lambda m, b: m["x"])
    before = """graph @g(%x: f32[3]) {
      %z = constant() {value=dense<f32[]>[0.0]} : f32[]
      %a = add(%x, %z) : f32[3]
      %b = add(%z, %a) : f32[3]
      %c = mul(%b, %b) : f32[3]
      return %c
    }"""
    expected = """graph @g(%x: f32[3]) {
      %c = mul(%x, %x) : f32[3]
      return %c
    }"""
    assert same(before, expected, [zero]) == {"add-zero": 2}


def test_one_use_blocks_duplication_and_declining_replacement():
    fused = Rule("exp-neg", P("exp", P("neg", Var("x"), one_use=True)),
                 replace=lambda m, b: b.add(unary("reciprocal"), [b.add(unary("exp"), [m["x"]])]))
    text = """graph @g(%x: f32[2]) {
      %n = neg(%x) : f32[2]
      %e = exp(%n) : f32[2]
      %f = add(%e, %n) : f32[2]
      return %f
    }"""
    g = parse_graph(text)
    assert rewrite(g, [fused]) == {}
    assert print_graph(g) == print_graph(parse_graph(text))
    never = Rule("never", P("neg", Var("x")), replace=lambda m, b: None)
    assert rewrite(g, [never]) == {}


def test_where_predicate_and_attrs():
    only_f16 = Rule("f16-only", P("cast", Var("x"), attrs={"to": _dt("f16")}),
                    replace=lambda m, b: b.add(binary("add"), [m.root.outputs[0], m.root.outputs[0]]),
                    where=lambda m: False)
    g = parse_graph("""graph @g(%x: f32[2]) {
      %c = cast(%x) {to=f16} : f16[2]
      return %c
    }""")
    assert rewrite(g, [only_f16]) == {}


def _dt(name):
    from ingot.ir.types import DType

    return DType(name)


def test_replacement_of_wrong_type_is_an_error():
    bad = Rule("bad", P("neg", Var("x")),
               replace=lambda m, b: b.add(_cast_f16(), [m["x"]]))
    g = parse_graph("""graph @g(%x: f32[2]) {
      %n = neg(%x) : f32[2]
      return %n
    }""")
    with pytest.raises(RewriteError, match=r"rule bad: replacement .* f16\[2\] does not fit %n: f32\[2\]"):
        rewrite(g, [bad])


def _cast_f16():
    from ingot.ir.ops.core import Cast
    from ingot.ir.types import DType

    return Cast(to=DType.f16)


def test_graph_outputs_are_redirected():
    ident = Rule("drop-identity", P("identity", Var("x")), replace=lambda m, b: m["x"])
    before = """graph @g(%x: f32[2]) {
      %a = neg(%x) : f32[2]
      %b = identity(%a) : f32[2]
      return %b as "out"
    }"""
    expected = """graph @g(%x: f32[2]) {
      %a = neg(%x) : f32[2]
      return %a as "out"
    }"""
    same(before, expected, [ident])
