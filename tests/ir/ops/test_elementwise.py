"""Elementwise ops: ingot vs onnxruntime on fresh random inputs, type inference, text round-trip.

Narrow floats (f16, bf16) are checked against onnxruntime run in float32 on the same (upcast)
inputs with the result rounded to the narrow type: ingot computes in f32 and rounds once, so the
two agree to one unit in the last place.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

from ingot.frontend.onnx import import_onnx
from ingot.ir.op import OpError
from ingot.ir.ops.elementwise import BitCast, Clip, Cumulative, Where, binary, compare, unary
from ingot.ir.types import DType, TensorType
from tests.helpers import assert_close, assert_text_roundtrip, make_model, rng, run_ingot, run_ort

_ELEM = {
    np.dtype(np.float32): TP.FLOAT, np.dtype(np.float64): TP.DOUBLE, np.dtype(np.float16): TP.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): TP.BFLOAT16, np.dtype(np.int8): TP.INT8, np.dtype(np.int16): TP.INT16,
    np.dtype(np.int32): TP.INT32, np.dtype(np.int64): TP.INT64, np.dtype(np.uint8): TP.UINT8,
    np.dtype(np.uint16): TP.UINT16, np.dtype(np.uint32): TP.UINT32, np.dtype(np.uint64): TP.UINT64,
    np.dtype(np.bool_): TP.BOOL,
}
_NARROW = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _model(op: str, feeds: dict[str, np.ndarray], out_dtypes: list[np.dtype], opset: int = 21,
           inits: dict[str, np.ndarray] | None = None, inputs: list[str] | None = None,
           **attrs) -> onnx.ModelProto:
    """A one-node model; ``inputs`` orders the node's inputs (names from feeds/inits, "" omitted)."""
    inits = inits or {}
    names = inputs if inputs is not None else list(feeds) + list(inits)
    node = oh.make_node(op, names, [f"y{i}" for i in range(len(out_dtypes))], **attrs)
    vis = [oh.make_tensor_value_info(k, _ELEM[v.dtype], v.shape) for k, v in feeds.items()]
    outs = [oh.make_tensor_value_info(f"y{i}", _ELEM[np.dtype(d)], None) for i, d in enumerate(out_dtypes)]
    tensors = [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()]
    return make_model(node, vis, outs, opset=opset, initializers=tensors)


def check(op: str, feeds: dict[str, np.ndarray], out_dtype: np.dtype | type | None = None, opset: int = 21,
          inits: dict[str, np.ndarray] | None = None, inputs: list[str] | None = None,
          rtol: float | None = None, atol: float | None = None, **attrs) -> np.ndarray:
    """Run one node through ingot and onnxruntime and compare every element."""
    first = next(iter(feeds.values()))
    out_dtype = np.dtype(out_dtype or first.dtype)
    got = run_ingot(_model(op, feeds, [out_dtype], opset, inits, inputs, **attrs), feeds)["y0"]
    if out_dtype in _NARROW or any(v.dtype in _NARROW for v in feeds.values()):
        up = {k: v.astype(np.float32) if v.dtype in _NARROW else v for k, v in feeds.items()}
        up_inits = {k: v.astype(np.float32) if v.dtype in _NARROW else v for k, v in (inits or {}).items()}
        up_out = np.dtype(np.float32) if out_dtype in _NARROW else out_dtype
        exp = run_ort(_model(op, up, [up_out], opset, up_inits, inputs, **attrs), up)["y0"]
        exp = exp.astype(out_dtype)
    else:
        exp = run_ort(_model(op, feeds, [out_dtype], opset, inits, inputs, **attrs), feeds)["y0"]
    assert_close(got, exp, rtol=rtol, atol=atol, what=f"{op} {attrs}")
    return got


def _uniform(shape: tuple[int, ...], lo: float, hi: float, dtype: type | np.dtype = np.float32) -> np.ndarray:
    return rng().uniform(lo, hi, shape).astype(dtype)


def _ints(shape: tuple[int, ...], lo: int, hi: int, dtype: type | np.dtype,
          nonzero: bool = False) -> np.ndarray:
    x = rng().integers(lo, hi, shape).astype(dtype)
    if nonzero:
        x[x == 0] = 1
    return x


# -- unary math -----------------------------------------------------------------------------------

_UNARY_DOMAINS = {
    "Abs": (-5, 5), "Neg": (-5, 5), "Exp": (-6, 6), "Log": (0.05, 20), "Sqrt": (0.01, 20),
    "Reciprocal": (0.25, 4), "Sin": (-6, 6), "Cos": (-6, 6), "Tan": (-1.3, 1.3), "Asin": (-0.95, 0.95),
    "Acos": (-0.95, 0.95), "Atan": (-8, 8), "Sinh": (-4, 4), "Cosh": (-4, 4), "Asinh": (-8, 8),
    "Acosh": (1.05, 9), "Atanh": (-0.95, 0.95), "Erf": (-3, 3), "Floor": (-9, 9), "Ceil": (-9, 9),
    "Sign": (-3, 3), "Relu": (-3, 3), "Sigmoid": (-12, 12), "Tanh": (-5, 5), "Softplus": (-10, 10),
    "Softsign": (-6, 6), "HardSwish": (-5, 5), "Mish": (-6, 6),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("op", sorted(_UNARY_DOMAINS))
def test_unary_float(op: str, dtype: type) -> None:
    lo, hi = _UNARY_DOMAINS[op]
    x = _uniform((3, 17), lo, hi, dtype)
    opset = 18 if op == "Mish" else 21
    # ORT's f32 tanh/sigmoid/exp-family kernels are polynomial approximations (~1e-6 relative)
    rtol = 1e-5 if dtype == np.float32 else None
    check(op, {"x": x}, opset=opset, rtol=rtol, atol=2e-6 if dtype == np.float32 else None)


def test_unary_float64_and_bfloat16() -> None:
    for op in ("Exp", "Sqrt", "Sin", "Tanh", "Floor"):
        lo, hi = _UNARY_DOMAINS[op]
        check(op, {"x": _uniform((4, 5), lo, hi, np.float64)})
    for op in ("Exp", "Sigmoid", "Neg"):
        lo, hi = _UNARY_DOMAINS[op]
        check(op, {"x": _uniform((4, 5), lo, hi, ml_dtypes.bfloat16)})


def test_round_half_to_even() -> None:
    x = (rng().integers(-20, 20, (50,)) / 2).astype(np.float32)  # many exact .5 ties
    x += _uniform((50,), -0.01, 0.01) * (rng().random(50) < 0.3)
    got = check("Round", {"x": x})
    assert got[np.nonzero(x == 2.5)].tolist() in ([], [2.0] * int(np.sum(x == 2.5)))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
@pytest.mark.parametrize("op", ["Abs", "Neg", "Sign", "Relu"])
def test_unary_int(op: str, dtype: type) -> None:
    if op == "Relu" and dtype == np.int64:
        dtype = np.int32  # onnxruntime has no int64 Relu
    check(op, {"x": _ints((4, 6), -100, 100, dtype)})


def test_isnan_isinf() -> None:
    x = _uniform((5, 8), -3, 3)
    flat = x.reshape(-1)
    idx = rng().choice(flat.size, 12, replace=False)
    flat[idx[:4]], flat[idx[4:8]], flat[idx[8:]] = np.nan, np.inf, -np.inf
    check("IsNaN", {"x": x}, np.bool_)
    for neg in (0, 1):
        for pos in (0, 1):
            check("IsInf", {"x": x}, np.bool_, detect_negative=neg, detect_positive=pos)
    check("IsInf", {"x": x.astype(np.float16)}, np.bool_)


def test_not_and_bitwise_not() -> None:
    check("Not", {"x": rng().random((3, 4, 5)) < 0.5})
    for dt in (np.int32, np.uint8, np.int64):
        check("BitwiseNot", {"x": _ints((3, 7), 0, 120, dt)}, opset=18)


# -- activations ----------------------------------------------------------------------------------

_ACTIVATIONS = [
    ("LeakyRelu", {"alpha": 0.3}, 21),
    ("LeakyRelu", {}, 21),
    ("Elu", {"alpha": 0.7}, 21),
    ("Selu", {}, 21),
    ("Selu", {"alpha": 1.3, "gamma": 0.9}, 21),
    ("Celu", {"alpha": 1.5}, 21),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 21),
    ("ThresholdedRelu", {"alpha": 0.5}, 21),
    ("Gelu", {}, 20),
    ("Gelu", {"approximate": "tanh"}, 20),
    ("Swish", {"alpha": 0.8}, 24),
    ("Shrink", {"bias": 0.2, "lambd": 0.6}, 21),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("op", "attrs", "opset"), _ACTIVATIONS)
def test_activation(op: str, attrs: dict, opset: int, dtype: type) -> None:
    x = _uniform((2, 3, 11), -4, 4, dtype)
    check(op, {"x": x}, opset=opset, atol=2e-6 if dtype == np.float32 else None, **attrs)


def test_shrink_int() -> None:
    check("Shrink", {"x": _ints((4, 9), -10, 10, np.int32)}, bias=1.0, lambd=2.0)


@pytest.mark.parametrize(("xs", "ss"), [((2, 3, 4), (4,)), ((2, 3, 4), (3, 1)), ((5, 6), (1,))])
def test_prelu_broadcast(xs: tuple, ss: tuple) -> None:
    x, s = _uniform(xs, -3, 3), _uniform(ss, 0.05, 0.5)
    check("PRelu", {"x": x, "s": s})
    check("PRelu", {"x": x}, inits={"s": s})


# -- binary / variadic ----------------------------------------------------------------------------

_SHAPES = [((3, 4, 5), (4, 1)), ((2, 1, 5), (3, 1)), ((), (2, 3)), ((4, 3), (4, 3))]


def _pair(op: str, dtype: type, sa: tuple, sb: tuple) -> dict[str, np.ndarray]:
    if np.dtype(dtype).kind == "f":
        if op == "Pow":
            return {"a": _uniform(sa, 0.2, 3, dtype), "b": _uniform(sb, -2.5, 2.5, dtype)}
        b = _uniform(sb, 0.5, 3, dtype) * np.where(rng().random(sb) < 0.5, -1, 1).astype(dtype)
        return {"a": _uniform(sa, -5, 5, dtype), "b": b.astype(dtype)}
    if op == "Pow":
        return {"a": _ints(sa, -4, 5, dtype), "b": _ints(sb, 0, 5, dtype)}
    return {"a": _ints(sa, -50, 50, dtype), "b": _ints(sb, -9, 9, dtype, nonzero=True)}


@pytest.mark.parametrize(("sa", "sb"), _SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"])
def test_binary(op: str, dtype: type, sa: tuple, sb: tuple) -> None:
    check(op, _pair(op, dtype, sa, sb))


def test_int_div_truncates_and_small_ints() -> None:
    a = np.array([7, -7, 7, -7, 1, -1, 0, -128], np.int8)
    b = np.array([2, 2, -2, -2, 3, 3, 5, 3], np.int8)
    got = check("Div", {"a": a, "b": b})
    assert got.tolist() == [3, -3, -3, 3, 0, 0, 0, -42]
    for dt in (np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.uint64):
        lo = 0 if np.dtype(dt).kind == "u" else -100
        check("Div", {"a": _ints((6, 5), lo, 100, dt), "b": _ints((5,), 1 if lo == 0 else -9, 9, dt, True)})
        check("Mul", {"a": _ints((6, 5), lo, 100, dt), "b": _ints((5,), 0, 9, dt)})


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.float32, np.float64])
def test_mod(dtype: type, fmod: int) -> None:
    feeds = _pair("Mod", dtype, (3, 4), (4,))
    if np.dtype(dtype).kind == "f" and not fmod:
        # onnxruntime rejects float Mod with fmod=0: the reference is Python's float %
        m = _model("Mod", feeds, [np.dtype(dtype)], fmod=0)
        a, b = np.broadcast_arrays(feeds["a"], feeds["b"])
        exp = np.array([float(x) % float(y) for x, y in zip(a.ravel(), b.ravel())]).astype(dtype)
        assert_close(run_ingot(m, feeds)["y0"], exp.reshape(a.shape))
        return
    check("Mod", feeds, fmod=fmod)


def test_pow_mixed_dtypes() -> None:
    a = _uniform((3, 4), 0.3, 2.5)
    check("Pow", {"a": a, "b": _ints((4,), -3, 4, np.int64)})
    check("Pow", {"a": a, "b": _ints((3, 1), -2, 3, np.int32)})
    check("Pow", {"a": _ints((3, 4), 1, 6, np.int64), "b": _uniform((4,), 0, 2.5)})
    check("Pow", {"a": _ints((3, 4), 1, 6, np.int32), "b": _uniform((4,), 0, 2.5)})


@pytest.mark.parametrize(("op", "dtype"), [
    (op, dt) for op in ("Max", "Min", "Sum", "Mean") for dt in (np.float32, np.float16)
] + [("Max", np.int32), ("Min", np.int64), ("Sum", np.float64), ("Max", np.uint8)])
def test_variadic(op: str, dtype: type) -> None:
    shapes = [(3, 1), (1, 4), (4,)]
    mk = (lambda s: _uniform(s, -4, 4, dtype)) if np.dtype(dtype).kind == "f" else (
        lambda s: _ints(s, 0, 50, dtype))

    def atol(feeds: dict[str, np.ndarray]) -> float | None:
        """float16 Sum / Mean fold into pairwise adds, each partial sum rounded to float16, while the reference adds
        in float32 and rounds once: each of the n - 1 partial sums may be off by half a float16 ulp at its
        magnitude (at most the sum of the inputs' largest magnitudes), however small the result."""
        if dtype is not np.float16 or op not in ("Sum", "Mean") or len(feeds) < 3:
            return None
        bound = np.float16(sum(float(np.abs(v).max()) for v in feeds.values()))
        return (len(feeds) - 1) * float(np.spacing(bound)) / 2 + 1e-3

    three = {f"x{i}": mk(s) for i, s in enumerate(shapes)}
    check(op, three, atol=atol(three))
    check(op, {"x0": mk((2, 3))})
    check(op, {"x0": mk((2, 3)), "x1": mk((2, 3))})


# -- comparisons, logic, bitwise ------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.uint8, np.float16])
def test_compare(op: str, dtype: type) -> None:
    a = _ints((3, 4, 5), 0, 6, np.int64).astype(dtype)  # small range: many equal pairs
    b = _ints((4, 1), 0, 6, np.int64).astype(dtype)
    if np.dtype(dtype).kind == "f":
        a = (a + _uniform(a.shape, 0, 1) * (rng().random(a.shape) < 0.3)).astype(dtype)
    # Pin one equal, one smaller and one larger pair so no op can come out all-true or all-false
    # by chance (an unlucky draw of b once made LessOrEqual all-true).
    b[:3, 0] = np.array([1, 2, 3]).astype(dtype)
    a[0, 0, 0], a[0, 1, 0], a[0, 2, 0] = b[0, 0], 0, 5
    got = check(op, {"a": a, "b": b}, np.bool_)
    assert got.any() and not got.all()


def test_equal_bool() -> None:
    check("Equal", {"a": rng().random((3, 4)) < 0.5, "b": rng().random((4,)) < 0.5}, np.bool_)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op: str) -> None:
    check(op, {"a": rng().random((2, 3, 4)) < 0.5, "b": rng().random((3, 1)) < 0.5})


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.uint64, np.int16])
def test_bitwise(op: str, dtype: type) -> None:
    check(op, {"a": _ints((3, 4), -100, 127, dtype), "b": _ints((4,), -100, 127, dtype)}, opset=18)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_bitshift(direction: str, dtype: type) -> None:
    bits = np.dtype(dtype).itemsize * 8
    a = _ints((3, 5), 0, 250, dtype)
    check("BitShift", {"a": a, "b": _ints((5,), 0, bits, dtype)}, direction=direction)


def test_bitshift_signed_edge_cases() -> None:
    a = np.array([-128, -1, 64, 127, 5, -7, 3, 1], np.int8)
    b = np.array([1, 3, 1, 8, -1, 9, 0, 7], np.int8)
    g = import_onnx(_model("BitShift", {"a": a, "b": b}, [np.int8], direction="RIGHT"))
    from ingot.runtime.cpu import run_graph

    assert run_graph(g, {"a": a, "b": b})["y0"].tolist() == [-64, -1, 32, 0, 0, -1, 3, 0]
    g = import_onnx(_model("BitShift", {"a": a, "b": b}, [np.int8], direction="LEFT"))
    assert run_graph(g, {"a": a, "b": b})["y0"].tolist() == [0, -8, -128, 0, 0, 0, 3, -128]


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16])
def test_where(dtype: type) -> None:
    c = rng().random((3, 1)) < 0.5
    x = _uniform((1, 4), -3, 3, dtype) if np.dtype(dtype).kind == "f" else _ints((1, 4), -9, 9, dtype)
    y = _uniform((2, 3, 4), -3, 3, dtype) if np.dtype(dtype).kind == "f" else _ints((2, 3, 4), -9, 9, dtype)
    check("Where", {"c": c, "x": x, "y": y}, dtype)


# -- clip, cumulative, casts ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int8])
def test_clip(dtype: type) -> None:
    is_f = np.dtype(dtype).kind == "f"
    x = _uniform((4, 6), -5, 5, dtype) if is_f else _ints((4, 6), -100, 100, dtype)
    lo, hi = np.array(-1.5 if is_f else -30, dtype), np.array(2.25 if is_f else 40, dtype)
    check("Clip", {"x": x}, inits={"lo": lo, "hi": hi})  # constant bounds: attributes
    check("Clip", {"x": x, "lo": lo, "hi": hi})  # dynamic bounds: inputs
    check("Clip", {"x": x}, inits={"hi": hi}, inputs=["x", "", "hi"])
    check("Clip", {"x": x, "lo": lo}, inputs=["x", "lo"])
    check("Clip", {"x": x}, inits={"lo": hi, "hi": lo})  # min > max: everything is max
    check("Clip", {"x": x}, inputs=["x"])


def test_clip_opset6_attributes() -> None:
    x = _uniform((3, 5), -5, 5)
    check("Clip", {"x": x}, opset=6, min=-1.25, max=0.5)
    check("Clip", {"x": x}, opset=6, max=0.5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.float16])
@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(dtype: type, exclusive: int, reverse: int) -> None:
    x = _uniform((3, 4, 5), -2, 2, dtype) if np.dtype(dtype).kind == "f" else _ints((3, 4, 5), -9, 9, dtype)
    axis = int(rng().integers(-3, 3))
    rtol = 1e-5 if np.dtype(dtype) == np.float32 else None
    # f16: ingot accumulates in f32 and rounds each output; ORT in f32 (upcast) does the same
    check("CumSum", {"x": x}, inits={"axis": np.array(axis, np.int64)}, exclusive=exclusive,
          reverse=reverse, rtol=rtol, atol=1e-5 if rtol else None)
    check("CumSum", {"x": x, "axis": np.array(axis, np.int32)}, exclusive=exclusive, reverse=reverse,
          rtol=rtol, atol=1e-5 if rtol else None)


@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod(exclusive: int, reverse: int) -> None:
    # onnxruntime has no CumProd: the reference is written out with explicit loops
    x = _uniform((3, 6), 0.5, 1.5)
    m = _model("CumProd", {"x": x}, [np.float32], opset=26, inits={"axis": np.array(1, np.int64)},
               exclusive=exclusive, reverse=reverse)
    got = run_ingot(m, {"x": x})["y0"]
    exp = np.empty_like(x)
    for i in range(3):
        for j in range(6):
            ks = range(j, 6) if reverse else range(0, j + 1)
            ks = [k for k in ks if not (exclusive and k == j)]
            exp[i, j] = np.prod(x[i, ks].astype(np.float64)) if ks else 1.0
    assert_close(got, exp.astype(np.float32))
    xi = _ints((2, 5), -3, 4, np.int64)
    m = _model("CumProd", {"x": xi, "axis": np.array(0, np.int64)}, [np.int64], opset=26)
    assert_close(run_ingot(m, {"x": xi, "axis": np.array(0, np.int64)})["y0"], np.cumprod(xi, axis=0))


def _cast_chain(x: np.ndarray, to: int, saturate: int) -> onnx.ModelProto:
    n1 = oh.make_node("Cast", ["x"], ["t"], to=to, saturate=saturate)
    n2 = oh.make_node("Cast", ["t"], ["y0"], to=TP.FLOAT)
    g = oh.make_graph([n1, n2], "c", [oh.make_tensor_value_info("x", _ELEM[x.dtype], x.shape)],
                      [oh.make_tensor_value_info("y0", TP.FLOAT, None)])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 21)])
    m.ir_version = 10
    return m


_F8 = {TP.FLOAT8E5M2: ml_dtypes.float8_e5m2, TP.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
       TP.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz, TP.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz}


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("to", list(_F8))
def test_cast_float8(to: int, saturate: int) -> None:
    big = float(ml_dtypes.finfo(_F8[to]).max)
    x = (_uniform((64,), -1, 1) * np.exp2(rng().integers(-20, 20, 64))).astype(np.float32)
    if not saturate:
        # onnxruntime maps everything above max to NaN, even what rounds down to max: checked below
        x = np.clip(x, -big, big)
    x[:6] = [np.inf, -np.inf, np.nan, 1e6, -1e6, 0.0]
    with np.errstate(over="ignore"):
        x16 = x.astype(np.float16)  # 1e6 becomes inf
    for src in (x, x16):
        m = _cast_chain(src, to, saturate)
        assert_close(run_ingot(m, {"x": src})["y0"], run_ort(m, {"x": src})["y0"])
    # just above max rounds (to nearest even) down to max; past the half-way point it overflows
    ulp = big - float(np.nextafter(_F8[to](big), _F8[to](0)).astype(np.float32))
    x = np.array([big + 0.4 * ulp, -(big + 0.4 * ulp), big + 0.6 * ulp, np.inf], np.float32)
    got = run_ingot(_cast_chain(x, to, saturate), {"x": x})["y0"]
    over = big if saturate else (np.inf if to == TP.FLOAT8E5M2 else np.nan)
    assert_close(got, np.array([big, -big, over, over], np.float32))


def test_cast_e8m0_rounding() -> None:
    from ingot.ir.ops.core import cast_array

    x = (_uniform((200,), -1, 1) * np.exp2(rng().integers(-140, 128, 200))).astype(np.float32)
    x[:8] = [0.0, 1.0, 1.5, np.inf, np.nan, 3.4e38, 1e-45, -2.0]
    for saturate in (True, False):
        for mode in ("up", "nearest", "down"):
            got = cast_array(x, DType.f8e8m0, saturate, mode)
            exp = onnx.numpy_helper.to_float8e8m0(x, saturate, mode)
            assert_close(got.view(np.uint8), exp.view(np.uint8), what=f"{saturate} {mode}")
    got = cast_array(np.array([1.5, 3.4e38, 1.0], np.float32), DType.f8e8m0, True, "up")
    assert got.astype(np.float32).tolist() == [2.0, 2.0**127, 1.0]


def test_bitcast() -> None:
    for x, to in [(_uniform((3, 4), -9, 9), np.int32), (_ints((5,), -100, 100, np.int16), np.uint16),
                  (_uniform((2, 2), -9, 9, np.float64), np.int64), (np.array(1.5, np.float32), np.int32)]:
        check("BitCast", {"x": x}, to, opset=26, to=_ELEM[np.dtype(to)])


# -- type inference and text form -----------------------------------------------------------------


def test_type_inference() -> None:
    f32, i32 = DType.f32, DType.i32
    t = binary("add").infer([TensorType(f32, ("B", 1, 4)), TensorType(f32, (3, 1))])
    assert t == [TensorType(f32, ("B", 3, 4))]
    t = compare("less").infer([TensorType(i32, (2, 1)), TensorType(i32, (5,))])
    assert t == [TensorType(DType.bool, (2, 5))]
    t = binary("pow").infer([TensorType(DType.f16, (3,)), TensorType(DType.i64, ())])
    assert t == [TensorType(DType.f16, (3,))]
    assert unary("isnan").infer([TensorType(DType.bf16, (2,))]) == [TensorType(DType.bool, (2,))]
    t = Where().infer([TensorType(DType.bool, ("T", 1)), TensorType(i32, (4,)), TensorType(i32, ())])
    assert t == [TensorType(i32, ("T", 4))]
    assert Cumulative(fn="sum").infer([TensorType(f32, (2, 3)), TensorType(DType.i64, ())])[0].shape == (2, 3)
    assert Clip().infer([TensorType(DType.f16, (7,))]) == [TensorType(DType.f16, (7,))]
    bad = [
        (unary("exp"), [TensorType(i32, (2,))]),
        (unary("not"), [TensorType(f32, (2,))]),
        (binary("add"), [TensorType(f32, (2,)), TensorType(i32, (2,))]),
        (binary("mul"), [TensorType(f32, (3,)), TensorType(f32, (4,))]),
        (binary("and"), [TensorType(i32, (3,)), TensorType(i32, (3,))]),
        (compare("less"), [TensorType(DType.bool, (3,)), TensorType(DType.bool, (3,))]),
        (Where(), [TensorType(i32, (3,)), TensorType(f32, (3,)), TensorType(f32, (3,))]),
        (BitCast(to=DType.i64), [TensorType(f32, (3,))]),
        (Cumulative(fn="sum"), [TensorType(f32, (3,))]),
        (Clip(min=np.array(1, np.int64)), [TensorType(f32, (3,))]),
    ]
    for op, ins in bad:
        with pytest.raises(OpError):
            op.infer(ins)
    for make, fn in ((unary, "nope"), (binary, "nope"), (compare, "lt")):
        with pytest.raises(OpError, match="unknown"):
            make(fn)


def test_text_roundtrip() -> None:
    x = oh.make_tensor_value_info("x", TP.FLOAT, ["B", 8])
    nodes = [
        oh.make_node("Exp", ["x"], ["e"]),
        oh.make_node("LeakyRelu", ["e"], ["l"], alpha=0.25),
        oh.make_node("Clip", ["l", "lo", "hi"], ["c"]),
        oh.make_node("Gelu", ["c"], ["g"], approximate="tanh"),
        oh.make_node("Less", ["g", "x"], ["m"]),
        oh.make_node("Where", ["m", "g", "x"], ["w"]),
        oh.make_node("CumSum", ["w", "ax"], ["s"], reverse=1),
        oh.make_node("IsInf", ["s"], ["inf"], detect_negative=0),
        oh.make_node("BitCast", ["s"], ["bits"], to=TP.INT32),
        oh.make_node("Mod", ["bits", "seven"], ["r"], fmod=1),
    ]
    inits = [onnx.numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
             onnx.numpy_helper.from_array(np.array(3.0, np.float32), "hi"),
             onnx.numpy_helper.from_array(np.array(1, np.int64), "ax"),
             onnx.numpy_helper.from_array(np.array(7, np.int32), "seven")]
    outs = [oh.make_tensor_value_info(n, t, None) for n, t in (("r", TP.INT32), ("inf", TP.BOOL))]
    m = oh.make_model(oh.make_graph(nodes, "t", [x], outs, initializer=inits),
                      opset_imports=[oh.make_opsetid("", 26)])
    m.ir_version = 10
    g = import_onnx(m)
    text = str(g)
    for s in ("= exp(", "leaky_relu(", "clip(", "gelu(", "= less(", "where(",
              "cumulative(", "is_inf(", "bit_cast(", "= fmod("):
        assert s in text, s
    assert_text_roundtrip(g)
    feeds = {"x": _uniform((3, 8), -2, 2)}
    got, exp = run_ingot(m, feeds), run_ort(m, feeds)
    assert_close(got["inf"], exp["inf"])
    # r is the bit pattern of a float: compare the floats it encodes
    assert_close(got["r"].view(np.float32), exp["r"].view(np.float32), what="r")
