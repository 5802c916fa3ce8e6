"""Paged prefill attention on Hopper's warpgroup MMA (``prefill_wgmma.cu``): when it runs, and its launch.

``prefill_wgmma.cu`` is ``prefill_flash.cu`` (same parameters ``ATTEND_PARAMS``, same semantics: ragged packing,
chunked prefill over a cached prefix, GQA rows (token, query head of the group), softcap, sliding window, zeros
for padding tokens) with its MMAs on ``wgmma.mma_async`` (FlashAttention-3 style): each consumer warpgroup owns 64
query rows, S = Q K^T with both operands from 128-byte-swizzled shared memory, P kept in registers as the A
operand of O += P V (V from shared memory, MN-major). sm_90a only (wgmma exists nowhere else), bf16 queries and
cache, head_dim 64 or 128.

Launch: ``WgmmaConfig`` (consumer warpgroups, K/V tile positions, stages; opt-in ``overlap``, FlashAttention-3's
intra-warpgroup softmax/MMA pipelining, and ``producer``, its warp specialization with a loading warpgroup and
mbarriers); block ``128 * (warpgroups + producer)`` threads, grid ``(ceil(num_tokens / (64 * warpgroups / G)),
num_kv_heads)``, dynamic shared memory ``smem_bytes``. The default config (neither) is the simplest; which is
fastest is for the H200 to say (``bench/bench_prefill_attention.py``).

Selection: ``prefill_rule.plan_prefill`` returns this kernel instead of ``prefill_flash.cu`` wherever ``supported``
holds, unless ``INGOT_PREFILL_ATTENTION=flash`` (``prefill_rule.prefill_kernel``); measured on the H200 it is
1.3-1.5x the flash kernel (docs/PERF.md, "The wgmma kernel").
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ....ir.types import DType
from ...kernel import GridDim, KernelSpec
from ...target import Target
from .split_rule import ATTEND_PARAMS

HEAD_DIMS = (64, 128)
BLOCK_NS = (64, 128)
#: the alignment slack the kernel rounds its dynamic shared memory up by (SWIZZLE_128B panels start 1024-aligned)
ALIGN_SLACK = 1024
#: dynamic shared memory an sm_90a CTA may have
MAX_SMEM = 227 * 1024


@dataclass(frozen=True)
class WgmmaConfig:
    #: consumer warpgroups per CTA (64 query rows each); 2 is FlashAttention-3's 128-row tile
    warpgroups: int = 2
    #: K/V positions per tile (the N of S = Q K^T, the K of O += P V)
    block_n: int = 128
    #: shared-memory K/V stages (cp.async: STAGES - 1 tiles in flight while one is computed)
    stages: int = 2
    #: FlashAttention-3's intra-warpgroup pipelining: a tile's O += P V runs during the next tile's softmax (S of
    #: the next tile live beside P and O: more registers; needs 3 stages, loads then run 1 tile ahead)
    overlap: bool = False
    #: warp specialization: one more warpgroup that only loads K/V, full/empty mbarriers per stage instead of a CTA
    #: barrier per tile (the consumer warpgroups drift apart: one's softmax under the other's MMAs)
    producer: bool = False
    #: the CTAs with the most K/V tiles first: KV heads vary fastest over the launch order and token ranges run
    #: from the last (the longest causal rows) to the first, so the grid's last wave holds its shortest CTAs
    heavy_first: bool = False
    #: the causal / window / context mask only on the tiles it can change (the rest skip its compares and selects)
    #: and, without softcap, the scale folded into the exponent (one FFMA per score instead of FMUL + FADD)
    lean_mask: bool = False
    #: FlashAttention-3's inter-warpgroup ping-pong (with a producer and two consumers): named barriers let the
    #: consumers issue their MMAs in turn, so one's softmax runs under the other's O += P V and next S = Q K^T
    pingpong: bool = False
    #: (with a producer) its first warp loads K/V by TMA, a copy per cache block, head_dim panel and K or V, through
    #: a tensor map of the KV cache the loader fills (``runtime/kv_tma.py``), instead of 128 threads' cp.async per
    #: 16 bytes; block sizes a multiple of 8 that divide or are divided by ``block_n``
    tma: bool = False
    #: (with tma) the producer's second warp zeroes, once a tile's copies landed, the V rows past the context that
    #: the copy of the context's last cache block brought (whatever an earlier owner of the block left: a non-finite
    #: value there would make P V NaN although P is 0); the consumers wait for it on that tile only
    v_zero: bool = False

    @property
    def rows(self) -> int:
        return 64 * self.warpgroups

    @property
    def threads(self) -> int:
        return 128 * (self.warpgroups + self.producer)


#: overrides ``default_config`` at compile time: a config name (``parse_config``) for every head_dim, or
#: ``HEAD_DIM:NAME`` items separated by commas (``64:2x64x3wshf,128:2x128x3wspp``)
CONFIG_ENV = "INGOT_PREFILL_WGMMA_CONFIG"
#: a config name's flags (two letters each, after ``WxNxS``) and the WgmmaConfig fields they set
CONFIG_FLAGS = {"ov": "overlap", "ws": "producer", "hf": "heavy_first", "lm": "lean_mask", "pp": "pingpong",
                "tm": "tma", "vz": "v_zero"}


def parse_config(name: str) -> WgmmaConfig:
    """``WxNxS`` (consumer warpgroups x K/V positions per tile x stages) then any of ``CONFIG_FLAGS`` in any order,
    e.g. ``2x128x3ovwspp``."""
    rest, flags = name.strip(), {}
    while rest[-2:] in CONFIG_FLAGS:
        rest, flags = rest[:-2], {**flags, CONFIG_FLAGS[rest[-2:]]: True}
    parts = rest.split("x")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"wgmma config {name!r}: expected WxNxS plus flags {'/'.join(CONFIG_FLAGS)}, "
                         f"e.g. 2x128x3wspp")
    return WgmmaConfig(*(int(p) for p in parts), **flags)


def config_name(cfg: WgmmaConfig) -> str:
    """``parse_config``'s inverse (flags in ``CONFIG_FLAGS``' order)."""
    flags = "".join(f for f, field in CONFIG_FLAGS.items() if getattr(cfg, field))
    return f"{cfg.warpgroups}x{cfg.block_n}x{cfg.stages}{flags}"


def default_config(head_dim: int, block_size: int | None = None) -> WgmmaConfig:
    """The fastest config measured on the H200 (``bench/bench_prefill_attention.py``, docs/PERF.md "The wgmma
    kernel" and "K/V by TMA"): a producer warpgroup loading K/V by TMA and two consumers, three stages of 128-position
    K/V tiles, the heaviest CTAs first and the mask only on the tiles that cross it, at head_dim 128 with ping-pong
    consumers (``2x128x3wshflmpptm``: 485 / 488 TFLOP/s on 4k causal MHA, two runs, against 483 / 476 without
    ping-pong and 409 / 410 with cp.async loads), at 64 without (``2x128x3wshflmtm``: 310 / 312 on 8 x 2048 causal
    GQA 32/8, 308 / 307 with ping-pong, 291 / 292 with cp.async). Caches whose ``block_size`` TMA copies cannot tile
    (``tma_block_ok``) load by cp.async, without ping-pong (``2x128x3wshflm``, the fastest there). With TMA the V
    rows past the context are zeroed (``v_zero``, flag vz: 484.8 vs 485.1 TFLOP/s at head_dim 128, 307.8 vs 309.2 at
    64, eighteenth session), so a non-finite value an earlier owner left in the context's last cache block cannot
    make a row NaN. ``INGOT_PREFILL_WGMMA_CONFIG`` (``CONFIG_ENV``) overrides it."""
    env = os.environ.get(CONFIG_ENV, "").strip()
    for item in filter(None, (i.strip() for i in env.split(","))):
        dim, sep, name = item.rpartition(":")
        if not sep or int(dim) == head_dim:
            return parse_config(name)
    tma = block_size is None or tma_block_ok(block_size, 128)
    return WgmmaConfig(2, 128, 3, producer=True, heavy_first=True, lean_mask=True, pingpong=tma and head_dim == 128,
                       tma=tma, v_zero=tma)


def smem_bytes(head_dim: int, cfg: WgmmaConfig) -> int:
    """The Q rows plus ``stages`` K and V tiles, bf16, plus the 1 KB the kernel may skip to align them; with a
    producer the stages' full and empty mbarriers (8 bytes each), with overlap a scratch word per thread, with
    v_zero a third mbarrier per stage."""
    extra = ((16 * cfg.stages if cfg.producer else 0) + (4 * cfg.threads if cfg.overlap else 0)
             + (8 * cfg.stages if cfg.v_zero else 0))
    return ALIGN_SLACK + 2 * head_dim * (cfg.rows + 2 * cfg.stages * cfg.block_n) + extra


def supported(dtype: DType, cache_dtype: DType, num_heads: int, num_kv_heads: int, head_dim: int,
              block_size: int, target: Target, cfg: WgmmaConfig | None = None) -> bool:
    """Whether ``prefill_wgmma.cu`` takes this attention: an sm_90a target, bf16 queries and cache, head_dim 64 or
    128, a query-head group no larger than the CTA's rows, a valid config whose shared memory fits."""
    if target.arch != "sm_90a" or not target.wgmma:
        return False
    if dtype is not DType.bf16 or cache_dtype is not DType.bf16 or head_dim not in HEAD_DIMS:
        return False
    if num_kv_heads <= 0 or num_heads % num_kv_heads or block_size <= 0:
        return False
    cfg = cfg or default_config(head_dim, block_size)
    if cfg.warpgroups not in (1, 2) or cfg.block_n not in BLOCK_NS or cfg.stages not in (2, 3):
        return False
    if cfg.overlap and cfg.stages < 3:
        return False
    if cfg.pingpong and not (cfg.producer and cfg.warpgroups == 2):
        return False
    if cfg.tma and not (cfg.producer and tma_block_ok(block_size, cfg.block_n)):
        return False
    if cfg.v_zero and not cfg.tma:
        return False
    return num_heads // num_kv_heads <= cfg.rows and smem_bytes(head_dim, cfg) <= MAX_SMEM


def tma_block_ok(block_size: int, block_n: int) -> bool:
    """Whether TMA copies can load a cache of ``block_size``-position blocks into ``block_n``-position tiles: copies of
    ``min(block_size, block_n)`` rows, a multiple of 8 (the 128-byte swizzle's 1024-byte atom), tiling both."""
    rows = min(block_size, block_n)
    return rows % 8 == 0 and block_n % rows == 0 and block_size % rows == 0


def tokens_per_cta(num_heads: int, num_kv_heads: int, cfg: WgmmaConfig) -> int:
    return cfg.rows // (num_heads // num_kv_heads)


def wgmma_spec(dtype: DType, cache_dtype: DType, num_heads: int, num_kv_heads: int, head_dim: int,
               block_size: int, scale: float, target: Target, softcap: float = 0.0, sliding_window: int = 0,
               cfg: WgmmaConfig | None = None) -> KernelSpec:
    """The attention launch: params ``ATTEND_PARAMS`` (those of ``prefill_flash.cu`` and the decode kernels),
    grid ``(ceil(num_tokens / tokens_per_cta), num_kv_heads)``."""
    cfg = cfg or default_config(head_dim, block_size)
    if not supported(dtype, cache_dtype, num_heads, num_kv_heads, head_dim, block_size, target, cfg):
        raise ValueError(f"wgmma prefill attention does not take {dtype.value}/{cache_dtype.value} "
                         f"{num_heads}x{num_kv_heads}x{head_dim} block {block_size} on {target.name} with {cfg}")
    group = num_heads // num_kv_heads
    values = {"HEAD_DIM": head_dim, "KV_HEADS": num_kv_heads, "GROUP": group, "BLOCK_SIZE": block_size,
              "WGS": cfg.warpgroups, "BLOCK_N": cfg.block_n, "STAGES": cfg.stages, "OVERLAP": cfg.overlap,
              "PRODUCER": cfg.producer, "HEAVY_FIRST": cfg.heavy_first, "LEAN_MASK": cfg.lean_mask,
              "PINGPONG": cfg.pingpong, "TMA": cfg.tma, "VZ": cfg.v_zero, "Q_STRIDE": num_heads * head_dim,
              "SCALE": float(scale), "SOFTCAP": float(softcap), "SLIDING_WINDOW": int(sliding_window)}
    tag = (f"{dtype.value}_{num_heads}x{num_kv_heads}x{head_dim}_b{block_size}_wg{cfg.warpgroups}_n{cfg.block_n}"
           f"_s{cfg.stages}{'_ov' if cfg.overlap else ''}{'_ws' if cfg.producer else ''}"
           f"{'_hf' if cfg.heavy_first else ''}{'_lm' if cfg.lean_mask else ''}{'_pp' if cfg.pingpong else ''}"
           f"{'_tm' if cfg.tma else ''}{'_vz' if cfg.v_zero else ''}")
    tpt = tokens_per_cta(num_heads, num_kv_heads, cfg)
    return KernelSpec.make("attention", "prefill_wgmma.cu", f"paged_attention_prefill_wgmma_{tag}",
                           target.arch or "", values, ATTEND_PARAMS, cfg.threads,
                           [GridDim("num_tokens", tpt), GridDim(const=num_kv_heads)], smem_bytes(head_dim, cfg),
                           doc=f"wgmma prefill attention, {cfg.rows} rows ({tpt} tokens) x {cfg.block_n} positions, "
                               f"{cfg.stages} stages{', softmax overlapping O += P V' if cfg.overlap else ''}"
                               f"{', a producer warpgroup' if cfg.producer else ''}"
                               f"{', heaviest CTAs first' if cfg.heavy_first else ''}"
                               f"{', masks only boundary tiles' if cfg.lean_mask else ''}"
                               f"{', ping-pong consumers' if cfg.pingpong else ''}"
                               f"{', K/V by TMA (tensor map ingot_kv_tma, runtime/kv_tma.py)' if cfg.tma else ''}"
                               f"{', V rows past the context zeroed' if cfg.v_zero else ''}")
