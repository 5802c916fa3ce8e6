"""``TpExecutor``: the N ranks of a tensor-parallel artifact behind the single-device executor interface.

::

    engine thread (driver process)                      worker processes (spawn), one per rank 1..N-1
    ------------------------------                      ---------------------------------------------
    run(step inputs)
      send ("step", inputs) to every worker  ------->   run(step inputs) on its shard + its KV cache
      run rank 0 (its shard + its KV cache)                 |
          ... meet at every all_reduce ...   <------->      ... meet at every all_reduce ...
      receive ("ok",) from every worker      <-------   ("ok",)
      return rank 0's logits

Rank 0 runs in the calling process (it drives the scheduler: ``runtime/engine.py`` holds this object
where it would hold a ``CpuExecutor`` or ``CudaExecutor``); ranks 1..N-1 are worker processes
(``worker.py``). Every rank gets the same step inputs, so the ranks stay in lockstep; each holds the
KV cache of its own KV heads (the engine allocates none, as for the CUDA backend: ``kv_cache.*``
feeds are ignored). ``device="cpu"``: the all_reduce goes through shared memory and a barrier
(``comm.py``); ``device="cuda"``: rank r runs the CUDA backend on GPU r and the all_reduce is
``ncclAllReduce`` (``nccl.py``).

Failures: a rank whose step raises aborts the group's transport and reports; a worker that dies is
noticed by a watchdog thread, which aborts the transport so that no rank waits forever. Either way
``run`` raises ``TpError`` naming the rank and its error, and every later call fails at once (the KV
caches of the ranks can no longer be trusted); ``close`` stops the workers.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .artifact import load_tp, rank_dir, tp_size
from .comm import DEFAULT_SLOT_BYTES, DEFAULT_TIMEOUT

#: seconds a worker may take to load its shard (and join NCCL) before the driver gives up
READY_TIMEOUT = 600.0


class TpError(RuntimeError):
    """A rank of the tensor-parallel group failed; the message names it and says why."""


class TpExecutor:
    """Runs a TP artifact's ranks together (module docstring); ``run`` is ``CpuExecutor.run``'s interface.

    ``num_blocks``: KV cache blocks per rank (each rank's blocks hold its KV heads of the same tokens).
    On the CPU it is required; on the GPU ``None`` sizes rank 0's cache like ``CudaExecutor`` does
    (``kv_cache_bytes`` or a share of the free memory) and gives the others the same count.
    """

    def __init__(self, path: str | Path, *, device: str = "cpu", num_blocks: int | None = None,
                 kv_cache_bytes: int | None = None, block_size: int | None = None, cuda_graphs: bool = True,
                 timeout: float = DEFAULT_TIMEOUT, slot_bytes: int = DEFAULT_SLOT_BYTES) -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {device!r}; use 'cpu' or 'cuda'")
        import os

        # INGOT_TP_CUDA_GRAPHS=0: plain launches only (a fallback should NCCL inside the decode graphs misbehave)
        cuda_graphs = cuda_graphs and os.environ.get("INGOT_TP_CUDA_GRAPHS", "1") != "0"
        self.path = Path(path)
        self.device = device
        self.graph, self.manifest = load_tp(self.path)
        self.size = tp_size(self.manifest)
        spec = self.manifest["kv_cache"]
        self.kv_inputs: list[str] = list(spec["inputs"])
        self.block_size = int(block_size or spec["block_size"])
        self.timeout = timeout
        self._broken: str | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self._comm0: Any = None
        self.caches: dict[str, np.ndarray] = {}
        ctx = mp.get_context("spawn")
        config: dict[str, Any] = {"path": str(self.path), "size": self.size, "device": device,
                                  "timeout": timeout, "cuda_graphs": cuda_graphs}
        self._finalizer = weakref.finalize(self, _stop, self._conns, self._procs)
        try:
            if device == "cpu":
                self._start_cpu(ctx, config, num_blocks, slot_bytes)
            else:
                self._start_cuda(ctx, config, num_blocks, kv_cache_bytes, cuda_graphs)
        except BaseException:
            self.close()
            raise
        self._watchdog = threading.Thread(target=self._watch, name="ingot-tp-watchdog", daemon=True)
        self._watchdog.start()

    # -- start -------------------------------------------------------------------------------------
    def _spawn(self, ctx: Any, config: dict[str, Any], *extra: Any) -> None:
        from .worker import worker_main

        for rank in range(1, self.size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=({**config, "rank": rank}, child, *extra),
                            name=f"ingot-tp-rank{rank}", daemon=True)
            p.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(p)

    def _expect(self, kind: str, timeout: float) -> None:
        for rank, conn in enumerate(self._conns, 1):
            msg = self._recv(rank, conn, timeout, f"waiting for rank {rank} to be {kind}")
            if msg[0] != kind:
                raise TpError(f"rank {rank} did not start: {msg[1] if len(msg) > 1 else msg}")

    def _start_cpu(self, ctx: Any, config: dict[str, Any], num_blocks: int | None, slot_bytes: int) -> None:
        from ...ir.types import DType
        from ..cpu import CpuExecutor
        from .comm import SharedAllReduce, overrides, process_group_resources

        if not num_blocks or num_blocks < 1:
            raise ValueError("a tensor-parallel model on the CPU needs num_blocks (KV cache blocks per rank) >= 1")
        self.num_blocks = int(num_blocks)
        buffer, barrier = process_group_resources(ctx, self.size, slot_bytes)
        self._spawn(ctx, {**config, "num_blocks": self.num_blocks, "block_size": self.block_size}, buffer, barrier)
        self._comm0 = SharedAllReduce(0, self.size, buffer, barrier, self.timeout)
        self.executor = CpuExecutor(self.graph, overrides(self._comm0))
        spec = self.manifest["kv_cache"]
        shape = (self.num_blocks, 2, self.block_size, int(spec["num_kv_heads"]), int(spec["head_dim"]))
        self.caches = {name: np.zeros(shape, DType(spec["dtype"]).np) for name in self.kv_inputs}
        self._expect("ready", READY_TIMEOUT)

    def _start_cuda(self, ctx: Any, config: dict[str, Any], num_blocks: int | None, kv_cache_bytes: int | None,
                    cuda_graphs: bool) -> None:
        import os

        from ..cuda_backend import CudaExecutor
        from .nccl import NcclAllReduce, available, new_unique_id

        ok, why = available(self.size)
        if not ok:
            raise TpError(f"{self.path}: tensor parallelism over {self.size} GPUs is not possible here: {why}")
        os.environ.setdefault("NCCL_RUNTIME_CONNECT", "0")  # connect at init, never inside a graph capture
        self.executor = CudaExecutor(self.graph, self.manifest, self.path / rank_dir(0), num_blocks=num_blocks,
                                     kv_cache_bytes=kv_cache_bytes, device=0, cuda_graphs=cuda_graphs)
        self.num_blocks = int(self.executor.num_blocks)
        uid = new_unique_id()
        self._spawn(ctx, {**config, "num_blocks": self.num_blocks, "nccl_id": uid})
        self._expect("loaded", READY_TIMEOUT)
        box: list[Any] = []

        def init() -> None:
            try:
                self.executor.ctx.make_current()
                box.append(NcclAllReduce(0, self.size, uid, device=0))
            except BaseException as e:  # noqa: BLE001 - re-raised below
                box.append(e)

        t = threading.Thread(target=init, name="ingot-tp-nccl-init", daemon=True)
        t.start()
        t.join(READY_TIMEOUT)
        if not box:
            raise TpError(f"NCCL init of rank 0 did not finish within {READY_TIMEOUT} s (a rank did not join)")
        if isinstance(box[0], BaseException):
            raise TpError(f"rank 0: NCCL init failed: {box[0]}") from box[0]
        self._comm0 = box[0]
        self.executor.set_communicator(self._comm0)
        self._expect("ready", READY_TIMEOUT)

    # -- steps -------------------------------------------------------------------------------------
    def _recv(self, rank: int, conn: Any, timeout: float, what: str) -> tuple:
        deadline = time.monotonic() + timeout
        proc = self._procs[rank - 1]
        while not conn.poll(0.05):
            if not proc.is_alive() and not conn.poll(0.05):
                raise TpError(f"rank {rank} exited (code {proc.exitcode}) while {what}")
            if time.monotonic() > deadline:
                raise TpError(f"rank {rank} did not answer within {timeout} s while {what}")
        try:
            return conn.recv()
        except (EOFError, OSError) as e:
            raise TpError(f"rank {rank}: its pipe closed while {what} ({e})") from None

    def run(self, feeds: Mapping[str, np.ndarray], check: bool = True) -> dict[str, np.ndarray]:
        """One step on every rank; rank 0's outputs (``kv_cache.*`` feeds are ignored: the ranks own their caches)."""
        with self._lock:
            if self._closed:
                raise TpError("the tensor-parallel group is closed")
            if self._broken is not None:
                raise TpError(f"the tensor-parallel group failed earlier and cannot run: {self._broken}")
            step = {k: np.asarray(v) for k, v in feeds.items() if k not in self.kv_inputs}
            for rank, conn in enumerate(self._conns, 1):
                try:
                    conn.send(("step", step, check))
                except (OSError, EOFError, ValueError) as e:
                    self._abort()
                    code = self._procs[rank - 1].exitcode
                    raise self._fail(f"rank {rank} is gone (exit code {code}): {type(e).__name__}: {e}") from None
            try:
                out = self.executor.run({**step, **self.caches} if self.device == "cpu" else step, check=check)
            except BaseException as e:
                self._abort()
                raise self._fail(f"rank 0: {type(e).__name__}: {e}") from e
            for rank, conn in enumerate(self._conns, 1):
                try:
                    msg = self._recv(rank, conn, self.timeout, "running a step")
                except TpError as e:
                    self._abort()
                    raise self._fail(str(e)) from None
                if msg[0] != "ok":
                    self._abort()
                    raise self._fail(str(msg[1]) if len(msg) > 1 else str(msg))
            return out

    def logits(self, step_inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        return self.run(step_inputs, check=False)["logits"]

    def _fail(self, reason: str) -> TpError:
        """Mark the group broken; the error to raise names the first rank that reported a failure."""
        errors = []
        for conn in self._conns:
            try:
                while conn.poll(0.5):
                    msg = conn.recv()
                    if msg and msg[0] == "error":
                        errors.append(str(msg[1]))
            except (EOFError, OSError):
                pass
        detail = errors[0] if errors else reason
        self._broken = self._broken or detail
        return TpError(f"tensor-parallel step failed: {detail}")

    def _abort(self) -> None:
        comm = self._comm0
        if comm is not None:
            try:
                comm.abort()
            except Exception:  # noqa: BLE001 - best effort
                pass

    def _watch(self) -> None:
        while not self._closed:
            for rank, p in enumerate(list(self._procs), 1):
                if not p.is_alive() and not self._closed:
                    self._broken = self._broken or f"rank {rank} exited (code {p.exitcode})"
                    self._abort()
                    return
            time.sleep(0.2)

    # -- the rest of the executor interface -----------------------------------------------------------
    @property
    def stats(self) -> dict[str, Any]:
        return dict(getattr(self.executor, "stats", {}) or {})

    def kv_cache(self, layer: int) -> np.ndarray:
        raise TpError("the KV cache of a tensor-parallel model is split over its ranks; it cannot be read as one")

    def close(self) -> None:
        """Stop the workers and free rank 0's resources.

        Every rank tears its communicator down at the same time: the workers are told to stop first
        (they abort theirs on the way out), rank 0 aborts its own meanwhile, then the workers are
        joined. On two H200s a rank-0 ``ncclCommDestroy`` and then ``ncclCommAbort`` issued after the
        workers had exited never returned, so rank 0's teardown runs in a thread with a deadline:
        past it the communicator is left to the process's exit, with a warning, and close returns."""
        if self._closed:
            return
        self._closed = True
        _send_stop(self._conns)
        comm, self._comm0 = self._comm0, None
        if self.device == "cuda" and comm is not None:
            _abort_with_deadline(comm, NCCL_TEARDOWN_S)
        _join(self._conns, self._procs)
        if self.device == "cuda":
            ex = getattr(self, "executor", None)
            if ex is not None:
                ex.close()


#: seconds rank 0 waits for its NCCL communicator's teardown before leaving it to process exit
NCCL_TEARDOWN_S = 10.0


def _abort_with_deadline(comm: Any, seconds: float) -> None:
    import threading
    import warnings

    done = threading.Event()

    def run() -> None:
        try:
            comm.abort()
        except Exception:  # noqa: BLE001 - shutting down: nothing to recover
            pass
        finally:
            done.set()

    threading.Thread(target=run, name="ingot-tp-nccl-abort", daemon=True).start()
    if not done.wait(seconds):
        warnings.warn(f"tensor parallelism: rank 0's NCCL communicator did not tear down within {seconds:.0f} s; "
                      "left to process exit", RuntimeWarning, stacklevel=3)


def _send_stop(conns: list[Any]) -> None:
    for conn in conns:
        try:
            conn.send(("stop",))
        except (OSError, EOFError, ValueError):
            pass


def _join(conns: list[Any], procs: list[Any]) -> None:
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.terminate()
            p.join(5)
    for conn in conns:
        try:
            conn.close()
        except OSError:
            pass


def _stop(conns: list[Any], procs: list[Any]) -> None:
    """The finalizer's shutdown (an executor collected without ``close``)."""
    _send_stop(conns)
    _join(conns, procs)
