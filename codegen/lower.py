"""Lowering a graph to CUDA for a GPU target: kernels, kernel table, memory plan (the artifact's ``cuda`` entry).

``lower_for_target(graph, target, workdir)`` does, in order (``plan_kernels(graph, target)``: steps 0-2 alone, the
``KernelPlan`` with nothing compiled):

0. **serving-fuse** (serving form only; ``INGOT_NO_SERVING_FUSE=1`` skips it): the ``split`` copies of the fused
   qkv / gate_up outputs are folded into ``rope_qkv`` and a packed ``swiglu`` (``passes/fuse_split_*.py``); here
   because quantization and tensor-parallel sharding, which run before the lowering, read the split form.
1. **Types** (serving form only): weights, activations and the KV cache become bf16 (kernels
   accumulate in f32); f32 inputs that kernels read as f32 stay f32 (``F32_INPUTS``: RoPE tables, the
   quantization scales ``weight_scale``/``weight_scale_2``/``input_scale`` of ``quantized_linear`` and
   ``kv_scale`` of ``paged_attention_fp8``); quantized codes (f8e4m3fn, packed u8 E2M1) and an FP8 KV
   cache keep their types; a final ``cast`` keeps the ``logits`` output f32, so the graph still
   satisfies docs/SERVING_FORM.md and the CPU backend can run it too. Graph mode keeps the model's own
   types.
2. **Kernels**: one or more launches per node, from the family rules (``codegen/registry.py``;
   ``split``/``gather``/``cast`` through ``codegen/kernels/copy``). Nodes no family takes are
   collected and reported together (``LoweringError`` names every op without a kernel).
   After autotuning, **decode fusion** (below) gives some linears' small-row variants the preceding norm or
   activation as a prologue and marks that launch to be skipped at those row counts.
3. **Compile** every unique kernel (cubin for the target's arch + PTX) through the cached driver
   (``codegen/compile.py``) into ``workdir/kernels/<entry>.{cu,cubin,ptx}``; the shape-generic CUTLASS kernels
   (nvcc: cubin and Params probe) all start at once, at most ``$INGOT_CUTLASS_JOBS`` nvcc running at a time.
4. **Memory plan** (``codegen/memory_plan.py``) at the bound dims.

The manifest's ``cuda`` entry (``CUDA_FORMAT`` 1)::

    {"format": 1, "arch": "sm_90a", "target": "h200", "compiler": "nvrtc-13.5",
     "activation_dtype": "bf16", "limits": {"max_num_batched_tokens": 2048, ...},
     "kernels": {entry: {"source": "kernels/E.cu", "cubin": "kernels/E.cubin", "ptx": "kernels/E.ptx",
                         "params": [[name, ctype], ...], "block": [x, y, z], "smem": 0,
                         "grid": [{"size": "num_tokens", "tile": 1, "const": 1}, ...], "spec": {...}}},
     "launches": [{"kernel": entry, "node": 3, "op": "linear", "source": "layers.0",
                   "args": {"x": {"buffer": "h"}, "bias": {"null": true}, "M": {"dim": "T"}}}],
     "memory_plan": {...}}

A launch may carry ``"variants": [{"kernel": entry, "max_rows": 8}, ...]`` (smallest first): kernels taking
the same arguments that the executor runs instead of ``kernel`` when the launch's ``M`` argument (the step's
row count) is at most ``max_rows`` -- the decode GEMV family (``codegen/kernels/gemv``) for ``linear``
(``codegen/registry.py`` ``plan_variants``). Their kernels are listed under ``variant_kernels`` (same entry
format as ``kernels``). ``INGOT_NO_GEMV=1`` at compile time leaves them out. A launch whose row count is another
argument names it: ``"rows_arg": "num_tokens"`` -- the bf16 ``paged_attention`` launch, whose ``kernel`` is the
tensor-core prefill kernel and whose variant is the decode kernel the family rule picked, for steps of at most
``DECODE_MAX_ROWS`` tokens (``codegen/kernels/attention/prefill_rule.py``; ``INGOT_NO_PREFILL_FLASH=1`` leaves the
prefill kernel out).

**Decode fusion** (``codegen/decode_fusion.py``; on unless ``INGOT_DECODE_FUSION=0``): an ``rms_norm`` or
packed ``swiglu`` launch whose output only the next ``linear`` reads gets ``"skip": {"max_rows": 8, "into": j}``
and a ``rows_arg`` (``rows`` / ``num_tokens``): the executor launches nothing for it in steps of at most
``max_rows`` rows, because launch ``j``'s variants up to that row count compute its output themselves. Those
variants have their own arguments, ``"args"`` (same format as the launch's), since they read the skipped launch's
input (``x``: the norm's input or the gate_up buffer; ``norm_weight``: the norm's weight)::

    {"kernel": "rms_norm_bf16_h2048_...", "op": "rms_norm", "rows_arg": "rows", "skip": {"max_rows": 8, "into": 7},
     "args": {...}}
    {"kernel": "linear_bf16_...", "op": "linear", "args": {"x": {"buffer": "mlp_norm"}, ...},
     "variants": [{"kernel": "gemv_bf16_n16384_k2048_m8_rms_norm_...", "max_rows": 8,
                   "args": {"x": {"buffer": "attn_out"}, "norm_weight": {"buffer": "...norm.weight"}, ...}},
                  {"kernel": "gemv_bf16_n16384_k2048_m16_...", "max_rows": 16}, ...]}

A fused variant's kernel entry carries the autotune record of the plain variant it was made from (its
configuration) with ``"tuned_as"``: that variant's entry.

**Quantized prefill GEMM** (``codegen/quant_prefill.py``; on unless ``INGOT_QUANT_PREFILL_GEMM=0``): a weight-only
``quantized_linear`` becomes a dequantize launch (bf16 weight into a memory-plan temporary; ``"skip"`` up to the
largest GEMV bucket, ``into`` the next launch) and the bf16 GEMM a ``linear`` of that shape gets, reading it, whose
variants are the quantized GEMV buckets with their own ``"args"``; a W8A8 FP8 one the FP8 activation quantizer
(e4m3 codes and row scales into temporaries, skipped the same way) and the FP8 CUTLASS GEMM reading them.

**Rope-cache fusion** (``codegen/rope_cache_fusion.py``; on unless ``INGOT_ROPE_CACHE_FUSION=0``): a ``rope_qkv``
launch whose k and v only a paged attention reads becomes ``codegen/kernels/rope/qkv_cache.cu``, which writes them
straight into the KV cache (arguments ``qkv``, ``positions``, ``cos``, ``sin``, ``q``, ``kv_cache``, ``slot_mapping``,
``kv_scale``, ``num_tokens``), and that attention's cache-write launch is left out of the table.

On tcgen05 targets (b200) a bf16 ``linear``'s ``kernel`` is a shape-generic CUTLASS GEMM (``codegen/kernels/
gemm_cutlass/cutlass_params.py``): its kernel entry has ``"cutlass"``, the layout of its Params blob, which the
runtime fills in Python (TMA descriptors through ``cuTensorMapEncodeTiled``; no shipped host code), and the
launch has ``"alternatives": [{"kernel": entry}]``, the plain template GEMM taking the same arguments, which a
runtime without the CUTLASS launch path runs instead (listed under ``alternative_kernels``, same entry format).
``INGOT_NO_CUTLASS=1`` at compile time leaves CUTLASS out.

**Short steps on CUTLASS** (h100/h200; ``INGOT_CUTLASS_SHORT_M=0`` at compile time leaves them out): a CUTLASS
launch of a narrow matrix (its own configuration's 128-row tiles would run fewer tiles than the GPU has SMs at 256
rows, each over at least 256 KB of weights: a 1B model's qkv, o, down and a small-vocabulary lm_head) ends its
variants with the same GEMM (kind, residual) in 64-row-tile ping-pong configurations,
``{"kernel": "linear_cutlass_bf16_pp64x64x64c2x1_...", "max_rows": 256}`` (and for K >= 8192
``{"kernel": "linear_cutlass_bf16_res_pp64x128x64c2x1_...", "max_rows": 512}``), which take the launch's arguments:
the steps past the GEMV buckets (bf16: from 65 rows; W8A8 FP8: from 17) run them instead of the prefill
configuration (``gemm_cutlass/rule.py`` ``SHORT_M_TIERS``, ``cutlass_params.short_variants``; their kernel entries
under ``variant_kernels`` have their own ``"cutlass"`` layout). They replace the skinny GEMM's any-M variant where
that applied.

On FP4 targets (b200) a W4A4 NVFP4/MXFP4 ``quantized_linear`` (weight scales swizzled by ``pack-sm100``) is two
launches of its node (``codegen/kernels/gemm_cutlass/blockscaled_rule.py``): the activation quantizer
(``codegen/kernels/quant_act``: packed E2M1 codes, swizzled block scales and the per-row product of the global
scales, into memory-plan temporaries ``<out>.x_fp4``, ``<out>.x_block_scale``, ``<out>.x_scale``) and the
shape-generic block-scaled CUTLASS GEMM reading them (a ``"cutlass"`` layout like the bf16 ones; no alternative).

Where the compiling machine has a GPU of the target's architecture, the tunable kernels (decode GEMV variants,
split-KV attention) are autotuned before compiling (``codegen/autotune.py``; ``INGOT_AUTOTUNE=0`` turns it off):
the chosen kernel's entry then has ``"autotune": {"heuristic": entry, "heuristic_us", "chosen_us", "config", ...}``
and ``cuda`` has ``"autotune": {"gpu", "sm", "driver", "kernels", "changed"}``; without tuning neither key exists.

An argument is ``{"buffer": value name}`` (a device pointer: the value's offset in the arena),
``{"null": true}`` (an absent optional input), ``{"dim": expression}`` (an integer evaluated from the
step's bound dims, ``T``, ``(S+1)``, ...) or ``{"value": number}``. The grid of a launch comes from
its kernel's grid expressions over its integer arguments (``KernelSpec.grid_dims``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ..ir.graph import Graph, Node, Value, Weight
from ..ir.ops.core import Cast
from ..ir.types import Dim, DType, TensorType, shape_numel
from . import autotune, decode_fusion, qkv_rope_fusion, quant_prefill
from .compile import compile_source, compile_spec, nvcc_version, nvrtc_version
from .kernel import KernelSpec, has_pdl
from .kernels.attention import prefill_rule
from .kernels.copy.rule import plan as plan_copy
from .kernels.gemm_cutlass import blockscaled_rule, cutlass_params
from .kernels.gemv import rule as gemv_rule
from .kernels.gemv import skinny_rule
from .launch_list import Launch, by_node, token_rows
from .memory_plan import KV_DIM, plan_memory
from .registry import plan_node, plan_variants
from .rope_cache_fusion import fuse as fuse_rope_cache
from .target import Target, get_target
from .tvm import rule as tvm_rule

CUDA_FORMAT = 1
#: defaults for the serving form's bound dims (runtime/engine.py EngineArgs' defaults)
DEFAULT_LIMITS = {"max_num_batched_tokens": 2048, "max_num_seqs": 256}


class LoweringError(ValueError):
    """The graph cannot be lowered to CUDA for the target; the message says which nodes and why."""


# -- 1. types -------------------------------------------------------------------------------------


def _bf16_loader(w: Weight) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        a = np.asarray(w.load(), np.float32)
        w.release()
        return a.astype(ml_dtypes.bfloat16)

    return load


#: op -> input positions that kernels read as f32 (kept f32 by ``to_device_dtypes``): RoPE tables (accurate
#: angles); ``quantized_linear``'s weight_scale (FP8), weight_scale_2 (NVFP4 global) and input_scale (static
#: activation scale); ``paged_attention_fp8``'s kv_scale. The formats define these scales as float32
#: (docs/QUANTIZATION.md), and the ops' type inference refuses anything else.
F32_INPUTS: dict[str, tuple[int, ...]] = {"rope": (2, 3), "rope_qkv": (2, 3), "quantized_linear": (2, 3, 4),
                                          "paged_attention_fp8": (8,)}


def _read_as_f32(v: Value, users: list[Node]) -> bool:
    """Whether every use of ``v`` is at a position ``F32_INPUTS`` keeps f32."""
    return bool(users) and all(i in F32_INPUTS.get(n.op.name, ()) for n in users
                               for i, u in enumerate(n.inputs) if u is v)


def to_device_dtypes(graph: Graph, dtype: DType = DType.bf16) -> None:
    """Narrow a serving-form graph in place to ``dtype`` weights, activations and KV cache (see the
    module docstring); type inference runs again over every node."""
    users = graph.users()
    for name, v in graph.weight_values.items():
        w = graph.weights[name]
        if w.type.dtype is not DType.f32:
            continue  # quantized codes and their non-f32 scales (e4m3 / e8m0 block scales) stay as they are
        if _read_as_f32(v, users.get(v, [])):
            continue
        nw = Weight(TensorType(dtype, w.type.shape), _bf16_loader(w), w.source)
        graph.weights[name] = nw
        v.type = nw.type
    spec = graph.meta.get("kv_cache")
    for v in graph.inputs:
        if v.type.dtype is DType.f32 and v.type.shape and v.type.shape[0] == KV_DIM:
            v.type = TensorType(dtype, v.type.shape)
    if isinstance(spec, dict) and spec.get("dtype") == DType.f32.value:
        itemsize = dtype.np.itemsize
        spec["bytes_per_token"] = int(spec["bytes_per_token"]) // 4 * itemsize
        spec["dtype"] = dtype.value
    for node in graph.nodes:
        types = node.op.infer([v.type if v is not None else None for v in node.inputs])
        for out, t in zip(node.outputs, types):
            out.type = t
    for i, v in enumerate(graph.outputs):
        if v.type.dtype is dtype:
            cast = graph.add1(Cast(to=DType.f32), [v], graph.fresh_name(f"{v.name}.f32"), "output cast")
            graph.outputs[i] = cast


# -- 2. kernels and their arguments ---------------------------------------------------------------


def _buf(v: Value | None) -> dict[str, Any]:
    return {"null": True} if v is None else {"buffer": v.name}


def _dim(d: Dim) -> dict[str, Any]:
    return {"dim": d}


def _rows(v: Value) -> dict[str, Any]:
    return _dim(token_rows(v))


def _in(node: Node, i: int) -> Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def bind_args(node: Node, specs: list[KernelSpec]) -> list[dict[str, dict[str, Any]]]:
    """Each launch's arguments by parameter name (see the module docstring)."""
    op, x, out = node.op.name, node.inputs[0], node.outputs[0]
    assert x is not None
    if op == "embedding":
        ids = node.inputs[1]
        assert ids is not None
        return [{"table": _buf(x), "ids": _buf(ids), "out": _buf(out), "num_tokens": _dim(ids.type.shape[0]),
                 "vocab": _dim(x.type.shape[0])}]
    if op in ("rms_norm", "layer_norm"):
        return [{"x": _buf(x), "weight": _buf(node.inputs[1]), "bias": _buf(_in(node, 2)), "residual": _buf(None),
                 "residual_out": _buf(None), "out": _buf(out), "rows": _rows(x)}]
    if op == "rope":
        return [{"x": _buf(x), "positions": _buf(node.inputs[1]), "cos": _buf(node.inputs[2]),
                 "sin": _buf(node.inputs[3]), "out": _buf(out), "num_tokens": _dim(x.type.shape[0])}]
    if op == "rope_qkv":  # codegen/kernels/rope/qkv.cu
        q, k, v = node.outputs
        return [{"qkv": _buf(x), "positions": _buf(node.inputs[1]), "cos": _buf(node.inputs[2]),
                 "sin": _buf(node.inputs[3]), "q": _buf(q), "k": _buf(k), "v": _buf(v),
                 "num_tokens": _dim(x.type.shape[0])}]
    if op == "swiglu":  # packed: both halves from one buffer, the kernel offsets b by the width
        b = x if getattr(node.op, "packed", False) else node.inputs[1]
        return [{"a": _buf(x), "b": _buf(b), "out": _buf(out), "num_tokens": _rows(x)}]
    if op == "linear":
        return [{"x": _buf(x), "weight": _buf(node.inputs[1]), "weight_scale": _buf(None),
                 "bias": _buf(_in(node, 2)), "residual": _buf(_in(node, 3)), "out": _buf(out), "M": _rows(x)}]
    if op == "quantized_linear":  # codegen/kernels/gemv/quant_rule.py PARAMS: the op's inputs by name
        names = ("weight", "weight_scale", "weight_scale_2", "input_scale", "bias", "residual")
        return [{"x": _buf(x), **{nm: _buf(_in(node, i)) for i, nm in enumerate(names, 1)}, "out": _buf(out),
                 "M": _rows(x)}]
    if op in ("paged_attention", "paged_attention_fp8"):
        q, k, v, cache, tables, lens, starts, slots = node.inputs[:8]
        assert k is not None and tables is not None and lens is not None
        write = {"k": _buf(k), "v": _buf(v), "kv_cache": _buf(cache), "slot_mapping": _buf(slots),
                 "num_tokens": _dim(k.type.shape[0])}
        attend = {"q": _buf(q), "kv_cache": _buf(cache), "block_tables": _buf(tables), "seq_lens": _buf(lens),
                  "query_start_loc": _buf(starts), "out": _buf(out), "num_tokens": _dim(x.type.shape[0]),
                  "num_seqs": _dim(lens.type.shape[0]), "max_blocks": _dim(tables.type.shape[1])}
        if op == "paged_attention_fp8":  # both launches read the static K/V scales (split_rule.py FP8_*_PARAMS)
            write["kv_scale"] = attend["kv_scale"] = _buf(node.inputs[8])
        return [write, attend]
    if op == "arg_max":
        return [{"logits": _buf(x), "tokens": _buf(out), "num_rows": _dim(x.type.shape[0])}]
    if op == "split":
        return [{"src": _buf(x), "index": _buf(None), "dst": _buf(o), "rows": _rows(x), "src_rows": _rows(x)}
                for o in node.outputs]
    if op == "gather":
        idx = node.inputs[1]
        assert idx is not None
        return [{"src": _buf(x), "index": _buf(idx), "dst": _buf(out), "rows": _dim(idx.type.shape[0]),
                 "src_rows": _dim(x.type.shape[0])}]
    if op == "cast":
        return [{"src": _buf(x), "index": _buf(None), "dst": _buf(out), "rows": _rows(x), "src_rows": _rows(x)}]
    raise LoweringError(f"{op}: the CUDA lowering does not know how to bind this op's kernel arguments")


def plan_launches(graph: Graph, target: Target) -> list[Launch]:
    """(node index, node, spec, arguments) per launch, in order; raises ``LoweringError`` naming every
    op without a kernel for ``target``. An ``all_reduce`` (a tensor-parallel rank's graph) has spec None:
    its launch entry is ``{"collective": "all_reduce", "dtype", "args": {x, out, count}}``, run by NCCL."""
    launches = []
    missing: dict[str, list[str]] = {}
    notes: dict[str, None] = {}  # why quantized_linear nodes have no kernel, once each, in order
    for i, node in enumerate(graph.nodes):
        specs = None
        if node.op.name == "all_reduce":  # tensor parallelism: NCCL, not a kernel (runtime/tp/nccl.py)
            x = node.inputs[0]
            assert x is not None
            launches.append((i, node, None, {"x": _buf(x), "out": _buf(node.outputs[0]),
                                             "count": _dim(shape_numel(x.type.shape or ()))}))
            continue
        if node.op.name == "quantized_linear" and blockscaled_rule.applies(node, target):
            # W4A4 FP4 (b200): the activation quantizer, then the block-scaled CUTLASS GEMM (two launches)
            launches.extend((i, node, spec, args) for spec, args in blockscaled_rule.plan_launches(node, target))
            continue
        if node.op.name in ("split", "gather", "cast"):
            specs = plan_copy(node.op, [v.type if v is not None else None for v in node.inputs], target)
            if specs is None:  # the generated fallback (codegen/tvm)
                specs = plan_node(node, target)
        else:
            specs = plan_node(node, target)
        if specs is None:
            types = ", ".join(str(v.type) if v is not None else "_" for v in node.inputs)
            missing.setdefault(node.op.name, []).append(f"{node.source or node.outputs[0].name} ({types})")
            if node.op.name == "quantized_linear":
                notes.setdefault(_quant_note(node), None)
                if target.fp4_tensor_cores:
                    why = blockscaled_rule.decline_reason(node, target)
                    notes.setdefault(f"quantized_linear on {target.name}: {why}", None)
            continue
        bound = tvm_rule.bind(node, specs) if not specs or specs[0].family == "tvm" else bind_args(node, specs)
        for spec, args in zip(specs, bound):
            names = {p.name for p in spec.params}
            if set(args) != names:
                raise LoweringError(f"{node.op.name}: kernel {spec.entry} takes {sorted(names)}, bound {sorted(args)}")
            launches.append((i, node, spec, args))
    if missing:
        lines = [f"  {op} ({len(where)} node{'s' if len(where) > 1 else ''}), e.g. {where[0]}"
                 for op, where in sorted(missing.items())]
        raise LoweringError(
            f"no CUDA kernel for {len(missing)} op(s) on target {target.name} ({target.arch}):\n" + "\n".join(lines)
            + "".join(f"\n  {n}" for n in notes)
            + "\n" + (tvm_rule.failure_hint(sorted(missing)) or "(or compile for target cpu)"))
    return launches


def _quant_note(node: Node) -> str:
    op = node.op
    fmt, act = getattr(op, "weight_format", "?"), getattr(op, "act_format", "?")
    what = (f"{fmt} weights ({getattr(op, 'weight_granularity', '?')} scales, {getattr(op, 'scale_layout', '?')} "
            f"layout), {act} activations ({getattr(op, 'act_granularity', '?')})")
    return (f"quantized_linear: {what}: the quantized GEMV (codegen/kernels/gemv/quant_rule.py) takes FP8 "
            "per-channel weights with bf16 or FP8 activations and weight-only NVFP4 with linear scales, K a multiple "
            "of 64 (FP8) / 128 (NVFP4); pick such formats in the quant config (on b200 W4A4 NVFP4/MXFP4 scales are "
            "swizzled for CUTLASS by pack-sm100 and run the block-scaled CUTLASS GEMM; weight-only NVFP4 keeps linear "
            "scales for the GEMV; weight-only MXFP4 has no kernel), or compile for target cpu")


def gemv_variant_plans(launches: list[Launch],
                       target: Target) -> dict[int, list[tuple[int, KernelSpec]]]:
    """Launch index -> its small-M variants (``plan_variants``: ``(max rows, spec)``, smallest first) for nodes of
    one launch counting rows in ``M``, where the variants take the launch's arguments and some step can use them."""
    per_node = by_node(launches)
    plans: dict[int, list[tuple[int, KernelSpec]]] = {}
    for j, (i, node, _, args) in enumerate(launches):
        if len(per_node[i]) != 1 or "M" not in args or node.op.name == "all_reduce":
            continue
        found = [(mr, v) for mr, v in plan_variants(node, target) if {p.name for p in v.params} == set(args)]
        rows = args["M"].get("dim")
        if found and not (isinstance(rows, int) and rows > found[-1][0]):
            plans[j] = found
    return plans


# -- 3./4. compile, memory plan, manifest -----------------------------------------------------------


def default_bindings(graph: Graph, limits: Mapping[str, int]) -> dict[str, int]:
    """Bound dims: the serving form's T, S, max_blocks from ``limits``; any other symbol of an input
    from ``limits`` (graph mode), else 1."""
    bindings: dict[str, int] = {}
    spec = graph.meta.get("kv_cache")
    if isinstance(spec, dict):
        T = int(limits.get("max_num_batched_tokens", DEFAULT_LIMITS["max_num_batched_tokens"]))
        S = min(int(limits.get("max_num_seqs", DEFAULT_LIMITS["max_num_seqs"])), T)
        info = graph.meta.get("llm") if isinstance(graph.meta.get("llm"), dict) else {}
        ctx = int(limits.get("max_model_len") or info.get("context_length") or 4096)  # type: ignore[union-attr]
        bindings.update(T=T, S=S, max_blocks=math.ceil(ctx / int(spec["block_size"])))
    for v in graph.inputs:
        for d in v.type.shape or ():
            if isinstance(d, str) and d.isidentifier() and d != KV_DIM and d not in bindings:
                bindings[d] = int(limits.get(d, 1))
    return bindings


@dataclass
class KernelPlan:
    """What ``lower_for_target`` decides before it compiles anything (``plan_kernels``): each launch with its kernel
    spec (a CUTLASS GEMM where one applies, autotuned where this machine could), the specs kept beside them
    (``alternatives``: the plain GEMM beside CUTLASS's, by launch index), each launch's decode variants as (max rows,
    spec, its own arguments or None) smallest first with decode fusion and the qkv rope fusion in place
    (``variant_lists``), the launches decode steps skip (``skips``: launch -> (rows argument, max rows); ``into``: the
    launch that computes them instead), the row-count argument of the launches whose variants it picks
    (``rows_args``), the autotuning results (``tuned``, ``records`` by spec key), the dims the memory plan binds and
    the quantized prefill's temporaries."""

    serving: bool
    launches: list[Launch]
    alternatives: dict[int, KernelSpec]
    variant_lists: dict[int, list[tuple[int, KernelSpec, Any]]]
    skips: dict[int, tuple[str, int]]
    into: dict[int, int]
    rows_args: dict[int, str]
    tuned: dict[str, Any]
    records: dict[str, Any]
    bindings: dict[str, int]
    temporaries: dict[str, Any] = field(default_factory=dict)


def plan_kernels(graph: Graph, target: Target | str, *, limits: Mapping[str, int] | None = None,
                 progress: Callable[[str, int, int], None] | None = None) -> KernelPlan:
    """Steps 0-2 of ``lower_for_target`` (the module docstring): ``graph`` changed in place as there, its launches
    and decode variants planned and autotuned where this machine has a GPU of the target's architecture, nothing
    compiled."""
    tgt = get_target(target)
    if not tgt.is_gpu:
        raise LoweringError(f"target {tgt.name!r} is not a GPU target")
    limits = dict(limits or {})
    serving = isinstance(graph.meta.get("kv_cache"), dict)
    if serving:
        if os.environ.get("INGOT_NO_SERVING_FUSE", "") in ("", "0"):
            _serving_fuse(graph, tgt)
        to_device_dtypes(graph, DType.bf16)
    else:  # graph mode: static shapes and constants as weights where generated kernels are needed
        from .tvm.specialize import SpecializeError, prepare_graph

        try:
            prepare_graph(graph, tgt, limits)
        except SpecializeError as e:
            raise LoweringError(str(e)) from None
    launches = plan_launches(graph, tgt)
    # rope_qkv writes k and v into the KV cache, the attention's cache write dropped (unless INGOT_ROPE_CACHE_FUSION=0)
    launches = fuse_rope_cache(graph, launches, tgt)
    gemv = os.environ.get("INGOT_NO_GEMV", "") in ("", "0")
    # prefill steps of weight-only quantized linears: dequantize + the bf16 GEMM (on unless INGOT_QUANT_PREFILL_GEMM=0)
    prefill = (quant_prefill.plan(graph, launches, tgt, gemv) if quant_prefill.enabled()
               else quant_prefill.QuantPrefill())
    launches = prefill.launches or launches
    # bf16 linears: CUTLASS first, the plain GEMM kept beside it
    alternatives: dict[int, KernelSpec] = dict(prefill.alternatives)
    for j, (i, node, spec, args) in enumerate(launches):
        if spec is None:
            continue
        primary = cutlass_params.plan_linear(node, spec, tgt)
        if primary is not None:
            alternatives[j], launches[j] = spec, (i, node, primary, args)
    variant_plans = {**gemv_variant_plans(launches, tgt), **prefill.variants} if gemv else {}
    rows_args: dict[int, str] = {}
    if os.environ.get("INGOT_NO_PREFILL_FLASH", "") in ("", "0"):  # prefill steps: tensor-core attention
        for j, (i, node, spec, args) in enumerate(launches):
            if spec is None or node.op.name != "paged_attention" or prefill_rule.ROWS_ARG not in args:
                continue
            flash = prefill_rule.plan_prefill(spec, args[prefill_rule.ROWS_ARG].get("dim", ""), tgt)
            if flash is not None:
                launches[j] = (i, node, flash, args)
                variant_plans[j] = [(prefill_rule.DECODE_MAX_ROWS, spec)]
                rows_args[j] = prefill_rule.ROWS_ARG
    bindings = default_bindings(graph, limits)
    # shape-generic CUTLASS kernels are tuned per launch shape: autotuning is asked about each launch's shaped spec
    asked = [cutlass_params.tuning_spec(s, node) for _, node, s, _ in launches]
    tuned = _autotune([a for a in asked if a is not None]
                      + [v for found in variant_plans.values() for _, v in found], tgt, bindings, progress)
    if tuned:
        launches = [(i, node, tuned[a.key].chosen if a is not None and a.key in tuned else s, args)
                    for (i, node, s, args), a in zip(launches, asked)]
        variant_plans = {j: [(mr, tuned[v.key].chosen if v.key in tuned else v) for mr, v in found]
                         for j, found in variant_plans.items()}
    records = {r.chosen.key: r.record() for r in tuned.values()}
    # decode steps: rms_norm / swiglu computed in the next linear's GEMV variant, their launches skipped
    fusion = (decode_fusion.plan(graph, launches, variant_plans, tgt, prefill.variant_args)
              if decode_fusion.enabled() else decode_fusion.DecodeFusion())
    for key, plain in fusion.made_from.items():  # a fused variant runs the configuration tuned for its plain one
        if plain.key in records:
            records[key] = {**records[plain.key], "tuned_as": plain.entry}
    variant_lists = {j: [(mr, v, None) for mr, v in found] for j, found in variant_plans.items()}
    variant_lists.update(prefill.variant_lists(variant_plans))
    variant_lists.update(fusion.variants)  # a fused quantized linear's list holds its variants' own arguments
    skips, into = {**fusion.skips, **prefill.skips}, {**fusion.into, **prefill.into}
    # decode steps: the qkv GEMV rotates q / k and writes the KV cache, the rope launch skipped
    # (INGOT_QKV_ROPE_FUSION=0: off)
    if gemv and qkv_rope_fusion.enabled():
        rope = qkv_rope_fusion.plan(graph, launches, variant_lists, tgt)
        for key, made in rope.made_from.items():
            base = fusion.made_from.get(made.key, made)
            if base.key in records:
                records[key] = {**records[base.key], "tuned_as": base.entry}
        variant_lists.update(rope.variants)
        skips.update(rope.skips)
        into.update(rope.into)
    # steps past the GEMV buckets on narrow matrices, up to 256 rows (512 with long reductions): the CUTLASS GEMM in
    # 64-row-tile configurations (gemm_cutlass/rule.py SHORT_M_TIERS; INGOT_CUTLASS_SHORT_M=0: off), in place of the
    # skinny GEMM's any-M variant where that had them (faster at every row count measured: docs/PERF.md "Short steps
    # on CUTLASS")
    for j, (_, node, spec, _) in enumerate(launches):
        found = [v for v in variant_lists.get(j, []) if v[0] <= gemv_rule.BUCKETS[-1]]
        shorts = cutlass_params.short_variants(node, spec, max((mr for mr, _, _ in found), default=0), tgt) \
            if spec is not None else []
        if shorts:
            variant_lists[j] = [*found, *((mr, s, None) for mr, s in shorts)]
    return KernelPlan(serving=serving, launches=launches, alternatives=alternatives, variant_lists=variant_lists,
                      skips=skips, into=into, rows_args=rows_args, tuned=tuned, records=records, bindings=bindings,
                      temporaries=dict(prefill.temporaries))


def lower_for_target(graph: Graph, target: Target | str, workdir: str | Path, *,
                     limits: Mapping[str, int] | None = None, compiler: str = "auto",
                     progress: Callable[[str, int, int], None] | None = None) -> tuple[dict[str, Path], dict[str, Any]]:
    """Lower ``graph`` (changed in place: types, see step 1) for a GPU ``target``. Returns the files
    to add to the artifact (``kernels/...`` -> path under ``workdir``) and the manifest entries
    (``cuda``, and ``kv_cache`` for the serving form). Tunable kernels are autotuned first where this machine
    has a GPU of the target's architecture (``codegen/autotune.py``; ``progress`` reports it). ``plan_kernels`` is
    its planning alone."""
    tgt = get_target(target)
    limits = dict(limits or {})
    kp = plan_kernels(graph, tgt, limits=limits, progress=progress)
    serving, launches, alternatives, variant_lists = kp.serving, kp.launches, kp.alternatives, kp.variant_lists
    skips, into, rows_args, tuned, records, bindings = (kp.skips, kp.into, kp.rows_args, kp.tuned, kp.records,
                                                       kp.bindings)
    kdir = Path(workdir) / "kernels"
    kdir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    kernels: dict[str, Any] = {}
    compiler_name = None

    # the shape-generic CUTLASS kernels (cubin and Params probe each: minutes of nvcc cold) are all built side by side
    # from the start, at most $INGOT_CUTLASS_JOBS nvcc at a time (gemm_cutlass/build.py), not one kernel after the
    # other; the loops below take their results in the same order as before
    generic = {s.entry: s for s in (*(s for _, _, s, _ in launches), *alternatives.values(),
                                    *(v for found in variant_lists.values() for _, v, _ in found))
               if s is not None and cutlass_params.is_generic(s)}
    builds = ThreadPoolExecutor(max(1, len(generic)), thread_name_prefix="ingot-cutlass")
    prebuilt: dict[str, Future] = {entry: builds.submit(cutlass_params.build_linear, s) for entry, s in generic.items()}

    def compile_kernel(spec: KernelSpec) -> dict[str, Any]:
        nonlocal compiler_name
        layout = None
        if spec.family == "gemm_cutlass" and spec.value("ABI") == cutlass_params.ABI:
            built, layout = prebuilt[spec.entry].result()  # every generic spec below is in ``generic``
        else:
            built = (compile_source(tvm_rule.source(spec), spec.arch, f"{spec.entry}.cu", compiler=compiler)
                     if spec.family == "tvm" else compile_spec(spec, compiler=compiler))
        compiler_name = nvrtc_version() if built.compiler == "nvrtc" else nvcc_version()
        entry = spec.entry
        src = tvm_rule.source(spec) if spec.family == "tvm" else spec.source()
        for suffix, data in ((".cu", src.encode()), (".cubin", built.cubin), (".ptx", built.ptx.encode())):
            (kdir / f"{entry}{suffix}").write_bytes(data)
            files[f"kernels/{entry}{suffix}"] = kdir / f"{entry}{suffix}"
        d = spec.to_dict()
        return {
            "source": f"kernels/{entry}.cu", "cubin": f"kernels/{entry}.cubin", "ptx": f"kernels/{entry}.ptx",
            "params": d["params"], "block": d["block"], "grid": d["grid"], "smem": d["smem"], "spec": d,
            **({"cutlass": layout} if layout is not None else {}),
            **({"autotune": records[spec.key]} if spec.key in records else {}),
            **({"pdl": True} if has_pdl(src) else {}),
        }

    try:
        for _, _, spec, _ in launches:
            if spec is not None and spec.entry not in kernels:
                kernels[spec.entry] = compile_kernel(spec)
        alternative_kernels: dict[str, Any] = {}
        for spec in alternatives.values():
            if spec.entry not in alternative_kernels:
                alternative_kernels[spec.entry] = compile_kernel(spec)
        variant_kernels: dict[str, Any] = {}
        launch_variants: dict[int, list[dict[str, Any]]] = {}
        for j, found in variant_lists.items():
            launch_variants[j] = [{"kernel": v.entry, "max_rows": mr, **({"args": a} if a is not None else {})}
                                  for mr, v, a in found]
            for _, v, _ in found:
                if v.entry not in variant_kernels:
                    variant_kernels[v.entry] = compile_kernel(v)
    finally:  # on an error: builds not yet started are dropped, running ones finish
        builds.shutdown(cancel_futures=True)
    for j, (rows_arg, _) in skips.items():
        rows_args[j] = rows_arg
    table = [{"kernel": spec.entry, "node": i, "op": node.op.name, "source": node.source, "args": args,
              **({"variants": launch_variants[j]} if j in launch_variants else {}),
              **({"rows_arg": rows_args[j]} if j in rows_args else {}),
              **({"skip": {"max_rows": skips[j][1], "into": into[j]}} if j in skips else {}),
              **({"alternatives": [{"kernel": alternatives[j].entry}]} if j in alternatives else {})}
             if spec is not None else
             {"collective": node.op.name, "node": i, "op": node.op.name, "source": node.source, "args": args,
              "dtype": node.inputs[0].type.dtype.value, "group_size": node.op.group_size}  # type: ignore
             for j, (i, node, spec, args) in enumerate(launches)]
    # fused variants read their skipped producer's input: it stays live until their node
    temporaries = {**kp.temporaries, **blockscaled_rule.temporaries(graph, tgt)}  # W4A4: quantized x
    # weights a skinny GEMM variant reads through its module's tensor map: whole rows from the region's base
    pitches = skinny_rule.weight_pitches(table, {e: k["spec"] for e, k in variant_kernels.items()})
    plan = plan_memory(graph, bindings, reads=decode_fusion.variant_reads(table), temporaries=temporaries,
                       weight_align=pitches)
    cuda = {
        "format": CUDA_FORMAT,
        "arch": tgt.arch,
        "target": tgt.name,
        "compiler": compiler_name,
        "activation_dtype": DType.bf16.value if serving else None,
        "limits": {**({k: bindings[k] for k in ("T", "S", "max_blocks")} if serving else {}), **limits},
        "kernels": kernels,
        "variant_kernels": variant_kernels,
        **({"alternative_kernels": alternative_kernels} if alternative_kernels else {}),
        "launches": table,
        "memory_plan": plan.to_dict(),
        "switches": compile_switches(),
    }
    if tuned:
        gpu = next(iter(tuned.values())).gpu
        cuda["autotune"] = {"gpu": gpu.name, "sm": gpu.sm, "driver": gpu.driver, "kernels": len(tuned),
                            "changed": sum(r.changed for r in tuned.values())}
    manifest: dict[str, Any] = {"cuda": cuda}
    if serving:
        manifest["kv_cache"] = graph.meta["kv_cache"]
    return files, manifest


def compile_switches() -> dict[str, str]:
    """The ``INGOT_*`` environment variables set (non-empty) while this artifact was compiled, recorded in its
    ``cuda`` entry as ``switches``: several choose kernels at compile time (docs/ENVIRONMENT.md), so a benchmark of
    an artifact can say what it was made with. Directories and caches (``*_DIR``, ``*_CACHE``) and the test suite's
    own variables (second word ``TEST``) are left out: they do not change what is compiled."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("INGOT_") and v.strip()
            and k.split("_")[1] != "TEST" and not k.endswith(("_DIR", "_CACHE"))}


def _serving_fuse(graph: Graph, target: Target) -> None:
    """The ``serving-fuse`` pipeline (``passes/manager.py``): split copies folded into their consumers (swiglu
    over the whole gate_up output, ``rope_qkv`` over the whole qkv output). Here, not in the compile's pass
    pipeline, because quantization and tensor-parallel sharding, which run between the two, read the split form."""
    from ..passes import PassContext, PassError, run_passes

    try:
        run_passes(graph, "serving-fuse", PassContext(target=target.name))
    except PassError as e:
        raise LoweringError(str(e)) from None


def _autotune(specs: list[KernelSpec], target: Target, bindings: Mapping[str, int],
              progress: Callable[[str, int, int], None] | None) -> dict[str, autotune.Result]:
    """Heuristic spec key -> autotune result (``codegen/autotune.py``); ``{}`` where nothing is tuned."""
    try:
        return autotune.autotune_for_lowering(specs, target, bindings, progress)
    except autotune.AutotuneUnavailable as e:
        raise LoweringError(str(e)) from None


def kernel_report(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A summary of an artifact's ``cuda`` entry: launches per op, kernels, arena sizes."""
    cuda = manifest["cuda"]
    ops: dict[str, int] = {}
    for launch in cuda["launches"]:
        ops[launch["op"]] = ops.get(launch["op"], 0) + 1
    return {"arch": cuda["arch"], "kernels": len(cuda["kernels"]), "launches": len(cuda["launches"]),
            "launches_per_op": ops, "regions": cuda["memory_plan"]["regions"], "switches": cuda.get("switches", {})}
