"""What autotuning (``codegen/autotune.py``) may change in a CUTLASS ``linear`` GEMM on h100/h200, and what it
times it on.

The kernels are shape-generic and shared by every linear of one configuration, but the best configuration depends
on the shape, so tuning is per launch shape: the lowering asks about each launch's *shaped* spec
(``cutlass_params.tuning_spec``: the generic spec with the launch's N, K, row dimension and bias in its values) and
compiles the generic spec of the answer (``cutlass_params.kernel_spec``, this tunable's ``kernel``), so shapes that
choose the same configuration still share one build. The heuristic is ``rule.shape_config``'s choice.

Candidates: the kind's ``rule.SM90_CANDIDATES`` (bf16: 6; FP8: 8 with f32 promotion, 4 FP8FastAccum, as many as
``autotune.MAX_CANDIDATES`` keeps; each a 1-2 minute nvcc build of the cubin and its Params probe, cached afterwards)
with the heuristic's epilogue; for FP8 only those with the heuristic's accumulation (``FP8FastAccum`` changes the
numerics: not a speed knob; the overlapped promotion, swizzle and raster order keep CUTLASS's promotion numerics, so
they are candidates). b200 has one configuration per kind: nothing to tune. Workload: one, ``M`` = the launch's
compiled row count (its row bound from the artifact's bindings, e.g. ``T`` = the step token budget, or the static
count), random x, weights rotating over copies so that each launch reads them from HBM as in a model's step.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...autotune import Tunable, Workload, random_array
from ...kernel import KernelSpec
from ...target import Target
from . import cutlass_params as cp
from .rule import OPERANDS, Config, candidate_configs, weight_scales_reason

KNOBS = ("TILE_M", "TILE_N", "TILE_K", "CLUSTER_M", "CLUSTER_N", "SCHEDULE", "EPILOGUE_SCHEDULE", "OVERLAP_PROMOTION",
         "MAX_SWIZZLE", "RASTER", "EPI_N", "DIRECT_EPILOGUE")
#: rows timed where the launch's row bound is not among the bindings (lower.py's default step budget)
DEFAULT_ROWS = 2048
#: operand kind -> the numpy dtype name of x and w in the timing buffers
STORAGE = {"bf16": "bfloat16", "fp8": "float8_e4m3fn"}
FAST_ACCUM = "FP8FastAccum"


def kind_of(spec: KernelSpec) -> str:
    return next(kind for kind, (ctype, _, _) in OPERANDS.items() if ctype == spec.value("A_TYPE"))


def config_of(spec: KernelSpec) -> Config:
    """The configuration a CUTLASS spec was made with (its knobs)."""
    v = dict(spec.values)
    return Config(spec.template, (int(v["TILE_M"]), int(v["TILE_N"]), int(v["TILE_K"])),
                  (int(v["CLUSTER_M"]), int(v["CLUSTER_N"])), two_sm=bool(v["TWO_SM"]), schedule=str(v["SCHEDULE"]),
                  threads=spec.block[0], overlap=bool(v["OVERLAP_PROMOTION"]), swizzle=int(v["MAX_SWIZZLE"]),
                  raster=str(v["RASTER"]), epi_n=int(v.get("EPI_N", 0)),
                  direct=bool(v.get("DIRECT_EPILOGUE", False)))


def matches(spec: KernelSpec) -> bool:
    """Shaped sm_90a generic specs of a kind with candidates (plain generic specs carry no shape to time)."""
    values = dict(spec.values)
    return (cp.is_generic(spec) and spec.template == "sm90.cu" and "ROWS" in values
            and kind_of(spec) in STORAGE)


def candidates(spec: KernelSpec, target: Target) -> list[KernelSpec]:
    kind, fast = kind_of(spec), FAST_ACCUM in str(spec.value("SCHEDULE"))
    n, k, rows = int(spec.value("N")), int(spec.value("K")), spec.value("ROWS")
    out = [spec]
    scales = cp.weight_scales(spec)
    for cfg in candidate_configs(kind, target):
        if (FAST_ACCUM in cfg.schedule) != fast or weight_scales_reason(kind, cfg, scales):
            continue
        generic = cp.generic_linear_spec(kind, target, residual=bool(spec.value("HAS_RESIDUAL")), config=cfg,
                                         weight_scales=scales)
        out.append(cp.shaped(generic, n, k, rows if isinstance(rows, str) else int(rows), bool(spec.value("HAS_BIAS"))))
    return out


def rows_of(spec: KernelSpec, bounds: Mapping[str, int]) -> int:
    rows = spec.value("ROWS")
    if isinstance(rows, int) and not isinstance(rows, bool):
        return max(1, rows)
    return max(1, int(bounds.get(str(rows), bounds.get("T", DEFAULT_ROWS))))


def workloads(spec: KernelSpec, bounds: Mapping[str, int]) -> list[Workload]:
    m, n, k = rows_of(spec, bounds), int(spec.value("N")), int(spec.value("K"))
    store = STORAGE[kind_of(spec)]
    bufs: dict[str, tuple[str, tuple[int, ...]]] = {
        "x": (store, (m, k)), "weight": (store, (n, k)), "out": ("bfloat16", (m, n))}
    if store != "bfloat16":
        scales = cp.weight_scales(spec)
        kb = -(-k // 128)
        bufs["weight_scale"] = ("float32", {"channel": (n,), "tensor": (1,), "block": (-(-n // 128), -(-kb // 4) * 4),
                                            "block-rows": (-(-n // 128), kb)}[scales])
        if scales == "block":  # x's scales per row and 128 columns (rule.linear_cutlass_spec's layout)
            bufs["x_scale"] = ("float32", (kb, m))
    if spec.value("HAS_BIAS"):
        bufs["bias"] = ("bfloat16", (n,))
    if spec.value("HAS_RESIDUAL"):
        bufs["residual"] = ("bfloat16", (m, n))

    def fill(rng: np.random.Generator) -> dict[str, np.ndarray]:
        arrays = {}
        for name, (dt, shape) in bufs.items():
            a = random_array(dt, shape, rng, 0.05 if name == "weight" else 1.0)
            arrays[name] = np.abs(a) * 1e-2 + 1e-3 if dt == "float32" else a  # scales: small and positive
        return arrays

    return [Workload(f"M={m} N={n} K={k}", {"M": m}, bufs, fill, ("weight",))]


TUNABLES = [Tunable("cutlass-linear-sm90", matches, candidates, workloads, KNOBS, kernel=cp.kernel_spec)]
