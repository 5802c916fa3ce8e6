"""Representative kernel specs of every family, shared by the compile-only and the GPU tests."""

from __future__ import annotations

from ingot.codegen.kernel import KernelSpec
from ingot.codegen.kernels.activation.rule import gated_spec
from ingot.codegen.kernels.attention.rule import paged_attention_specs
from ingot.codegen.kernels.embedding.rule import embedding_spec
from ingot.codegen.kernels.gemm.rule import linear_spec
from ingot.codegen.kernels.gemv.quant_rule import quant_gemv_spec
from ingot.codegen.kernels.gemv.rule import gemv_spec
from ingot.codegen.kernels.norm.rule import norm_spec
from ingot.codegen.kernels.rope.rule import rope_qkv_spec, rope_spec
from ingot.codegen.kernels.sampling.rule import greedy_spec
from ingot.codegen.target import Target
from ingot.ir.types import DType

bf16, f32, f8 = DType.bf16, DType.f32, DType.f8e4m3fn


def family_specs(target: Target) -> dict[str, list[KernelSpec]]:
    """A few variants per family (every template, the main dtype combinations)."""
    return {
        "embedding": [embedding_spec(bf16, 2048, target), embedding_spec(f32, 100, target)],
        "norm": [norm_spec("rms", bf16, bf16, 2048, 1e-5, target),
                 norm_spec("rms", bf16, bf16, 2048, 1e-6, target, residual=True),
                 norm_spec("layer", f32, f32, 1000, 1e-5, target, bias=True)],
        "rope": [rope_spec(bf16, f32, 32, 64, 64, False, target), rope_spec(f32, f32, 4, 80, 32, True, target),
                 rope_qkv_spec(bf16, f32, 32, 8, 64, 64, False, target),
                 rope_qkv_spec(f32, f32, 4, 2, 80, 32, True, target)],
        "activation": [gated_spec("swiglu", bf16, 8192, target), gated_spec("geglu", f32, 1000, target),
                       gated_spec("swiglu", bf16, 8192, target, a_stride=16384, b_stride=16384, b_offset=8192)],
        "gemm": [linear_spec(bf16, bf16, 2048, 2048, target, bias=True, residual=True),
                 linear_spec(bf16, f8, 1000, 520, target),
                 linear_spec(f32, f32, 1000, 520, target, bias=True)],
        "gemv": [gemv_spec(2048, 2048, 8, target, bias=True, residual=True),
                 quant_gemv_spec(1024, 512, 16, target, "fp8", "fp8", "token", residual=True),
                 quant_gemv_spec(1000, 1024, 64, target, "nvfp4", any_m=True)],
        "attention": [*paged_attention_specs(bf16, bf16, 32, 8, 64, 16, 0.125, target),
                      *paged_attention_specs(f32, f8, 8, 2, 128, 16, 0.088, target, softcap=30.0,
                                             sliding_window=64)],
        "sampling": [greedy_spec(f32, 128256, target), greedy_spec(bf16, 1000, target)],
    }
