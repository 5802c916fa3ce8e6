"""Single-node ingot-vs-onnxruntime checks shared by test_reduce.py and test_norm.py.

Narrow-float models (f16, bf16) are checked against onnxruntime running the same node in float32
on the same (exactly upcast) values, its results rounded back: ingot's references compute narrow
floats in float32, so both sides round nearly the same float32 values once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ml_dtypes
import numpy as np
import onnx
from onnx import helper as oh
from onnx import numpy_helper

from tests.helpers import assert_close, assert_text_roundtrip, make_model, run_ingot, run_ort

_NARROW = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def onnx_type(dtype: np.dtype | type) -> int:
    dt = np.dtype(dtype)
    if dt == np.dtype(ml_dtypes.bfloat16):
        return onnx.TensorProto.BFLOAT16
    return oh.np_dtype_to_tensor_dtype(dt)


def _initializer(name: str, a: np.ndarray) -> onnx.TensorProto:
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        bits = a.view(np.uint16).reshape(-1).tolist()
        return oh.make_tensor(name, onnx.TensorProto.BFLOAT16, a.shape, bits, raw=False)
    return numpy_helper.from_array(a, name)


def build(node: onnx.NodeProto, feeds: Mapping[str, np.ndarray], out_dtypes: Sequence[np.dtype | type],
          opset: int, consts: Mapping[str, np.ndarray] | None = None,
          in_shapes: Mapping[str, list] | None = None) -> onnx.ModelProto:
    ins = [oh.make_tensor_value_info(k, onnx_type(v.dtype), (in_shapes or {}).get(k, list(v.shape)))
           for k, v in feeds.items()]
    outs = [oh.make_tensor_value_info(o, onnx_type(t), None) for o, t in zip(node.output, out_dtypes) if o]
    inits = [_initializer(k, v) for k, v in (consts or {}).items()]
    return make_model(node, ins, outs, opset=opset, initializers=inits)


def _up(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype in _NARROW else a


def check(node: onnx.NodeProto, feeds: Mapping[str, np.ndarray], out_dtypes: Sequence[np.dtype | type],
          opset: int, consts: Mapping[str, np.ndarray] | None = None,
          in_shapes: Mapping[str, list] | None = None, rtol: float | None = None,
          atol: float | None = None) -> tuple[dict[str, np.ndarray], onnx.ModelProto]:
    """Run ``node`` through ingot and onnxruntime, compare every output, round-trip the text form."""
    from ingot.frontend.onnx import import_onnx

    consts = dict(consts or {})
    model = build(node, feeds, out_dtypes, opset, consts, in_shapes)
    got = run_ingot(model, feeds)
    out_np = [np.dtype(t) for t in out_dtypes]
    narrow = any(a.dtype in _NARROW for a in [*feeds.values(), *consts.values()]) or any(
        t in _NARROW for t in out_np
    )
    if narrow:
        ref_model = build(node, {k: _up(v) for k, v in feeds.items()},
                          [np.float32 if t in _NARROW else t for t in out_np], opset,
                          {k: _up(v) for k, v in consts.items()}, in_shapes)
        exp = run_ort(ref_model, {k: _up(v) for k, v in feeds.items()})
        want = {o: t for o, t in zip(node.output, out_np) if o}
        exp = {k: v.astype(want[k]) for k, v in exp.items()}
    else:
        exp = run_ort(model, feeds)
    for o in node.output:
        if o:
            assert_close(got[o], exp[o], rtol=rtol, atol=atol, what=f"{node.op_type} output {o!r}")
    assert_text_roundtrip(import_onnx(model))
    return got, model
