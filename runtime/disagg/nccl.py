"""The NCCL transport: a transfer's KV blocks GPU to GPU with ncclSend / ncclRecv, the rest over the TCP frames.

NOT RUN YET ON GPUs (written for the lead's two-GPU run; the protocol is tested on the CPU with a
loopback link in tests/runtime/test_disagg_nccl.py). NCCL is called through ``runtime/tp/nccl.py``
(ctypes over ``libnccl.so.2``, every ``ncclResult_t`` checked); nccl4py is not needed.

Pairing: each (prefill worker, decode worker) pair has its own two-rank communicator, the prefill
worker rank 0 (sends), the decode worker rank 1 (receives), set up on the pair's first transfer over
the decode worker's KV port (the process transport's frames, ``transport.py``)::

    prefill                                         decode (TcpKVReceiver + NcclKVReceiver.ops)
    {"op": "nccl_init", "sender"}            ---->  new channel, ncclGetUniqueId
                                             <----  {"ok", "unique_id": hex, "channel"}
    ncclCommInitRank(rank 0)                        ncclCommInitRank(rank 1)      (both block until both joined)
                                             <----  {"ok"}                         (rank 1 joined)

and each transfer (one at a time per pair: the ranks' sends and receives must pair up in order)::

    descriptor + {"op": "nccl_transfer", "channel"}  ---->  checked; a device buffer of nbytes from the pool
                                             <----  {"ok", "ready"}  or  {"ok": false, "error"} (refused: nothing sent)
    ncclSend(buffer), wait                          ncclRecv(buffer), wait; staged as KVTransfer(DeviceBlocks)
                                             <----  {"ok", "transfer_id", "bytes"}

The receiver answers "ready" before it posts its ``ncclRecv``: NCCL may connect a pair's peers inside
the first send/receive, which then blocks until the other side calls too. Every blocking CUDA/NCCL
call runs on the channel's own thread (the device's context current there) and every wait has a
deadline: a send or receive that does not complete in time aborts the communicator
(``ncclCommAbort``), the transfer fails with ``TransferError`` naming it, and the pair sets up a new
communicator on its next transfer. Anything that fails after "ready" breaks the channel on both sides
(the peers' operation counts no longer agree); a refusal before it does not.

The block buffer is filled on the prefill GPU by ``LLMEngine.export_kv_device`` (one device-to-device
copy per layer and run of consecutive block ids) and emptied on the decode GPU into the request's
blocks by ``LLMEngine.add_request(..., prefilled=Prefilled(kv_blocks=...))``; both engines must have the
same KV layout (the GPU backend uses the artifact's block size and dtype), otherwise the decode worker
copies the blocks to the host and converts them (``layout.assemble_tokens``) like the TCP transport's.

A link (``NcclLink``; the tests use a loopback one) is what the channel's thread drives::

    link = link_factory()                  # on the channel's thread
    link.new_unique_id() -> bytes          # receiver
    link.init(rank, unique_id)             # blocks until both ranks joined
    link.send_wait(ptr, nbytes, deadline) / link.recv_wait(ptr, nbytes, deadline)
    link.abort(); link.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from .device import BufferPool, DeviceBlocks
from .layout import KVTransfer, LayoutError, parse_descriptor
from .transport import FrameHandler, TransferError, _split_addr, _tune, read_frame, write_frame

log = logging.getLogger("ingot.disagg")


def available() -> tuple[bool, str]:
    """Whether this machine can run the NCCL transport (libnccl and two CUDA devices), and why not."""
    from ..tp.nccl import available as nccl_available

    ok, why = nccl_available(2)
    return ok, why.replace("tensor parallelism over 2 ranks needs 2", "a GPU-to-GPU KV transfer needs 2")


class NcclLink:
    """One rank of a pair's communicator on the device whose context ``ctx`` is (this process's engine GPU).
    Every method runs on the channel's thread."""

    #: poll interval bounds while waiting for a stream (seconds)
    POLL = (2e-5, 1e-3)

    def __init__(self, ctx: Any) -> None:
        from .. import cuda_driver as cd

        self.ctx = ctx
        ctx.make_current()
        self.stream = cd.Stream()
        self.comm: Any = None
        self.rank = -1

    @staticmethod
    def new_unique_id() -> bytes:
        from ..tp.nccl import new_unique_id

        return new_unique_id()

    def init(self, rank: int, unique_id: bytes) -> None:
        from ..tp.nccl import NcclAllReduce

        self.ctx.make_current()
        self.rank = rank
        self.comm = NcclAllReduce(rank, 2, unique_id, device=0)

    def _stream(self) -> int:
        from ..cuda_launch import address_of as _address

        return _address(self.stream.handle)

    def send_wait(self, ptr: int, nbytes: int, deadline: float) -> None:
        from ..tp.nccl import send_bytes

        send_bytes(self.comm, ptr, nbytes, 1 - self.rank, self._stream())
        self._wait(deadline, f"ncclSend of {nbytes} bytes")

    def recv_wait(self, ptr: int, nbytes: int, deadline: float) -> None:
        from ..tp.nccl import recv_bytes

        recv_bytes(self.comm, ptr, nbytes, 1 - self.rank, self._stream())
        self._wait(deadline, f"ncclRecv of {nbytes} bytes")

    def _wait(self, deadline: float, what: str) -> None:
        from .. import cuda_driver as cd
        from ..tp.nccl import NCCL_IN_PROGRESS, NcclError, async_error, error_string

        pause = self.POLL[0]
        while not cd.stream_done(self.stream):
            err = async_error(self.comm)
            if err not in (0, NCCL_IN_PROGRESS):
                self.abort()
                raise NcclError(f"{what}: NCCL reports error {err} ({error_string(err)}); communicator aborted")
            if time.monotonic() > deadline:
                self.abort()
                raise TimeoutError(f"{what} did not complete in time (the peer never matched it); "
                                   "communicator aborted")
            time.sleep(pause)
            pause = min(pause * 2, self.POLL[1])

    def abort(self) -> None:
        if self.comm is not None:
            self.comm.abort()

    def close(self) -> None:
        if self.comm is not None and self.comm.comm is not None:
            self.comm.close()
        if self.stream is not None:
            self.stream.destroy()
            self.stream = None


class _Thread:
    """A daemon thread running submitted calls in order (a stuck NCCL call must not block the process's exit,
    which a ``ThreadPoolExecutor`` worker would)."""

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._t = threading.Thread(target=self._run, name=name, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                fut.set_exception(e)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut: Future = Future()
        self._q.put((fut, fn, args))
        return fut

    def stop(self) -> None:
        self._q.put(None)


class Channel:
    """One side of a pair: its link, the thread that drives it, and a lock that keeps one transfer in flight."""

    def __init__(self, link_factory: Callable[[], Any], name: str, channel_id: str | None = None) -> None:
        self.id = channel_id or uuid.uuid4().hex
        self.name = name
        self.thread = _Thread(f"ingot-nccl-{name}")
        self.link: Any = None
        self.lock = asyncio.Lock()
        self.broken: str | None = None
        self.bytes = 0
        self.seconds = 0.0
        self.transfers = 0
        self._start = self.thread.submit(self._make, link_factory)

    def _make(self, link_factory: Callable[[], Any]) -> None:
        self.link = link_factory()

    async def call(self, fn: Callable[..., Any], *args: Any, timeout: float) -> Any:
        """``fn(*args)`` on the channel's thread (after the link exists), at most ``timeout`` seconds; a call
        that overruns or is cancelled breaks the channel (its link is aborted)."""
        def run() -> Any:
            self._start.result()
            return fn(*args)

        fut = asyncio.wrap_future(self.thread.submit(run))
        try:
            return await asyncio.wait_for(fut, max(timeout, 0.0))
        except (TimeoutError, asyncio.CancelledError):
            self.fail(f"{getattr(fn, '__name__', 'call')} did not finish within {timeout:.1f} s")
            raise

    def fail(self, reason: str) -> None:
        """Mark the channel unusable; abort its link (a call stuck on the thread then returns)."""
        if self.broken is None:
            self.broken = reason
            log.warning("NCCL channel %s (%s) broken: %s", self.id[:8], self.name, reason)
        link = self.link
        if link is not None:
            with contextlib.suppress(Exception):
                link.abort()

    def close(self) -> None:
        """Destroy the link on its thread (after whatever it is running) and end the thread."""
        def shut() -> None:
            if self.link is not None:
                try:
                    if self.broken:
                        self.link.abort()
                    self.link.close()
                except Exception as e:  # noqa: BLE001 - closing a broken communicator
                    log.debug("closing NCCL channel %s: %s", self.id[:8], e)

        self.thread.submit(shut)
        self.thread.stop()


async def _connect(peer: str) -> socket.socket:
    host, port = _split_addr(peer)
    loop = asyncio.get_running_loop()
    info = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, type_, proto, _, addr = info[0]
    sock = socket.socket(family, type_, proto)
    _tune(sock)
    try:
        await loop.sock_connect(sock, addr)
    except BaseException:
        sock.close()
        raise
    return sock


def _remaining(deadline: float) -> float:
    return deadline - time.monotonic()


class NcclKVSender:
    """The prefill side (``KVSender``): ``send`` takes a ``KVTransfer`` whose ``data`` is ``DeviceBlocks`` on this
    process's GPU; the caller releases them afterwards. ``sender_id`` names this worker to receivers."""

    def __init__(self, link_factory: Callable[[], Any], sender_id: str) -> None:
        self.link_factory = link_factory
        self.sender_id = sender_id
        self.channels: dict[str, Channel] = {}
        self._setup: dict[str, asyncio.Lock] = {}

    async def _channel(self, peer: str, deadline: float) -> Channel:
        lock = self._setup.setdefault(peer, asyncio.Lock())
        async with lock:
            ch = self.channels.get(peer)
            if ch is not None and ch.broken is None:
                return ch
            if ch is not None:
                del self.channels[peer]
                ch.close()
            ch = await self._handshake(peer, deadline)
            self.channels[peer] = ch
            return ch

    async def _handshake(self, peer: str, deadline: float) -> Channel:
        from ..tp.nccl import version

        ch = Channel(self.link_factory, f"send-{peer}")
        sock: socket.socket | None = None
        try:
            sock = await _connect(peer)
            try:
                v = version()
            except Exception:  # noqa: BLE001 - a loopback link has no NCCL
                v = None
            await write_frame(sock, {"op": "nccl_init", "sender": self.sender_id, "nccl_version": v})
            reply, _ = await read_frame(sock, max_payload=0)
            if not reply.get("ok"):
                raise TransferError(f"NCCL setup refused by {peer}: {reply.get('error')}")
            try:
                uid = bytes.fromhex(str(reply["unique_id"]))
                ch.id = str(reply["channel"])
            except (KeyError, ValueError) as e:
                raise TransferError(f"NCCL setup: bad answer from {peer}: {e}") from None
            await ch.call(lambda: ch.link.init(0, uid), timeout=_remaining(deadline))
            done, _ = await read_frame(sock, max_payload=0)
            if not done.get("ok"):
                raise TransferError(f"NCCL setup with {peer} failed on the receiver: {done.get('error')}")
            log.info("NCCL channel %s to %s ready (rank 0)", ch.id[:8], peer)
            return ch
        except BaseException:
            ch.fail("setup failed")
            ch.close()
            raise
        finally:
            if sock is not None:
                sock.close()

    async def send(self, peer: str, transfer: KVTransfer, timeout: float) -> dict[str, Any]:
        data = transfer.data
        if not isinstance(data, DeviceBlocks):
            raise TransferError(f"KV transfer {transfer.transfer_id}: the NCCL transport sends device blocks, got "
                                f"{type(data).__name__}")
        deadline = time.monotonic() + timeout
        tid = transfer.transfer_id
        ch: Channel | None = None
        sent = False
        sock: socket.socket | None = None
        try:
            async with asyncio.timeout(timeout):
                ch = await self._channel(peer, deadline)
                async with ch.lock:
                    if ch.broken:
                        raise TransferError(f"NCCL channel to {peer} broke: {ch.broken}")
                    sock = await _connect(peer)
                    await write_frame(sock, {**transfer.descriptor(), "op": "nccl_transfer", "channel": ch.id})
                    ready, _ = await read_frame(sock, max_payload=0)
                    if not ready.get("ok"):
                        raise TransferError(f"KV transfer {tid} refused by {peer}: {ready.get('error')}")
                    sent = True
                    t0 = time.perf_counter()
                    await ch.call(ch.link.send_wait, data.ptr, data.nbytes, deadline, timeout=_remaining(deadline))
                    ack, _ = await read_frame(sock, max_payload=0)
                    ch.seconds += time.perf_counter() - t0
                    ch.bytes += data.nbytes
                    ch.transfers += 1
        except TimeoutError:
            if ch is not None and sent:
                ch.fail(f"transfer {tid} timed out")
            raise TransferError(f"KV transfer {tid} to {peer} (NCCL) did not finish within {timeout} s") from None
        except (OSError, asyncio.IncompleteReadError) as e:
            if ch is not None and sent:
                ch.fail(f"transfer {tid}: {type(e).__name__}: {e}")
            raise TransferError(f"KV transfer {tid} to {peer} (NCCL) failed: {type(e).__name__}: {e}") from None
        except TransferError:
            raise
        except Exception as e:  # NcclError, CudaError: the communicator is gone
            if ch is not None:
                ch.fail(f"transfer {tid}: {type(e).__name__}: {e}")
            raise TransferError(f"KV transfer {tid} to {peer} (NCCL) failed: {type(e).__name__}: {e}") from None
        finally:
            if sock is not None:
                sock.close()
        if not ack.get("ok"):
            ch.fail(f"transfer {tid} failed on the receiver")
            raise TransferError(f"KV transfer {tid} to {peer} (NCCL) failed on the receiver: {ack.get('error')}")
        return ack

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()
        self.channels.clear()

    def stats(self) -> dict[str, Any]:
        return {peer: {"channel": ch.id, "broken": ch.broken, "transfers": ch.transfers, "bytes": ch.bytes,
                       "seconds": round(ch.seconds, 6)} for peer, ch in self.channels.items()}


class NcclKVReceiver:
    """The decode side: the ``nccl_init`` / ``nccl_transfer`` frame handlers for ``TcpKVReceiver(ops=...)``.
    Received blocks go to ``on_transfer`` (the worker's staging store) as ``KVTransfer(data=DeviceBlocks)``;
    ``check_layout`` may refuse a layout before anything is sent (``LayoutError``)."""

    def __init__(self, link_factory: Callable[[], Any], pool: BufferPool, on_transfer: Callable[[KVTransfer], None],
                 *, timeout: float = 30.0, check_layout: Callable[[Any], None] | None = None) -> None:
        self.link_factory = link_factory
        self.pool = pool
        self.on_transfer = on_transfer
        self.timeout = timeout
        self.check_layout = check_layout
        self.channels: dict[str, Channel] = {}
        self._by_sender: dict[str, str] = {}

    @property
    def ops(self) -> dict[str, FrameHandler]:
        return {"nccl_init": self.handle_init, "nccl_transfer": self.handle_transfer}

    def _drop(self, ch: Channel) -> None:
        self.channels.pop(ch.id, None)
        for s, cid in list(self._by_sender.items()):
            if cid == ch.id:
                del self._by_sender[s]
        ch.close()

    async def handle_init(self, header: dict[str, Any], payload: bytearray, sock: socket.socket) -> int:
        sender = str(header.get("sender") or "?")
        deadline = time.monotonic() + self.timeout
        old = self.channels.get(self._by_sender.get(sender, ""))
        if old is not None:  # the sender starts over (its side broke): so does this one
            old.fail("the sender set up a new channel")
            self._drop(old)
        ch = Channel(self.link_factory, f"recv-{sender}")
        try:
            uid = await ch.call(lambda: ch.link.new_unique_id(), timeout=_remaining(deadline))
            self.channels[ch.id] = ch
            self._by_sender[sender] = ch.id
            await write_frame(sock, {"ok": True, "unique_id": uid.hex(), "channel": ch.id})
            await ch.call(lambda: ch.link.init(1, uid), timeout=_remaining(deadline))
            await write_frame(sock, {"ok": True, "channel": ch.id})
            log.info("NCCL channel %s from %s ready (rank 1)", ch.id[:8], sender)
        except BaseException as e:
            ch.fail(f"setup failed: {type(e).__name__}: {e}")
            self._drop(ch)
            with contextlib.suppress(Exception):
                await write_frame(sock, {"ok": False, "error": f"NCCL setup failed: {type(e).__name__}: {e}"})
            if isinstance(e, asyncio.CancelledError):
                raise
        return 0

    async def handle_transfer(self, header: dict[str, Any], payload: bytearray, sock: socket.socket) -> int:
        deadline = time.monotonic() + self.timeout
        ch = self.channels.get(str(header.get("channel")))
        if ch is None or ch.broken:
            why = "unknown" if ch is None else f"broken ({ch.broken})"
            await write_frame(sock, {"ok": False, "error": f"NCCL channel {header.get('channel')} is {why}; "
                                     "set up a new one"})
            return 0
        try:
            tid, layout, toks, shape, nbytes, meta = parse_descriptor(header)
            if self.check_layout is not None:
                self.check_layout(layout)
        except LayoutError as e:
            await write_frame(sock, {"ok": False, "error": str(e)})
            return 0
        async with ch.lock:
            blocks: DeviceBlocks | None = None
            posted = False
            try:
                blocks = await ch.call(DeviceBlocks.allocate, self.pool, shape, layout.np_dtype,
                                       timeout=_remaining(deadline))
                await write_frame(sock, {"ok": True, "ready": True})
                posted = True
                t0 = time.perf_counter()
                await ch.call(ch.link.recv_wait, blocks.ptr, nbytes, deadline, timeout=_remaining(deadline))
                ch.seconds += time.perf_counter() - t0
                ch.bytes += nbytes
                ch.transfers += 1
                transfer = KVTransfer(tid, layout, toks, blocks, meta)
                try:
                    self.on_transfer(transfer)
                except LayoutError as e:  # e.g. staging full: the bytes arrived, the channel is fine
                    await write_frame(sock, {"ok": False, "error": str(e)})
                    return 0
                blocks = None  # the store owns them now
                await write_frame(sock, {"ok": True, "transfer_id": tid, "bytes": nbytes})
                return nbytes
            except BaseException as e:
                if posted:  # the ranks' send/receive counts no longer agree
                    ch.fail(f"transfer {tid}: {type(e).__name__}: {e}")
                    self._drop(ch)
                with contextlib.suppress(Exception):
                    await write_frame(sock, {"ok": False, "error": f"KV transfer {tid} (NCCL) failed on the "
                                             f"receiver: {type(e).__name__}: {e}"})
                if isinstance(e, asyncio.CancelledError):
                    raise
                return 0
            finally:
                if blocks is not None:
                    blocks.release()

    def close(self) -> None:
        for ch in list(self.channels.values()):
            self._drop(ch)

    def stats(self) -> dict[str, Any]:
        return {ch.id: {"name": ch.name, "broken": ch.broken, "transfers": ch.transfers, "bytes": ch.bytes,
                        "seconds": round(ch.seconds, 6)} for ch in self.channels.values()}
