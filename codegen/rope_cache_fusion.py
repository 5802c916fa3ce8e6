"""rope-cache-fusion: ``rope_qkv`` writes the rotated k and the v straight into the paged KV cache, and the paged
attention that reads them drops its cache-write launch.

Per layer the serving form runs ``rope_qkv`` (``codegen/kernels/rope/qkv.cu``: rotated q, rotated k and a copy of v,
three buffers) and then the attention's two launches: the cache write (``attention/cache_write.cu``, or
``cache_write_fp8.cu`` with the static ``kv_scale``) copying k and v into the cache at ``slot_mapping``, and the
attention kernel reading q and the cache. The cache write is a latency-bound launch of its own (about 4 us at batch 1
on the H200, docs/PERF.md), and k and v make a round trip through memory only to be copied. The fused kernel
(``codegen/kernels/rope/qkv_cache.cu``, spec ``kernels/rope/cache_rule.py``) reads the qkv row once, writes the
rotated q to q's buffer and the rotated k and v into the cache, rounded as the cache write rounds them (FP8:
saturating, divided by ``kv_scale``); the rotation is ``qkv.cu``'s (``rope/rotate.cuh``), so the cache and q hold the
same bits as after the two launches. Every step size (decode, prefill, mixed) takes it: the launch has no variants.

The pass (``fuse``) runs in ``lower_for_target`` right after ``plan_launches``, before any step that refers to
launches by index (quantized prefill, CUTLASS alternatives, GEMV variants, the prefill attention kernel, decode
fusion). **On by default** (``INGOT_ROPE_CACHE_FUSION=0`` turns it off). On the H200 (docs/PERF.md, "Bulk-copy GEMV",
A/B of the switches, eighth session): the batch-1 GPU step of the 1B shape 2.3% shorter (1.034 -> 1.010 ms a
token, the same with 8 steps a call), batch 64 no slower (21,709 vs 21,132 tok/s, two runs each); its GPU tests
(``tests/runtime/test_rope_cache_fusion_gpu.py``, bit-identical logits and cache) pass.

A ``rope_qkv`` launch and the cache write are fused when:

- the ``rope_qkv`` node is one launch of ``qkv.cu``, and its k and v outputs are no graph outputs and are read only by
  one ``paged_attention`` / ``paged_attention_fp8`` node, as its k and v inputs (once each);
- that node lowers to two launches, the first a cache write binding exactly those k and v, with the same token count
  (the ``num_tokens`` dim) as the ``rope_qkv`` launch;
- the KV cache it writes is read by no other node (the write now happens at the ``rope_qkv`` node, earlier in the
  order), and ``slot_mapping`` / ``kv_scale`` are defined before the ``rope_qkv`` node (graph inputs in the serving
  form);
- the head layout has a unit width (``cache_rule.vec_width``).

Then the ``rope_qkv`` launch becomes the fused one (its node, op and q buffer unchanged; arguments ``qkv``,
``positions``, ``cos``, ``sin``, ``q``, ``kv_cache``, ``slot_mapping``, ``kv_scale`` (null for an unscaled cache),
``num_tokens``), and the cache-write launch is removed. k and v keep their scratch bytes in the memory plan
(``plan_memory`` places every graph value), but no launch writes or reads them any more (``RopeCacheFusion.unused``
names them). Giving them no bytes would save nothing on the Llama-3.2-1B shape: they live only between the two
nodes, and the scratch region is 104 MiB at T = 2048 with or without them (its peak is in the MLP). The graph is
not changed: the CPU backend still runs ``rope_qkv`` and the attention's own cache write.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir.graph import Graph, Node, Value
from .kernel import KernelSpec
from .kernels.rope.cache_rule import rope_qkv_cache_spec, vec_width
from .launch_list import Launch, by_node
from .target import Target

#: set to 0 to lower without the fusion (the kernel table then is as before it existed); unset or 1: with it
ENV = "INGOT_ROPE_CACHE_FUSION"
#: the cache-write templates of the attention family, and whether each divides by ``kv_scale``
CACHE_WRITES = {"cache_write.cu": False, "cache_write_fp8.cu": True}
ATTENTION_OPS = ("paged_attention", "paged_attention_fp8")


@dataclass
class RopeCacheFusion:
    """What the lowering changes (launches by their index in ``plan_launches``' list)."""

    #: ``rope_qkv`` launch -> the fused spec and its arguments
    fused: dict[int, tuple[KernelSpec, dict[str, Any]]] = field(default_factory=dict)
    #: ``rope_qkv`` launch -> the cache-write launch it replaces (removed from the list)
    drops: dict[int, int] = field(default_factory=dict)
    #: values no launch reads or writes any more (the fused nodes' k and v outputs)
    unused: set[str] = field(default_factory=set)

    def apply(self, launches: Sequence[Launch]) -> list[Launch]:
        """``launches`` with the fused launches in place and the cache writes removed."""
        dropped = set(self.drops.values())
        out = []
        for j, (i, node, spec, args) in enumerate(launches):
            if j in dropped:
                continue
            out.append((i, node, *self.fused[j]) if j in self.fused else (i, node, spec, args))
        return out


def enabled() -> bool:
    """Rope-cache fusion applies (the default; ``INGOT_ROPE_CACHE_FUSION=0`` turns it off)."""
    return os.environ.get(ENV, "").strip() != "0"


def fuse(graph: Graph, launches: Sequence[Launch], target: Target) -> list[Launch]:
    """``launches`` with the fusion applied where ``enabled()``; the same launches otherwise."""
    return plan(graph, launches, target).apply(launches) if enabled() else list(launches)


def _defined_before(graph: Graph, v: Value | None, index: int, producers: dict[Value, int]) -> bool:
    """Whether ``v`` exists when node ``index`` runs (a graph input, a weight, or an earlier node's output)."""
    return v is not None and (producers.get(v, -1) < index)


def plan(graph: Graph, launches: Sequence[Launch], target: Target) -> RopeCacheFusion:
    """The fused pairs among ``launches`` (``lower.plan_launches``' list). Changes nothing itself."""
    out = RopeCacheFusion()
    users = graph.users()
    outputs = set(graph.outputs)
    producers = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
    per_node = by_node(launches)
    for j, (i, node, spec, args) in enumerate(launches):
        if (spec is None or node.op.name != "rope_qkv" or spec.family != "rope" or spec.template != "qkv.cu"
                or len(per_node[i]) != 1):
            continue
        _, k, v = node.outputs
        readers = users.get(k, [])
        if k in outputs or v in outputs or len(readers) != 1 or users.get(v, []) != readers:
            continue
        attn = readers[0]
        if attn.op.name not in ATTENTION_OPS or attn.inputs[1] is not k or attn.inputs[2] is not v:
            continue
        if sum(u is k for u in attn.inputs) != 1 or sum(u is v for u in attn.inputs) != 1:
            continue
        ai = graph.nodes.index(attn)
        if len(per_node.get(ai, ())) != 2:
            continue
        jw = per_node[ai][0]
        _, _, wspec, wargs = launches[jw]
        if wspec is None or wspec.family != "attention" or wspec.template not in CACHE_WRITES:
            continue
        cache, slots = attn.inputs[3], attn.inputs[7]
        scale = attn.inputs[8] if CACHE_WRITES[wspec.template] else None
        if (cache is None or users.get(cache, []) != [attn] or wargs.get("k") != {"buffer": k.name}
                or wargs.get("v") != {"buffer": v.name} or wargs.get("num_tokens") != args.get("num_tokens")
                or "dim" not in args.get("num_tokens", {})):
            continue
        if not _defined_before(graph, slots, i, producers) or (scale is not None
                                                                and not _defined_before(graph, scale, i, producers)):
            continue
        found = _fused_spec(node, spec, wspec, cache, target)
        if found is None:
            continue
        fused_args = {"qkv": args["qkv"], "positions": args["positions"], "cos": args["cos"], "sin": args["sin"],
                      "q": args["q"], "kv_cache": wargs["kv_cache"], "slot_mapping": wargs["slot_mapping"],
                      "kv_scale": wargs.get("kv_scale", {"null": True}), "num_tokens": args["num_tokens"]}
        if {p.name for p in found.params} != set(fused_args):  # the binding and the kernel must agree
            raise ValueError(f"rope-cache fusion: {found.entry} takes {sorted(p.name for p in found.params)}, "
                             f"bound {sorted(fused_args)}")
        out.fused[j] = (found, fused_args)
        out.drops[j] = jw
        out.unused |= {k.name, v.name}
    # a value some remaining launch still names keeps its bytes (none does in the serving form)
    named = {a["buffer"] for launch in out.apply(launches) for a in launch[3].values() if "buffer" in a}
    out.unused -= named
    return out


def _fused_spec(node: Node, rope: KernelSpec, write: KernelSpec, cache: Value, target: Target) -> KernelSpec | None:
    """The fused kernel for a ``qkv.cu`` launch and the cache write after it, or None where the shapes disagree or
    no unit width fits."""
    r, w = dict(rope.values), dict(write.values)
    nkv, d = int(r["NKV"]), int(r["HEAD_DIM"])
    shape = cache.type.shape or ()
    if (int(w["KV_HEADS"]) != nkv or int(w["HEAD_DIM"]) != d or w["DT"] != r["DT"] or len(shape) != 5
            or shape[2] != w["BLOCK_SIZE"] or w["K_STRIDE"] != nkv * d or w["V_STRIDE"] != nkv * d):
        return None
    qkv, cos = node.inputs[0], node.inputs[2]
    assert qkv is not None and cos is not None
    if vec_width(qkv.type.dtype, d, int(r["ROT"]), bool(r["INTERLEAVED"])) is None:
        return None
    return rope_qkv_cache_spec(qkv.type.dtype, cos.type.dtype, cache.type.dtype, int(r["NQ"]), nkv, d, int(r["ROT"]),
                               bool(r["INTERLEAVED"]), int(w["BLOCK_SIZE"]), CACHE_WRITES[write.template], target)
