"""quant-prefill-gemm: a weight-only ``quantized_linear`` in prefill steps as dequantize + the bf16 GEMM, a W8A8 FP8
one as the activation quantizer + the FP8 GEMM.

The quantized GEMV (``codegen/kernels/gemv/quant.cu``) is built for decode: its any-M launch walks the tokens in
64-row chunks and reads the whole weight again for each, so a 2048-token prefill step reads it 32 times (docs/PERF.md,
"In a quantized artifact": FP8 weight-only prefill at a third of BF16's). With this step a quantized_linear becomes
two launches::

    {"kernel": "dequant_fp8_n16384_k2048_...", "op": "quantized_linear", "rows_arg": "M",
     "skip": {"max_rows": 64, "into": j + 1},
     "args": {"weight": {"buffer": "...weight"}, "weight_scale": ..., "weight_scale_2": ...,
              "out": {"buffer": "<out>.dequant_weight"}, "out_scale": {"null": true}, "M": {"dim": "T"}}}
    {"kernel": "linear_cutlass_bf16_...", "op": "quantized_linear",
     "args": {"x": ..., "weight": {"buffer": "<out>.dequant_weight"}, "weight_scale": {"buffer": "...weight_scale"},
              "bias": ..., "residual": ..., "out": ..., "M": {"dim": "T"}},
     "variants": [{"kernel": "gemv_fp8_a16_..._m8_...", "max_rows": 8, "args": {<the quantized GEMV's arguments>}},
                  ..., {"kernel": "gemv_fp8_a16_..._m64_...", "max_rows": 64, "args": {...}}],
     "alternatives": [{"kernel": "linear_bf16_bf16_..."}]}

1. the **dequantize** kernel (``codegen/kernels/dequant``) writes the weight as exact bf16 values into a scratch
   buffer ``<out>.dequant_weight`` (and, for NVFP4, its global scale as an f32 [N] column scale
   ``<out>.dequant_scale``); it carries ``"skip"`` (``codegen/decode_fusion.py``'s mechanism): the executor launches
   nothing for it in steps of at most ``WO_GEMM_ROWS`` (64) rows, where the GEMM launch's variants run;
2. the **GEMM** is what a bf16 ``linear`` of that shape gets (``cutlass_params.plan_linear``: the shape's CUTLASS
   configuration on h100/h200 and b200, the template GEMM as its alternative; the template GEMM alone without
   CUTLASS), with the per-output-channel scale in its epilogue (CUTLASS's column-scale vector, the template's
   ``HAS_SCALE``): the FP8 weight's own ``weight_scale``, or the NVFP4 scratch scale. Its variants are the quantized
   GEMV's token buckets with their own arguments (the quantized operands), tuned like any variant. Until 2026-12-03
   the any-M GEMV itself followed for steps of 65 to ``GEMV_MAX_ROWS`` (256) rows; measured on the H200 it was no
   faster than the pair at 65-128 rows and 1.2x slower at 256 (both far from bf16 cuBLAS: docs/PERF.md "Decode steps
   of 65-256 rows"), so the pair takes those steps now (``INGOT_WO_GEMM_ROWS=256`` keeps the any-M GEMV).

**Why the scale in the epilogue** instead of folded into the bf16 scratch: e4m3 and e2m1 x e4m3 values are exact in
bf16, the scale is not, so ``bf16(code * scale)`` would round every weight (up to 2^-9 relative); with the scale
applied to the f32 accumulator the GEMM computes what the GEMV and the reference compute, up to f32 summation
order, and both CUTLASS's epilogue and the template GEMM already take an optional per-channel f32 scale (one build
shared with the bf16 linears).

**Scratch memory**: the scratch buffers are *temporaries* of the memory plan (``plan_memory``'s ``temporaries``),
live only during their node, so every layer's scratch shares the same bytes of the scratch region (the largest
[N, K] bf16 weight once, not one per linear), and they are never among the io the decode graphs copy.

Taken: weight-only FP8 (per-channel) and NVFP4 (linear scales) ``quantized_linear`` whose launch is the quantized
GEMV (``dequant/rule.py`` ``applies``), with a row count that can exceed the largest bucket.

**W8A8 FP8** (per-channel weight scales, activations per token or with the static ``input_scale``: the ``fp8`` and
``fp8:static`` formats) runs the FP8 tensor cores instead: the pair is ::

    {"kernel": "quant_act_fp8_k2048_...", "op": "quantized_linear", "rows_arg": "M", "skip": {"max_rows": 16, ...},
     "args": {"x": ..., "input_scale": {"null": true}, "x_fp8": {"buffer": "<out>.x_fp8"},
              "x_scale": {"buffer": "<out>.x_scale"}, "M": {"dim": "T"}}}
    {"kernel": "linear_cutlass_fp8_...", "op": "quantized_linear",
     "args": {"x": {"buffer": "<out>.x_fp8"}, "weight": ..., "x_scale": {"buffer": "<out>.x_scale"},
              "weight_scale": ..., "bias": ..., "residual": ..., "out": ..., "M": {"dim": "T"}},
     "variants": [<the W8A8 GEMV's buckets 8 and 16, with their own arguments, as above>]}

Unlike the weight-only pair, it takes over from the GEMV at 17 rows, not 257 (``W8A8_GEMM_ROWS``, measured; the
variants are the W8A8 GEMV's buckets 8 and 16 only; ``INGOT_W8A8_GEMM_ROWS`` moves the boundary).

1. the **quantizer** (``codegen/kernels/quant_act/fp8.cu``) writes x's e4m3 codes and per-row scales exactly as
   ``quantize_activation`` (the op's reference, and what the GEMV computes in its CTAs) into memory-plan temporaries
   ``<out>.x_fp8`` e4m3[T, K] and ``<out>.x_scale`` f32[T]; skipped like the dequantize launch, up to 16 rows;
2. the **FP8 GEMM** is the shape-generic CUTLASS one (``gemm_cutlass/sm90.cu`` on h100/h200, ``sm100.cu`` on b200;
   ``cutlass_params.generic_linear_spec("fp8", ...)`` with ``rule.shape_config``'s configuration, autotuned like the
   bf16 ones), its epilogue ``weight_scale[n] * (acc * x_scale[m]) + bias (+ residual)``: the reference's product up
   to f32 summation order. FP8 weights in 128 x 128 blocks (``fp8:block``) take the GEMM's ``block-rows`` build
   (sm_90a, the default configuration): each k-tile's partial promoted times its weight block's scale in the mainloop,
   x's per-row scale in the epilogue. There is no template alternative (no plain FP8 GEMM): ``w8a8_decline_reason``
   keeps the GEMV where CUTLASS cannot be built, with ``INGOT_NO_CUTLASS=1``, for per-tensor weight scales (the
   ``fp8-channel-scales`` pass makes them per channel first), blocks other than 128 x 128 or on b200, and for K not a
   multiple of 16 (128 with blocks) or N of 8. Run on the H200; the b200 build is compiled only.
``INGOT_NO_GEMV=1`` (``gemv`` False): no variants, the pair runs at every row count.

**On by default** (``INGOT_QUANT_PREFILL_GEMM=0`` turns it off at compile time; off, the kernel table is what it was
before this step existed): measured on the H200 it takes the 1B shape's FP8 weight-only prefill (8 x 2048 tokens)
from 69k to 216k prompt tok/s, BF16's rate (docs/PERF.md, "In a quantized artifact"). Runs in
``lower_for_target`` right after ``plan_launches``, before the CUTLASS alternatives, variants, autotuning and decode
fusion are planned over the list.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir.graph import Graph, Node, Value
from ..ir.ops.llm import Linear
from ..ir.types import DType, TensorType
from .kernel import KernelSpec
from .kernels.attention.prefill_rule import DECODE_MAX_ROWS
from .kernels.dequant import rule as dequant
from .kernels.gemm.rule import linear_spec
from .kernels.gemm_cutlass import cutlass_params
from .kernels.gemm_cutlass.rule import shape_config, supports, variant_config, weight_scales_reason
from .kernels.gemv.quant_rule import quant_variants
from .kernels.gemv.rule import BUCKETS
from .kernels.quant_act.rule import FP8_MAX_K, fp8_quantizer_spec
from .launch_list import Launch, by_node, token_rows
from .target import Target

#: set to 0 to lower without the dequantize + GEMM prefill path (the kernel table as before it existed); unset: on
ENV = "INGOT_QUANT_PREFILL_GEMM"
#: the scratch buffers' names: the node's output name and these suffixes
WEIGHT_SUFFIX, SCALE_SUFFIX = ".dequant_weight", ".dequant_scale"
#: ... and of a W8A8 linear's quantized activations (e4m3 codes, per-row scales)
X_FP8_SUFFIX, X_SCALE_SUFFIX = ".x_fp8", ".x_scale"
#: steps of at most this many rows keep the quantized GEMV (its buckets, then the any-M launch as the last variant):
#: the any-M GEMV reads the weight once per 64 rows, the pair ~5 bytes per weight (dequantize: read 1, write 2; GEMM:
#: read 2) plus the GEMM, so by bytes they break even near 5 chunks. It is the attention's DECODE_MAX_ROWS (256), so
#: decode batches up to that (their CUDA-graph buckets) run exactly the GEMV kernels, as they run the decode
#: attention. The threshold itself is not tuned on the H200 (only 310-row and 2048-row steps were measured).
GEMV_MAX_ROWS = DECODE_MAX_ROWS
#: W8A8 FP8: steps of more rows than this run the quantizer + FP8 GEMM pair, smaller ones the W8A8 GEMV's variants up
#: to it (a bucket's max rows, or GEMV_MAX_ROWS: the any-M launch too); ``INGOT_W8A8_GEMM_ROWS`` at compile time
#: (0: the pair at every row count). 16: on the H200 the pair ran the 1B model's four linears 1.1-1.7x faster than
#: the GEMV at 32 rows, 2.1-2.6x at 64 and 4.4-11x past the buckets (the any-M launch), 0.84-1.17x at 16 and 0.6-0.97x
#: at 8; W8A8 decode at batch 64 went from 17.7k to 33.1k tok/s, batch 16 unchanged (docs/PERF.md, "W8A8 prefill on
#: FP8 tensor cores")
W8A8_ENV = "INGOT_W8A8_GEMM_ROWS"
W8A8_GEMM_ROWS = 16
#: weight-only FP8 / NVFP4: steps of more rows than this run the dequantize + bf16 GEMM pair, smaller ones the
#: quantized GEMV's variants up to it (``GEMV_MAX_ROWS``: the any-M launch too, the default before 2026-12-03);
#: ``INGOT_WO_GEMM_ROWS`` at compile time (0: the pair at every row count). 64, the largest bucket: measured on the H200
#: (bench_gemv_quant.py --pair, docs/PERF.md "Decode steps of 65-256 rows") the 1B model's four linears took 195 / 206
#: / 254 us with the any-M GEMV at 65 / 128 / 256 rows (FP8 weights) and 203 / 200 / 211 us with the pair; NVFP4 227 /
#: 282 against 220 / 231 at 128 / 256
WO_ENV = "INGOT_WO_GEMM_ROWS"
WO_GEMM_ROWS = 64


def _gemv_rows(env: str, default: int) -> int:
    from .switches import env_choice

    choices = {"": default, **{str(r): r for r in (0, *BUCKETS, GEMV_MAX_ROWS)}}
    return env_choice(env, choices, f"one of {sorted(set(choices.values()))}")


def w8a8_gemm_rows() -> int:
    """The W8A8 GEMV's largest step (``W8A8_ENV``; unset: ``W8A8_GEMM_ROWS``): 0, a GEMV bucket, or GEMV_MAX_ROWS."""
    return _gemv_rows(W8A8_ENV, W8A8_GEMM_ROWS)


def wo_gemm_rows() -> int:
    """The weight-only quantized GEMV's largest step (``WO_ENV``; unset: ``WO_GEMM_ROWS``): 0, a GEMV bucket, or
    GEMV_MAX_ROWS (the any-M launch's steps too)."""
    return _gemv_rows(WO_ENV, WO_GEMM_ROWS)


def enabled() -> bool:
    return os.environ.get(ENV, "").strip() != "0"


@dataclass
class QuantPrefill:
    """What the lowering changes (launches by their index in ``launches``, the list with the pairs in place)."""

    #: the launch list with each taken quantized_linear's launch replaced by (dequantize, GEMM); empty: unchanged
    launches: list[Launch] = field(default_factory=list)
    #: dequantize launch -> (its row-count argument, max rows): not launched for steps of at most that many rows
    skips: dict[int, tuple[str, int]] = field(default_factory=dict)
    #: dequantize launch -> the GEMM launch whose variants do the small steps
    into: dict[int, int] = field(default_factory=dict)
    #: GEMM launch -> the quantized GEMV variants ``(max rows, spec)``, smallest first (tuned like other variants)
    variants: dict[int, list[tuple[int, KernelSpec]]] = field(default_factory=dict)
    #: GEMM launch -> its variants' own arguments (the quantized GEMV's: the node's inputs by name)
    variant_args: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: GEMM launch -> the template GEMM beside a CUTLASS primary (``alternatives`` in the kernel table)
    alternatives: dict[int, KernelSpec] = field(default_factory=dict)
    #: scratch buffer -> (node index, type): ``plan_memory``'s ``temporaries``
    temporaries: dict[str, tuple[int, TensorType]] = field(default_factory=dict)

    def variant_lists(self, plans: Mapping[int, Sequence[tuple[int, KernelSpec]]]
                      ) -> dict[int, list[tuple[int, KernelSpec, dict[str, Any] | None]]]:
        """The GEMM launches' variants as the kernel table lists them, from ``plans`` (the variant plans after
        autotuning): ``(max rows, spec, own arguments)``."""
        return {j: [(mr, v, self.variant_args[j]) for mr, v in plans[j]] for j in self.variant_args if j in plans}


def w8a8_decline_reason(node: Node, target: Target) -> str | None:
    """Why a W8A8 FP8 ``quantized_linear`` keeps the quantized GEMV in prefill steps, or None when it gets the
    quantizer + FP8 GEMM pair (any other node: a reason too)."""
    op = node.op
    if op.name != "quantized_linear" or getattr(op, "weight_format", "") != "fp8" or op.act_format != "fp8":
        return "not a W8A8 FP8 quantized_linear"
    if op.weight_granularity not in ("channel", "block") or op.scale_layout != "linear":
        return f"the FP8 GEMM takes per-channel or 128 x 128 block weight scales, not {op.weight_granularity!r}"
    if not supports("fp8", target):
        return f"target {target.name} has no FP8 CUTLASS GEMM"
    w = node.inputs[1]
    assert w is not None and w.type.shape is not None
    n, k = int(w.type.shape[0]), int(op.in_features)
    if k % 16 or n % 8 or k > FP8_MAX_K:
        return f"the FP8 GEMM needs K % 16 == 0 (K <= {FP8_MAX_K}) and N % 8 == 0, got N={n} K={k}"
    if op.weight_granularity == "block":
        block = tuple(int(b) for b in op.block) if op.block else (128, 128)
        if block != (128, 128) or k % 128:
            return f"the block-scaled FP8 GEMM takes 128 x 128 blocks over whole blocks of K, got {block}, K={k}"
        why = weight_scales_reason("fp8", variant_config("fp8", target), "block-rows")
        if why:
            return why
    if os.environ.get("INGOT_NO_CUTLASS", "") not in ("", "0"):
        return "INGOT_NO_CUTLASS=1 leaves CUTLASS out (the FP8 GEMM is a CUTLASS kernel)"
    if not cutlass_params.cutlass_available():
        return "the FP8 GEMM is a CUTLASS kernel: it needs nvcc and the nvidia-cutlass wheel's headers"
    return None


def _bf16_linear(node: Node, n: int, k: int) -> Node:
    """A stand-in bf16 ``linear`` node of ``node``'s shape and epilogue, to ask the GEMM rules what it would get."""
    x, out = node.inputs[0], node.outputs[0]
    assert x is not None
    bias, residual = (node.inputs[i] if len(node.inputs) > i else None for i in (5, 6))
    w = Value(f"{out.name}{WEIGHT_SUFFIX}", TensorType(DType.bf16, (n, k)))
    return Node(Linear(), [x, w, bias, residual], [out], node.source)


def plan(graph: Graph, launches: Sequence[Launch], target: Target, gemv: bool = True) -> QuantPrefill:
    """The pairs for ``launches`` (``lower.plan_launches``' list); ``gemv``: the quantized GEMV variants take the
    small steps (``INGOT_NO_GEMV`` unset). Changes nothing itself; ``launches`` stays empty when no node is taken."""
    out = QuantPrefill()
    per_node = by_node(launches)
    taken: list[Launch] = []
    names = {v.name for v in graph.inputs} | set(graph.weights) | {o.name for n in graph.nodes for o in n.outputs}
    for i, node, spec, args in launches:
        types = [v.type if v is not None else None for v in node.inputs]
        shape = dequant.applies(node.op, types, target) if node.op.name == "quantized_linear" else None
        w8a8 = shape is None and node.op.name == "quantized_linear" and w8a8_decline_reason(node, target) is None
        rows = args.get("M", {}).get("dim")
        variants = quant_variants(node.op, types, target) if gemv and (shape is not None or w8a8) else []
        if variants and spec is not None and dict(spec.values).get("ANY_M", False):
            variants.append((GEMV_MAX_ROWS, spec))  # the node's own any-M GEMV, now the largest variant
        if variants:  # the GEMV keeps the steps of up to W8A8_GEMM_ROWS / WO_GEMM_ROWS rows (a static count too)
            most = w8a8_gemm_rows() if w8a8 else wo_gemm_rows()
            variants = [(mr, v) for mr, v in variants if mr <= most]
        if ((shape is None and not w8a8) or spec is None or len(per_node[i]) != 1 or rows is None
                or (variants and isinstance(rows, int) and rows <= variants[-1][0])):
            taken.append((i, node, spec, args))
            continue
        if w8a8:
            _plan_w8a8(out, taken, i, node, args, variants, target, names)
            continue
        n, k, fmt = shape.n, shape.k, shape.weight_format
        scratch, scale = f"{node.outputs[0].name}{WEIGHT_SUFFIX}", f"{node.outputs[0].name}{SCALE_SUFFIX}"
        if {scratch, scale} & names:
            raise ValueError(f"quant-prefill-gemm: a value is named like the scratch of {node.outputs[0].name}")
        column_scale = args["weight_scale"] if fmt == "fp8" else {"buffer": scale}
        dq_args = {"weight": args["weight"], "weight_scale": args["weight_scale"],
                   "weight_scale_2": args["weight_scale_2"], "out": {"buffer": scratch},
                   "out_scale": {"null": True} if fmt == "fp8" else {"buffer": scale}, "M": args["M"]}
        gemm_args = {"x": args["x"], "weight": {"buffer": scratch}, "weight_scale": column_scale,
                     "bias": args["bias"], "residual": args["residual"], "out": args["out"], "M": args["M"]}
        plain = linear_spec(DType.bf16, DType.bf16, n, k, target, bias="buffer" in args["bias"],
                            residual="buffer" in args["residual"], weight_scale=True)
        primary = cutlass_params.plan_linear(_bf16_linear(node, n, k), plain, target)
        dq = dequant.dequant_spec(fmt, n, k, target)
        for s, a in ((dq, dq_args), (primary or plain, gemm_args)):
            if {p.name for p in s.params} != set(a):  # the binding and the kernel must agree, as in plan_launches
                raise ValueError(f"quant-prefill-gemm: {s.entry} takes {sorted(p.name for p in s.params)}, "
                                 f"bound {sorted(a)}")
        jd, jg = len(taken), len(taken) + 1
        taken += [(i, node, dq, dq_args), (i, node, primary or plain, gemm_args)]
        if primary is not None:
            out.alternatives[jg] = plain
        if variants:
            out.variants[jg] = variants
            out.variant_args[jg] = dict(args)
            out.skips[jd] = ("M", variants[-1][0])
            out.into[jd] = jg
        out.temporaries[scratch] = (i, TensorType(DType.bf16, (n, k)))
        if fmt != "fp8":
            out.temporaries[scale] = (i, TensorType(DType.f32, (n,)))
    if out.temporaries:
        out.launches = taken
    return out


def _plan_w8a8(out: QuantPrefill, taken: list[Launch], i: int, node: Node, args: Mapping[str, Any],
               variants: list[tuple[int, KernelSpec]], target: Target, names: set[str]) -> None:
    """A W8A8 FP8 linear's pair, appended to ``taken`` and recorded in ``out``: the activation quantizer (x -> e4m3
    codes + per-row scales, memory-plan temporaries) and the FP8 CUTLASS GEMM reading them with the weight's own
    per-channel scale; the W8A8 GEMV (``variants``, up to ``W8A8_GEMM_ROWS``) for the steps they cover."""
    o = node.outputs[0]
    assert node.inputs[1] is not None and node.inputs[1].type.shape is not None
    n, k = int(node.inputs[1].type.shape[0]), int(node.op.in_features)
    x_fp8, x_scale = f"{o.name}{X_FP8_SUFFIX}", f"{o.name}{X_SCALE_SUFFIX}"
    if {x_fp8, x_scale} & names:
        raise ValueError(f"quant-prefill-gemm: a value is named like the scratch of {o.name}")
    static = node.op.act_granularity == "tensor"
    q_args = {"x": args["x"], "input_scale": args["input_scale"] if static else {"null": True},
              "x_fp8": {"buffer": x_fp8}, "x_scale": {"buffer": x_scale}, "M": args["M"]}
    gemm_args = {"x": {"buffer": x_fp8}, "weight": args["weight"], "x_scale": {"buffer": x_scale},
                 "weight_scale": args["weight_scale"], "bias": args["bias"], "residual": args["residual"],
                 "out": args["out"], "M": args["M"]}
    quantizer = fp8_quantizer_spec(k, target, static)
    if node.op.weight_granularity == "block":  # the default configuration's block-rows build (w8a8_decline_reason)
        gemm = cutlass_params.generic_linear_spec("fp8", target, residual="buffer" in args["residual"],
                                                  weight_scales="block-rows")
    else:
        gemm = cutlass_params.generic_linear_spec("fp8", target, residual="buffer" in args["residual"],
                                                  config=shape_config("fp8", n, k, target))
    for s, a in ((quantizer, q_args), (gemm, gemm_args)):
        if {p.name for p in s.params} != set(a):  # the binding and the kernel must agree, as in plan_launches
            raise ValueError(f"quant-prefill-gemm: {s.entry} takes {sorted(p.name for p in s.params)}, "
                             f"bound {sorted(a)}")
    jq, jg = len(taken), len(taken) + 1
    taken += [(i, node, quantizer, q_args), (i, node, gemm, gemm_args)]
    if variants:
        out.variants[jg] = variants
        out.variant_args[jg] = dict(args)
        out.skips[jq] = ("M", variants[-1][0])
        out.into[jq] = jg
    codes, scales = _w8a8_types(node)
    out.temporaries[x_fp8], out.temporaries[x_scale] = (i, codes), (i, scales)


def _w8a8_types(node: Node) -> tuple[TensorType, TensorType]:
    """The types of a W8A8 linear's quantized activations: e4m3 codes [rows, K] and per-row f32 scales [rows]."""
    x = node.inputs[0]
    assert x is not None
    rows = token_rows(x)
    return TensorType(DType.f8e4m3fn, (rows, int(node.op.in_features))), TensorType(DType.f32, (rows,))


def temporaries(graph: Graph, table: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, TensorType]]:
    """The scratch buffers a kernel table's dequantize and W8A8 quantizer launches write, as ``plan_memory``'s
    ``temporaries`` (what ``lower_for_target`` planned; for tests and tools that rebuild an artifact's memory plan)."""
    found: dict[str, tuple[int, TensorType]] = {}
    for ln in table:
        if str(ln.get("kernel", "")).startswith("quant_act_fp8_"):  # W8A8: the quantized activations
            codes, scales = _w8a8_types(graph.nodes[int(ln["node"])])
            found[ln["args"]["x_fp8"]["buffer"]] = (int(ln["node"]), codes)
            found[ln["args"]["x_scale"]["buffer"]] = (int(ln["node"]), scales)
            continue
        if not str(ln.get("kernel", "")).startswith("dequant_"):
            continue
        node = graph.nodes[int(ln["node"])]
        w = node.inputs[1]
        assert w is not None and w.type.shape is not None
        n, k = int(w.type.shape[0]), int(getattr(node.op, "in_features", 0))
        found[ln["args"]["out"]["buffer"]] = (int(ln["node"]), TensorType(DType.bf16, (n, k)))
        if "buffer" in ln["args"]["out_scale"]:
            found[ln["args"]["out_scale"]["buffer"]] = (int(ln["node"]), TensorType(DType.f32, (n,)))
    return found
