"""Build CUTLASS GEMM specs: the kernel's cubin (nvcc ``-cubin``) and its host shim (a shared library).

Both come from the same rendered source and land in the kernel cache (``$INGOT_CACHE_DIR``), keyed
by the source, the options, the nvcc version and the ``nvidia-cutlass`` version, so an unchanged
kernel is never rebuilt (a build takes 20-60 s and 3-5 GB). At most ``$INGOT_CUTLASS_JOBS``
(default 2) builds run at once in a process.

How a runtime launches one (the spec's ``values["ABI"] == "cutlass-params-v1"``)::

    lib = ctypes.CDLL(build_shim(spec))            # host code only, no device code inside
    size = lib.<entry>_params_size()
    rc = lib.<entry>_prepare(x, w, x_block_scale, w_block_scale, x_scale, w_scale, bias, residual, out,
                             M, sm_count, params_buf, size, launch_int10)   # 0 = ok
    # launch = grid xyz, block xyz, cluster xyz, dynamic smem bytes
    fn = cuModuleGetFunction(cuModuleLoadData(compile_cutlass(spec).cubin), spec.entry)
    cuFuncSetAttribute(fn, MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
    cuLaunchKernelEx(config(grid, block, smem, stream, attrs=[CLUSTER_DIMENSION(cluster)]),
                     fn, kernelParams=[params_buf])     # one by-value argument: the Params blob

The Params blob holds the TMA descriptors, so it is tied to the buffer addresses and M it was built
for: build it once per (buffers, M), e.g. once per CUDA-graph batch bucket over the arena.
Unused pointers are 0 (scales read as 1, bias as 0); ``residual`` must be given exactly when the
spec has ``HAS_RESIDUAL``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import tempfile
import threading
from functools import cache
from pathlib import Path

from ...compile import (
    CompiledKernel,
    CompileError,
    cache_dir,
    cached_build,
    compile_source,
    cutlass_include_dirs,
    key_options,
    nvcc_path,
    nvcc_version,
    write_entry,
)
from ...kernel import KernelSpec

#: besides compile.BASE_OPTIONS; -DNDEBUG drops CUTLASS's device asserts
CUTLASS_OPTIONS = ("-DNDEBUG", "--expt-relaxed-constexpr", "-Xptxas=-w")


@cache
def _jobs() -> threading.BoundedSemaphore:
    return threading.BoundedSemaphore(max(1, int(os.environ.get("INGOT_CUTLASS_JOBS", "2"))))


def cutlass_version() -> str | None:
    try:
        return importlib.metadata.version("nvidia-cutlass")
    except importlib.metadata.PackageNotFoundError:
        return None


def cutlass_available() -> bool:
    """True when nvcc and the nvidia-cutlass wheel's headers are both present."""
    return nvcc_path() is not None and bool(cutlass_include_dirs())


def cutlass_options() -> tuple[str, ...]:
    dirs = cutlass_include_dirs()
    if not dirs:
        raise CompileError("CUTLASS headers not found: pip install nvidia-cutlass (the 4.2 wheel ships them)")
    return (*CUTLASS_OPTIONS, f"-DINGOT_CUTLASS_VERSION={cutlass_version()}", *(f"-I{d}" for d in dirs))


def compile_cutlass(spec: KernelSpec, use_cache: bool = True) -> CompiledKernel:
    """The spec's cubin (no PTX: arch-specific ``a`` code has no forward-compatible PTX)."""
    with _jobs():
        return compile_source(spec.source(), spec.arch, name=f"{spec.entry}.cu", options=cutlass_options(),
                              compiler="nvcc", use_cache=use_cache, ptx=False)


def build_shim(spec: KernelSpec, use_cache: bool = True) -> Path:
    """The spec's host shim, ``<cache>/<key>.so`` (see the module docstring for its functions)."""
    source = spec.source()
    opts = (*cutlass_options(), "-std=c++17", "-O2", "-DINGOT_HOST_SHIM", "-shared", "-Xcompiler=-fPIC",
            f"-arch={spec.arch}")
    key = hashlib.sha256("\0".join([source, *key_options(opts), str(nvcc_version()), "shim"]).encode()).hexdigest()
    path = cache_dir() / key[:2] / f"{key}.so"
    if use_cache and path.is_file():
        return path
    nvcc = nvcc_path()
    if nvcc is None:
        raise CompileError("nvcc not found: install a CUDA toolkit or pip install nvidia-cuda-nvcc")

    def build() -> Path:
        with _jobs(), tempfile.TemporaryDirectory(prefix="ingot-shim-") as tmp:
            src = Path(tmp) / f"{spec.entry}.cu"
            src.write_text(source)
            out = Path(tmp) / "shim.so"
            r = subprocess.run([nvcc, *opts, "-o", str(out), str(src)], capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                raise CompileError(f"nvcc failed to build the host shim of {spec.entry}", r.stdout + r.stderr, source)
            write_entry(path, out.read_bytes())
        return path

    return cached_build(path, use_cache, load=lambda: path, build=build)
