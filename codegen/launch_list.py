"""The lowering's launch list and what the passes over it share.

``lower.plan_launches`` gives one ``Launch`` per kernel launch, in order: ``(node index, node, spec or None,
arguments)``. A node may have several launches (rope-cache fusion's rope + cache write, quant-prefill's dequantize +
GEMM), and the passes that pair launches (``decode_fusion``, ``qkv_rope_fusion``, ``rope_cache_fusion``,
``quant_prefill``, ``lower.gemv_variant_plans``) each ask which launches a node has: ``by_node``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..ir.graph import Node, Value
from ..ir.types import Dim, shape_numel
from .kernel import KernelSpec

Launch = tuple[int, Node, KernelSpec | None, dict[str, Any]]


def by_node(launches: Sequence[Launch]) -> dict[int, list[int]]:
    """Node index -> the indices of its launches in ``launches``, in launch order."""
    out: dict[int, list[int]] = {}
    for j, (i, _, _, _) in enumerate(launches):
        out.setdefault(i, []).append(j)
    return out


def token_rows(x: Value) -> Dim:
    """The rows of an activation ``x`` [..., K]: the product of its leading dims (a bound's name such as ``T``, or a
    static count), 1 for a vector; a linear's ``M``, the size of its per-row temporaries."""
    shape = x.type.shape or ()
    return shape_numel(shape[:-1]) if len(shape) > 1 else 1
