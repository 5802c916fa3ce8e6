"""The FP8 activation quantizer of W8A8 prefill steps (``codegen/kernels/quant_act/fp8.cu``) without a GPU: its spec
(parameters, one block per row, the K it accepts) and its build for sm_90a and sm_100a (the row held in registers,
no local memory, hardware E4M3 conversions). Its bytes against ``quantize_activation``'s and the pair with the FP8
GEMM: ``test_quant_act_fp8_gpu.py``; its place in the kernel table: ``test_quant_prefill_gemm.py``.
"""

from __future__ import annotations

import pytest

from ingot.codegen.kernels.quant_act.rule import FP8_BLOCK, FP8_MAX_K, fp8_quantizer_spec
from ingot.codegen.target import get_target
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    module_kernel_cache,
    needs_compiler,
    sass_opcodes,
)


def test_spec_is_one_block_per_row():
    spec = fp8_quantizer_spec(2048, get_target("h200"), static=False)
    assert [(p.name, p.ctype) for p in spec.params] == [("x", "ptr"), ("input_scale", "ptr"), ("x_fp8", "ptr"),
                                                        ("x_scale", "ptr"), ("M", "i64")]
    assert spec.grid_dims({"M": 300}) == (300, 1, 1) and spec.block == (FP8_BLOCK, 1, 1)
    assert spec.entry.startswith("quant_act_fp8_k2048_")
    static = fp8_quantizer_spec(2048, get_target("h200"), static=True)
    assert static.entry.startswith("quant_act_fp8_k2048_static_") and static.key != spec.key


@pytest.mark.parametrize("k", [0, 8, 200, FP8_MAX_K + 16])
def test_spec_refuses_rows_it_cannot_hold(k):
    with pytest.raises(ValueError, match="multiple of 16"):
        fp8_quantizer_spec(k, get_target("h200"), static=False)


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("k,static", [(480, False), (2048, True), (8208, False), (FP8_MAX_K, False)])
def test_compiles_without_spills(target, k, static):
    """Rows below, at and past one chunk per thread (8208: five, the last partial), up to the widest."""
    tgt = get_target(target)
    spec = fp8_quantizer_spec(k, tgt, static)
    ops = sass_opcodes(spec, tgt.arch)
    assert_no_local_memory(ops, spec.entry)
    assert any(o.startswith("F2FP") for o in ops), sorted(ops)  # cvt.rn.satfinite.e4m3x2.f32 in hardware
