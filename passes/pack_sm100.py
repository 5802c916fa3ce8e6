"""``pack-sm100``: lay quantized weights out as sm_100 (Blackwell) block-scaled MMAs read them.

Runs after: ``quantize``. Needs nothing else. Preserves: every value and its result (the CPU
reference of ``quantized_linear`` reads the swizzled layout back), so the packed graph still runs on
the CPU backend and is tested against the unpacked one.

NVFP4 and MXFP4 weights are already K-major with two E2M1 codes per byte (element 0 in the low
nibble, CUTLASS's ``nv_float4_t`` order); their scale factors move into CUTLASS's
``Sm1xxBlkScaledConfig`` layout: padded to (128 rows, 4 scale columns) and stored in 128x4 atoms
(``ir/quant/packing.py``). FP8 weights are K-major rows already and are left as they are, and so are weight-only
NVFP4 linears' scales (``act_format`` none): no block-scaled MMA reads them, the decode GEMV (``kernel.cu`` /
``quant.cu``) and the prefill's dequantize launch take linear scales, as on sm_90a.
"""

from __future__ import annotations

import dataclasses

from ..ir.graph import Graph, Weight
from ..ir.quant.packing import swizzle_sm100_scales
from ..ir.types import TensorType
from .manager import Pass, PassContext, register_pass


@register_pass
class PackSm100(Pass):
    __doc__ = __doc__
    name = "pack-sm100"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        changed = False
        users = graph.users()
        for node in graph.nodes:
            op = node.op
            if op.name != "quantized_linear" or op.weight_format not in ("nvfp4", "mxfp4"):
                continue
            if op.scale_layout != "linear":
                continue
            if op.weight_format == "nvfp4" and op.act_format == "none":
                continue  # weight-only NVFP4: the GEMV and the dequantize launch read linear scales (the docstring)
            sv = node.inputs[2]
            assert sv is not None and sv.type.shape is not None
            rows, cols = (int(d) for d in sv.type.shape)
            old = graph.weights[sv.name]
            shape = (-(-rows // 128) * 128, -(-cols // 4) * 4)
            if len(users.get(sv, [])) > 1:
                continue  # shared scales (never made by quantize): leave them
            graph.weights[sv.name] = Weight(TensorType(sv.type.dtype, shape),
                                            lambda w=old: swizzle_sm100_scales(w.load()),
                                            source=f"pack-sm100({old.source})")
            sv.type = TensorType(sv.type.dtype, shape)
            node.op = dataclasses.replace(op, scale_layout="sm100")
            changed = True
            self.stats["swizzled"] = self.stats.get("swizzled", 0) + 1
        return changed
