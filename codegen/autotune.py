"""Autotuning: time a tunable kernel's candidate configurations on the compiling machine's GPU, keep the fastest.

A family that has real choices describes them in ``codegen/kernels/<family>/tune.py`` as ``Tunable`` records
(``TUNABLE_FAMILIES``): which specs it tunes, the candidate specs for one (each an ordinary ``KernelSpec`` from the
family's rule, the heuristic's own spec first) and the workloads to time them on (integer arguments and buffers
sized from the spec's shapes, filled with random values). Today: the bf16 and quantized decode GEMV variants
(split-K count, warps, tiles per warp, load-stage depth; per N, K and token bucket), the split-KV decode
attention's split policy (CTAs per SM, most splits, smallest split) and the h100/h200 CUTLASS GEMM's configuration
(tile, cluster, schedule; per N and K of each linear, at the artifact's step row count). The template GEMM's tile
is fixed in its rule: nothing to tune there yet. A compile leaves some matching specs to the heuristics
(``Tunable.in_compile``): the decode GEMVs of bucket 8 (batch 1), whose configurations timed alone were misranked
in the model (an autotuned 1B artifact decoded batch 1 17% slower on the H200: ``kernels/gemv/tune.py``).

Shape-generic kernels (the CUTLASS GEMMs: one build serves every N and K) are tuned per launch shape all the same:
the lowering passes a *shaped* spec per launch (the shape in its values, ``cutlass_params.tuning_spec``), the
candidates are shaped too (the workloads read the shape from them), and the tunable's ``kernel`` maps a shaped
spec to the one compiled; ``Result.heuristic`` and ``Result.chosen`` are the compiled specs.

``autotune(specs, target, timer, gpu)`` times every candidate of every tunable spec on every workload (the
``timer``: median seconds per launch; ``CudaTimer`` does it with CUDA events around a CUDA graph of back-to-back
launches rotating over copies of the large inputs, after warm-up; CUTLASS kernels launched with the Params blob
built for the workload's M, N, K and buffers, as the runtime does) and picks the lowest total time; the heuristic
stays unless a candidate is at least ``MIN_GAIN`` faster. Fail-safe: a candidate whose compile or launch fails is
dropped with an ``AutotuneWarning``; if the heuristic itself fails, it stays. Results are cached as JSON in
``$INGOT_CACHE_DIR/autotune`` (``compile.cache_dir``), keyed by the heuristic spec (template and values), the
template's text, the candidates, the workloads, the architecture, the GPU's name, the driver and compiler
versions and ingot's version: a second compile on the same machine times nothing.

**When** (``tuning_gpu``): with ``INGOT_AUTOTUNE=auto`` (the default, ``DEFAULT_MODE``), ``lower_for_target`` tunes
when a CUDA GPU is present whose compute capability is the target's (sm_90 for h100/h200, sm_100 for b200); ``0``
is off; ``INGOT_AUTOTUNE=1`` makes it
required (``AutotuneUnavailable`` without such a GPU). Otherwise the heuristics choose, and the artifact is exactly
what it was without autotuning. The chosen kernel's entry in the kernel table gets an ``"autotune"`` record
(``Result.record``: the heuristic's entry, both times, the knobs' values) that ``ingot inspect`` shows.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import statistics
import sys
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from .compile import cache_dir, nvcc_version, nvrtc_version
from .kernel import KernelSpec
from .target import Target

ENV = "INGOT_AUTOTUNE"
#: unset means this: tune when a GPU of the target's architecture is present (the timing path and the tuned
#: kernels pass tests/codegen/test_autotune_gpu.py on the H200, 2026-11-29; docs/PERF.md, "Autotuning")
DEFAULT_MODE = "auto"
#: a candidate replaces the heuristic only when it is at least this much faster (timing noise is ~1-2%)
MIN_GAIN = 0.02
#: at most this many candidates per spec (the heuristic's included): each is compiled and timed
MAX_CANDIDATES = 8
CACHE_FORMAT = 1
TUNABLE_FAMILIES = ("gemv", "attention", "gemm_cutlass")
#: the CUTLASS GEMMs' configurations are tuned in a compile only with ``INGOT_AUTOTUNE_CUTLASS=1``: their timing
#: path has not run on a GPU yet (tests/codegen/test_autotune_gpu.py's CUTLASS case is pending there), and each
#: candidate is a multi-minute nvcc build on a first compile; without it the rule table chooses (``shape_config``)
CUTLASS_ENV = "INGOT_AUTOTUNE_CUTLASS"


class AutotuneUnavailable(RuntimeError):
    """``INGOT_AUTOTUNE=1`` but there is no GPU of the target's architecture here."""


class AutotuneWarning(UserWarning):
    """A candidate could not be compiled or timed (it was dropped), or the tuning was given up."""


# -- what is tuned --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One timed situation: the kernel's integer arguments and its buffers (name -> (numpy dtype name, shape));
    ``fill(rng)`` makes their contents (random values; index arrays that are valid). Pointer parameters without a
    buffer are passed as null. ``rotate``: buffers the timer copies so that back-to-back launches read them from
    memory, not from L2 (the weights, the KV cache)."""

    label: str
    ints: Mapping[str, int]
    buffers: Mapping[str, tuple[str, tuple[int, ...]]]
    fill: Callable[[np.random.Generator], dict[str, np.ndarray]] = field(compare=False, repr=False)
    rotate: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "ints": dict(sorted(self.ints.items())),
                "buffers": {k: [d, list(s)] for k, (d, s) in sorted(self.buffers.items())}, "rotate": list(self.rotate)}


@dataclass(frozen=True)
class Tunable:
    """The choices of one kind of spec. ``candidates(spec, target)``: specs taking the same parameters, the
    heuristic's ``spec`` first; ``workloads(spec, bounds)``: what to time them on (``bounds``: the artifact's
    bound dims, ``T``, ``S``, ``max_blocks``); ``knobs``: the spec values the candidates differ in (recorded);
    ``kernel``: the spec compiled (and timed) for a candidate, where that is not the candidate itself (shaped specs
    of shape-generic kernels, see the module docstring)."""

    name: str
    matches: Callable[[KernelSpec], bool]
    candidates: Callable[[KernelSpec, Target], list[KernelSpec]]
    workloads: Callable[[KernelSpec, Mapping[str, int]], list[Workload]]
    knobs: tuple[str, ...]
    kernel: Callable[[KernelSpec], KernelSpec] | None = None
    #: where a compile tunes a matching spec (None: everywhere). ``autotune`` itself (benchmarks) times any match;
    #: ``autotune_for_lowering`` leaves the others to the heuristics, for kernels whose time alone misranks their
    #: configurations in the model (the decode GEMVs of batch 1: ``kernels/gemv/tune.py``)
    in_compile: Callable[[KernelSpec], bool] | None = None


@cache
def tunables() -> tuple[Tunable, ...]:
    found: list[Tunable] = []
    for name in TUNABLE_FAMILIES:
        found += importlib.import_module(f"{__package__}.kernels.{name}.tune").TUNABLES
    return tuple(found)


def tunable_for(spec: KernelSpec) -> Tunable | None:
    return next((t for t in tunables() if t.matches(spec)), None)


def kernel_for(spec: KernelSpec) -> KernelSpec:
    """The spec compiled for ``spec`` (a candidate or heuristic): its tunable's ``kernel`` of it, else itself."""
    t = tunable_for(spec)
    return t.kernel(spec) if t is not None and t.kernel is not None else spec


def candidates(spec: KernelSpec, target: Target) -> list[KernelSpec]:
    """The candidate specs for ``spec`` (the heuristic first, distinct, at most ``MAX_CANDIDATES``); ``[spec]``
    when nothing tunes it."""
    t = tunable_for(spec)
    return dedupe([spec, *(t.candidates(spec, target) if t else [])])


def dedupe(specs: Sequence[KernelSpec]) -> list[KernelSpec]:
    out: dict[str, KernelSpec] = {}
    for s in specs:
        out.setdefault(s.key, s)
    return list(out.values())[:MAX_CANDIDATES]


# -- the GPU ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuInfo:
    name: str
    sm: int  # compute capability as an int: 90, 100
    driver: int  # cuDriverGetVersion: 13000
    num_sms: int


def detect_gpu() -> GpuInfo | None:
    """Device 0, or None when there is no CUDA driver, device or cuda-python here."""
    try:
        from ..runtime import cuda_driver as cd

        ctx = cd.Context(0)
        return GpuInfo(ctx.name, ctx.sm, cd.driver_version(), ctx.num_sms)
    except Exception:  # CudaUnavailable, ImportError, a driver error: no GPU to tune on
        return None


def tuning_gpu(target: Target) -> GpuInfo | None:
    """The GPU to tune on for ``target``, or None (heuristics); see the module docstring for ``INGOT_AUTOTUNE``."""
    mode = os.environ.get(ENV, DEFAULT_MODE).strip().lower()
    if mode in ("0", "off", "false", "no", ""):
        return None
    if mode not in ("", "auto", "1", "on", "true", "yes"):
        raise AutotuneUnavailable(f"{ENV} must be 0 (off), 1 (required) or auto, got {os.environ[ENV]!r}")
    required = mode in ("1", "on", "true", "yes")
    if not target.is_gpu:
        return None
    gpu = detect_gpu()
    if gpu is not None and gpu.sm == target.sm:
        return gpu
    if required:
        here = (f"this machine's GPU is {gpu.name} (sm_{gpu.sm})" if gpu is not None
                else "this machine has no usable CUDA GPU (no driver, no device or no cuda-python)")
        raise AutotuneUnavailable(
            f"{ENV}=1: autotuning for target {target.name} needs a GPU of its architecture (sm_{target.sm}), but "
            f"{here}; compile on such a machine, or unset {ENV} (or set it to 0) to let the heuristics choose")
    return None


# -- choosing ---------------------------------------------------------------------------------------

Timer = Callable[[KernelSpec, Workload], float]


@dataclass
class Result:
    """The outcome for one heuristic spec. Times are the sums over the workloads, in seconds (None: not timed).
    ``heuristic`` and ``chosen`` are the specs to compile (``kernel_for`` of the timed ones); ``times`` is keyed by
    the timed candidates' keys."""

    heuristic: KernelSpec
    chosen: KernelSpec
    heuristic_s: float | None
    chosen_s: float | None
    times: dict[str, float | None]  # candidate key -> total seconds, None where it failed
    workloads: list[str]
    knobs: tuple[str, ...]
    gpu: GpuInfo
    cached: bool = False

    @property
    def changed(self) -> bool:
        return self.chosen.key != self.heuristic.key

    def record(self) -> dict[str, Any]:
        """The kernel table's ``"autotune"`` entry of the chosen kernel."""
        def us(s: float | None) -> float | None:
            return None if s is None else round(s * 1e6, 3)

        return {"heuristic": self.heuristic.entry, "heuristic_us": us(self.heuristic_s), "chosen_us": us(self.chosen_s),
                "config": _knob_values(self.chosen, self.knobs),
                "heuristic_config": _knob_values(self.heuristic, self.knobs),
                "candidates": len(self.times), "timed": sum(t is not None for t in self.times.values()),
                "workloads": self.workloads, "gpu": self.gpu.name, "driver": self.gpu.driver}


def _knob_values(spec: KernelSpec, knobs: Sequence[str]) -> dict[str, Any]:
    """``spec``'s values of ``knobs``, those its template has (a tunable may serve templates with different knobs:
    ``quant.cu`` has no ``CLUSTER``)."""
    values = dict(spec.values)
    return {k: values[k] for k in knobs if k in values}


def cache_key(spec: KernelSpec, cands: Sequence[KernelSpec], loads: Sequence[Workload], gpu: GpuInfo,
              timer: object) -> str:
    from .. import __version__

    parts = {"format": CACHE_FORMAT, "spec": spec.to_dict(with_doc=False), "source": hashlib.sha256(
        spec.source().encode()).hexdigest(), "candidates": [c.key for c in cands],
        "workloads": [w.describe() for w in loads], "arch": spec.arch, "gpu": gpu.name, "sm": gpu.sm,
        "driver": gpu.driver, "ingot": __version__, "compiler": nvrtc_version() or nvcc_version(),
        "timer": getattr(timer, "signature", type(timer).__name__)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _cache_path(key: str) -> Path:
    return cache_dir() / "autotune" / key[:2] / f"{key}.json"


def _load_cached(key: str) -> dict[str, Any] | None:
    try:
        return json.loads(_cache_path(key).read_text())
    except (OSError, ValueError):
        return None


def _store(key: str, entry: Mapping[str, Any]) -> None:
    path = _cache_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:  # a read-only cache costs a re-tune next time, not the compile
        warnings.warn(f"autotune: could not write the cache entry {path}: {e}", AutotuneWarning, stacklevel=2)


def _time_all(spec: KernelSpec, cands: Sequence[KernelSpec], loads: Sequence[Workload],
              timer: Timer) -> dict[str, float | None]:
    totals: dict[str, float | None] = {c.key: 0.0 for c in cands}
    for w in loads:
        for c in cands:
            if totals[c.key] is None:
                continue
            try:
                t = float(timer(c, w))
                if not t > 0 or t != t:
                    raise ValueError(f"the timer returned {t}")
                totals[c.key] = totals[c.key] + t  # type: ignore[operator]
            except Exception as e:  # compile or launch failure, a bad time: drop this candidate
                what = "the heuristic configuration" if c.key == spec.key else "candidate"
                warnings.warn(f"autotune {c.entry} ({what}) on {w.label}: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}; dropped", AutotuneWarning, stacklevel=3)
                totals[c.key] = None
    return totals


def select(spec: KernelSpec, times: Mapping[str, float | None]) -> str:
    """The key of the chosen candidate: the fastest, if it beats the heuristic by ``MIN_GAIN``; else the heuristic
    (also when the heuristic itself was not timed)."""
    base = times.get(spec.key)
    if base is None:
        return spec.key
    ok = [(t, k) for k, t in times.items() if t is not None]
    best_t, best = min(ok)
    return best if best != spec.key and best_t <= base * (1.0 - MIN_GAIN) else spec.key


def autotune(specs: Sequence[KernelSpec], target: Target, timer: Timer, gpu: GpuInfo, *,
             bounds: Mapping[str, int] | None = None, use_cache: bool = True,
             progress: Callable[[str, int, int], None] | None = None) -> dict[str, Result]:
    """Heuristic spec key -> ``Result`` for every tunable spec among ``specs`` (each distinct spec once; the keys
    are those of the specs given, shaped ones included)."""
    work: list[tuple[KernelSpec, Tunable]] = []
    for s in {s.key: s for s in specs}.values():
        t = tunable_for(s)
        if t is not None:
            work.append((s, t))
    results: dict[str, Result] = {}
    if not work:
        return results
    plans = []
    for s, t in work:
        cands = candidates(s, target)
        plans.append((s, t, cands, t.workloads(s, bounds or {})))
    keys = [cache_key(s, cands, loads, gpu, timer) for s, _, cands, loads in plans]
    hits = [_load_cached(k) if use_cache else None for k in keys]
    todo = [p for p, h in zip(plans, hits) if h is None]
    title = f"autotuning {len(todo)} kernel{'s' if len(todo) != 1 else ''} on {gpu.name}"
    if todo:
        if progress is not None:
            progress(title, 0, len(todo))
        else:
            print(f"ingot: {title}...", file=sys.stderr, flush=True)
        prepare = getattr(timer, "prepare", None)
        if prepare is not None:
            prepare([c for _, _, cands, _ in todo for c in cands])
    done = 0
    for (s, t, cands, loads), key, hit in zip(plans, keys, hits):
        by_key = {c.key: c for c in cands}
        if hit is not None and hit.get("chosen") in by_key:
            times = {k: v for k, v in hit["times"].items() if k in by_key}
            chosen, cached = hit["chosen"], True
        else:
            times = _time_all(s, cands, loads, timer)
            chosen, cached = select(s, times), False
            if use_cache and any(v is not None for v in times.values()):
                _store(key, {"chosen": chosen, "times": times, "heuristic": s.key, "gpu": gpu.name,
                             "driver": gpu.driver, "workloads": [w.label for w in loads]})
            done += 1
            if progress is not None:
                progress(title, done, len(todo))
        kernel = t.kernel or (lambda spec: spec)
        results[s.key] = Result(kernel(s), kernel(by_key[chosen]), times.get(s.key), times.get(chosen), times,
                                [w.label for w in loads], t.knobs, gpu, cached)
    return results


def autotune_for_lowering(specs: Sequence[KernelSpec], target: Target, bounds: Mapping[str, int],
                          progress: Callable[[str, int, int], None] | None = None) -> dict[str, Result]:
    """What ``lower_for_target`` calls: ``{}`` when there is nothing to tune on or no GPU to tune with (see the
    module docstring); raises ``AutotuneUnavailable`` only under ``INGOT_AUTOTUNE=1``. Never fails otherwise:
    any error while tuning leaves the heuristics, with a warning. CUTLASS GEMMs only with ``CUTLASS_ENV``."""
    if os.environ.get(CUTLASS_ENV, "").strip() != "1":
        specs = [s for s in specs if s.family != "gemm_cutlass"]
    specs = [s for s in specs if (t := tunable_for(s)) is None or t.in_compile is None or t.in_compile(s)]
    if not any(tunable_for(s) for s in specs):
        if os.environ.get(ENV, "").strip().lower() in ("1", "on", "true", "yes"):
            tuning_gpu(target)  # still say so when the machine cannot tune
        return {}
    gpu = tuning_gpu(target)
    if gpu is None:
        return {}
    timer: Timer | None = None
    try:
        timer = make_timer()
        return autotune(specs, target, timer, gpu, bounds=bounds, progress=progress)
    except Exception as e:
        warnings.warn(f"autotune: gave up ({type(e).__name__}: {e}); the heuristics choose", AutotuneWarning,
                      stacklevel=2)
        return {}
    finally:
        try:
            getattr(timer, "release", lambda: None)()
        except Exception:  # freeing the timing buffers must not fail the compile either
            pass


def make_timer() -> Timer:
    """The timer ``autotune_for_lowering`` uses (tests replace this)."""
    return CudaTimer()


# -- timing on the GPU ------------------------------------------------------------------------------


def random_array(dtype: str, shape: Sequence[int], rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """Random contents for a timing buffer: normal values for float types, any byte but NaN for ``float8_e4m3fn``
    (and ``uint8``: packed codes). Large buffers repeat a random 1M-element block (the values do not change the
    time, the generation would)."""
    n = int(np.prod(shape, dtype=np.int64))
    m = min(n, 1 << 20)
    if dtype in ("uint8", "float8_e4m3fn"):
        block = rng.integers(0, 256, m, dtype=np.uint8)
        if dtype == "float8_e4m3fn":
            block[(block & 0x7F) == 0x7F] = 0x38  # the two NaN codes -> 1.0
            block = block.view(ml_dtypes.float8_e4m3fn)
    else:
        block = (rng.standard_normal(m, dtype=np.float32) * scale).astype(
            ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype))
    return np.resize(block, n).reshape(tuple(shape))


class CudaTimer:
    """Median seconds per launch of a spec on one workload, on device 0 (``runtime/cuda_driver.py``).

    Per candidate: load its cubin (``kernel_for`` the spec); ``warmup`` plain launches (a launch error shows here);
    then ``launches`` back-to-back launches captured in one CUDA graph (launch overhead is not timed), each launch
    reading the next copy of the ``rotate`` buffers (copies together >= ``rotate_bytes``, so the weights come from
    HBM as in a model's step, not from the 50 MB L2); the graph replayed ``reps`` times between CUDA events; the
    median. The workload's buffers are uploaded once and shared by the candidates timed on it. A shape-generic
    CUTLASS GEMM (``gemm_cutlass/cutlass_params.py``) is launched as the runtime launches it: a Params blob built
    from its layout for the workload's M, the shaped spec's N and K and each copy's buffers, with its cluster
    shape (``cutlass_params.launch``)."""

    def __init__(self, launches: int = 10, reps: int = 15, warmup: int = 2, rotate_bytes: int = 256 << 20,
                 max_copies: int = 32, seed: int = 0) -> None:
        from ..runtime import cuda_driver as cd

        self.cd = cd
        self.launches, self.reps, self.warmup = launches, reps, warmup
        self.rotate_bytes, self.max_copies = rotate_bytes, max_copies
        self.signature = f"cuda-graph-events:{launches}x{reps}:rotate{rotate_bytes}"
        self.ctx = cd.Context(0)
        self.stream = cd.Stream()
        self.rng = np.random.default_rng(seed)
        self._workload: Workload | None = None
        self._copies: list[dict[str, int]] = []
        self._memory: list[Any] = []
        self._built: dict[str, Any] = {}

    @staticmethod
    def _build(kernel: KernelSpec) -> tuple[Any, Mapping[str, Any] | None]:
        """(compiled kernel, Params layout or None) of a spec to compile."""
        from .compile import compile_spec
        from .kernels.gemm_cutlass import cutlass_params

        if cutlass_params.is_generic(kernel):
            return cutlass_params.build_linear(kernel)
        return compile_spec(kernel), None

    def prepare(self, specs: Sequence[KernelSpec]) -> None:
        """Compile the candidates up front, in parallel (NVRTC / nvcc; cached); failures show when timed."""

        def build(s: KernelSpec) -> tuple[str, Any]:
            try:
                return s.key, self._build(s)
            except Exception as e:
                return s.key, e

        kernels = {k.key: k for k in map(kernel_for, specs)}  # shaped specs of one generic kernel: one build
        todo = [k for k in kernels.values() if k.key not in self._built]
        with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
            self._built.update(pool.map(build, todo))

    def _compiled(self, kernel: KernelSpec) -> tuple[Any, Mapping[str, Any] | None]:
        built = self._built.get(kernel.key)
        if built is None:
            built = self._built[kernel.key] = self._build(kernel)
        if isinstance(built, Exception):
            raise built
        return built

    def _upload(self, w: Workload) -> None:
        if self._workload is w:
            return
        self.release()
        cd = self.cd
        arrays = w.fill(self.rng)
        for name, (dt, shape) in w.buffers.items():
            a = arrays[name]
            if a.dtype.name != dt or tuple(a.shape) != tuple(shape):
                raise ValueError(f"workload {w.label}: buffer {name} is {a.dtype}{list(a.shape)}, declared {dt}{shape}")
        rot = sum(arrays[n].nbytes for n in w.rotate)
        copies = max(1, min(self.max_copies, -(-self.rotate_bytes // rot))) if rot else 1
        first: dict[str, int] = {}
        for name, a in arrays.items():
            mem = cd.DeviceMemory(a.nbytes)
            self._memory.append(mem)
            a = np.ascontiguousarray(a)
            cd.memcpy_htod(mem.ptr, a.ctypes.data, a.nbytes)
            first[name] = mem.ptr
        self._copies = [first]
        for _ in range(copies - 1):
            extra = dict(first)
            for name in w.rotate:
                mem = cd.DeviceMemory(arrays[name].nbytes)
                self._memory.append(mem)
                cd.memcpy_dtod(mem.ptr, first[name], arrays[name].nbytes)
                extra[name] = mem.ptr
            self._copies.append(extra)
        self.ctx.synchronize()
        self._workload = w

    def _set_smem(self, fn: Any, smem: int) -> None:
        cd = self.cd
        if smem > 48 * 1024:
            attr = cd.driver().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            cd.check(cd.driver().cuFuncSetAttribute(fn, attr, smem), "cuFuncSetAttribute")

    def _plain_launcher(self, fn: Any, kernel: KernelSpec, w: Workload) -> Callable[[int], None]:
        """Launch i reads copy i of the rotating buffers: the kernel's arguments packed once per copy."""
        import ctypes

        cd = self.cd
        self._set_smem(fn, kernel.smem)
        ctor = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float}
        packs = []
        for bufs in self._copies:
            vals = [ctypes.c_uint64(bufs.get(p.name, 0)) if p.ctype == "ptr" else ctor[p.ctype](w.ints[p.name])
                    for p in kernel.params]
            ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
            packs.append((vals, ptrs, ctypes.addressof(ptrs)))
        grid = kernel.grid_dims({p.name: int(w.ints[p.name]) for p in kernel.params if p.ctype != "ptr"})

        def launch(i: int) -> None:
            cd.launch(fn, grid, kernel.block, kernel.smem, self.stream, packs[i % len(packs)][2], kernel.entry)

        return launch

    def _cutlass_launcher(self, fn: Any, spec: KernelSpec, layout: Mapping[str, Any],
                          w: Workload) -> Callable[[int], None]:
        """One Params blob per copy of the rotating buffers (the blob holds TMA descriptors of their addresses), for
        the workload's M and the shaped spec's N and K, as ``runtime/cuda_launch.py``'s ``CutlassLaunch``."""
        from .kernels.gemm_cutlass import cutlass_params

        self._set_smem(fn, int(layout["smem"]))
        m, n, k = int(w.ints["M"]), int(spec.value("N")), int(spec.value("K"))
        blobs = [cutlass_params.build_params(layout, bufs, m, n, k, self.ctx.num_sms) for bufs in self._copies]

        def launch(i: int) -> None:
            blob, config = blobs[i % len(blobs)]
            cutlass_params.launch(fn, blob, config, self.stream.handle)

        return launch

    def __call__(self, spec: KernelSpec, w: Workload) -> float:
        cd = self.cd
        self.ctx.make_current()
        self._upload(w)
        kernel = kernel_for(spec)
        built, layout = self._compiled(kernel)
        module = cd.Module(built.cubin, kernel.entry)
        graph = start = end = None
        try:
            fn = module.function(kernel.entry)
            launch = (self._plain_launcher(fn, kernel, w) if layout is None
                      else self._cutlass_launcher(fn, spec, layout, w))

            def enqueue(count: int, offset: int = 0) -> None:
                for i in range(count):
                    launch(offset + i)

            enqueue(self.warmup)
            self.stream.synchronize()
            graph = cd.CudaGraph(self.stream, lambda: enqueue(self.launches, 1))
            graph.launch(self.stream)
            self.stream.synchronize()
            start, end = cd.Event(), cd.Event()
            times = []
            for _ in range(self.reps):
                start.record(self.stream)
                graph.launch(self.stream)
                end.record(self.stream)
                end.synchronize()
                times.append(end.elapsed_ms(start) / 1e3 / self.launches)
            return statistics.median(times)
        finally:
            for obj in (graph, start, end):
                if obj is not None:
                    obj.destroy()
            module.unload()

    def release(self) -> None:
        for mem in self._memory:
            mem.free()
        self._memory, self._copies, self._workload = [], [], None
