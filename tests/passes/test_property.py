"""Soundness of the pipelines on random small graphs: outputs keep their values, graphs verify.

The strategy draws a few f32 inputs with random static shapes and 3-15 nodes from unary/binary
elementwise ops (with broadcasting and constants, including the neutral 0/1 the identity rules look
for), reshape (attribute, constant-input and shape-chain forms), transpose, concat, slice, reductions,
casts (exact and lossy chains), identities and duplicated subexpressions.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingot.ir.graph import Graph, Value
from ingot.ir.op import OPS, Op, OpError
from ingot.ir.ops.core import Cast, Constant, Identity
from ingot.ir.ops.elementwise import binary, unary
from ingot.ir.ops.shape import Concat, Reshape, ShapeOf, Slice, Transpose
from ingot.ir.text import parse_graph
from ingot.ir.types import DType, TensorType
from ingot.ir.verify import verify
from ingot.passes import PassContext, manager, run_passes
from ingot.runtime.cpu import run_graph
from tests.helpers import assert_close

UNARY = ["neg", "abs", "tanh", "sigmoid", "exp", "relu"]
BINARY = ["add", "sub", "mul", "div", "max", "min"]
REDUCE = ["reduce_sum", "reduce_mean", "reduce_max"]
KINDS = ["unary", "binary", "const-binary", "reshape", "transpose", "concat", "slice", "reduce", "cast",
         "identity", "duplicate"]


def _shape(draw) -> tuple[int, ...]:
    return tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))


def _factor(draw, n: int) -> list[int]:
    """A random shape with ``n`` elements."""
    dims = []
    while n > 1 and len(dims) < 3:
        divs = [d for d in range(2, n + 1) if n % d == 0]
        d = draw(st.sampled_from(divs))
        dims.append(d)
        n //= d
    if n > 1:
        dims.append(n)
    return draw(st.permutations(dims)) if dims else [1]


class _Builder:
    def __init__(self, draw) -> None:
        self.draw = draw
        self.g = Graph("random")
        self.pool: list[Value] = []

    def add(self, op: Op, inputs: list[Value | None], declare: tuple[int, ...] | None = None) -> Value | None:
        """Add a node; ``declare`` gives a sharper declared shape than inference (a runtime reshape)."""
        try:
            v = self.g.add1(op, inputs)
        except (OpError, ValueError):
            return None
        if declare is not None:
            v.type = TensorType(v.type.dtype, declare)
        if v.type.is_static and v.type.rank:  # later ops draw from static shapes of rank >= 1
            self.pool.append(v)
        return v

    def const(self, shape: tuple[int, ...], dtype: DType = DType.f32) -> Value:
        draw = self.draw
        special = draw(st.sampled_from(["random", "one", "zero"]))
        if special == "one":
            a = np.ones(shape)
        elif special == "zero":
            a = np.zeros(shape)
        else:
            a = np.array(draw(st.lists(st.floats(-3, 3, width=32), min_size=int(np.prod(shape)),
                                       max_size=int(np.prod(shape))))).reshape(shape)
        return self.g.add1(Constant(value=a.astype(dtype.np)), [])

    def pick(self, f32: bool = False) -> Value:
        cands = [v for v in self.pool if not f32 or v.type.dtype is DType.f32]
        return self.draw(st.sampled_from(cands or self.pool))

    def step(self) -> None:
        draw = self.draw
        kind = draw(st.sampled_from(KINDS))
        x = self.pick(f32=kind in ("unary", "binary", "const-binary", "reduce"))
        shape = x.type.shape
        assert shape is not None and all(isinstance(d, int) for d in shape)
        if kind == "unary":
            self.add(unary(draw(st.sampled_from(UNARY))), [x])
        elif kind == "binary":
            y = self.pick(f32=True)
            self.add(binary(draw(st.sampled_from(BINARY))), draw(st.permutations([x, y])))
        elif kind == "const-binary":
            k = draw(st.integers(0, len(shape)))
            c = self.const(tuple(shape[k:]), x.type.dtype)  # broadcasts against x
            self.add(binary(draw(st.sampled_from(BINARY))), draw(st.permutations([x, c])))
        elif kind == "reshape":
            n = int(np.prod(shape))
            target = _factor(draw, n)
            form = draw(st.sampled_from(["attr", "input", "chain"]))
            if form == "attr":
                self.add(Reshape(shape=tuple(target)), [x])
            elif form == "input":
                s = self.g.add1(Constant(value=np.array(target, np.int64)), [])
                self.add(Reshape(), [x, s], declare=tuple(target))
            else:  # reshape(x, shape(x)) -> reshape to target, through a shape chain
                s = self.g.add1(ShapeOf(), [x])
                back = self.add(Reshape(), [x, s], declare=tuple(shape))
                if back is not None:
                    t = self.g.add1(Constant(value=np.array(target, np.int64)), [])
                    self.add(Reshape(), [back, t], declare=tuple(target))
        elif kind == "transpose":
            perm = draw(st.permutations(range(len(shape))))
            self.add(Transpose(perm=tuple(perm)), [x])
        elif kind == "concat":
            same = [v for v in self.pool if v.type.dtype == x.type.dtype and v.type.shape is not None
                    and len(v.type.shape) == len(shape)]
            y = draw(st.sampled_from(same))
            ax = draw(st.integers(0, len(shape) - 1))
            self.add(Concat(axis=ax), [x, y])
        elif kind == "slice":
            ax = draw(st.integers(0, len(shape) - 1))
            start = draw(st.integers(0, shape[ax] - 1))
            end = draw(st.sampled_from([shape[ax], 2**63 - 1, start + 1]))
            self.add(Slice(starts=(start,), ends=(end,), axes=(ax,)), [x])
        elif kind == "reduce":
            ax = draw(st.integers(0, len(shape) - 1))
            self.add(OPS[draw(st.sampled_from(REDUCE))](axes=(ax,), keepdims=draw(st.booleans())), [x])
        elif kind == "cast":
            path = draw(st.sampled_from([[DType.f64, DType.f32], [DType.f16, DType.f32], [DType.f32],
                                         [DType.i32, DType.i64, DType.f32], [DType.f64]]))
            v: Value | None = x
            for to in path:
                if v is not None:
                    v = self.add(Cast(to=to), [v])
        elif kind == "identity":
            self.add(Identity(), [x])
        elif kind == "duplicate" and x.producer is not None and x.producer.op.name != "constant":
            n = x.producer
            if len(n.outputs) == 1:
                self.add(n.op, list(n.inputs))


@st.composite
def random_graphs(draw) -> tuple[str, int]:
    b = _Builder(draw)
    for i in range(draw(st.integers(1, 3))):
        b.pool.append(b.g.add_input(f"x{i}", TensorType(DType.f32, _shape(draw))))
    inputs = list(b.pool)
    for _ in range(draw(st.integers(3, 15))):
        b.step()
    made = [v for v in b.pool if v not in inputs]
    if not made:
        made = [b.g.add1(unary("neg"), [inputs[0]])]
    outs = [made[-1]] + draw(st.lists(st.sampled_from(made), max_size=2, unique=True))
    for i, v in enumerate(dict.fromkeys(outs)):
        b.g.add_output(v, f"out{i}")
    verify(b.g)
    return str(b.g), draw(st.integers(0, 2**32 - 1))


def _feeds(g: Graph, seed: int) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    return {v.name: r.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs}  # type: ignore


def _check(text: str, seed: int, pipeline: str) -> None:
    before = parse_graph(text)
    after = parse_graph(text)
    run_passes(after, pipeline, PassContext(verify_each=True))
    verify(after)
    feeds = _feeds(before, seed)
    want, got = run_graph(before, feeds), run_graph(after, feeds)
    assert list(got) == list(want)
    for k in want:
        assert_close(got[k], want[k], what=f"{k}\n{text}\n---\n{after}")


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(random_graphs())
def test_o1_preserves_outputs(case):
    _check(*case, "O1")


def _has_fuse() -> bool:
    manager._ensure_builtin()
    return "fuse" in manager.PASSES


@pytest.mark.skipif(not _has_fuse(), reason="the fuse pass is not written yet (O2 = canonicalize, fuse, ...)")
@_SETTINGS
@given(random_graphs())
def test_o2_preserves_outputs(case):
    _check(*case, "O2")
