"""The wgmma skinny GEMM (``skinny.cu``): decode steps of 5-64 tokens on bf16 (and FP8 / NVFP4 weight-only) matrices
on sm_90a.

``skinny.cu`` streams the weight through shared memory by TMA (a producer warp, ``stages`` stages of ``64 x
warpgroups`` rows by 64 columns) and multiplies on the tensor cores with ``wgmma m64nMBk16`` (weights as A, the
step's tokens as B, x staged once per CTA), persistent over the row tiles. It is what kernel.cu's mma.sync GEMV lacks
on large matrices from 8 tokens on: measured on the H200 (docs/PERF.md, "The skinny wgmma GEMM"), the 1B model's
gate_up (16384 x 2048) at 16 / 32 tokens 1.05x / 1.00x cuBLAS (kernel.cu 0.83x / 0.78x), the lm_head (128256 x 2048)
1.01x (kernel.cu 0.90-0.94x); on narrow matrices (qkv, o, down: fewer row tiles than SMs) it is slower than kernel.cu
unless it splits K (below). End to end (BF16 1B shape): decode at batch 16 +25.5%, batch 32 +10.0% (persistent on wide
matrices), then +5.5% / +19.4% / +4.9% at batch 16 / 32 / 64 (split-K on narrow ones), then batch 64 +28.3% (x
streamed, so 64 tokens run on it too).

**How it is chosen** (``choice``; ``INGOT_GEMV_SKINNY``, ``INGOT_GEMV_SKINNY_SPLITK``, ``INGOT_GEMV_SKINNY_XS``,
compile time): ``rule.variants`` makes a ``linear``'s variant of a token bucket with this template

- persistent (no split-K) at buckets ``DEFAULT_BUCKETS`` (16, 32, 64) where the matrix is wide, at least
  ``WIDE_TILES`` row tiles an SM (the 1B model's gate_up and lm_head): x staged whole where it fits beside
  ``MIN_STAGES`` stages (up to 32 tokens at K = 2048), else streamed (``x_stream``: 64 tokens);
- with split-K over ``NARROW_SPLITK`` CTAs of a cluster at buckets ``SPLITK_BUCKETS`` (16, 32, 64) where it is
  narrower (the 1B model's qkv, o, down): x's K slice staged where it fits, else streamed (down at 64 tokens).
  Measured on the H200 (``bench_skinny.py --splitk``, docs/PERF.md "Split-K in a cluster for the skinny GEMM"): qkv
  3072 x 2048 at 32 / 64 tokens 1.01x / 0.85x cuBLAS (kernel.cu 0.88x / 0.65x), o 2048 x 2048 1.12x / 0.87x (1.01x /
  0.65x), down 2048 x 8192 at 32 0.92x (0.82x); at 16 tokens 1.02-1.23x, about kernel.cu's. End to end (BF16 1B)
  against ``INGOT_GEMV_SKINNY_SPLITK=0``: batch 16 +5.5%, 32 +19.4%, 64 +4.9%.

Bias and residual are added in the epilogue (o and down carry the residual stream). Bucket 8 of a wide matrix is
split (``split8``): up to ``SPLIT8_ROWS`` (4) tokens keep kernel.cu's variant and its decode fusions, 5-8 tokens take
this template's with ``SPLIT8_STAGES`` (4) stages, which leave shared memory for the previous kernel's CTAs so
programmatic dependent launch overlaps them (measured: batch 6 / 8 +2.5-3%, batches 1-4 unchanged; all of bucket 8
here, with the rms_norm prologue, made batch 1 3-5% slower). ``INGOT_GEMV_BULK``, an opt-in, takes precedence where
it gives a bucket ``bulk.cu``. ``INGOT_GEMV_SKINNY``: ``from16``: bucket 8 all kernel.cu's; ``all``: all of bucket 8
of wide matrices here; ``force``: the persistent kernel at every bucket for any N (tests: small models' matrices);
``0``: never. ``INGOT_GEMV_SKINNY_SPLITK``: the split-K buckets (``0``: none,
``32,64``: those). ``INGOT_GEMV_SKINNY_XS=0``: x never streamed (what does not fit staged stays kernel.cu's).
Weight-only FP8 linears take the same variants at buckets 16-64 (``wb=1``: the e4m3 codes by TMA, converted to f16
in registers as wgmma's A operand, x staged in f16; the template's header), except split-K with x streamed (down at
64 tokens: 0.61x cuBLAS bf16 against kernel.cu's 0.76x), which stays kernel.cu's. Measured on the H200
(``bench_skinny.py --fp8``, docs/PERF.md "Weight-only FP8 on the skinny GEMM"): gate_up at 16 / 32 / 64 tokens 12.1 /
15.5 / 24.1 us against kernel.cu's 14.3 / 17.4 / 28.6; end to end (FP8 1B) batch 16 +10.3%, 32 +17.4%, 64 +7.3%.
``INGOT_GEMV_SKINNY_FP8=0`` keeps them on kernel.cu. Weight-only NVFP4 linears likewise with
``INGOT_GEMV_SKINNY_NVFP4=1`` (opt-in: ``wb=0``, the e2m1 codes and their block scales converted to f16 in registers
as kernel.cu's NVFP4 variant does, x staged whole in their order), where x fits whole and K slices are whole
256-column groups of scales (else kernel.cu's). Correct on the H200 but bound by the e2m1 conversion (about 120
instructions a 4 KB stage): gate_up and down 1.4-2x slower than kernel.cu's NVFP4 variants, split-K on qkv / o 4-23%
faster at 32 / 64 tokens, still 0.55-0.79x cuBLAS bf16 (``bench_skinny.py --nvfp4``, docs/PERF.md twentieth
session), so not the default.
``rule.fused_spec`` makes a persistent variant's rms_norm prologue (decode fusion; ``fused_skinny_spec``), as
kernel.cu's.

**Split-K in a cluster** (``skinny_spec``'s ``splitk``: 2, 4 or 8): the CTAs of a cluster take K slices of one row
tile each and add their f32 partial tiles through distributed shared memory (the template's header): for matrices
with fewer row tiles than SMs. ``bench/bench_skinny.py --splitk 2 4 8`` times it.

**x streamed** (``skinny_spec``'s ``x_stream``): x's 64-column panels go through a ring of ``stages`` panels beside the
weight stages, loaded by the consumers a few stages ahead (the template's header), so any token count up to 64 and
any K fit; x is then read once per row tile (from L2) instead of once per CTA. ``bench_skinny.py --xs`` times it.

**The weight's tensor map** (``ingot_w_tma`` in the module; ``runtime/kv_tma.fill_w_tma``): one map per module views a
region of device memory as rows of K weights and the kernel addresses its ``weight`` argument's rows from the
region's base, so every weight the module is launched on must start a whole number of rows (``row_bytes``: ``K x 2``
bytes, ``K`` with e4m3 codes, ``K / 2`` with NVFP4 ones) from it:
``weight_pitches`` names those weights for the memory plan, which aligns their offsets so (``plan_memory``'s
``weight_align``), and ``CudaExecutor`` fills each such module's map over the whole weights region at load (the
tests and benchmarks over the launch's own weight buffer).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ...kernel import GridDim, KernelSpec
from ...switches import env_choice, env_on
from ...target import Target
from .rule import PROLOGUES, QUANT_PARAMS, Prologue

#: the kernel's parameters: a plain GEMV variant's (``rule.PARAMS``, the GEMM launch's arguments), weight_scale
#: unused (bf16 weights)
PARAMS = [("x", "ptr"), ("weight", "ptr"), ("weight_scale", "ptr"), ("bias", "ptr"), ("residual", "ptr"),
          ("out", "ptr"), ("M", "i64")]
#: token buckets the kernel takes (wgmma's N; 64 only where x's K slice fits: split-K)
BUCKETS = (8, 16, 32, 64)
#: split-K widths (CTAs of a cluster, each a K slice; ``skinny_spec``'s ``splitk``)
SPLITS = (1, 2, 4, 8)
ENV = "INGOT_GEMV_SKINNY"
#: compile time: the buckets whose narrow matrices take split-K (unset or 1: ``SPLITK_BUCKETS``; 0: none; a list
#: such as ``32,64`` or ``32+64``)
SPLITK_ENV = "INGOT_GEMV_SKINNY_SPLITK"
#: split-K width of the narrow matrices' variants (bench_skinny.py on the H200: 4 the fastest of 2 / 4 / 8 on qkv,
#: o and down at 16-64 tokens)
NARROW_SPLITK = 4
SPLITK_BUCKETS = (16, 32, 64)
#: compile time: 0 keeps x staged whole (the rule then leaves what does not fit to kernel.cu); unset or 1: streamed
#: where it does not fit beside ``MIN_STAGES`` stages (64 tokens at K = 2048, 32 at K = 4096; a quarter of K = 8192
#: at 64 tokens)
XS_ENV = "INGOT_GEMV_SKINNY_XS"
#: compile time: unset or 1 gives weight-only FP8 ``quantized_linear``\ s the skinny variants ``choice`` makes for bf16
#: ones (``rule_spec``: not split-K with x streamed); 0: kernel.cu's at every bucket
FP8_ENV = "INGOT_GEMV_SKINNY_FP8"
#: compile time: 1 gives weight-only NVFP4 ``quantized_linear``\ s the skinny variants ``choice`` makes for bf16 ones
#: where x fits whole and K slices are whole 256-column scale groups (``wb=0``); unset or 0: kernel.cu's (opt-in until
#: run on a GPU)
NVFP4_ENV = "INGOT_GEMV_SKINNY_NVFP4"
#: compile time: unset or 1 gives narrow matrices with long reductions the any-M variant for steps of 65 to
#: ``ANY_M_ROWS`` tokens (``any_m_spec``); 0: none (those steps run the launch's GEMM)
ANY_ENV = "INGOT_GEMV_SKINNY_ANY"
ANY_DEFAULT = True
#: the shortest reduction given the any-M variant (``any_m_spec``: measured faster than the GEMM at K = 8192, not at
#: 2048)
ANY_MIN_K = 8192
#: the any-M variant's max rows: the decode CUDA graphs' largest bucket (the attention's DECODE_MAX_ROWS); longer
#: steps are prefill chunks, where the weights are re-read once per 64 tokens and the GEMM gets enough row tiles
ANY_M_ROWS = 256
#: compile time: at most this many weight stages in the rule's variants (default: as many as fit, ``max_stages``);
#: fewer stages leave shared memory for the previous kernel's CTAs, so programmatic dependent launch can start this
#: one's weight stream beside them (an experiment for bucket 8: docs/PERF.md, "The skinny wgmma GEMM")
STAGES_ENV = "INGOT_GEMV_SKINNY_STAGES"
#: buckets whose variant on a wide matrix is the persistent kernel by default (``all`` / ``force``: ``RULE_BUCKETS``)
DEFAULT_BUCKETS = (16, 32, 64)
RULE_BUCKETS = (8, 16, 32, 64)
#: row tiles (64 x warpgroups rows) per SM from which a matrix is wide enough: the 1B model's gate_up has 0.97 (128
#: tiles on 132 SMs) and gains, its qkv 0.18 and loses
WIDE_TILES = 0.9
#: fewest weight stages taken (bench_skinny.py on the H200: 4 stages 2-6% slower than the 6-8 that fit at K = 2048)
MIN_STAGES = 4
#: weight stages of bucket 8's skinny variant with ``split8``: fewer leave shared memory for the previous kernel's
#: CTAs, so programmatic dependent launch overlaps more (batch 8: 4 stages +3.0%, 6-8 stages +1.4%; docs/PERF.md)
SPLIT8_STAGES = 4
#: with ``split8``, the most tokens kernel.cu's bucket-8 variant keeps (measured with 1: batch 2 -10%, batch 4 -1% on
#: the skinny kernel; with 4: batch 1 and 4 unchanged, 6 and 8 +2.5-3%)
SPLIT8_ROWS = 4
#: the kernel's weight formats by ``WB``: entry-name part and doc
WB_NAMES = {2: "bf16", 1: "fp8w", 0: "nvfp4w"}
WB_DOCS = {2: "", 1: ", e4m3 weights", 0: ", NVFP4 weights"}


def smem_bytes(k: int, mb: int, warpgroups: int = 2, stages: int = 4, splitk: int = 1, x_stream: bool = False,
               wb: int = 2) -> int:
    """x (mb x k / splitk bf16; with ``x_stream`` a ring of ``stages`` 64-column panels), the weight stages (64 x
    warpgroups rows x ``stage_row_bytes(wb)`` each), their full / empty mbarriers, the rms_norm prologue's sums
    (f32 per token and consumer warp, then per token; reserved either way), with split-K the f32 partial tile
    (16-byte aligned), and 1 KB to align the swizzled panels."""
    part = (15 + 64 * warpgroups * mb * 4) if splitk > 1 else 0
    x = stages * mb * 128 if x_stream else mb * (k // splitk) * 2
    w = stages * 64 * warpgroups * stage_row_bytes(wb)
    return 1024 + x + w + 16 * stages + mb * (4 * warpgroups + 1) * 4 + part


def stage_row_bytes(wb: int = 2) -> int:
    """Bytes of a weight row in a stage (64 columns): 128 bf16, 64 e4m3 codes, 32 NVFP4 (``wb`` 0) bytes."""
    return 32 if wb == 0 else 64 * wb


def stage_limit(wb: int = 2) -> int:
    """The most weight stages a variant takes: 8 of bf16 (16 KB each at 128 rows), 16 of e4m3 codes (8 KB each),
    32 of NVFP4 codes (4 KB each): the same bytes in flight."""
    return {2: 8, 1: 16, 0: 32}[wb]


def max_stages(k: int, mb: int, target: Target, warpgroups: int = 2, splitk: int = 1, x_stream: bool = False,
               wb: int = 2) -> int:
    """The most weight stages (up to ``stage_limit``) that fit beside x in a CTA's shared memory on ``target``: more
    bytes in flight per SM."""
    return max((s for s in range(2, stage_limit(wb) + 1)
                if smem_bytes(k, mb, warpgroups, s, splitk, x_stream, wb) <= target.smem_per_block), default=0)


def supported(n: int, k: int, mb: int, target: Target, warpgroups: int = 2, stages: int = 4, splitk: int = 1,
              x_stream: bool = False, wb: int = 2) -> bool:
    """sm_90a, K slices (K / splitk) a multiple of 64, a bucket of ``BUCKETS``, a split of ``SPLITS``, x's slice (or
    ring) and the stages (2 .. ``stage_limit``) within shared memory; a streamed x takes at least 4 stages."""
    return (target.arch == "sm_90a" and target.wgmma and n > 0 and k > 0 and splitk in SPLITS
            and k % (64 * splitk) == 0 and mb in BUCKETS and warpgroups in (1, 2) and 2 <= stages <= stage_limit(wb)
            and (not x_stream or stages >= 4) and (wb != 0 or (not x_stream and k % (256 * splitk) == 0))
            and smem_bytes(k, mb, warpgroups, stages, splitk, x_stream, wb) <= target.smem_per_block)


def skinny_spec(n: int, k: int, mb: int, target: Target, warpgroups: int = 2, stages: int | None = None,
                prologue: Prologue | None = None, splitk: int = 1, bias: bool = False,
                residual: bool = False, x_stream: bool = False, wb: int = 2, any_m: bool = False) -> KernelSpec:
    """The launch for ``out[M, n] = x[M, k] @ w[n, k]^T`` with ``M <= mb``: one persistent CTA per SM (at most one
    per row tile of ``64 x warpgroups`` rows), ``128 x (warpgroups + 1)`` threads; ``stages`` by default as many as
    fit (``max_stages``). ``prologue``: ``rms_norm`` (x is the norm's input, an extra ``norm_weight`` parameter, as
    ``rule.fused_spec``'s) or none. ``splitk`` > 1: clusters of ``splitk`` CTAs, one a K slice, one row tile a
    cluster (a grid of tiles x splitk; the template's header; no prologue). ``bias`` (``[n]``) and ``residual``
    (``[M, n]``): added in the epilogue. ``x_stream``: x's 64-column panels streamed through a ring beside the
    weight stages (read once per row tile, from L2) instead of staged whole: 64 tokens without split-K (no
    prologue). ``wb=1``: a weight-only FP8 ``quantized_linear`` (e4m3 ``w[n, k]``, f32 ``weight_scale[n]``; its
    inputs by name, ``rule.QUANT_PARAMS``), ``wb=0`` a weight-only NVFP4 one (e2m1 codes ``u8[n, k / 2]``, e4m3 block
    scales, the global scale; x staged whole, K slices of whole 256 columns): the codes turned into f16 A fragments in
    registers, x staged in f16 in their order (no prologue; the template's header). ``any_m``: any M, in chunks of
    ``mb`` tokens on grid.z (``ceil(M / mb)``), each chunk this variant on its rows (no prologue)."""
    pro = prologue or Prologue()
    if any_m and pro.kind != "none":
        raise ValueError("skinny wgmma GEMM: the any-M launch takes no prologue")
    if wb not in (0, 1, 2) or (wb != 2 and pro.kind != "none"):
        raise ValueError(f"skinny wgmma GEMM: wb must be 2 (bf16 weights), 1 (e4m3) or 0 (NVFP4; those two without a "
                         f"prologue), got {wb} with a {pro.kind} prologue")
    if pro.kind not in ("none", "rms_norm"):
        raise ValueError(f"skinny wgmma GEMM: no {pro.kind} prologue (rms_norm only)")
    if pro.kind != "none" and (splitk > 1 or x_stream):
        raise ValueError("skinny wgmma GEMM: the rms_norm prologue needs all of K in one CTA (no split-K, x staged)")
    stages = stages or max_stages(k, mb, target, warpgroups, splitk, x_stream, wb)
    if not supported(n, k, mb, target, warpgroups, stages, splitk, x_stream, wb):
        raise ValueError(f"skinny wgmma GEMM does not take N={n} K={k} for {mb} tokens with {warpgroups} warpgroups, "
                         f"{stages} stages and split-K {splitk} on {target.name} (sm_90a, K / split-K a multiple of "
                         f"64, buckets {BUCKETS}, splits {SPLITS}, shared memory "
                         f"{smem_bytes(k, mb, warpgroups, stages, splitk, x_stream, wb)} of {target.smem_per_block} "
                         f"bytes{', x streamed: at least 4 stages' if x_stream else ''}"
                         f"{'; NVFP4: x staged whole, K slices a multiple of 256' if wb == 0 else ''})")
    rows = 64 * warpgroups
    tiles = -(-n // rows)
    norm = pro.kind == "rms_norm"
    values = {"N": n, "K": k, "MB": mb, "WGS": warpgroups, "STAGES": stages, "W_TMA": True,
              "PROLOGUE": PROLOGUES[pro.kind], "EPS": float(pro.eps), "SPLITK": splitk, "HAS_BIAS": bias,
              "HAS_RESIDUAL": residual, "XS": x_stream, "WB": wb, "CHUNKS": any_m}
    grid = ([GridDim(const=tiles), GridDim(const=splitk)] if splitk > 1
            else [GridDim(const=min(tiles, target.num_sms)), GridDim(const=1)])
    if any_m:
        grid.append(GridDim("M", mb))
    return KernelSpec.make("gemv", "skinny.cu",
                           f"skinny_{WB_NAMES[wb]}_n{n}_k{k}_m{mb}_wg{warpgroups}_s{stages}"
                           + ("_rms_norm" if norm else "")
                           + (f"_sk{splitk}" if splitk > 1 else "") + ("_xs" if x_stream else "")
                           + ("_b" if bias else "") + ("_r" if residual else "") + ("_any" if any_m else ""),
                           target.arch or "", values,
                           QUANT_PARAMS if wb != 2 else PARAMS + [("norm_weight", "ptr")] if norm else PARAMS,
                           128 * (warpgroups + 1), grid,
                           smem=smem_bytes(k, mb, warpgroups, stages, splitk, x_stream, wb),
                           doc=f"skinny wgmma GEMM{WB_DOCS[wb]}, M <= {mb}, {rows}-row tiles "
                               f"by TMA, {stages} stages, "
                               + (f"split-K {splitk} in a cluster" if splitk > 1 else "persistent")
                               + (", x streamed" if x_stream else "") + (", rms_norm prologue" if norm else "")
                               + (", bias" if bias else "")
                               + (", residual" if residual else "")
                               + (f", any M in chunks of {mb}" if any_m else ""))


def fused_skinny_spec(plain: KernelSpec, prologue: Prologue, target: Target) -> KernelSpec:
    """``plain`` (this template's variant without a prologue) with ``prologue`` (``rms_norm``; ``ValueError``
    otherwise): the same N, K, bucket, warpgroups and stages (``rule.fused_spec`` for this template)."""
    v = dict(plain.values)
    if not is_skinny(plain) or v.get("PROLOGUE", 0):
        raise ValueError(f"skinny GEMM: {plain.entry} is not a skinny variant without a prologue")
    return skinny_spec(int(v["N"]), int(v["K"]), int(v["MB"]), target, int(v["WGS"]), int(v["STAGES"]), prologue,
                       int(v.get("SPLITK", 1)), bool(v.get("HAS_BIAS")), bool(v.get("HAS_RESIDUAL")), bool(v.get("XS")),
                       int(v.get("WB", 2)))


def mode() -> str:
    """``INGOT_GEMV_SKINNY``: ``split8`` (unset, 1 or ``split8``: buckets ``DEFAULT_BUCKETS`` on wide matrices, and
    bucket 8 of wide matrices split: kernel.cu's variant up to ``SPLIT8_ROWS`` tokens, this template's with
    ``SPLIT8_STAGES`` stages for the rest), ``on`` (``from16``: buckets ``DEFAULT_BUCKETS`` only), ``all`` (bucket 8
    whole too), ``force`` (every bucket, any N: for tests on small models) or ``off`` (0)."""
    return env_choice(ENV, {"": "split8", "1": "split8", "split8": "split8", "from16": "on", "0": "off", "all": "all",
                            "force": "force"}, "0, 1, split8, from16, all or force")


def split8() -> bool:
    """Whether bucket 8 of a wide matrix is split (the default; ``INGOT_GEMV_SKINNY=from16`` keeps all of it on
    kernel.cu): kernel.cu's variant for up to ``SPLIT8_ROWS`` tokens (its decode fusions; batches 1-4 unchanged), the
    skinny kernel with ``SPLIT8_STAGES`` stages for the rest of bucket 8 (``rule.variants`` puts a variant of max rows
    ``SPLIT8_ROWS`` before bucket 8's). Measured on the H200 (docs/PERF.md, twentieth session): batch 1 and 4
    unchanged, batch 6 +2.5%, batch 8 +2.5-3.0%; at 8 tokens gate_up 1.00x and lm_head 1.02x cuBLAS with 4 stages
    (1.06x / 1.03x with as many as fit; kernel.cu 0.92x / 0.97x). (With kernel.cu for one token only: batch 2 -10%;
    with the skinny kernel for all of bucket 8: batch 1 -4.9%.)"""
    return mode() == "split8"


def splitk_buckets() -> tuple[int, ...]:
    """``INGOT_GEMV_SKINNY_SPLITK``: the buckets whose narrow matrices take split-K (unset or 1:
    ``SPLITK_BUCKETS``, 0: none, else ``BUCKETS`` separated by commas or ``+``; another value: ``ValueError``)."""
    raw = os.environ.get(SPLITK_ENV, "").strip()
    if raw in ("", "1"):
        return SPLITK_BUCKETS
    if raw == "0":
        return ()
    items = [i.strip() for i in raw.replace("+", ",").split(",")]
    if not all(i.isdigit() and int(i) in BUCKETS for i in items):
        raise ValueError(f"{SPLITK_ENV}={raw!r}: expected 0, 1 or buckets of {BUCKETS} separated by commas or +")
    return tuple(sorted({int(i) for i in items}))


def x_stream_on() -> bool:
    """``INGOT_GEMV_SKINNY_XS``: whether the rule streams x where it does not fit whole (unset or 1: yes; 0: no)."""
    return env_on(XS_ENV)


def fp8_on() -> bool:
    """``INGOT_GEMV_SKINNY_FP8``: whether weight-only FP8 linears take skinny variants (unset or 1; 0: no)."""
    return env_on(FP8_ENV)


def nvfp4_on() -> bool:
    """``INGOT_GEMV_SKINNY_NVFP4``: whether weight-only NVFP4 linears take skinny variants (1; unset or 0: no; slower
    than kernel.cu's on the H200, the module docstring)."""
    return env_choice(NVFP4_ENV, {"": False, "0": False, "1": True}, "0 or 1")


def choice(n: int, k: int, mb: int, target: Target) -> tuple[int, bool] | None:
    """(split-K width, x streamed) of this template's variant for the bf16 ``linear`` ``w[n, k]`` at ``M <= mb``
    (split-K 1: the persistent kernel), or None where the variant is another template's (``mode``,
    ``splitk_buckets``, ``x_stream_on``; the module docstring)."""
    m = mode()
    if m == "off":
        return None
    wide = -(-n // 128) >= WIDE_TILES * (target.num_sms or 132)
    xs = (False, True) if x_stream_on() else (False,)

    def fits(splitk: int, stream: bool) -> bool:
        return (max_stages(k, mb, target, splitk=splitk, x_stream=stream) >= MIN_STAGES
                and supported(n, k, mb, target, splitk=splitk, x_stream=stream))

    if (wide or m == "force") and mb in (RULE_BUCKETS if m in ("all", "force", "split8") else DEFAULT_BUCKETS):
        return next(((1, stream) for stream in xs if fits(1, stream)), None)
    if not wide and mb in splitk_buckets():
        return next(((NARROW_SPLITK, stream) for stream in xs if fits(NARROW_SPLITK, stream)), None)
    return None


def rule_spec(n: int, k: int, mb: int, target: Target, bias: bool = False, residual: bool = False,
              wb: int = 2) -> KernelSpec | None:
    """The rule's variant of this template for ``w[n, k]`` at ``M <= mb`` (``choice``, ``rule_stages``; ``wb``:
    ``skinny_spec``'s), or None where the variant is another template's (also e4m3 weights where ``choice`` splits K
    with x streamed: slower than kernel.cu's FP8 variant, the module docstring)."""
    chosen = choice(n, k, mb, target)
    if chosen is None or (wb == 1 and chosen[0] > 1 and chosen[1]):
        return None
    splitk, xs = chosen
    if not supported(n, k, mb, target, splitk=splitk, x_stream=xs, wb=wb):  # NVFP4: x whole, K slices of 256
        return None
    return skinny_spec(n, k, mb, target, stages=rule_stages(k, mb, target, splitk, xs), splitk=splitk, bias=bias,
                       residual=residual, x_stream=xs, wb=wb)


def any_m_spec(n: int, k: int, target: Target, bias: bool = False, residual: bool = False,
               wb: int = 2) -> KernelSpec | None:
    """The any-M variant for steps of more tokens than the buckets (up to ``ANY_M_ROWS``) where the matrix is narrow
    and its reduction long (K >= ``ANY_MIN_K``): the rule's split-K variant of the largest bucket (``rule_spec``)
    walking the tokens in chunks on grid.z, or None (wide matrices: their GEMM fills the SMs;
    ``INGOT_GEMV_SKINNY_ANY=0``; no split-K variant at that bucket). A narrow matrix has few row tiles: the 1B model's
    down (2048 x 8192) 16 of 128 rows at up to 256 tokens, so the bf16 CUTLASS GEMM runs 16 CTAs each over all of
    K = 8192 (79 us at 65-256 rows on the H200, 0.19-0.26x cuBLAS); 64-token chunks of the split-K variant ran it in
    34 / 37 / 56 us at 65 / 128 / 256 rows (2.3x / 2.1x / 1.4x). On qkv and o (K = 2048) the GEMM's CTAs are short:
    the chunks were 1.2-1.4x faster at 65 rows, even at 128, 0.5-0.7x at 256 (docs/PERF.md "Decode steps of 65-256
    rows"), so they keep the GEMM. Where the CUTLASS GEMM has its short-step configuration (64-row tiles,
    ``gemm_cutlass/rule.py`` ``SHORT_M_TIERS``: down 19-25 us at 65-256 rows), the lowering plans that instead and
    drops this variant (``codegen/lower.py``); it stays the way without CUTLASS."""
    if not any_m_on() or k < ANY_MIN_K:
        return None
    plain = rule_spec(n, k, BUCKETS[-1], target, bias, residual, wb)
    if plain is None or int(plain.value("SPLITK")) == 1:
        return None
    return skinny_spec(n, k, BUCKETS[-1], target, stages=int(plain.value("STAGES")), splitk=int(plain.value("SPLITK")),
                       bias=bias, residual=residual, x_stream=bool(plain.value("XS")), wb=wb, any_m=True)


def any_m_on() -> bool:
    """``INGOT_GEMV_SKINNY_ANY``: whether narrow long-K matrices get the any-M variant (``any_m_spec``; unset or 1:
    yes; 0: no, their steps of 65-256 rows go to the GEMM as before)."""
    return env_choice(ANY_ENV, {"": ANY_DEFAULT, "0": False, "1": True}, "0 or 1")


def rule_stages(k: int, mb: int, target: Target, splitk: int = 1, x_stream: bool = False, wb: int = 2) -> int:
    """The weight stages of the rule's variant: as many as fit (``max_stages``; bucket 8 with ``split8`` at most
    ``SPLIT8_STAGES``), at most ``INGOT_GEMV_SKINNY_STAGES`` (an integer 2..16; another value: ``ValueError`` naming
    the variable)."""
    fit = max_stages(k, mb, target, splitk=splitk, x_stream=x_stream, wb=wb)
    if mb == 8 and split8():
        fit = min(fit, SPLIT8_STAGES)
    raw = os.environ.get(STAGES_ENV, "").strip()
    if not raw:
        return fit
    if not raw.isdigit() or not 2 <= int(raw) <= 16:
        raise ValueError(f"{STAGES_ENV}={raw!r}: expected an integer from 2 to 16")
    return min(int(raw), fit)


def row_bytes(values: Any) -> int:
    """A weight row's bytes for the variant of these spec ``values`` (pairs or a mapping): ``K x WB`` (``K / 2``
    with NVFP4 codes, ``WB`` 0)."""
    v = dict(values)
    return int(v["K"]) // 64 * stage_row_bytes(int(v.get("WB", 2)))


def is_skinny(spec: KernelSpec) -> bool:
    """Whether ``spec`` is this template's (its module holds ``ingot_w_tma``)."""
    return spec.family == "gemv" and spec.template == "skinny.cu"


def weight_reads(launches: Iterable[Mapping[str, Any]],
                 specs: Mapping[str, Mapping[str, Any]]) -> Iterator[tuple[str, str, int]]:
    """(kernel entry, weight buffer, its row pitch in bytes: ``row_bytes``) for every skinny variant among ``launches``
    (the manifest's launch table) and the weight it is launched on; ``specs``: kernel entry -> its spec dict (the
    manifest's ``variant_kernels``' ``spec``). The memory plan aligns those weights (``weight_pitches``), the
    executor checks them before it fills each module's map (``runtime/cuda_backend.py``)."""
    for ln in launches:
        for v in ln.get("variants", ()):
            spec = specs.get(v["kernel"])
            if spec is not None and spec.get("template") == "skinny.cu":
                args = v.get("args") or ln["args"]
                yield v["kernel"], args["weight"]["buffer"], row_bytes(spec["values"])


def weight_pitches(launches: Iterable[Mapping[str, Any]], specs: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Weight buffer -> its row pitch in bytes for every weight a skinny variant among ``launches`` is launched on
    (``weight_reads``). Raises ``ValueError`` for a weight two pitches would have to divide."""
    out: dict[str, int] = {}
    for _, name, pitch in weight_reads(launches, specs):
        if out.setdefault(name, pitch) != pitch:
            raise ValueError(f"skinny GEMM: weight {name} read with row pitches {out[name]} and {pitch} bytes")
    return out
