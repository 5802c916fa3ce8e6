"""The GPU all-reduce: ``ncclAllReduce`` (sum) of arena buffers on the CUDA backend's stream.

NOT RUN IN THIS SESSION (no GPU here; written for the lead's 2-GPU run). The CUDA backend keeps every
activation in one arena and knows buffers only as raw device pointers with an ingot dtype (bf16 in
the serving form), while nccl4py's ``Communicator.allreduce`` takes typed buffer objects (DLPack or
``__cuda_array_interface__``, which has no bf16). So this module calls the NCCL C API that nccl4py
wraps, through ctypes on the same library: ``libnccl.so.2`` from the ``nvidia-nccl-cu12`` wheel
(nccl4py's dependency; ``INGOT_NCCL_LIBRARY`` overrides the path). Every call's ``ncclResult_t`` is
checked; an error names the call, NCCL's error string and its last error message.

One ``NcclAllReduce`` per rank and process (rank r on device r): ``new_unique_id()`` on the driver,
passed to every rank, then ``NcclAllReduce(rank, size, unique_id, device)`` on each (they block until
all ranks joined). ``all_reduce`` enqueues on a stream and returns; it may be captured in a CUDA graph
(the decode graphs of ``runtime/cuda_backend.py``). ``NCCL_RUNTIME_CONNECT=0`` is set (unless given)
so that connections are made at init, never lazily inside a graph capture.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path
from typing import Any

NCCL_UNIQUE_ID_BYTES = 128
#: ncclDataType_t by ingot dtype name
NCCL_DTYPES = {"f16": 6, "f32": 7, "f64": 8, "bf16": 9}
NCCL_SUM = 0


class NcclError(RuntimeError):
    """NCCL is missing or one of its calls failed."""


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * NCCL_UNIQUE_ID_BYTES)]


def _candidates() -> list[str]:
    found = []
    env = os.environ.get("INGOT_NCCL_LIBRARY")
    if env:
        found.append(env)
    for module in ("nvidia.nccl", "nccl"):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        for d in (spec.submodule_search_locations or []) if spec else []:
            found += [str(p) for p in sorted(Path(d).rglob("libnccl.so*"))]
    found += ["libnccl.so.2", "libnccl.so"]
    return found


_lib: Any = None


def library() -> Any:
    """``libnccl`` loaded once (``NcclError`` naming every place tried when it is nowhere)."""
    global _lib
    if _lib is not None:
        return _lib
    errors = []
    for cand in _candidates():
        try:
            lib = ctypes.CDLL(cand)
            break
        except OSError as e:
            errors.append(f"{cand}: {e}")
    else:
        raise NcclError("NCCL is not available: pip install 'ingot[cuda]' (nvidia-nccl-cu12, nccl4py) or set "
                        "INGOT_NCCL_LIBRARY to libnccl.so.2; tried " + "; ".join(errors))
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetErrorString.argtypes = [ctypes.c_int]
    if hasattr(lib, "ncclGetLastError"):
        lib.ncclGetLastError.restype = ctypes.c_char_p
        lib.ncclGetLastError.argtypes = [ctypes.c_void_p]
    lib.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(_UniqueId)]
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, _UniqueId, ctypes.c_int]
    lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p]
    lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
    lib.ncclCommAbort.argtypes = [ctypes.c_void_p]
    for fn in ("ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclAllReduce", "ncclCommDestroy",
               "ncclCommAbort"):
        getattr(lib, fn).restype = ctypes.c_int
    _lib = lib
    return lib


def check(result: int, what: str, comm: Any = None) -> None:
    if result == 0:
        return
    lib = library()
    text = (lib.ncclGetErrorString(result) or b"?").decode(errors="replace")
    last = ""
    if hasattr(lib, "ncclGetLastError"):
        last = (lib.ncclGetLastError(comm) or b"").decode(errors="replace")
    raise NcclError(f"{what} failed: ncclResult {result} ({text})" + (f": {last}" if last else ""))


def version() -> int:
    v = ctypes.c_int(0)
    check(library().ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
    return int(v.value)


def available(min_devices: int = 2) -> tuple[bool, str]:
    """Whether this machine can run a ``min_devices``-rank NCCL group, and why not."""
    try:
        library()
    except NcclError as e:
        return False, str(e)
    try:
        from ..cuda_driver import check as cu_check
        from ..cuda_driver import driver, init

        init()
        n = int(cu_check(driver().cuDeviceGetCount(), "cuDeviceGetCount"))
    except Exception as e:  # no driver, no device
        return False, f"no CUDA device ({type(e).__name__}: {e})"
    if n < min_devices:
        return False, f"{n} CUDA device(s); tensor parallelism over {min_devices} ranks needs {min_devices}"
    return True, ""


def new_unique_id() -> bytes:
    """A fresh ``ncclUniqueId`` (128 bytes) for ``NcclAllReduce`` on every rank."""
    uid = _UniqueId()
    check(library().ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    return bytes(bytearray(uid.internal))


class NcclAllReduce:
    """One rank's NCCL communicator; the device (its primary context) must be current on this thread."""

    def __init__(self, rank: int, size: int, unique_id: bytes, device: int) -> None:
        if len(unique_id) != NCCL_UNIQUE_ID_BYTES:
            raise NcclError(f"an NCCL unique id has {NCCL_UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
        os.environ.setdefault("NCCL_RUNTIME_CONNECT", "0")
        lib = library()
        self.rank, self.size, self.device = rank, size, device
        uid = _UniqueId()
        ctypes.memmove(ctypes.addressof(uid), unique_id, NCCL_UNIQUE_ID_BYTES)
        comm = ctypes.c_void_p()
        check(lib.ncclCommInitRank(ctypes.byref(comm), size, uid, rank),
              f"ncclCommInitRank(rank {rank} of {size}, device {device})")
        self.comm = comm

    def all_reduce(self, send: int, recv: int, count: int, dtype: str, stream: Any) -> None:
        """Enqueue ``recv[:count] = sum over ranks of send[:count]`` on ``stream`` (a CUstream or its address)."""
        if count <= 0:
            return
        if dtype not in NCCL_DTYPES:
            raise NcclError(f"all_reduce of {dtype} tensors: NCCL sums {', '.join(NCCL_DTYPES)}")
        if self.comm is None:
            raise NcclError("all_reduce on a closed communicator")
        check(library().ncclAllReduce(ctypes.c_void_p(send), ctypes.c_void_p(recv), count, NCCL_DTYPES[dtype],
                                      NCCL_SUM, self.comm, ctypes.c_void_p(int(stream))),
              f"ncclAllReduce(rank {self.rank}, {count} x {dtype})", self.comm)

    def abort(self) -> None:
        if self.comm is not None:
            library().ncclCommAbort(self.comm)
            self.comm = None

    def close(self) -> None:
        if self.comm is not None:
            check(library().ncclCommDestroy(self.comm), "ncclCommDestroy")
            self.comm = None


# -- point-to-point (the disaggregated KV transfer, runtime/disagg/nccl.py) ------------------------
# Added beside the all-reduce without changing it: a two-rank ``NcclAllReduce`` is the pair's
# communicator, and these functions enqueue ncclSend / ncclRecv of raw bytes on it.

NCCL_UINT8 = 1
#: ncclResult_t of an operation still running (non-blocking communicators); not an error
NCCL_IN_PROGRESS = 7

_p2p_lib: Any = None


def p2p_library() -> Any:
    """``library()`` with the point-to-point entry points' signatures declared (once)."""
    global _p2p_lib
    if _p2p_lib is not None:
        return _p2p_lib
    lib = library()
    for fn in ("ncclSend", "ncclRecv"):
        getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_void_p]
    lib.ncclGroupStart.argtypes = []
    lib.ncclGroupEnd.argtypes = []
    lib.ncclCommGetAsyncError.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    for fn in ("ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd", "ncclCommGetAsyncError"):
        getattr(lib, fn).restype = ctypes.c_int
    _p2p_lib = lib
    return lib


def _open(comm: NcclAllReduce, what: str) -> Any:
    if comm.comm is None:
        raise NcclError(f"{what} on a closed communicator")
    return comm.comm


def send_bytes(comm: NcclAllReduce, buf: int, nbytes: int, peer: int, stream: Any) -> None:
    """Enqueue ``ncclSend`` of ``nbytes`` bytes at device address ``buf`` to rank ``peer`` on ``stream``."""
    c = _open(comm, "ncclSend")
    check(p2p_library().ncclSend(ctypes.c_void_p(buf), nbytes, NCCL_UINT8, peer, c, ctypes.c_void_p(int(stream))),
          f"ncclSend(rank {comm.rank} -> {peer}, {nbytes} bytes)", c)


def recv_bytes(comm: NcclAllReduce, buf: int, nbytes: int, peer: int, stream: Any) -> None:
    """Enqueue ``ncclRecv`` of ``nbytes`` bytes into device address ``buf`` from rank ``peer`` on ``stream``."""
    c = _open(comm, "ncclRecv")
    check(p2p_library().ncclRecv(ctypes.c_void_p(buf), nbytes, NCCL_UINT8, peer, c, ctypes.c_void_p(int(stream))),
          f"ncclRecv(rank {comm.rank} <- {peer}, {nbytes} bytes)", c)


def group_start() -> None:
    check(p2p_library().ncclGroupStart(), "ncclGroupStart")


def group_end() -> None:
    check(p2p_library().ncclGroupEnd(), "ncclGroupEnd")


def async_error(comm: NcclAllReduce) -> int:
    """``ncclCommGetAsyncError``: 0 while healthy (``NCCL_IN_PROGRESS`` while a non-blocking call runs)."""
    if comm.comm is None:
        return 0
    err = ctypes.c_int(0)
    check(p2p_library().ncclCommGetAsyncError(comm.comm, ctypes.byref(err)), "ncclCommGetAsyncError", comm.comm)
    return int(err.value)


def error_string(result: int) -> str:
    return (library().ncclGetErrorString(result) or b"?").decode(errors="replace")
