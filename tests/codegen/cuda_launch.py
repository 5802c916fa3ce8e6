"""A minimal test launcher over ``cuda.bindings.driver``: compile a spec, load its cubin, launch.

Not the runtime backend (that owns an arena, streams and graphs); this only lets the kernel tests
run each spec once, with every CUDA return code checked and outputs poisoned (0xFF bytes: NaN for
floats, -1 for integers) before the launch.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from ingot.codegen.compile import compile_spec
from ingot.codegen.kernel import KernelSpec
from ingot.runtime.kv_tma import tensor_maps


def _driver():
    from cuda.bindings import driver

    return driver


def check(ret):
    """Unwrap a ``cuda.bindings`` result tuple; raise on any error code."""
    cu = _driver()
    err, rest = (ret[0], ret[1:]) if isinstance(ret, tuple) else (ret, ())
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise RuntimeError(f"CUDA error {int(err)}: {name.decode() if name else err}")
    return rest[0] if len(rest) == 1 else rest


@dataclass
class Buffer:
    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class Gpu:
    def __init__(self) -> None:
        cu = _driver()
        check(cu.cuInit(0))
        self.device = check(cu.cuDeviceGet(0))
        self.ctx = check(cu.cuDevicePrimaryCtxRetain(self.device))
        check(cu.cuCtxSetCurrent(self.ctx))
        self._functions: dict[str, object] = {}
        self._modules: dict[str, object] = {}
        self._buffers: list[Buffer] = []
        self.arch = "sm_{}{}a".format(
            check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                          self.device)),
            check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                          self.device)))
        self.sm_count = int(check(cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.device)))

    # -- memory --------------------------------------------------------------------------------
    def alloc(self, shape: tuple[int, ...], dtype, poison: bool = True) -> Buffer:
        cu = _driver()
        buf = Buffer(0, tuple(shape), np.dtype(dtype))
        buf.ptr = int(check(cu.cuMemAlloc(max(buf.nbytes, 1))))
        self._buffers.append(buf)
        if poison and buf.nbytes:
            check(cu.cuMemsetD8(buf.ptr, 0xFF, buf.nbytes))
        return buf

    def upload(self, array: np.ndarray) -> Buffer:
        a = np.ascontiguousarray(array)
        buf = self.alloc(a.shape, a.dtype, poison=False)
        if buf.nbytes:
            check(_driver().cuMemcpyHtoD(buf.ptr, a.view(np.uint8).reshape(-1), buf.nbytes))
        return buf

    def download(self, buf: Buffer) -> np.ndarray:
        out = np.empty(buf.shape, buf.dtype)
        if buf.nbytes:
            check(_driver().cuCtxSynchronize())
            check(_driver().cuMemcpyDtoH(out.view(np.uint8).reshape(-1), buf.ptr, buf.nbytes))
        return out

    def free_all(self) -> None:
        for b in self._buffers:
            check(_driver().cuMemFree(b.ptr))
        self._buffers.clear()

    # -- kernels -------------------------------------------------------------------------------
    def function(self, spec: KernelSpec):
        if spec.arch != self.arch:
            raise ValueError(f"spec is for {spec.arch}, the device is {self.arch}")
        if spec.key not in self._functions:
            cu = _driver()
            compiled = compile_spec(spec)
            module = check(cu.cuModuleLoadData(compiled.cubin))
            fn = check(cu.cuModuleGetFunction(module, spec.entry.encode()))
            if spec.smem > 48 * 1024:  # dynamic shared memory past 48 KiB must be opted into per function
                check(cu.cuFuncSetAttribute(
                    fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, spec.smem))
            self._functions[spec.key] = fn
            self._modules[spec.key] = module
        return self._functions[spec.key]

    def launch(self, spec: KernelSpec, **args) -> None:
        """Launch ``spec`` with its parameters by name (Buffers or None for pointers, ints, floats)."""
        cu = _driver()
        missing = [p.name for p in spec.params if p.name not in args]
        extra = sorted(set(args) - {p.name for p in spec.params})
        if missing or extra:
            raise TypeError(f"{spec.entry}: missing params {missing}, unknown params {extra}")
        packed = []
        for p in spec.params:
            v = args[p.name]
            if p.ctype == "ptr":
                packed.append(ctypes.c_uint64(0 if v is None else v.ptr))
            elif p.ctype == "i32":
                packed.append(ctypes.c_int32(int(v)))
            elif p.ctype == "i64":
                packed.append(ctypes.c_int64(int(v)))
            else:
                packed.append(ctypes.c_float(float(v)))
        pointers = (ctypes.c_void_p * len(packed))(*[ctypes.addressof(x) for x in packed])
        ints = {p.name: int(args[p.name]) for p in spec.params if p.ctype in ("i32", "i64")}
        grid = spec.grid_dims(ints)
        if min(grid) == 0:
            return
        fn = self.function(spec)
        for name, fill in tensor_maps(spec):  # the KV cache's or the weight's tensor map over this launch's buffer
            fill(self._modules[spec.key], spec, args[name].ptr, args[name].nbytes)
        check(cu.cuLaunchKernel(fn, *grid, *spec.block, spec.smem, 0, ctypes.addressof(pointers), 0))
        check(cu.cuCtxSynchronize())
