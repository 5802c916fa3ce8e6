"""qkv-rope-fusion: the qkv projection's decode GEMV rotates q and k and writes the KV cache itself, and the rope
launch is skipped in decode steps.

After rope-cache fusion (``codegen/rope_cache_fusion.py``) a layer's attention block at decode is three launches:
the qkv GEMV (with the rms_norm prologue, ``codegen/decode_fusion.py``), ``rope/qkv_cache.cu`` (one block a token:
rotate q and k, write q and the cache) and the attention. The middle one is latency on the critical path (a launch,
a grid-dependency wait, a round trip to L2 for the qkv row) for a few kilobytes of work. Here the GEMV variant's
epilogue does that work (``kernels/gemv/kernel.cu``'s rope epilogue, ``rule.RopeEpilogue``): its tiles stream the
weight rows of each rotating pair side by side, so a lane holds both halves of its pairs; it rounds each output to
bf16 as the plain variant stores it, rotates with ``rope/rotate.cuh`` and stores what ``qkv_cache.cu`` stores, bit for
bit. The qkv buffer is not written in those steps.

A pair is fused when:

- the ``rope_qkv`` launch is the fused ``qkv_cache.cu`` one, bf16 q/k/v, all of each head rotating (``ROT`` equal
  to the head size), heads of a multiple of 16 features;
- its qkv input is the output of a ``linear`` or ``quantized_linear`` node read by nothing else and no graph output,
  and that node's launch with decode variants (a weight-only quantized linear's other launch, the dequantize, is
  skipped at decode) has ``kernel.cu`` variants (plain or with a prologue; bf16 weights, or FP8 weight-only ones,
  which run ``kernel.cu`` by default: ``quant_rule.fp8_template``), ``quant.cu`` ones with FP8 activations (W8A8,
  the ``fp8`` format's decode buckets; ``quant_rule.with_rope``) or, with ``INGOT_QKV_ROPE_FUSION=all``, any
  ``quant.cu`` ones (weight-only FP8 / NVFP4 there too) for the qkv row's width, without residual;
- both launches count the same rows (the rope launch's ``num_tokens`` and the linear's ``M``).

The variants up to ``MAX_ROWS`` tokens get the epilogue, with their own arguments (the variant's, plus the rope
launch's ``positions``, ``cos``, ``sin``, ``q``, ``kv_cache``, ``slot_mapping``, ``kv_scale``), and the rope launch
is skipped for steps of at most the largest of those (``skips``); prefill steps run both launches as before. q is
then written at the linear's node: ``decode_fusion.variant_reads`` names it for the memory plan, which keeps q's
bytes from the linear's node on (``plan_memory``'s ``reads`` widen a value's interval both ways).

**On by default** (``INGOT_QKV_ROPE_FUSION=0`` at compile time turns it off). On the H200 (docs/PERF.md, "The rope
launch in the qkv GEMV", tenth session), bf16 weights: the batch-1 GPU step of the 1B shape 9% shorter
(0.988 -> 0.898 ms), 8 steps a call 940 -> 1,020 tok/s (medians of 4 alternating runs each), batch 64 unchanged
(its bucket is not fused); its GPU tests (the epilogue bit for bit against the variant + ``qkv_cache.cu``, same
logits and cache end to end) pass. ``quant.cu``'s epilogue passes the same tests, but FP8 weight-only artifacts ran
no faster with it (GPU step 0.899 vs 0.891 ms, its split-K tail then carries the epilogue), so it is opt-in:
``INGOT_QKV_ROPE_FUSION=all``. Since the twelfth session FP8 weight-only decode buckets are ``kernel.cu``'s
(``INGOT_GEMV_FP8``), so they take this epilogue by default (docs/PERF.md, "FP8 weights on kernel.cu"). W8A8's
decode buckets (``quant.cu``, x quantized per token in the CTA) take ``quant.cu``'s by default since the thirtieth
session: the 1B shape's W8A8 decode at batch 1 / 8 +2.9% / +2.2% (1,006 -> 1,036, 5,705 -> 5,828 tok/s, two runs
each), batch 16 (not fused) unchanged (docs/PERF.md, "W8A8 decode at 1-16 rows").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir.graph import Graph
from .kernel import KernelSpec
from .kernels.gemv import quant_rule
from .kernels.gemv import rule as gemv
from .launch_list import Launch, by_node
from .switches import env_choice
from .target import Target

#: compile-time switch: 0 turns the fusion off (the kernel table then is as before it existed); unset or 1: on for
#: ``kernel.cu``'s variants (bf16 and FP8 weight-only) and ``quant.cu``'s with FP8 activations (W8A8); ``all``: also
#: ``quant.cu``'s weight-only ones (FP8 / NVFP4 weights)
ENV = "INGOT_QKV_ROPE_FUSION"
#: the largest GEMV bucket fused (decode steps; the epilogue's stores are per element, worth it for few tokens)
MAX_ROWS = 8

Variant = tuple[int, KernelSpec, dict[str, Any] | None]
#: the rope launch's arguments a fused variant takes over
ROPE_ARGS = ("positions", "cos", "sin", "q", "kv_cache", "slot_mapping", "kv_scale")


@dataclass
class QkvRopeFusion:
    """What the lowering changes (launches by their index in the launch list)."""

    #: rope launch -> (its row-count argument, max rows): not launched for steps of at most that many rows
    skips: dict[int, tuple[str, int]] = field(default_factory=dict)
    #: rope launch -> the qkv linear's launch whose variants do its work
    into: dict[int, int] = field(default_factory=dict)
    #: linear launch -> its variants with the fused ones in place
    variants: dict[int, list[Variant]] = field(default_factory=dict)
    #: fused spec key -> the variant it was made from (its autotune record applies)
    made_from: dict[str, KernelSpec] = field(default_factory=dict)


def mode() -> str:
    """``INGOT_QKV_ROPE_FUSION``: ``"bf16"`` (unset, empty or ``1``: ``kernel.cu``'s variants and ``quant.cu``'s with
    FP8 activations, the default), ``"all"`` (also ``quant.cu``'s weight-only ones, FP8 / NVFP4 weights: measured no
    faster, docs/PERF.md) or ``"off"`` (``0``); another value is an error naming the variable."""
    return env_choice(ENV, {"": "bf16", "1": "bf16", "all": "all", "0": "off"},
                      "1 (the default: kernel.cu's variants and W8A8's quant.cu ones), all (also quant.cu's "
                      "weight-only ones) or 0 (off)")


def enabled() -> bool:
    """The fusion applies (the default; ``INGOT_QKV_ROPE_FUSION=0`` turns it off)."""
    return mode() != "off"


def epilogue(rope: KernelSpec) -> gemv.RopeEpilogue | None:
    """The GEMV epilogue doing what the fused rope launch ``rope`` does, or None where it cannot."""
    if rope.family != "rope" or rope.template != "qkv_cache.cu":
        return None
    v = dict(rope.values)
    d = int(v["HEAD_DIM"])
    if v["DT"] != "bf16" or int(v["ROT"]) != d or d % 16:
        return None
    return gemv.RopeEpilogue(int(v["NQ"]), int(v["NKV"]), d, bool(v["INTERLEAVED"]), int(v["BLOCK_SIZE"]),
                             str(v["KT"]), str(v["CT"]), bool(v["KV_SCALED"]))


def _takes_epilogue(spec: KernelSpec, ep: gemv.RopeEpilogue) -> bool:
    """A decode variant (``kernel.cu``; ``quant.cu`` with FP8 activations, or with ``mode() == "all"`` any ``quant.cu``
    one; never the any-M launch) of the qkv row's width, no residual."""
    v = dict(spec.values)
    template = spec.template == "kernel.cu" or (
        spec.template == "quant.cu" and (mode() == "all" or int(v.get("AFMT", 0)) != 0))
    return (spec.family == "gemv" and template and not v.get("ANY_M")
            and int(v["N"]) == ep.rows and not v["HAS_RESIDUAL"] and not v.get("ROPE"))


def plan(graph: Graph, launches: Sequence[Launch], variant_lists: Mapping[int, Sequence[Variant]],
         target: Target) -> QkvRopeFusion:
    """The fused pairs among ``launches`` given each launch's variants (``variant_lists``: launch index ->
    ``(max rows, spec, own arguments or None)``, smallest first, decode fusion's prologues in place). Changes
    nothing itself."""
    out = QkvRopeFusion()
    users = graph.users()
    outputs = set(graph.outputs)
    per_node = by_node(launches)  # node index -> its launches
    for jr, (i, node, spec, args) in enumerate(launches):
        if spec is None or node.op.name != "rope_qkv" or len(per_node[i]) != 1:
            continue
        ep = epilogue(spec)
        qkv = node.inputs[0]
        if ep is None or qkv is None or qkv in outputs or users.get(qkv, []) != [node] or qkv.producer is None:
            continue
        linear = qkv.producer
        if linear.op.name not in ("linear", "quantized_linear") or linear.outputs[0] is not qkv:
            continue
        ci = graph.nodes.index(linear)
        # the node's launch with decode variants (a weight-only quantized linear also has a dequantize launch,
        # skipped at decode: codegen/quant_prefill.py)
        with_variants = [j for j in per_node.get(ci, ()) if j in variant_lists]
        if len(with_variants) != 1:
            continue
        jc = with_variants[0]
        cargs = launches[jc][3]
        planned = list(variant_lists.get(jc, ()))
        if (not planned or "M" not in cargs or args.get("num_tokens") != cargs["M"] or "dim" not in cargs["M"]
                or any(a not in args for a in ROPE_ARGS)):
            continue
        fuse = [mr <= MAX_ROWS and _takes_epilogue(s, ep) for mr, s, _ in planned]
        if not fuse[0]:  # the smallest bucket must be among them
            continue
        largest = max(mr for (mr, _, _), f in zip(planned, fuse) if f)
        if not all(f for (mr, _, _), f in zip(planned, fuse) if mr <= largest):
            continue  # a bucket the rope launch would be skipped for would keep an unfused variant
        if not isinstance(cargs["M"]["dim"], str) and int(cargs["M"]["dim"]) > largest:
            continue  # graph mode: a static count too large for the fused buckets
        variants: list[Variant] = []
        for (mr, s, own), f in zip(planned, fuse):
            if not f:
                variants.append((mr, s, own))
                continue
            fused = (gemv.with_rope if s.template == "kernel.cu" else quant_rule.with_rope)(s, ep, target)
            bound = {**(own if own is not None else cargs), **{n: args[n] for n in ROPE_ARGS}}
            if {p.name for p in fused.params} != set(bound):  # the binding and the kernel must agree
                raise ValueError(f"qkv-rope fusion: {fused.entry} takes {sorted(p.name for p in fused.params)}, "
                                 f"bound {sorted(bound)}")
            out.made_from[fused.key] = s
            variants.append((mr, fused, bound))
        out.variants[jc] = variants
        out.skips[jr] = ("num_tokens", largest)
        out.into[jr] = jc
    return out
