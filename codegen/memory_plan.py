"""The memory plan of a GPU artifact: one arena, laid out at compile time.

::

    arena = | weights | io: graph inputs and outputs | scratch: intermediates | kv cache |
              fixed     fixed offsets, sized for       offsets shared by       sized at load
                        the maximum step               values whose lives      (num_blocks)
                                                       do not overlap

Symbolic dims are bound to their maxima (``T`` <= ``max_num_batched_tokens``, ``S`` <= ``max_num_seqs``,
``max_blocks`` <= ``ceil(max_model_len / block_size)``; graph mode: the bounds given, 1 by default),
so every buffer has a fixed offset and a CUDA graph captured once stays valid for every step.
Scratch offsets come from a liveness analysis over the node order: a value lives from the node that
produces it to its last reader, and values whose lives do not overlap share bytes (greedy, largest
first, lowest offset that fits); a kernel may also read a value the graph does not give it (a fused decode GEMV
reading the input of a launch it replaces, ``codegen/decode_fusion.py``: ``reads``), and then the value lives
until that node. A node's launches may also share a buffer that is no graph value, a *temporary* (the bf16 weight
a quantized linear's prefill GEMM reads, ``codegen/quant_prefill.py``: ``temporaries``): it lives during that node
only, so the temporaries of different nodes share bytes. A weight that a kernel addresses as whole rows from the
weights region's base (the skinny GEMM's tensor map, ``codegen/kernels/gemv/skinny_rule.py``: ``weight_align``) starts
at a multiple of its row pitch (and of ``ALIGN``). KV caches (inputs whose first dim is ``num_blocks``) get
no bytes here: the runtime sizes that region from the device's free memory and places layer ``i`` at
``kv_base + i * layer_bytes``.

Dims are evaluated by ``eval_dim``, a small parser for the IR's dim expressions (integers, names,
``+``, ``-``, ``*``, parentheses): nothing is ever passed to ``eval``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..ir.graph import Graph, Value
from ..ir.types import Dim, TensorType

ALIGN = 256
#: graph inputs whose leading dim is this symbol live in the runtime-sized KV region
KV_DIM = "num_blocks"


class PlanError(ValueError):
    """A buffer cannot be sized (an unknown dim, a symbol without a bound)."""


_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_.]*)|(.))")


def eval_dim(dim: Dim, bindings: Mapping[str, int]) -> int:
    """The value of a dim (an int, a symbol, or an expression like ``(S+1)``) under ``bindings``."""
    if isinstance(dim, int):
        return dim
    tokens: list[tuple[str, str]] = []
    for num, name, op in _TOKEN.findall(str(dim)):
        if num:
            tokens.append(("n", num))
        elif name:
            tokens.append(("s", name))
        elif op.strip():
            tokens.append(("o", op))
    pos = 0

    def peek() -> tuple[str, str] | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> tuple[str, str]:
        nonlocal pos
        if pos >= len(tokens):
            raise PlanError(f"dim {dim!r}: unexpected end")
        pos += 1
        return tokens[pos - 1]

    def atom() -> int:
        kind, text = take()
        if kind == "n":
            return int(text)
        if kind == "s":
            if text not in bindings:
                raise PlanError(f"dim {dim!r}: symbol {text!r} has no bound (known: {sorted(bindings)})")
            return int(bindings[text])
        if text == "(":
            v = expr()
            if take() != ("o", ")"):
                raise PlanError(f"dim {dim!r}: missing ')'")
            return v
        if text == "-":
            return -atom()
        raise PlanError(f"dim {dim!r}: unexpected {text!r}")

    def term() -> int:
        v = atom()
        while peek() == ("o", "*"):
            take()
            v *= atom()
        return v

    def expr() -> int:
        v = term()
        while peek() in (("o", "+"), ("o", "-")):
            _, o = take()
            v = v + term() if o == "+" else v - term()
        return v

    value = expr()
    if pos != len(tokens):
        raise PlanError(f"dim {dim!r}: trailing {tokens[pos][1]!r}")
    return value


def _align(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


def value_nbytes(v: Value, bindings: Mapping[str, int]) -> int:
    if v.type.shape is None:
        raise PlanError(f"%{v.name}: unknown rank; every buffer needs a shape")
    n = 1
    for d in v.type.shape:
        n *= eval_dim(d, bindings)
    return n * v.type.dtype.np.itemsize


@dataclass
class Buffer:
    name: str
    region: str  # weights | io | scratch | kv
    offset: int  # within its region
    nbytes: int  # at the bound dims (kv: per block)
    dtype: str
    shape: list[Any]

    def to_dict(self) -> dict[str, Any]:
        return {"region": self.region, "offset": self.offset, "nbytes": self.nbytes, "dtype": self.dtype,
                "shape": self.shape}


@dataclass
class MemoryPlan:
    bindings: dict[str, int]
    buffers: dict[str, Buffer] = field(default_factory=dict)
    region_sizes: dict[str, int] = field(default_factory=dict)
    #: KV cache input names in layer order, and each one's bytes per block
    kv_inputs: list[str] = field(default_factory=list)
    kv_block_bytes: int = 0
    #: scratch bytes without reuse, for the report
    scratch_unshared: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "alignment": ALIGN,
            "bindings": dict(self.bindings),
            "regions": dict(self.region_sizes),
            "scratch_without_reuse": self.scratch_unshared,
            "kv_cache": {"inputs": list(self.kv_inputs), "bytes_per_block": self.kv_block_bytes},
            "buffers": {n: b.to_dict() for n, b in self.buffers.items()},
        }


def plan_memory(graph: Graph, bindings: Mapping[str, int], reads: Mapping[str, int] | None = None,
                temporaries: Mapping[str, tuple[int, TensorType]] | None = None,
                weight_align: Mapping[str, int] | None = None) -> MemoryPlan:
    """Offsets for every value of ``graph`` (see the module docstring); ``reads``: value name -> index of a node
    whose kernel also reads it, or writes it before its own node does (a fused decode variant: the value's interval
    is widened to that node either way); ``temporaries``: scratch buffer name -> (the node whose launches use it,
    its type); ``weight_align``: weight name -> a byte pitch its offset in the weights region must be a multiple
    of."""
    plan = MemoryPlan(dict(bindings))
    align = weight_align or {}
    off = 0
    for name, w in graph.weights.items():
        n = value_nbytes(graph.weight_values[name], {})
        pitch = int(align.get(name, 0))
        if pitch > 0:
            off = _align(off, math.lcm(ALIGN, pitch))
        plan.buffers[name] = Buffer(name, "weights", off, n, w.type.dtype.value, list(w.type.shape or ()))
        off += _align(n)
    plan.region_sizes["weights"] = off

    off = 0
    kv_bytes = None
    for v in graph.inputs:
        shape = list(v.type.shape or ())
        if shape and shape[0] == KV_DIM:
            per_block = value_nbytes(v, {**bindings, KV_DIM: 1})
            if kv_bytes not in (None, per_block):
                raise PlanError("KV cache inputs differ in size; the runtime lays them out uniformly")
            kv_bytes = per_block
            plan.kv_inputs.append(v.name)
            plan.buffers[v.name] = Buffer(v.name, "kv", len(plan.kv_inputs) - 1, per_block, v.type.dtype.value, shape)
            continue
        n = value_nbytes(v, bindings)
        plan.buffers[v.name] = Buffer(v.name, "io", off, n, v.type.dtype.value, shape)
        off += _align(n)
    plan.kv_block_bytes = kv_bytes or 0
    outputs = [v for v in graph.outputs if v.name not in plan.buffers]
    for v in outputs:
        n = value_nbytes(v, bindings)
        plan.buffers[v.name] = Buffer(v.name, "io", off, n, v.type.dtype.value, list(v.type.shape or ()))
        off += _align(n)
    plan.region_sizes["io"] = off

    # liveness of intermediates: [defining node, last reading node]
    start: dict[Value, int] = {}
    end: dict[Value, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            if v is not None and v in start:
                end[v] = i
        for v in node.outputs:
            if v.name not in plan.buffers:
                start[v] = i
                end.setdefault(v, i)
    for v in start:  # a node whose kernel reads (or writes, before the value's own node) it
        if reads and v.name in reads:
            end[v] = max(end[v], reads[v.name])
            start[v] = min(start[v], reads[v.name])
    taken = {v.name for v in start} | set(plan.buffers)
    for name, (node_index, t) in (temporaries or {}).items():
        if name in taken:
            raise PlanError(f"temporary {name!r} has the name of a value")
        tmp = Value(name, t)
        start[tmp] = end[tmp] = node_index
    items = sorted(start, key=lambda v: (-value_nbytes(v, bindings), start[v]))
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, start, end)
    top = 0
    for v in items:
        size = _align(max(value_nbytes(v, bindings), 1))
        plan.scratch_unshared += size
        s, e = start[v], end[v]
        clashes = sorted((o, o + n) for o, n, s2, e2 in placed if not (e2 < s or e < s2))
        offset = 0
        for lo, hi in clashes:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((offset, size, s, e))
        top = max(top, offset + size)
        plan.buffers[v.name] = Buffer(v.name, "scratch", offset, size, v.type.dtype.value,
                                      list(v.type.shape or ()))
    plan.region_sizes["scratch"] = top
    return plan
