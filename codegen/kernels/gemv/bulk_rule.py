"""Bulk-copy decode GEMV (``bulk.cu``): the bf16 ``linear`` variants with weights fetched by ``cp.async.bulk``.

Opt-in at compile time (``mode``): with ``INGOT_GEMV_BULK=1`` ``rule.variants`` makes the plain variant of each
token bucket up to ``MAX_BUCKET`` with this template where ``bulk_config`` finds a configuration, and with
``kernel.cu`` otherwise; ``=all`` every bucket, and the FP8 variants below. Same parameters (``rule.PARAMS``),
buckets and numerics as ``kernel.cu``. On the H200 (docs/PERF.md, "Bulk-copy GEMV"; every GPU test passes): a
16-layer GEMV chain at M = 1 runs 1.17x kernel.cu's speed, but end to end on the 1B shape it is within 1% of the
default once decode fusion is on (12% slower without it), hence opt-in.

**Prologues** (``codegen/decode_fusion.py``): ``rule.fused_spec`` makes a bulk variant's fused variants here too
(``fused_bulk_spec``), with kernel.cu's prologues, semantics and parameters (``rms_norm``: ``norm_weight`` after
``rule.PARAMS``; packed ``swiglu``: x is the ``[M, 2K]`` gate_up buffer): the raw slices are bulk-copied after the
wait and turned into x in place (the template's header). The plain variant's configuration is kept, with fewer ring
stages where the larger x region (swiglu: gate and up, twice x's bytes; rms_norm: the norm weight's slice) needs
the room; where even two stages do not fit, ``bulk_config`` picks one for the prologue, and where none fits the
fused variant is ``kernel.cu``'s (``rule.fused_spec``). GPU tests: ``tests/codegen/test_decode_fusion_gpu.py``.

**FP8 weights** (``bulk_quant_spec``; ``quant_rule.quant_variants`` with ``INGOT_GEMV_BULK=all``): ``quantized_linear``
with e4m3 weights, per-output-channel f32 scales and bf16 activations (weight-only) gets bulk variants too, with
``quant.cu``'s parameters (``quant_rule.PARAMS``): the ring holds 1 byte a weight, fragments are converted to bf16 in
registers, the channel scale is applied in the epilogue (the template's header). NVFP4 weights and FP8 activations stay
on ``quant.cu``. Correct on the H200, but 0.51-0.75x ``quant.cu``'s speed, so only on request.

**Why.** ``kernel.cu`` streams weights through registers: its bytes in flight per SM are bounded by registers, and
under programmatic dependent launch only its first register stage may load before the grid-dependency wait. Here
each warp owns 16 x ``tiles`` rows of the CTA's tile and a ring of ``stages`` shared-memory stages of
``stage_cols`` columns, filled by 1-D bulk copies (one per row piece) *before* the wait: a small matrix (the 1B
model's qkv and o: <= ~100 KB per SM) is then read almost whole while the previous kernel finishes. The template's
header has the details.

**Configuration** (``bulk_config``): the CTA's shared memory (x's K slice for ``mb`` tokens plus the warps' rings)
stays within ``SMEM_BUDGET`` so that two CTAs (this kernel's and the next one's) fit on one SM of the H200 (228 KB).
Over warps per CTA (``WARPS``), tiles per warp, split-K and stage widths (``STAGE_COLS``), the configuration with the
least estimated time wins: bytes per SM on the critical path (waves x the CTA's tile), plus the split-K partials
and a fixed cost per split, plus a cost per bulk copy, less a share for the part of the tile fetched before the wait.
A bucket with no configuration (x's slice too large for the budget even when split) keeps ``kernel.cu``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...kernel import GridDim, KernelSpec
from ...switches import env_choice
from ...target import Target
from .quant_rule import PARAMS as QUANT_PARAMS
from .rule import BUCKETS, PARAMS, PROLOGUES, Prologue

ENV = "INGOT_GEMV_BULK"
#: dynamic shared memory per CTA (bytes): two CTAs per SM on the H200 (228 KB, 1 KB reserved per CTA, barriers)
SMEM_BUDGET = 110 * 1024
#: split-K workspace per variant (bytes): a module-scope device array (``SPLITK x row blocks x BN x MB`` f32) that
#: lives as long as the artifact's module, one per variant; a configuration over it is not taken (a bucket with none
#: keeps kernel.cu: the lm_head at 64 tokens would otherwise hold 131-263 MB)
WORKSPACE_BUDGET = 64 << 20
#: stage widths (columns; multiples of 64 keep ldmatrix conflict-free with 16-byte row padding)
STAGE_COLS = (512, 256, 128)
#: warps per CTA tried
WARPS = (2, 3, 4, 6, 8)
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
#: cost model, in bytes of weight traffic per SM: each wave of CTAs past the first (setup, x staging and the
#: ring's fill no longer overlap anything), a split-K reduction's fixed cost, one bulk copy's issue, x's bytes per
#: CTA (from L2: a fraction), and the share of the first CTA's tile fetched before the grid-dependency wait that
#: overlaps the previous kernel
WAVE_COST, SPLIT_COST, COPY_COST, X_SHARE, PREFETCH_SHARE = 16384, 8192, 32, 0.25, 0.5


@dataclass(frozen=True)
class BulkConfig:
    warps: int
    tiles: int  # MT: 16-row tiles per warp (a lane per row: at most 2)
    splitk: int
    slice_k: int  # KS
    stage_cols: int  # SC
    stages: int  # S: ring slots per warp

    @property
    def rows(self) -> int:
        """Rows of w per CTA (BN)."""
        return 16 * self.tiles * self.warps


#: token buckets whose plain bf16 variant is this template's under ``INGOT_GEMV_BULK=1``. Measured on the H200
#: (docs/PERF.md, "Bulk-copy GEMV"): a 16-layer qkv/o/gate_up/down chain with PDL in one CUDA graph runs 1.17x
#: (M = 1) and 1.11x (M = 8) kernel.cu's speed in bucket 8, but 0.79x at M = 32 (bucket 32), where the ring's
#: shallower stages and x's larger slice leave too few bytes in flight.
MAX_BUCKET = 8


def mode() -> str:
    """``INGOT_GEMV_BULK``: ``off`` (unset or 0), ``on`` (1: bf16 buckets up to ``MAX_BUCKET``, where it was
    measured faster) or ``all`` (every bf16 bucket and the FP8 weight-only variants: for benchmarks; the FP8 ones
    ran at ~0.7x quant.cu's speed on the H200)."""
    return env_choice(ENV, {"": "off", "0": "off", "1": "on", "all": "all"}, "0, 1 or all")


def enabled() -> bool:
    """``INGOT_GEMV_BULK`` set (and not 0): some plain bf16 GEMV variants use this template (``uses``)."""
    return mode() != "off"


def uses(mb: int) -> bool:
    """The plain bf16 variant of token bucket ``mb`` is this template's (when a configuration fits)."""
    m = mode()
    return m == "all" or (m == "on" and mb <= MAX_BUCKET)


def fp8_enabled() -> bool:
    """FP8 weight-only ``quantized_linear`` variants use this template (``INGOT_GEMV_BULK=all`` only)."""
    return mode() == "all"


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def x_bytes(mb: int, slice_k: int, prologue: str = "none", wb: int = 2) -> int:
    """Shared memory before the rings: x's slice ``[mb][KS + 8]`` bf16 (``[mb][KS + 16]`` beside FP8 weights,
    ``wb`` = 1; swiglu: gate's and up's; rms_norm: then the norm weight's ``KS`` columns)."""
    rows = mb * (2 if prologue == "swiglu" else 1)
    return rows * (2 * slice_k + (16 if wb == 2 else 32)) + (2 * slice_k if prologue == "rms_norm" else 0)


def stage_bytes(cfg: BulkConfig, wb: int = 2) -> int:
    """One ring stage of all the CTA's warps: ``[16 MT][SC]`` weights of ``wb`` bytes, rows padded by 16 bytes."""
    return cfg.warps * 16 * cfg.tiles * (wb * cfg.stage_cols + 16)


def smem_bytes(mb: int, cfg: BulkConfig, prologue: str = "none", wb: int = 2) -> int:
    """Dynamic shared memory: x's region (``x_bytes``), then the warps' rings."""
    return x_bytes(mb, cfg.slice_k, prologue, wb) + cfg.stages * stage_bytes(cfg, wb)


def workspace_bytes(n: int, mb: int, cfg: BulkConfig) -> int:
    """The template's split-K workspace for ``w[n, :]`` at ``M <= mb`` (0 without split-K)."""
    return cfg.splitk * -(-n // cfg.rows) * cfg.rows * mb * 4 if cfg.splitk > 1 else 0


def _cost(n: int, k: int, mb: int, num_sms: int, c: BulkConfig, wb: int = 2) -> float:
    waves = -(-(-(-n // c.rows) * c.splitk) // num_sms)
    tile = c.rows * c.slice_k * wb
    split = c.rows * mb * 4 * c.splitk + SPLIT_COST if c.splitk > 1 else 0
    copies = c.rows * (c.slice_k // c.stage_cols) + mb
    ring = c.stages * c.stage_cols * c.rows * wb
    return (waves * (tile + X_SHARE * mb * c.slice_k * 2) + (waves - 1) * WAVE_COST + split + copies * COPY_COST
            - PREFETCH_SHARE * min(tile, ring))


def bulk_config(n: int, k: int, mb: int, num_sms: int, budget: int = SMEM_BUDGET,
                prologue: str = "none", wb: int = 2) -> BulkConfig | None:
    """The configuration for ``w[n, k]`` and ``M <= mb`` (see the module docstring), or None when none fits
    (``prologue``: the x region of that prologue, ``x_bytes``; ``wb``: bytes per weight, 1 for FP8)."""
    if k % 32 or mb not in BUCKETS:
        return None
    best: tuple[float, BulkConfig] | None = None
    for warps in WARPS:
        for tiles in (1, 2):
            if tiles > 1 and -(-n // (16 * warps)) < num_sms:  # two tiles a warp only where rows are plentiful
                continue
            for sc in STAGE_COLS:
                for split in SPLITS:
                    ks = _round_up(-(-k // split), sc)
                    splitk = -(-k // ks)
                    if splitk != split:  # the same slices as a smaller split
                        continue
                    x = x_bytes(mb, ks, prologue, wb)
                    per_stage = warps * 16 * tiles * (wb * sc + 16)
                    stages = min((budget - x) // per_stage, ks // sc) if budget > x else 0
                    if stages < min(2, ks // sc):
                        continue
                    c = BulkConfig(warps, tiles, splitk, ks, sc, stages)
                    if workspace_bytes(n, mb, c) > WORKSPACE_BUDGET:
                        continue
                    cost = _cost(n, k, mb, num_sms, c, wb)
                    if best is None or cost < best[0]:
                        best = (cost, c)
    return best[1] if best else None


def bulk_spec(n: int, k: int, mb: int, target: Target, bias: bool = False, residual: bool = False,
              config: BulkConfig | None = None, prologue: Prologue | None = None) -> KernelSpec | None:
    """The bulk-copy variant for ``M <= mb`` of ``linear`` with bf16 ``x[M, k]``, ``w[n, k]`` (params as
    ``rule.gemv_spec``'s, and ``norm_weight`` after them with an ``rms_norm`` prologue), or None when no
    configuration fits the shared-memory budget."""
    if k % 32 or mb not in BUCKETS:
        raise ValueError(f"gemv bulk: K must be a multiple of 32 (got {k}) and mb one of {BUCKETS} (got {mb})")
    pro = prologue or Prologue()
    cfg = config or bulk_config(n, k, mb, target.num_sms or 132, prologue=pro.kind)
    if cfg is None:
        return None
    smem, limit = smem_bytes(mb, cfg, pro.kind), target.smem_per_block or 227 * 1024
    if smem + 1024 > limit:
        raise ValueError(f"gemv bulk: {smem} bytes of shared memory for M <= {mb}, {pro.kind} prologue: more than "
                         f"the target's {limit}")
    values = {"N": n, "K": k, "MB": mb, "WARPS": cfg.warps, "MT": cfg.tiles, "KS": cfg.slice_k, "SPLITK": cfg.splitk,
              "SC": cfg.stage_cols, "S": cfg.stages, "HAS_BIAS": bias, "HAS_RESIDUAL": residual,
              "PROLOGUE": PROLOGUES[pro.kind], "EPS": float(pro.eps), "ALPHA": float(pro.alpha), "WB": 2}
    tag = f"gemv_bulk_bf16_n{n}_k{k}_m{mb}" + ("" if pro.kind == "none" else f"_{pro.kind}")
    params = PARAMS + [("norm_weight", "ptr")] if pro.kind == "rms_norm" else PARAMS
    what = "" if pro.kind == "none" else f", {pro.kind} prologue"
    return KernelSpec.make("gemv", "bulk.cu", tag, target.arch or "", values, params, 32 * cfg.warps,
                           [GridDim(const=-(-n // cfg.rows)), GridDim(const=cfg.splitk)], smem=smem,
                           doc=f"decode GEMV (bulk copies), M <= {mb}, {cfg.rows} rows x split-K {cfg.splitk} x "
                               f"{cfg.slice_k}, {cfg.stages} stages of {cfg.stage_cols} columns{what}")


def fused_bulk_spec(plain: KernelSpec, prologue: Prologue, target: Target) -> KernelSpec | None:
    """``plain`` (a plain bulk variant) with ``prologue`` (module docstring, **Prologues**): its configuration with
    as many ring stages as the budget leaves beside the prologue's x region, else ``bulk_config``'s for the
    prologue; None when neither fits (the caller falls back to ``kernel.cu``)."""
    v = dict(plain.values)
    n, k, mb = int(v["N"]), int(v["K"]), int(v["MB"])
    cfg: BulkConfig | None = spec_config(plain)
    assert cfg is not None
    room = SMEM_BUDGET - x_bytes(mb, cfg.slice_k, prologue.kind)
    stages = min(cfg.stages, room // stage_bytes(cfg)) if room > 0 else 0
    if stages >= min(2, cfg.slice_k // cfg.stage_cols):
        cfg = replace(cfg, stages=stages)
    else:
        cfg = bulk_config(n, k, mb, target.num_sms or 132, prologue=prologue.kind)
    if cfg is None:
        return None
    return bulk_spec(n, k, mb, target, bool(v["HAS_BIAS"]), bool(v["HAS_RESIDUAL"]), config=cfg, prologue=prologue)


def spec_config(spec: KernelSpec) -> BulkConfig:
    """The configuration a bulk spec was made with (``bulk_spec(..., config=spec_config(s))`` rebuilds ``s``)."""
    v = dict(spec.values)
    return BulkConfig(int(v["WARPS"]), int(v["MT"]), int(v["SPLITK"]), int(v["KS"]), int(v["SC"]), int(v["S"]))


def bulk_quant_spec(n: int, k: int, mb: int, target: Target, bias: bool = False, residual: bool = False,
                    config: BulkConfig | None = None) -> KernelSpec | None:
    """The bulk-copy variant for ``M <= mb`` of a weight-only ``quantized_linear``: bf16 ``x[M, k]``, e4m3
    ``w[n, k]`` with f32 ``weight_scale[n]`` (params ``quant_rule.PARAMS``), or None when no configuration fits."""
    if k % 64 or mb not in BUCKETS:
        raise ValueError(f"gemv bulk fp8: K must be a multiple of 64 (got {k}) and mb one of {BUCKETS} (got {mb})")
    cfg = config or bulk_config(n, k, mb, target.num_sms or 132, wb=1)
    if cfg is None:
        return None
    smem, limit = smem_bytes(mb, cfg, wb=1), target.smem_per_block or 227 * 1024
    if smem + 1024 > limit:
        raise ValueError(f"gemv bulk fp8: {smem} bytes of shared memory for M <= {mb}: more than the target's {limit}")
    values = {"N": n, "K": k, "MB": mb, "WARPS": cfg.warps, "MT": cfg.tiles, "KS": cfg.slice_k, "SPLITK": cfg.splitk,
              "SC": cfg.stage_cols, "S": cfg.stages, "HAS_BIAS": bias, "HAS_RESIDUAL": residual, "PROLOGUE": 0,
              "EPS": 0.0, "ALPHA": 1.0, "WB": 1}
    return KernelSpec.make("gemv", "bulk.cu", f"gemv_bulk_fp8_a16_n{n}_k{k}_m{mb}", target.arch or "", values,
                           QUANT_PARAMS, 32 * cfg.warps, [GridDim(const=-(-n // cfg.rows)), GridDim(const=cfg.splitk)],
                           smem=smem, doc=f"fp8 weights, bf16 activations (bulk copies), M <= {mb}, {cfg.rows} rows x "
                                          f"split-K {cfg.splitk} x {cfg.slice_k}, {cfg.stages} stages of "
                                          f"{cfg.stage_cols} columns")
