"""Shared by the pass tests: Before/Expected comparison and before/after numerics."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ingot.ir.graph import Graph
from ingot.ir.text import parse_graph
from ingot.ir.verify import verify
from ingot.passes import PassContext, run_passes
from ingot.runtime.cpu import run_graph
from tests.helpers import assert_close, rng


def normalized(g: Graph) -> str:
    """The text form with node outputs renamed ``v0, v1, ...`` in order (graph inputs and weights
    keep their names), so fresh names made by a pass do not matter."""
    i = 0
    for n in g.nodes:
        for o in n.outputs:
            o.name = f"v{i}"
            i += 1
    return str(g)


def check_rewrite(before: str, expected: str, passes: Sequence[str], ctx: PassContext | None = None,
                  weights: dict[str, np.ndarray] | None = None, numerics: bool = True) -> Graph:
    """Parse ``before``, run ``passes``, compare with ``expected`` (structurally), check the graph
    verifies and (with ``numerics``) that the CPU backend gives the same outputs before and after."""
    g = parse_graph(before, weights=weights)
    ref = parse_graph(before, weights=weights)
    run_passes(g, list(passes), ctx or PassContext(verify_each=True))
    verify(g)
    want = parse_graph(expected, weights=weights)
    got_text, want_text = normalized(g), normalized(want)
    assert got_text == want_text, f"got:\n{got_text}\nexpected:\n{want_text}"
    if numerics:
        assert_same_outputs(ref, g)
    return g


def random_feeds(g: Graph, dims: dict[str, int] | None = None, seed: int | None = None) -> dict[str, np.ndarray]:
    """Fresh random inputs (never zeros); symbolic dims bound to ``dims`` or random sizes 1..5."""
    r = rng(seed)
    dims = dict(dims or {})
    feeds = {}
    for v in g.inputs:
        assert v.type.shape is not None
        shape = []
        for d in v.type.shape:
            if isinstance(d, int):
                shape.append(d)
            else:
                shape.append(dims.setdefault(d, int(r.integers(1, 6))))
        dt = v.type.dtype.np
        if dt.kind == "f" or v.type.dtype.is_float:
            a = r.standard_normal(shape).astype(np.float32).astype(dt)
        elif dt == np.bool_:
            a = r.integers(0, 2, shape).astype(np.bool_)
        else:
            a = r.integers(1, 9, shape).astype(dt)
        feeds[v.name] = a
    return feeds


def assert_same_outputs(before: Graph, after: Graph, feeds: dict[str, np.ndarray] | None = None,
                        rtol: float | None = None) -> None:
    feeds = feeds if feeds is not None else random_feeds(before)
    want = run_graph(before, feeds)
    got = run_graph(after, feeds)
    assert set(got) == set(want)
    for k in want:
        assert_close(got[k], want[k], rtol=rtol, what=k)
