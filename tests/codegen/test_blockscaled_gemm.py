"""W4A4 ``quantized_linear`` on b200 (``codegen/kernels/gemm_cutlass/blockscaled_rule.py``) without a GPU: which
nodes the rule takes and why it declines the others, the two launches' arguments and the memory-plan temporaries,
and (slow: a CUTLASS probe build) the block-scaled GEMM's Params layout, derived from CUTLASS's own
``to_underlying_arguments`` like the bf16 ones and rebuilt in Python for a shape the probe did not run.
Nothing here runs on a B200; the whole artifact is compiled in ``test_lower_quant.py``.
"""

from __future__ import annotations

import os
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ingot.codegen.kernels.gemm_cutlass import blockscaled_rule as bs
from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp
from ingot.codegen.kernels.gemm_cutlass.build import cutlass_available
from ingot.codegen.memory_plan import plan_memory
from ingot.codegen.target import get_target
from ingot.ir.graph import Graph, Weight
from ingot.ir.ops.quantized import QuantizedLinear
from ingot.ir.types import DType, TensorType
from tests.codegen.common import session_kernel_cache  # noqa: F401 (a fixture)

B200 = get_target("b200")
needs_cutlass = pytest.mark.skipif(not cutlass_available(),
                                   reason="needs nvcc and CUTLASS headers: pip install nvidia-cutlass nvidia-cuda-nvcc")


def _graph(fmt: str = "nvfp4", act: str | None = None, static: bool = True, n: int = 256, k: int = 512,
           residual: bool = False) -> Graph:
    """x bf16[T, k] -> one quantized_linear with sm100-swizzled scales (as pack-sm100 leaves it)."""
    act = fmt if act is None else act
    vec = 16 if fmt == "nvfp4" else 32
    g = Graph()
    x = g.add_input("x", TensorType(DType.bf16, ("T", k)))

    def weight(name: str, dt: DType, shape: tuple[int, ...]) -> object:
        return g.add_weight(name, Weight(TensorType(dt, shape), lambda: np.zeros(shape, dt.np)))

    w = weight("w.weight", DType.u8, (n, k // 2))
    sf = weight("w.weight_scale", DType.f8e4m3fn if fmt == "nvfp4" else DType.f8e8m0,
                (-(-n // 128) * 128, -(-k // vec // 4) * 4))
    s2 = weight("w.weight_scale_2", DType.f32, ()) if fmt == "nvfp4" else None
    xs = weight("w.input_scale", DType.f32, ()) if static and act == "nvfp4" else None
    res = g.add_input("res", TensorType(DType.bf16, ("T", n))) if residual else None
    op = QuantizedLinear(weight_format=fmt, weight_granularity="block", act_format=act,
                         act_granularity="tensor" if static and act == "nvfp4" else "token", scale_layout="sm100",
                         in_features=k)
    g.add_output(g.add1(op, [x, w, sf, s2, xs, None, res], "y"))
    return g


@pytest.mark.skipif(not cutlass_available(), reason="the rule declines without CUTLASS")
@pytest.mark.parametrize("fmt,static,residual", [("nvfp4", True, False), ("nvfp4", False, True),
                                                 ("mxfp4", False, False)])
def test_two_launches_and_their_temporaries(fmt, static, residual):
    g = _graph(fmt, static=static, residual=residual)
    (node,) = g.nodes
    assert bs.applies(node, B200) and bs.decline_reason(node, B200) is None
    (quant, qargs), (gemm, gargs) = bs.plan_launches(node, B200)
    for spec, args in ((quant, qargs), (gemm, gargs)):
        assert [p.name for p in spec.params] == list(args)
        assert args["M"] == {"dim": "T"}
    assert quant.family == "quant_act" and quant.value("STATIC") is static and quant.value("K") == 512
    assert gemm.template == "sm100_blockscaled.cu" and cp.is_generic(gemm) and gemm.value("N") == 0
    assert gemm.value("HAS_RESIDUAL") is residual and gemm.value("SF_VECTOR") == (16 if fmt == "nvfp4" else 32)
    assert {p.name for p in gemm.params if p.ctype == "ptr"} <= set(cp.POINTERS)  # CutlassLaunch binds by name
    for name in ("x_fp4", "x_block_scale"):
        assert qargs[name] == {"buffer": f"y.{name}"}
    assert gargs["x"] == qargs["x_fp4"] and gargs["x_block_scale"] == qargs["x_block_scale"]
    assert gargs["weight_block_scale"] == {"buffer": "w.weight_scale"} and gargs["out"] == {"buffer": "y"}
    assert gargs["x_scale"] == qargs["x_scale"]
    if fmt == "nvfp4":
        assert qargs["x_scale"] == {"buffer": "y.x_scale"}
        assert qargs["weight_scale_2"] == {"buffer": "w.weight_scale_2"}
        assert qargs["input_scale"] == ({"buffer": "w.input_scale"} if static else {"null": True})
    else:
        assert qargs["x_scale"] == qargs["input_scale"] == qargs["weight_scale_2"] == {"null": True}
    assert gargs["residual"] == ({"buffer": "res"} if residual else {"null": True})
    temps = bs.temporaries(g, B200)
    cols = 32 if fmt == "nvfp4" else 16
    want = {"y.x_fp4": (0, TensorType(DType.u8, ("T", 256))),
            "y.x_block_scale": (0, TensorType(DType.u8, ("(T+127)", cols)))}
    if fmt == "nvfp4":
        want["y.x_scale"] = (0, TensorType(DType.f32, ("T",)))
    assert temps == want
    plan = plan_memory(g, {"T": 300}, temporaries=temps)
    sf = plan.buffers["y.x_block_scale"]
    assert sf.region == "scratch" and sf.nbytes >= 384 * cols  # 300 rows padded to 3 atoms of 128


def test_declined_combinations_say_why():
    cases = [(_graph("nvfp4", act="none", static=False), "weight-only FP4 with sm100-swizzled scales has no kernel"),
             (_graph("mxfp4", act="none"), "weight-only FP4"),
             (_graph("nvfp4", n=100), "N % 8 == 0")]
    for g, why in cases:
        (node,) = g.nodes
        assert why in (bs.decline_reason(node, B200) or ""), why
        assert not bs.applies(node, B200)
    (node,) = _graph().nodes
    assert "no FP4 tensor cores" in (bs.decline_reason(node, get_target("h200")) or "")


def test_no_cutlass_declines(monkeypatch):
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    (node,) = _graph().nodes
    assert "the only W4A4 kernel" in (bs.decline_reason(node, B200) or "") and not bs.applies(node, B200)


@pytest.mark.slow
@needs_cutlass
@pytest.mark.parametrize("fmt", ["nvfp4", pytest.param("mxfp4", marks=pytest.mark.skipif(
    not os.environ.get("INGOT_SLOW"), reason="set INGOT_SLOW=1 to probe the MXFP4 layout too (~40 s in CI)"))])
@pytest.mark.usefixtures("session_kernel_cache")
def test_params_layout_reproduces_cutlass(fmt):
    """``derive_layout`` checks the layout against all probe shapes (it raises otherwise); here: the scale-factor
    descriptors and layout integers it found, and a blob for one more shape; for both epilogues (plain, residual).

    The two probes build side by side, one a core, into the session's kernel cache (test_lower_quant.py's): the W4A4
    lowering there needs both layouts (its plain and residual GEMMs), and finds them there instead of building the
    residual one alone beside its cubins."""
    with ThreadPoolExecutor(2) as pool:
        layout, res_layout = pool.map(lambda r: cp.params_layout(bs.blockscaled_spec(fmt, B200, residual=r)),
                                      (False, True))
    kt = "K/64" if fmt == "nvfp4" else "K/128"
    sfa = next(t for t in layout["tma"] if t["tensor"] == "x_block_scale")
    assert sfa["dims"] == [[256, ""], [1, kt], [1, "M/128"], [1, ""]]  # 512-byte atoms of u16, per K atom, M atom
    assert sfa["strides"] == [[512, ""], [512, kt], [512, f"{kt}*M/128"]]
    x = next(t for t in layout["tma"] if t["tensor"] == "x")
    assert x["dims"][:2] == [[1, "K"], [1, "M"]] and x["strides"][0] == [1, "K/2"]  # packed e2m1 rows
    assert {t["tensor"] for t in layout["tma"]} == {"x", "weight", "x_block_scale", "weight_block_scale", "out"}
    assert {name for _, name in layout["pointers"]} >= {"x_scale", "bias"}
    assert layout["ints"] and layout["cluster"] == [1, 1, 1] and layout["block"] == [256, 1, 1]
    # derive_layout takes the second half of each TMA atom as padding (cutlass_params._atom_tails): nothing live there
    for lay in (layout, res_layout):
        live = {off + j for off, *_ in lay["ints"] for j in range(4)}
        live |= {off + j for off, _ in lay["pointers"] for j in range(8)}
        assert not cp._atom_tails(lay["tma"]) & live
    encoded = {}

    def encode(t, address, dims, strides):
        encoded[t["tensor"]] = (address, dims, strides)
        return bytes(cp.TMA_BYTES)

    m, n, k = 777, 1536, 2048
    ptrs = {"x": 0x1000, "weight": 0x2000, "x_block_scale": 0x3000, "weight_block_scale": 0x4000, "out": 0x5000,
            "x_scale": 0x6000}
    blob, launch = cp.build_params(layout, ptrs, m, n, k, 148, encode=encode)
    assert len(blob) == layout["size"]
    assert struct.unpack_from("<4i", blob, layout["problem_shape"]) == (m, n, k, 1)
    katoms = k // (64 if fmt == "nvfp4" else 128)
    assert encoded["x_block_scale"] == (0x3000, [256, katoms, 7, 1], [512, 512 * katoms, 512 * katoms * 7])
    assert encoded["weight_block_scale"] == (0x4000, [256, katoms, 12, 1], [512, 512 * katoms, 512 * katoms * 12])
    assert encoded["x"] == (0x1000, [k, m, 1], [k // 2, 0])
    # 128x128 tiles, 1-SM: 7 x 12 tiles, rasterized along M (more N tiles than M)
    assert launch["grid"] == (7, 12, 1)
    # the residual epilogue (o_proj, down): the same operands and scale-factor descriptors, plus its C operand read
    # like the output (bf16 [M, N] rows), and the same tiles
    assert {t["tensor"] for t in res_layout["tma"]} == {t["tensor"] for t in layout["tma"]} | {"residual"}
    assert next(t for t in res_layout["tma"] if t["tensor"] == "x_block_scale") == sfa
    encoded.clear()
    res_blob, res_launch = cp.build_params(res_layout, {**ptrs, "residual": 0x7000}, m, n, k, 148, encode=encode)
    assert len(res_blob) == res_layout["size"]
    assert struct.unpack_from("<4i", res_blob, res_layout["problem_shape"]) == (m, n, k, 1)
    assert encoded["out"] == (0x5000, [n, m, 1], [2 * n, 0]) and encoded["residual"] == (0x7000, [n, m, 1], [2 * n, 0])
    assert res_launch["grid"] == (7, 12, 1)
