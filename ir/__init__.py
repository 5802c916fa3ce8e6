"""ingot's IR: types, graph, ops (each with type inference and a numpy reference), text form."""

from . import ops  # noqa: F401  (registers every op)
from .graph import Graph, Node, Value, Weight
from .op import OPS, Op, OpError
from .types import DType, TensorType

__all__ = ["Graph", "Node", "Value", "Weight", "Op", "OpError", "OPS", "DType", "TensorType"]
