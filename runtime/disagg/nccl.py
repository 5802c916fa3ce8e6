"""The NCCL transport: KV block bytes GPU to GPU with ncclSend/ncclRecv (``nccl4py``, ``nvidia-nccl-cu12``).

NOT RUN IN THIS SESSION: only one-GPU machines were lent, so this code has never executed; it is
written against the documented ``nccl.core`` API (``Communicator.init``, ``send``, ``recv``) and is
skipped by the tests with the reason ``available()`` gives. The descriptor still travels as JSON
over the process transport's TCP frames (``payload_len`` 0, ``"payload": "nccl"``); only the block
bytes go through NCCL, one ``send`` of the contiguous block buffer per transfer. Pairing: the prefill
worker is rank 0 and the decode worker rank 1 of a two-rank communicator per (prefill, decode) pair,
created from a unique id the decode worker hands out in ``/internal/info``.

On the GPU the blocks are gathered into one contiguous device buffer before ``send`` (a gather
kernel over the block ids) and scattered from it after ``recv``; layout conversion (block size,
dtype, heads) then runs on the receiving GPU exactly as ``layout.assemble_tokens`` does on the CPU.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .layout import KVTransfer
from .transport import TransferError


def available() -> tuple[bool, str]:
    """Whether this machine can run the NCCL transport, and why not."""
    if importlib.util.find_spec("nccl") is None:
        return False, "nccl4py is not installed (pip install 'ingot[cuda]')"
    try:
        from cuda.core import system  # type: ignore[import-not-found]

        n = system.get_num_devices() if callable(getattr(system, "get_num_devices", None)) else system.num_devices
    except Exception as e:  # no driver, no device
        return False, f"no CUDA device ({type(e).__name__}: {e})"
    if n < 2:
        return False, f"{n} CUDA device(s); a GPU-to-GPU transfer needs 2"
    return True, ""


class NcclKVChannel:
    """One prefill -> decode pair over a two-rank NCCL communicator (rank 0 sends, rank 1 receives).

    ``send``/``recv`` take device buffers (anything with ``__cuda_array_interface__`` or DLPack, e.g.
    the CUDA backend's arena views) and block the calling thread until the stream has finished, under
    ``timeout`` (a stuck peer aborts the communicator: NCCL has no per-call deadline).
    """

    def __init__(self, rank: int, unique_id: Any, device: int = 0) -> None:
        from cuda.core import Device  # type: ignore[import-not-found]
        from nccl import core as nccl  # type: ignore[import-not-found]

        if rank not in (0, 1):
            raise ValueError("rank must be 0 (prefill, sends) or 1 (decode, receives)")
        self.rank = rank
        self.device = Device(device)
        self.device.set_current()
        self.stream = self.device.create_stream()
        self.comm = nccl.Communicator.init(nranks=2, rank=rank, unique_id=unique_id)

    @staticmethod
    def new_unique_id() -> Any:
        from nccl import core as nccl  # type: ignore[import-not-found]

        return nccl.get_unique_id()

    def _wait(self, what: str, timeout: float) -> None:
        import threading

        done = threading.Event()
        err: list[BaseException] = []

        def sync() -> None:
            try:
                self.stream.sync()
            except BaseException as e:  # noqa: BLE001 - reported below
                err.append(e)
            done.set()

        threading.Thread(target=sync, daemon=True).start()
        if not done.wait(timeout):
            self.comm.abort()
            raise TransferError(f"NCCL {what} did not finish within {timeout} s; communicator aborted")
        if err:
            raise TransferError(f"NCCL {what} failed: {err[0]}")

    def send(self, transfer: KVTransfer, device_buffer: Any, timeout: float) -> None:
        """ncclSend of the transfer's contiguous block bytes (``device_buffer``) to rank 1."""
        self.comm.send(device_buffer, peer=1, stream=self.stream)
        self._wait(f"send of transfer {transfer.transfer_id}", timeout)

    def recv(self, descriptor: dict[str, Any], device_buffer: Any, timeout: float) -> None:
        """ncclRecv into ``device_buffer`` (``descriptor["nbytes"]`` bytes, allocated by the caller) from rank 0."""
        self.comm.recv(device_buffer, peer=0, stream=self.stream)
        self._wait(f"recv of transfer {descriptor.get('transfer_id')}", timeout)

    def close(self) -> None:
        self.comm.destroy()
