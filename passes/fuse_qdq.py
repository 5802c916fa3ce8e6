"""fuse-qdq: QDQ patterns of pre-quantized ONNX models -> ``qdq_linear`` / ``qdq_conv``.

Runs in ``fuse`` before fuse-linear (after canonicalize, which leaves dequantize_linear of
quantized weights unfolded). Needs nothing. Preserves every output's value (the ops dequantize
exactly as DequantizeLinear does; the float32 GEMM may differ in the last bit).

::

    matmul(a, dequantize_linear(Wq, s, zp))          Wq a 2-D constant [K, N]  -> qdq_linear(a, Wq^T, ...)
    gemm(a, dequantize_linear(Wq, s, zp), c?)        alpha = 1, not trans_a    -> qdq_linear(a, Wq or Wq^T, ..., c)
    conv(a, dequantize_linear(Wq, s, zp), b?)                                  -> qdq_conv(a, Wq, ..., b)
    qdq_linear(...) + b                              b a constant [N]          -> qdq_linear(..., b)

where ``a`` is either any float value, or ``dequantize_linear(quantize_linear(x, sx, zx), sx, zx)``
with one (per-tensor) activation scale: then the op takes ``x`` and quantizes it itself
(``act_dtype``). The weight keeps its quantized dtype (int8/uint8/int4/uint4/fp8/fp4, ...), its
scales and zero points (per tensor, per axis or blocked); a matmul's [K, N] weight becomes an [N, K]
lazy weight transposed on load (its 2-D scales and zero points likewise, the axis flips).
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.ops.qlinear import QdqConv, QdqLinear
from ..ir.ops.quant import QUANT_TYPES
from .fuse_util import is_constant, transposed
from .manager import Pass, PassContext, register_pass
from .rewrite import Builder, Match, P, Rule, Var, const_value, rewrite

_Weight = tuple[Value, Value, Value | None, int, int]  # wq, scale, zero point, axis, block_size
_Act = tuple[Value, Value | None, Value | None, object]  # x, x_scale, x_zero_point, act dtype


def _same(a: Value | None, b: Value | None, graph: Graph) -> bool:
    """The same value, or equal one-element constants."""
    if a is None or b is None:
        return a is b
    if a is b:
        return True
    ca, cb = const_value(a, graph, 1), const_value(b, graph, 1)
    return (ca is not None and cb is not None and ca.dtype == cb.dtype
            and np.array_equal(ca.reshape(-1), cb.reshape(-1), equal_nan=True))


def _one(v: Value | None) -> bool:
    return v is None or (v.type.shape is not None and all(d == 1 for d in v.type.shape))


def _input(n: Node, i: int) -> Value | None:
    return n.inputs[i] if i < len(n.inputs) else None


def _weight(v: Value, graph: Graph, dtype: object) -> _Weight | None:
    """``(Wq, scale, zero point, axis, block_size)`` if ``v = dequantize_linear(Wq, ...)`` of constants."""
    p = v.producer
    if p is None or p.op.name != "dequantize_linear" or p.op.to != dtype:  # type: ignore[attr-defined]
        return None
    wq, s, zp = p.inputs[0], p.inputs[1], _input(p, 2)
    if wq is None or s is None or wq.type.dtype not in QUANT_TYPES or wq.type.rank is None:
        return None
    if not all(u is None or is_constant(u, graph) for u in (wq, s, zp)):
        return None
    rank = wq.type.rank
    axis = p.op.axis % rank if rank else 0  # type: ignore[attr-defined]
    return wq, s, zp, axis, int(p.op.block_size)  # type: ignore[attr-defined]


def _activation(a: Value, graph: Graph) -> _Act:
    """``(x, x_scale, x_zero_point, act_dtype)`` for a per-tensor QDQ pair, else ``(a, None, None, None)``."""
    none: _Act = (a, None, None, None)
    dq = a.producer
    if dq is None or dq.op.name != "dequantize_linear":
        return none
    q_out = dq.inputs[0]
    q = q_out.producer if q_out is not None else None
    if q is None or q.op.name != "quantize_linear" or q.op.precision is not None:  # type: ignore[attr-defined]
        return none
    x, sq, zq = q.inputs[0], q.inputs[1], _input(q, 2)
    sd, zd = dq.inputs[1], _input(dq, 2)
    if x is None or sq is None or x.type.dtype != a.type.dtype or not x.type.dtype.is_float:
        return none
    if not (_one(sq) and _one(zq) and _same(sq, sd, graph) and _same(zq, zd, graph)):
        return none
    return x, sq, zq, q.op.to  # type: ignore[attr-defined]


def _to_nk(b: Builder, w: _Weight, cache: dict[Value, Value]) -> _Weight:
    """The [K, N] weight's quantization as the [N, K] weight's: transposed values, 2-D scales and
    zero points transposed, the axis flipped."""
    wq, s, zp, axis, block = w

    def t(v: Value | None) -> Value | None:
        if v is None or v.type.rank != 2:
            return v  # per tensor or per axis (1-D): the same values
        return transposed(b, v, cache)

    return t(wq), t(s), t(zp), 1 - axis, block  # type: ignore[return-value]


def _rules(graph: Graph) -> list[Rule]:
    cache: dict[Value, Value] = {}

    def linear(b: Builder, a: Value, w: _Weight, bias: Value | None) -> Value:
        x, xs, xz, act = _activation(a, graph)
        wq, s, zp, axis, block = w
        op = QdqLinear(axis=axis, block_size=block, act_dtype=act)  # type: ignore[arg-type]
        return b.add(op, [x, wq, s, zp, bias, xs, xz])

    def matmul(m: Match, b: Builder) -> Value | None:
        a, wv = m["a"], m["w"]
        if not a.type.dtype.is_float or a.type.rank is None or a.type.rank < 1:
            return None
        w = _weight(wv, graph, a.type.dtype)
        if w is None or w[0].type.rank != 2:
            return None
        return linear(b, a, _to_nk(b, w, cache), None)

    def gemm(m: Match, b: Builder) -> Value | None:
        op, a, wv = m.root.op, m["a"], m["w"]
        c = _input(m.root, 2)
        if op.trans_a or op.alpha != 1.0 or a.type.rank != 2:  # type: ignore[attr-defined]
            return None
        w = _weight(wv, graph, a.type.dtype)
        if w is None or w[0].type.rank != 2 or w[0].type.shape is None:
            return None
        w = w if op.trans_b else _to_nk(b, w, cache)  # type: ignore[attr-defined]
        n = w[0].type.shape[0]  # type: ignore[index]
        if c is not None and (op.beta != 1.0 or c.type.shape != (n,)):  # type: ignore[attr-defined]
            return None
        return linear(b, a, w, c)

    def conv(m: Match, b: Builder) -> Value | None:
        op, a, wv = m.root.op, m["a"], m["w"]
        w = _weight(wv, graph, a.type.dtype)
        if w is None:
            return None
        x, xs, xz, act = _activation(a, graph)
        wq, s, zp, axis, block = w
        q = QdqConv(axis=axis, block_size=block, act_dtype=act, strides=op.strides,  # type: ignore
                    pads=op.pads, dilations=op.dilations, group=op.group, auto_pad=op.auto_pad)  # type: ignore
        return b.add(q, [x, wq, s, zp, _input(m.root, 2), xs, xz])

    def bias_fits(m: Match) -> bool:
        lin, bias = m.node("lin"), m["bias"]
        out = lin.outputs[0]
        n = lin.inputs[1].type.shape[0] if lin.inputs[1].type.shape else None  # type: ignore[union-attr]
        return (_input(lin, 4) is None and bias.type.shape == (n,) and bias.type.dtype == out.type.dtype
                and is_constant(bias, graph) and m.root.outputs[0].type.shape == out.type.shape)

    def with_bias(m: Match, b: Builder) -> Value:
        lin = m.node("lin")
        ins = list(lin.inputs) + [None] * (7 - len(lin.inputs))
        ins[4] = m["bias"]
        return b.add(lin.op, ins)

    lin = P("qdq_linear", Var("x"), Var("w"), name="lin", one_use=True, partial=True)
    return [
        Rule("matmul", P("matmul", Var("a"), Var("w")), matmul),
        Rule("gemm", P("gemm", Var("a"), Var("w"), partial=True), gemm),
        Rule("conv", P("conv", Var("a"), Var("w"), partial=True), conv),
        Rule("bias", P("add", lin, Var("bias"), commutative=True), with_bias, bias_fits),
    ]


@register_pass
class FuseQdq(Pass):
    """QDQ around matmul/gemm/conv with a dequantized constant weight -> ``qdq_linear``/``qdq_conv``.

    Runs in ``fuse`` before fuse-linear; needs nothing; preserves values."""

    name = "fuse-qdq"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        self.stats = rewrite(graph, _rules(graph))
        return bool(self.stats)
