"""l2-prefetch: during a decode step's attention, ask L2 for the weights of the GEMVs that come after it.

A batch-1 decode step of the Llama-3.2-1B shape spends about a fifth of each layer in launches that read almost
nothing from DRAM: rope + KV cache write (one block a token) and the split-KV attention over a short context
(docs/PERF.md, "Where a step's GPU time goes"). The GEMVs around them stream their weights from DRAM and are
bandwidth- or latency-bound; what they read during that idle stretch would come from L2 instead (H100/H200: 50 MB).

The pass gives each fused rope + cache-write launch (``rope/qkv_cache.cu``, from ``codegen/rope_cache_fusion.py``)
``PREFETCH_CTAS`` extra blocks (``cache_rule.with_prefetch``): after the launch's grid-dependency wait (the qkv GEMV
has finished) they issue ``cp.async.bulk.prefetch.L2`` for the leading bytes of the weights of the next linear
launches in the table (the layer's o and then gate_up projections), up to ``budget_bytes()`` in all, at most two
weights, and exit; the attention then runs while DRAM fills L2. Launches of more than
``cache_rule.PF_MAX_TOKENS`` tokens (prefill, large batches) prefetch nothing (the blocks exit at once). Values are
unchanged (a prefetch moves no data that any kernel reads differently), so the artifact's outputs are bit-identical
with and without it.

Off by default until measured end to end (docs/PERF.md, "L2 prefetch during attention"); ``INGOT_L2_PREFETCH=MB``
at compile time turns it on with that budget in MiB (``0``: off). The switch is recorded in the manifest
(``cuda.switches``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..ir.graph import Graph, Node
from .kernel import KernelSpec
from .kernels.rope.cache_rule import with_prefetch
from .target import Target

#: compile-time switch: the prefetch budget in MiB (unset: ``DEFAULT_MB``; 0: off)
ENV = "INGOT_L2_PREFETCH"
#: the budget when ``ENV`` is unset (0: off by default)
DEFAULT_MB = 0
#: prefetching blocks per launch: each thread issues one ``PF_CHUNK`` piece per round, so 32 blocks of the 1B
#: shape's 224 threads cover 28 MiB in one round
PREFETCH_CTAS = 32
#: at most this many weights per launch (the kernel's two regions)
MAX_REGIONS = 2

#: the ops whose ``weight`` argument a decode GEMV streams
LINEAR_OPS = ("linear", "quantized_linear")

Launch = tuple[int, Node, KernelSpec | None, dict[str, Any]]


def budget_bytes() -> int:
    """Bytes of weights each decode launch of rope + cache write asks L2 for (``INGOT_L2_PREFETCH`` MiB); 0: off.
    A value that is not a non-negative number is an error naming the variable."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_MB << 20
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: expected MiB of weights to prefetch (a number, 0 for off)") from None
    if mb < 0 or mb != mb:
        raise ValueError(f"{ENV}={raw!r}: expected MiB of weights to prefetch (a number, 0 for off)")
    return int(mb * (1 << 20)) // 16 * 16


def _is_fused_rope(spec: KernelSpec | None) -> bool:
    return spec is not None and spec.family == "rope" and spec.template == "qkv_cache.cu"


def regions(graph: Graph, launches: Sequence[Launch], j: int, budget: int) -> list[tuple[str, int]]:
    """The weights launch ``j``'s blocks prefetch: (buffer, leading bytes) of the next linear launches' weights in
    table order, until ``budget`` bytes, ``MAX_REGIONS`` weights or the next fused rope launch (the next layer)."""
    out: list[tuple[str, int]] = []
    left = budget
    for _, node, spec, args in launches[j + 1:]:
        if _is_fused_rope(spec) or left < 16 or len(out) == MAX_REGIONS:
            break
        if spec is None or node.op.name not in LINEAR_OPS:
            continue
        name = args.get("weight", {}).get("buffer")
        w = graph.weights.get(name) if name is not None else None
        if w is None:
            continue
        nbytes = (w.type.numel() or 0) * w.type.dtype.itemsize_bits // 8
        take = min(nbytes, left) // 16 * 16
        if take:
            out.append((name, take))
            left -= take
    return out


def apply(graph: Graph, launches: Sequence[Launch], target: Target, budget: int | None = None) -> list[Launch]:
    """``launches`` with the prefetching form of each fused rope launch that has weights to prefetch (``budget``:
    ``budget_bytes()`` when None); the same launches when the budget is 0."""
    budget = budget_bytes() if budget is None else budget
    out = list(launches)
    if budget <= 0:
        return out
    for j, (i, node, spec, args) in enumerate(launches):
        if not _is_fused_rope(spec):
            continue
        assert spec is not None
        found = regions(graph, launches, j, budget)
        if not found:
            continue
        found += [("", 0)] * (MAX_REGIONS - len(found))
        pf_args = {}
        for r, (name, nbytes) in enumerate(found):
            pf_args[f"pf{r}"] = {"buffer": name} if name else {"null": True}
            pf_args[f"pf{r}_bytes"] = {"value": nbytes}
        out[j] = (i, node, with_prefetch(spec, PREFETCH_CTAS, target), {**args, **pf_args})
    return out
