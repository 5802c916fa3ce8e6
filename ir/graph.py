"""The graph: values, nodes and weights.

A ``Value`` is produced by exactly one ``Node`` (at an output index), or is a graph input, or a
weight. Nodes are kept in a topological order; ``Graph.add`` appends, so building a graph front to
back keeps it valid. Weights are lazy references (``Weight``): the graph never copies their bytes.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .op import Op, OpError
from .types import TensorType


class Weight:
    """A lazily loaded constant tensor.

    ``loader`` produces the array on first use; ``source`` says where it lives (for error messages
    and for the artifact writer, which may copy the bytes without materializing them twice).
    """

    def __init__(self, type: TensorType, loader: Callable[[], np.ndarray], source: str = "") -> None:
        self.type = type
        self._loader = loader
        self._array: np.ndarray | None = None
        self.source = source

    @staticmethod
    def from_array(array: np.ndarray, source: str = "memory") -> Weight:
        array = np.asarray(array)
        w = Weight(TensorType.of(array), lambda: array, source)
        w._array = array
        return w

    def load(self) -> np.ndarray:
        if self._array is None:
            arr = np.asarray(self._loader())
            if TensorType.of(arr).shape != self.type.shape or arr.dtype != self.type.dtype.np:
                raise ValueError(
                    f"weight from {self.source} has {TensorType.of(arr)}, expected {self.type}"
                )
            self._array = arr
        return self._array

    def release(self) -> None:
        """Drop a cached array that can be loaded again."""
        if self.source != "memory":
            self._array = None


@dataclasses.dataclass(eq=False)
class Value:
    name: str
    type: TensorType
    producer: Node | None = None
    index: int = 0

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclasses.dataclass(eq=False)
class Node:
    op: Op
    inputs: list[Value | None]
    outputs: list[Value]
    #: Where the node came from (the ONNX node name), for error messages.
    source: str = ""

    def __repr__(self) -> str:
        return f"Node({self.op.name}, {self.source or '-'})"


class Graph:
    def __init__(self, name: str = "main") -> None:
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        #: The outputs' external names (ONNX output names); a value's own name may differ.
        self.output_names: list[str] = []
        self.nodes: list[Node] = []
        self.weights: dict[str, Weight] = {}
        self.weight_values: dict[str, Value] = {}
        #: Free-form metadata carried into the artifact (source format, opset, producer, ...).
        self.meta: dict[str, object] = {}
        self._names: set[str] = set()
        self._counter = itertools.count()

    # -- names -----------------------------------------------------------------------------------
    def fresh_name(self, hint: str = "") -> str:
        if hint and hint not in self._names:
            self._names.add(hint)
            return hint
        while True:
            name = f"{hint}.{next(self._counter)}" if hint else str(next(self._counter))
            if name not in self._names:
                self._names.add(name)
                return name

    # -- building --------------------------------------------------------------------------------
    def add_input(self, name: str, type: TensorType) -> Value:
        v = Value(self.fresh_name(name), type)
        self.inputs.append(v)
        return v

    def add_weight(self, name: str, weight: Weight) -> Value:
        v = Value(self.fresh_name(name), weight.type)
        self.weights[v.name] = weight
        self.weight_values[v.name] = v
        return v

    def add(
        self,
        op: Op,
        inputs: Sequence[Value | None],
        names: Sequence[str] | None = None,
        source: str = "",
    ) -> list[Value]:
        """Append a node; infer its output types. Returns its output values."""
        try:
            types = op.infer([v.type if v is not None else None for v in inputs])
        except (OpError, ValueError, TypeError, IndexError) as e:
            where = f" (node {source!r})" if source else ""
            raise OpError(f"{op.name}{where}: {e}") from e
        node = Node(op, list(inputs), [], source)
        for i, t in enumerate(types):
            hint = names[i] if names is not None and i < len(names) and names[i] else ""
            node.outputs.append(Value(self.fresh_name(hint), t, node, i))
        self.nodes.append(node)
        return node.outputs

    def add_output(self, value: Value, name: str | None = None) -> None:
        self.outputs.append(value)
        self.output_names.append(name or value.name)

    def add1(self, op: Op, inputs: Sequence[Value | None], name: str = "", source: str = "") -> Value:
        return self.add(op, inputs, [name] if name else None, source)[0]

    # -- queries ---------------------------------------------------------------------------------
    def values(self) -> Iterator[Value]:
        yield from self.inputs
        yield from self.weight_values.values()
        for n in self.nodes:
            yield from n.outputs

    def users(self) -> dict[Value, list[Node]]:
        out: dict[Value, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None:
                    out.setdefault(v, []).append(n)
        return out

    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for n in self.nodes:
            hist[n.op.name] = hist.get(n.op.name, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))

    def num_parameters(self) -> int:
        total = 0
        for w in self.weights.values():
            n = w.type.numel()
            total += n or 0
        return total

    def replace_uses(self, replaced: Mapping[Value, Value]) -> None:
        """Every use of a key of ``replaced`` (node inputs, graph outputs) becomes its value."""
        for n in self.nodes:
            n.inputs = [replaced.get(v, v) if v is not None else None for v in n.inputs]
        self.outputs = [replaced.get(v, v) for v in self.outputs]

    def remove_unused(self) -> int:
        """Drop nodes and weights whose outputs nothing uses. Returns how many nodes went."""
        live: set[Value] = set(self.outputs)
        kept: list[Node] = []
        for n in reversed(self.nodes):
            if n.op.has_side_effects or any(o in live for o in n.outputs):
                kept.append(n)
                live.update(v for v in n.inputs if v is not None)
        removed = len(self.nodes) - len(kept)
        self.nodes = kept[::-1]
        for name in [k for k, v in self.weight_values.items() if v not in live]:
            del self.weight_values[name]
            del self.weights[name]
        return removed

    def __str__(self) -> str:
        from .text import print_graph

        return print_graph(self)


def topo_sort(nodes: Iterable[Node], available: Iterable[Value]) -> list[Node]:
    """Order nodes so every input is defined before use; raises if that is impossible."""
    defined = set(available)
    pending = list(nodes)
    out: list[Node] = []
    while pending:
        rest = []
        for n in pending:
            if all(v is None or v in defined for v in n.inputs):
                out.append(n)
                defined.update(n.outputs)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            names = ", ".join(repr(n) for n in rest[:5])
            raise OpError(f"graph has a cycle or undefined inputs at {names}")
        pending = rest
    return out


def weights_nbytes(weights: dict[str, Weight]) -> int:
    total = 0
    for w in weights.values():
        n = w.type.numel() or 0
        total += n * w.type.dtype.itemsize_bits // 8
    return total
