"""Checking the TE builders without a GPU: the same compute, built by TVM for the CPU (``llvm``), run
on numpy inputs. Tests compare it with the op's numpy reference; the CUDA kernels come from the
same compute with a GPU schedule (``build.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...ir.graph import Graph
from ...ir.op import Op
from ...ir.types import TensorType


def run_llvm(op: Op, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """``op`` on ``arrays`` through its TE builder, compiled by TVM for the CPU."""
    import tvm
    from tvm import te

    from .build import _copy
    from .common import static_shape, tdtype
    from .rule import builders

    in_types = [None if a is None else TensorType.of(np.asarray(a)) for a in arrays]
    out_types = op.infer(in_types)
    ins, tensors, feeds = [], [], []
    for i, (a, t) in enumerate(zip(arrays, in_types)):
        if t is None:
            ins.append(None)
            continue
        ph = te.placeholder(static_shape(t), tdtype(t.dtype), name=f"in{i}")
        ins.append(ph)
        tensors.append(ph)
        feeds.append(np.require(a, requirements="C"))
    outs = builders()[op.name](op, ins, in_types, out_types)
    outs = [o if o.op.name == f"out{k}" else _copy(o, f"out{k}") for k, o in enumerate(outs)]
    func = te.create_prim_func([*tensors, *outs]).with_attr("global_symbol", "main")
    ex = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    results = [np.zeros(static_shape(t), t.dtype.np) for t in out_types]
    args = [tvm.runtime.tensor(a) for a in feeds] + [tvm.runtime.tensor(r) for r in results]
    ex["main"](*args)
    return [a.numpy() for a in args[len(feeds):]]


def compare_graph(graph: Graph, feeds: dict[str, np.ndarray], nodes: Sequence[int] | None = None,
                  rtol: float = 1e-4, atol: float = 1e-5) -> list[str]:
    """Run ``graph`` with the references; for each node (or those in ``nodes``) with a builder, run its
    TE on the CPU on the same inputs and compare. Returns one line per mismatch."""
    from .rule import OPS

    env = {v: np.asarray(feeds[v.name]) for v in graph.inputs}
    for name, v in graph.weight_values.items():
        env[v] = graph.weights[name].load()
    bad = []
    for i, n in enumerate(graph.nodes):
        args = [None if v is None else env[v] for v in n.inputs]
        want = n.op.run(*args)
        if n.op.name in OPS and (nodes is None or i in nodes):
            try:
                got = run_llvm(n.op, args)
            except Exception as e:
                bad.append(f"node {i} {n.op.name}: {type(e).__name__}: {str(e)[:300]}")
                got = None
            for k, (g, w) in enumerate(zip(got or [], want)):
                w = np.asarray(w)
                if g.shape != w.shape or g.dtype != w.dtype:
                    bad.append(f"node {i} {n.op.name} out{k}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}")
                    continue
                if w.dtype.kind == "f":
                    ok = np.allclose(g, w, rtol=rtol, atol=atol * max(1.0, float(np.abs(w).max(initial=0))),
                                     equal_nan=True)
                else:
                    ok = np.array_equal(g, w)
                if not ok:
                    err = np.abs(g.astype(np.float64) - w.astype(np.float64)).max()
                    bad.append(f"node {i} {n.op.name} out{k}: max abs err {err}")
        for v, a in zip(n.outputs, want):
            env[v] = np.asarray(a)
    return bad
