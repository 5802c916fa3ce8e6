"""The experimental wgmma skinny GEMM (``codegen/kernels/gemv/skinny.cu``, ``skinny_rule.py``) without a GPU: what it
takes, its launch, and its sm_90a build (wgmma with the step's tokens as N, the weight by TMA, no local memory, the
grid-dependency wait in the consumers' code only). Its numbers: ``test_gemv_skinny_gpu.py`` and
``bench/bench_skinny.py`` on an H200."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from ingot.codegen.kernels.gemv.skinny_rule import PARAMS, max_stages, skinny_spec, smem_bytes, supported
from ingot.codegen.target import get_target
from ingot.runtime.kv_tma import needs_kv_tma, needs_w_tma
from tests.codegen.common import needs_compiler

H200, B200 = get_target("h200"), get_target("b200")


def test_supported_and_declined():
    assert supported(16384, 2048, 32, H200) and supported(128256, 2048, 8, H200)
    assert not supported(16384, 2048, 32, B200)  # wgmma is sm_90a's
    assert not supported(16384, 2048, 64, H200) and not supported(16384, 2048, 4, H200)  # buckets 8 / 16 / 32
    assert not supported(16384, 2000, 8, H200)  # K a multiple of 64
    assert not supported(2048, 8192, 32, H200)  # x (512 KB) does not fit beside the stages
    assert not supported(16384, 2048, 8, H200, warpgroups=3) and not supported(16384, 2048, 8, H200, stages=1)
    with pytest.raises(ValueError, match="does not take N=2048 K=8192 for 32 tokens"):
        skinny_spec(2048, 8192, 32, H200)


def test_spec_launch_and_stages():
    spec = skinny_spec(16384, 2048, 32, H200)
    assert spec.template == "skinny.cu" and spec.arch == "sm_90a"
    assert [(p.name, p.ctype) for p in spec.params] == PARAMS
    assert spec.block == (384, 1, 1)
    assert spec.grid_dims({"M": 32}) == (128, 1, 1)  # 16384 / 128 row tiles, fewer than the SMs
    assert skinny_spec(128256, 2048, 8, H200).grid_dims({"M": 8}) == (132, 1, 1)  # persistent over 1,002 tiles
    # as many stages as fit beside x: 6 of 16 KB at 32 tokens (x 128 KB), 8 at 8 tokens
    assert max_stages(2048, 32, H200) == 6 and max_stages(2048, 8, H200) == 8
    limit = H200.smem_per_block  # 227 KB
    assert spec.smem == smem_bytes(2048, 32, 2, 6) == 1024 + 32 * 2048 * 2 + 6 * 128 * 128 + 6 * 16 <= limit
    assert smem_bytes(2048, 32, 2, 7) > limit
    assert needs_w_tma(spec) and not needs_kv_tma(spec)


@needs_compiler
@pytest.mark.parametrize("n,k,mb,wgs,stages", [(16384, 2048, 32, 2, None), (128256, 2048, 8, 2, None),
                                               (1000, 64, 16, 1, 3)])
def test_compiles_to_wgmma_with_tma(n, k, mb, wgs, stages):
    from ingot.codegen.compile import compile_spec
    from ingot.codegen.kernel import render
    from ingot.codegen.sass import disassemble

    spec = skinny_spec(n, k, mb, H200, warpgroups=wgs, stages=stages)
    built = compile_spec(spec)
    assert f"wgmma.mma_async.sync.aligned.m64n{mb}k16.f32.bf16.bf16" in built.ptx
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in built.ptx
    assert "setmaxnreg" in built.ptx if wgs == 2 else "setmaxnreg" not in built.ptx
    assert not re.search(r"\.local\b", built.ptx)
    sass = disassemble(built.cubin)
    ops = Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.x]*)", sass))
    assert ops[f"HGMMA.64x{mb}x16.F32.BF16"] == 4  # four 16-column k-steps a 64-column stage
    assert ops["UTMALDG.2D"] >= 1 and not any(o.startswith(("LDL", "STL", "HMMA")) for o in ops)
    assert ops["ACQBULK"] == 1  # one grid-dependency wait, the consumers' (the producer's copies start at once)
    assert render(spec).count("griddepcontrol.wait") == 1
    if wgs == 2:  # setmaxnreg only moves registers: the CTA must start with the 40 + 2 x 232 it hands out
        from tests.codegen.test_prefill_wgmma import _registers

        assert _registers(built.cubin) * spec.block[0] >= 128 * (40 + 2 * 232)
