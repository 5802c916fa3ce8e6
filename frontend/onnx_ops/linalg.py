"""Converters for MatMul, Gemm, Einsum, MatMulInteger."""

from __future__ import annotations

from ...ir.graph import Value
from ...ir.ops.linalg import Einsum, Gemm, MatMul, MatMulInteger
from ..onnx import NodeContext, converter


@converter("MatMul")
def _matmul(ctx: NodeContext) -> Value:
    return ctx.add1(MatMul(), [ctx.input(0), ctx.input(1)])


@converter("Gemm")
def _gemm(ctx: NodeContext) -> Value:
    op = Gemm(
        trans_a=bool(ctx.attr("transA", 0)),
        trans_b=bool(ctx.attr("transB", 0)),
        alpha=float(ctx.attr("alpha", 1.0)),
        beta=float(ctx.attr("beta", 1.0)),
    )
    return ctx.add1(op, [ctx.input(0), ctx.input(1), ctx.input(2)])


@converter("Einsum")
def _einsum(ctx: NodeContext) -> Value:
    return ctx.add1(Einsum(equation=str(ctx.attr("equation"))), list(ctx.inputs))


@converter("MatMulInteger")
def _matmul_integer(ctx: NodeContext) -> Value:
    return ctx.add1(MatMulInteger(), [ctx.input(i) for i in range(4)])
