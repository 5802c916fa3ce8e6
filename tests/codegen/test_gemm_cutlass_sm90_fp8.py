"""The sm_90a FP8 candidates with f32 promotion beyond CUTLASS's defaults (``gemm_cutlass/sm90.cu``'s knobs):
overlapped promotion (``sm90_fp8_mainloop.cuh``), the tile scheduler's swizzle and raster order, and the tiles added
beside them (``rule.SM90_CANDIDATES`` and ``SM90_EXPLORE``, timed by ``bench/bench_gemm.py``).

Without a compiler: the candidate table is well formed and every candidate renders. With nvcc, CUTLASS and
``INGOT_SLOW=1`` (each build 1-2 minutes and 3-5 GB on 2 cores: not in CI): each new candidate compiles for sm_90a to
QGMMA with no local memory (spilled registers are local memory: ptxas's "spill stores", cuobjdump's LOCAL and
STACK), the overlapped mainloop keeps one batch of wgmmas in flight through its promotions, and the swizzled
scheduler's Params layout reproduces CUTLASS's blob. On an H200: the overlapped mainloop's output equals CUTLASS's
promotion of the same tile bit for bit.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp
from ingot.codegen.kernels.gemm_cutlass import rule
from ingot.codegen.kernels.gemm_cutlass.build import cutlass_available
from ingot.codegen.kernels.gemm_cutlass.rule import (
    RASTER_TAGS,
    SM90_CANDIDATES,
    SM90_EXPLORE,
    Config,
    bench_configs,
    config_tag,
    linear_cutlass_spec,
    variant_config,
)
from ingot.codegen.target import get_target
from tests.codegen.common import needs_cuobjdump

SLOW = bool(os.environ.get("INGOT_SLOW"))
H200 = get_target("h200")
needs_cutlass = pytest.mark.skipif(not cutlass_available(), reason="needs nvcc and CUTLASS headers: pip install "
                                                                   "nvidia-cutlass (and a toolkit or nvidia-cuda-nvcc)")
slow_build = [pytest.mark.slow, needs_cutlass,
              pytest.mark.skipif(not SLOW, reason="set INGOT_SLOW=1 to build the sm_90a FP8 candidates (1-2 min each)")]

#: the FP8 (f32 promotion) configurations added after docs/PERF.md's H200 run (SM90_CANDIDATES, then SM90_EXPLORE),
#: all checked for spills below
NEW_FP8 = ("coopov128x128x128c1x2", "coopov128x128x128c2x1", "ppov64x128x128c2x1", "coop128x192x128c1x2",
           "ppov64x128x128c1x2", "pp64x128x128c2x1", "coopov128x128x128c2x1e64", "coopov128x128x128c1x2e64",
           "coopov128x128x128c1x1e64", "coopov128x128x128c2x1d", "coopov128x128x128c1x2d")
#: what bench_gemm --build builds in one go (each candidate a cubin and a host shim; 33: 6-9 minutes on the H200's 16
#: cores, or --only a subset)
MAX_CANDIDATES = 33
#: f32 registers a thread of a consumer warpgroup may hold in accumulators (CUTLASS gives it 232 in all)
ACCUMULATOR_BUDGET = 192


def _by_tag() -> dict[str, Config]:
    """Every FP8 configuration bench_gemm builds on h200, by tag."""
    return {config_tag(c): c for c in bench_configs("fp8", H200)}


def _accumulators_per_thread(cfg: Config) -> int:
    """f32 accumulator registers per consumer thread: a warpgroup's share of the tile (cooperative: half the rows)
    over its 128 threads, times the sets (the promoted sums and one partial; two partials when overlapped)."""
    rows = cfg.tile[0] // 2 if cfg.schedule.startswith("Cooperative") else cfg.tile[0]
    sets = 1 if "FastAccum" in cfg.schedule else 3 if cfg.overlap else 2
    return rows * cfg.tile[1] // 128 * sets


# -- the table (no compiler) ------------------------------------------------------------------------------------


def test_candidates_are_well_formed():
    from ingot.codegen import autotune as at

    assert sum(len(bench_configs(kind, H200)) for kind in SM90_CANDIDATES) <= MAX_CANDIDATES
    for kind in SM90_CANDIDATES:
        tags = [config_tag(c) for c in bench_configs(kind, H200)]
        assert len(set(tags)) == len(tags), f"{kind}: two candidates share a tag"
        # the autotuner times every candidate of a spec's accumulation (it keeps the first MAX_CANDIDATES)
        for fast in (False, True):
            assert sum(("FastAccum" in c.schedule) == fast for c in SM90_CANDIDATES[kind]) <= at.MAX_CANDIDATES
    assert set(SM90_EXPLORE) <= set(SM90_CANDIDATES)
    assert bench_configs("fp8", get_target("b200")) == (variant_config("fp8", get_target("b200")),)
    fp8 = _by_tag()
    assert set(NEW_FP8) <= set(fp8)
    # the default: the overlapped promotion (measured ahead of CUTLASS's own on the H200, docs/PERF.md) with the
    # direct epilogue (ahead of the TMA epilogue there)
    assert variant_config("fp8", H200) == fp8["coopov128x128x128c2x1d"]
    for tag, cfg in fp8.items():
        assert cfg.template == "sm90.cu" and cfg.threads == 384
        assert cfg.swizzle in (0, 1, 2, 4, 8) and cfg.raster in RASTER_TAGS, tag
        assert (f"s{cfg.swizzle}" in tag) == (cfg.swizzle != 0), tag
        if cfg.overlap:  # CUTLASS's interval (4 wgmmas of K = 32) is one 128-deep k-tile
            assert "FastAccum" not in cfg.schedule and cfg.tile[2] == 128, tag
        if tag in NEW_FP8:
            assert _accumulators_per_thread(cfg) <= ACCUMULATOR_BUDGET, tag
    # the 256-wide promotion tile measured at ~450 TFLOP/s spills: 2 x 128 accumulators a thread
    assert _accumulators_per_thread(fp8["coop256x128x128c1x2"]) == 256


def test_bench_sorts_them_by_accumulation():
    """bench_gemm times the promotion candidates against use_fast_accum=False and the FastAccum ones against True,
    telling them apart by tag."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "bench_gemm.py"
    spec = importlib.util.spec_from_file_location("bench_gemm_under_test", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for tag, cfg in _by_tag().items():
        fast = "FastAccum" in cfg.schedule
        assert bench._fits("fp8-row-fast", tag) == fast and bench._fits("fp8-tensor", tag) != fast, tag


@pytest.mark.parametrize("tag", NEW_FP8)
def test_new_candidates_render(tag):
    cfg = _by_tag()[tag]
    for residual in (False, True):
        spec = cp.generic_linear_spec("fp8", H200, residual=residual, config=cfg)
        src = spec.source()
        # the default configuration's entry carries no tag (linear_cutlass_fp8_<hash>)
        assert "${" not in src and 'extern "C" __global__' in src
        assert tag in spec.entry or cfg == variant_config("fp8", H200)
        values = dict(spec.values)
        assert (values["OVERLAP_PROMOTION"], values["MAX_SWIZZLE"], values["RASTER"], values["EPI_N"],
                values["DIRECT_EPILOGUE"]) == (cfg.overlap, cfg.swizzle, cfg.raster, cfg.epi_n, cfg.direct)
        assert tag.endswith("d") == cfg.direct
        # the epilogue subtile: CUTLASS's (EPI_N 0) or kEpiM x EPI_N, kEpiM a warpgroup's rows of the tile
        assert f"cute::conditional_t<{cfg.epi_n} == 0, cutlass::epilogue::collective::EpilogueTileAuto," in src
        assert (f"e{cfg.epi_n}" in tag) == (cfg.epi_n != 0)
        # the swizzle: the spec's, which the host shim's caller may replace per Params (launch.py)
        assert f"static int ingot_max_swizzle = {cfg.swizzle};" in src
        assert f"void {spec.entry}_set_max_swizzle(int max_swizzle)" in src
        assert "max_swizzle_size = ingot_max_swizzle;" in src and f"RasterOrderOptions::{cfg.raster};" in src
        assert f"constexpr bool kOverlapPromotion = {'true' if cfg.overlap else 'false'};" in src
    # the autotuner's view of the spec gives the configuration back
    from ingot.codegen.kernels.gemm_cutlass import tune

    assert tune.config_of(spec) == cfg


def test_autotuner_considers_them():
    """A shaped FP8 spec (promotion) is tuned over every promotion candidate of SM90_CANDIDATES, the new ones
    included, and none of the FastAccum ones (SM90_EXPLORE's are bench_gemm's alone)."""
    from ingot.codegen import autotune as at
    from ingot.codegen.kernels.gemm_cutlass import tune

    shaped = cp.shaped(cp.generic_linear_spec("fp8", H200), 16384, 2048, "T", False)
    cands = at.candidates(shaped, H200)
    tags = [config_tag(tune.config_of(c)) for c in cands]
    promoting = [config_tag(c) for c in SM90_CANDIDATES["fp8"] if "FastAccum" not in c.schedule]
    assert sorted(set(tags)) == sorted(promoting) and len(tags) == len(promoting)
    assert set(NEW_FP8) - {config_tag(c) for c in SM90_EXPLORE["fp8"]} <= set(tags)
    for c in cands:
        assert tune.matches(c) and (c.value("N"), c.value("K")) == (16384, 2048)
        assert at.kernel_for(c) == cp.generic_linear_spec("fp8", H200, config=tune.config_of(c))


@pytest.mark.parametrize("blocks_m,blocks_n,max_swizzle,log", [
    (64, 64, 1, 0), (64, 64, 2, 1), (64, 64, 4, 2), (64, 64, 8, 3), (5, 64, 8, 2), (2, 64, 8, 1), (1, 64, 8, 0),
    (64, 3, 4, 2), (64, 2, 4, 1)])
def test_log_swizzle_is_cutlass_rule(blocks_m, blocks_n, max_swizzle, log):
    assert cp._log_swizzle(blocks_m, blocks_n, max_swizzle) == log


def test_scheduler_fields_with_swizzle_and_raster():
    """The scheduler fields build_params writes for a swizzled, raster-forced layout (CUTLASS's
    PersistentTileSchedulerSm90Params::initialize, by hand for one shape)."""
    import struct

    f = cp._SM90_SCHED
    base = {"kind": "sm90", "offset": 0, "tile": [128, 128], "atom_m": 1, "cluster": [1, 2]}
    blob = bytearray(f["size"])
    # M = N = 8192 with 128x128 tiles: 64 x 64 blocks, swizzle 8 -> log 3, rounded to 64 x 64 (multiples of 8, 16)
    grid = cp._sm90_schedule(base, 8192, 8192, 132, blob, max_swizzle=8)
    log, raster = struct.unpack_from("<ii", blob, f["log_swizzle"])
    assert (log, raster) == (3, 1)  # equal block counts: Heuristic rasterizes along N
    assert struct.unpack_from("<3I", blob, f["tiles_m"]) == (64, 32, 1)
    assert grid == (1, 132 // 2 * 2, 1)
    # M = 1000: 8 row blocks, N = 3000: 24 (cluster 2) -> swizzle 4 (log 2) rounds them to 8 and 24
    cp._sm90_schedule(base | {"raster_option": "AlongM"}, 1000, 3000, 132, blob, max_swizzle=4)
    log, raster = struct.unpack_from("<ii", blob, f["log_swizzle"])
    assert (log, raster) == (2, 0)
    assert struct.unpack_from("<3I", blob, f["tiles_m"]) == (8, 12, 1)
    # the defaults are what they were: no swizzle, Heuristic (AlongM when there are more column blocks)
    cp._sm90_schedule(base, 1000, 3000, 132, blob)
    assert struct.unpack_from("<ii", blob, f["log_swizzle"]) == (0, 0)


@pytest.mark.parametrize("m,n,k,bits,swept", [
    (8192, 8192, 8192, 8, 8192 * 8192),  # equal block counts: along N, w swept
    (8192, 16384, 2048, 8, 8192 * 2048),  # more column blocks: along M, x swept
    (16384, 3072, 2048, 16, 3072 * 2048 * 2),  # a 1B qkv at 16k tokens: w
    (1000, 3000, 512, 16, 1000 * 512 * 2),  # 8 row blocks (cluster 2x1) against 24
])
def test_swept_operand_is_the_one_a_wave_reads_whole(m, n, k, bits, swept):
    """The scheduler walks the dimension with fewer tile blocks (CUTLASS's Heuristic raster, as _sm90_schedule
    writes it), so the swept operand is the smaller one; a forced raster order sweeps its own."""
    import struct

    tile, cluster = (128, 128), (2, 1)
    assert rule.swept_operand_bytes(m, n, k, bits, tile, cluster) == swept
    blob = bytearray(cp._SM90_SCHED["size"])
    cp._sm90_schedule({"kind": "sm90", "offset": 0, "tile": list(tile), "cluster": list(cluster)}, m, n, 132, blob)
    along_m = struct.unpack_from("<i", blob, cp._SM90_SCHED["raster"])[0] == 0
    assert swept == (m if along_m else n) * k * bits // 8
    assert rule.swept_operand_bytes(m, n, k, bits, tile, cluster, "AlongM") == m * k * bits // 8
    assert rule.swept_operand_bytes(m, n, k, bits, tile, cluster, "AlongN") == n * k * bits // 8


def test_runtime_swizzle_follows_the_swept_operand():
    """Layouts of configurations that leave the swizzle open (swizzle 0: they record the operands' bits) get
    rule.auto_swizzle's per problem: 8 once the swept operand is past SWIZZLE_BYTES; a configuration's own swizzle
    wins; layouts without either (from before) keep none."""
    import struct

    f = cp._SM90_SCHED
    base = {"kind": "sm90", "offset": 0, "tile": [128, 128], "atom_m": 1, "cluster": [2, 1]}
    fp8, bf16 = base | {"elem_bits": 8}, base | {"elem_bits": 16}
    big = 8192  # 8192^3: 64 MB of e4m3 swept, 128 MB of bf16
    assert cp.sm90_max_swizzle(fp8, big, big, big) == rule.AUTO_SWIZZLE == 8
    assert cp.sm90_max_swizzle(bf16, big, big, big) == 8
    # just past the threshold and just below it (w swept: N x K)
    k_at = rule.SWIZZLE_BYTES // big
    assert cp.sm90_max_swizzle(fp8, big, big, k_at) == 1
    assert cp.sm90_max_swizzle(fp8, big, big, k_at + 16) == 8
    assert cp.sm90_max_swizzle(bf16, big, big, k_at // 2 + 16) == 8
    assert cp.sm90_max_swizzle(fp8, big, big, 4096) == 8  # 32 MiB swept: measured faster swizzled
    # the 1B model's gate_up at 8192 tokens: x swept (16 MB e4m3), no swizzle; 4096^3 in fp8 likewise
    assert cp.sm90_max_swizzle(fp8, 8192, 16384, 2048) == 1
    assert cp.sm90_max_swizzle(fp8, 4096, 4096, 4096) == 1
    assert cp.sm90_max_swizzle(fp8 | {"max_swizzle": 4}, big, big, big) == 4
    assert cp.sm90_max_swizzle(fp8 | {"max_swizzle": 2}, 64, 64, 64) == 2
    assert cp.sm90_max_swizzle(base, big, big, big) == 1
    # the host shim's caller (launch.py, hence bench_gemm) picks the same from the spec's values
    from types import SimpleNamespace

    from ingot.codegen.kernels.gemm_cutlass.launch import CutlassGemm

    default, forced = variant_config("fp8", H200), _by_tag()["coopov128x128x128c1x2rn"]
    for cfg in (default, forced, Config("sm90.cu", (128, 128, 128), (1, 2), schedule="Cooperative", swizzle=2)):
        spec = linear_cutlass_spec("fp8", 0, 0, H200, config=cfg)
        s = {"tile": list(cfg.tile[:2]), "cluster": list(cfg.cluster)} | cp.scheduler_knobs(dict(spec.values))
        for shape in ((big, big, big), (8192, 16384, 2048), (4096, 4096, 4096), (16384, 8192, 4096)):
            want = cp.sm90_max_swizzle(s, *shape)
            assert CutlassGemm.max_swizzle(SimpleNamespace(spec=spec), *shape) == want, (config_tag(cfg), shape)
            assert want == (cfg.swizzle or rule.auto_swizzle(*shape, 8, cfg.tile, cfg.cluster, cfg.raster))
    # and build_params writes it (log 3), unless told otherwise
    layout = {"version": cp.LAYOUT_VERSION, "template": bytes(32 + f["size"]).hex(), "problem_shape": 0,
              "sm_count": 16, "pointers": [], "tma": [], "block": [384, 1, 1], "cluster": [2, 1, 1], "smem": 0,
              "scheduler": fp8 | {"offset": 32}}
    for swizzle, log in ((None, 3), (1, 0), (2, 1)):
        blob, _ = cp.build_params(layout, {}, big, big, big, 132, encode=lambda *a: b"", max_swizzle=swizzle)
        assert struct.unpack_from("<i", blob, 32 + f["log_swizzle"])[0] == log


# -- builds (INGOT_SLOW=1) --------------------------------------------------------------------------------------


def _resource_usage(cubin: bytes) -> dict[str, int]:
    from ingot.codegen.sass import find_cuobjdump

    with tempfile.TemporaryDirectory(prefix="ingot-res-") as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([find_cuobjdump(), "--dump-resource-usage", str(path)], capture_output=True, text=True,
                             check=True).stdout
    line = next(ln for ln in out.splitlines() if "REG:" in ln)
    return {k: int(v) for k, v in re.findall(r"(\w+(?:\[\d+\])?):(\d+)", line)}


@needs_cuobjdump
@pytest.mark.parametrize("tag", [pytest.param(t, marks=slow_build) for t in NEW_FP8])
def test_builds_without_spills(tag):
    """sm_90a cubin with QGMMA and TMA, no stack and no local memory (ptxas spills to local memory); the
    overlapped mainloop waits for all but one wgmma batch (``WARPGROUP.DEPBAR.LE gsb0, 0x1``) before each
    promotion inside its loop, where CUTLASS's promotion waits for all of them."""
    from ingot.codegen.kernels.gemm_cutlass.build import compile_cutlass
    from ingot.codegen.sass import disassemble, opcodes, sass_arch

    cfg = _by_tag()[tag]
    spec = linear_cutlass_spec("fp8", 0, 0, H200, config=cfg)
    cubin = compile_cutlass(spec).cubin
    usage = _resource_usage(cubin)
    assert usage["LOCAL"] == 0 and usage["STACK"] == 0, f"{tag} spills: {usage}"
    sass = disassemble(cubin)
    assert sass_arch(sass) == "sm_90a"
    ops = opcodes(sass)
    assert any(o.startswith("QGMMA") for o in ops) and any(o.startswith("UTMALDG") for o in ops)
    waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", sass)
    if cfg.overlap:
        # the loop's two promotions and the odd tail's first keep one batch in flight
        assert waits.count("0x1") >= 3, waits


@needs_cutlass
@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="set INGOT_SLOW=1 to probe the swizzled scheduler's Params (~1 min each)")
@pytest.mark.parametrize("cfg", [
    Config("sm90.cu", (128, 128, 128), (1, 2), schedule="Cooperative", threads=384, overlap=True, swizzle=4),
    Config("sm90.cu", (128, 128, 128), (2, 1), schedule="Cooperative", threads=384, swizzle=2, raster="AlongM"),
    # the swizzle left to the runtime (the default configuration, 128 x 64 epilogue subtiles): none in the probe, 8
    # for 8192^3
    Config("sm90.cu", (128, 128, 128), (2, 1), schedule="Cooperative", threads=384, overlap=True, epi_n=64),
], ids=config_tag)
def test_swizzled_params_layout_reproduces_cutlass(cfg):
    """The probe's blobs (CUTLASS's to_underlying_arguments through sm90.cu's scheduler arguments) equal the
    Python layout's for every probe shape (``derive_layout`` raises otherwise), and a large problem gets the
    swizzle."""
    import struct

    spec = cp.generic_linear_spec("fp8", H200, config=cfg)
    layout = cp.params_layout(spec)
    s = layout["scheduler"]
    if cfg.swizzle:
        assert s["max_swizzle"] == cfg.swizzle and "elem_bits" not in s
    else:
        assert "max_swizzle" not in s and s["elem_bits"] == 8
    assert s.get("raster_option", "Heuristic") == cfg.raster
    blob, launch = cp.build_params(layout, {"x": 0x1000, "weight": 0x2000, "out": 0x3000}, 8192, 8192, 8192, 132,
                                   encode=lambda *a: bytes(cp.TMA_BYTES))
    log, raster = struct.unpack_from("<ii", blob, s["offset"] + cp._SM90_SCHED["log_swizzle"])
    assert log == (cfg.swizzle or rule.AUTO_SWIZZLE).bit_length() - 1
    assert raster == (0 if cfg.raster == "AlongM" else 1)
    assert launch["grid"][0] * launch["grid"][1] <= 132


# -- on the GPU ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cutlass
@pytest.mark.parametrize("overlapped,plain", [("coopov128x128x128c1x2", "coop128x128x128c1x2"),
                                              ("coopov128x128x128c2x1e64", "coop128x128x128c1x2"),
                                              ("coopov128x128x128c2x1d", "coop128x128x128c1x2"),
                                              ("ppov64x128x128c2x1", "pp64x128x128c2x1")])
def test_overlapped_promotion_matches_cutlass_bit_for_bit(overlapped, plain):
    """The overlapped mainloop adds the same per-k-tile partials in the same order as CUTLASS's promotion: equal
    outputs for k-tile counts 1 to 17 (odd and even, a partial last k-tile), M not a tile multiple, per-row and
    per-column scales and a bias; and both close to an f32 product (output poisoned before each launch)."""
    import ml_dtypes
    import numpy as np

    from ingot.codegen.kernels.gemm_cutlass.build import build_shim, compile_cutlass
    from ingot.codegen.kernels.gemm_cutlass.launch import CutlassGemm

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100/H200)")
    torch.empty(1, device="cuda")
    gemms = []
    for tag in (overlapped, plain):
        spec = linear_cutlass_spec("fp8", 0, 0, H200, config=_by_tag()[tag])
        gemms.append(CutlassGemm(spec, compile_cutlass(spec).cubin, build_shim(spec)))
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    for m, n, k in ((200, 384, 128), (1000, 1024, 256), (300, 640, 384), (2048, 2048, 2048 + 64), (4096, 3072, 2048)):
        x = rng.standard_normal((m, k)).astype(ml_dtypes.float8_e4m3fn)
        w = (rng.standard_normal((n, k)) * 0.5).astype(ml_dtypes.float8_e4m3fn)
        xs, ws = rng.uniform(0.5, 2, m).astype(np.float32), rng.uniform(0.5, 2, n).astype(np.float32)
        bias = rng.standard_normal(n).astype(ml_dtypes.bfloat16)
        bufs = {"x": torch.from_numpy(x.view(np.uint8)).cuda().view(torch.float8_e4m3fn),
                "weight": torch.from_numpy(w.view(np.uint8)).cuda().view(torch.float8_e4m3fn),
                "x_scale": torch.from_numpy(xs).cuda(), "weight_scale": torch.from_numpy(ws).cuda(),
                "bias": torch.from_numpy(bias.view(np.uint16)).cuda().view(torch.bfloat16)}
        outs = []
        for gemm in gemms:
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            p = gemm.prepare({name: t.data_ptr() for name, t in bufs.items()} | {"out": out.data_ptr()}, m, sm_count,
                             N=n, K=k)
            gemm.launch(p, torch.cuda.current_stream().cuda_stream)
            torch.cuda.synchronize()
            outs.append(out.float().cpu().numpy())
        ref = (x.astype(np.float32) @ w.astype(np.float32).T) * xs[:, None] * ws[None, :] + bias.astype(np.float32)
        assert np.isfinite(outs[0]).all(), f"{overlapped} M, N, K = {m, n, k}: unwritten outputs"
        np.testing.assert_allclose(outs[0], ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max(), err_msg=f"{m, n, k}")
        # the same tile, so the same wgmmas: the same bits
        assert np.array_equal(outs[0], outs[1]), f"{overlapped} != {plain} for M, N, K = {m, n, k}"
