"""Converters for the ``com.microsoft`` contrib ops that onnxruntime's transformer tools export:
GroupQueryAttention, MultiHeadAttention, RotaryEmbedding, SkipSimplifiedLayerNormalization, and
SimplifiedLayerNormalization (registered by onnxruntime in the default domain)."""

from __future__ import annotations

from ...ir.graph import Value
from ...ir.ops.attention import Attention, RotaryEmbedding
from ..onnx import NodeContext, Unsupported, converter
from .attention import concat_seq, to_bhsd

MS = "com.microsoft"


def _scale(ctx: NodeContext) -> float | None:
    s = float(ctx.attr("scale", 0.0))
    return s if s else None


def _want(ctx: NodeContext, i: int) -> bool:
    return i < ctx.num_outputs and bool(ctx.node.output[i])


def _has_data(v: Value | None) -> bool:
    """False for an omitted input or an empty (zero-length) past tensor."""
    return v is not None and not (v.type.shape is not None and 0 in v.type.shape)


@converter("GroupQueryAttention", domain=MS)
def _group_query_attention(ctx: NodeContext) -> list[Value | None]:
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    past_k, past_v, seqlens_k = ctx.input(3), ctx.input(4), ctx.input(5)
    assert q is not None
    if k is None or v is None:
        raise Unsupported("packed QKV (key and value omitted)")
    if int(ctx.attr("do_rotary", 0)):
        raise Unsupported("do_rotary=1 (apply RotaryEmbedding before the op instead)")
    if int(ctx.attr("smooth_softmax", 0)) or any(ctx.input(i) is not None for i in (9, 10, 11)):
        raise Unsupported("smooth_softmax, position_ids, attention_bias or head_sink")
    if _want(ctx, 3):
        raise Unsupported("the output_qk output")
    hq, hkv = int(ctx.attr("num_heads")), int(ctx.attr("kv_num_heads"))
    pk, pv = to_bhsd(ctx, k, hkv), to_bhsd(ctx, v, hkv)
    if _has_data(past_k) and _has_data(past_v):
        assert past_k is not None and past_v is not None
        pk, pv = concat_seq(ctx, past_k, pk), concat_seq(ctx, past_v, pv)
    op = Attention(
        scale=_scale(ctx),
        causal=True,
        softcap=float(ctx.attr("softcap", 0.0)),
        num_heads=hq,
        window_left=int(ctx.attr("local_window_size", -1)),
    )
    lengths = None
    if seqlens_k is not None:
        from ...ir.ops.elementwise import binary

        # seqlens_k holds each sequence's total length minus one
        lengths = ctx.add1(binary("add"), [seqlens_k, ctx.const(1, seqlens_k.type.dtype)])
    y = ctx.add1(op, [q, pk, pv, None, lengths])
    return [y, pk, pv]


@converter("MultiHeadAttention", domain=MS)
def _multi_head_attention(ctx: NodeContext) -> list[Value | None]:
    q, k, v, bias = ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3)
    key_padding_mask, attn_bias = ctx.input(4), ctx.input(5)
    past_k, past_v = ctx.input(6), ctx.input(7)
    assert q is not None
    if k is None or v is None or q.type.rank != 3 or k.type.rank not in (3, 4):
        raise Unsupported("packed or 5-D q/k/v layouts")
    if bias is not None or key_padding_mask is not None:
        raise Unsupported("the bias or key_padding_mask inputs")
    if any(ctx.input(i) is not None for i in range(8, 12)) or _want(ctx, 3):
        raise Unsupported("past_sequence_length / cache_indirection / output_qk")
    heads = int(ctx.attr("num_heads"))
    causal = bool(ctx.attr("unidirectional", 0))
    kk, vv = k, v
    if _has_data(past_k) or _want(ctx, 1) or _want(ctx, 2) or k.type.rank == 4:
        kk, vv = to_bhsd(ctx, k, heads), to_bhsd(ctx, v, heads)
        if _has_data(past_k) and _has_data(past_v):
            assert past_k is not None and past_v is not None
            kk, vv = concat_seq(ctx, past_k, kk), concat_seq(ctx, past_v, vv)
    op = Attention(
        scale=_scale(ctx),
        causal=causal,
        num_heads=heads,
        num_kv_heads=heads if kk.type.rank == 3 else None,
        align="bottom_right",
    )
    y = ctx.add1(op, [q, kk, vv, attn_bias])
    return [y, kk if _want(ctx, 1) else None, vv if _want(ctx, 2) else None]


@converter("RotaryEmbedding", domain=MS)
def _ms_rotary_embedding(ctx: NodeContext) -> Value:
    x, pos, cos, sin = ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3)
    assert x is not None and pos is not None
    if pos.type.rank != 2:
        raise Unsupported("position_ids as a single offset (use a (batch, seq) tensor)")
    if int(ctx.attr("is_packed_batching", 0)) or float(ctx.attr("scale", 1.0)) != 1.0:
        raise Unsupported("is_packed_batching or scale != 1")
    if x.type.rank == 4:
        raise Unsupported("4-D input (BSNH in contrib RotaryEmbedding)")
    op = RotaryEmbedding(
        interleaved=bool(ctx.attr("interleaved", 0)),
        rotary_dim=int(ctx.attr("rotary_embedding_dim", 0)),
        num_heads=int(ctx.attr("num_heads", 0)) or None,
    )
    if op.num_heads is None:
        if cos is None or cos.type.shape is None or not isinstance(cos.type.shape[-1], int):
            raise Unsupported("3-D input without num_heads")
        shape = x.type.shape
        half = cos.type.shape[-1]
        if shape is None or not isinstance(shape[-1], int) or shape[-1] % (2 * half):
            raise Unsupported("cannot derive num_heads")
        op = RotaryEmbedding(interleaved=op.interleaved, rotary_dim=op.rotary_dim,
                             num_heads=shape[-1] // (2 * half))
    return ctx.add1(op, [x, cos, sin, pos])


def _rms_norm(ctx: NodeContext, x: Value, gamma: Value, axis: int) -> Value:
    from ...ir.ops.norm import RmsNorm

    return ctx.add1(RmsNorm(eps=float(ctx.attr("epsilon", 1e-5)), axis=axis), [x, gamma])


@converter("SimplifiedLayerNormalization")
def _simplified_layer_norm(ctx: NodeContext) -> Value:
    if _want(ctx, 1):
        raise Unsupported("the inv_std_var output")
    x, gamma = ctx.input(0), ctx.input(1)
    assert x is not None and gamma is not None
    return _rms_norm(ctx, x, gamma, int(ctx.attr("axis", -1)))


@converter("SkipSimplifiedLayerNormalization", domain=MS)
def _skip_simplified_layer_norm(ctx: NodeContext) -> list[Value | None]:
    from ...ir.ops.elementwise import binary

    x, skip, gamma, bias = ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3)
    assert x is not None and skip is not None and gamma is not None
    if _want(ctx, 1) or _want(ctx, 2):
        raise Unsupported("the mean / inv_std_var outputs")
    s = ctx.add1(binary("add"), [x, skip])
    if bias is not None:
        s = ctx.add1(binary("add"), [s, bias])
    y = _rms_norm(ctx, s, gamma, -1)
    return [y, None, None, s]
