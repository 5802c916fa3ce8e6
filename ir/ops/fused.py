"""Ops that only fusion passes create: gated activations besides ``swiglu`` and fused elementwise
groups.

``geglu(a, b) = gelu(a) * b`` (``approximate`` as in ``gelu``). ``fused_elementwise`` carries its body
as a text-IR graph (``body``): its inputs are the op's inputs in order, its one output the result;
the reference parses the body once and runs it node by node with the ops' own references.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..types import DType, TensorType, dims_compatible
from .linalg import from_compute

_FLOATS = (DType.f32, DType.f16, DType.bf16, DType.f64)


@register
@dataclass(frozen=True, eq=False)
class GeGLU(Op):
    """``gelu(a) * b`` (gate ``a`` and value ``b`` of one shape); computes in float32 (f64 for f64)."""

    name: ClassVar[str] = "geglu"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 2)
    approximate: str = "none"

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        a, b = require(inputs[0], "a"), require(inputs[1], "b")
        if self.approximate not in ("none", "tanh"):
            raise OpError(f"geglu: unknown approximate={self.approximate!r} (none or tanh)")
        if a.dtype not in _FLOATS or b.dtype != a.dtype:
            raise OpError(f"geglu needs float inputs of one dtype, got {a}, {b}")
        if a.shape is not None and b.shape is not None:
            if len(a.shape) != len(b.shape) or not all(map(dims_compatible, a.shape, b.shape)):
                raise OpError(f"geglu inputs differ in shape: {a}, {b}")
        return [TensorType(a.dtype, a.shape)]

    def ref(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        from .elementwise import _erf64

        x = a.astype(np.float64)
        if self.approximate == "tanh":
            g = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        else:
            g = 0.5 * x * (1 + _erf64(x / math.sqrt(2)))
        ct = np.float64 if a.dtype == np.float64 else np.float32
        return from_compute(g.astype(ct) * b.astype(ct), a.dtype)


@functools.lru_cache(maxsize=256)
def _parse_body(body: str):  # -> Graph (local import: text imports the op registry)
    from ..text import parse_graph

    return parse_graph(body)


@register
@dataclass(frozen=True, eq=False)
class FusedElementwise(Op):
    """A group of elementwise ops run as one: ``body`` is a text-IR graph with one input per op
    input (same types) and one output. Output type: the body's output type."""

    name: ClassVar[str] = "fused_elementwise"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, None)
    body: str = ""

    def graph(self):  # noqa: ANN201 - ir.graph.Graph; not imported here (cycle)
        return _parse_body(self.body)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        g = self.graph()
        if len(inputs) != len(g.inputs) or len(g.outputs) != 1:
            raise OpError(f"fused_elementwise: body takes {len(g.inputs)} inputs and gives {len(g.outputs)} "
                          f"outputs; the node has {len(inputs)} inputs")
        for t, v in zip(inputs, g.inputs):
            t = require(t)
            if t.dtype != v.type.dtype or (t.shape is not None and v.type.shape is not None and (
                    len(t.shape) != len(v.type.shape) or not all(map(dims_compatible, t.shape, v.type.shape)))):
                raise OpError(f"fused_elementwise: input {t} does not fit the body's %{v.name}: {v.type}")
        return [g.outputs[0].type]

    def ref(self, *inputs: np.ndarray | None) -> np.ndarray:
        g = self.graph()
        env = {v: a for v, a in zip(g.inputs, inputs)}
        for n in g.nodes:
            outs = n.op.run(*(None if v is None else env[v] for v in n.inputs))
            env.update(zip(n.outputs, outs))
        return env[g.outputs[0]]


__all__ = ["GeGLU", "FusedElementwise"]
