"""CUTLASS GEMMs launched from the cubin alone: the kernel's Params blob built in Python.

A CUTLASS kernel takes one by-value argument, ``GemmKernel::Params``: TMA descriptors, the problem
shape, pointers and scalars of the epilogue, the tile scheduler's parameters and hardware info.
``build.py``'s host shim builds it with CUTLASS's own ``to_underlying_arguments``, but a shim is native
code and an artifact's loading never executes shipped code (``shared/DESIGN.md``, "Artifact"). So:

1. **At compile time** (``params_layout``), a *probe* (``probe.cuh`` appended to the spec's source; a
   host program built with nvcc and run here, never shipped) calls ``to_underlying_arguments`` for
   sentinel pointers and a few (M, N, K), with ``cuTensorMapEncodeTiled`` replaced by a recorder.
   From its output this module derives the *layout*: the blob size, the constant bytes, where each
   pointer goes, where each TMA descriptor goes and the arguments it is encoded with (dims and
   strides as ``coef * symbol`` over M, N, K and ceiling quotients such as ``K/64``), where the problem shape,
   SM count and scheduler fields are, any other 32-bit integer that depends on the shape (``ints``: the
   block-scaled mainloop's scale-factor layouts), and the launch configuration. The layout is then checked:
   rebuilt in Python for other shapes, every non-padding byte and the grid must equal the probe's, else
   ``LayoutError``.
2. **At load/launch time** (``build_params``), the runtime fills a copy of the constant bytes with
   the pointers, M/N/K, SM count and scheduler fields, and the descriptors encoded by
   ``cuTensorMapEncodeTiled`` (``cuda.bindings.driver``; ``tma_encoder``), then launches the cubin
   with ``cuLaunchKernelEx`` and the cluster dimension attribute (``launch``). The layout is JSON in
   the kernel table (``kernels[entry]["cutlass"]``).

The kernel itself is shape-generic (M, N, K are all run-time values), so the lowering uses one
*generic* spec per (kind, residual, configuration, target) (``generic_linear_spec``): SmolLM2 and the tiny Llama
share one ~40 s build. N and K come from the weight buffer's shape at launch. The configuration (tile, cluster,
schedule) is chosen per linear from its N and K (``rule.shape_config``), so linears whose shapes favour different
configurations run different builds, and all linears of one configuration share one.

Autotuning (``codegen/autotune.py``, ``tune.py``) tunes per launch shape while kernels stay shape-generic: the
lowering hands it each launch's *shaped* spec (``tuning_spec``: the generic spec with the launch's N, K and row
dimension in its values; never compiled), and what is compiled for a shaped spec is ``kernel_spec`` of it.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import struct
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import product
from pathlib import Path
from typing import Any

from ....ir.graph import Node
from ...compile import (
    CompiledKernel,
    CompileError,
    cache_dir,
    cached_build,
    compile_source,
    key_options,
    nvcc_path,
    nvcc_version,
    write_entry,
)
from ...kernel import KernelSpec
from ...switches import env_on
from ...target import Target
from .build import _jobs, cutlass_available, cutlass_options
from .rule import (
    OPERANDS,
    WEIGHT_SCALES,
    WEIGHT_SCALES_SUFFIX,
    Config,
    auto_swizzle,
    config_tag,
    linear_cutlass_spec,
    plan,
    rasterizes_along_m,
    shape_config,
    short_m_configs,
    sm90_blocks,
    variant_config,
    weight_scales_reason,
)

LAYOUT_VERSION = 1
#: the probe's pointer arguments, in order (sentinel i is SENTINEL + ((i + 1) << 32))
POINTERS = ("x", "weight", "x_block_scale", "weight_block_scale", "x_scale", "weight_scale", "bias", "residual",
            "out")
#: the generic spec's parameters: ``linear``'s launch arguments (codegen/lower.py bind_args), no N/K
LINEAR_PARAMS = [("x", "ptr"), ("weight", "ptr"), ("weight_scale", "ptr"), ("bias", "ptr"), ("residual", "ptr"),
                 ("out", "ptr"), ("M", "i64")]
#: the FP8 generic spec's: the same and x's per-row scale (W8A8 prefill, codegen/quant_prefill.py: the activation
#: quantizer's ``x_scale``)
FP8_LINEAR_PARAMS = [*LINEAR_PARAMS[:2], ("x_scale", "ptr"), *LINEAR_PARAMS[2:]]
ABI = "cutlass-layout-v1"
#: (M, N, K) the probe runs: the first derives the layout, all check it (M spans both raster orders)
PROBE_SHAPES = ((37, 424, 472), (1000, 136, 4104), (1, 2048, 64), (4096, 8, 8), (300, 1064, 200))
PROBE_SMS = 148
#: stack fills of the further runs of each shape (each its own process): bytes that differ between a shape's
#: runs are indeterminate (padding, or members CUTLASS leaves unset) and left 0
PROBE_FILLS = (255, 0, 90, 165)
TMA_BYTES = 128
_MARKER = 0x494E474F54000000  # "INGOT" + descriptor index, written by the probe's recorder
_SYMBOLS = ("", "M", "N", "K", "M*N", "M*K", "N*K",
            # the block-scaled kernels (sm100_blockscaled.cu): packed FP4 rows are K/2 bytes; scale factors come in
            # 128-row atoms of 4 columns (K/64 atoms of K for NVFP4's 16-element vectors, K/128 for MXFP4's 32)
            "K/2", "M/128", "N/128", "K/64", "K/128", "K/64*M/128", "K/64*N/128", "K/128*M/128", "K/128*N/128")
_COEFS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: PersistentTileSchedulerSm100Params: problem_tiles_{m,n,l} at 0, 4, 8; raster_order_ at 48 (56 bytes)
_SM100_SCHED = {"tiles_m": 0, "tiles_n": 4, "tiles_l": 8, "raster": 48, "size": 56}
#: PersistentTileSchedulerSm90Params (CUTLASS 4.2 ``tile_scheduler_params.h``): FastDivmodU64Pow2
#: divmod_cluster_shape_{major,minor}_ (u64 divisor, u32 shift; 16 bytes each) at 0 and 16, FastDivmodU64
#: divmod_batch_ and divmod_cluster_blk_major_ (u64 divisor, u64 multiplier, u32 shift, u32 round_up) at 32 and
#: 56, blocks_per_problem_ (u64) at 80, log_swizzle_size_ at 88, raster_order_ at 92, problem_tiles_{m,n,l}_ at
#: 96, 100, 104, cluster_shape_{m,n}_ at 108, 112 (120 bytes). Every field is written per launch (field_bytes).
_SM90_SCHED = {"major": 0, "minor": 16, "batch": 32, "blk_major": 56, "blocks": 80, "log_swizzle": 88,
               "raster": 92, "tiles_m": 96, "tiles_n": 100, "tiles_l": 104, "cluster_m": 108, "cluster_n": 112,
               "size": 120}
#: CUTLASS's GH100 assumption in get_max_cta_occupancy (SMs per GPC)
_SM90_MAX_SM_PER_GPC = 18


class LayoutError(RuntimeError):
    """The Params layout could not be derived or did not reproduce CUTLASS's blob."""


# -- the generic spec --------------------------------------------------------------------------------


def generic_linear_spec(kind: str, target: Target, residual: bool = False, config: Config | None = None,
                        weight_scales: str = "channel") -> KernelSpec:
    """One shape-generic CUTLASS ``linear`` kernel per (kind, residual, configuration, weight scale, target), taking
    ``linear``'s own launch arguments (``LINEAR_PARAMS``); the grid recorded is the persistent bound, the real one
    comes from the layout for each M. ``config`` defaults to the kind's (``variant_config``); another one is named in
    the entry (``linear_cutlass_bf16_coop256x128x64c1x2_...``). FP8 takes ``x_scale`` too (``FP8_LINEAR_PARAMS``);
    ``weight_scales``: ``rule.linear_cutlass_spec``'s (``tensor``: one f32, ``_wt`` in the name; ``block``: 1x128 x
    128x128 block scales, ``_wb``)."""
    default = variant_config(kind, target)
    cfg = config or default
    base = linear_cutlass_spec(kind, 0, 0, target, residual=residual, config=cfg, weight_scales=weight_scales)
    values = dict(base.values)
    values["ABI"] = ABI
    doc = (f"CUTLASS {kind} GEMM {cfg.template}, tile {'x'.join(map(str, cfg.tile))}, cluster "
           f"{cfg.cluster[0]}x{cfg.cluster[1]}, shape-generic; launched with a Params blob built from the "
           f"kernel table's layout (gemm_cutlass/cutlass_params.py, ABI {ABI})")
    name = (f"linear_cutlass_{kind}{'_res' if residual else ''}{WEIGHT_SCALES_SUFFIX[weight_scales]}"
            f"{'' if cfg == default else '_' + config_tag(cfg)}")
    params = FP8_LINEAR_PARAMS if kind == "fp8" else LINEAR_PARAMS
    return KernelSpec.make("gemm_cutlass", base.template, name, base.arch, values, params, base.block,
                           list(base.grid), smem=base.smem, doc=doc)


def is_generic(spec: KernelSpec) -> bool:
    """A shape-generic CUTLASS ``linear`` spec (compiled with a Params layout), shaped (``tuning_spec``) or not."""
    return spec.family == "gemm_cutlass" and dict(spec.values).get("ABI") == ABI


def plan_linear(node: Node, planned: KernelSpec, target: Target) -> KernelSpec | None:
    """The generic CUTLASS kernel to record as ``node``'s primary kernel instead of ``planned`` (the plain
    template GEMM, kept as the launch's alternative), or None: only bf16 ``linear`` on tcgen05 (b200) and
    wgmma (h100/h200) targets with K % 8 == 0 and N % 8 == 0, when nvcc and CUTLASS's headers are here (else
    the plain GEMM alone); ``INGOT_NO_CUTLASS=1`` leaves it out. Its configuration is ``rule.shape_config``'s for
    the weight's N and K. Small-M steps still run the GEMV variants (``codegen/lower.py``); the CUTLASS kernel takes
    the prefill-sized ones."""
    if os.environ.get("INGOT_NO_CUTLASS", "") not in ("", "0"):
        return None
    if node.op.name != "linear" or planned.family != "gemm" or not (target.tcgen05 or target.wgmma):
        return None
    specs = plan(node.op, [v.type if v is not None else None for v in node.inputs], target)
    if not specs or not cutlass_available():
        return None
    n, k = int(specs[0].value("N")), int(specs[0].value("K"))
    return generic_linear_spec("bf16", target, residual=bool(specs[0].value("HAS_RESIDUAL")),
                               config=shape_config("bf16", n, k, target))


#: compile-time switch: ``0`` leaves the short-step configurations out (``short_variants``); unset or ``1``: in
SHORT_M_ENV = "INGOT_CUTLASS_SHORT_M"


def linear_nk(node: Node) -> tuple[int, int]:
    """N and K of the GEMM a ``linear`` or ``quantized_linear`` node's CUTLASS launch computes (a quantized one's
    prefill GEMM reads the dequantized ``[N, in_features]`` weight, or the FP8 codes of that shape)."""
    w = node.inputs[1]
    assert w is not None and w.type.shape is not None
    n = int(w.type.shape[0])
    k = int(getattr(node.op, "in_features", 0)) if node.op.name == "quantized_linear" else int(w.type.shape[1])
    return n, k


def short_variants(node: Node, spec: KernelSpec, largest: int, target: Target) -> list[tuple[int, KernelSpec]]:
    """``(max rows, spec)`` for a generic CUTLASS launch ``spec`` at ``node`` whose variants end at ``largest`` rows:
    the same GEMM (kind, residual) in each ``rule.short_m_configs`` tier past ``largest`` rows (64-row tiles where
    the launch's own configuration leaves most SMs idle); none where that would not be so (wide matrices, other
    targets), for a spec other than a generic CUTLASS one, or with ``INGOT_CUTLASS_SHORT_M=0`` (another value than
    0 / 1: ``ValueError``). Their arguments are the launch's (the same parameters)."""
    if not env_on(SHORT_M_ENV) or not is_generic(spec):
        return []
    kind = "fp8" if spec.value("A_TYPE") == OPERANDS["fp8"][0] else "bf16"
    n, k = linear_nk(node)
    own = kernel_spec(spec).entry
    out = []
    scales = weight_scales(spec)
    for rows, cfg in short_m_configs(kind, n, k, target):
        if weight_scales_reason(kind, cfg, scales):  # (block scales: the default configuration's builds only)
            continue
        short = generic_linear_spec(kind, target, residual=bool(spec.value("HAS_RESIDUAL")), config=cfg,
                                    weight_scales=scales)
        if rows > largest and short.entry != own:
            out.append((rows, short))
    return out


def weight_scales(spec: KernelSpec) -> str:
    """A CUTLASS ``linear`` spec's weight scale granularity (``linear_cutlass_spec``'s ``weight_scales``)."""
    code = int(dict(spec.values).get("WEIGHT_SCALES", 0))
    return next(name for name, c in WEIGHT_SCALES.items() if c == code)


def _with_values(spec: KernelSpec, values: Mapping[str, Any]) -> KernelSpec:
    return KernelSpec.make(spec.family, spec.template, spec.name, spec.arch, values,
                           [(p.name, p.ctype) for p in spec.params], spec.block, list(spec.grid), spec.smem, spec.doc)


def tuning_spec(spec: KernelSpec | None, node: Node) -> KernelSpec | None:
    """What autotuning is asked about for the launch of ``spec`` at ``node``: for a generic CUTLASS spec, the same
    spec with the launch's N and K, its row dimension (a bound's name such as ``"T"``, or a static count: x's
    leading dims) and whether it has a bias in its values, so that each shape is tuned (autotuning is keyed by
    spec) while the kernels stay shared (``kernel_spec``); any other spec (or None) as it is."""
    if spec is None or not is_generic(spec) or int(spec.value("N")) != 0:
        return spec
    lead = list(node.inputs[0].type.shape or ())[:-1]
    named = [d for d in lead if not isinstance(d, int)]
    rows: int | str = str(named[0]) if named else math.prod(lead)
    # a quantized_linear's bias is input 5 (2 is the weight's scale)
    at = 5 if node.op.name == "quantized_linear" else 2
    bias = len(node.inputs) > at and node.inputs[at] is not None
    return shaped(spec, *linear_nk(node), rows, bias)


def shaped(spec: KernelSpec, n: int, k: int, rows: int | str, bias: bool) -> KernelSpec:
    """The generic ``spec`` with a launch's shape in its values (``tuning_spec``); a stand-in while tuning, never
    compiled."""
    return _with_values(spec, dict(spec.values) | {"N": n, "K": k, "ROWS": rows, "HAS_BIAS": bias})


def kernel_spec(spec: KernelSpec) -> KernelSpec:
    """The generic spec compiled for a shaped one: its shape values taken out again (other specs as they are)."""
    if not is_generic(spec) or "ROWS" not in dict(spec.values):
        return spec
    return _with_values(spec, {k: v for k, v in spec.values if k not in ("ROWS", "HAS_BIAS")} | {"N": 0, "K": 0})


# -- compile time: the probe and the layout ------------------------------------------------------


def _probe_source(spec: KernelSpec) -> str:
    return spec.source() + "\n" + (Path(__file__).with_name("probe.cuh")).read_text()


def _probe_options(spec: KernelSpec) -> tuple[str, ...]:
    return (*cutlass_options(), "-std=c++17", "-O0", "-DINGOT_HOST_SHIM", "-DCUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL",
            "-Xcompiler=-Wno-invalid-offsetof", f"-arch={spec.arch}")


def _run_probe(exe: Path, m: int, n: int, k: int, fill: int) -> dict[str, Any]:
    # No GPU visible to the probe: the Params are the *target's* (PROBE_SMS SMs), and CUTLASS's host code
    # asks the CUDA runtime about the local device where it can (the tile scheduler's occupancy query).
    # On a GPU host that answer came from the wrong chip (an H200 compiling for B200), the blob differed
    # from the derived layout in the scheduler's fields, and the b200 compile failed with LayoutError.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([str(exe), str(m), str(n), str(k), str(PROBE_SMS), str(fill)], capture_output=True,
                       text=True, timeout=120, env=env)
    if r.returncode != 0:
        raise LayoutError(f"the Params probe failed ({r.returncode}) for M={m} N={n} K={k}: {r.stderr[-2000:]}")
    tmas, out = [], None
    text = r.stdout
    for line in text.splitlines():
        if line.startswith('{"tma"'):
            tmas.append(json.loads(line))
    out = json.loads(text[text.index('{"size"'):])
    out["tma"] = tmas
    out["blob"] = bytes.fromhex(out["blob"])
    return out


def probe_shapes(spec: KernelSpec) -> tuple[tuple[int, int, int], ...]:
    """``PROBE_SHAPES`` with K rounded up to the operand kind's alignment (FP8: 16 elements, FP4: 32)."""
    align = max(a for ctype, _, a in OPERANDS.values() if ctype == spec.value("A_TYPE"))
    return tuple((m, n, _round_up(k, align)) for m, n, k in PROBE_SHAPES)


def _probe(spec: KernelSpec) -> list[tuple[Any, ...]]:
    """Builds and runs the probe: per PROBE_SHAPES entry, runs with the stack filled with 0 and PROBE_FILLS."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise CompileError("nvcc not found: the CUTLASS Params probe needs it")
    source = _probe_source(spec)
    with _jobs(), tempfile.TemporaryDirectory(prefix="ingot-probe-") as tmp:
        src, exe = Path(tmp) / "probe.cu", Path(tmp) / "probe"
        src.write_text(source)
        r = subprocess.run([nvcc, *_probe_options(spec), "-o", str(exe), str(src)], capture_output=True, text=True,
                           timeout=900)
        if r.returncode != 0:
            raise CompileError(f"nvcc failed to build the Params probe of {spec.entry}", r.stdout + r.stderr, source)
        return [(shape, _run_probe(exe, *shape, 0), *(_run_probe(exe, *shape, f) for f in PROBE_FILLS))
                for shape in probe_shapes(spec)]


def _symbolic(values: Sequence[int], shapes: Sequence[tuple[int, int, int]]) -> list[int | str]:
    """``[coef, symbol]`` with ``values[i] == coef * symbol(shapes[i])`` for every probe."""
    for sym, coef in product(_SYMBOLS, _COEFS):
        if all(coef * _eval_sym(sym, *s) == v for v, s in zip(values, shapes)):
            return [coef, sym]
    raise LayoutError(f"no coef * symbol over M, N, K gives {list(values)} for shapes {list(shapes)}")


def _eval_sym(sym: str, m: int, n: int, k: int) -> int:
    """A product of ``M``, ``N``, ``K`` and ceiling quotients such as ``K/64`` (``ceil(K / 64)``)."""
    env = {"M": m, "N": n, "K": k}
    out = 1
    for part in sym.split("*") if sym else ():
        name, _, div = part.partition("/")
        out *= -(-env[name] // int(div)) if div else env[name]
    return out


def derive_layout(spec: KernelSpec, runs: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
    """The layout (module docstring) from the probe's runs; raises ``LayoutError`` when it does not
    reproduce every run."""
    shapes = [r[0] for r in runs]
    first = runs[0][1]
    size = int(first["size"])
    if not first["can_implement"] or first["workspace"]:
        raise LayoutError(f"{spec.entry}: CUTLASS cannot run the probe shape {shapes[0]} without a workspace")
    sentinel = int(first["sentinel"])
    blob = first["blob"]
    # descriptors: each recorded call's marker, found in the blob
    tmas = []
    for t in first["tma"]:
        marker = struct.pack("<Q", _MARKER | (t["tma"] + 1))
        off = blob.find(marker)
        if off < 0 or off % 64:
            raise LayoutError(f"{spec.entry}: TMA descriptor {t['tma']} not found (64-byte aligned) in the Params")
        idx = (int(t["address"]) - sentinel >> 32) - 1
        if not 0 <= idx < len(POINTERS) or int(t["address"]) != sentinel + ((idx + 1) << 32):
            raise LayoutError(f"{spec.entry}: TMA descriptor {t['tma']} over an unknown address {t['address']}")
        per_run = [next(u for u in r[1]["tma"] if u["tma"] == t["tma"]) for r in runs]
        tmas.append({
            "offset": off, "probe_index": t["tma"], "tensor": POINTERS[idx], "dtype": t["dtype"], "rank": t["rank"],
            "dims": [_symbolic([u["dims"][i] for u in per_run], shapes) for i in range(t["rank"])],
            "strides": [_symbolic([u["strides"][i] for u in per_run], shapes) for i in range(t["rank"] - 1)],
            "box": t["box"], "elem_strides": t["elem_strides"], "interleave": t["interleave"],
            "swizzle": t["swizzle"], "l2": t["l2"], "oob": t["oob"]})
    tma_bytes = {o for t in tmas for o in range(t["offset"], t["offset"] + TMA_BYTES)}
    # pointers: 8-byte words equal to a sentinel, outside the descriptors
    pointers = []
    for off in range(0, size - 7, 8):
        if off in tma_bytes:
            continue
        (word,) = struct.unpack_from("<Q", blob, off)
        if word >= sentinel and (word - sentinel) & 0xFFFFFFFF == 0 and 1 <= (word - sentinel) >> 32 <= len(POINTERS):
            pointers.append([off, POINTERS[((word - sentinel) >> 32) - 1]])
    offsets = first["offsets"]
    sched = int(offsets["scheduler"])
    kind = "sm100" if spec.template.startswith("sm100") else "sm90" if spec.template == "sm90.cu" else None
    known = {"sm100": _SM100_SCHED["size"], "sm90": _SM90_SCHED["size"]}
    if kind is None or first["sizes"]["scheduler"] != known[kind]:
        raise LayoutError(f"{spec.entry}: only the sm100 and sm90 persistent tile schedulers' Params are known "
                          f"(scheduler {first['sizes']['scheduler']} bytes, template {spec.template})")
    cfg_tile = (int(spec.value("TILE_M")), int(spec.value("TILE_N")))
    cluster = (int(spec.value("CLUSTER_M")), int(spec.value("CLUSTER_N")))
    layout: dict[str, Any] = {
        "version": LAYOUT_VERSION, "abi": ABI, "size": size, "align": int(first["align"]),
        "block": first["block"], "cluster": first["cluster"], "smem": int(first["smem"]),
        "problem_shape": int(offsets["problem_shape"]), "sm_count": int(offsets["hw_info"]) + 4,
        "pointers": pointers, "tma": tmas,
        "scheduler": {"kind": kind, "offset": sched, "tile": list(cfg_tile),
                      "atom_m": 2 if spec.value("TWO_SM") else 1, "cluster": list(cluster)},
    }
    if kind == "sm90":
        layout["scheduler"] |= scheduler_knobs(dict(spec.values))
    # padding: bytes that differ between any shape's runs (all shapes: a byte left unset is unset in every run);
    # variable: everything build_params fills
    padding = {i for _, run, *others in runs for o in others for i in range(size) if run["blob"][i] != o["blob"][i]}
    # the scheduler's own padding (FastDivmod structs copied from temporaries): indeterminate even where the
    # stack fills happened to agree (seen on a GPU host: garbage from registers, not from the stack)
    if kind == "sm90":  # every sm90 field is written per launch: the rest of the struct is padding
        fields = _scheduler_field_bytes(kind)
        padding |= {sched + i for i in range(known[kind]) if i not in fields}
    if kind == "sm100":  # both sm100 templates: sm100.cu and sm100_blockscaled.cu
        padding |= _atom_tails(tmas) - tma_bytes
    variable = set(tma_bytes) | {o + j for o, _ in pointers for j in range(8)}
    variable |= set(range(layout["problem_shape"], layout["problem_shape"] + 16))
    variable |= set(range(layout["sm_count"], layout["sm_count"] + 4))
    variable |= {sched + i for i in _scheduler_field_bytes(kind)}
    # other shape-dependent words (the block-scaled mainloop's scale-factor layouts, runtime cute layouts): 32-bit
    # integers that differ between the shapes' runs, each coef * symbol
    changing = {i for _, run, *_ in runs[1:] for i in range(size)
                if i not in padding and i not in variable and run["blob"][i] != blob[i]}
    ints = []
    for off in sorted({i - i % 4 for i in changing}):
        try:
            ints.append([off, *_symbolic([struct.unpack_from("<i", r[1]["blob"], off)[0] for r in runs], shapes)])
        except LayoutError as e:  # name the word: inside which TMA atom, if any (indeterminate bytes look like this)
            atoms = [t["offset"] for t in tmas if t["offset"] <= off < t["offset"] + 2 * TMA_BYTES]
            where = f"byte {off - atoms[0]} of the TMA atom at {atoms[0]}" if atoms else "outside the TMA atoms"
            raise LayoutError(f"{spec.entry} ({spec.template}): the 32-bit word at Params offset {off} ({where}) "
                              f"changes between the probe's shapes: {e}") from None
        variable |= set(range(off, off + 4))
    if ints:
        layout["ints"] = ints
    template = bytearray(blob)
    for i in padding | variable:
        template[i] = 0
    layout["template"] = template.hex()
    layout["padding"] = _ranges(padding)
    # check: the layout reproduces every run
    for shape, run, *_ in runs:
        pad = padding
        ptrs = {name: sentinel + ((i + 1) << 32) for i, name in enumerate(POINTERS)}
        # the probe's Params took the spec's swizzle (0: none), whatever build_params would pick for the shape
        mine, launch = build_params(layout, ptrs, *shape, PROBE_SMS, encode=_marker_encoder,
                                    max_swizzle=layout["scheduler"].get("max_swizzle", 1))
        bad = [i for i in range(size) if i not in pad and mine[i] != run["blob"][i]]
        if bad:
            raise LayoutError(f"{spec.entry}: the derived layout differs from CUTLASS's Params for M, N, K = {shape} "
                              f"at bytes {_ranges(set(bad))[:8]}")
        if list(launch["grid"]) != list(run["grid"]):
            raise LayoutError(f"{spec.entry}: grid {launch['grid']} != CUTLASS's {run['grid']} for {shape}")
        if not run["can_implement"] or run["workspace"]:
            raise LayoutError(f"{spec.entry}: CUTLASS cannot run {shape} without a workspace")
    return layout


def _atom_tails(tmas: Sequence[Mapping[str, Any]]) -> set[int]:
    """The second half of each encoded TMA atom of an sm100 template's Params: padding (``derive_layout``).

    Each atom (256 bytes, aligned to 128) is its 128-byte descriptor, then its aux params (``AuxTmaParams``:
    ``g_stride_``, the TMA coordinate bases) and padding. In both sm100 templates the aux params are static types
    (an empty 1-byte struct at the descriptor's offset + 128; CUTLASS 4.2, printed by a probe built on a CPU host),
    so nothing in those 128 bytes is ever read, yet they are indeterminate: on a GPU host (an H200 compiling for
    b200) they held host-stack words that were the same in every stack fill but differed between shapes, which
    failed the derivation (docs/PERF.md, "Overlap of the host with the GPU", run 4); a CPU host reads 0 there, or
    host-stack addresses in the store atom's. Offsets of the block-scaled template (``sm100_blockscaled.cu``, NVFP4
    and MXFP4, 128x128x256, cluster 1x1; 3072 bytes): the mainloop's atoms A, B, SFA, SFB and their fallbacks at
    128, 384, 640, 896, 1152, 1408, 1664, 1920, its live members after them (``layout_SFA`` at 2176 and
    ``layout_SFB`` at 2196, 20 bytes each: the shape-dependent ``ints``; ``cluster_shape_fallback`` at 2216,
    the runtime data types at 2232 and 2240), the epilogue's fusion params at 2304 (pointers and scalars, 104
    bytes), its C atom at 2432 (encoded only with the residual) and D atom at 2688, the scheduler at 2944. No live
    member lies in an atom's second half. A template whose aux params hold dynamic strides (a TMA mode merging
    gmem modes with a run-time stride) would need them excluded here."""
    return {t["offset"] + TMA_BYTES + i for t in tmas for i in range(TMA_BYTES)}


def _ranges(idx: set[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in sorted(idx):
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


def params_layout(spec: KernelSpec, use_cache: bool = True) -> dict[str, Any]:
    """The spec's Params layout (probe built and run on this machine, cached by content like the cubin)."""
    parts = [_probe_source(spec), *key_options(_probe_options(spec)), str(nvcc_version()), f"layout-v{LAYOUT_VERSION}",
             repr(probe_shapes(spec)), repr(PROBE_FILLS)]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    path = cache_dir() / key[:2] / f"{key}.layout.json"

    def build() -> dict[str, Any]:
        layout = derive_layout(spec, _probe(spec))
        write_entry(path, json.dumps(layout).encode())
        return layout

    return cached_build(path, use_cache, load=lambda: json.loads(path.read_text()), build=build)


def build_linear(spec: KernelSpec, use_cache: bool = True) -> tuple[CompiledKernel, dict[str, Any]]:
    """The cubin (+ PTX) and the Params layout of a generic spec, built side by side."""
    if not cutlass_available():
        raise CompileError("CUTLASS kernels need nvcc and the nvidia-cutlass wheel's headers")
    def kernel() -> CompiledKernel:  # cubin, and the PTX the artifact keeps beside it (while the probe builds)
        with _jobs():
            return compile_source(spec.source(), spec.arch, name=f"{spec.entry}.cu", options=cutlass_options(),
                                  compiler="nvcc", use_cache=use_cache, ptx=True)

    with ThreadPoolExecutor(2) as pool:
        cubin = pool.submit(kernel)
        layout = pool.submit(params_layout, spec, use_cache)
        return cubin.result(), layout.result()


# -- launch time: the blob --------------------------------------------------------------------------


Encoder = Callable[[Mapping[str, Any], int, list[int], list[int]], bytes]


def _marker_encoder(t: Mapping[str, Any], address: int, dims: list[int], strides: list[int]) -> bytes:
    return struct.pack("<Q", _MARKER | (int(t["probe_index"]) + 1)) + bytes(TMA_BYTES - 8)


def tma_encoder() -> Encoder:
    """Encodes descriptors with the driver's ``cuTensorMapEncodeTiled`` (cuda.bindings)."""
    from cuda.bindings import driver as drv

    def encode(t: Mapping[str, Any], address: int, dims: list[int], strides: list[int]) -> bytes:
        u64, u32 = drv.cuuint64_t, drv.cuuint32_t  # cuda.bindings 13 takes no plain ints in these lists
        err, tmap = drv.cuTensorMapEncodeTiled(
            drv.CUtensorMapDataType(t["dtype"]), t["rank"], address, [u64(d) for d in dims],
            [u64(s) for s in strides], [u32(b) for b in t["box"]], [u32(e) for e in t["elem_strides"]],
            drv.CUtensorMapInterleave(t["interleave"]), drv.CUtensorMapSwizzle(t["swizzle"]),
            drv.CUtensorMapL2promotion(t["l2"]), drv.CUtensorMapFloatOOBfill(t["oob"]))
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuTensorMapEncodeTiled({t['tensor']}, dims {dims}, strides {strides}) failed: {err}")
        return ctypes.string_at(tmap.getPtr(), TMA_BYTES)

    return encode


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil(a, b) * b


def _sm100_schedule(s: Mapping[str, Any], m: int, n: int) -> tuple[int, int, int, tuple[int, int, int]]:
    """(tiles_m, tiles_n, raster order, grid) of PersistentTileSchedulerSm100 (Heuristic rasterization)."""
    tm, tn = s["tile"]
    cm, cn = s["cluster"]
    blocks_m = _round_up(_ceil(m, tm) * s["atom_m"], cm)
    blocks_n = _round_up(_ceil(n, tn), cn)
    tiles_m, tiles_n = blocks_m // cm, blocks_n // cn
    raster = 0 if tiles_n > tiles_m else 1  # AlongM : AlongN
    if raster == 1 and tiles_m * cn > (1 << 16) - 1:
        raster = 0
    grid = (blocks_m, blocks_n, 1) if raster == 0 else (blocks_n // cn * cm, blocks_m // cm * cn, 1)
    return tiles_m, tiles_n, raster, grid


def _scheduler_field_bytes(kind: str) -> set[int]:
    """Offsets (within the scheduler's Params) of every byte ``build_params`` writes."""
    if kind == "sm100":
        return {v + j for key, v in _SM100_SCHED.items() if key != "size" for j in range(4)}
    f = _SM90_SCHED
    out = {f[key] + j for key in ("major", "minor") for j in range(12)}
    out |= {f[key] + j for key in ("batch", "blk_major") for j in range(24)}
    out |= {f["blocks"] + j for j in range(8)}
    out |= {f[key] + j for key in ("log_swizzle", "raster", "tiles_m", "tiles_n", "tiles_l", "cluster_m", "cluster_n")
            for j in range(4)}
    return out


def _fast_divmod_u64(d: int) -> bytes:
    """CUTLASS's ``FastDivmodU64(d)`` (``fast_math.h``): divisor, multiplier, shift_right, round_up."""
    shift = d.bit_length() - 1
    if d & (d - 1) == 0:
        multiplier, round_up = 0, 0
    else:
        p = 1 << shift
        lo = (p << 64) // d
        multiplier = ((p << 64) + p) // d
        round_up = 1 if lo == multiplier else 0
    return struct.pack("<QQII", d, multiplier, shift, round_up)


def _max_cta_occupancy(max_sm_per_gpc: int, cluster_size: int, sm_count: int) -> int:
    """CUTLASS's ``get_max_cta_occupancy`` (``tile_scheduler_params.h``)."""
    gpcs = 1 if sm_count < max_sm_per_gpc else sm_count // max_sm_per_gpc
    cta = gpcs * (max_sm_per_gpc - max_sm_per_gpc % cluster_size)
    residual = 0 if sm_count < max_sm_per_gpc else sm_count % max_sm_per_gpc
    cta += residual - residual % cluster_size
    return min(sm_count, cta)


def _log_swizzle(blocks_m: int, blocks_n: int, max_swizzle: int) -> int:
    """CUTLASS's ``get_log_swizzle_size`` (``tile_scheduler_params.h``)."""
    least = min(blocks_m, blocks_n)
    for log, (size, needs) in ((3, (8, 6)), (2, (4, 3)), (1, (2, 2))):
        if max_swizzle >= size and least >= needs:
            return log
    return 0


def scheduler_knobs(values: Mapping[str, Any]) -> dict[str, Any]:
    """An sm90.cu spec's scheduler settings as its layout records them: ``max_swizzle`` where the spec fixes one,
    else the operands' ``elem_bits`` (``sm90_max_swizzle`` then picks it per problem), and ``raster_option`` where
    not CUTLASS's Heuristic."""
    knobs: dict[str, Any] = {}
    if int(values.get("MAX_SWIZZLE", 0)):
        knobs["max_swizzle"] = int(values["MAX_SWIZZLE"])
    else:
        knobs["elem_bits"] = next(bits for ctype, bits, _ in OPERANDS.values() if ctype == values["A_TYPE"])
    if values.get("RASTER", "Heuristic") != "Heuristic":
        knobs["raster_option"] = str(values["RASTER"])
    return knobs


def sm90_max_swizzle(s: Mapping[str, Any], m: int, n: int, k: int) -> int:
    """The scheduler's max swizzle for an ``m x n x k`` problem: the layout's ``max_swizzle`` (``sm90.cu``'s
    ``MAX_SWIZZLE``) where the configuration fixes one, ``rule.auto_swizzle`` where it leaves it open (the layout
    records the operands' ``elem_bits``), else none (layouts from before the choice existed)."""
    if "max_swizzle" in s:
        return int(s["max_swizzle"])
    if "elem_bits" in s:
        return auto_swizzle(m, n, k, int(s["elem_bits"]), s["tile"], s["cluster"], s.get("raster_option", "Heuristic"))
    return 1


def _sm90_schedule(s: Mapping[str, Any], m: int, n: int, sm_count: int, blob: bytearray,
                   max_swizzle: int = 1) -> tuple[int, int, int]:
    """Writes PersistentTileSchedulerSm90Params into ``blob`` and returns its launch grid (``get_grid_shape``). The
    scheduler's Arguments: ``max_swizzle`` (``sm90_max_swizzle``) and the layout's ``raster_option`` (``sm90.cu``
    sets it at compile time), else CUTLASS's default, Heuristic rasterization."""
    cm, cn = s["cluster"]
    blocks_m, blocks_n = sm90_blocks(m, n, s["tile"], s["cluster"])
    log_swizzle = _log_swizzle(blocks_m, blocks_n, max_swizzle)
    blocks_m = _round_up(blocks_m, (1 << log_swizzle) * cm)
    blocks_n = _round_up(blocks_n, (1 << log_swizzle) * cn)
    raster = 0 if rasterizes_along_m(blocks_m, blocks_n, s.get("raster_option", "Heuristic")) else 1  # M : N
    total = blocks_m * blocks_n
    base, f = s["offset"], _SM90_SCHED
    major, minor = (cn, cm) if raster == 1 else (cm, cn)
    struct.pack_into("<QI", blob, base + f["major"], major, major.bit_length() - 1)
    struct.pack_into("<QI", blob, base + f["minor"], minor, minor.bit_length() - 1)
    blob[base + f["batch"]:base + f["batch"] + 24] = _fast_divmod_u64(total)
    blk_major = blocks_n // cn if raster == 1 else blocks_m // cm
    blob[base + f["blk_major"]:base + f["blk_major"] + 24] = _fast_divmod_u64(blk_major)
    struct.pack_into("<Qii", blob, base + f["blocks"], total, log_swizzle, raster)
    struct.pack_into("<5I", blob, base + f["tiles_m"], blocks_m // cm, blocks_n // cn, 1, cm, cn)
    if cm * cn == 1:
        ctas = min(sm_count, total)
        return (cm, ctas, 1) if raster == 1 else (ctas, cn, 1)
    cta = _max_cta_occupancy(_SM90_MAX_SM_PER_GPC, cm * cn, sm_count)
    if raster == 1:
        return cm, min(cta // cm, total // cm), 1
    return min(cta // cn, total // cn), cn, 1


def build_params(layout: Mapping[str, Any], pointers: Mapping[str, int], m: int, n: int, k: int, sm_count: int,
                 encode: Encoder | None = None, max_swizzle: int | None = None) -> tuple[bytes, dict[str, Any]]:
    """The Params blob and launch config (grid, block, cluster, smem) for buffers ``pointers`` (names from
    ``POINTERS``; missing ones are null) and an ``m x n x k`` problem. ``encode`` defaults to the driver's;
    ``max_swizzle`` (sm90) to ``sm90_max_swizzle``'s choice."""
    if layout.get("version") != LAYOUT_VERSION:
        raise LayoutError(f"Params layout version {layout.get('version')}, this ingot reads {LAYOUT_VERSION}")
    if m < 1:
        raise ValueError(f"M must be positive, got {m}")
    encode = encode or tma_encoder()
    blob = bytearray.fromhex(layout["template"])
    struct.pack_into("<4i", blob, layout["problem_shape"], m, n, k, 1)
    struct.pack_into("<i", blob, layout["sm_count"], sm_count)
    for off, name in layout["pointers"]:
        struct.pack_into("<Q", blob, off, int(pointers.get(name) or 0))
    for off, coef, sym in layout.get("ints", ()):
        struct.pack_into("<i", blob, off, coef * _eval_sym(sym, m, n, k))
    for t in layout["tma"]:
        address = int(pointers.get(t["tensor"]) or 0)
        if not address:
            raise ValueError(f"the {t['tensor']} pointer is needed (a TMA descriptor reads it)")
        dims = [c * _eval_sym(s, m, n, k) for c, s in t["dims"]]
        strides = [c * _eval_sym(s, m, n, k) for c, s in t["strides"]]
        blob[t["offset"]:t["offset"] + TMA_BYTES] = encode(t, address, dims, strides)
    s = layout["scheduler"]
    if s["kind"] == "sm90":
        swizzle = sm90_max_swizzle(s, m, n, k) if max_swizzle is None else max_swizzle
        grid = _sm90_schedule(s, m, n, sm_count, blob, swizzle)
    else:
        tiles_m, tiles_n, raster, grid = _sm100_schedule(s, m, n)
        base = s["offset"]
        struct.pack_into("<3I", blob, base + _SM100_SCHED["tiles_m"], tiles_m, tiles_n, 1)
        struct.pack_into("<i", blob, base + _SM100_SCHED["raster"], raster)
    return bytes(blob), {"grid": grid, "block": tuple(layout["block"]), "cluster": tuple(layout["cluster"]),
                         "smem": int(layout["smem"])}


def launch(function: Any, blob: bytes, config: Mapping[str, Any], stream: Any = 0) -> None:
    """``cuLaunchKernelEx`` of a CUTLASS kernel with its Params blob and cluster dimension (the function's
    max dynamic shared memory must already allow ``config["smem"]``)."""
    PreparedLaunch(blob, config, stream)(function)


class PreparedLaunch:
    """One CUTLASS launch's driver objects (the launch config with its cluster attribute, the Params blob's buffer
    and argument array) built once, for launching the same blob on the same stream again: the CUDA backend keeps one
    per row count, so a step's launch is the ``cuLaunchKernelEx`` call alone."""

    def __init__(self, blob: bytes, config: Mapping[str, Any], stream: Any = 0) -> None:
        from cuda.bindings import driver as drv

        cfg = drv.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = config["grid"]
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = config["block"]
        cfg.sharedMemBytes = int(config["smem"])
        cfg.hStream = stream if isinstance(stream, drv.CUstream) else drv.CUstream(int(stream))
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = config["cluster"]
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        self.cfg, self.config = cfg, config
        self.buf = ctypes.create_string_buffer(bytes(blob), len(blob))
        self.args = (ctypes.c_void_p * 1)(ctypes.addressof(self.buf))
        self.args_addr = ctypes.addressof(self.args)
        self._launch = drv.cuLaunchKernelEx
        self._ok = drv.CUresult.CUDA_SUCCESS

    def __call__(self, function: Any) -> None:
        err, = self._launch(self.cfg, function, self.args_addr, 0)
        if err != self._ok:
            raise RuntimeError(f"cuLaunchKernelEx (CUTLASS, grid {self.config['grid']}, cluster "
                               f"{self.config['cluster']}): {err}")

