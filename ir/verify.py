"""The verifier: structural and type invariants every graph keeps between passes."""

from __future__ import annotations

from .graph import Graph, Value
from .op import OpError
from .types import DType, TensorType, shapes_compatible


class VerifyError(ValueError):
    pass


def _compatible(declared: TensorType, inferred: TensorType) -> bool:
    return declared.dtype == inferred.dtype and shapes_compatible(declared.shape, inferred.shape)


def verify(g: Graph) -> None:
    """Raise ``VerifyError`` listing every problem found in ``g``.

    Checks: value names are unique; every node input is a graph input, a weight or the output of an
    earlier node; each node's output types agree with its op's type inference (a declared type may
    be sharper than inference, e.g. a static dim where inference says ``?``, never different);
    graph outputs are defined values with names.
    """
    problems: list[str] = []
    defined: set[Value] = set()
    names: set[str] = set()

    def define(v: Value, where: str) -> None:
        if v.name in names:
            problems.append(f"{where}: value name %{v.name} is defined twice")
        names.add(v.name)
        defined.add(v)

    for v in g.inputs:
        define(v, "input")
    for name, v in g.weight_values.items():
        if name not in g.weights:
            problems.append(f"weight %{name} has no data reference")
        define(v, "weight")
    for i, n in enumerate(g.nodes):
        where = f"node {i} ({n.op.name}{', ' + n.source if n.source else ''})"
        for v in n.inputs:
            if v is not None and v not in defined:
                problems.append(f"{where}: input %{v.name} is used before it is defined")
        try:
            inferred = n.op.infer([v.type if v is not None else None for v in n.inputs])
        except (OpError, ValueError, TypeError, IndexError) as e:
            problems.append(f"{where}: type inference fails: {e}")
            inferred = None
        if inferred is not None:
            if len(inferred) != len(n.outputs):
                problems.append(f"{where}: {len(n.outputs)} outputs, op gives {len(inferred)}")
            for v, t in zip(n.outputs, inferred):
                if not _compatible(v.type, t):
                    problems.append(f"{where}: %{v.name} is declared {v.type}, inferred {t}")
        for j, v in enumerate(n.outputs):
            if v.producer is not n or v.index != j:
                problems.append(f"{where}: output %{v.name} does not point back to its node")
            define(v, where)
    if len(g.outputs) != len(g.output_names):
        problems.append("graph outputs and output names differ in length")
    for v in g.outputs:
        if v not in defined:
            problems.append(f"graph output %{v.name} is not defined")
    if problems:
        raise VerifyError(f"graph @{g.name} is invalid:\n  " + "\n  ".join(problems))


__all__ = ["verify", "VerifyError", "DType"]
