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


class _StandInDriver:
    """Records kv_tma's driver calls: the tensor maps' encode arguments and what is copied into the module global."""

    class _Names:
        def __getattr__(self, name: str) -> str:
            return name

    CUtensorMapDataType = CUtensorMapInterleave = CUtensorMapSwizzle = _Names()
    CUtensorMapL2promotion = CUtensorMapFloatOOBfill = _Names()
    CUresult = type("CUresult", (), {"CUDA_SUCCESS": 0})

    def __init__(self) -> None:
        self.encodes: list[tuple] = []
        self.copies: list[tuple[int, bytes]] = []

    @staticmethod
    def cuuint64_t(v: int) -> int:
        return v

    cuuint32_t = cuuint64_t

    def cuTensorMapEncodeTiled(self, *args):  # noqa: N802 (the driver's name)
        from types import SimpleNamespace

        self.encodes.append(args)
        return 0, SimpleNamespace(opaque=list(range(100, 116)))

    def cuModuleGetGlobal(self, module, symbol):  # noqa: N802
        return 0, 0x5000, 144

    def cuMemcpyHtoD(self, dst, src, n):  # noqa: N802
        import ctypes

        self.copies.append((dst, ctypes.string_at(src, n)))
        return (0,)


def test_maps_encode_the_layouts_the_kernels_read(monkeypatch):
    """The KV map views the region as rows of KV x D bf16 (dims {D, KV, rows}, a 64 x 1 x R box); the weight map as
    rows of K (dims {K, rows}, a 64 x (64 x warpgroups) box); each module global gets the map's 16 words, the region's
    base and its size."""
    import struct

    from ingot.codegen.kernels.gemv.skinny_rule import skinny_spec
    from ingot.runtime import cuda_driver
    from ingot.runtime.kv_tma import fill_kv_tma, fill_w_tma, tensor_maps

    fake = _StandInDriver()
    monkeypatch.setattr(cuda_driver, "driver", lambda: fake)
    base = 0x7F0000000000
    attn = wgmma_spec(bf16, bf16, 32, 8, 128, 16, 0.088, H200)
    skinny = skinny_spec(16384, 2048, 32, H200)
    assert [a for a, _ in tensor_maps(attn)] == ["kv_cache"] and [a for a, _ in tensor_maps(skinny)] == ["weight"]
    fill_kv_tma("module", attn, base, 1000 * 2048)
    fill_w_tma("module", skinny, base, 16384 * 4096)
    (_, rank, at, dims, strides, box, steps, *modes), w = fake.encodes
    assert (rank, at, dims, strides, box, steps) == (3, base, [128, 8, 1000], [256, 2048], [64, 1, 16], [1, 1, 1])
    assert modes[1] == "CU_TENSOR_MAP_SWIZZLE_128B" and modes[3] == "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"
    assert w[1:7] == (2, base, [2048, 16384], [4096], [64, 128], [1, 1])
    for (dst, blob), nbytes in zip(fake.copies, (1000 * 2048, 16384 * 4096)):
        assert dst == 0x5000 and blob == struct.pack("<18Q", *range(100, 116), base, nbytes)
    assert w[0] == "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16" and w[8] == "CU_TENSOR_MAP_SWIZZLE_128B"
    # e4m3 weights (weight-only FP8): rows of K bytes, boxes of 64-byte rows with the 64-byte swizzle
    fill_w_tma("module", skinny_spec(16384, 2048, 32, H200, wb=1), base, 16384 * 2048)
    f = fake.encodes[-1]
    assert f[:7] == ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 2, base, [2048, 16384], [2048], [64, 128], [1, 1])
    assert f[8] == "CU_TENSOR_MAP_SWIZZLE_64B" and fake.copies[-1][1][-16:] == struct.pack("<2Q", base, 16384 * 2048)
    with pytest.raises(ValueError, match=r"weight \(K 2048, e4m3\) tensor map"):
        fill_w_tma("module", skinny_spec(16384, 2048, 32, H200, wb=1), base, 16384 * 2048 + 1000)
    # NVFP4 weights: rows of K / 2 bytes, boxes of 32-byte rows landing densely
    fill_w_tma("module", skinny_spec(16384, 2048, 32, H200, wb=0), base, 16384 * 1024)
    f = fake.encodes[-1]
    assert f[:7] == ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 2, base, [1024, 16384], [1024], [32, 128], [1, 1])
    assert f[8] == "CU_TENSOR_MAP_SWIZZLE_NONE" and fake.copies[-1][1][-16:] == struct.pack("<2Q", base, 16384 * 1024)
    with pytest.raises(ValueError, match=r"weight \(K 2048, nvfp4\) tensor map"):
        fill_w_tma("module", skinny_spec(16384, 2048, 32, H200, wb=0), base, 16384 * 1024 + 100)
