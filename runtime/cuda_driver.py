"""A thin, checked layer over the CUDA driver API (``cuda.bindings.driver``, from cuda-python).

cuda.bindings opens ``libcuda.so.1`` itself when first used, so one install runs under any CUDA 12.x
or 13.x driver that supports the artifact's architecture; nothing here links against a toolkit.
Every call goes through ``check``, which turns an error code into ``CudaError`` naming the call and
the driver's error name. A machine without a driver (``libcuda.so.1`` missing: cuda.bindings raises
instead of returning an error code) or without a device gives ``CudaUnavailable`` with a message
that says so and points at ``device="cpu"``.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np


class CudaUnavailable(RuntimeError):
    """No usable CUDA driver or device here; the CPU backend (``device="cpu"``) still works."""


class CudaError(RuntimeError):
    """A CUDA driver call returned an error."""


_HINT = "; the CPU backend is available with device='cpu'"


def driver() -> Any:
    """The ``cuda.bindings.driver`` module (raises ``CudaUnavailable`` when cuda-python is missing)."""
    try:
        from cuda.bindings import driver as cu
    except ImportError as e:
        raise CudaUnavailable(f"device='cuda' needs cuda-python: pip install 'ingot[cuda]' ({e}){_HINT}") from None
    return cu


def check(ret: Any, what: str = "CUDA call") -> Any:
    """Unwrap a cuda.bindings result tuple; raise ``CudaError`` on any error code."""
    cu = driver()
    err, rest = (ret[0], ret[1:]) if isinstance(ret, tuple) else (ret, ())
    if err != cu.CUresult.CUDA_SUCCESS:
        try:
            _, name = cu.cuGetErrorName(err)
            _, desc = cu.cuGetErrorString(err)
            text = f"{name.decode()}: {desc.decode()}"
        except Exception:  # the error getters themselves failing must not hide the error
            text = str(err)
        raise CudaError(f"{what} failed: {text} (CUresult {int(err)})")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


_initialized = False


def init() -> None:
    """``cuInit`` once; ``CudaUnavailable`` when there is no driver or no device."""
    global _initialized
    if _initialized:
        return
    cu = driver()
    try:
        err = cu.cuInit(0)
    except Exception as e:  # libcuda.so.1 missing: cuda.bindings raises (RuntimeError) rather than returning
        raise CudaUnavailable(f"device='cuda' needs an NVIDIA driver, but libcuda.so.1 could not be loaded "
                              f"({type(e).__name__}: {e}){_HINT}") from None
    err = err[0] if isinstance(err, tuple) else err
    if err != cu.CUresult.CUDA_SUCCESS:
        try:
            name = cu.cuGetErrorName(err)[1].decode()
        except Exception:
            name = str(err)
        raise CudaUnavailable(f"cuInit failed ({name}): no usable NVIDIA GPU or driver{_HINT}")
    count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
    if count < 1:
        raise CudaUnavailable(f"the CUDA driver sees no GPU{_HINT}")
    _initialized = True


def driver_version() -> int:
    init()
    return int(check(driver().cuDriverGetVersion(), "cuDriverGetVersion"))


class Context:
    """The primary context of one device, made current on the calling thread."""

    def __init__(self, ordinal: int = 0) -> None:
        init()
        cu = driver()
        count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        if not 0 <= ordinal < count:
            raise CudaUnavailable(f"no CUDA device {ordinal}: this machine has {count}{_HINT}")
        self.device = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        self.ctx = check(cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self.make_current()
        attr = cu.CUdevice_attribute
        major = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device))
        minor = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device))
        self.compute_capability = (int(major), int(minor))
        self.num_sms = int(check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.device)))
        name = check(cu.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = bytes(name).split(b"\0", 1)[0].decode(errors="replace")

    @property
    def sm(self) -> int:
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    def make_current(self) -> None:
        check(driver().cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory."""
        free, total = check(driver().cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def synchronize(self) -> None:
        check(driver().cuCtxSynchronize(), "cuCtxSynchronize")


class DeviceMemory:
    """One ``cuMemAlloc`` allocation (the arena)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(check(driver().cuMemAlloc(self.nbytes), f"cuMemAlloc({self.nbytes} bytes)"))

    def free(self) -> None:
        if self.ptr:
            check(driver().cuMemFree(self.ptr), "cuMemFree")
            self.ptr = 0


class PinnedBuffer:
    """Page-locked host memory (``cuMemAllocHost``) viewed as a numpy byte array, for async copies."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(check(driver().cuMemAllocHost(self.nbytes), f"cuMemAllocHost({self.nbytes} bytes)"))
        self.array = np.ctypeslib.as_array((ctypes.c_uint8 * self.nbytes).from_address(self.ptr))

    def view(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.array[offset : offset + n].view(dtype).reshape(shape)

    def free(self) -> None:
        if self.ptr:
            check(driver().cuMemFreeHost(self.ptr), "cuMemFreeHost")
            self.ptr = 0


class Stream:
    def __init__(self) -> None:
        cu = driver()
        self.handle = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")

    def synchronize(self) -> None:
        check(driver().cuStreamSynchronize(self.handle), "cuStreamSynchronize")

    def destroy(self) -> None:
        if self.handle is not None:
            check(driver().cuStreamDestroy(self.handle), "cuStreamDestroy")
            self.handle = None


def memcpy_htod(dst: int, src_ptr: int, nbytes: int, stream: Stream | None = None) -> None:
    if nbytes <= 0:
        return
    cu = driver()
    if stream is None:
        check(cu.cuMemcpyHtoD(dst, src_ptr, nbytes), "cuMemcpyHtoD")
    else:
        check(cu.cuMemcpyHtoDAsync(dst, src_ptr, nbytes, stream.handle), "cuMemcpyHtoDAsync")


def memcpy_dtoh(dst_ptr: int, src: int, nbytes: int, stream: Stream | None = None) -> None:
    if nbytes <= 0:
        return
    cu = driver()
    if stream is None:
        check(cu.cuMemcpyDtoH(dst_ptr, src, nbytes), "cuMemcpyDtoH")
    else:
        check(cu.cuMemcpyDtoHAsync(dst_ptr, src, nbytes, stream.handle), "cuMemcpyDtoHAsync")


def memcpy_dtod(dst: int, src: int, nbytes: int, stream: Stream | None = None) -> None:
    if nbytes <= 0:
        return
    cu = driver()
    if stream is None:
        check(cu.cuMemcpyDtoD(dst, src, nbytes), "cuMemcpyDtoD")
    else:
        check(cu.cuMemcpyDtoDAsync(dst, src, nbytes, stream.handle), "cuMemcpyDtoDAsync")


def stream_done(stream: Stream) -> bool:
    """``cuStreamQuery``: True once all work enqueued on ``stream`` has finished (raises on an error)."""
    cu = driver()
    ret = cu.cuStreamQuery(stream.handle)
    err = ret[0] if isinstance(ret, tuple) else ret
    if err == cu.CUresult.CUDA_ERROR_NOT_READY:
        return False
    check(ret, "cuStreamQuery")
    return True


class Event:
    """A CUDA event for timing work on a stream (``cuEventRecord`` / ``cuEventElapsedTime``)."""

    def __init__(self) -> None:
        self.handle = check(driver().cuEventCreate(0), "cuEventCreate")

    def record(self, stream: Stream) -> None:
        check(driver().cuEventRecord(self.handle, stream.handle), "cuEventRecord")

    def synchronize(self) -> None:
        check(driver().cuEventSynchronize(self.handle), "cuEventSynchronize")

    def elapsed_ms(self, start: Event) -> float:
        """Milliseconds from ``start`` to this event (both recorded and complete)."""
        cu = driver()
        fn = getattr(cu, "cuEventElapsedTime", None) or cu.cuEventElapsedTime_v2
        return float(check(fn(start.handle, self.handle), "cuEventElapsedTime"))

    def destroy(self) -> None:
        if self.handle is not None:
            check(driver().cuEventDestroy(self.handle), "cuEventDestroy")
            self.handle = None


def memset(dst: int, nbytes: int, byte: int = 0) -> None:
    if nbytes > 0:
        check(driver().cuMemsetD8(dst, byte, nbytes), "cuMemsetD8")


class Module:
    """A cubin loaded with ``cuModuleLoadData``."""

    def __init__(self, image: bytes, what: str = "module") -> None:
        self.what = what
        self.handle = check(driver().cuModuleLoadData(image), f"cuModuleLoadData({what})")

    def function(self, name: str) -> Any:
        return check(driver().cuModuleGetFunction(self.handle, name.encode()), f"cuModuleGetFunction({name})")

    def unload(self) -> None:
        if self.handle is not None:
            check(driver().cuModuleUnload(self.handle), "cuModuleUnload")
            self.handle = None


def launch(fn: Any, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, stream: Stream,
           params_addr: int, what: str = "kernel", pdl: bool = False) -> None:
    """``cuLaunchKernel`` with ``params_addr`` the address of an array of pointers to the arguments. ``pdl``:
    ``cuLaunchKernelEx`` with programmatic stream serialization, for kernels that start with the PDL prologue
    (``codegen/kernel.py``: they wait for the previous grid themselves, so it may be scheduled before that grid
    ends; captured into CUDA graphs as programmatic edges)."""
    if not pdl:
        check(driver().cuLaunchKernel(fn, *grid, *block, smem, stream.handle, params_addr, 0),
              f"cuLaunchKernel({what})")
        return
    key = (grid, block, smem, int(stream.handle))
    config = _PDL_CONFIGS.get(key)
    if config is None:
        cu = driver()
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        config.sharedMemBytes = smem
        config.hStream = stream.handle
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config.attrs = [attr]
        config.numAttrs = 1
        if len(_PDL_CONFIGS) > 4096:
            _PDL_CONFIGS.clear()
        _PDL_CONFIGS[key] = config
    check(driver().cuLaunchKernelEx(config, fn, params_addr, 0), f"cuLaunchKernelEx({what}, PDL)")


#: launch configurations of PDL launches, by (grid, block, smem, stream): built once, reused every step
_PDL_CONFIGS: dict[tuple[Any, ...], Any] = {}


def pdl_enabled() -> bool:
    """Programmatic dependent launch for kernels marked ``pdl`` (default on; ``INGOT_PDL=0`` turns it off)."""
    return os.environ.get("INGOT_PDL", "1").strip() != "0"


class CudaGraph:
    """A stream capture turned into an executable graph (``cuStreamBeginCapture`` ... ``cuGraphInstantiate``)."""

    def __init__(self, stream: Stream, record: Any) -> None:
        cu = driver()
        check(cu.cuStreamBeginCapture(stream.handle, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
              "cuStreamBeginCapture")
        try:
            record()
        except BaseException:
            try:
                cu.cuStreamEndCapture(stream.handle)
            finally:
                raise
        self.graph = check(cu.cuStreamEndCapture(stream.handle), "cuStreamEndCapture")
        self.exec = check(cu.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")

    def launch(self, stream: Stream) -> None:
        check(driver().cuGraphLaunch(self.exec, stream.handle), "cuGraphLaunch")

    def destroy(self) -> None:
        cu = driver()
        if self.exec is not None:
            check(cu.cuGraphExecDestroy(self.exec), "cuGraphExecDestroy")
            self.exec = None
        if self.graph is not None:
            check(cu.cuGraphDestroy(self.graph), "cuGraphDestroy")
            self.graph = None
