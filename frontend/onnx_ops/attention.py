"""Converters for Attention (opset 23+), RotaryEmbedding, SwiGLU, LinearAttention,
CausalConvWithState."""

from __future__ import annotations

import numpy as np

from ...ir.graph import Value
from ...ir.ops.attention import (
    Attention,
    AttentionScores,
    CausalConvWithState,
    LinearAttention,
    RotaryEmbedding,
    SwiGLU,
)
from ..onnx import NodeContext, Unsupported, converter


def to_bhsd(ctx: NodeContext, x: Value, heads: int | None) -> Value:
    """``(B, S, H*D)`` -> ``(B, H, S, D)``; 4-D values pass through."""
    from ...ir.ops.shape import Reshape, Transpose

    if x.type.rank == 4:
        return x
    if x.type.rank != 3 or not heads:
        raise Unsupported(f"cannot split {x.type} into heads")
    r = ctx.add1(Reshape(), [x, ctx.const(np.array([0, 0, heads, -1], np.int64))])
    return ctx.add1(Transpose(perm=(0, 2, 1, 3)), [r])


def concat_seq(ctx: NodeContext, past: Value, new: Value) -> Value:
    from ...ir.ops.shape import Concat

    return ctx.add1(Concat(axis=2), [past, new])


def _opt_int(ctx: NodeContext, name: str) -> int | None:
    v = ctx.attr(name)
    return None if v is None else int(v)


@converter("Attention")
def _attention(ctx: NodeContext) -> list[Value | None]:
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    mask, past_k, past_v, nonpad = ctx.input(3), ctx.input(4), ctx.input(5), ctx.input(6)
    assert q is not None and k is not None and v is not None
    hq, hkv = _opt_int(ctx, "q_num_heads"), _opt_int(ctx, "kv_num_heads")
    if (past_k is None) != (past_v is None):
        raise Unsupported("past_key and past_value must be given together")
    outs = [o for o in ctx.node.output]
    want_present = len(outs) > 1 and bool(outs[1]) or len(outs) > 2 and bool(outs[2])
    present_k: Value | None = None
    present_v: Value | None = None
    if past_k is not None or want_present:
        present_k, present_v = to_bhsd(ctx, k, hkv), to_bhsd(ctx, v, hkv)
        if past_k is not None and past_v is not None:
            present_k, present_v = concat_seq(ctx, past_k, present_k), concat_seq(ctx, past_v, present_v)
        k, v = present_k, present_v
    diagonal = 0
    if past_k is not None:
        # ONNX's causal frontier is j <= i + past_length; bottom-right alignment gives
        # i + Skv - Sq, which differs when this step appends more (or fewer) keys than queries.
        s_q, s_new = q.type.shape[-2 if q.type.rank == 4 else 1], ctx.input(1).type.shape  # type: ignore
        s_new = s_new[-2 if len(s_new) == 4 else 1] if s_new is not None else None
        if isinstance(s_q, int) and isinstance(s_new, int):
            diagonal = s_q - s_new
        elif s_q != s_new:
            raise Unsupported("past_key with a query length that may differ from the new keys' length")
    scale = ctx.attr("scale")
    attrs = dict(
        scale=None if scale is None else float(scale),
        causal=bool(ctx.attr("is_causal", 0)),
        softcap=float(ctx.attr("softcap", 0.0)),
        num_heads=hq if q.type.rank == 3 else None,
        num_kv_heads=hkv if k.type.rank == 3 else None,
        window_left=int(ctx.attr("left_window_size", -1)),
        window_right=int(ctx.attr("right_window_size", -1)),
        align="bottom_right" if past_k is not None else "top_left",
        diagonal=diagonal,
    )
    ins = [q, k, v, mask, nonpad]
    y = ctx.add1(Attention(**attrs), ins)
    scores = None
    if len(outs) > 3 and outs[3]:
        scores = ctx.add1(AttentionScores(mode=int(ctx.attr("qk_matmul_output_mode", 0)), **attrs), ins)
    return [y, present_k, present_v, scores]


@converter("RotaryEmbedding")
def _rotary_embedding(ctx: NodeContext) -> Value:
    op = RotaryEmbedding(
        interleaved=bool(ctx.attr("interleaved", 0)),
        rotary_dim=int(ctx.attr("rotary_embedding_dim", 0)),
        num_heads=_opt_int(ctx, "num_heads") or None,
    )
    return ctx.add1(op, [ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3)])


@converter("SwiGLU")
def _swiglu(ctx: NodeContext) -> Value:
    return ctx.add1(SwiGLU(alpha=float(ctx.attr("alpha", 1.0))), [ctx.input(0), ctx.input(1)])


@converter("LinearAttention")
def _linear_attention(ctx: NodeContext) -> list[Value]:
    hq, hkv = _opt_int(ctx, "q_num_heads"), _opt_int(ctx, "kv_num_heads")
    if hq is None or hkv is None:
        raise Unsupported("q_num_heads and kv_num_heads are required")
    scale = ctx.attr("scale")
    op = LinearAttention(
        num_heads=hq,
        num_kv_heads=hkv,
        update_rule=str(ctx.attr("update_rule", "gated_delta")),
        scale=None if not scale else float(scale),
    )
    return ctx.add(op, [ctx.input(i) for i in range(6)])


@converter("CausalConvWithState")
def _causal_conv_with_state(ctx: NodeContext) -> list[Value]:
    act = str(ctx.attr("activation", "none"))
    act = {"swish": "silu"}.get(act, act)
    return ctx.add(CausalConvWithState(activation=act), [ctx.input(i) for i in range(4)])
