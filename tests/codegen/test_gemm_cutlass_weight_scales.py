"""CUTLASS FP8 GEMMs with other weight scales than one per output channel (``linear_cutlass_spec(...,
weight_scales=...)``): ``tensor`` (one f32, ``_wt``), the tensorwise scaling of ``torch._scaled_mm`` (cuBLASLt) that
``bench/bench_gemm.py``'s ``fp8-tensor`` mode compares like for like, and ``block`` (``_wb``), DeepSeek-V3's 1x128 x
128x128 block scaling (``fp8-block``). Rendering, refusals and the autotuner's view here; on an H100/H200: the tensor
builds give the same bits as the vector build with the scale repeated N times, for the direct epilogue (the FP8
default) and CUTLASS's TMA epilogue (the visitor tree's scalar broadcast); the block build matches the block-scaled
product computed in float64, launched as the CUDA backend does."""

from __future__ import annotations

import pytest

from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp
from ingot.codegen.kernels.gemm_cutlass import tune
from ingot.codegen.kernels.gemm_cutlass.rule import SM90_CANDIDATES, linear_cutlass_spec, variant_config
from ingot.codegen.target import get_target
from tests.codegen.test_gemm_cutlass import load_generic, needs_cutlass
from tests.codegen.test_gemm_cutlass_direct_epilogue import FP8_OV, _run, run_poisoned
from tests.helpers import rng


def test_weight_scale_builds_are_named_and_rendered():
    h200, b200 = get_target("h200"), get_target("b200")
    for target in (h200, b200):
        wt = cp.generic_linear_spec("fp8", target, weight_scales="tensor")
        vec = cp.generic_linear_spec("fp8", target)
        assert wt.value("WEIGHT_SCALES") == 1 and vec.value("WEIGHT_SCALES") == 0
        assert wt.name == "linear_cutlass_fp8_wt" and wt.entry != vec.entry
        assert cp.weight_scales(wt) == "tensor" and cp.weight_scales(vec) == "channel"
        assert "Sm90ScalarBroadcast<float, Stride<_0, _0, int64_t>>" in wt.source()  # common.cuh's tree, either way
    res = cp.generic_linear_spec("fp8", h200, residual=True, weight_scales="tensor", config=FP8_OV)
    assert res.name.startswith("linear_cutlass_fp8_res_wt_") and res.value("DIRECT_EPILOGUE") is False
    # block scales: the FP8 default (overlapped promotion, direct epilogue, 128^3 tiles) on sm_90a only
    wb = cp.generic_linear_spec("fp8", h200, weight_scales="block")
    assert wb.name == "linear_cutlass_fp8_wb" and wb.value("WEIGHT_SCALES") == 2 and cp.weight_scales(wb) == "block"
    assert "kWeightScales = 2" in wb.source() and "struct BlockScaleArgs" in wb.source()
    # fp8:block's W8A8 GEMM: the weight's blocks in the mainloop, x's per-row scale in the epilogue
    wbr = cp.generic_linear_spec("fp8", h200, weight_scales="block-rows")
    assert wbr.name == "linear_cutlass_fp8_wbr" and wbr.value("WEIGHT_SCALES") == 3
    assert cp.weight_scales(wbr) == "block-rows" and "kWeightScales = 3" in wbr.source()
    for target, cfg in ((h200, FP8_OV), (h200, SM90_CANDIDATES["bf16"][0]), (b200, None)):
        for scales in ("block", "block-rows"):
            with pytest.raises(ValueError, match="block scales are for FP8 on sm90.cu"):
                cp.generic_linear_spec("fp8" if cfg is not SM90_CANDIDATES["bf16"][0] else "bf16", target, config=cfg,
                                       weight_scales=scales)
    with pytest.raises(ValueError, match="weight_scales must be one of"):
        cp.generic_linear_spec("fp8", h200, weight_scales="row")
    # shaped for the autotuner: its candidates keep the scales (block: only the configurations that have the build),
    # its workload's scales are laid out as the kernel reads them
    for scales, shape, k in (("tensor", (1,), 2048), ("block", (24, 16), 2048), ("block-rows", (24, 10), 1280)):
        shaped = cp.shaped(cp.generic_linear_spec("fp8", h200, weight_scales=scales), 3072, k, "T", False)
        cands = tune.candidates(shaped, h200)
        assert len(cands) > 1 and all(cp.weight_scales(c) == scales for c in cands)
        (work,) = tune.workloads(shaped, {"T": 256})
        assert work.buffers["weight_scale"] == ("float32", shape)
        assert work.buffers.get("x_scale") == (("float32", (16, 256)) if scales == "block" else None)
    # the block-scaled template has no per-tensor build (its weight scales are block scales)
    nvfp4 = variant_config("nvfp4", b200)
    with pytest.raises(ValueError, match="per-tensor weight scale"):
        linear_cutlass_spec("nvfp4", 0, 0, b200, config=nvfp4, weight_scales="tensor")


@pytest.mark.gpu
@needs_cutlass
@pytest.mark.parametrize("config,residual", [("default", False), ("default", True), ("tma", False)])
def test_weight_scalar_equals_the_repeated_vector(config, residual):
    """Row scales, one weight scale, bias (and residual) on problems with partial tiles: every output bit equal to the
    vector build's given the scale N times (same mainloop, same products), nothing written past M x N, close to
    numpy; a null scale reads as 1."""
    import ml_dtypes
    import numpy as np

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100/H200)")
    torch.empty(1, device="cuda")  # the primary context
    h200 = get_target("h200")
    cfg = None if config == "default" else FP8_OV
    specs = [cp.generic_linear_spec("fp8", h200, residual=residual, config=cfg, weight_scales=scales)
             for scales in ("channel", "tensor")]
    loaded = [load_generic(spec) for spec in specs]
    gen = rng()
    for m, n, k in ((1, 256, 128), (77, 960, 576), (300, 1064, 256), (2048, 3072, 2048), (4096, 4096, 128)):
        x = np.clip(gen.standard_normal((m, k)), -448, 448).astype(ml_dtypes.float8_e4m3fn)
        w = np.clip(gen.standard_normal((n, k)) * 0.1, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        bias = gen.standard_normal(n).astype(ml_dtypes.bfloat16)
        xs, ws = gen.uniform(0.5, 2, m).astype(np.float32), np.float32(gen.uniform(0.5, 2))
        xt, wt = (torch.from_numpy(a.view(np.uint8)).cuda().view(torch.float8_e4m3fn) for a in (x, w))
        if m * n * k > 2**30:  # f32 on the GPU (no TF32), numpy would take long
            torch.backends.cuda.matmul.allow_tf32 = False
            ref = (xt.float() @ wt.float().T).cpu().numpy()
        else:
            ref = x.astype(np.float32) @ w.astype(np.float32).T
        ref = ref * xs[:, None] * ws + bias.astype(np.float32)[None, :]
        inputs = {"x": xt, "weight": wt, "x_scale": torch.from_numpy(xs).cuda(),
                  "bias": torch.from_numpy(bias.view(np.uint16)).cuda().view(torch.bfloat16)}
        if residual:
            res = gen.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
            inputs["residual"] = torch.from_numpy(res.view(np.uint16)).cuda().view(torch.bfloat16)
            ref = ref + res.astype(np.float32)
        scales = [torch.full((n,), float(ws), device="cuda"), torch.tensor([ws], device="cuda")]
        vec, scalar = (run_poisoned(launchable, inputs | {"weight_scale": scale}, m, n, k, spec.entry)
                       for spec, launchable, scale in zip(specs, loaded, scales))
        assert torch.isfinite(scalar.float()).all(), f"M, N, K = {m, n, k}: unwritten outputs"
        assert torch.equal(scalar.view(torch.int16), vec.view(torch.int16)), (
            f"M, N, K = {m, n, k}: {int((scalar.view(torch.int16) != vec.view(torch.int16)).sum())} outputs differ "
            f"from the vector build's")
        np.testing.assert_allclose(scalar.float().numpy(), ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
    # no weight scale at all: 1 (the vector build without one too)
    m, n, k = 77, 960, 576
    x = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 0.1).to(torch.float8_e4m3fn)
    outs = []
    for launchable in loaded:
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        extra = {"residual": torch.zeros(m, n, dtype=torch.bfloat16, device="cuda")} if residual else {}
        _run(launchable, {"x": x, "weight": w, "out": out, **extra}, m, n, k)
        outs.append(out.cpu())
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


@pytest.mark.gpu
@needs_cutlass
def test_block_scales_match_the_block_scaled_product():
    """x with a scale per row and 128 columns, w per 128 x 128 block, in cuBLASLt's layouts (x_scale [KB][M], w_scale
    [NB][KB4]), with bias: close to the block-scaled product in float64 on problems with partial tiles and K blocks
    (the last block of K short, KB not a multiple of 4); scales spanning 2^-10 .. 2^10 so that a scale applied to the
    wrong row, block or k-tile shows; nothing written past M x N; the same bits from a second launch. Both ways the
    scales reach the consumers: copied by the producer into each stage (M % 4 == 0, the arrays 16-byte aligned; a
    last tile of M shorter than 128 rows, and M < 128) and loaded from global memory by each thread (M % 4 != 0, or
    x_scale placed 4 bytes off 16-byte alignment): the latter's bits equal the former's for the same problem."""
    import ml_dtypes
    import numpy as np

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100/H200)")
    torch.empty(1, device="cuda")  # the primary context
    h200 = get_target("h200")
    spec = cp.generic_linear_spec("fp8", h200, weight_scales="block")
    loaded = load_generic(spec)
    gen = rng()
    for m, n, k in ((1, 128, 128), (77, 384, 640), (124, 640, 1152), (300, 1064, 1008), (1000, 2048, 2048),
                    (4096, 4096, 512)):
        kb, nb = -(-k // 128), -(-n // 128)
        kb4 = -(-kb // 4) * 4
        x = np.clip(gen.standard_normal((m, k)) * 4, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        w = np.clip(gen.standard_normal((n, k)) * 4, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        xs = np.exp2(gen.integers(-10, 11, (kb, m))).astype(np.float32) * gen.uniform(0.5, 1, (kb, m)).astype(
            np.float32)
        ws = np.zeros((nb, kb4), np.float32)
        ws[:, :kb] = np.exp2(gen.integers(-10, 11, (nb, kb))) * gen.uniform(0.5, 1, (nb, kb))
        bias = gen.standard_normal(n).astype(ml_dtypes.bfloat16)
        xf = x.astype(np.float64) * np.repeat(xs.T, 128, axis=1)[:, :k]
        wf = w.astype(np.float64) * np.repeat(np.repeat(ws[:, :kb], 128, axis=0), 128, axis=1)[:n, :k]
        ref = xf @ wf.T + bias.astype(np.float64)[None, :]
        inputs = {"x": torch.from_numpy(x.view(np.uint8)).cuda().view(torch.float8_e4m3fn),
                  "weight": torch.from_numpy(w.view(np.uint8)).cuda().view(torch.float8_e4m3fn),
                  "x_scale": torch.from_numpy(xs).cuda(), "weight_scale": torch.from_numpy(ws).cuda(),
                  "bias": torch.from_numpy(bias.view(np.uint16)).cuda().view(torch.bfloat16)}
        outs = [run_poisoned(loaded, inputs, m, n, k, spec.entry) for _ in range(2)]
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), f"M, N, K = {m, n, k}: not repeatable"
        if m % 4 == 0:  # the same scales 4 bytes off alignment: loaded by the consumers, the same bits
            off = torch.empty(xs.size + 1, dtype=torch.float32, device="cuda")[1:].view(kb, m)
            off.copy_(inputs["x_scale"])
            assert off.data_ptr() % 16 == 4
            loaded_bits = run_poisoned(loaded, inputs | {"x_scale": off}, m, n, k, spec.entry)
            assert torch.equal(loaded_bits.view(torch.int16), outs[0].view(torch.int16)), (
                f"M, N, K = {m, n, k}: scales loaded by the consumers give other bits than the producer's copies")
        got = outs[0].float().numpy()
        assert np.isfinite(got).all(), f"M, N, K = {m, n, k}: unwritten outputs"
        # each output: bf16 rounding (2^-9) of sums of e4m3 products in f32 (relative to the row's magnitudes)
        scale = np.abs(xf) @ np.abs(wf).T + np.abs(bias.astype(np.float64))[None, :]
        err = np.abs(got - ref) / scale
        assert err.max() < 2.0**-7, (m, n, k, float(err.max()), np.unravel_index(err.argmax(), err.shape))


@pytest.mark.gpu
@needs_cutlass
def test_block_rows_match_the_block_scaled_product():
    """fp8:block's W8A8 GEMM (``block-rows``): x with one scale per row, w per 128 x 128 block in ingot's layout
    ([NB][KB], KB not padded: with KB % 4 != 0 the scales are loaded by the consumers, else copied by the producer),
    with bias and residual: close to the product in float64 on problems with partial tiles (K whole blocks, as
    fp8:block's linears have); nothing written past M x N; the same bits from a second launch."""
    import ml_dtypes
    import numpy as np

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100/H200)")
    torch.empty(1, device="cuda")  # the primary context
    h200 = get_target("h200")
    spec = cp.generic_linear_spec("fp8", h200, residual=True, weight_scales="block-rows")
    loaded = load_generic(spec)
    gen = rng()
    for m, n, k in ((1, 128, 128), (77, 384, 640), (300, 1064, 1024), (1000, 2048, 2048), (4096, 4096, 512)):
        kb, nb = k // 128, -(-n // 128)
        x = np.clip(gen.standard_normal((m, k)) * 4, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        w = np.clip(gen.standard_normal((n, k)) * 4, -448, 448).astype(ml_dtypes.float8_e4m3fn)
        xs = (np.exp2(gen.integers(-10, 11, m)) * gen.uniform(0.5, 1, m)).astype(np.float32)
        ws = (np.exp2(gen.integers(-10, 11, (nb, kb))) * gen.uniform(0.5, 1, (nb, kb))).astype(np.float32)
        bias = gen.standard_normal(n).astype(ml_dtypes.bfloat16)
        res = gen.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
        xf = x.astype(np.float64) * xs.astype(np.float64)[:, None]
        wf = w.astype(np.float64) * np.repeat(np.repeat(ws, 128, axis=0), 128, axis=1)[:n, :k]
        ref = xf @ wf.T + bias.astype(np.float64)[None, :] + res.astype(np.float64)
        inputs = {"x": torch.from_numpy(x.view(np.uint8)).cuda().view(torch.float8_e4m3fn),
                  "weight": torch.from_numpy(w.view(np.uint8)).cuda().view(torch.float8_e4m3fn),
                  "x_scale": torch.from_numpy(xs).cuda(), "weight_scale": torch.from_numpy(ws).cuda(),
                  "bias": torch.from_numpy(bias.view(np.uint16)).cuda().view(torch.bfloat16),
                  "residual": torch.from_numpy(res.view(np.uint16)).cuda().view(torch.bfloat16)}
        outs = [run_poisoned(loaded, inputs, m, n, k, spec.entry) for _ in range(2)]
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), f"M, N, K = {m, n, k}: not repeatable"
        got = outs[0].float().numpy()
        assert np.isfinite(got).all(), f"M, N, K = {m, n, k}: unwritten outputs"
        scale = (np.abs(xf) @ np.abs(wf).T + np.abs(bias.astype(np.float64))[None, :]
                 + np.abs(res.astype(np.float64)))
        err = np.abs(got - ref) / scale
        assert err.max() < 2.0**-7, (m, n, k, float(err.max()), np.unravel_index(err.argmax(), err.shape))
