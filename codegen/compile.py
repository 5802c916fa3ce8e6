"""Compile CUDA source to cubin + PTX for ``sm_90a`` / ``sm_100a``, with a content-addressed cache.

Two compilers, same result shape:

- ``nvrtc``: NVRTC through ``cuda.bindings.nvrtc`` (pip wheels ``cuda-bindings`` and
  ``nvidia-cuda-nvrtc``), so a machine without a CUDA toolkit can compile. The cubin comes from
  ``-arch=sm_XXa``, the PTX from a second run with ``-arch=compute_XXa`` (NVRTC gives one or the other).
- ``nvcc``: the toolkit's ``nvcc -cubin`` / ``nvcc -ptx`` (``$CUDA_HOME/bin``, ``PATH``,
  ``/usr/local/cuda``, else the pip wheel ``nvidia-cuda-nvcc``). CUTLASS kernels need it (NVRTC
  leaves CUTLASS's SM100 builders out); their headers come from the ``nvidia-cutlass`` wheel
  (``cutlass_include_dirs``), and they skip the PTX (``ptx=False``: arch-specific ``a`` features
  have no forward-compatible PTX, and a second 30 s build would buy nothing).

``compiler="auto"`` takes NVRTC where it loads, else nvcc. The cache key is the sha256 of the
source, the options, the architecture and the compiler's version, so an unchanged kernel is
never compiled twice; entries are written atomically (temp file + rename), and a compile that misses the cache
holds the entry's lock file while it builds (``entry_lock``: ``flock``), so concurrent compiles of one kernel
(two ``ingot compile`` runs, pytest-xdist workers) build it once, the others waiting for it. The cache lives in
``$INGOT_CACHE_DIR`` (default ``~/.cache/ingot/kernels``).

Kernel sources include no CUDA headers (``codegen/kernels/common.cuh`` defines the storage
types), so neither compiler needs a toolkit's include directory; CUTLASS sources are the exception.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .kernel import KernelSpec

T = TypeVar("T")

ARCHES = ("sm_90a", "sm_100a")
#: options every kernel is built with; no fast-math: kernels must match the numpy references
BASE_OPTIONS = ("-std=c++17", "-lineinfo")


class CompileError(RuntimeError):
    """A compiler rejected a source; ``log`` holds the compiler's output."""

    def __init__(self, message: str, log: str = "", source: str = "") -> None:
        super().__init__(f"{message}\n--- compiler log ---\n{log.strip()}" if log else message)
        self.log = log
        self.source = source


class CompilerUnavailable(RuntimeError):
    """No usable compiler (neither NVRTC from cuda.bindings nor nvcc)."""


@dataclass(frozen=True)
class CompiledKernel:
    arch: str
    cubin: bytes
    ptx: str
    key: str
    compiler: str
    log: str = ""
    cached: bool = False


def cache_dir() -> Path:
    return Path(os.environ.get("INGOT_CACHE_DIR") or Path.home() / ".cache" / "ingot" / "kernels")


@contextlib.contextmanager
def entry_lock(path: Path) -> Iterator[None]:
    """An exclusive lock, across processes, on the cache entry ``path`` while it is built (``flock`` on
    ``<path>.lock``, created beside it and left there): a second process compiling the same kernel waits here and
    then finds the entry, instead of running the same minutes of nvcc beside the first. Callers check the cache
    again once they hold it. Where ``fcntl`` is missing (not Linux) nothing is locked; the atomic writes keep
    concurrent builds correct either way."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - ingot's CUDA targets are Linux
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cached_build(entry: Path, use_cache: bool, load: Callable[[], T], build: Callable[[], T],
                 ready: Callable[[], bool] | None = None) -> T:
    """``load()`` where the cache holds ``entry`` (``ready()``; default: the file exists), else ``build()`` (which
    writes it, ``write_entry``) under the entry's lock, the cache checked again once the lock is held: a build another
    process finished while this one waited is loaded, not repeated. ``use_cache`` False: ``build()``, no lock."""
    if not use_cache:
        return build()
    is_ready = ready or entry.is_file
    if is_ready():
        return load()
    with entry_lock(entry):
        return load() if is_ready() else build()


def write_entry(path: Path, data: bytes) -> None:
    """Write a cache entry atomically (a temporary file beside it, then a rename): readers see all of it or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# -- compilers ------------------------------------------------------------------------------------


def _nvrtc():
    from cuda.bindings import nvrtc  # optional dependency: imported on use

    return nvrtc


@functools.cache
def nvrtc_version() -> str | None:
    """``"nvrtc-13.5"``, or ``None`` when cuda.bindings or libnvrtc cannot be loaded."""
    try:
        nvrtc = _nvrtc()
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception:  # ImportError, or the library is missing (raised as RuntimeError)
        return None
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return None
    return f"nvrtc-{major}.{minor}"


def nvcc_path() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)
    if found:
        return found
    for base in map(Path, sys.path):  # the pip wheel nvidia-cuda-nvcc (nvidia/cu13/bin/nvcc)
        for cu in ("cu13", "cu12"):
            p = base / "nvidia" / cu / "bin" / "nvcc"
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
    return None


def cutlass_include_dirs() -> tuple[str, ...]:
    """CUTLASS's C++ include folders from the ``nvidia-cutlass`` wheel (``cutlass_library/source``);
    empty when the wheel is not installed. Found without importing the package (it pulls in scipy)."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return ()
    root = Path(next(iter(spec.submodule_search_locations))) / "source"
    dirs = (root / "include", root / "tools" / "util" / "include")
    return tuple(str(d) for d in dirs) if (dirs[0] / "cutlass" / "cutlass.h").is_file() else ()


def key_options(options: tuple[str, ...] | list[str]) -> list[str]:
    """``options`` as they enter a cache key: the CUTLASS include folders (wherever the wheel is installed)
    become ``-I<cutlass>``, so a cache built on one machine serves another with the same versions (the
    CUTLASS version is in the options as ``-DINGOT_CUTLASS_VERSION``)."""
    dirs = {f"-I{d}" for d in cutlass_include_dirs()}
    return ["-I<cutlass>" if o in dirs else o for o in options]


@functools.cache
def nvcc_version() -> str | None:
    path = nvcc_path()
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    line = [ln for ln in out.splitlines() if ln.strip()][-1:] or ["unknown"]
    return f"nvcc-{line[0].strip()}"


def available_compiler(preferred: str = "auto") -> str:
    """``nvrtc`` or ``nvcc``; raises ``CompilerUnavailable`` saying what to install."""
    if preferred not in ("auto", "nvrtc", "nvcc"):
        raise ValueError(f"compiler must be auto, nvrtc or nvcc, got {preferred!r}")
    if preferred in ("auto", "nvrtc") and nvrtc_version() is not None:
        return "nvrtc"
    if preferred in ("auto", "nvcc") and nvcc_version() is not None:
        return "nvcc"
    raise CompilerUnavailable(
        f"no CUDA compiler for {preferred!r}: install the pip wheels `cuda-bindings nvidia-cuda-nvrtc` "
        "(pip install 'ingot[cuda]') or put a CUDA toolkit's nvcc on PATH / CUDA_HOME")


def _nvrtc_compile(source: str, name: str, arch: str, options: tuple[str, ...]) -> tuple[bytes, str, str]:
    nvrtc = _nvrtc()
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS

    def run(target: str, want_cubin: bool) -> tuple[bytes, str]:
        err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
        if err != ok:
            raise CompileError(f"nvrtcCreateProgram failed: {err}")
        try:
            opts = [o.encode() for o in (f"-arch={target}", *options)]
            (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            # bytearray, never ``b" " * size``: NVRTC writes into the buffer, and for size 1 that
            # expression is CPython's shared one-byte object, so every later b" " would read b"\x00"
            log_buf = bytearray(size)
            nvrtc.nvrtcGetProgramLog(prog, log_buf)
            log = bytes(log_buf).rstrip(b"\x00 ").decode(errors="replace")
            if err != ok:
                raise CompileError(f"NVRTC failed to compile {name} for {target}", log, source)
            if want_cubin:
                _, size = nvrtc.nvrtcGetCUBINSize(prog)
                buf = bytearray(size)
                (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
            else:
                _, size = nvrtc.nvrtcGetPTXSize(prog)
                buf = bytearray(size)
                (err,) = nvrtc.nvrtcGetPTX(prog, buf)
            if err != ok or size <= 1:
                raise CompileError(f"NVRTC produced no {'cubin' if want_cubin else 'PTX'} for {target}", log)
            return bytes(buf), log
        finally:
            nvrtc.nvrtcDestroyProgram(prog)

    cubin, log = run(arch, True)
    ptx, _ = run(arch.replace("sm_", "compute_"), False)
    return cubin, ptx.rstrip(b"\x00").decode(), log


def _nvcc_compile(source: str, name: str, arch: str, options: tuple[str, ...],
                  ptx: bool = True) -> tuple[bytes, str, str]:
    nvcc = nvcc_path()
    assert nvcc is not None
    with tempfile.TemporaryDirectory(prefix="ingot-nvcc-") as tmp:
        src = Path(tmp) / name
        src.write_text(source)
        (Path(tmp) / "k.ptx").write_text("")
        logs = []
        steps = [("-cubin", f"-arch={arch}", "k.cubin"), ("-ptx", f"-arch={arch.replace('sm_', 'compute_')}", "k.ptx")]
        for kind, target, out in steps[:2 if ptx else 1]:
            cmd = [nvcc, kind, target, "-O3", *options, "-o", str(Path(tmp) / out), str(src)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            logs.append(r.stdout + r.stderr)
            if r.returncode != 0:
                raise CompileError(f"nvcc failed to compile {name} for {arch} ({' '.join(cmd)})", logs[-1], source)
        return (Path(tmp) / "k.cubin").read_bytes(), (Path(tmp) / "k.ptx").read_text(), "".join(logs)


# -- driver ---------------------------------------------------------------------------------------


def compile_source(source: str, arch: str, name: str = "kernel.cu", options: tuple[str, ...] = (),
                   compiler: str = "auto", use_cache: bool = True, ptx: bool = True) -> CompiledKernel:
    """Compile ``source`` for ``arch`` (``sm_90a`` or ``sm_100a``) to cubin + PTX, through the cache.
    ``ptx=False`` (nvcc only) builds the cubin alone; ``CompiledKernel.ptx`` is then empty."""
    if arch not in ARCHES:
        raise ValueError(f"arch must be one of {ARCHES}, got {arch!r}")
    which = available_compiler(compiler)
    if not ptx and which != "nvcc":
        raise ValueError("ptx=False needs compiler='nvcc'")
    version = nvrtc_version() if which == "nvrtc" else nvcc_version()
    opts = (*BASE_OPTIONS, *options)
    parts = [source, arch, *key_options(opts), str(version), *([] if ptx else ["no-ptx"])]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    folder = cache_dir() / key[:2]
    cubin_path, ptx_path = folder / f"{key}.cubin", folder / f"{key}.ptx"

    def build() -> CompiledKernel:
        if which == "nvrtc":
            cubin, ptx_text, log = _nvrtc_compile(source, name, arch, opts)
        else:
            cubin, ptx_text, log = _nvcc_compile(source, name, arch, opts, ptx=ptx)
        if use_cache:
            write_entry(ptx_path, ptx_text.encode())
            write_entry(cubin_path, cubin)  # the cubin last: it marks the entry complete
        return CompiledKernel(arch, cubin, ptx_text, key, which, log)

    return cached_build(cubin_path, use_cache, build=build, ready=lambda: cubin_path.is_file() and ptx_path.is_file(),
                        load=lambda: CompiledKernel(arch, cubin_path.read_bytes(), ptx_path.read_text(), key, which,
                                                    cached=True))


def compile_spec(spec: KernelSpec, compiler: str = "auto", use_cache: bool = True) -> CompiledKernel:
    """Render and compile one kernel spec for its own architecture (CUTLASS specs: cubin only, nvcc)."""
    if spec.family == "gemm_cutlass":
        from .kernels.gemm_cutlass.build import compile_cutlass

        return compile_cutlass(spec, use_cache=use_cache)
    return compile_source(spec.source(), spec.arch, name=f"{spec.entry}.cu", compiler=compiler, use_cache=use_cache)
