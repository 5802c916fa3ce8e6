"""Collective ops: communication between the ranks of a tensor-parallel group (docs/SCALE_OUT.md).

A tensor-parallel artifact holds one graph per rank (``passes/tp_shard.py``). Every rank runs its
graph in lockstep with the others; a collective is where they meet. Each rank's graph has the same
collectives in the same order with the same shapes, so the ranks pair up by position.

Semantics of ``all_reduce`` (sum): every rank passes its partial ``x`` (same dtype and shape on all
ranks) and receives ``sum over ranks r of x_r``, identical on every rank. With ``group_size == 1``
(one process, no group) it is the identity: that is its numpy reference. With ``group_size > 1`` the
reference cannot see the other ranks' values; the runtime that runs the ranks supplies them:
``AllReduce.reduce(parts)`` is the reference of the sum given every rank's input in rank order
(the CPU transports, ``runtime/tp/comm.py``, call it; it adds in rank order in f32 and rounds once,
so every rank gets bit-identical results), and on the GPU the same sum goes through NCCL
(``ncclAllReduce``, ``runtime/tp/nccl.py``).

The op has side effects (it communicates): passes never remove, merge or reorder it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..types import DType, TensorType
from .core import cast_array


@register
@dataclass(frozen=True, eq=False)
class AllReduce(Op):
    """Sum of ``x`` over the ``group_size`` ranks of a tensor-parallel group; same type as ``x``."""

    name: ClassVar[str] = "all_reduce"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 1)
    has_side_effects: ClassVar[bool] = True
    group_size: int = 1

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "x")
        if self.group_size < 1:
            raise OpError(f"all_reduce group_size must be >= 1, got {self.group_size}")
        if not x.dtype.is_float:
            raise OpError(f"all_reduce sums floating-point tensors, got {x}")
        return [TensorType(x.dtype, x.shape)]

    def ref(self, x: np.ndarray) -> np.ndarray:
        if self.group_size == 1:
            return x
        raise OpError(
            f"all_reduce over {self.group_size} ranks needs the other ranks' values: run a tensor-parallel "
            "artifact through ingot.load / ingot.LLM (runtime/tp), which runs every rank and connects them")

    def reduce(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        """The result every rank receives, from all ranks' inputs in rank order (the CPU transports' sum)."""
        if len(parts) != self.group_size:
            raise OpError(f"all_reduce over {self.group_size} ranks got {len(parts)} parts")
        dtype = parts[0].dtype
        wide = np.float64 if dtype == np.float64 else np.float32
        total = parts[0].astype(wide, copy=True)
        for p in parts[1:]:
            if p.shape != parts[0].shape or p.dtype != dtype:
                raise OpError(f"all_reduce parts disagree: {parts[0].dtype}{list(parts[0].shape)} vs "
                              f"{p.dtype}{list(p.shape)}")
            total += p.astype(wide, copy=False)
        if dtype in (np.float32, np.float64):
            return total.astype(dtype, copy=False)
        return cast_array(total.astype(np.float32), DType.from_np(dtype))
