"""The sm_90a direct epilogue (``gemm_cutlass/sm90_direct_epilogue.cuh``, ``Config.direct``): its configurations, and
on an H100/H200 the same bits as CUTLASS's TMA epilogue (the visitor tree of ``common.cuh``) for the same mainloop,
launched the way the CUDA backend does (cubin + a Params blob built in Python from the probed layout)."""

from __future__ import annotations

import pytest

from ingot.codegen.kernels.gemm_cutlass.rule import (
    SM90_EXPLORE,
    Config,
    config_tag,
    linear_cutlass_spec,
    variant_config,
)
from ingot.codegen.target import get_target
from tests.codegen.test_gemm_cutlass import load_generic, needs_cutlass
from tests.helpers import rng

FP8_OV = Config("sm90.cu", (128, 128, 128), (2, 1), schedule="Cooperative", threads=384, overlap=True)
BF16 = Config("sm90.cu", (128, 256, 64), (2, 1), schedule="Cooperative", threads=384)


def _direct(cfg: Config) -> Config:
    return Config(**{**cfg.__dict__, "direct": True})


def test_direct_configurations_are_named_and_rendered():
    h200 = get_target("h200")
    cfg = _direct(FP8_OV)
    assert config_tag(cfg) == "coopov128x128x128c2x1d"
    assert config_tag(FP8_OV) == "coopov128x128x128c2x1"
    spec = linear_cutlass_spec("fp8", 0, 0, h200, config=cfg)
    assert spec.value("DIRECT_EPILOGUE") is True
    assert "kDirectEpilogue = true" in spec.source()
    assert linear_cutlass_spec("fp8", 0, 0, h200, config=FP8_OV).value("DIRECT_EPILOGUE") is False
    # the FP8 default (measured ahead of the TMA epilogue on the H200, docs/PERF.md), another cluster explored
    assert variant_config("fp8", h200) == cfg and any(c.direct for c in SM90_EXPLORE["fp8"])
    # only cooperative 128-row tiles: each consumer warpgroup stores its own 64 rows
    for bad in (Config("sm90.cu", (128, 128, 64), (2, 1), schedule="Pingpong", threads=384, direct=True),
                Config("sm90.cu", (256, 128, 64), (1, 2), schedule="Cooperative", threads=384, direct=True)):
        with pytest.raises(ValueError, match="direct epilogue"):
            linear_cutlass_spec("bf16", 0, 0, h200, config=bad)


def _run(loaded, bufs, m, n, k):
    """Launch a loaded generic spec (``load_generic``) on ``bufs`` (torch tensors by pointer name) from a Python-built
    Params blob."""
    import torch

    from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp

    fn, layout = loaded
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    blob, config = cp.build_params(layout, {name: t.data_ptr() for name, t in bufs.items()}, m, n, k, sm_count)
    cp.launch(fn, blob, config, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()


def run_poisoned(loaded, bufs, m, n, k, what=""):
    """``_run`` into a bf16 output of one row more than M x N, poisoned with NaN: the kernel writes M x N exactly (the
    extra row stays NaN, checked); returns the M x N output on the host."""
    import torch

    padded = torch.full((m + 1, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    _run(loaded, bufs | {"out": padded}, m, n, k)
    assert torch.isnan(padded[m]).all(), f"{what}: wrote past M x N for {m, n, k}"
    return padded[:m].cpu()


@pytest.mark.gpu
@needs_cutlass
@pytest.mark.parametrize("kind,residual", [("fp8", False), ("fp8", True), ("bf16", False)])
def test_direct_epilogue_equals_tma_epilogue(kind, residual):
    """Row and column scales, bias and residual on problems with partial tiles: every output bit equal to CUTLASS's
    TMA epilogue's (same mainloop, same arithmetic), nothing written past the M x N output, and close to numpy."""
    import ml_dtypes
    import numpy as np

    from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100/H200)")
    torch.empty(1, device="cuda")  # the primary context
    h200 = get_target("h200")
    base = FP8_OV if kind == "fp8" else BF16
    specs = [cp.generic_linear_spec(kind, h200, residual=residual, config=c) for c in (base, _direct(base))]
    loaded = [load_generic(spec) for spec in specs]
    gen = rng()
    store, tdt, view = ((ml_dtypes.float8_e4m3fn, torch.float8_e4m3fn, np.uint8) if kind == "fp8"
                        else (ml_dtypes.bfloat16, torch.bfloat16, np.uint16))
    # the last: 1024 tiles of one k-tile each, ~8 a CTA, the producer up to its stage count of tiles ahead (the
    # prefetch's tile ring at its fullest)
    for m, n, k in ((1, 256, 128), (77, 960, 576), (300, 1064, 256), (2048, 3072, 2048), (4096, 4096, 128)):
        x = np.clip(gen.standard_normal((m, k)), -448, 448).astype(store)
        w = np.clip(gen.standard_normal((n, k)) * 0.1, -448, 448).astype(store)
        bias = gen.standard_normal(n).astype(ml_dtypes.bfloat16)
        if m * n * k > 2**30:  # f32 on the GPU (no TF32), numpy would take long
            xf, wf = (torch.from_numpy(a.astype(np.float32)).cuda() for a in (x, w))
            torch.backends.cuda.matmul.allow_tf32 = False
            ref = (xf @ wf.T).cpu().numpy()
        else:
            ref = x.astype(np.float32) @ w.astype(np.float32).T
        inputs = {"x": torch.from_numpy(x.view(view)).cuda().view(tdt),
                  "weight": torch.from_numpy(w.view(view)).cuda().view(tdt),
                  "bias": torch.from_numpy(bias.view(np.uint16)).cuda().view(torch.bfloat16)}
        if kind == "fp8":
            xs, ws = gen.uniform(0.5, 2, m).astype(np.float32), gen.uniform(0.5, 2, n).astype(np.float32)
            ref = ref * xs[:, None] * ws[None, :]
            inputs |= {"x_scale": torch.from_numpy(xs).cuda(), "weight_scale": torch.from_numpy(ws).cuda()}
        ref = ref + bias.astype(np.float32)[None, :]
        if residual:
            res = gen.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
            inputs["residual"] = torch.from_numpy(res.view(np.uint16)).cuda().view(torch.bfloat16)
            ref = ref + res.astype(np.float32)
        tma, direct = (run_poisoned(launchable, inputs, m, n, k, spec.entry) for spec, launchable in zip(specs, loaded))
        assert torch.isfinite(direct.float()).all(), f"M, N, K = {m, n, k}: unwritten outputs"
        assert torch.equal(direct.view(torch.int16), tma.view(torch.int16)), (
            f"M, N, K = {m, n, k}: {int((direct.view(torch.int16) != tma.view(torch.int16)).sum())} outputs differ "
            f"from the TMA epilogue's")
        np.testing.assert_allclose(direct.float().numpy(), ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
