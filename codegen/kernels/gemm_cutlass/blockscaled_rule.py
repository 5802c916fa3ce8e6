"""W4A4 ``quantized_linear`` on FP4 tensor cores (b200): an activation quantizer, then the block-scaled CUTLASS GEMM.

A ``quantized_linear`` with NVFP4 (or MXFP4) weights *and* activations whose weight scales ``pack-sm100`` swizzled
(``scale_layout="sm100"``) becomes two launches of its node::

    quant_act_<fmt>_k<K>[_static]   x bf16[M, K] -> x_fp4 u8[M, K/2], x_block_scale (swizzled), x_scale f32[M]
    linear_cutlass_<fmt>[_res]      out = x_scale[m] * (x_fp4 . x_block_scale) @ (weight . weight_block_scale)^T
                                          + bias (+ residual), bf16

The quantizer (``codegen/kernels/quant_act``) writes what ``quantize_activation`` defines (the CPU reference of
the op); its ``x_scale[m]`` is the product of the global scales, ``input_scale * weight_scale_2`` (static NVFP4)
or ``amax_m / 2688 * weight_scale_2`` (per-row NVFP4), which the GEMM's epilogue applies as its per-row scale
(``common.cuh``: CUTLASS's alpha, per row); MXFP4 has no global scale (``x_scale`` null, read as 1). The GEMM is
``sm100_blockscaled.cu``, shape-generic like the bf16 CUTLASS GEMMs and launched from its cubin with a Params blob
built from the kernel table's layout (``cutlass_params.py``): one build per (format, residual) serves every linear.
Its parameters are named after the layout's pointers (``cutlass_params.POINTERS``), so ``CutlassLaunch`` binds
them as they are.

The quantizer's outputs are temporaries of the memory plan (``temporaries``: named after the node's output,
``<out>.x_fp4`` etc., live during the node), the scale factors sized for ``rows + 127`` rows (enough for the
128-row padding at any row count up to the bound).

Declined (``decline_reason`` says why; the lowering's error names it): weight-only FP4 (no kernel reads the
sm100 scale layout with bf16 activations), activations of another format than the weights', targets without FP4
tensor cores, K not a multiple of 32 or N of 8, no nvcc/CUTLASS on the compiling machine, and
``INGOT_NO_CUTLASS=1`` (no alternative kernel exists).
"""

from __future__ import annotations

import os
from typing import Any

from ....ir.graph import Graph, Node, Value
from ....ir.types import DType, TensorType
from ...kernel import KernelSpec
from ...launch_list import token_rows
from ...target import Target
from ..quant_act.rule import ATOM_ROWS, quantizer_spec, scale_cols
from . import cutlass_params
from .build import cutlass_available
from .rule import OPERANDS, supports

#: the GEMM's parameters: the layout's pointer names (cutlass_params.POINTERS) but weight_scale (no per-column
#: scale here), then M
GEMM_PARAMS = [("x", "ptr"), ("weight", "ptr"), ("x_block_scale", "ptr"), ("weight_block_scale", "ptr"),
               ("x_scale", "ptr"), ("bias", "ptr"), ("residual", "ptr"), ("out", "ptr"), ("M", "i64")]
#: the scratch buffers of one node, by the quantizer's parameter names
SCRATCH = ("x_fp4", "x_block_scale", "x_scale")


def blockscaled_spec(kind: str, target: Target, residual: bool = False) -> KernelSpec:
    """The shape-generic block-scaled GEMM for ``kind`` (nvfp4 | mxfp4) on ``target`` (``GEMM_PARAMS``)."""
    base = cutlass_params.generic_linear_spec(kind, target, residual=residual)
    doc = base.doc + "; A operand from the activation quantizer (codegen/kernels/quant_act)"
    return KernelSpec.make(base.family, base.template, base.name, base.arch, dict(base.values), GEMM_PARAMS,
                           base.block, list(base.grid), smem=base.smem, doc=doc)


def _input(node: Node, i: int) -> Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def decline_reason(node: Node, target: Target) -> str | None:
    """Why ``node`` (a ``quantized_linear``) does not run here, or None when it does."""
    op = node.op
    fmt, act = getattr(op, "weight_format", ""), getattr(op, "act_format", "")
    if fmt not in ("nvfp4", "mxfp4") or getattr(op, "scale_layout", "") != "sm100":
        return "the block-scaled GEMM takes FP4 weights with sm100-swizzled scales (pack-sm100)"
    if act != fmt:
        return (f"the block-scaled GEMM takes {fmt} activations with {fmt} weights (W4A4); weight-only FP4 with "
                f"sm100-swizzled scales has no kernel (use {fmt}:w4a4, nvfp4:wo or fp8 on b200)")
    if not target.fp4_tensor_cores or not supports(fmt, target):
        return f"target {target.name} has no FP4 tensor cores"
    w = node.inputs[1]
    assert w is not None and w.type.shape is not None
    n, k = int(w.type.shape[0]), int(op.in_features)
    if k % OPERANDS[fmt][2] or n % 8:
        return f"the block-scaled GEMM needs K % {OPERANDS[fmt][2]} == 0 and N % 8 == 0, got N={n} K={k}"
    if os.environ.get("INGOT_NO_CUTLASS", "") not in ("", "0"):
        return "INGOT_NO_CUTLASS=1 leaves CUTLASS out, and the block-scaled CUTLASS GEMM is the only W4A4 kernel"
    if not cutlass_available():
        return "the block-scaled GEMM is a CUTLASS kernel: it needs nvcc and the nvidia-cutlass wheel's headers"
    return None


def applies(node: Node, target: Target) -> bool:
    return node.op.name == "quantized_linear" and decline_reason(node, target) is None


def _names(node: Node) -> dict[str, str]:
    return {s: f"{node.outputs[0].name}.{s}" for s in SCRATCH}


def plan_launches(node: Node, target: Target) -> list[tuple[KernelSpec, dict[str, dict[str, Any]]]]:
    """The node's two launches (quantizer, GEMM) and their arguments (``codegen/lower.py``'s format)."""
    op, x, out = node.op, node.inputs[0], node.outputs[0]
    assert x is not None
    fmt, static = op.weight_format, op.act_granularity == "tensor"
    names = _names(node)

    def buf(v: Value | None) -> dict[str, Any]:
        return {"null": True} if v is None else {"buffer": v.name}

    rows = {"dim": token_rows(x)}
    x_scale = {"buffer": names["x_scale"]} if fmt == "nvfp4" else {"null": True}
    quant = {"x": buf(x), "input_scale": buf(_input(node, 4) if static else None),
             "weight_scale_2": buf(_input(node, 3) if fmt == "nvfp4" else None),
             "x_fp4": {"buffer": names["x_fp4"]}, "x_block_scale": {"buffer": names["x_block_scale"]},
             "x_scale": x_scale, "M": rows}
    gemm = {"x": {"buffer": names["x_fp4"]}, "weight": buf(node.inputs[1]),
            "x_block_scale": {"buffer": names["x_block_scale"]}, "weight_block_scale": buf(node.inputs[2]),
            "x_scale": x_scale, "bias": buf(_input(node, 5)), "residual": buf(_input(node, 6)), "out": buf(out),
            "M": rows}
    residual = _input(node, 6) is not None
    return [(quantizer_spec(fmt, int(op.in_features), target, static), quant),
            (blockscaled_spec(fmt, target, residual=residual), gemm)]


def temporaries(graph: Graph, target: Target) -> dict[str, tuple[int, TensorType]]:
    """The scratch buffers of every node this rule lowers, for ``plan_memory``'s ``temporaries``: name -> (node
    index, type), each live during its node only."""
    found: dict[str, tuple[int, TensorType]] = {}
    for i, node in enumerate(graph.nodes):
        if not applies(node, target):
            continue
        x = node.inputs[0]
        assert x is not None
        rows, k, fmt = token_rows(x), int(node.op.in_features), node.op.weight_format
        sf_rows = -(-rows // ATOM_ROWS) * ATOM_ROWS if isinstance(rows, int) else f"({rows}+{ATOM_ROWS - 1})"
        names = _names(node)
        found[names["x_fp4"]] = (i, TensorType(DType.u8, (rows, k // 2)))
        found[names["x_block_scale"]] = (i, TensorType(DType.u8, (sf_rows, scale_cols(fmt, k))))
        if fmt == "nvfp4":
            found[names["x_scale"]] = (i, TensorType(DType.f32, (rows,)))
    return found
