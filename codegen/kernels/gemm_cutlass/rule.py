"""CUTLASS GEMMs for ``linear``: ``out[M, N] = x[M, K] @ w[N, K]^T`` with a fused epilogue.

One template per architecture and kind, all from CUTLASS 4.2's collective builders (headers from
the ``nvidia-cutlass`` wheel, built with nvcc; ``build.py`` says how and how a runtime launches them):

- ``sm100.cu``: sm_100a tcgen05 (UMMA) BF16 and FP8 e4m3, 1-SM or 2-SM MMA, CLC persistent scheduler;
- ``sm100_blockscaled.cu``: sm_100a block-scaled tcgen05 NVFP4 (e2m1, ue4m3 scale per 16) and
  MXFP4 (e2m1, ue8m0 scale per 32);
- ``sm90.cu``: sm_90a warp-specialized wgmma + TMA BF16 and FP8 e4m3 (cooperative or ping-pong), the persistent
  tile scheduler's swizzle and raster order, FP8's f32 promotion CUTLASS's or overlapped with the next k-tile's
  MMAs (``sm90_fp8_mainloop.cuh``).

Every variant computes the same epilogue: ``out = w_scale[n] * (acc * x_scale[m]) + bias[n] (+ residual[m, n])``,
the vectors optional at run time (FP8: per-token x per-channel scales), the residual a build-time choice. Output is
bf16. It is CUTLASS's TMA epilogue with a visitor tree (``common.cuh``; the residual is its C operand), or on sm_90a
cooperative 128-row tiles (``Config.direct``, the FP8 default) ingot's direct epilogue (``sm90_direct_epilogue.cuh``:
the same arithmetic, bit for bit; the scales prefetched during the mainloop, each consumer warpgroup storing its own
rows).

Tile and cluster shapes are chosen here: ``variant_config`` is a kind's default on a target, ``shape_config``
the choice for one linear's N and K (on h100/h200 a small table of rules, ``SM90_SHAPE_RULES``, from the
candidates' timings on the H200; the kernels are shape-generic, so every linear that gets the same configuration
shares one build). Where the compiling machine has the target's GPU, the autotuner times the kind's candidates
(``SM90_CANDIDATES``) for each shape instead (``tune.py``). The plan accepts plain bf16 linears whose N and
K suit TMA (16-byte rows); quantized linears get their specs from ``linear_cutlass_spec`` directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ....ir.op import Op
from ....ir.types import DType, TensorType
from ...family import Family, static_dim
from ...kernel import GridDim, KernelSpec
from ...target import Target

#: the shim's arguments, in order (see build.py); the kernel itself takes one Params blob
PARAMS = [("x", "ptr"), ("weight", "ptr"), ("x_block_scale", "ptr"), ("weight_block_scale", "ptr"),
          ("x_scale", "ptr"), ("weight_scale", "ptr"), ("bias", "ptr"), ("residual", "ptr"), ("out", "ptr"),
          ("M", "i64")]
ABI = "cutlass-params-v1"

#: operand kinds -> (CUTLASS element type, bits per element, K alignment in elements)
OPERANDS: dict[str, tuple[str, int, int]] = {
    "bf16": ("cutlass::bfloat16_t", 16, 8),
    "fp8": ("cutlass::float_e4m3_t", 8, 16),
    "nvfp4": ("cutlass::nv_float4_t<cutlass::float_e2m1_t>", 4, 32),
    "mxfp4": ("cutlass::mx_float4_t<cutlass::float_e2m1_t>", 4, 32),
}
#: the IR dtype of each kind's x/w storage (packed FP4: two e2m1 per byte)
KIND_DTYPES = {"bf16": DType.bf16, "fp8": DType.f8e4m3fn, "nvfp4": DType.f4e2m1fn, "mxfp4": DType.f4e2m1fn}


@dataclass(frozen=True)
class Config:
    """One CUTLASS instantiation: template, MMA tile (M x N x K), cluster, threads per block; on ``sm90.cu``
    ``overlap``: FP8 promotion overlapped with the next k-tile's MMAs, ``swizzle``: the persistent tile scheduler's
    max swizzle (1, 2, 4, 8; 0: chosen per problem by ``auto_swizzle``, the same cubin either way), ``raster``: its
    raster order (Heuristic, AlongM, AlongN), ``epi_n``: the epilogue subtile's columns (its rows: 128 cooperative,
    64 ping-pong; 0: CUTLASS's choice, 32 columns for bf16 output); the defaults are CUTLASS's but the swizzle's."""

    template: str
    tile: tuple[int, int, int]
    cluster: tuple[int, int]
    two_sm: bool = False
    schedule: str = ""
    threads: int = 256
    overlap: bool = False
    swizzle: int = 0
    raster: str = "Heuristic"
    epi_n: int = 0
    direct: bool = False


def variant_config(kind: str, target: Target) -> Config:
    """A kind's default tile/cluster on a target, for any shape (first match wins; ``shape_config`` chooses per
    shape)."""
    if target.tcgen05:
        if kind == "bf16":
            return Config("sm100.cu", (256, 128, 64), (2, 1), two_sm=True)
        if kind == "fp8":
            return Config("sm100.cu", (256, 128, 128), (2, 1), two_sm=True)
        if kind in ("nvfp4", "mxfp4"):
            return Config("sm100_blockscaled.cu", (128, 128, 256), (1, 1))
    elif target.wgmma and kind in SM90_CANDIDATES:
        return SM90_CANDIDATES[kind][0]
    raise ValueError(f"gemm_cutlass: no {kind} variant for target {target.name} ({target.arch})")


#: sm_90a configurations worth timing per kind, the first ``variant_config``'s choice (bf16: the fastest on the 1B
#: model's prefill shapes, docs/PERF.md; fp8: the fastest with f32 promotion): CTA tile,
#: cluster and schedule (Cooperative: two consumer warp groups share one tile; Pingpong: each owns a tile and
#: their epilogues overlap the other's MMAs; ``FP8FastAccum``: FP8 MMAs accumulate without CUTLASS's periodic
#: promotion to f32 registers, what ``torch._scaled_mm(use_fast_accum=True)`` asks of cuBLASLt).
#: ``bench/bench_gemm.py`` times them against cuBLAS/cuBLASLt.
SM90_CANDIDATES: dict[str, tuple[Config, ...]] = {
    "bf16": (
        Config("sm90.cu", (128, 128, 64), (2, 1), schedule="Pingpong", threads=384),
        Config("sm90.cu", (128, 128, 64), (1, 2), schedule="Cooperative", threads=384),
        Config("sm90.cu", (128, 256, 64), (2, 1), schedule="Cooperative", threads=384),
        Config("sm90.cu", (256, 128, 64), (1, 2), schedule="Cooperative", threads=384),
        Config("sm90.cu", (256, 128, 64), (2, 1), schedule="Cooperative", threads=384),
        Config("sm90.cu", (128, 128, 64), (1, 2), schedule="Pingpong", threads=384),
    ),
    "fp8": (
        # the default (first): f32 promotion overlapped with the next k-tile's MMAs (``ov``, sm90_fp8_mainloop.cuh),
        # its 2-CTA cluster along M, the direct epilogue (``d``, sm90_direct_epilogue.cuh: the tile's scales
        # prefetched during its k-tiles, each warpgroup staging its rows by stmatrix and storing them itself, no
        # CTA-wide barrier): against the TMA epilogue below on the H200 (2026-12-02, docs/PERF.md "The FP8 GEMM's
        # epilogue") +0.8-4.0% short-burst on all six of issue 7's shapes, sustained at the power limit +0.8-1.3% on
        # five and -0.8% on one (qkv), 4% more TFLOP/s per clock on 8192 x 16384 x 2048
        Config("sm90.cu", (128, 128, 128), (2, 1), schedule="Cooperative", threads=384, overlap=True, direct=True),
        # the default before (2026-12-02), 128 x 64 epilogue subtiles: sustained at the H200's power limit with the
        # runtime's swizzle (docs/PERF.md "The tile scheduler's swizzle per problem") the fastest FP8 promotion
        # build with the TMA epilogue, or within 0.1% of it, on all 11 shapes timed in two runs
        Config("sm90.cu", (128, 128, 128), (2, 1), schedule="Cooperative", threads=384, overlap=True, epi_n=64),
        # measured on the H200 (commit 5ce8ab1, bench_gemm fp8-row, M = 8192 / 4096): 1287-1354 TFLOP/s where
        # CUTLASS's own promotion on the same tile (the next line, the default before) gave 963-1172
        Config("sm90.cu", (128, 128, 128), (1, 2), schedule="Cooperative", threads=384, overlap=True),
        Config("sm90.cu", (128, 128, 128), (1, 2), schedule="Cooperative", threads=384),
        Config("sm90.cu", (256, 128, 128), (1, 2), schedule="Cooperative", threads=384),
        Config("sm90.cu", (128, 128, 128), (1, 2), schedule="CooperativeFP8FastAccum", threads=384),
        Config("sm90.cu", (128, 256, 128), (2, 1), schedule="CooperativeFP8FastAccum", threads=384),
        Config("sm90.cu", (256, 128, 128), (1, 2), schedule="CooperativeFP8FastAccum", threads=384),
        Config("sm90.cu", (128, 128, 128), (2, 1), schedule="PingpongFP8FastAccum", threads=384),
        # f32 promotion again (added 2026-11-30, not yet timed): CUTLASS's promotion drains a warpgroup's wgmmas
        # every k-tile; the ``ov`` mainloop keeps the next k-tile's in flight (sm90_fp8_mainloop.cuh), for one more
        # accumulator set (3 x 64 floats a thread: 64x128 per warpgroup is the widest that fits without spills).
        # 256-wide tiles with promotion hold 2 x 128 and spill (coop256x128x128: 904 bytes); 128x192 holds 2 x 96
        # and does not. (Forced swizzles were candidates here until 2026-12-02: the swizzle is host-side Params, the
        # same cubin, now chosen per problem at launch, ``auto_swizzle``.)
        Config("sm90.cu", (128, 128, 128), (2, 1), schedule="Cooperative", threads=384, overlap=True),
        Config("sm90.cu", (64, 128, 128), (2, 1), schedule="Pingpong", threads=384, overlap=True),
        Config("sm90.cu", (128, 192, 128), (1, 2), schedule="Cooperative", threads=384),
    ),
}
#: further sm_90a configurations ``bench/bench_gemm.py`` builds and times beside ``SM90_CANDIDATES`` but the
#: autotuner does not (it times at most ``autotune.MAX_CANDIDATES`` = 8 per spec); one that wins a shape there moves
#: into ``SM90_CANDIDATES`` (in place of one that never wins). Swizzles are no configurations: ``bench_gemm.py
#: --swizzles 1,8`` times each build at each (the same cubin).
SM90_EXPLORE: dict[str, tuple[Config, ...]] = {
    # (2026-12-01) the tile scheduler's raster order on the configurations that fell short of the reference: one
    # bench_gemm run (docs/PERF.md, "Prefill GEMMs", sixteenth session) timed 4 bf16 and 8 FP8 raster and swizzle
    # variants; none of the bf16 ones won a shape, these FP8 ones won one or two cells each (by less than the spread
    # between runs)
    "fp8": (
        Config("sm90.cu", (128, 128, 128), (1, 2), schedule="Cooperative", threads=384, overlap=True,
               raster="AlongN"),
        Config("sm90.cu", (128, 128, 128), (2, 1), schedule="PingpongFP8FastAccum", threads=384,
               raster="AlongM"),
        Config("sm90.cu", (128, 128, 128), (1, 2), schedule="PingpongFP8FastAccum", threads=384),
        Config("sm90.cu", (64, 128, 128), (1, 2), schedule="Pingpong", threads=384, overlap=True),
        # ping-pong with CUTLASS's promotion: each warpgroup's epilogue overlaps the other's MMAs
        Config("sm90.cu", (64, 128, 128), (2, 1), schedule="Pingpong", threads=384),
        # (2026-12-02) epilogue subtiles of 128 x 64 (CUTLASS's: 128 x 32, four a 128 x 128 tile), and no cluster
        # (cuBLASLt's rowwise FP8 kernels with promotion use none): each won several of the 18 FP8 cells of one
        # bench_gemm run (docs/PERF.md, "FP8 prefill GEMMs at the power limit"); 128 x 128 subtiles, and no cluster
        # with CUTLASS's subtile, won none (coopov c2x1e64 became the default that day: SM90_CANDIDATES)
        Config("sm90.cu", (128, 128, 128), (1, 2), schedule="Cooperative", threads=384, overlap=True, epi_n=64),
        Config("sm90.cu", (128, 128, 128), (1, 1), schedule="Cooperative", threads=384, overlap=True, epi_n=64),
        Config("sm90.cu", (128, 128, 128), (2, 1), schedule="PingpongFP8FastAccum", threads=384, epi_n=64),
        # (2026-12-02) the direct epilogue on the other cluster shape (c2x1d is the default). bf16 builds with it
        # (no scales to prefetch, CUTLASS's mainloop) measured 3-15% slower than with the TMA epilogue: not explored
        Config("sm90.cu", (128, 128, 128), (1, 2), schedule="Cooperative", threads=384, overlap=True, direct=True),
    ),
}
#: sm_90a configurations for steps of few rows (65-256: decode batches past the GEMV buckets, short prefill chunks)
#: on narrow matrices, where the prefill configurations' 128-row tiles give one tile row and so N / 128 CTAs (16-24
#: on a 1B model's qkv / o) for 132 SMs: 64-row ping-pong tiles, a 2-CTA cluster along M sharing each weight tile by
#: multicast. ``bench/bench_skinny.py --short-m`` times them against cuBLAS / cuBLASLt at those row counts.
SM90_SHORT_M: dict[str, tuple[Config, ...]] = {
    "bf16": (
        Config("sm90.cu", (64, 64, 64), (2, 1), schedule="Pingpong", threads=384),
        Config("sm90.cu", (64, 64, 64), (1, 1), schedule="Pingpong", threads=384),
        Config("sm90.cu", (64, 128, 64), (2, 1), schedule="Pingpong", threads=384),
        Config("sm90.cu", (64, 32, 64), (2, 1), schedule="Pingpong", threads=384),
    ),
    "fp8": (
        Config("sm90.cu", (64, 64, 128), (2, 1), schedule="Pingpong", threads=384, overlap=True),
        Config("sm90.cu", (64, 128, 128), (2, 1), schedule="Pingpong", threads=384, overlap=True),
        Config("sm90.cu", (64, 64, 128), (1, 1), schedule="Pingpong", threads=384, overlap=True),
    ),
}
#: ``linear_cutlass_spec``'s weight scale granularities -> the templates' ``WEIGHT_SCALES`` and the entry name's suffix
WEIGHT_SCALES = {"channel": 0, "tensor": 1, "block": 2, "block-rows": 3}
WEIGHT_SCALES_SUFFIX = {"channel": "", "tensor": "_wt", "block": "_wb", "block-rows": "_wbr"}
#: the weight scale granularities in 128 x 128 blocks (applied in the mainloop)
BLOCK_SCALES = ("block", "block-rows")
#: the tile scheduler's raster orders (RasterOrderOptions) -> their config_tag suffix (Heuristic: none)
RASTER_TAGS = {"Heuristic": "", "AlongM": "rm", "AlongN": "rn"}

#: ``auto_swizzle``: the bytes of the operand a wave of tiles reads whole past which the persistent scheduler
#: swizzles (the H100's / H200's L2 is 50 MB): between the largest measured that swizzling slowed (16 MiB) and the
#: smallest it sped up (32 MiB), see auto_swizzle
SWIZZLE_BYTES = 24 << 20
#: the max swizzle ``auto_swizzle`` takes past SWIZZLE_BYTES (CUTLASS's largest)
AUTO_SWIZZLE = 8


def sm90_blocks(m: int, n: int, tile: Sequence[int], cluster: Sequence[int]) -> tuple[int, int]:
    """The sm90 persistent scheduler's tile blocks along M and N before any swizzle: tiles rounded up to whole
    clusters."""
    def blocks(extent: int, size: int, cluster_size: int) -> int:
        tiles = -(-extent // size)
        return -(-tiles // cluster_size) * cluster_size

    return blocks(m, tile[0], cluster[0]), blocks(n, tile[1], cluster[1])


def rasterizes_along_m(blocks_m: int, blocks_n: int, raster: str = "Heuristic") -> bool:
    """Whether the sm90 scheduler walks along M: CUTLASS's Heuristic does where there are more column blocks (the
    dimension with fewer blocks is walked), else the forced order."""
    return blocks_n > blocks_m if raster == "Heuristic" else raster == "AlongM"


def swept_operand_bytes(m: int, n: int, k: int, elem_bits: int, tile: Sequence[int], cluster: Sequence[int],
                        raster: str = "Heuristic") -> int:
    """Bytes of the operand the sm90 persistent scheduler sweeps whole while it walks one tile row or column: x
    (``M x K``) when it rasterizes along M, w (``N x K``) along N. Heuristic rasterization (CUTLASS's) walks the
    dimension with fewer tile blocks, so this is the smaller operand."""
    along_m = rasterizes_along_m(*sm90_blocks(m, n, tile, cluster), raster)
    return (m if along_m else n) * k * elem_bits // 8


def auto_swizzle(m: int, n: int, k: int, elem_bits: int, tile: Sequence[int], cluster: Sequence[int],
                 raster: str = "Heuristic") -> int:
    """The max swizzle for an ``m x n x k`` problem on the sm90 persistent scheduler, for configurations that leave it
    open (``Config.swizzle`` 0). Unswizzled, the 132 tiles in flight lie along one or two tile rows (or columns), so
    every wave reads the swept operand (``swept_operand_bytes``) whole; once that is past the L2 it comes from DRAM
    again each wave. Swizzled by 8, a wave covers 8 rows by ~16 columns and the operand is read once per 8 rows.
    Measured on the H200 (bench_gemm --sustain-all --swizzles 1,8: every build at the 690 W power limit, 2026-12-02,
    docs/PERF.md "The tile scheduler's swizzle per problem"), swizzle 8 against none: FP8 1.11-1.13x with 64 MiB
    swept (8192^3; the clock 1,150-1,230 -> 1,335-1,365 MHz), 1.02-1.06x with 32 MiB (8192 x 8192 x 4096,
    16384 x 16384 x 2048), 0.98x with 16 MiB (4096^3, 8192 x 16384 x 2048: where the operand stays in L2 the
    swizzle's longer strides cost a little); BF16 1.03-1.13x with 128 and 64 MiB, 1.01-1.09x with 32 MiB."""
    swept = swept_operand_bytes(m, n, k, elem_bits, tile, cluster, raster)
    return AUTO_SWIZZLE if swept > SWIZZLE_BYTES else 1


def config_tag(cfg: Config) -> str:
    """A short name for a configuration, e.g. ``coop128x256x64c2x1``; the sm90 knobs where not CUTLASS's defaults:
    ``ov`` after the schedule (overlapped promotion), ``s4`` (max swizzle 4), ``rm`` / ``rn`` (raster along M / N),
    ``e64`` (64-column epilogue subtiles), ``d`` (the direct epilogue) at the end, e.g. ``coop128x128x128c1x2s4``,
    ``coopov128x128x128c2x1e64``, ``coopov128x128x128c2x1d``."""
    sched = cfg.schedule.replace("Cooperative", "coop").replace("Pingpong", "pp").replace("FP8FastAccum", "fa")
    knobs = (f"{'s' + str(cfg.swizzle) if cfg.swizzle else ''}{RASTER_TAGS[cfg.raster]}"
             f"{'e' + str(cfg.epi_n) if cfg.epi_n else ''}{'d' if cfg.direct else ''}")
    return (f"{sched}{'ov' if cfg.overlap else ''}{'2sm' if cfg.two_sm else ''}{'x'.join(map(str, cfg.tile))}"
            f"c{cfg.cluster[0]}x{cfg.cluster[1]}{knobs}")


def _candidate(kind: str, tag: str) -> Config:
    """The ``SM90_CANDIDATES[kind]`` entry named ``tag`` (``config_tag``): rules name their configuration."""
    found = [c for c in SM90_CANDIDATES[kind] if config_tag(c) == tag]
    if len(found) != 1:
        raise ValueError(f"gemm_cutlass: no single {kind} candidate {tag!r} in SM90_CANDIDATES")
    return found[0]


@dataclass(frozen=True)
class ShapeRule:
    """Linears with ``N >= min_n``, ``K >= min_k`` and ``N >= min_n_per_k * K`` take ``config``. ``measured``:
    the (N, K) shapes whose fastest candidate it is (docs/PERF.md), which ``tests/codegen/test_gemm_cutlass.py``
    checks the table against."""

    name: str
    kind: str
    config: Config
    min_n: int = 0
    min_k: int = 0
    min_n_per_k: int = 0
    measured: tuple[tuple[int, int], ...] = ()

    def applies(self, kind: str, n: int, k: int) -> bool:
        return kind == self.kind and n >= self.min_n and k >= self.min_k and n >= self.min_n_per_k * k


#: Per-shape choice on h100/h200, tried in order, first match wins, else the kind's default (``variant_config``).
#: Data: docs/PERF.md, "Prefill GEMMs: CUTLASS sm_90a vs cuBLAS / cuBLASLt" (H200, 2026-11-29, bench/bench_gemm.py,
#: M = 8192 rows): the fastest bf16 candidate was pp128x128x64c2x1 (the default) for N x K = 3072x2048 and 2048x2048,
#: pp128x128x64c1x2 for 16384x2048, coop256x128x64c1x2 for 2048x8192 and 8192x8192, coop128x256x64c2x1 for 4096x4096;
#: the default was within 3-10% of the winner elsewhere. Only those six shapes were measured, at that one row
#: count: the thresholds between them are a guess (tuning on the target GPU measures the artifact's own shapes).
#: Rules are few on purpose: each configuration an artifact uses is one more multi-minute nvcc build (cubin and
#: Params probe) shared by all its linears of that configuration and epilogue. FP8 (f32 promotion) has no rule:
#: its default, coopov128x128x128c2x1d (the direct epilogue), was faster than the fastest TMA-epilogue build before it
#: (coopov128x128x128c2x1e64) on all six shapes short-burst and five of six sustained (2026-12-02; the FP8FastAccum
#: ones give other numerics and are not a per-shape choice). The scheduler's swizzle is chosen per problem at launch
#: (``auto_swizzle``), not here.
SM90_SHAPE_RULES: tuple[ShapeRule, ...] = (
    # long reductions (a down projection; 8192^3 too, so before "large"): a 256-row tile loads each weight tile
    # once per 256 rows instead of 128, which pays where the main loop dominates
    ShapeRule("long-k", "bf16", _candidate("bf16", "coop256x128x64c1x2"), min_k=8192,
              measured=((2048, 8192), (8192, 8192))),
    # many more outputs than inputs (gate+up, lm_head): the default's tile, its 2-CTA cluster along N instead of M
    # (the pair shares x tiles instead of weight tiles)
    ShapeRule("wide-n", "bf16", _candidate("bf16", "pp128x128x64c1x2"), min_n=8192, min_n_per_k=4,
              measured=((16384, 2048),)),
    # large layers otherwise (an 8B model's attention projections): 256-column tiles
    ShapeRule("large", "bf16", _candidate("bf16", "coop128x256x64c2x1"), min_n=4096, min_k=4096,
              measured=((4096, 4096),)),
)


def shape_config(kind: str, n: int, k: int, target: Target) -> Config:
    """The configuration for a ``kind`` linear of N outputs and K inputs on ``target``: the first of
    ``SM90_SHAPE_RULES`` that applies on h100/h200, else (and on other targets) the kind's default. Deterministic:
    what every compile without a GPU of the target's architecture records."""
    default = variant_config(kind, target)
    if target.wgmma and not target.tcgen05 and default.template == "sm90.cu":
        rule = next((r for r in SM90_SHAPE_RULES if r.applies(kind, n, k)), None)
        if rule is not None:
            return rule.config
    return default


@dataclass(frozen=True)
class ShortTier:
    """Steps of up to ``rows`` rows of a narrow linear run ``configs[kind]`` (``short_m_configs``); ``min_k``: only
    for reductions at least this long."""

    rows: int
    configs: dict[str, Config]
    min_k: int = 0


def _short(kind: str, tile: tuple[int, int, int], overlap: bool = False) -> Config:
    found = [c for c in SM90_SHORT_M[kind] if c.tile == tile and c.cluster == (2, 1) and c.overlap == overlap]
    assert len(found) == 1, (kind, tile)
    return found[0]


#: short-step tiers, smallest first, measured on the H200 (docs/PERF.md "Short steps on CUTLASS"): 64 x 64 tiles up to
#: 256 rows (qkv / o / down 1.5-4x the prefill configuration); from 257 to 512 rows 64 x 128 tiles on long
#: reductions only (down: 29-35 us against 79 at 320-512 rows, W8A8 1.2-1.3x; on qkv / o, K = 2048, no short
#: configuration was faster than the prefill one past 256 rows)
SHORT_M_TIERS = (
    ShortTier(256, {"bf16": _short("bf16", (64, 64, 64)), "fp8": _short("fp8", (64, 64, 128), overlap=True)}),
    ShortTier(512, {"bf16": _short("bf16", (64, 128, 64)), "fp8": _short("fp8", (64, 128, 128), overlap=True)},
              min_k=8192),
)
#: the weight bytes a tile of the linear's own configuration streams (its columns x K) from which a short-step
#: configuration pays: below it the few CTAs finish about as fast as many would (a small model's linears)
SHORT_M_MIN_TILE_BYTES = 256 << 10


def short_m_configs(kind: str, n: int, k: int, target: Target) -> list[tuple[int, Config]]:
    """``(max rows, configuration)`` of the ``SHORT_M_TIERS`` a ``kind`` linear takes, smallest first: those where
    its own configuration (``shape_config``) would run fewer tiles than the GPU has SMs at the tier's row count, each
    streaming at least ``SHORT_M_MIN_TILE_BYTES`` of weights (narrow matrices of large K: a 1B model's qkv / o / down
    give 16-48 tiles of 512 KB-2 MB for 132 SMs at 256 rows), and K reaches the tier's ``min_k``; empty for wide
    matrices, small K, and targets other than h100 / h200."""
    if not (target.wgmma and not target.tcgen05) or kind not in SM90_SHORT_M:
        return []
    own = shape_config(kind, n, k, target)
    if own.template != "sm90.cu" or own.tile[1] * k * OPERANDS[kind][1] // 8 < SHORT_M_MIN_TILE_BYTES:
        return []
    out = []
    for tier in SHORT_M_TIERS:
        blocks_m, blocks_n = sm90_blocks(tier.rows, n, own.tile, own.cluster)
        if k >= tier.min_k and blocks_m * blocks_n < target.num_sms:
            out.append((tier.rows, tier.configs[kind]))
    return out


def candidate_configs(kind: str, target: Target) -> tuple[Config, ...]:
    """Configurations to time for ``kind`` on ``target`` (the default alone where no candidates are listed)."""
    if target.wgmma and not target.tcgen05 and kind in SM90_CANDIDATES:
        return SM90_CANDIDATES[kind]
    return (variant_config(kind, target),)


def bench_configs(kind: str, target: Target) -> tuple[Config, ...]:
    """What ``bench/bench_gemm.py`` builds and times for ``kind`` on ``target``: the candidates, then (h100/h200)
    ``SM90_EXPLORE``'s."""
    explore = SM90_EXPLORE.get(kind, ()) if target.wgmma and not target.tcgen05 else ()
    return (*candidate_configs(kind, target), *explore)


def supports(kind: str, target: Target) -> bool:
    try:
        variant_config(kind, target)
    except ValueError:
        return False
    return True


def weight_scales_reason(kind: str, cfg: Config, weight_scales: str) -> str | None:
    """Why configuration ``cfg`` of ``kind`` has no build with ``weight_scales`` (``linear_cutlass_spec``), or None."""
    if weight_scales not in WEIGHT_SCALES:
        return f"weight_scales must be one of {sorted(WEIGHT_SCALES)}, got {weight_scales!r}"
    if weight_scales == "tensor" and cfg.template not in ("sm90.cu", "sm100.cu"):
        return f"a per-tensor weight scale is for sm90.cu / sm100.cu builds, not {cfg.template} (block scales there)"
    if weight_scales in BLOCK_SCALES and (kind != "fp8" or cfg.template != "sm90.cu" or not (cfg.overlap and cfg.direct)
                                          or cfg.tile != (128, 128, 128)):
        return (f"128 x 128 block scales are for FP8 on sm90.cu with the overlapped promotion, the direct epilogue "
                f"and 128 x 128 x 128 tiles (one weight block a tile and k-tile), not {config_tag(cfg)}")
    return None


def linear_cutlass_spec(kind: str, n: int, k: int, target: Target, residual: bool = False,
                        config: Config | None = None, weight_scales: str = "channel") -> KernelSpec:
    """The spec for a ``kind`` (bf16 | fp8 | nvfp4 | mxfp4) linear with static N and K, bf16 output.

    ``weight_scales`` (a build-time choice, like the residual; ``WEIGHT_SCALES``): ``channel``, ``weight_scale`` f32[N]
    and ``x_scale`` f32[M] in the epilogue; ``tensor`` (``sm90.cu`` / ``sm100.cu``, entry names ``..._wt``), the
    weight's one f32 (an FP8 weight quantized per tensor); ``block`` (FP8 on ``sm90.cu``, the overlapped-promotion
    mainloop with the direct epilogue and 128 x 128 x 128 tiles, ``..._wb``): DeepSeek-V3's 1x128 x 128x128 block
    scaling in the layouts cuBLASLt takes, ``x_scale`` f32 ``[ceil(K/128)][M]`` (x's scale per row and 128 columns,
    column by column) and ``weight_scale`` f32 ``[ceil(N/128)][KB4]`` (KB4: ceil(K/128) rounded up to a multiple of
    4), each k-tile's partial promoted with its two scales (``sm90_fp8_mainloop.cuh``); ``block-rows`` (the same builds,
    ``..._wbr``): ``fp8:block`` with per-token activations, ``weight_scale`` f32 ``[ceil(N/128)][ceil(K/128)]`` (ingot's
    layout, not padded) applied to each k-tile's partial, ``x_scale`` f32[M] in the epilogue as ``channel``'s.

    The grid recorded here is the persistent upper bound (one CTA per SM, rounded down to whole
    clusters) and ``smem`` the most a block may opt into; the shim's ``_prepare`` returns the exact
    grid and dynamic shared memory for each M.
    """
    if kind not in OPERANDS:
        raise ValueError(f"gemm_cutlass: kind must be one of {sorted(OPERANDS)}, got {kind!r}")
    cfg = config or variant_config(kind, target)
    ctype, _, align = OPERANDS[kind]
    if k % align or n % 8:
        raise ValueError(f"gemm_cutlass {kind}: needs K % {align} == 0 and N % 8 == 0, got N={n} K={k}")
    reason = weight_scales_reason(kind, cfg, weight_scales)
    if reason:
        raise ValueError(f"gemm_cutlass {kind}: {reason}")
    values = {
        "A_TYPE": ctype, "B_TYPE": ctype, "OUT_TYPE": "cutlass::bfloat16_t", "N": n, "K": k,
        "TILE_M": cfg.tile[0], "TILE_N": cfg.tile[1], "TILE_K": cfg.tile[2],
        "CLUSTER_M": cfg.cluster[0], "CLUSTER_N": cfg.cluster[1], "TWO_SM": cfg.two_sm,
        "HAS_RESIDUAL": residual, "ABI": ABI,
    }
    if cfg.template in ("sm90.cu", "sm100.cu"):
        values["WEIGHT_SCALES"] = WEIGHT_SCALES[weight_scales]
    if cfg.direct and (cfg.template != "sm90.cu" or not cfg.schedule.startswith("Cooperative") or cfg.tile[0] != 128):
        raise ValueError(f"gemm_cutlass: the direct epilogue is for sm90.cu's cooperative schedules with 128-row tiles "
                         f"(each consumer warpgroup stores its 64 rows; the scale prefetch follows one tile at a "
                         f"time): {cfg}")
    if cfg.template == "sm90.cu":
        values["SCHEDULE"] = cfg.schedule
        values["EPILOGUE_SCHEDULE"] = "Cooperative" if cfg.schedule.startswith("Cooperative") else ""
        values |= {"OVERLAP_PROMOTION": cfg.overlap, "MAX_SWIZZLE": cfg.swizzle, "RASTER": cfg.raster,
                   "EPI_N": cfg.epi_n, "DIRECT_EPILOGUE": cfg.direct}
    if cfg.template == "sm100_blockscaled.cu":
        values["SF_VECTOR"] = 16 if kind == "nvfp4" else 32
    cluster = cfg.cluster[0] * cfg.cluster[1]
    tag = f"linear_cutlass_{kind}_n{n}_k{k}{'_res' if residual else ''}{WEIGHT_SCALES_SUFFIX[weight_scales]}"
    if config is not None and config != variant_config(kind, target):
        tag += f"_{config_tag(cfg)}"
    doc = (f"CUTLASS {kind} GEMM {cfg.template}, tile {'x'.join(map(str, cfg.tile))}, cluster "
           f"{cfg.cluster[0]}x{cfg.cluster[1]}, {weight_scales} weight scales; launch through the host shim (ABI "
           f"{ABI}, build.py)")
    return KernelSpec.make("gemm_cutlass", cfg.template, tag, target.arch or "", values, PARAMS, cfg.threads,
                           [GridDim(const=target.num_sms // cluster * cluster)], smem=target.smem_per_block,
                           doc=doc)


def plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    residual = inputs[3] if len(inputs) > 3 else None
    n, k = static_dim(w, 0), static_dim(w, 1)
    if not target.is_gpu or x is None or w is None or n is None or k is None or w.rank != 2:
        return None
    if x.dtype is not DType.bf16 or w.dtype is not DType.bf16 or static_dim(x, -1) != k:
        return None
    if any(t is not None and t.dtype is not DType.bf16 for t in (bias, residual)):
        return None
    if not supports("bf16", target) or k % OPERANDS["bf16"][2] or n % 8:
        return None
    return [linear_cutlass_spec("bf16", n, k, target, residual=residual is not None,
                                config=shape_config("bf16", n, k, target))]


FAMILY = Family(name="gemm_cutlass", ops=("linear",), plan=plan)
