"""decode-fusion: per-token ops computed inside the decode GEMV that reads their output, their launch skipped.

At batch 1 a decode step's small launches (a few microseconds each, on the critical path) cost more than their
work. Two of them per layer only prepare the next ``linear``'s input, so the GEMV variant of that linear
(``codegen/kernels/gemv``) computes it itself while staging x (a *prologue*, ``rule.Prologue``):

- ``rms_norm -> linear``: the variant reads the norm's input and weight, stages ``x * weight`` and sums ``x^2``
  over its K slice; its epilogue scales each token's f32 sums by ``1 / rms`` (the slices' sums of squares added
  through the split-K workspace), so no CTA reads a whole row before it stages x;
- packed ``swiglu -> linear`` (``bind_args``: one gate_up buffer): the variant reads gate_up and stages
  silu(gate) * up (``ex2.approx`` / ``rcp.approx``).

A step's results change within rounding: not bit-identical to the skipped kernel followed by the plain variant
(the norm factor multiplies the f32 sums instead of being rounded into the bf16 x; the sigmoid's approximate
instructions), and within the GEMV's tolerance of the numpy reference (``tests/codegen/test_decode_fusion_gpu.py``).
Runs in ``lower_for_target`` after the variants are planned and autotuned (a fused variant takes the tuned plain
variant's configuration). **On by default** (``INGOT_DECODE_FUSION=0`` turns it off). This version, on the H200
(docs/PERF.md, "Decode fusion v2" and "Bulk-copy GEMV"): each fused pair 1.3-7.8 us faster than norm/activation +
plain GEMV; end to end on the 1B shape the batch-1 GPU step 3% shorter (1.073 -> 1.035 ms a token; 8 steps a call:
8.72 -> 8.47 ms), batch 64 unchanged (its bucket is never fused); its end-to-end GPU test
(``tests/runtime/test_cuda_backend.py::test_decode_fusion_changes_no_logit``) passes. The first version
did not pay (docs/PERF.md, "End to end", third run): at batch 1 on the 1B shape the fused GEMVs
took about as much longer (gate_up +4.5 us, down +4.6 us, qkv +3.3 us) as the skipped launches took (843.7 tok/s
fused vs 850.3 unfused). Its SASS shows why the rms_norm variants were slow: after the grid-dependency wait one warp
summed each token's whole row (two dependent rounds of loads, a block reduction, an IEEE 1 / sqrt) before the CTA
staged x, and the staging loop used each 16-byte load before issuing the next (up to 2 round trips at one token, 16
at eight), every round trip behind the CTA's weight loads; and in every variant, plain ones included, ptxas had
hoisted the wait above the first weight stage, so no weights loaded during the previous kernel's tail. The kernel
now stages with cp.async (one round trip, no registers held), reads only its slice, and loads its first weight stage
before the wait (``rule.gemv_spec``'s ``weights_first``). ``bench/bench_decode_fusion.py`` times each fused variant
against the producer + plain variant it replaces.

A pair is fused when:

- the producer is one launch of the norm / activation family's kernel (``rms_norm`` without residual or bias,
  bf16 x and weight; ``swiglu`` packed, ``alpha`` any), and its output is no graph output and is read only by
  the ``linear`` (or weight-only FP8 ``quantized_linear``), as its x;
- the linear's launch with decode variants (a weight-only quantized linear's other launch, the dequantize, is
  skipped at decode: ``codegen/quant_prefill.py``) has plain ``kernel.cu`` variants (``rule.is_plain``: bf16
  weights, or FP8 ones with ``INGOT_GEMV_FP8=kernel``), the skinny wgmma GEMM's (``skinny_rule``; rms_norm
  prologues only) or, with ``INGOT_W8A8_NORM_FUSION=1``, W8A8's ``quant.cu`` ones (rms_norm only:
  ``quant_rule.fused_quant_spec``, the per-token quantization after the norm; off by default, slower at 8 rows) for
  the buckets fused, and all its variants have the producer's width as K;
- both launches count the same rows (the producer's ``rows`` / ``num_tokens`` argument and the linear's ``M``
  are the same dim expression: every step selects the same way for both, CUDA-graph buckets included);
- the fused variants fit the target's shared memory (the swiglu prologue stages up's slice beside x's).

The variants up to ``MAX_ROWS[op]`` rows get the prologue; the producer's launch is skipped for steps of at most
the largest of those (``DecodeFusion.skips``). A fused variant has its own arguments (``x`` is the producer's
input, plus ``norm_weight`` for ``rms_norm``); the producer's input then lives until the linear in the memory plan
(``variant_reads``, ``plan_memory``'s ``reads``), so the linear's output never shares its bytes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir.graph import Graph, Node
from .kernel import KernelSpec
from .kernels.gemv import quant_rule, skinny_rule
from .kernels.gemv import rule as gemv
from .launch_list import Launch, by_node
from .target import Target

#: set to 0 to lower without decode fusion (the kernel table then is as before it existed); unset or 1: with it
ENV = "INGOT_DECODE_FUSION"
#: op -> the largest GEMV bucket fused: each CTA of a row block recomputes its slice's x (a product and a square,
#: or an ex2 and a rcp, per element; swiglu reads twice x's bytes), worth a launch only for few tokens.
MAX_ROWS = {"rms_norm": 8, "swiglu": 8}


@dataclass
class DecodeFusion:
    """What the lowering changes for the fused pairs (launches by their index in the launch list)."""

    #: producer launch -> (its row-count argument, max rows): not launched for steps of at most that many rows
    skips: dict[int, tuple[str, int]] = field(default_factory=dict)
    #: producer launch -> the consumer launch whose fused variants do its work
    into: dict[int, int] = field(default_factory=dict)
    #: consumer launch -> its variants with the fused ones in place: (max rows, spec, own arguments or None)
    variants: dict[int, list[tuple[int, KernelSpec, dict[str, Any] | None]]] = field(default_factory=dict)
    #: fused spec key -> the plain variant it was made from (its autotune record applies)
    made_from: dict[str, KernelSpec] = field(default_factory=dict)


def enabled() -> bool:
    """Decode fusion applies (the default; ``INGOT_DECODE_FUSION=0`` turns it off)."""
    return os.environ.get(ENV, "").strip() != "0"


def _prologue(node: Node, spec: KernelSpec, args: Mapping[str, Any]) -> tuple[gemv.Prologue, str, str] | None:
    """(prologue, the producer's row-count argument, the buffer the fused variant reads as x) for a producer
    launch this pass can fuse, else None."""
    v = dict(spec.values)
    if node.op.name == "rms_norm" and spec.family == "norm":
        if v.get("KIND") != 0 or v.get("RESIDUAL") or v.get("BIAS") or v.get("DT") != "bf16" or v.get("WT") != "bf16":
            return None
        pro = gemv.Prologue("rms_norm", eps=float(v["EPS"]))
        return pro, "rows", args["x"]["buffer"]
    if node.op.name == "swiglu" and spec.family == "activation" and getattr(node.op, "packed", False):
        width = int(v["WIDTH"])
        if (v.get("ACT") != 0 or v.get("DT") != "bf16" or v.get("B_OFFSET") != width
                or v.get("A_STRIDE") != 2 * width or v.get("B_STRIDE") != 2 * width or args["a"] != args["b"]):
            return None
        return gemv.Prologue("swiglu", alpha=float(v["ALPHA"])), "num_tokens", args["a"]["buffer"]
    return None


def _fusable(spec: KernelSpec) -> bool:
    """A variant ``rule.fused_spec`` takes: a plain GEMV variant, the skinny wgmma GEMM's, or with
    ``INGOT_W8A8_NORM_FUSION=1`` a W8A8 ``quant.cu`` decode variant (those two rms_norm only; another prologue raises
    ``ValueError`` there and the pair stays unfused)."""
    return (gemv.is_plain(spec) or skinny_rule.is_skinny(spec)
            or (quant_rule.fusable_quant(spec) and quant_rule.w8a8_norm_fusion_on()))


def plan(graph: Graph, launches: Sequence[Launch], variant_plans: Mapping[int, Sequence[tuple[int, KernelSpec]]],
         target: Target, variant_args: Mapping[int, Mapping[str, Any]] | None = None) -> DecodeFusion:
    """The fused pairs among ``launches`` (``lower.plan_launches``' list) given each launch's planned variants
    (``variant_plans``: launch index -> ``(max rows, spec)``, smallest first) and the launches whose variants have
    arguments of their own (``variant_args``: ``quant_prefill``'s GEMM launches, whose variants take the quantized
    operands). Changes nothing itself."""
    variant_args = variant_args or {}
    out = DecodeFusion()
    users = graph.users()
    outputs = set(graph.outputs)
    per_node = by_node(launches)
    for j, (i, node, spec, args) in enumerate(launches):
        if spec is None or node.op.name not in MAX_ROWS or len(per_node[i]) != 1:
            continue
        found = _prologue(node, spec, args)
        y = node.outputs[0]
        readers = users.get(y, [])
        if (found is None or y in outputs or len(readers) != 1
                or readers[0].op.name not in ("linear", "quantized_linear")):
            continue
        consumer = readers[0]
        if consumer.inputs[0] is not y or sum(u is y for u in consumer.inputs) != 1:
            continue
        ci = graph.nodes.index(consumer)
        # the node's launch with decode variants (a weight-only quantized linear's dequantize launch has none)
        with_variants = [jj for jj in per_node.get(ci, ()) if jj in variant_plans]
        if len(with_variants) != 1 or (consumer.op.name == "linear" and len(per_node[ci]) != 1):
            continue
        jc = with_variants[0]
        prologue, rows_arg, x_buffer = found
        base = variant_args.get(jc)  # the variants' own arguments, where they have them
        cargs = base if base is not None else launches[jc][3]
        planned = list(variant_plans.get(jc, ()))
        width = (y.type.shape or (None,))[-1]
        fused = [(mr, s) for mr, s in planned if mr <= MAX_ROWS[node.op.name]]
        if (not planned or rows_arg not in args or "dim" not in args[rows_arg] or "M" not in cargs
                or args[rows_arg] != cargs["M"] or not all(_fusable(s) for _, s in fused)
                or (base is None and not all(_fusable(s) for _, s in planned))
                or any(s.value("K") != width for _, s in planned)):
            continue
        rows = cargs["M"]["dim"]
        if not fused or (isinstance(rows, int) and rows > fused[-1][0]):  # graph mode: a static count too large
            continue
        own = {**cargs, "x": {"buffer": x_buffer}}
        if prologue.kind == "rms_norm":
            own["norm_weight"] = args["weight"]
        try:  # the swiglu prologue stages up beside x: a slice too wide for shared memory keeps the pair unfused
            made = {mr: gemv.fused_spec(s, prologue, target) for mr, s in fused}
        except ValueError:
            continue
        variants: list[tuple[int, KernelSpec, dict[str, Any] | None]] = []
        for mr, s in planned:
            if mr not in made:
                variants.append((mr, s, None if base is None else dict(base)))
                continue
            f = made[mr]
            if {p.name for p in f.params} != set(own):  # the binding and the kernel must agree, as in plan_launches
                raise ValueError(f"decode fusion: {f.entry} takes {sorted(p.name for p in f.params)}, "
                                 f"bound {sorted(own)}")
            out.made_from[f.key] = s
            variants.append((mr, f, own))
        out.variants[jc] = variants
        out.skips[j] = (rows_arg, fused[-1][0])
        out.into[j] = jc
    return out


def variant_reads(table: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Value name -> the last node that names it in a variant's own arguments, over a kernel table's ``launches``: what
    ``plan_memory`` must be given as ``reads`` for that table (buffers the launch reads anyway change nothing there;
    a value written there before its own node, q of ``codegen/qkv_rope_fusion.py``, has its interval widened back
    to that node)."""
    reads: dict[str, int] = {}
    for ln in table:
        for v in ln.get("variants", ()):
            for a in v.get("args", {}).values():
                if "buffer" in a:
                    reads[a["buffer"]] = max(reads.get(a["buffer"], -1), int(ln["node"]))
    return reads
