"""A reference launcher for CUTLASS GEMM specs (ABI ``cutlass-params-v1``) through the driver API.

What a runtime does with a ``gemm_cutlass`` spec, in ~60 lines: load the cubin, ask the host shim
for the Params blob and launch configuration of one (buffers, M), launch with the cluster shape
as a launch attribute. Needs ``cuda-bindings`` and a current CUDA context (the primary one works).
The GPU tests use it; the CUDA backend can use it or copy it.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from ...kernel import KernelSpec

#: the pointer arguments of ``_prepare``, in order (then M, sm_count)
POINTERS = ("x", "weight", "x_block_scale", "weight_block_scale", "x_scale", "weight_scale", "bias", "residual",
            "out")


def _check(result: tuple) -> object:
    from cuda.bindings import driver

    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver call failed: {err}")
    return rest[0] if len(rest) == 1 else rest


@dataclass
class Prepared:
    """One launch's Params blob (tied to its buffers and M) and configuration."""

    params: ctypes.Array
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    cluster: tuple[int, int, int]
    smem: int


class CutlassGemm:
    def __init__(self, spec: KernelSpec, cubin: bytes, shim: Path | str) -> None:
        from cuda.bindings import driver

        self.spec = spec
        self._lib = ctypes.CDLL(str(shim))
        self._size = getattr(self._lib, f"{spec.entry}_params_size")
        self._size.restype = ctypes.c_ulonglong
        self._prepare = getattr(self._lib, f"{spec.entry}_prepare")
        self._prepare.restype = ctypes.c_int
        self._prepare.argtypes = [ctypes.c_void_p] * len(POINTERS) + [
            ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_int)]
        self._prepare_nk = getattr(self._lib, f"{spec.entry}_prepare_nk")
        self._prepare_nk.restype = ctypes.c_int
        self._prepare_nk.argtypes = [ctypes.c_void_p] * len(POINTERS) + [
            ctypes.c_longlong, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p,
            ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_int)]
        # sm90.cu's shims take the scheduler's max swizzle per Params (other templates have no such knob)
        self._set_swizzle = getattr(self._lib, f"{spec.entry}_set_max_swizzle", None)
        if self._set_swizzle is not None:
            self._set_swizzle.argtypes = [ctypes.c_int]
        self._cubin = cubin  # cuModuleLoadData reads it; keep it alive
        if not int(_check(driver.cuCtxGetCurrent())):  # no context yet: use device 0's primary one
            _check(driver.cuInit(0))
            ctx = _check(driver.cuDevicePrimaryCtxRetain(_check(driver.cuDeviceGet(0))))
            _check(driver.cuCtxSetCurrent(ctx))
        self.module = _check(driver.cuModuleLoadData(cubin))
        self.function = _check(driver.cuModuleGetFunction(self.module, spec.entry.encode()))
        self._smem_set = 0

    def max_swizzle(self, m: int, n: int, k: int) -> int:
        """The sm90 scheduler's max swizzle the runtime's Params take for this problem (``cutlass_params``): the
        spec's ``MAX_SWIZZLE``, or ``rule.auto_swizzle``'s where that is 0."""
        from .cutlass_params import scheduler_knobs, sm90_max_swizzle

        v = dict(self.spec.values)
        s = {"tile": [int(v["TILE_M"]), int(v["TILE_N"])], "cluster": [int(v["CLUSTER_M"]), int(v["CLUSTER_N"])]}
        return sm90_max_swizzle(s | scheduler_knobs(v), m, n, k)

    def prepare(self, pointers: dict[str, int], M: int, sm_count: int, N: int | None = None,
                K: int | None = None, max_swizzle: int | None = None) -> Prepared:
        """Params for ``pointers`` (names from ``POINTERS``; missing ones are null) and ``M`` rows; ``N`` and
        ``K`` default to the spec's own (give them for a shape-generic spec, rendered with N = K = 0). On sm90
        the scheduler's max swizzle is ``max_swizzle``, by default the runtime's choice (``self.max_swizzle``)."""
        unknown = set(pointers) - set(POINTERS)
        if unknown:
            raise ValueError(f"unknown pointers {sorted(unknown)}; known: {POINTERS}")
        n, k = N or self.spec.value("N"), K or self.spec.value("K")
        if self._set_swizzle is not None:
            self._set_swizzle(self.max_swizzle(M, n, k) if max_swizzle is None else max_swizzle)
        size = int(self._size())
        buf = (ctypes.c_uint8 * size)()
        cfg = (ctypes.c_int * 10)()
        ptrs = [pointers.get(name) or None for name in POINTERS]
        if N is None and K is None:
            rc = self._prepare(*ptrs, M, sm_count, buf, size, cfg)
        else:
            rc = self._prepare_nk(*ptrs, M, n, k, sm_count, buf, size, cfg)
        if rc != 0:
            raise RuntimeError(f"{self.spec.entry}_prepare failed with {rc} (see entry.cuh for the codes)")
        return Prepared(buf, tuple(cfg[0:3]), tuple(cfg[3:6]), tuple(cfg[6:9]), int(cfg[9]))

    def launch(self, p: Prepared, stream: int = 0) -> None:
        from cuda.bindings import driver

        if p.smem > self._smem_set:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(driver.cuFuncSetAttribute(self.function, attr, p.smem))
            self._smem_set = p.smem
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = p.grid
        config.blockDimX, config.blockDimY, config.blockDimZ = p.block
        config.sharedMemBytes = p.smem
        config.hStream = driver.CUstream(stream)
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = p.cluster
        config.attrs = [attr]
        config.numAttrs = 1
        args = (ctypes.c_void_p * 1)(ctypes.addressof(p.params))
        _check(driver.cuLaunchKernelEx(config, self.function, ctypes.addressof(args), 0))
