"""One rank of a tensor-parallel group, in a process of its own (ranks 1..N-1; rank 0 runs in the driver).

The driver (``TpExecutor``) starts it with ``multiprocessing`` (spawn) and talks to it over a pipe::

    worker -> driver   ("loaded",)                     GPU only: its executor is up, NCCL init comes next
    worker -> driver   ("ready", {"num_blocks": n})    it can take steps
    driver -> worker   ("step", feeds, check)          run one step (the same feeds as every rank)
    worker -> driver   ("ok",)                          done (its logits are not sent: rank 0's are used)
    driver -> worker   ("stop",)                        free everything and exit
    worker -> driver   ("error", message)               it failed; it aborts the group's transport and exits

The KV cache of the rank (its KV heads only) lives here: host arrays on the CPU, the device arena on
the GPU (device ``rank``). A worker whose driver went away (the pipe closes) exits.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import numpy as np


def _describe(rank: int, e: BaseException) -> str:
    return f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"


def worker_main(config: dict[str, Any], conn: Any, buffer: Any = None, barrier: Any = None) -> None:
    """The process entry point (module docstring). ``config``: path, rank, size, device, num_blocks,
    block_size (CPU), timeout, cuda_graphs and nccl_id (GPU)."""
    rank, size, device = int(config["rank"]), int(config["size"]), config["device"]
    path = Path(config["path"])
    comm: Any = None
    executor: Any = None
    caches: dict[str, np.ndarray] = {}
    try:
        from ...ir.types import DType
        from .artifact import load_rank, rank_dir

        graph, manifest = load_rank(path, rank)
        if device == "cpu":
            from ..cpu import CpuExecutor
            from .comm import SharedAllReduce, overrides

            comm = SharedAllReduce(rank, size, buffer, barrier, float(config["timeout"]))
            executor = CpuExecutor(graph, overrides(comm))
            spec = manifest["kv_cache"]
            shape = (int(config["num_blocks"]), 2, int(config["block_size"]), int(spec["num_kv_heads"]),
                     int(spec["head_dim"]))
            caches = {name: np.zeros(shape, DType(spec["dtype"]).np) for name in spec["inputs"]}
        else:
            from ..cuda_backend import CudaExecutor
            from .nccl import NcclAllReduce

            executor = CudaExecutor(graph, manifest, path / rank_dir(rank), num_blocks=int(config["num_blocks"]),
                                    device=rank, cuda_graphs=bool(config.get("cuda_graphs", True)))
            conn.send(("loaded",))
            executor.ctx.make_current()
            comm = NcclAllReduce(rank, size, config["nccl_id"], device=rank)
            executor.set_communicator(comm)
        conn.send(("ready", {"num_blocks": int(config["num_blocks"])}))
    except BaseException as e:  # noqa: BLE001 - reported to the driver
        _abort(comm)
        _send(conn, ("error", _describe(rank, e)))
        return
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return  # the driver is gone
            if msg[0] == "stop":
                return
            if msg[0] != "step":
                _send(conn, ("error", f"rank {rank}: unknown message {msg[0]!r}"))
                return
            feeds, check = msg[1], bool(msg[2])
            try:
                executor.run({**feeds, **caches} if device == "cpu" else feeds, check=check)
            except BaseException as e:  # noqa: BLE001 - reported; the group is unusable after a failed step
                _abort(comm)
                _send(conn, ("error", _describe(rank, e)))
                return
            conn.send(("ok",))
    finally:
        if device != "cpu":
            try:
                # abort, not destroy: ncclCommDestroy finalizes collectively and would wait for rank 0,
                # which only closes its own communicator after joining this process (a shutdown hang
                # seen on two H200s). Every step has completed (its stream synchronized) by now.
                if comm is not None:
                    comm.abort()
                if executor is not None:
                    executor.close()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass


def _abort(comm: Any) -> None:
    if comm is not None:
        try:
            comm.abort()
        except Exception:  # noqa: BLE001 - best effort: the others must not hang
            pass


def _send(conn: Any, msg: Any) -> None:
    try:
        conn.send(msg)
    except (OSError, EOFError, ValueError):
        pass
