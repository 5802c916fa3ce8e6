"""The CPU all-reduce transport: the ranks meet at each ``all_reduce`` through shared memory and a barrier.

::

    buffer: [2 (round parity), size (rank), slot_bytes]     one shared byte array
    all_reduce(x) on rank r, per chunk of at most slot_bytes:
        write the chunk into buffer[round % 2, r]
        barrier.wait()                       every rank's chunk is there
        out = AllReduce.reduce(buffer[round % 2, 0..size-1])   the same sum, in rank order, on every rank
        round += 1

One barrier per chunk is enough because the two halves alternate: a rank writes half ``k % 2`` again
only at round ``k + 2``, after passing the barrier of round ``k + 1``, which every rank reaches only
after it has read round ``k``. Larger tensors go through in chunks, so the buffer bounds memory, not
tensor size. Every rank computes the sum itself (in rank order, in f32), so the results are
bit-identical across ranks and reproducible run to run.

``SharedAllReduce`` works across processes (``multiprocessing`` barrier + ``RawArray``, spawn-safe)
and across threads (``threading.Barrier`` + a numpy array: ``thread_group``, for tests). A barrier
that times out or is aborted (a rank died: ``runtime/tp/executor.py``'s watchdog aborts it) raises
``TpCommError`` on every waiting rank instead of hanging.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...ir.ops.collective import AllReduce

#: default bytes per rank and round: 4 MiB (2048 tokens x 512 f32 features in one round)
DEFAULT_SLOT_BYTES = 4 << 20
#: default seconds a rank waits for the others at one all_reduce
DEFAULT_TIMEOUT = 300.0


class TpCommError(RuntimeError):
    """A rank did not arrive at an all_reduce (it failed, died or timed out); the group is unusable."""


class SharedAllReduce:
    """One rank's end of the shared-memory all-reduce (module docstring).

    ``buffer``: any writable buffer of ``2 * size * slot_bytes`` bytes shared by all ranks; ``barrier``:
    a ``threading.Barrier`` or ``multiprocessing`` barrier for ``size`` parties.
    """

    def __init__(self, rank: int, size: int, buffer: Any, barrier: Any, timeout: float = DEFAULT_TIMEOUT) -> None:
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} is not in [0, {size})")
        raw = np.frombuffer(buffer, np.uint8)
        if raw.size < 2 * size or raw.size % (2 * size):
            raise ValueError(f"the shared buffer has {raw.size} bytes, not a multiple of 2 x {size} ranks")
        self.rank, self.size = rank, size
        self.slot_bytes = raw.size // (2 * size)
        self.slots = raw.reshape(2, size, self.slot_bytes)
        self.barrier = barrier
        self.timeout = timeout
        self.rounds = 0

    def _wait(self, what: str) -> None:
        try:
            self.barrier.wait(self.timeout)
        except threading.BrokenBarrierError:
            raise TpCommError(
                f"rank {self.rank}: the other ranks did not arrive at {what} within {self.timeout} s, or the group was "
                "aborted (a rank failed or died)") from None

    def all_reduce(self, op: AllReduce, x: np.ndarray) -> np.ndarray:
        """Every rank's ``x`` summed (``op.reduce``), identical on all ranks."""
        if op.group_size != self.size:
            raise TpCommError(f"all_reduce over {op.group_size} ranks in a group of {self.size}")
        x = np.ascontiguousarray(x)
        flat = x.reshape(-1)
        out = np.empty_like(flat)
        per = max(self.slot_bytes // max(x.dtype.itemsize, 1), 1)
        for start in range(0, flat.size, per):
            chunk = flat[start:start + per]
            n = chunk.nbytes
            half = self.slots[self.rounds % 2]
            half[self.rank, :n] = chunk.view(np.uint8)
            self._wait(f"all_reduce round {self.rounds}")
            out[start:start + chunk.size] = op.reduce([half[r, :n].view(x.dtype) for r in range(self.size)])
            self.rounds += 1
        return out.reshape(x.shape)

    def abort(self) -> None:
        """Break the barrier: every rank waiting now or later gets ``TpCommError``."""
        self.barrier.abort()


def thread_group(size: int, slot_bytes: int = DEFAULT_SLOT_BYTES, timeout: float = DEFAULT_TIMEOUT,
                 ) -> list[SharedAllReduce]:
    """``size`` ends of one all-reduce group for threads of one process (tests, and the reference of
    the multi-process transport)."""
    buffer = np.zeros(2 * size * slot_bytes, np.uint8)
    barrier = threading.Barrier(size)
    return [SharedAllReduce(r, size, buffer, barrier, timeout) for r in range(size)]


def process_group_resources(ctx: Any, size: int, slot_bytes: int = DEFAULT_SLOT_BYTES) -> tuple[Any, Any]:
    """The shared buffer and barrier of a process group, made from a ``multiprocessing`` context (``spawn``);
    pass them to each rank's process and build ``SharedAllReduce(rank, size, buffer, barrier)`` there."""
    import ctypes

    return ctx.RawArray(ctypes.c_uint8, 2 * size * slot_bytes), ctx.Barrier(size)


def overrides(comm: SharedAllReduce) -> dict[str, Any]:
    """The CPU executor's op overrides that route ``all_reduce`` nodes through ``comm``."""

    def all_reduce(op: AllReduce, x: np.ndarray) -> Sequence[np.ndarray]:
        return [comm.all_reduce(op, x)]

    return {"all_reduce": all_reduce}
