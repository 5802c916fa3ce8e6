"""Decode GEMV / skinny GEMM for ``quantized_linear`` (``quant.cu``): FP8 and NVFP4 weights, bf16 or FP8 activations.

What the template computes, exactly as ``ir/ops/quantized.py``'s reference (up to f32 summation order):

==========================  ========================  ====================================================
``weight_format``           ``act_format``            kernel
==========================  ========================  ====================================================
``fp8`` (channel scales)    ``none``                  e4m3 -> bf16 in registers (exact), bf16 ``mma.sync``
``fp8`` (channel scales)    ``fp8`` token / tensor    x quantized per token in the CTA (amax over all of K),
                                                      e4m3 x e4m3 ``mma.sync`` m16n8k32, scales in the epilogue
``fp8`` (128 x 128 blocks)  ``none`` / ``fp8``        as the two above (``fp8_block``, ``WFMT`` 2; K a multiple of
                                                      128), each 128-column block's products summed apart and
                                                      added times the block's scale
``nvfp4`` (linear scales)   ``none``                  e2m1 x e4m3 scale -> bf16 in registers (exact)
==========================  ========================  ====================================================

Other combinations (per-tensor FP8 scales: the ``fp8-channel-scales`` pass makes them per channel first; blocks
other than 128 x 128, MXFP4, NVFP4 activations, the sm100 scale swizzle) are not taken (``quant_applies`` returns
None). Block-scaled FP8 runs here at every M (the decode buckets and the any-M launch: no dequantize + GEMM pair for
its prefill yet).

**FP8 weight-only decode buckets on ``kernel.cu``** (``INGOT_GEMV_FP8``, ``fp8_template``): the bf16 GEMV's template
with e4m3 weights (``rule.gemv_spec(..., wb=1)``: the codes converted in registers, exactly, to bf16, or to f16
in ``rule.F16_BUCKETS``; the scale in the epilogue), so those buckets get what the bf16 path has and ``quant.cu``
lacks: the rms_norm / swiglu prologues
(``codegen/decode_fusion.py``), the rope epilogue (``codegen/qkv_rope_fusion.py``) and the row groups, with the bf16
rule's configurations for the same bytes a row. The default since the twelfth session: on the H200 the 1B model's
FP8 weight-only decode ran 1.15x faster at batch 1 and 1.25x at batch 64 (docs/PERF.md, "FP8 weights on
kernel.cu"). ``INGOT_GEMV_FP8=quant`` keeps ``quant.cu`` for them; the any-M launch and FP8 activations stay
on ``quant.cu`` either way.

**NVFP4 weight-only decode buckets on ``kernel.cu``** (``INGOT_GEMV_NVFP4``, ``nvfp4_template``): the same template
with NVFP4 weights (``rule.gemv_spec(..., wb=rule.WB_NVFP4)``: codes and block scales turned into f16 exactly, the
global scale in the epilogue; rule.py's **NVFP4 weights**), with the same fusions. The default since the fourteenth
session: its GEMVs 1.1-2.4x ``quant.cu``'s up to 16 tokens (about half the instructions a weight), the 1B model's
NVFP4 decode 1.44x at batch 1 and 1.05-1.07x at batch 64 (docs/PERF.md, "NVFP4 weights on kernel.cu, and plain GEMVs
weights first"); at 32 tokens the small matrices (qkv, o) ran 0.9x ``quant.cu``. ``INGOT_GEMV_NVFP4=quant`` keeps
``quant.cu``; the any-M launch stays there either way.

**Selection**, as for the bf16 GEMV (``rule.py``): ``quant_variants`` gives one variant per token bucket
(``BUCKETS``, each correct for ``M <= MB``, split-K sized for that bucket); ``quant_plan`` gives the launch for
any M (``ANY_M``: MB = 64 token chunks on grid.z, no split-K, the weights re-read per chunk), which is the node's
own kernel: the executor runs the first variant whose ``max_rows`` covers the step's M, else that. By default
(``codegen/quant_prefill.py``; ``INGOT_QUANT_PREFILL_GEMM=0`` turns it off) weight-only linears run a dequantize
launch + the bf16 GEMM above ``GEMV_MAX_ROWS`` instead, the buckets and this launch as that GEMM launch's variants.

**Configuration** (``quant_config``): a step is 16 bytes of weights per lane (64 FP8 or 128 NVFP4 columns);
warps, tiles and steps per stage per bucket from the bf16 GEMV's table (same bytes per load); split-K doubles
until ``CTAS_PER_SM x num_sms`` CTAs, slices of at least ``MIN_SLICE_BYTES`` bytes of weights per row, and the
x slice within ``SMEM_BUDGET``; the stage depth shrinks to fit the slice.

**Row groups** (``QuantGemvConfig.kwarps``, the template's ``KW``; as the bf16 GEMV's, ``rule.row_groups_apply``):
in the bf16 GEMV's ``KW_BUCKETS``, where the bucket's shape gives too few row blocks for ``CTAS_PER_SM`` and x's
whole-K slice (``smem_bytes(mb, k, act)``: FP8 activations take half the bytes) fits ``KW_MAX_X``, the CTA takes
``KW_SHAPE`` and its warps form row groups of the fewest warps that give ``KW_CTAS_PER_SM`` CTAs an SM, each warp a
part of the CTA's K slice of at least ``MIN_SLICE_BYTES`` a row and whole stages (the stage shrinking to a short
part, as it does to a short slice); split-K over CTAs only on top, towards ``KW_CTAS_PER_SM``. The 1B model's qkv
and o at M <= 8 get 16-row CTAs of 4 warps splitting the whole of K, no split-K; with FP8 activations down too (its
x as e4m3 codes, 8 x 8256 B, fits where bf16's 8 x 16448 B does not: the bf16 GEMV's down ran slower with row groups,
this one is unmeasured). ``INGOT_GEMV_KW=0`` (compile time) gives no row groups: the configurations as before them.
Never for the any-M launch. Not yet measured on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ....ir.op import Op
from ....ir.types import DType, TensorType
from ...family import static_dim
from ...kernel import GridDim, KernelSpec
from ...switches import env_choice
from ...target import Target
from .rule import (
    BUCKETS,
    CTAS_PER_SM,
    KW_CTAS_PER_SM,
    KW_SHAPE,
    LARGE_N_SHAPE,
    NO_ROPE,
    NVFP4_SPLIT8_ROWS,
    QUANT_PARAMS,
    ROPE_PARAMS,
    SHAPE_BY_BUCKET,
    SMEM_BUDGET,
    WB_NVFP4,
    Prologue,
    RopeEpilogue,
    gemv_spec,
    kw_quant_enabled,
    nvfp4_split8_config,
    row_group_bytes,
    row_groups_apply,
)

#: the op's inputs by name (``kernel.cu``'s FP8-weight variants take the same)
PARAMS = QUANT_PARAMS
#: the template's weight formats (``WFMT``): ``fp8_block`` is FP8 with 128 x 128 block scales (weight_granularity
#: ``block``), ``fp8`` per output channel
WEIGHT_FORMATS = {"fp8": 0, "nvfp4": 1, "fp8_block": 2}
#: (act_format, act_granularity) -> AFMT
ACT_MODES = {("none", "token"): 0, ("none", "tensor"): 0, ("fp8", "token"): 1, ("fp8", "tensor"): 2}
#: K columns per step (16 bytes of weights per lane)
STEP_COLS = {"fp8": 64, "nvfp4": 128, "fp8_block": 64}
#: ``fp8_block``'s scale block (rows x columns)
FP8_BLOCK = (128, 128)
MIN_SLICE_BYTES = 256
#: the any-M launch's token chunk
ANY_M_CHUNK = 64
#: compile-time switch: which template runs the FP8 weight-only decode buckets (``fp8_template``)
FP8_ENV = "INGOT_GEMV_FP8"
#: its default: measured faster end to end (the module docstring)
FP8_DEFAULT = "kernel"
#: compile-time switch: which template runs the NVFP4 weight-only decode buckets (``nvfp4_template``)
NVFP4_ENV = "INGOT_GEMV_NVFP4"
#: its default: measured faster (the module docstring)
NVFP4_DEFAULT = "kernel"


def fp8_template() -> str:
    """``INGOT_GEMV_FP8``: ``"kernel.cu"`` (``kernel``) or ``"quant.cu"`` (``quant``) for the FP8 weight-only decode
    buckets; unset or empty: ``FP8_DEFAULT``; another value is an error naming the variable."""
    choice = env_choice(FP8_ENV, {"": FP8_DEFAULT, "kernel": "kernel", "quant": "quant"}, "kernel or quant")
    return f"{choice}.cu"


def nvfp4_template() -> str:
    """``INGOT_GEMV_NVFP4``: ``"kernel.cu"`` (``kernel``) or ``"quant.cu"`` (``quant``) for the NVFP4 weight-only
    decode buckets; unset or empty: ``NVFP4_DEFAULT``; another value is an error naming the variable."""
    choice = env_choice(NVFP4_ENV, {"": NVFP4_DEFAULT, "kernel": "kernel", "quant": "quant"}, "kernel or quant")
    return f"{choice}.cu"


@dataclass(frozen=True)
class QuantGemvConfig:
    warps: int = 4
    tiles: int = 1  # MT: 16-row tiles per warp
    splitk: int = 1  # CTAs along K (grid.y); the any-M launch keeps 1 and walks ceil(K / slice_k) slices itself
    stage_steps: int = 4  # U: steps per load stage
    slice_k: int = 0  # KS (columns)
    kwarps: int = 1  # KW: warps of a row group, splitting the CTA's K slice among them (1: a warp its own rows)

    @property
    def rows(self) -> int:
        """Rows of w per CTA (BN)."""
        return 16 * self.tiles * (self.warps // self.kwarps)


def weight_bytes_per_row(fmt: str, k: int) -> int:
    return k if fmt in ("fp8", "fp8_block") else k // 2 + k // 16


def smem_bytes(mb: int, slice_k: int, act: str) -> int:
    """The CTA's x slice in shared memory: bf16 (weight-only) or e4m3 codes, rows padded by 64 bytes."""
    return mb * (slice_k * (2 if act == "none" else 1) + 64)


def kw_fits(mb: int, act: str, cfg: QuantGemvConfig) -> bool:
    """The in-CTA K split's partial tiles (``kwarps - 1`` per row group, f32) fit x's shared-memory region, which
    they reuse (the template's static_assert)."""
    return row_group_bytes(mb, cfg.warps, cfg.tiles, cfg.kwarps) <= smem_bytes(mb, cfg.slice_k, act)


def _part_steps(per: int, kwarps: int, u_max: int, pairs: bool = False) -> tuple[int, int]:
    """(slice steps, steps a stage) for a slice of at least ``per`` steps split over ``kwarps`` warps: the stage
    depth shrinks to a short part; the slice rounds up to whole stages for each warp. ``pairs``: stages of an even
    number of steps (``fp8_block``: a warp's part is whole 128-column blocks of two steps)."""
    u = max(1, min(u_max, -(-per // kwarps)))
    if pairs:
        u = max(2, u - u % 2)
    unit = u * kwarps
    return -(-per // unit) * unit, u


def _kwarps(n: int, steps: int, num_sms: int, warps: int, tiles: int, u_max: int, min_steps: int) -> int:
    """The fewest warps a row group (at most all the CTA's) that give ``KW_CTAS_PER_SM`` CTAs an SM, each warp's
    part of K at least ``min_steps`` steps and whole stages (``steps % (u * kw) == 0``, u shrunk to a short part)."""
    kw = 1
    while kw < warps and warps % (2 * kw) == 0 and steps % (2 * kw) == 0 and steps // (2 * kw) >= min_steps:
        u = min(u_max, steps // (2 * kw))
        if steps % (u * 2 * kw):
            break
        kw *= 2
        if -(-n // (16 * tiles * (warps // kw))) >= KW_CTAS_PER_SM * num_sms:
            break
    return kw


def quant_config(n: int, k: int, mb: int, wfmt: str, act: str, num_sms: int, *, any_m: bool = False,
                 splitk: int | None = None, warps: int | None = None, tiles: int | None = None,
                 stage_steps: int | None = None, kwarps: int | None = None) -> QuantGemvConfig:
    """The launch configuration for ``w[n, k]`` in ``wfmt`` and ``M <= mb`` (see the module docstring).
    ``kwarps``: warps sharing a row group (None: the rule's, see **Row groups**; 1: none; never for ``any_m``)."""
    sw = STEP_COLS[wfmt]
    if k % sw:
        raise ValueError(f"quantized gemv: K={k} must be a multiple of {sw} for {wfmt} weights")
    if any_m and kwarps not in (None, 1):
        raise ValueError(f"quantized gemv: the any-M launch has no row groups (kwarps={kwarps})")
    dw, dt, du = SHAPE_BY_BUCKET.get(mb, (4, 1, 4))
    if mb in LARGE_N_SHAPE:
        lw, lt, lu = LARGE_N_SHAPE[mb]
        if -(-n // (16 * lw * lt)) >= 2 * num_sms:
            dw, dt, du = lw, lt, lu
    steps = k // sw
    min_steps = max(1, MIN_SLICE_BYTES // 64)  # a step is 64 B of a row (16 B per lane, 4 lanes per row)
    # rule.row_groups_apply, with quant.cu's x bytes and switch (INGOT_GEMV_KW=all: opt-in until run on a GPU)
    if kwarps is None and not any_m and row_groups_apply(n, mb, num_sms, smem_bytes(mb, k, act), kw_quant_enabled()):
        gw, gt, gu = KW_SHAPE
        kwarps = _kwarps(n, steps, num_sms, warps or gw, tiles or gt, stage_steps or gu, min_steps)
        if kwarps > 1:  # else (K too short for 2 warps' parts) the bucket's own shape, no row groups
            dw, dt, du = gw, gt, gu
    warps, tiles, u_max, kwarps = warps or dw, tiles or dt, stage_steps or du, kwarps or 1
    if kwarps < 1 or warps % kwarps:
        raise ValueError(f"quantized gemv: {kwarps} warps a row group do not divide {warps} warps")
    blocks = -(-n // (16 * tiles * (warps // kwarps)))
    target = (KW_CTAS_PER_SM if kwarps > 1 else CTAS_PER_SM.get(mb, 1.0)) * num_sms
    if any_m:
        splitk = 1
    elif splitk is None:
        splitk = 1  # each warp's part of a slice at least min_steps (a row group's warps: kwarps parts)
        while (blocks * splitk < target and -(-steps // (splitk * 2)) >= min_steps * kwarps
               and splitk * 2 * kwarps <= steps):
            splitk *= 2

    slices, pairs = splitk, wfmt == "fp8_block"
    per, u = _part_steps(-(-steps // slices), kwarps, u_max, pairs)
    while smem_bytes(mb, per * sw, act) > SMEM_BUDGET and per > u * kwarps:  # more (any-M: in-CTA) slices until x fits
        slices *= 2
        per, u = _part_steps(-(-steps // slices), kwarps, u_max, pairs)
    if smem_bytes(mb, per * sw, act) > SMEM_BUDGET:
        raise ValueError(f"quantized gemv: an x slice of {per * sw} columns for {mb} tokens exceeds shared memory")
    splitk = 1 if any_m else -(-steps // per)
    cfg = QuantGemvConfig(warps=warps, tiles=tiles, splitk=splitk, stage_steps=u, slice_k=per * sw, kwarps=kwarps)
    if not kw_fits(mb, act, cfg):
        raise ValueError(f"quantized gemv: {kwarps} warps a row group need more shared memory than x's slice "
                         f"({smem_bytes(mb, cfg.slice_k, act)} bytes) for M <= {mb}")
    return cfg


def quant_gemv_spec(n: int, k: int, mb: int, target: Target, weight_format: str = "fp8", act: str = "none",
                    act_granularity: str = "token", bias: bool = False, residual: bool = False,
                    any_m: bool = False, config: QuantGemvConfig | None = None,
                    rope: RopeEpilogue | None = None, prologue: Prologue | None = None) -> KernelSpec:
    """The kernel for ``M <= mb`` (``any_m``: any M, in chunks of ``mb``) of a ``quantized_linear`` with
    ``weight_format`` weights [n, k] and ``act`` activations; params ``PARAMS`` (the op's inputs by name),
    ``norm_weight`` with an ``rms_norm`` ``prologue`` (FP8 activations, decode variants: ``fused_quant_spec``), then
    ``rule.ROPE_PARAMS`` with the rope epilogue (``rope``: a decode variant of the qkv projection, no residual)."""
    kind = "none" if prologue is None else prologue.kind
    if kind not in ("none", "rms_norm") or (kind != "none" and (act == "none" or any_m)):
        raise ValueError(f"quantized gemv: a {kind} prologue is not taken here (the rms_norm prologue: FP8 "
                         f"activations, decode variants; got {act} activations{', any M' if any_m else ''})")
    if rope is not None and (rope.rows != n or residual or any_m):
        raise ValueError(f"quantized gemv rope epilogue: N {n} must be the qkv row's {rope.rows} features, "
                         "without residual, not the any-M launch")
    if weight_format not in WEIGHT_FORMATS or (act, act_granularity) not in ACT_MODES:
        raise ValueError(f"quantized gemv: unsupported formats {weight_format}/{act}:{act_granularity}")
    if weight_format == "nvfp4" and act != "none":
        raise ValueError("quantized gemv: nvfp4 weights take bf16 activations (weight-only)")
    if mb not in BUCKETS:
        raise ValueError(f"quantized gemv: mb must be one of {BUCKETS}, got {mb}")
    cfg = config or quant_config(n, k, mb, weight_format, act, target.num_sms or 132, any_m=any_m)
    afmt = ACT_MODES[(act, act_granularity)]
    values = {"N": n, "K": k, "MB": mb, "WARPS": cfg.warps, "MT": cfg.tiles, "KS": cfg.slice_k, "SPLITK": cfg.splitk,
              "U": cfg.stage_steps, "KW": cfg.kwarps, "WFMT": WEIGHT_FORMATS[weight_format], "AFMT": afmt,
              "ANY_M": any_m, "HAS_BIAS": bias, "HAS_RESIDUAL": residual,
              "PROLOGUE": int(kind == "rms_norm"), "EPS": float(prologue.eps) if prologue is not None else 0.0,
              **(rope.values() if rope is not None else NO_ROPE)}
    a = "a16" if afmt == 0 else "a8"
    tag = (f"gemv_{weight_format}_{a}_n{n}_k{k}_m{mb}{'_any' if any_m else ''}"
           f"{'_rms_norm' if kind == 'rms_norm' else ''}{'_rope' if rope is not None else ''}")
    if any_m and cfg.kwarps != 1:
        raise ValueError(f"quantized gemv: the any-M launch has no row groups (kwarps={cfg.kwarps})")
    grid = [GridDim(const=-(-n // cfg.rows)), GridDim(const=cfg.splitk),
            GridDim("M", mb) if any_m else GridDim(const=1)]
    params = PARAMS + (NORM_PARAMS if kind == "rms_norm" else []) + (ROPE_PARAMS if rope is not None else [])
    return KernelSpec.make("gemv", "quant.cu", tag, target.arch or "", values, params, 32 * cfg.warps, grid,
                           smem=smem_bytes(mb, cfg.slice_k, act),
                           doc=f"{weight_format} weights, {act} activations, M <= {'any' if any_m else mb}, "
                               f"split-K {cfg.splitk} x {cfg.slice_k}"
                               + (f", {cfg.kwarps} warps a row group" if cfg.kwarps > 1 else "")
                               + (", rms_norm prologue" if kind == "rms_norm" else "")
                               + (", rope epilogue" if rope is not None else ""))


def with_rope(spec: KernelSpec, rope: RopeEpilogue, target: Target) -> KernelSpec:
    """``spec`` (a decode ``quant.cu`` variant) with the rope epilogue: the same formats, configuration and weight
    order."""
    v = dict(spec.values)
    if spec.family != "gemv" or spec.template != "quant.cu" or v.get("ROPE") or v["ANY_M"]:
        raise ValueError(f"quantized gemv: {spec.entry} is not a decode quant.cu variant without the rope epilogue")
    prologue = Prologue("rms_norm", eps=float(v["EPS"])) if int(v.get("PROLOGUE", 0)) else None
    return _remade(spec, target, rope=rope, prologue=prologue)


def _remade(spec: KernelSpec, target: Target, *, rope: RopeEpilogue | None = None,
            prologue: Prologue | None = None) -> KernelSpec:
    """``spec`` (a decode ``quant.cu`` variant) made again with its formats, epilogue and configuration, with ``rope``
    and ``prologue`` (those ``quant_gemv_spec`` takes)."""
    v = dict(spec.values)
    wfmt = {code: name for name, code in WEIGHT_FORMATS.items()}[int(v["WFMT"])]
    act, gran = {code: mode for mode, code in ACT_MODES.items()}[int(v["AFMT"])]
    return quant_gemv_spec(int(v["N"]), int(v["K"]), int(v["MB"]), target, wfmt, act, gran, bool(v["HAS_BIAS"]),
                           bool(v["HAS_RESIDUAL"]), config=spec_config(spec), rope=rope, prologue=prologue)


#: ``quant.cu``'s rms_norm prologue parameter (after ``PARAMS``, before ``ROPE_PARAMS``, as ``kernel.cu``'s)
NORM_PARAMS = [("norm_weight", "ptr")]
#: compile time: ``1`` lets decode fusion give W8A8's ``quant.cu`` decode variants the rms_norm prologue (the norm's
#: launch skipped up to 8 rows); unset or ``0``: not. Correct on the H200, but on the 1B shape batch 1 +1.9% and batch
#: 8 -6.2% (every CTA normalizes the bucket's rows itself; docs/PERF.md, thirtieth session): off by default
W8A8_NORM_ENV = "INGOT_W8A8_NORM_FUSION"


def w8a8_norm_fusion_on() -> bool:
    """``INGOT_W8A8_NORM_FUSION``: ``1`` (on) or unset / ``0`` (off, the default: slower at 8 rows)."""
    return env_choice(W8A8_NORM_ENV, {"": False, "0": False, "1": True}, "0 or 1")


def fusable_quant(spec: KernelSpec) -> bool:
    """A ``quant.cu`` decode variant with FP8 activations and no prologue yet: what ``fused_quant_spec`` takes."""
    v = dict(spec.values)
    return (spec.family == "gemv" and spec.template == "quant.cu" and int(v["AFMT"]) != 0 and not v["ANY_M"]
            and not int(v.get("PROLOGUE", 0)) and not v.get("ROPE"))


def fused_quant_spec(plain: KernelSpec, prologue: Prologue, target: Target) -> KernelSpec:
    """``plain`` (``fusable_quant``) with ``prologue`` (``rms_norm`` only): the same formats and configuration, x
    read as the norm's input and normalized per token before it is quantized."""
    if not fusable_quant(plain) or prologue.kind != "rms_norm":
        raise ValueError(f"quantized gemv: no {prologue.kind} prologue for {plain.entry} (W8A8 decode variants take "
                         "the rms_norm prologue only)")
    return _remade(plain, target, prologue=prologue)


def spec_config(spec: KernelSpec) -> QuantGemvConfig:
    """The configuration a quant.cu spec was made with (``quant_gemv_spec(..., config=spec_config(s))`` rebuilds
    ``s``); ``KW`` 1 where a spec has none."""
    v = dict(spec.values)
    return QuantGemvConfig(int(v["WARPS"]), int(v["MT"]), int(v["SPLITK"]), int(v["U"]), int(v["KS"]),
                           int(v.get("KW", 1)))


def workspace_floats(spec: KernelSpec) -> int:
    """The split-K workspace (module-scope f32) that a spec's kernel declares."""
    v = dict(spec.values)
    return int(v["SPLITK"]) * spec.grid[0].const * spec_config(spec).rows * int(v["MB"]) if int(v["SPLITK"]) > 1 else 1


@dataclass(frozen=True)
class QuantLinearShape:
    n: int
    k: int
    weight_format: str
    act: str
    act_granularity: str
    bias: bool
    residual: bool


def quant_applies(op: Op, inputs: Sequence[TensorType | None], target: Target) -> QuantLinearShape | None:
    """The shape and formats when ``quant.cu`` implements this ``quantized_linear`` on ``target``."""
    if op.name != "quantized_linear" or not target.is_gpu:
        return None
    fmt, gran = getattr(op, "weight_format", ""), getattr(op, "weight_granularity", "")
    act, agran = getattr(op, "act_format", ""), getattr(op, "act_granularity", "token")
    ins = list(inputs) + [None] * (7 - len(inputs))
    x, w, s, s2, xs, bias, res = ins[:7]
    k = int(getattr(op, "in_features", 0))
    n = static_dim(w, 0)
    if x is None or w is None or s is None or n is None or k <= 0 or static_dim(x, -1) != k or n < 16:
        return None
    if x.dtype is not DType.bf16 or any(t is not None and t.dtype is not DType.bf16 for t in (bias, res)):
        return None
    if fmt == "fp8":
        if gran not in ("channel", "block") or w.dtype is not DType.f8e4m3fn or s.dtype is not DType.f32:
            return None
        if (act, agran) not in ACT_MODES or (act == "fp8" and agran == "tensor" and xs is None):
            return None
        if gran == "block":  # 128 x 128 blocks over whole 128-column blocks of K, scales [ceil(N / 128)][K / 128]
            block = tuple(int(b) for b in getattr(op, "block", ()) or FP8_BLOCK)
            blocks = (-(-n // FP8_BLOCK[0]), k // FP8_BLOCK[1])
            if block != FP8_BLOCK or k % FP8_BLOCK[1] or tuple(static_dim(s, i) for i in range(s.rank)) != blocks:
                return None
            fmt = "fp8_block"
    elif fmt == "nvfp4":
        if act != "none" or getattr(op, "scale_layout", "linear") != "linear" or s2 is None:
            return None
    else:
        return None
    if k % STEP_COLS[fmt]:
        return None
    return QuantLinearShape(n, k, fmt, act, agran, bias is not None, res is not None)


def _weight_only_variants(a: QuantLinearShape, target: Target, wb: int, skinny: bool) -> list[tuple[int, KernelSpec]]:
    """kernel.cu's weight-only variants of ``a`` (``quant_applies``) with weights of ``wb`` (1: e4m3, ``WB_NVFP4``)
    per bucket, the skinny GEMM's from bucket 16 on where it applies and ``skinny`` (``INGOT_GEMV_SKINNY_FP8`` /
    ``INGOT_GEMV_SKINNY_NVFP4``; bucket 8 keeps kernel.cu and its decode fusions: no prologue on the quantized skinny
    forms). NVFP4 weights with row groups in bucket 8 split it (``rule.nvfp4_split8_config``): the row groups up to
    ``NVFP4_SPLIT8_ROWS`` tokens, a cluster shape for the rest."""
    from . import skinny_rule

    def variant(mb: int) -> KernelSpec:
        spec = skinny_rule.rule_spec(a.n, a.k, mb, target, a.bias, a.residual, wb=wb) if skinny and mb > 8 else None
        return spec or gemv_spec(a.n, a.k, mb, target, a.bias, a.residual, wb=wb)

    out = [(mb, variant(mb)) for mb in BUCKETS]
    split = nvfp4_split8_config(a.n, a.k, target.num_sms or 132) if wb == WB_NVFP4 else None
    if split is not None:
        out[:1] = [(NVFP4_SPLIT8_ROWS, out[0][1]),
                   (BUCKETS[0], gemv_spec(a.n, a.k, BUCKETS[0], target, a.bias, a.residual, config=split, wb=wb))]
    return out


def quant_variants(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[tuple[int, KernelSpec]]:
    """(max rows, spec) per token bucket, smallest first; empty when ``quant.cu`` does not apply. FP8 weight-only
    buckets are ``kernel.cu``'s with ``INGOT_GEMV_FP8=kernel`` (``fp8_template``); with ``INGOT_GEMV_BULK=all``
    ``bulk.cu``'s where a configuration fits (``bulk_rule.bulk_quant_spec``; slower than ``quant.cu`` on the H200,
    so only on that request)."""
    a = quant_applies(op, inputs, target)
    if a is None:
        return []
    from . import bulk_rule, skinny_rule

    if a.weight_format == "fp8" and a.act == "none":  # weight-only FP8: bulk.cu on request, else INGOT_GEMV_FP8's
        template = fp8_template()  # read (and checked) either way
        if bulk_rule.fp8_enabled():
            return [(mb, bulk_rule.bulk_quant_spec(a.n, a.k, mb, target, a.bias, a.residual)
                     or quant_gemv_spec(a.n, a.k, mb, target, "fp8", "none", a.act_granularity, a.bias, a.residual))
                    for mb in BUCKETS]
        if template == "kernel.cu":
            return _weight_only_variants(a, target, 1, skinny_rule.fp8_on())
    if a.weight_format == "nvfp4" and nvfp4_template() == "kernel.cu":  # weight-only NVFP4 (quant_applies)
        return _weight_only_variants(a, target, WB_NVFP4, skinny_rule.nvfp4_on())
    return [(mb, quant_gemv_spec(a.n, a.k, mb, target, a.weight_format, a.act, a.act_granularity, a.bias,
                                 a.residual)) for mb in BUCKETS]


def quant_plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
    """The node's own launch: the any-M kernel (its small-M variants come from ``quant_variants``)."""
    a = quant_applies(op, inputs, target)
    if a is None:
        return None
    return [quant_gemv_spec(a.n, a.k, ANY_M_CHUNK, target, a.weight_format, a.act, a.act_granularity, a.bias,
                            a.residual, any_m=True)]
