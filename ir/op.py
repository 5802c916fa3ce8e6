"""Op definitions: one frozen dataclass per op, registered by its snake_case name.

Each op is defined exactly once, with
- typed attributes (the dataclass fields; allowed field types: ``int``, ``float``, ``bool``,
  ``str``, ``DType``, ``tuple[...]`` of those, ``np.ndarray`` for constants, or ``X | None``),
- ``infer``: the output types from the input types (``None`` for an omitted optional input),
- ``ref``: the numpy reference implementation, which the CPU backend runs and every kernel and pass
  is tested against.

Example::

    @register
    @dataclass(frozen=True, eq=False)
    class LeakyRelu(Op):
        name: ClassVar[str] = "leaky_relu"
        alpha: float = 0.01

        def infer(self, inputs):
            return [same_as(inputs[0])]

        def ref(self, x):
            return np.where(x >= 0, x, x * self.alpha).astype(x.dtype)

``infer`` raises ``OpError`` (or ``ValueError``/``TypeError``) for inputs the op does not accept;
the caller adds the node's name to the message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from .types import DType, TensorType


class OpError(ValueError):
    """An op was given inputs or attributes it does not accept."""


@dataclasses.dataclass(frozen=True, eq=False)
class Op:
    name: ClassVar[str] = ""
    #: Minimum and maximum number of inputs (None: no maximum).
    num_inputs: ClassVar[tuple[int, int | None]] = (0, None)
    #: Ops that write into an input (paged_attention writes the KV cache) are never removed or merged.
    has_side_effects: ClassVar[bool] = False
    #: Inputs that become attributes when constant (input index -> attribute name).
    const_inputs: ClassVar[dict[int, str]] = {}

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        raise NotImplementedError(f"{self.name}: no type inference")

    def ref(self, *inputs: np.ndarray | None) -> np.ndarray | Sequence[np.ndarray]:
        raise NotImplementedError(f"{self.name}: no reference implementation")

    # -- helpers shared by every op --------------------------------------------------------------
    def attrs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def key(self) -> tuple:
        """A hashable identity of the op and its attributes (for CSE and caches)."""
        items = []
        for k, v in self.attrs().items():
            if isinstance(v, np.ndarray):
                v = (v.dtype.str, v.shape, v.tobytes())
            items.append((k, v))
        return (self.name, tuple(items))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Op) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def run(self, *inputs: np.ndarray | None) -> list[np.ndarray]:
        out = self.ref(*inputs)
        if isinstance(out, np.ndarray | np.generic):
            return [np.asarray(out)]
        return [np.asarray(o) for o in out]


OPS: dict[str, type[Op]] = {}


def register(cls: type[Op]) -> type[Op]:
    if not cls.name:
        raise TypeError(f"{cls.__name__} has no op name")
    if cls.name in OPS and OPS[cls.name] is not cls:
        raise TypeError(f"op {cls.name!r} is defined twice ({OPS[cls.name].__name__}, {cls.__name__})")
    OPS[cls.name] = cls
    return cls


def get_op(name: str) -> type[Op]:
    try:
        return OPS[name]
    except KeyError:
        raise OpError(f"unknown op {name!r}") from None


# -- small helpers for infer() -------------------------------------------------------------------


def same_as(t: TensorType | None) -> TensorType:
    if t is None:
        raise OpError("missing required input")
    return TensorType(t.dtype, t.shape)


def with_dtype(t: TensorType | None, dtype: DType) -> TensorType:
    if t is None:
        raise OpError("missing required input")
    return TensorType(dtype, t.shape)


def require(t: TensorType | None, what: str = "input") -> TensorType:
    if t is None:
        raise OpError(f"missing required {what}")
    return t


def fold_const_input(op: Op, index: int, array: np.ndarray) -> Op:
    """Return ``op`` with constant input ``index`` moved into the attribute it maps to.

    Ops list such inputs in ``const_inputs`` (input index -> attribute name): ONNX passes axes,
    shapes, pads, ... as tensors; ingot keeps them as attributes when they are known at compile
    time, so type inference stays exact, and as inputs otherwise.
    """
    from .text import _hints  # local: text imports this module

    attr = op.const_inputs[index]
    hint = _hints(type(op))[attr]
    value = _from_array(array, hint)
    return dataclasses.replace(op, **{attr: value})


def _from_array(array: np.ndarray, hint: Any) -> Any:
    import types as _types
    import typing

    if typing.get_origin(hint) in (typing.Union, _types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is tuple:
        (elem, *_) = typing.get_args(hint)
        conv = float if elem is float else int
        return tuple(conv(x) for x in np.asarray(array).reshape(-1).tolist())
    if hint is int:
        return int(np.asarray(array).reshape(-1)[0])
    if hint is float:
        return float(np.asarray(array).reshape(-1)[0])
    if hint is bool:
        return bool(np.asarray(array).reshape(-1)[0])
    if hint is np.ndarray:
        return np.asarray(array)
    raise TypeError(f"cannot fold a constant into an attribute of type {hint}")
