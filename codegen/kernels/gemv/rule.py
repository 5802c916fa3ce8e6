"""Skinny GEMM / GEMV for ``linear`` in decode steps (M from 1 to 64 tokens): ``kernel.cu``.

``x[M, K] @ w[N, K]^T (+ bias[N]) (+ residual[M, N])`` with bf16 activations and weights, memory-bound:
each weight byte is read once per launch with 16-byte loads, x sits in shared memory, tensor cores
(``mma.sync``) do the products, split-K over CTAs fills the GPU when N is small (see the template's
header for the design). One template serves ``sm_90a`` and ``sm_100a`` (``mma.sync`` runs on both).

**How it is chosen.** The tensor-core GEMM (``codegen/kernels/gemm``) stays each ``linear`` node's
launch; this family adds *variants* of that launch, one per token bucket ``MB`` in ``BUCKETS``, each
correct for ``M <= MB`` (``variants``). ``codegen/lower.py`` compiles them and records them in the
launch's ``variants`` list (``{"kernel", "max_rows"}``); the executor (``runtime/cuda_backend.py``)
takes the first variant whose ``max_rows`` is at least the step's ``M`` (the launch's ``M`` argument,
the step's token count) and the GEMM otherwise. A decode step's CUDA graph is captured per batch bucket,
so each bucket's graph holds the variant for its size. A variant launched with ``M > MB`` traps. On sm_90a the
variants of buckets 16-64 are the wgmma skinny GEMM's instead (``skinny.cu``, ``skinny_rule.choice``): persistent
on wide matrices (the 1B model's gate_up and lm_head), split-K over a cluster on narrow ones (qkv, o, down), x
streamed where it does not fit whole (``INGOT_GEMV_SKINNY``, ``INGOT_GEMV_SKINNY_SPLITK``, ``INGOT_GEMV_SKINNY_XS``).

**Configuration** (``gemv_config``): per bucket, warps per CTA, 16-row tiles per warp and 32-column
steps per load stage from ``SHAPE_BY_BUCKET`` (``WIDE_N_SHAPE`` in bucket 16 when N alone gives 0.9 CTAs an SM
of it, ``LARGE_N_SHAPE`` when N alone gives 2 CTAs per SM of it; row groups, ``KW_SHAPE``, for small matrices in
bucket 8), picked from sweeps on the H200 (``bench/bench_gemv.py --sweep``, docs/PERF.md), and the fewest
split-K slices that give at least ``CTAS_PER_SM[bucket] x num_sms`` CTAs, with slices of at least 256
columns and the CTA's x slice in at most ``SMEM_BUDGET`` bytes of shared memory. At 32+ tokens the
split-K reduction costs more (its partials grow with M), so those buckets split less.

**Split-K in a cluster** (``GemvConfig.cluster``, the template's ``CLUSTER``; ``INGOT_GEMV_CLUSTER``, on by default):
the split-K slices of a row block run as one thread-block cluster (1 x SPLITK CTAs, 2 to ``CLUSTER_MAX``) and add
their partial tiles through distributed shared memory, in slice order (bit for bit the workspace reduction's),
instead of a global workspace, a fence, an atomic counter and the last CTA reading every slice's partials from L2.
The rule takes it where ``cluster_fits`` and the cluster's x slices take at most ``CLUSTER_SMEM`` together (8 CTAs of
67 KB and more measured slower: a cluster's CTAs are placed in one GPC at once); with it the row groups go (but for
NVFP4 weights) and the small matrices at 32 tokens take ``CLUSTER_SHAPE`` (bf16) or ``CLUSTER_SHAPE_NVFP4``.
Measured on the H200 (docs/PERF.md, "Split-K in a cluster"): the 1B model's qkv at M = 1 5.59 -> 4.82 us (62% of 4.19
TB/s), the BF16 batch-1 step 2.7% shorter, batch 64 11-15% faster. ``INGOT_GEMV_CLUSTER=0`` gives the workspace and
the row groups as before; ``INGOT_GEMV_CLUSTER_SHAPE=0`` keeps the clusters but not the two shapes (A/B runs).
NVFP4 weights in bucket 8 without row groups (gate_up, down, the lm_head) take ``NVFP4_SHAPE`` (8 warps, split-K
through the workspace; ``INGOT_GEMV_NVFP4_SHAPE=0`` for the bucket's own shape); those with row groups (qkv, o)
split bucket 8 (``nvfp4_split8_config``, ``quant_rule``'s weight-only variants): the row groups up to 4 tokens,
``NVFP4_SPLIT8_SHAPE`` in a cluster for 5-8 (``INGOT_GEMV_NVFP4_SPLIT8=0`` keeps bucket 8 whole). FP8 weights in
bucket 8 without row groups take ``FP8_SHAPE`` (8 warps; ``INGOT_GEMV_FP8_SHAPE=0`` for the bucket's own shape).

**Prologues** (``Prologue``, ``fused_spec``): a variant may compute its x from the output's producer's input while
staging it (the template's ``PROLOGUE``): ``rms_norm`` (x is the norm's input; an extra ``norm_weight`` parameter;
the CTA stages ``x * norm_weight`` and sums ``x^2`` over its K slice, the epilogue scales the accumulators by each
token's ``1 / rms``) or packed ``swiglu`` (x is the ``[M, 2K]`` gate_up buffer). Not bit-identical to the norm /
activation kernel followed by the plain variant (the norm factor is applied to the f32 sums instead of inside the
bf16 x; the sigmoid uses ``ex2.approx`` / ``rcp.approx``): both match the numpy reference within the GEMV's
tolerance. ``codegen/decode_fusion.py`` pairs them in the lowering and skips the producer's launch for those steps;
a fused variant keeps the configuration of the plain variant it replaces (tuned or not), and autotuning never sees
it (``tune.py``).

**Rope epilogue** (``RopeEpilogue``, ``with_rope``; ``rope_epilogue.cuh``, shared with ``quant.cu``): the qkv
projection's decode variant rotates q and k and writes q and the paged KV cache as ``rope/qkv_cache.cu`` does, bit
for bit, instead of storing the qkv row; its tiles stream each rotating pair's two weight rows side by side. Extra
parameters ``ROPE_PARAMS``; ``codegen/qkv_rope_fusion.py`` binds them and skips the rope launch in decode steps.

**Weights before the grid-dependency wait** (``weights_first``): ptxas moves ``ld.global.nc`` across the PDL wait,
so with them a variant waits first and only then loads weights (its SASS: ``ACQBULK`` at the top).
``weights_first`` loads the first weight stage, and reads what the previous kernel wrote, with coherent loads, which
ptxas keeps on their side of the wait (the template's header). On by default for every variant since the fourteenth
session (plain ones too: the 1B model's batch-1 step 1.0-1.3% shorter with BF16 weights, 1.9-2.7% with FP8 ones,
batch 64 no slower; docs/PERF.md, "NVFP4 weights on kernel.cu, and plain GEMVs weights first");
``INGOT_GEMV_WEIGHTS_FIRST=fused`` keeps it to
the fused variants as before. ``bench/bench_decode_fusion.py`` times both ways.

**Bulk copies** (opt-in, ``INGOT_GEMV_BULK=1``: buckets up to 8; ``bulk.cu``, ``bulk_rule.py``): variants whose
weights go to shared memory by ``cp.async.bulk``, the CTA's whole ring issued before the grid-dependency wait; a bulk
variant's fused variants are bulk ones too (``fused_spec``), with the same prologues. Measured: docs/PERF.md,
"Bulk-copy GEMV".

**FP8 weights** (``wb=1``, the template's ``WB``): a weight-only FP8 ``quantized_linear`` (e4m3 ``w[n, k]``, f32
``weight_scale[n]``, bf16 x) on this template, its params the op's inputs by name (``QUANT_PARAMS``, as ``quant.cu``'s).
A lane's 16-byte load covers 16 columns, so a step is 64 columns (``WB_STEP_COLS``), the same 64 bytes of a row as a
bf16 step; the codes become 16-bit fragments in registers (exact), the scale multiplies the f32 sums in the epilogue.
In the buckets of ``F16_BUCKETS`` (the template's ``F16``) the fragments are f16, by the hardware's e4m3 -> f16
conversion, with f16 MMAs and x staged in f16 times 2^-4 (exact for 2^-13 <= |x| < ~1e6, the template's header);
elsewhere bf16, by bit operations. The configuration is the bf16 rule's with steps and the smallest slice in bytes
(``gemv_config(..., wb=1)``), and the prologues, the rope epilogue and the row groups are the bf16 variant's.
``quant_rule.quant_variants`` gives these for the decode buckets with ``INGOT_GEMV_FP8=kernel``
(``quant_rule.fp8_template``).

**NVFP4 weights** (``wb=WB_NVFP4``, 0: half a byte a weight): a weight-only NVFP4 ``quantized_linear`` (e2m1 codes
``u8[n, k / 2]``, an e4m3 scale per 16 columns ``u8[n, k / 16]`` in the linear layout, the f32 global scale
``weight_scale_2[1]``, bf16 x) on this template, params ``QUANT_PARAMS``. A lane's 16-byte load covers 32 columns
(two scale blocks, whose two scale bytes it loads beside), so a step is 128 columns, 64 bytes of a row again; the
codes' f16s (their values times 2^-14, exact) are made four high bytes at a time by shifts and masks and spread into
f16 halves by PRMT, then one multiply by the block's scale (exact); f16 MMAs, x staged in f16 times 2^-4 as the FP8
f16 route's and in the fragments' order; the epilogue multiplies by 2^18 and the global scale. Same configurations
(in bytes a row; row groups take ``KW_SHAPE_NVFP4``), prologues, rope epilogue and row groups.
``quant_rule.quant_variants`` gives these for the decode buckets with ``INGOT_GEMV_NVFP4=kernel`` (the default;
``quant_rule.nvfp4_template``).

**Quantized weights** (``quant.cu``, ``quant_rule.py``): ``quantized_linear`` with FP8 (per-channel) or NVFP4
weights, bf16 or per-token FP8 activations, through the same two entry points (``variants`` per bucket, ``plan``
for any M). ``codegen/registry.py`` lists this family in ``FAMILY_NAMES`` after ``gemm`` (so ``plan`` gives a
``quantized_linear`` node its any-M launch; a bf16 ``linear`` keeps the GEMM) and in ``VARIANT_FAMILY_NAMES``;
``codegen/lower.py`` binds ``quantized_linear``'s arguments by the op's input names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from ....ir.op import Op
from ....ir.types import DType, TensorType
from ...family import Family, static_dim
from ...kernel import GridDim, KernelSpec
from ...switches import env_choice, env_on
from ...target import Target

PARAMS = [("x", "ptr"), ("weight", "ptr"), ("weight_scale", "ptr"), ("bias", "ptr"), ("residual", "ptr"),
          ("out", "ptr"), ("M", "i64")]
#: a ``quantized_linear``'s parameters (its inputs by name): ``quant.cu``'s (``quant_rule.PARAMS``) and this
#: template's FP8-weight variants' (``WB`` 1)
QUANT_PARAMS = [("x", "ptr"), ("weight", "ptr"), ("weight_scale", "ptr"), ("weight_scale_2", "ptr"),
                ("input_scale", "ptr"), ("bias", "ptr"), ("residual", "ptr"), ("out", "ptr"), ("M", "i64")]
#: bytes a weight -> columns a load step covers (16 bytes a lane, 4 lanes a row: 64 bytes of each row; quant.cu's
#: steps by weight format: ``quant_rule.STEP_COLS``)
WB_STEP_COLS = {2: 32, 1: 64, 0: 128}
#: ``wb`` of NVFP4 weights (half a byte a weight, with block scales: the module docstring)
WB_NVFP4 = 0
#: ``wb`` -> the weights' name in kernel names and docs
WB_NAMES = {2: "bf16", 1: "fp8", 0: "nvfp4"}
#: FP8-weight buckets whose e4m3 codes become f16 fragments (``cvt``, 4 instructions a 16-byte load) instead of bf16
#: ones (bit operations, ~20): measured on the H200 (docs/PERF.md, "FP8 weights as f16"), the 1B model's batch-1
#: GEMVs 2-11% faster and its FP8 batch-1 step 10% shorter; batch 64 (bucket 64) 6% slower with f16, so not there
F16_BUCKETS = (8,)
#: token buckets: one variant per bucket, each correct for M <= bucket
BUCKETS = (8, 16, 32, 64)
#: shared memory a CTA's x slice may take (bytes); above 48 KB the launcher raises the function's limit
SMEM_BUDGET = 140 * 1024
#: the template's static shared memory, at most (the rms_norm prologue's sums of squares, the split-K flag)
STATIC_SMEM = 1024 + 16
MIN_SLICE = 256
#: token bucket -> (warps per CTA, 16-row tiles per warp, steps per load stage: 32 columns, 64 with FP8 weights)
SHAPE_BY_BUCKET = {8: (4, 1, 8), 16: (4, 1, 8), 32: (8, 1, 4), 64: (8, 1, 4)}
#: the shape when N alone gives at least 2 CTAs per SM with it (no split-K): the lm_head at 32 tokens
LARGE_N_SHAPE = {32: (8, 2, 2)}
#: bf16 only: the shape of bucket 16 when N alone gives it ``WIDE_N_CTAS_PER_SM`` CTAs an SM (the 1B model's gate_up
#: and lm_head), without split-K. Swept on the H200 at M = 16 (docs/PERF.md, "Row groups in the decode GEMV"):
#: gate_up 0.83x cuBLAS, lm_head 0.92x, where bucket 16's own shape with split-K gave 0.68x and 0.76x
WIDE_N_SHAPE = {16: (8, 1, 4)}
WIDE_N_CTAS_PER_SM = 0.9
#: split K until the grid has this many CTAs per SM
CTAS_PER_SM = {8: 1.5, 16: 1.5, 32: 0.9, 64: 0.9}
#: buckets where too few row blocks for ``CTAS_PER_SM`` first split K inside the CTA (``kwarps``: warps share rows,
#: each a part of the K slice, their partials added through shared memory), aiming at ``KW_CTAS_PER_SM``, before
#: any split over CTAs (whose tail, a fence, an atomic and a second pass over the partials, every launch waits for).
#: Row groups take ``KW_SHAPE`` (warps, tiles, steps a stage) and apply only where x's whole-K slice fits in
#: ``KW_MAX_X`` bytes (a longer one leaves one CTA an SM: the 1B model's down, K = 8192, ran slower with them).
#: Measured on the H200 (docs/PERF.md, "Row groups in the decode GEMV"): 16-row CTAs without split-K for qkv and o at
#: M <= 8; alone, 8 warps x 4 steps were the fastest (1.09-1.39x cuBLAS), but end to end 4 warps x 8 steps made
#: the shorter batch-1 step (0.989 vs 1.001 ms GPU, no row groups 1.015: medians of 3 alternating runs each). Not
#: bucket 16: qkv at M = 16 ran 9.65 us with row groups, 9.07 without.
KW_BUCKETS = (8,)
KW_CTAS_PER_SM = 0.9
KW_SHAPE = (4, 1, 8)
#: the row groups' shape with NVFP4 weights (``wb`` 0: 128-column steps, so KW_SHAPE's 1024-column stage lets K = 2048
#: split over 2 warps only): 8 warps, 4 steps a stage, 4 warps a row group for the 1B model's qkv and o. Probed on the
#: H200 (docs/PERF.md, "NVFP4 weights on kernel.cu, and plain GEMVs weights first"): qkv at M = 1 3.67 us against
#: KW_SHAPE's 4.02, o 3.24 against 3.46, at M = 8 as fast (5.83 / 5.18 against 5.85 / 5.20)
KW_SHAPE_NVFP4 = (8, 1, 4)
KW_MAX_X = 72 * 1024
#: ``INGOT_GEMV_KW=0`` at compile time: no row groups (every warp its own rows, as before they existed)
KW_ENV = "INGOT_GEMV_KW"


#: compile time: split-K over thread-block clusters in ``kernel.cu`` (``cluster_mode``)
CLUSTER_ENV = "INGOT_GEMV_CLUSTER"
#: the most slices a cluster takes (a portable cluster size)
CLUSTER_MAX = 8
#: the rule reduces in a cluster only where its CTAs' x slices take at most this much shared memory together: a
#: cluster's CTAs are placed in one GPC at once. Measured on the H200 (docs/PERF.md, "Split-K in a cluster"): 8 CTAs of
#: 67 KB and 135 KB (the 1B model's down at 32 / 64 tokens) ran slower than the workspace's reduction, clusters of
#: 264-288 KB (8 x 33-36 KB; 2 x 135 KB: gate_up and the lm_head at 64 tokens) faster
CLUSTER_SMEM = 384 * 1024
#: bf16 weights: bucket -> (warps, tiles, steps a stage, CTAs an SM split-K aims at) of the matrices that split K in
#: a cluster there, where the bucket's own shape would split too (the 1B model's qkv and o at 32 tokens: 8 slices of
#: 64-row CTAs instead of 128-row ones). Swept on the H200 (docs/PERF.md, "Split-K in a cluster"): qkv at M = 32
#: 8.90 -> 7.75 us (0.75x -> 0.86x cuBLAS), o 7.19 -> 6.26 (0.88x -> 1.01x); down, whose clusters the rule does not
#: take at 32 (CLUSTER_SMEM), was slower with the shape alone (22.1 against 17.1 us): it applies where a cluster results
CLUSTER_SHAPE = {32: (4, 1, 8, 1.5)}
#: NVFP4 weights: the same, with splits of whole stages down to one stage (256 columns with 2 steps of 128), not
#: ``MIN_SLICE``'s 1024 NVFP4 columns (the e2m1 conversion, not the bytes, bounds these GEMVs: more CTAs convert). Swept
#: on the H200 (``bench_gemv_quant.py --kernel --sweep-kernel``, docs/PERF.md twenty-first session), against the
#: bucket's own shape: at 32 tokens qkv 9.72 -> 7.02 us (8 warps, 2 steps, 4 slices in a cluster; 0.66x -> 0.91x
#: cuBLAS bf16), o 9.52 -> 6.48 (8 slices; 0.66x -> 1.00x); at 16 tokens qkv 6.77 -> 4.85, o 6.07 -> 4.74 (8 slices
#: each); at 64 qkv 14.92 -> 10.42, o 15.09 -> 10.10. Fewer CTAs an SM at 32: qkv in 8 slices took 8.02 us there
CLUSTER_SHAPE_NVFP4 = {16: (8, 1, 2, 0.9), 32: (8, 1, 2, 0.7), 64: (8, 1, 2, 0.9)}
#: compile time: ``0`` leaves ``CLUSTER_SHAPE`` / ``CLUSTER_SHAPE_NVFP4`` out of the rule (the bucket's own shape, still
#: reduced in a cluster where it splits); unset or ``1``: they apply
CLUSTER_SHAPE_ENV = "INGOT_GEMV_CLUSTER_SHAPE"


#: NVFP4 weights, buckets -> (warps, tiles, CTAs an SM split-K aims at) of the matrices without row groups (the 1B
#: model's gate_up, down and lm_head; qkv and o keep ``KW_SHAPE_NVFP4``'s row groups, the fastest at one token). Split K
#: (slices of at least ``NVFP4_SHAPE_MIN_STEPS`` steps) until the grid has the CTAs, 8 steps a stage where it has at
#: most one CTA an SM (the weight bytes in flight), else 4 (the registers of many CTAs an SM); split-K through the
#: workspace. Swept on the H200 (``bench_gemv_quant.py --kernel --sweep-kernel --m 1 8``, docs/PERF.md twenty-second
#: session), us at M = 1 / 8 against the bucket's own shape: lm_head 51.8 / 60.2 -> 43.8 / 48.9 (68% -> 81% of 4.19
#: TB/s at M = 1), gate_up 9.75 / 11.8 -> 8.93 / 10.3, down 6.97 / 7.89 -> 6.30 / 6.84 (8 slices in a cluster: 7.13 /
#: 7.78)
NVFP4_SHAPE = {8: (8, 1, 0.9)}
NVFP4_SHAPE_MIN_STEPS = 4
#: compile time: ``0`` leaves ``NVFP4_SHAPE`` out of the rule (the bucket's own shape); unset or ``1``: it applies
NVFP4_SHAPE_ENV = "INGOT_GEMV_NVFP4_SHAPE"


#: NVFP4 weights with row groups in bucket 8 (the 1B model's qkv and o): bucket 8 splits, the row groups up to
#: ``NVFP4_SPLIT8_ROWS`` tokens (the fastest at one token) and this cluster shape (warps, tiles, steps a stage, CTAs an
#: SM split-K aims at: 4 slices for qkv and o) for the rest. Swept on the H200 (docs/PERF.md twenty-second session),
#: us at M = 1 / 8: qkv row groups 3.82 / 5.79, this shape 3.94 / 4.32; o 3.40 / 5.23 against 3.70 / 4.01. End to end
#: (twenty-third session): NVFP4 decode at batch 5 / 6 / 8 +4.0-4.2%, batch 1 unchanged
NVFP4_SPLIT8_SHAPE = (8, 1, 4, 0.7)
NVFP4_SPLIT8_ROWS = 4
#: compile time: ``0`` keeps bucket 8 whole (row groups up to 8 tokens); unset or ``1``: it splits
NVFP4_SPLIT8_ENV = "INGOT_GEMV_NVFP4_SPLIT8"


#: FP8 weights, buckets -> (warps, tiles, CTAs an SM split-K aims at) of the matrices without row groups (all of the
#: 1B model's with the cluster on): 8 warps, 8 steps a stage where the grid has at most one row block an SM (else 4),
#: K split until the CTAs (in a cluster where ``cluster_fits`` and ``CLUSTER_SMEM`` allow, as the bucket's own shape).
#: Swept on the H200 (``bench_gemv_quant.py --kernel --sweep-kernel --formats fp8-w8a16 --m 1 8``, docs/PERF.md
#: twenty-third session), us at M = 1 / 8 against the bucket's own shape (4 warps): qkv 4.35 / 4.63 -> 4.22 / 4.57, o
#: 3.77 / 4.13 -> 3.68 / 3.96, gate_up 11.23 / 13.44 -> 11.02 / 11.87, down 7.96 / 8.37 -> 7.84 / 7.86, lm_head
#: 65.84 / 77.28 -> 62.75 / 66.35. End to end the fused variants gain more: FP8 decode +5.9% at batch 1, +18.7% at 8
FP8_SHAPE = {8: (8, 1, 0.7)}
#: compile time: ``0`` leaves ``FP8_SHAPE`` out of the rule (the bucket's own shape); unset or ``1``: it applies
FP8_SHAPE_ENV = "INGOT_GEMV_FP8_SHAPE"


def fp8_shape_on() -> bool:
    """``INGOT_GEMV_FP8_SHAPE``: ``FP8_SHAPE`` in the rule (unset, empty or ``1``) or not (``0``)."""
    return env_on(FP8_SHAPE_ENV)


def _fp8_shaped(n: int, k: int, mb: int, num_sms: int) -> GemvConfig:
    """``FP8_SHAPE``'s configuration of ``w[n, k]`` (FP8 weights) for bucket ``mb``."""
    warps, tiles, per_sm = FP8_SHAPE[mb]
    steps = 8 if -(-n // (16 * warps * tiles)) <= num_sms else 4
    return gemv_config(n, k, mb, num_sms, warps=warps, tiles=tiles, stage_steps=steps, kwarps=1, wb=1,
                       ctas_per_sm=per_sm)


def nvfp4_shape_on() -> bool:
    """``INGOT_GEMV_NVFP4_SHAPE``: ``NVFP4_SHAPE`` in the rule (unset, empty or ``1``) or not (``0``)."""
    return env_on(NVFP4_SHAPE_ENV)


def _splits_for(blocks: int, k: int, per_sm: float, num_sms: int, min_slice: int) -> int:
    """Split-K of ``blocks`` row blocks: doubled while the grid is short of ``per_sm`` CTAs an SM, a slice keeps at
    least ``min_slice`` columns and a cluster could take the slices (``CLUSTER_MAX``)."""
    sk = 1
    while blocks * sk < per_sm * num_sms and k >= 2 * sk * min_slice and 2 * sk <= CLUSTER_MAX:
        sk *= 2
    return sk


def _nvfp4_shaped(n: int, k: int, mb: int, num_sms: int) -> GemvConfig:
    """``NVFP4_SHAPE``'s configuration of ``w[n, k]`` (NVFP4) for bucket ``mb``."""
    warps, tiles, per_sm = NVFP4_SHAPE[mb]
    cw = WB_STEP_COLS[WB_NVFP4]
    blocks = -(-n // (16 * warps * tiles))
    sk = _splits_for(blocks, k, per_sm, num_sms, cw * NVFP4_SHAPE_MIN_STEPS)
    steps = 8 if blocks * sk <= num_sms else 4
    while steps > 1 and steps * cw * sk > k:  # no longer than a slice
        steps //= 2
    return gemv_config(n, k, mb, num_sms, warps=warps, tiles=tiles, stage_steps=steps, splitk=sk, kwarps=1,
                       wb=WB_NVFP4, cluster=False)


def _cluster_shaped(n: int, k: int, mb: int, num_sms: int, shape: tuple[int, int, int, float],
                    wb: int) -> GemvConfig | None:
    """``w[n, k]``'s configuration for bucket ``mb`` with ``shape`` (warps, tiles, steps a stage, CTAs an SM) split
    in a cluster (NVFP4 weights: slices down to one stage, ``_splits_for``), or None where no cluster results (NVFP4:
    a matrix not narrow enough to split for the CTAs, not for x's shared memory alone)."""
    sw, st, su, sper = shape
    sk = None
    if wb == WB_NVFP4:
        sk = _splits_for(-(-n // (16 * sw * st)), k, sper, num_sms, WB_STEP_COLS[wb] * su)
        if sk == 1:
            return None
    shaped = gemv_config(n, k, mb, num_sms, warps=sw, tiles=st, stage_steps=su, splitk=sk, kwarps=1, wb=wb,
                         ctas_per_sm=sper)
    return shaped if shaped.cluster else None


def nvfp4_split8_config(n: int, k: int, num_sms: int) -> GemvConfig | None:
    """The configuration of ``w[n, k]`` (NVFP4 weights) for ``NVFP4_SPLIT8_ROWS`` + 1 to 8 tokens where bucket 8
    splits (``NVFP4_SPLIT8_SHAPE`` in a cluster), or None where it does not: ``INGOT_GEMV_NVFP4_SPLIT8=0``, row groups
    not the bucket's configuration (gate_up, down and the lm_head take ``NVFP4_SHAPE`` whole) or no cluster."""
    if not env_on(NVFP4_SPLIT8_ENV) or gemv_config(n, k, 8, num_sms, wb=WB_NVFP4).kwarps == 1:
        return None
    return _cluster_shaped(n, k, 8, num_sms, NVFP4_SPLIT8_SHAPE, WB_NVFP4)


def cluster_shapes(wb: int) -> dict[int, tuple[int, int, int, float]]:
    """The bucket -> (warps, tiles, steps a stage, CTAs an SM) table of ``wb``'s weights (``CLUSTER_SHAPE`` for bf16,
    ``CLUSTER_SHAPE_NVFP4``, none for FP8), empty with ``INGOT_GEMV_CLUSTER_SHAPE=0``."""
    if not env_on(CLUSTER_SHAPE_ENV):
        return {}
    return {2: CLUSTER_SHAPE, WB_NVFP4: CLUSTER_SHAPE_NVFP4}.get(wb, {})


def cluster_mode() -> bool:
    """``INGOT_GEMV_CLUSTER``: unset, empty or ``1`` (the default): the split-K slices of a row block as one
    thread-block cluster, reduced through distributed shared memory (kernel.cu's header), where ``cluster_fits`` and
    the cluster's shared memory is within ``CLUSTER_SMEM``, and no row groups but with NVFP4 weights (the cluster's
    reduction replaces them); ``0``: the workspace and the row block's last CTA, and row groups, as before; another
    value is an error."""
    return env_on(CLUSTER_ENV)


def cluster_fits(mb: int, cfg: GemvConfig, wb: int = 2) -> bool:
    """``cfg`` can reduce its split-K slices in a cluster: 2 to ``CLUSTER_MAX`` slices, and the CTA's partial tile
    (f32, ``rows x mb``) fits x's shared-memory region, where it is stored."""
    return 1 < cfg.splitk <= CLUSTER_MAX and cfg.rows * mb * 4 <= smem_bytes(mb, cfg.slice_k, wb=wb)


def kw_mode() -> str:
    """``INGOT_GEMV_KW``: ``on`` (unset or 1: the rule's row groups in ``kernel.cu`` variants, bf16, FP8 or NVFP4
    weights), ``all`` (also in ``quant.cu``'s FP8 / NVFP4 variants: their GPU tests pass, no faster end to end) or
    ``off`` (0: none); another value is an error."""
    return env_choice(KW_ENV, {"": "on", "1": "on", "all": "all", "0": "off"}, "0, 1 or all")


def kw_enabled() -> bool:
    """Row groups in ``kernel.cu`` variants, bf16, FP8 or NVFP4 weights (``kw_mode``: on or all)."""
    return kw_mode() != "off"


def kw_quant_enabled() -> bool:
    """Row groups in ``quant.cu`` variants: ``INGOT_GEMV_KW=all`` only, until they have run on a GPU."""
    return kw_mode() == "all"


@dataclass(frozen=True)
class GemvConfig:
    warps: int = 4
    tiles: int = 1  # MT: 16-row tiles per warp
    splitk: int = 1
    stage_steps: int = 4  # U: steps per load stage (32 columns, 64 with FP8 weights)
    slice_k: int = 0  # KS (0: derived from splitk)
    kwarps: int = 1  # KW: warps of a row group, splitting the CTA's K slice among them (1: a warp its own rows)
    cluster: bool = False  # CLUSTER: the split-K slices of a row block are one thread-block cluster (DSMEM reduction)

    @property
    def rows(self) -> int:
        """Rows of w per CTA (BN)."""
        return 16 * self.tiles * (self.warps // self.kwarps)


#: the template's PROLOGUE codes
PROLOGUES = {"none": 0, "rms_norm": 1, "swiglu": 2}


@dataclass(frozen=True)
class Prologue:
    """What a fused variant computes while staging x (see the module docstring): ``rms_norm`` with the norm's
    ``eps``, ``swiglu`` with ``alpha``. Values are copied from the producer's own spec, so the literals match."""

    kind: str = "none"
    eps: float = 0.0
    alpha: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in PROLOGUES:
            raise ValueError(f"gemv prologue must be one of {sorted(PROLOGUES)}, got {self.kind!r}")


#: compile time: which ``kernel.cu`` variants load their first weight stage before the grid-dependency wait (the
#: template's ``WEIGHTS_FIRST``) when ``gemv_spec`` is not told: ``all`` (default: measured faster end to end, the
#: module docstring) or ``fused`` (those with a prologue only)
WEIGHTS_FIRST_ENV = "INGOT_GEMV_WEIGHTS_FIRST"


def weights_first_all() -> bool:
    """``INGOT_GEMV_WEIGHTS_FIRST``: unset, empty or ``all``: True; ``fused``: False; anything else a ``ValueError``."""
    return env_choice(WEIGHTS_FIRST_ENV, {"": True, "fused": False, "all": True}, "'all' (the default) or 'fused'")


#: compile time: ``kernel.cu``'s rope epilogue loads its slots and cos / sin right after the grid-dependency wait
#: instead of after the last MMA (``rope_epilogue.cuh``); ``0`` (default) or ``1``. Not yet measured on a GPU
ROPE_PRELOAD_ENV = "INGOT_ROPE_PRELOAD"


def rope_preload() -> bool:
    """``INGOT_ROPE_PRELOAD``: unset, empty or ``0``: off; ``1``: on; anything else a ``ValueError``."""
    return env_choice(ROPE_PRELOAD_ENV, {"": False, "0": False, "1": True}, "'0' or '1'")


@dataclass(frozen=True)
class RopeEpilogue:
    """The rope epilogue (the template's ``ROPE``; ``codegen/qkv_rope_fusion.py``): the qkv projection's variant
    rotates q and k (``num_heads`` / ``num_kv_heads`` heads of ``head_dim`` features, all rotating; ``interleaved``
    pairs (2i, 2i+1) or (i, i + head_dim / 2)) at ``positions``, writes q to ``q_out`` and k and v into the paged
    cache (``block_size`` positions a block, ``cache_ctype`` elements, ``scaled``: e4m3 codes of ``x / kv_scale``)
    as ``rope/qkv_cache.cu`` does; ``table_ctype``: the cos / sin tables' element type."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    interleaved: bool
    block_size: int
    cache_ctype: str = "bf16"
    table_ctype: str = "float"
    scaled: bool = False

    def __post_init__(self) -> None:
        if self.head_dim % 16 or self.num_heads < 1 or self.num_kv_heads < 1 or self.block_size < 1:
            raise ValueError(f"gemv rope epilogue: head_dim {self.head_dim} must be a multiple of 16, "
                             f"heads {self.num_heads} / {self.num_kv_heads} and block size {self.block_size} positive")

    @property
    def rows(self) -> int:
        """The qkv row's features (the GEMV's N)."""
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    def values(self) -> dict[str, int | bool | str]:
        return {"ROPE": True, "ROPE_NQ": self.num_heads, "ROPE_NKV": self.num_kv_heads, "ROPE_D": self.head_dim,
                "ROPE_INTERLEAVED": self.interleaved, "ROPE_BS": self.block_size, "ROPE_KT": self.cache_ctype,
                "ROPE_CT": self.table_ctype, "ROPE_SCALED": self.scaled, "ROPE_PRELOAD": rope_preload()}


#: a variant without the rope epilogue (values the template needs all the same)
NO_ROPE = {"ROPE": False, "ROPE_NQ": 0, "ROPE_NKV": 0, "ROPE_D": 16, "ROPE_INTERLEAVED": False, "ROPE_BS": 16,
           "ROPE_KT": "bf16", "ROPE_CT": "float", "ROPE_SCALED": False, "ROPE_PRELOAD": False}
#: the rope epilogue's parameters, after the variant's own (and ``norm_weight``)
ROPE_PARAMS = [("positions", "ptr"), ("cos", "ptr"), ("sin", "ptr"), ("q", "ptr"), ("kv_cache", "ptr"),
               ("slot_mapping", "ptr"), ("kv_scale", "ptr")]


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def x_pad(wb: int = 2) -> int:
    """Columns padding each token's row of x in shared memory (the template's ``LDX``): 64 bytes with bf16 and NVFP4
    weights, 16 with FP8 ones (the fragment reads' lane stride differs)."""
    return 8 if wb == 1 else 32


def smem_bytes(mb: int, slice_k: int, prologue: str = "none", wb: int = 2) -> int:
    """Dynamic shared memory of a variant: x's slice (and up's beside it for the swiglu prologue)."""
    return mb * (slice_k + x_pad(wb)) * 2 * (2 if prologue == "swiglu" else 1)


def row_group_bytes(mb: int, warps: int, tiles: int, kwarps: int) -> int:
    """Shared memory the in-CTA K split's partial tiles take (``kwarps - 1`` per row group, f32; kernel.cu's and
    quant.cu's ``GemvSplitK::row_group_sum``): they reuse x's region, which must hold them (the templates'
    static_assert)."""
    return (kwarps - 1) * (warps // kwarps) * tiles * (mb // 8) * 512


def kw_fits(mb: int, cfg: GemvConfig, wb: int = 2) -> bool:
    """The row groups' partial tiles fit x's shared-memory region (``row_group_bytes``)."""
    return row_group_bytes(mb, cfg.warps, cfg.tiles, cfg.kwarps) <= smem_bytes(mb, cfg.slice_k, wb=wb)


def row_groups_apply(n: int, mb: int, num_sms: int, x_bytes: int, enabled: bool) -> bool:
    """The rule gives ``w[n, k]``'s variant for ``M <= mb`` row groups (``KW_BUCKETS``' comment; kernel.cu's and
    quant.cu's): ``enabled`` (``kw_enabled`` / ``kw_quant_enabled``), a bucket of ``KW_BUCKETS``, x's whole-K slice
    (``x_bytes`` of shared memory) within ``KW_MAX_X``, too few row blocks of the bucket's shape."""
    if not enabled or mb not in KW_BUCKETS or x_bytes > KW_MAX_X:
        return False
    dw, dt, _ = SHAPE_BY_BUCKET.get(mb, (4, 1, 4))
    return -(-n // (16 * dw * dt)) < CTAS_PER_SM.get(mb, 1.0) * num_sms


def _kwarps(n: int, k: int, num_sms: int, warps: int, tiles: int, stage_steps: int, cw: int = 32) -> int:
    """The fewest warps a row group that give ``KW_CTAS_PER_SM`` CTAs per SM (at most all the CTA's warps), each
    warp's part of K whole load stages (of ``cw``-column steps)."""
    kw = 1
    while kw < warps and warps % (2 * kw) == 0 and k % (cw * stage_steps * 2 * kw) == 0:
        kw *= 2
        if -(-n // (16 * tiles * (warps // kw))) >= KW_CTAS_PER_SM * num_sms:
            break
    return kw


def gemv_config(n: int, k: int, mb: int, num_sms: int, warps: int | None = None, stage_steps: int | None = None,
                splitk: int | None = None, tiles: int | None = None, kwarps: int | None = None,
                wb: int = 2, cluster: bool | None = None, ctas_per_sm: float | None = None) -> GemvConfig:
    """The launch configuration for ``w[n, k]`` and ``M <= mb`` (see the module docstring). ``kwarps``: warps
    sharing a row group (None: ``KW_BUCKETS``' rule; 1: none). ``wb``: bytes a weight (1: FP8); a step and the
    smallest slice cover the same bytes of a row in both (so twice the columns with FP8 weights). ``cluster``: reduce
    the split-K slices in a thread-block cluster where ``cluster_fits`` (None: ``cluster_mode``'s choice, and then
    ``CLUSTER_SHAPE`` and ``CLUSTER_SMEM`` apply; False: never). ``ctas_per_sm``: the CTAs per SM split-K aims at
    (None: the bucket's ``CTAS_PER_SM``)."""
    use_cluster = cluster_mode() if cluster is None else cluster
    shapes = cluster_shapes(wb) if cluster is None and use_cluster else {}
    if mb in shapes and all(v is None for v in (warps, stage_steps, splitk, tiles, kwarps, ctas_per_sm)):
        shaped = _cluster_shaped(n, k, mb, num_sms, shapes[mb], wb)
        if shaped is not None:
            return shaped
    cw = WB_STEP_COLS[wb]
    dw, dt, du = SHAPE_BY_BUCKET.get(mb, (4, 1, 4))
    per_sm = CTAS_PER_SM.get(mb, 1.0) if ctas_per_sm is None else ctas_per_sm
    if mb in LARGE_N_SHAPE:
        lw, lt, lu = LARGE_N_SHAPE[mb]
        if -(-n // (16 * lw * lt)) >= 2 * num_sms:
            dw, dt, du = lw, lt, lu
    if mb in WIDE_N_SHAPE:
        lw, lt, lu = WIDE_N_SHAPE[mb]
        if -(-n // (16 * lw * lt)) >= WIDE_N_CTAS_PER_SM * num_sms:
            (dw, dt, du), per_sm = (lw, lt, lu), WIDE_N_CTAS_PER_SM
    # row groups avoid the split-K tail over CTAs; a cluster's reduction replaces them (cluster_mode's docstring), but
    # for NVFP4 weights, whose conversion-bound GEMVs ran faster with KW_SHAPE_NVFP4's row groups (qkv at M = 1 3.67
    # us against 4.15 in a cluster, o 3.24 against 3.45: docs/PERF.md, "Split-K in a cluster")
    groups_ok = not use_cluster or wb == WB_NVFP4
    if kwarps is None and groups_ok and row_groups_apply(n, mb, num_sms, smem_bytes(mb, k, wb=wb), kw_enabled()):
        gw, gt, gu = KW_SHAPE_NVFP4 if wb == WB_NVFP4 else KW_SHAPE
        kwarps = _kwarps(n, k, num_sms, warps or gw, tiles or gt, stage_steps or gu, cw)
        if kwarps > 1:  # else (K not whole stages for 2 warps) the bucket's own shape, no row groups
            dw, dt, du = gw, gt, gu
    # the quantized weights' bucket shapes, where nothing was asked for and no row groups apply
    if (kwarps or 1) == 1 and cluster is None and ctas_per_sm is None and all(
            v is None for v in (warps, stage_steps, splitk, tiles)):
        if wb == WB_NVFP4 and mb in NVFP4_SHAPE and nvfp4_shape_on():
            return _nvfp4_shaped(n, k, mb, num_sms)
        if wb == 1 and mb in FP8_SHAPE and fp8_shape_on():
            return _fp8_shaped(n, k, mb, num_sms)
    warps, tiles, stage_steps, kwarps = warps or dw, tiles or dt, stage_steps or du, kwarps or 1
    if warps % kwarps:
        raise ValueError(f"gemv: {kwarps} warps a row group do not divide {warps} warps")
    stage = cw * stage_steps * kwarps  # a slice is whole stages for each warp of a row group
    min_slice = MIN_SLICE * cw // 32
    blocks = -(-n // (16 * tiles * (warps // kwarps)))
    target = (KW_CTAS_PER_SM if kwarps > 1 else per_sm) * num_sms
    if splitk is None:
        splitk = 1
        while True:
            nxt = splitk * 2
            ks = _round_up(-(-k // nxt), stage)
            if blocks * splitk >= target or ks < min_slice or (nxt - 1) * ks >= k:
                break
            splitk = nxt
    ks = _round_up(-(-k // splitk), stage)
    while smem_bytes(mb, ks, wb=wb) > SMEM_BUDGET and ks > stage:  # more slices until x fits
        splitk *= 2
        ks = _round_up(-(-k // splitk), stage)
    splitk = -(-k // ks)
    cfg = GemvConfig(warps=warps, tiles=tiles, splitk=splitk, stage_steps=stage_steps, slice_k=ks, kwarps=kwarps)
    together = cfg.splitk * smem_bytes(mb, ks, wb=wb)  # the cluster's x slices, bytes
    if use_cluster and cluster_fits(mb, cfg, wb) and (cluster is not None or together <= CLUSTER_SMEM):
        cfg = dataclasses.replace(cfg, cluster=True)
    if not kw_fits(mb, cfg, wb):
        raise ValueError(f"gemv: {kwarps} warps a row group need more shared memory than x's slice for M <= {mb}")
    return cfg


def gemv_spec(n: int, k: int, mb: int, target: Target, bias: bool = False, residual: bool = False,
              config: GemvConfig | None = None, prologue: Prologue | None = None,
              weights_first: bool | None = None, rope: RopeEpilogue | None = None, wb: int = 2) -> KernelSpec:
    """The variant for ``M <= mb`` of ``linear`` with bf16 ``x[M, k]``, ``w[n, k]``; params as the GEMM's (and
    ``norm_weight`` after them with an ``rms_norm`` prologue, then ``ROPE_PARAMS`` with ``rope``). ``weights_first``:
    load the first weight stage before the PDL wait (default: ``INGOT_GEMV_WEIGHTS_FIRST``'s, every variant unless
    ``fused``: a prologue's only; the module docstring).
    ``wb=1``: a weight-only ``quantized_linear`` with e4m3 ``w[n, k]`` and f32 ``weight_scale[n]`` instead
    (``QUANT_PARAMS``, the op's inputs by name; **FP8 weights** in the module docstring); ``wb=WB_NVFP4`` (0): one
    with NVFP4 weights (**NVFP4 weights**)."""
    if wb not in WB_STEP_COLS:
        raise ValueError(f"gemv: wb must be 2 (bf16 weights), 1 (e4m3) or 0 (NVFP4), got {wb}")
    if k % WB_STEP_COLS[wb] or mb not in BUCKETS:
        raise ValueError(f"gemv: K must be a multiple of {WB_STEP_COLS[wb]} (got {k}) and mb one of {BUCKETS} "
                         f"(got {mb})")
    if rope is not None and (rope.rows != n or residual):
        raise ValueError(f"gemv rope epilogue: N {n} must be the qkv row's {rope.rows} features, without residual")
    pro = prologue or Prologue()
    first = (pro.kind != "none" or weights_first_all()) if weights_first is None else weights_first
    cfg = config or gemv_config(n, k, mb, target.num_sms or 132, wb=wb)
    if cfg.cluster and (not cluster_fits(mb, cfg, wb) or target.sm < 90):
        raise ValueError(f"gemv: split-K {cfg.splitk} in a cluster needs 2..{CLUSTER_MAX} slices, a partial tile of "
                         f"{cfg.rows} x {mb} f32 within x's shared memory and sm_90+ (target {target.name})")
    smem, limit = smem_bytes(mb, cfg.slice_k, pro.kind, wb), target.smem_per_block or 227 * 1024
    if smem + STATIC_SMEM > limit:
        raise ValueError(f"gemv: {smem} bytes of shared memory for M <= {mb}, a slice of {cfg.slice_k}, {pro.kind} "
                         f"prologue: more than the target's {limit}")
    values = {"N": n, "K": k, "MB": mb, "WARPS": cfg.warps, "MT": cfg.tiles, "KS": cfg.slice_k, "SPLITK": cfg.splitk,
              "U": cfg.stage_steps, "KW": cfg.kwarps, "HAS_BIAS": bias, "HAS_RESIDUAL": residual,
              "PROLOGUE": PROLOGUES[pro.kind],
              "EPS": float(pro.eps), "ALPHA": float(pro.alpha), "WEIGHTS_FIRST": first, "WB": wb,
              "F16": wb == 1 and mb in F16_BUCKETS, "CLUSTER": cfg.cluster,
              **(rope.values() if rope is not None else NO_ROPE)}
    tag = (f"gemv_{'bf16' if wb == 2 else WB_NAMES[wb] + 'w'}_n{n}_k{k}_m{mb}"
           + ("" if pro.kind == "none" else f"_{pro.kind}")
           + ("" if rope is None else "_rope"))
    base = PARAMS if wb == 2 else QUANT_PARAMS
    params = base + [("norm_weight", "ptr")] if pro.kind == "rms_norm" else base
    if rope is not None:
        params = params + ROPE_PARAMS
    what = ("" if pro.kind == "none" else f", {pro.kind} prologue") + ("" if rope is None else ", rope epilogue")
    return KernelSpec.make("gemv", "kernel.cu", tag, target.arch or "", values, params, 32 * cfg.warps,
                           [GridDim(const=-(-n // cfg.rows)), GridDim(const=cfg.splitk)],
                           smem=smem,
                           doc=f"decode GEMV{'' if wb == 2 else ', ' + WB_NAMES[wb] + ' weights'}, M <= {mb}, "
                               f"split-K {cfg.splitk} x {cfg.slice_k}"
                               + (" in a cluster" if cfg.cluster else "")
                               + (f", {cfg.kwarps} warps a row group" if cfg.kwarps > 1 else "") + what)


def spec_config(spec: KernelSpec) -> GemvConfig:
    """The configuration a kernel.cu GEMV spec (bf16, FP8 or NVFP4 weights) was made with (``gemv_spec(...,
    config=spec_config(s))`` rebuilds ``s``)."""
    v = dict(spec.values)
    return GemvConfig(int(v["WARPS"]), int(v["MT"]), int(v["SPLITK"]), int(v["U"]), int(v["KS"]), int(v.get("KW", 1)),
                      bool(v.get("CLUSTER", False)))


def is_plain(spec: KernelSpec) -> bool:
    """A ``kernel.cu`` GEMV variant without a prologue, bf16, FP8 or NVFP4 weights (what ``variants`` and
    ``quant_rule.quant_variants`` make and autotuning tunes); with ``INGOT_GEMV_BULK=1`` also ``bulk.cu``'s bf16
    ones, not its FP8-weight ones (``WB`` 1)."""
    v = dict(spec.values)
    return (spec.family == "gemv" and not v.get("PROLOGUE", 0) and not v.get("ROPE")
            and (spec.template == "kernel.cu" or (spec.template == "bulk.cu" and v.get("WB", 2) == 2)))


def fused_spec(plain: KernelSpec, prologue: Prologue, target: Target, weights_first: bool | None = None) -> KernelSpec:
    """``plain`` (a bf16 variant, see ``is_plain``) with ``prologue``: the same N, K, bucket, epilogue and
    configuration, so it streams the weights exactly as ``plain`` does. A ``bulk.cu`` variant gets a ``bulk.cu``
    fused variant (``bulk_rule.fused_bulk_spec``: fewer ring stages where the prologue's x needs the room; always
    weights first), or ``kernel.cu``'s with its default configuration where no bulk configuration fits."""
    if plain.template == "skinny.cu":  # the wgmma skinny GEMM: its own fused variant (rms_norm only)
        from .skinny_rule import fused_skinny_spec

        return fused_skinny_spec(plain, prologue, target)
    if plain.template == "quant.cu":  # W8A8's decode variants: the rms_norm prologue before the quantization
        from .quant_rule import fused_quant_spec

        return fused_quant_spec(plain, prologue, target)
    if not is_plain(plain):
        raise ValueError(f"gemv: {plain.entry} is not a plain GEMV variant (kernel.cu, or bulk.cu with bf16 weights)")
    v = dict(plain.values)
    if plain.template == "bulk.cu":
        from .bulk_rule import fused_bulk_spec

        made = fused_bulk_spec(plain, prologue, target)
        if made is not None:
            return made
    config = spec_config(plain) if plain.template == "kernel.cu" else None
    n, k, mb, wb = int(v["N"]), int(v["K"]), int(v["MB"]), int(v.get("WB", 2))
    if config is not None and config.kwarps > 1 and \
            smem_bytes(mb, config.slice_k, prologue.kind, wb) + STATIC_SMEM > (target.smem_per_block or 227 * 1024):
        # the prologue's x region (swiglu: gate's and up's slices) does not fit beside a row-group configuration's
        # long slice: the rule's configuration without row groups, as before they existed
        config = gemv_config(n, k, mb, target.num_sms or 132, kwarps=1, wb=wb)
    return gemv_spec(n, k, mb, target, bool(v["HAS_BIAS"]), bool(v["HAS_RESIDUAL"]),
                     config=config, prologue=prologue, weights_first=weights_first, wb=wb)


def with_rope(spec: KernelSpec, rope: RopeEpilogue, target: Target) -> KernelSpec:
    """``spec`` (a ``kernel.cu`` variant, plain or with a prologue) with the rope epilogue: the same configuration,
    prologue and weight order, so it streams the weights as ``spec`` does."""
    if spec.family != "gemv" or spec.template != "kernel.cu" or dict(spec.values).get("ROPE"):
        raise ValueError(f"gemv: {spec.entry} is not a kernel.cu variant without the rope epilogue")
    v = dict(spec.values)
    kind = {code: name for name, code in PROLOGUES.items()}[int(v["PROLOGUE"])]
    return gemv_spec(int(v["N"]), int(v["K"]), int(v["MB"]), target, bool(v["HAS_BIAS"]), bool(v["HAS_RESIDUAL"]),
                     config=spec_config(spec), prologue=Prologue(kind, float(v["EPS"]), float(v["ALPHA"])),
                     weights_first=bool(v["WEIGHTS_FIRST"]), rope=rope, wb=int(v.get("WB", 2)))


def applies(inputs: Sequence[TensorType | None], target: Target) -> tuple[int, int, bool, bool] | None:
    """(N, K, has bias, has residual) when the variants apply to a ``linear`` with these inputs."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    residual = inputs[3] if len(inputs) > 3 else None
    n, k = static_dim(w, 0), static_dim(w, 1)
    if not target.is_gpu or x is None or w is None or n is None or k is None or w.rank != 2:
        return None
    if x.dtype is not DType.bf16 or w.dtype is not DType.bf16 or static_dim(x, -1) != k or k % 32 or n < 16:
        return None
    if any(t is not None and t.dtype is not DType.bf16 for t in (bias, residual)):
        return None
    return n, k, bias is not None, residual is not None


def variants(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[tuple[int, KernelSpec]]:
    """(max rows, spec) per token bucket, smallest first; empty when the family does not apply.
    ``quantized_linear`` (FP8 / NVFP4 weights): ``quant_rule.quant_variants``."""
    if op.name == "quantized_linear":
        from .quant_rule import quant_variants

        return quant_variants(op, inputs, target)
    if op.name != "linear":
        return []
    a = applies(inputs, target)
    if a is None:
        return []
    n, k, bias, residual = a
    from . import bulk_rule, skinny_rule

    def variant(mb: int) -> KernelSpec:
        # INGOT_GEMV_BULK (opt-in, so first): bulk.cu for the buckets bulk_rule.uses where a configuration fits
        bulk = bulk_rule.bulk_spec(n, k, mb, target, bias, residual) if bulk_rule.uses(mb) else None
        if bulk is not None:
            return bulk
        # 16-64 tokens: the wgmma skinny GEMM, persistent on wide matrices, split-K on narrow ones (skinny_rule's
        # docstring; INGOT_GEMV_SKINNY, INGOT_GEMV_SKINNY_SPLITK)
        return skinny_rule.rule_spec(n, k, mb, target, bias, residual) or gemv_spec(n, k, mb, target, bias, residual)

    out = [(mb, variant(mb)) for mb in BUCKETS]
    if skinny_rule.split8() and skinny_rule.is_skinny(out[0][1]):  # up to 4 tokens stay kernel.cu's (split8)
        out.insert(0, (skinny_rule.SPLIT8_ROWS, gemv_spec(n, k, BUCKETS[0], target, bias, residual)))
    # narrow matrices: steps of 65-256 tokens on the skinny kernel's split-K variant in 64-token chunks, where the
    # GEMM's 128-row tiles would leave most SMs idle (skinny_rule.any_m_spec; INGOT_GEMV_SKINNY_ANY)
    if skinny_rule.is_skinny(out[-1][1]):
        any_m = skinny_rule.any_m_spec(n, k, target, bias, residual)
        if any_m is not None:
            out.append((skinny_rule.ANY_M_ROWS, any_m))
    return out


def plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
    """A single launch when x's row count is static and within the largest bucket (graph mode).
    ``quantized_linear``: the any-M kernel of ``quant_rule.quant_plan`` (its variants take small M)."""
    if op.name == "quantized_linear":
        from .quant_rule import quant_plan

        return quant_plan(op, inputs, target)
    if op.name != "linear" or applies(inputs, target) is None:
        return None
    x = inputs[0]
    assert x is not None and x.shape is not None
    rows = 1
    for d in x.shape[:-1]:
        if not isinstance(d, int):
            return None
        rows *= d
    for mb, spec in variants(op, inputs, target):
        if rows <= mb:
            return [spec]
    return None


FAMILY = Family(name="gemv", ops=("linear", "quantized_linear"), plan=plan)
