"""Transfer buffers in device memory: a reusing pool, and a transfer's KV blocks held in one of its buffers.

The NCCL transport (``nccl.py``) moves each transfer as one contiguous buffer: the prefill worker's
engine copies the request's blocks into it (``LLMEngine.export_kv_device``), ``ncclSend`` sends it,
the decode worker ``ncclRecv``\\ s into one of its own, and its engine copies that into the blocks it
allocated (``Prefilled.kv_blocks``). ``cudaMalloc``/``cudaFree`` per transfer would cost a
device-wide synchronization each, so buffers are pooled.

Ownership: whoever holds a ``DeviceBlocks`` releases it (``release()``, idempotent); one dropped
without a release goes back to the pool when it is garbage collected, so a request abandoned
between two threads cannot leak its buffer. Releasing only returns the buffer to the pool's free
list (no CUDA call), so it may happen on any thread; memory is allocated and freed in ``acquire``,
on a thread where the device's context is current.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

#: buffer sizes are rounded up to this, so transfers of similar length reuse each other's buffers
GRANULARITY = 2 << 20


class PooledBuffer:
    """``capacity`` bytes at device address ``ptr``, on loan from a ``BufferPool`` until ``release()``."""

    __slots__ = ("pool", "ptr", "capacity", "_released")

    def __init__(self, pool: BufferPool, ptr: int, capacity: int) -> None:
        self.pool, self.ptr, self.capacity = pool, ptr, capacity
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.pool._give_back(self.ptr, self.capacity)

    @property
    def released(self) -> bool:
        return self._released


class BufferPool:
    """Device buffers reused across transfers. ``alloc(nbytes) -> ptr`` and ``free(ptr)`` do the CUDA calls
    (``cuda_pool``); ``read(ptr, out)`` / ``write(ptr, array)`` copy to and from the host. Free buffers
    beyond ``max_cached_bytes`` are freed at the next ``acquire``."""

    def __init__(self, alloc: Callable[[int], int], free: Callable[[int], None],
                 read: Callable[[int, np.ndarray], None], write: Callable[[int, np.ndarray], None], *,
                 max_cached_bytes: int = 4 << 30, granularity: int = GRANULARITY) -> None:
        self._alloc, self._free, self.read, self.write = alloc, free, read, write
        self.max_cached_bytes = max_cached_bytes
        self.granularity = granularity
        self._lock = threading.RLock()  # RLock: a garbage-collected DeviceBlocks may release inside acquire
        self._cached: list[tuple[int, int]] = []  # (capacity, ptr), free
        self.bytes_in_use = 0
        self.buffers_in_use = 0
        self.bytes_allocated = 0
        self.num_allocs = 0

    def acquire(self, nbytes: int) -> PooledBuffer:
        """A buffer of at least ``nbytes`` (the smallest free one that fits, else a new allocation)."""
        if nbytes < 1:
            raise ValueError(f"a transfer buffer of {nbytes} bytes")
        want = -(-nbytes // self.granularity) * self.granularity
        with self._lock:
            fits = [c for c in self._cached if c[0] >= want]
            if fits:
                best = min(fits)
                self._cached.remove(best)
                cap, ptr = best
            else:
                cap, ptr = want, 0
            self._trim(self.max_cached_bytes)
            self.bytes_in_use += cap
            self.buffers_in_use += 1
        if not ptr:
            try:
                ptr = self._alloc(cap)
            except BaseException:
                with self._lock:
                    self.bytes_in_use -= cap
                    self.buffers_in_use -= 1
                raise
            with self._lock:
                self.bytes_allocated += cap
                self.num_allocs += 1
        return PooledBuffer(self, ptr, cap)

    def _give_back(self, ptr: int, capacity: int) -> None:
        with self._lock:
            self._cached.append((capacity, ptr))
            self.bytes_in_use -= capacity
            self.buffers_in_use -= 1

    def _trim(self, keep: int) -> None:
        """Free cached buffers, largest first, until at most ``keep`` bytes stay cached (lock held)."""
        self._cached.sort()
        while self._cached and sum(c for c, _ in self._cached) > keep:
            cap, ptr = self._cached.pop()
            self._free(ptr)
            self.bytes_allocated -= cap

    def close(self) -> None:
        """Free every cached buffer (buffers on loan are freed when they come back and the pool is trimmed)."""
        with self._lock:
            self._trim(0)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"bytes_in_use": self.bytes_in_use, "buffers_in_use": self.buffers_in_use,
                    "bytes_allocated": self.bytes_allocated, "allocations": self.num_allocs}


class DeviceBlocks:
    """A transfer's KV blocks in a pooled device buffer: ``shape`` ``[layers, blocks, 2, block_size, kv_heads,
    head_dim]`` of ``dtype``, C order, at ``ptr``. ``KVTransfer.data`` for the NCCL transport."""

    def __init__(self, buffer: PooledBuffer, shape: tuple[int, ...], dtype: np.dtype | str) -> None:
        self.buffer = buffer
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        if self.nbytes > buffer.capacity:
            raise ValueError(f"KV blocks of {self.nbytes} bytes in a buffer of {buffer.capacity}")
        self._finalizer = weakref.finalize(self, buffer.release)

    @classmethod
    def allocate(cls, pool: BufferPool, shape: tuple[int, ...], dtype: Any) -> DeviceBlocks:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        return cls(pool.acquire(nbytes), shape, dtype)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def ptr(self) -> int:
        if self.buffer.released:
            raise RuntimeError("KV blocks used after their buffer was released")
        return self.buffer.ptr

    @property
    def released(self) -> bool:
        return self.buffer.released

    def release(self) -> None:
        self._finalizer()

    def to_host(self, release: bool = True) -> np.ndarray:
        """The blocks as a host array (then released, unless ``release`` is False)."""
        out = np.empty(self.shape, self.dtype)
        self.buffer.pool.read(self.ptr, out)
        if release:
            self.release()
        return out

    def __repr__(self) -> str:
        return f"DeviceBlocks({self.dtype}{list(self.shape)} at {self.buffer.ptr:#x})"


def release(data: Any) -> None:
    """Release ``data`` if it is ``DeviceBlocks`` (a host array needs nothing)."""
    if isinstance(data, DeviceBlocks):
        data.release()


def cuda_pool(ctx: Any, stream: Any = None, **kwargs: Any) -> BufferPool:
    """A ``BufferPool`` of ``cuMemAlloc`` buffers on ``ctx`` (a ``runtime.cuda_driver.Context``)."""
    from .. import cuda_driver as cd

    def alloc(n: int) -> int:
        ctx.make_current()
        return int(cd.check(cd.driver().cuMemAlloc(n), f"cuMemAlloc({n} bytes) for a KV transfer buffer"))

    def free(ptr: int) -> None:
        ctx.make_current()
        cd.check(cd.driver().cuMemFree(ptr), "cuMemFree (KV transfer buffer)")

    def read(ptr: int, out: np.ndarray) -> None:
        ctx.make_current()
        cd.memcpy_dtoh(out.ctypes.data, ptr, out.nbytes)

    def write(ptr: int, array: np.ndarray) -> None:
        a = np.ascontiguousarray(array)
        ctx.make_current()
        cd.memcpy_htod(ptr, a.ctypes.data, a.nbytes)

    return BufferPool(alloc, free, read, write, **kwargs)


class HostMemory:
    """Host memory standing in for device memory (tests and the CPU backend): ``pool()`` gives a ``BufferPool``
    whose buffers are numpy byte arrays addressed by fake pointers."""

    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}
        self._next = 1 << 40
        self._lock = threading.Lock()

    def alloc(self, n: int) -> int:
        with self._lock:
            ptr = self._next
            self._next += n + 4096
            self.buffers[ptr] = np.zeros(n, np.uint8)
        return ptr

    def free(self, ptr: int) -> None:
        with self._lock:
            del self.buffers[ptr]

    def view(self, ptr: int, nbytes: int) -> np.ndarray:
        """``nbytes`` bytes at ``ptr`` (which may point inside a buffer)."""
        with self._lock:
            for base, buf in self.buffers.items():
                if base <= ptr and ptr + nbytes <= base + buf.nbytes:
                    return buf[ptr - base : ptr - base + nbytes]
        raise ValueError(f"{nbytes} bytes at {ptr:#x}: not inside one allocation")

    def read(self, ptr: int, out: np.ndarray) -> None:
        out.reshape(-1).view(np.uint8)[:] = self.view(ptr, out.nbytes)

    def write(self, ptr: int, array: np.ndarray) -> None:
        a = np.ascontiguousarray(array)
        self.view(ptr, a.nbytes)[:] = a.reshape(-1).view(np.uint8)

    def pool(self, **kwargs: Any) -> BufferPool:
        return BufferPool(self.alloc, self.free, self.read, self.write, **kwargs)
