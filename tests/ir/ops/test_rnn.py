"""RNN, GRU, LSTM against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from ingot.frontend.onnx import import_onnx
from tests.helpers import assert_close, assert_text_roundtrip, make_model, rng, run_ingot, run_ort

F = TensorProto.FLOAT
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
T, B, I, H = 5, 3, 4, 6


def _run(op: str, direction: str, layout: int, seq_lens: bool, init: bool, extra: dict,
         peephole: bool = False):
    r = rng()
    nd = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    xs = (T, B, I) if layout == 0 else (B, T, I)
    hs = (nd, B, H) if layout == 0 else (B, nd, H)
    shapes = {"X": xs, "W": (nd, g * H, I), "R": (nd, g * H, H), "B": (nd, 2 * g * H)}
    feeds = {k: (0.5 * r.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}
    names = ["X", "W", "R", "B", "", ""]
    if seq_lens:
        names[4] = "L"
        feeds["L"] = r.integers(1, T + 1, B).astype(np.int32)
    if init:
        names[5] = "h0"
        feeds["h0"] = r.standard_normal(hs).astype(np.float32)
    if op == "LSTM":
        names += ["", ""]
        if init:
            names[6] = "c0"
            feeds["c0"] = r.standard_normal(hs).astype(np.float32)
        if peephole:
            names[7] = "P"
            feeds["P"] = r.standard_normal((nd, 3 * H)).astype(np.float32)
    while names[-1] == "":
        names.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=H, direction=direction, layout=layout, **extra)
    ins = [helper.make_tensor_value_info(n, TensorProto.INT32 if n == "L" else F, list(feeds[n].shape))
           for n in names if n]
    model = make_model(node, ins, [helper.make_tensor_value_info(o, F, None) for o in outs])
    got = run_ingot(model, feeds)
    if layout == 0:
        exp = run_ort(model, feeds)
    else:  # onnxruntime has no batch-first layout: run the sequence-first model on transposed data
        node0 = helper.make_node(op, names, outs, hidden_size=H, direction=direction, **extra)
        feeds0 = {k: (v.transpose(1, 0, 2) if k in ("X", "h0", "c0") else v) for k, v in feeds.items()}
        ins0 = [helper.make_tensor_value_info(n, TensorProto.INT32 if n == "L" else F, list(feeds0[n].shape))
                for n in names if n]
        model0 = make_model(node0, ins0, [helper.make_tensor_value_info(o, F, None) for o in outs])
        exp0 = run_ort(model0, feeds0)
        exp = {o: v.transpose(2, 0, 1, 3) if o == "Y" else v.transpose(1, 0, 2) for o, v in exp0.items()}
    for o in outs:
        assert_close(got[o], exp[o], rtol=1e-4, atol=1e-5, what=o)
    g_ = import_onnx(model)
    assert_text_roundtrip(g_)
    assert [v.type.shape for v in g_.outputs] == [exp[o].shape for o in outs]


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_recurrent_directions_layouts(op, direction, layout):
    _run(op, direction, layout, seq_lens=False, init=True, extra={})


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_recurrent_sequence_lengths(op, direction):
    _run(op, direction, 0, seq_lens=True, init=False, extra={})


def test_gru_linear_before_reset_and_clip():
    _run("GRU", "bidirectional", 0, seq_lens=False, init=True, extra=dict(linear_before_reset=1, clip=0.7))


def test_lstm_peepholes_input_forget():
    _run("LSTM", "forward", 0, seq_lens=False, init=True, extra=dict(input_forget=1), peephole=True)
    _run("LSTM", "bidirectional", 0, seq_lens=False, init=True, extra={}, peephole=True)


def test_rnn_custom_activations():
    _run("RNN", "bidirectional", 0, seq_lens=False, init=False,
         extra=dict(activations=["LeakyRelu", "HardSigmoid"], activation_alpha=[0.2, 0.3],
                    activation_beta=[0.4]))
    _run("GRU", "forward", 0, seq_lens=False, init=True, extra=dict(activations=["HardSigmoid", "Softsign"]))
