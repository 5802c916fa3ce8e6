"""``fp8-channel-scales``: an FP8 weight's per-tensor scale as a per-channel one, for the CUDA kernels.

Runs after: ``quantize``. Needs nothing else. Preserves: every value's result, bit for bit (the CPU reference of
``quantized_linear`` multiplies each code by its row's scale; every row's is the tensor's one scale), so the graph
still runs on the CPU backend and equals the unconverted one.

The CUDA backend's FP8 kernels read an ``[N]`` f32 weight scale, one per output channel: the decode GEMVs
(``gemv/kernel.cu``'s FP8 route, ``skinny.cu``, ``quant.cu``), the weight-only prefill's dequantize launch and the
W8A8 prefill's CUTLASS GEMM. An FP8 ``quantized_linear`` quantized per tensor (``fp8:tensor``, ``fp8:tensor:static``,
``fp8:tensor:wo``: the layout of ModelOpt's and vLLM's FP8 checkpoints) gets its scalar ``weight_scale`` broadcast to
``[N]`` and ``weight_granularity="channel"``: 4 bytes per output channel, and every kernel of the per-channel path
runs it. Block-scaled FP8 weights (``fp8:block``) are left alone (``quant.cu`` reads their 128 x 128 block scales
as they are), as are scales that another node reads too (never made by ``quantize``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..ir.graph import Graph, Weight
from ..ir.types import DType, TensorType
from .manager import Pass, PassContext, register_pass


@register_pass
class Fp8ChannelScales(Pass):
    __doc__ = __doc__
    name = "fp8-channel-scales"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        changed = False
        users = graph.users()
        for node in graph.nodes:
            op = node.op
            if op.name != "quantized_linear" or op.weight_format != "fp8" or op.weight_granularity != "tensor":
                continue
            w, sv = node.inputs[1], node.inputs[2]
            assert w is not None and sv is not None and w.type.shape is not None
            old = graph.weights.get(sv.name)
            if old is None or len(users.get(sv, [])) > 1 or sv.type.dtype is not DType.f32 or sv.type.numel() != 1:
                continue  # not a stored scalar of this node alone (never made by quantize): leave it
            n = int(w.type.shape[0])
            graph.weights[sv.name] = Weight(TensorType(DType.f32, (n,)),
                                            lambda s=old, n=n: np.full(n, np.asarray(s.load(), np.float32).reshape(()),
                                                                       np.float32),
                                            source=f"fp8-channel-scales({old.source})")
            sv.type = TensorType(DType.f32, (n,))
            node.op = dataclasses.replace(op, weight_granularity="channel")
            changed = True
            self.stats["expanded"] = self.stats.get("expanded", 0) + 1
        return changed
