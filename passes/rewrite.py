"""Pattern rewriting: patterns with named captures, predicates, and replacements as ordinary code.

::

    # silu(x) * y  ->  swiglu-style fused op
    rule = Rule(
        "silu-mul",
        P("mul", P("silu", Var("g"), name="act"), Var("u"), commutative=True),
        replace=lambda m, b: b.add(SiluMul(), [m["g"], m["u"]]),
        where=lambda m: m["g"].type.shape == m["u"].type.shape,
    )
    hits = rewrite(graph, [rule])

- ``P(op, *inputs, name=, attrs=, commutative=, one_use=, out=)`` matches a node whose op name is
  ``op`` (or one of a tuple of names) and whose inputs match ``inputs`` (exactly that many, unless
  ``partial=True``); ``attrs`` are required attribute values; ``name`` captures the node
  (``m.node("act")``); ``one_use`` requires the node's output to have no other user (so fusing it
  does not duplicate work); ``out`` is the output index the parent consumes.
- ``Var(name)`` matches any value and captures it (``m["g"]``); the same name twice must be the
  same value. ``Var(name, where=fn)`` adds a predicate on the value. ``_`` matches anything.
- ``Const(name)`` matches a compile-time constant (a ``constant`` node or a small weight) and
  captures its array (``m.const("c")``).
- ``replace(m, b)`` builds the replacement with ``b.add(op, inputs)`` and returns the value (or
  list of values, one per output of the matched root) that replaces the root's outputs, or
  ``None`` to decline. The driver checks every replacement's type against what it replaces.

The driver (``rewrite``) applies rules, indexed by root op, until nothing matches (a fixed point),
then removes dead nodes. It is the only code that edits the graph during a rewrite.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.op import Op
from ..ir.types import shapes_compatible


class RewriteError(RuntimeError):
    pass


class Pattern:
    pass


@dataclasses.dataclass
class Var(Pattern):
    name: str
    where: Callable[[Value], bool] | None = None


@dataclasses.dataclass
class Const(Pattern):
    name: str
    where: Callable[[np.ndarray], bool] | None = None


_ = Var("_")


@dataclasses.dataclass(init=False)
class P(Pattern):
    op: tuple[str, ...]
    inputs: tuple[Pattern, ...]
    name: str | None
    attrs: dict[str, Any]
    commutative: bool
    one_use: bool
    out: int
    partial: bool

    def __init__(
        self,
        op: str | Sequence[str],
        *inputs: Pattern,
        name: str | None = None,
        attrs: dict[str, Any] | None = None,
        commutative: bool = False,
        one_use: bool = False,
        out: int = 0,
        partial: bool = False,
    ) -> None:
        self.op = (op,) if isinstance(op, str) else tuple(op)
        self.inputs = inputs
        self.name = name
        self.attrs = attrs or {}
        self.commutative = commutative
        self.one_use = one_use
        self.out = out
        self.partial = partial


class Match:
    """What a pattern captured: values (``m["x"]``), nodes (``m.node("n")``), constants."""

    def __init__(self, root: Node) -> None:
        self.root = root
        self.values: dict[str, Value] = {}
        self.nodes: dict[str, Node] = {}
        self.consts: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> Value:
        return self.values[name]

    def node(self, name: str) -> Node:
        return self.nodes[name]

    def op(self, name: str) -> Any:
        return self.nodes[name].op

    def const(self, name: str) -> np.ndarray:
        return self.consts[name]

    def copy(self) -> Match:
        m = Match(self.root)
        m.values, m.nodes, m.consts = dict(self.values), dict(self.nodes), dict(self.consts)
        return m


def const_value(v: Value, graph: Graph, limit: int = 1 << 16) -> np.ndarray | None:
    """The array behind ``v`` if it is a compile-time constant of at most ``limit`` elements."""
    if v.producer is not None:
        if v.producer.op.name == "constant":
            return v.producer.op.value  # type: ignore[attr-defined]
        return None
    if graph.weight_values.get(v.name) is v:
        n = v.type.numel()
        if n is not None and n <= limit:
            return graph.weights[v.name].load()
    return None


@dataclasses.dataclass
class Rule:
    name: str
    pattern: P
    replace: Callable[[Match, Builder], Value | Sequence[Value] | None]
    where: Callable[[Match], bool] | None = None


class Builder:
    """Adds the replacement's nodes; they are inserted just before the matched root."""

    def __init__(self, graph: Graph, source: str) -> None:
        self.graph = graph
        self.source = source
        self.nodes: list[Node] = []

    def add(self, op: Op, inputs: Sequence[Value | None]) -> Value:
        return self.add_multi(op, inputs)[0]

    def add_multi(self, op: Op, inputs: Sequence[Value | None]) -> list[Value]:
        outs = self.graph.add(op, inputs, source=self.source)
        node = self.graph.nodes.pop()  # the driver places it
        self.nodes.append(node)
        return outs

    def const(self, array: np.ndarray | float | int, like: Value | None = None) -> Value:
        from ..ir.ops.core import Constant

        arr = np.asarray(array, dtype=like.type.dtype.np if like is not None else None)
        return self.add(Constant(value=arr), [])


class _Matcher:
    def __init__(self, graph: Graph, users: dict[Value, list[Node]]) -> None:
        self.graph = graph
        self.users = users
        self.outputs = set(graph.outputs)

    def match(self, pat: P, node: Node) -> Match | None:
        m = Match(node)
        return m if self._node(pat, node, m) else None

    def _node(self, pat: P, node: Node, m: Match) -> bool:
        if node.op.name not in pat.op:
            return False
        for k, v in pat.attrs.items():
            if getattr(node.op, k, None) != v:
                return False
        if pat.name is not None:
            if pat.name in m.nodes and m.nodes[pat.name] is not node:
                return False
            m.nodes[pat.name] = node
        ins = node.inputs
        if pat.partial:
            if len(ins) < len(pat.inputs):
                return False
            ins = ins[: len(pat.inputs)]
        elif len(ins) != len(pat.inputs):
            return False
        orders = [list(ins)]
        if pat.commutative and len(ins) == 2:
            orders.append([ins[1], ins[0]])
        for order in orders:
            trial = m.copy()
            if all(self._value(p, v, trial) for p, v in zip(pat.inputs, order)):
                m.values, m.nodes, m.consts = trial.values, trial.nodes, trial.consts
                return True
        return False

    def _value(self, pat: Pattern, v: Value | None, m: Match) -> bool:
        if isinstance(pat, Var):
            if pat.name == "_":
                return True
            if v is None or (pat.where is not None and not pat.where(v)):
                return False
            if pat.name in m.values:
                return m.values[pat.name] is v
            m.values[pat.name] = v
            return True
        if v is None:
            return False
        if isinstance(pat, Const):
            arr = const_value(v, self.graph)
            if arr is None or (pat.where is not None and not pat.where(arr)):
                return False
            m.consts[pat.name] = arr
            m.values[pat.name] = v
            return True
        assert isinstance(pat, P)
        if v.producer is None or v.index != pat.out:
            return False
        if pat.one_use and (len(self.users.get(v, ())) != 1 or v in self.outputs):
            return False
        return self._node(pat, v.producer, m)


def rewrite(graph: Graph, rules: Sequence[Rule], max_sweeps: int = 100) -> dict[str, int]:
    """Apply ``rules`` to a fixed point; returns hits per rule name. Dead nodes are removed."""
    by_root: dict[str, list[Rule]] = {}
    for r in rules:
        for op in r.pattern.op:
            by_root.setdefault(op, []).append(r)
    hits: dict[str, int] = {}
    for _sweep in range(max_sweeps):
        users = graph.users()
        matcher = _Matcher(graph, users)
        before: dict[Node, list[Node]] = {}
        replaced: dict[Value, Value] = {}
        dead: set[Node] = set()
        for node in list(graph.nodes):
            if node in dead or any(v is not None and v in replaced for v in node.inputs):
                continue  # its inputs changed in this sweep; look again next sweep
            for rule in by_root.get(node.op.name, ()):
                m = matcher.match(rule.pattern, node)
                if m is None or any(n in dead for n in m.nodes.values()):
                    continue
                if rule.where is not None and not rule.where(m):
                    continue
                b = Builder(graph, node.source)
                out = rule.replace(m, b)
                if out is None:
                    continue
                outs = [out] if isinstance(out, Value) else list(out)
                if len(outs) != len(node.outputs):
                    raise RewriteError(f"rule {rule.name}: returned {len(outs)} values for {len(node.outputs)}")
                for old, new in zip(node.outputs, outs):
                    if old.type.dtype != new.type.dtype or not shapes_compatible(old.type.shape, new.type.shape):
                        raise RewriteError(
                            f"rule {rule.name}: replacement %{new.name}: {new.type} does not fit "
                            f"%{old.name}: {old.type} (at {node.op.name} {node.source!r})"
                        )
                    replaced[old] = new
                before.setdefault(node, []).extend(b.nodes)
                dead.add(node)
                hits[rule.name] = hits.get(rule.name, 0) + 1
                break
        if not replaced:
            break
        _apply(graph, before, replaced)
        graph.remove_unused()
    else:
        raise RewriteError(f"rewrite did not reach a fixed point in {max_sweeps} sweeps: {hits}")
    graph.remove_unused()
    return hits


def _apply(graph: Graph, before: dict[Node, list[Node]], replaced: dict[Value, Value]) -> None:
    def resolve(v: Value) -> Value:
        while v in replaced:
            v = replaced[v]
        return v

    nodes: list[Node] = []
    for n in graph.nodes:
        nodes.extend(before.get(n, ()))
        nodes.append(n)
    for n in nodes:
        n.inputs = [None if v is None else resolve(v) for v in n.inputs]
    graph.nodes = nodes
    graph.outputs = [resolve(v) for v in graph.outputs]
