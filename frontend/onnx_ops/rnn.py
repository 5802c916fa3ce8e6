"""Converters for RNN, GRU, LSTM."""

from __future__ import annotations

from ...ir.ops.rnn import Gru, Lstm, Rnn
from ..onnx import NodeContext, converter


def _common(ctx: NodeContext) -> dict:
    clip = ctx.attr("clip")
    return dict(
        hidden_size=int(ctx.attr("hidden_size", 0)),
        direction=str(ctx.attr("direction", "forward")),
        layout=int(ctx.attr("layout", 0)),
        activations=tuple(str(a) for a in (ctx.attr("activations") or ())),
        activation_alpha=tuple(float(a) for a in (ctx.attr("activation_alpha") or ())),
        activation_beta=tuple(float(a) for a in (ctx.attr("activation_beta") or ())),
        clip=None if clip is None else float(clip),
    )


@converter("RNN")
def _rnn(ctx: NodeContext):
    return ctx.add(Rnn(**_common(ctx)), [ctx.input(i) for i in range(6)])


@converter("GRU")
def _gru(ctx: NodeContext):
    op = Gru(**_common(ctx), linear_before_reset=bool(ctx.attr("linear_before_reset", 0)))
    return ctx.add(op, [ctx.input(i) for i in range(6)])


@converter("LSTM")
def _lstm(ctx: NodeContext):
    op = Lstm(**_common(ctx), input_forget=bool(ctx.attr("input_forget", 0)))
    return ctx.add(op, [ctx.input(i) for i in range(8)])
