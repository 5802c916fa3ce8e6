"""Compile CUDA source to cubin + PTX for ``sm_90a`` / ``sm_100a``, with a content-addressed cache.

Two compilers, same result shape:

- ``nvrtc``: NVRTC through ``cuda.bindings.nvrtc`` (pip wheels ``cuda-bindings`` and
  ``nvidia-cuda-nvrtc``), so a machine without a CUDA toolkit can compile. The cubin comes from
  ``-arch=sm_XXa``, the PTX from a second run with ``-arch=compute_XXa`` (NVRTC gives one or the other).
- ``nvcc``: the toolkit's ``nvcc -cubin`` / ``nvcc -ptx`` (``$CUDA_HOME/bin`` or ``PATH``).

``compiler="auto"`` takes NVRTC where it loads, else nvcc. The cache key is the sha256 of the
source, the options, the architecture and the compiler's version, so an unchanged kernel is
never compiled twice; entries are written atomically (temp file + rename), so concurrent
compiles of the same kernel are safe. The cache lives in ``$INGOT_CACHE_DIR`` (default
``~/.cache/ingot/kernels``).

Kernel sources include no CUDA headers (``codegen/kernels/common.cuh`` defines the storage
types), so neither compiler needs a toolkit's include directory.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .kernel import KernelSpec

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
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)


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
            log_buf = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log_buf)
            log = log_buf.rstrip(b"\x00 ").decode(errors="replace")
            if err != ok:
                raise CompileError(f"NVRTC failed to compile {name} for {target}", log, source)
            if want_cubin:
                _, size = nvrtc.nvrtcGetCUBINSize(prog)
                buf = b" " * size
                (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
            else:
                _, size = nvrtc.nvrtcGetPTXSize(prog)
                buf = b" " * size
                (err,) = nvrtc.nvrtcGetPTX(prog, buf)
            if err != ok or size <= 1:
                raise CompileError(f"NVRTC produced no {'cubin' if want_cubin else 'PTX'} for {target}", log)
            return buf, log
        finally:
            nvrtc.nvrtcDestroyProgram(prog)

    cubin, log = run(arch, True)
    ptx, _ = run(arch.replace("sm_", "compute_"), False)
    return cubin, ptx.rstrip(b"\x00").decode(), log


def _nvcc_compile(source: str, name: str, arch: str, options: tuple[str, ...]) -> tuple[bytes, str, str]:
    nvcc = nvcc_path()
    assert nvcc is not None
    with tempfile.TemporaryDirectory(prefix="ingot-nvcc-") as tmp:
        src = Path(tmp) / name
        src.write_text(source)
        logs = []
        for kind, target, out in (("-cubin", f"-arch={arch}", "k.cubin"),
                                  ("-ptx", f"-arch={arch.replace('sm_', 'compute_')}", "k.ptx")):
            cmd = [nvcc, kind, target, "-O3", *options, "-o", str(Path(tmp) / out), str(src)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            logs.append(r.stdout + r.stderr)
            if r.returncode != 0:
                raise CompileError(f"nvcc failed to compile {name} for {arch} ({' '.join(cmd)})", logs[-1], source)
        return (Path(tmp) / "k.cubin").read_bytes(), (Path(tmp) / "k.ptx").read_text(), "".join(logs)


# -- driver ---------------------------------------------------------------------------------------


def compile_source(source: str, arch: str, name: str = "kernel.cu", options: tuple[str, ...] = (),
                   compiler: str = "auto", use_cache: bool = True) -> CompiledKernel:
    """Compile ``source`` for ``arch`` (``sm_90a`` or ``sm_100a``) to cubin + PTX, through the cache."""
    if arch not in ARCHES:
        raise ValueError(f"arch must be one of {ARCHES}, got {arch!r}")
    which = available_compiler(compiler)
    version = nvrtc_version() if which == "nvrtc" else nvcc_version()
    opts = (*BASE_OPTIONS, *options)
    key = hashlib.sha256("\0".join([source, arch, *opts, str(version)]).encode()).hexdigest()
    folder = cache_dir() / key[:2]
    cubin_path, ptx_path = folder / f"{key}.cubin", folder / f"{key}.ptx"
    if use_cache and cubin_path.is_file() and ptx_path.is_file():
        return CompiledKernel(arch, cubin_path.read_bytes(), ptx_path.read_text(), key, which, cached=True)
    fn = _nvrtc_compile if which == "nvrtc" else _nvcc_compile
    cubin, ptx, log = fn(source, name, arch, opts)
    if use_cache:
        folder.mkdir(parents=True, exist_ok=True)
        for path, data in ((ptx_path, ptx.encode()), (cubin_path, cubin)):  # cubin last: it marks completion
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
    return CompiledKernel(arch, cubin, ptx, key, which, log)


def compile_spec(spec: KernelSpec, compiler: str = "auto", use_cache: bool = True) -> CompiledKernel:
    """Render and compile one kernel spec for its own architecture."""
    return compile_source(spec.source(), spec.arch, name=f"{spec.entry}.cu", compiler=compiler, use_cache=use_cache)
