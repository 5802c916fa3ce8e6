"""What autotuning (``codegen/autotune.py``) may change in a decode GEMV variant, and what it times it on.

A variant's configuration (``rule.gemv_config`` / ``quant_rule.quant_config``) is warps per CTA, 16-row tiles per
warp, steps per load stage and the split-K count, from tables swept on one H200. Candidates: the heuristic's shape
with half and twice its split-K, and the other shapes of the sweep with the split-K the rule derives for them (each
valid by construction: the rule's own functions build them). Workloads: the bucket's two edges, ``M`` = the
previous bucket + 1 and ``M`` = the bucket (a decode CUDA graph of that batch size runs exactly this variant); the
weights rotate over copies so each launch streams them from HBM. The any-M quantized launch (prefill) is not tuned,
nor are fused variants (``rule.fused_spec``): the lowering makes them after tuning, with the tuned plain variant's
configuration.

**Bucket 8 keeps the heuristic in a compile** (``COMPILE_SKIPS_BUCKETS``, ``Tunable.in_compile``): timed alone, the
1B model's qkv and o GEMVs at bucket 8 ran 6% faster with 8 warps in row groups of 8 than with the rule's 4 warps in
row groups of 4, and the tuner took them; end to end (H200, twelfth session, docs/PERF.md "Autotuning in the model")
the batch-1 decode then ran 17% slower in BF16 (898 vs 1,078 tok/s, 2 alternating runs each) and 8% slower with FP8
weights, while batch 64 gained 0.6-1.3%. Batch 1's GEMVs run in a chain with programmatic dependent launch, where
the next kernel's early CTAs share the SMs with the running one, which a kernel timed alone does not show (the ninth
session saw the same for these shapes, docs/PERF.md "Row groups in the decode GEMV"). ``bench/bench_autotune.py``
still times bucket 8's candidates.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...autotune import Tunable, Workload, random_array
from ...kernel import KernelSpec
from ...target import Target
from .quant_rule import WEIGHT_FORMATS, QuantGemvConfig, quant_config, quant_gemv_spec
from .rule import BUCKETS, WB_NAMES, gemv_config, gemv_spec

#: (warps, tiles per warp, steps per stage) tried besides the heuristic's (bench/bench_gemv.py --sweep's best ones)
SHAPES = ((4, 1, 8), (8, 1, 4), (4, 1, 4), (8, 2, 2))
#: the spec values candidates differ in (both templates'; KW: the warps of a row group, ``GemvConfig.kwarps``; CLUSTER:
#: split-K in a cluster, kernel.cu's, ``GemvConfig.cluster``)
KNOBS = ("WARPS", "MT", "U", "SPLITK", "KS", "KW", "CLUSTER")
#: quant.cu's AFMT -> (act_format, act_granularity)
ACTS = {0: ("none", "token"), 1: ("fp8", "token"), 2: ("fp8", "tensor")}


def _tries(v: Mapping) -> list[dict[str, int | None]]:
    """Keyword arguments of the config functions for each candidate besides the heuristic (kernel.cu's and
    quant.cu's: with the heuristic's warps a row group, ``kwarps``; and where that is over 1, its shape without, as
    measured before)."""
    w, t, u, sk = int(v["WARPS"]), int(v["MT"]), int(v["U"]), int(v["SPLITK"])
    tries: list[dict[str, int | None]] = [dict(warps=w, tiles=t, stage_steps=u, splitk=s)
                                          for s in (sk // 2, sk * 2) if s >= 1]
    kw = int(v.get("KW", 1))
    if kw > 1:
        tries = [dict(warps=w, tiles=t, stage_steps=u, splitk=s, kwarps=kw) for s in (sk // 2, sk * 2) if s >= 1]
        tries.append(dict(warps=w, tiles=t, stage_steps=u, splitk=None, kwarps=1))
    return tries + [dict(warps=a, tiles=b, stage_steps=c, splitk=None) for a, b, c in SHAPES]


def bf16_candidates(spec: KernelSpec, target: Target) -> list[KernelSpec]:
    """``kernel.cu``'s candidates (bf16 weights, FP8 ones: ``WB`` 1, NVFP4 ones: ``WB`` 0)."""
    v = dict(spec.values)
    n, k, mb, wb = int(v["N"]), int(v["K"]), int(v["MB"]), int(v.get("WB", 2))
    out = [spec]
    for kw in _tries(v):
        try:
            cfg = gemv_config(n, k, mb, target.num_sms or 132, wb=wb, **kw)  # type: ignore[arg-type]
        except ValueError:  # a row group's partials would not fit x's region
            continue
        out.append(gemv_spec(n, k, mb, target, bool(v["HAS_BIAS"]), bool(v["HAS_RESIDUAL"]), config=cfg, wb=wb))
    return out


def quant_candidates(spec: KernelSpec, target: Target) -> list[KernelSpec]:
    v = dict(spec.values)
    n, k, mb = int(v["N"]), int(v["K"]), int(v["MB"])
    fmt = {code: name for name, code in WEIGHT_FORMATS.items()}[int(v["WFMT"])]
    act, gran = ACTS[int(v["AFMT"])]
    out = [spec]
    for kw in _tries(v):
        try:
            cfg: QuantGemvConfig = quant_config(n, k, mb, fmt, act, target.num_sms or 132, **kw)  # type: ignore[arg-type]
        except ValueError:  # the x slice (or a row group's partials) does not fit shared memory with this shape
            continue
        out.append(quant_gemv_spec(n, k, mb, target, fmt, act, gran, bool(v["HAS_BIAS"]), bool(v["HAS_RESIDUAL"]),
                                   config=cfg))
    return out


def _edges(mb: int) -> tuple[int, ...]:
    lower = max([b for b in BUCKETS if b < mb], default=0) + 1
    return (lower, mb) if lower < mb else (mb,)


def workloads(spec: KernelSpec, bounds: Mapping[str, int]) -> list[Workload]:
    v = dict(spec.values)
    n, k, mb = int(v["N"]), int(v["K"]), int(v["MB"])
    quant = spec.template == "quant.cu"
    # kernel.cu with e4m3 / NVFP4 weights (WB 1 / 0) takes a weight-only FP8 / NVFP4 quantized_linear's buffers (the
    # format's quant.cu code; bf16 weights: -1)
    wb_format = WEIGHT_FORMATS.get(WB_NAMES[int(v.get("WB", 2))], -1)
    wfmt, afmt = (int(v["WFMT"]), int(v["AFMT"])) if quant else (wb_format, 0)
    out = []
    for m in _edges(mb):
        bufs: dict[str, tuple[str, tuple[int, ...]]] = {"x": ("bfloat16", (m, k)), "out": ("bfloat16", (m, n))}
        if wfmt == 0:
            bufs.update(weight=("float8_e4m3fn", (n, k)), weight_scale=("float32", (n,)))
        elif wfmt == 1:
            bufs.update(weight=("uint8", (n, k // 2)), weight_scale=("float8_e4m3fn", (n, k // 16)),
                        weight_scale_2=("float32", (1,)))
        else:
            bufs["weight"] = ("bfloat16", (n, k))
        if afmt == 2:
            bufs["input_scale"] = ("float32", (1,))
        if v["HAS_BIAS"]:
            bufs["bias"] = ("bfloat16", (n,))
        if v["HAS_RESIDUAL"]:
            bufs["residual"] = ("bfloat16", (m, n))

        def fill(rng: np.random.Generator, bufs=bufs) -> dict[str, np.ndarray]:
            arrays = {}
            for name, (dt, shape) in bufs.items():
                a = random_array(dt, shape, rng, 0.05 if name == "weight" else 1.0)
                arrays[name] = np.abs(a) * 1e-2 + 1e-3 if dt == "float32" else a  # scales: small and positive
            return arrays

        out.append(Workload(f"M={m}", {"M": m}, bufs, fill,
                            ("weight", "weight_scale") if wfmt == 1 else ("weight",)))
    return out


def _is(template: str):
    # fused variants (a PROLOGUE, codegen/decode_fusion.py) are made after tuning from the tuned plain variant
    return lambda s: (s.family == "gemv" and s.template == template and not dict(s.values).get("ANY_M", False)
                      and not dict(s.values).get("PROLOGUE", 0))


#: buckets whose variants a compile does not tune (the module docstring): batch 1's
COMPILE_SKIPS_BUCKETS = (8,)


def _in_compile(spec: KernelSpec) -> bool:
    return int(dict(spec.values)["MB"]) not in COMPILE_SKIPS_BUCKETS


TUNABLES = [
    Tunable("gemv-bf16", _is("kernel.cu"), bf16_candidates, workloads, KNOBS, in_compile=_in_compile),
    Tunable("gemv-quant", _is("quant.cu"), quant_candidates, workloads, KNOBS, in_compile=_in_compile),
]
