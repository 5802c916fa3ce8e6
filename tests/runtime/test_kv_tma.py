"""``runtime/kv_tma.py`` without a GPU: which kernels ask for the KV cache's tensor map, and the regions it refuses
(the map itself, its encoding and the kernels reading it run on the GPU: ``tests/codegen/test_prefill_attention_gpu.py``
``-k tma``, ``tests/runtime/test_cuda_backend.py::test_long_prefill_matches_cpu``)."""

from __future__ import annotations

import pytest

from ingot.codegen.kernels.attention.prefill_wgmma_rule import WgmmaConfig, wgmma_spec
from ingot.codegen.target import get_target
from ingot.ir.types import DType
from ingot.runtime.kv_tma import NBYTES, kv_region_rows, needs_kv_tma

bf16 = DType.bf16
H200 = get_target("h200")


def test_only_tma_configs_need_the_map():
    tma = wgmma_spec(bf16, bf16, 32, 8, 128, 16, 0.088, H200, cfg=WgmmaConfig(2, 128, 3, producer=True, tma=True))
    plain = wgmma_spec(bf16, bf16, 32, 8, 128, 16, 0.088, H200, cfg=WgmmaConfig(2, 128, 3, producer=True))
    assert needs_kv_tma(tma) and not needs_kv_tma(plain)
    assert needs_kv_tma(wgmma_spec(bf16, bf16, 32, 8, 128, 16, 0.088, H200))  # the default on h200
    assert not needs_kv_tma(wgmma_spec(bf16, bf16, 32, 8, 128, 12, 0.088, H200))  # blocks TMA cannot tile
    assert NBYTES == 144  # a CUtensorMap and two words, as prefill_wgmma.cu declares ingot_kv_tma[18]


def test_region_rows_and_refusals():
    row = 8 * 128 * 2  # 8 KV heads x head_dim 128, bf16
    assert kv_region_rows(0x7F0000000000, 16 * 1000 * row, 128, 8) == 16 * 1000
    with pytest.raises(ValueError, match="16-byte aligned whole rows"):
        kv_region_rows(0x7F0000000008, 10 * row, 128, 8)
    with pytest.raises(ValueError, match="16-byte aligned whole rows of 2048 bytes"):
        kv_region_rows(0x7F0000000000, 10 * row + 512, 128, 8)
    with pytest.raises(ValueError, match="whole rows"):
        kv_region_rows(0x7F0000000000, 0, 128, 8)
    with pytest.raises(ValueError, match="32-bit coordinates"):
        kv_region_rows(0x7F0000000000, 2**31 * 128, 64, 1)
