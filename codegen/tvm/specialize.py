"""Graph mode before generated kernels: constants become weights, symbolic dims become static.

``prepare_graph(graph, target, limits)`` runs in ``lower_for_target`` on graph-mode graphs (not the
serving form). It does nothing when every node has a template kernel. Otherwise, since kernels
generated through TVM are built for static shapes:

1. every symbolic dim of the graph's inputs must be bound in ``limits`` (the compile's
   ``PassContext.options["cuda"]``, e.g. ``{"batch": 1, "seq": 8}``); an unbound one is an error
   naming it. The inputs get those static shapes, op attributes holding dim expressions (range
   lengths, expand/reshape/constant_of_shape shape hints) are evaluated, types are inferred again
   and the canonicalization passes run, which fold the exporter's shape arithmetic into constants;
   a value whose shape is still not static afterwards is an error naming it;
2. ``constant`` nodes become weights (no kernel, one upload).

The artifact's graph is then the specialized one: its inputs have static shapes, and both backends
refuse other shapes with a message naming the expected ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ...ir.graph import Graph, Weight
from ...ir.types import TensorType
from ..kernels.copy.rule import plan as plan_copy
from ..memory_plan import KV_DIM, PlanError, eval_dim
from ..registry import plan_node
from ..target import Target

COPY_OPS = ("split", "gather", "cast")


class SpecializeError(ValueError):
    """The graph cannot be made static for generated kernels (an unbound dim, a shape left symbolic)."""


def needs_fallback(graph: Graph, target: Target) -> list[str]:
    """Op names of nodes no template family takes on ``target``."""
    out = []
    for node in graph.nodes:
        types = [v.type if v is not None else None for v in node.inputs]
        specs = plan_copy(node.op, types, target) if node.op.name in COPY_OPS else plan_node(node, target, False)
        if specs is None:
            out.append(node.op.name)
    return out


def _is_static(t: TensorType) -> bool:
    return t.shape is not None and all(isinstance(d, int) for d in t.shape)


def _bind_dim(d: Any, bindings: Mapping[str, int]) -> Any:
    if isinstance(d, str) and d != "?":
        try:
            return eval_dim(d, bindings)
        except PlanError:
            return d
    return d


def _bind_type(t: TensorType, bindings: Mapping[str, int]) -> TensorType:
    if t.shape is None:
        return t
    return TensorType(t.dtype, tuple(_bind_dim(d, bindings) for d in t.shape))


def _bind_attr(v: Any, bindings: Mapping[str, int]) -> Any:
    if isinstance(v, str) and v and v != "?":
        try:
            return eval_dim(v, bindings)
        except (PlanError, ValueError):
            return v
    if isinstance(v, tuple) and any(isinstance(x, str) for x in v):
        new = tuple(_bind_attr(x, bindings) for x in v)
        return new if all(isinstance(x, int) for x in new) else v
    return v


def _symbols(graph: Graph) -> list[tuple[str, str]]:
    """(symbol, input name) for every symbolic dim of the graph's inputs."""
    out = []
    for v in graph.inputs:
        for d in v.type.shape or ():
            if isinstance(d, str) and d != KV_DIM and (d, v.name) not in out:
                out.append((d, v.name))
    return out


def specialize(graph: Graph, limits: Mapping[str, int]) -> dict[str, int]:
    """Bind the inputs' symbolic dims from ``limits`` and make every shape static (module docstring)."""
    from ...ir.verify import verify
    from ...passes import PassContext, run_passes

    syms = _symbols(graph)
    unknown = [(s, n) for s, n in syms if not s.isidentifier() or s not in limits]
    if unknown:
        what = ", ".join(f"{s!r} (input {n!r})" for s, n in unknown)
        raise SpecializeError(
            f"dim(s) {what} unbound: kernels generated through TVM are built for static shapes; give each "
            "symbol's value at compile time, e.g. ingot.compile(..., pass_context=ctx) with "
            f"ctx.options['cuda'] = {{{', '.join(repr(s) + ': N' for s, _ in unknown)}}}")
    bindings = {s: int(limits[s]) for s, _ in syms}
    for v in graph.inputs:
        v.type = _bind_type(v.type, bindings)
    for node in graph.nodes:
        changes = {}
        for f in dataclasses.fields(node.op):
            old = getattr(node.op, f.name)
            new = _bind_attr(old, bindings)
            if new is not old and new != old:
                changes[f.name] = new
        if changes:
            node.op = dataclasses.replace(node.op, **changes)
        types = node.op.infer([v.type if v is not None else None for v in node.inputs])
        for out, t in zip(node.outputs, types):
            out.type = _bind_type(t, bindings)
    run_passes(graph, ["canonicalize"], PassContext())
    verify(graph)
    left = [v for v in graph.values() if not _is_static(v.type)]
    if left:
        names = ", ".join(f"%{v.name}: {v.type}" for v in left[:8])
        raise SpecializeError(f"{len(left)} value(s) keep a non-static shape after binding {bindings}: {names}")
    return bindings


def constants_to_weights(graph: Graph) -> int:
    """``constant`` nodes become weights (same values, same names); returns how many."""
    kept = []
    n = 0
    for node in graph.nodes:
        if node.op.name == "constant" and len(node.outputs) == 1:
            out = node.outputs[0]
            import numpy as np

            arr = np.ascontiguousarray(np.asarray(node.op.value))
            graph.weights[out.name] = Weight.from_array(arr, "constant")
            graph.weight_values[out.name] = out
            out.producer = None
            n += 1
            continue
        kept.append(node)
    graph.nodes = kept
    return n


def prepare_graph(graph: Graph, target: Target, limits: Mapping[str, int]) -> dict[str, Any]:
    """Make a graph-mode graph ready for generated kernels when it needs them (module docstring).
    Returns a report: the ops that need the fallback, the bindings, the constants turned into weights."""
    need = needs_fallback(graph, target)
    if not need:
        return {}
    report: dict[str, Any] = {"fallback_ops": sorted(set(need))}
    if any(not _is_static(v.type) for v in graph.values()):
        report["bindings"] = specialize(graph, limits)
    report["constants_to_weights"] = constants_to_weights(graph)
    return report
