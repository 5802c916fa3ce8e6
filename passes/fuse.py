"""fuse: every fusion pass, in an order where each finds the forms the one before leaves.

Runs after canonicalize (O2: canonicalize, fuse, canonicalize). Needs nothing. Preserves values.
The order, top to bottom::

    fuse-qdq           QDQ matmul/gemm/conv with dequantized constant weights -> qdq_linear/qdq_conv
    fuse-linear        matmul/gemm with constant weights -> linear (+ bias, + residual)
    fuse-rms-norm      decomposed RMSNorm -> rms_norm
    fuse-layer-norm    decomposed LayerNorm -> layer_norm
    fuse-rope          rotate-half / interleaved RoPE -> rotary_embedding
    fuse-attention     q k^T, scale, mask, softmax, @ v (GQA repeat_kv) -> attention
    fuse-swiglu        silu(g) * u -> swiglu, gelu(g) * u -> geglu
    fuse-qkv           linears sharing an input -> one linear + split
    fuse-elementwise   remaining single-use elementwise chains -> fused_elementwise

The serving form's own split-removing fusions (fuse-split-swiglu, fuse-split-rope) are not in this list: they
run as the ``serving-fuse`` pipeline at the GPU lowering (``codegen/lower.py``), after quantization and
tensor-parallel sharding, which read the ``split`` nodes (and llm-lower, which recognizes them).

Passes not registered (yet) are skipped; ``ctx.option("fuse", "skip", ())`` leaves named ones out.
``stats`` holds every inner rule's hits as ``"<pass>/<rule>"``.
"""

from __future__ import annotations

from ..ir.graph import Graph
from .manager import PASSES, Pass, PassContext, get_pass, register_pass

#: The fusion passes, in order.
ORDER = ["fuse-qdq", "fuse-linear", "fuse-rms-norm", "fuse-layer-norm", "fuse-rope", "fuse-attention", "fuse-swiglu",
         "fuse-qkv", "fuse-elementwise"]


@register_pass
class Fuse(Pass):
    """Run the fusion passes in order (see the module docstring). Runs after canonicalize; needs
    nothing; preserves values."""

    name = "fuse"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        get_pass(self.name)  # loads the built-in passes
        skip = set(ctx.option(self.name, "skip", ()))
        changed = False
        self.stats = {}
        for name in ORDER:
            if name not in PASSES or name in skip:
                continue
            p = PASSES[name]()
            if p.run(graph, ctx):
                changed = True
            for k, v in p.stats.items():
                if v:
                    self.stats[f"{name}/{k}"] = self.stats.get(f"{name}/{k}", 0) + v
        return changed
