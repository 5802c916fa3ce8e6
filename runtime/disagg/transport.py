"""Moving KV between processes: the transport interface, the process (TCP) transport and the staging store.

Frames (both directions, one TCP connection per transfer, 127.0.0.1 or any reachable host)::

    | b"IKV1" | u32 header_len | u64 payload_len | header: UTF-8 JSON | payload: raw bytes |   (big-endian)

A transfer is one frame from the sender, ``header`` = ``KVTransfer.descriptor()`` and ``payload`` = the
block array's bytes (C order, the descriptor's dtype), answered by one frame from the receiver with
``{"ok": true}`` or ``{"ok": false, "error": "..."}`` and no payload. Nothing from the network is
unpickled or evaluated: the header is JSON, checked field by field, and the payload is viewed as the
one array the checked descriptor describes. Every read and write runs under a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from .layout import KVTransfer, LayoutError

log = logging.getLogger("ingot.disagg")

MAGIC = b"IKV1"
_HEAD = struct.Struct(">4sIQ")
MAX_HEADER_BYTES = 16 << 20
DEFAULT_MAX_PAYLOAD = 16 << 30


#: ``await handler(header, payload, sock)`` -> bytes received (runtime/disagg/nccl.py)
FrameHandler = Callable[[dict[str, Any], bytearray, socket.socket], Awaitable[int | None]]


class TransferError(RuntimeError):
    """A transfer that failed: peer unreachable or gone, deadline passed, or refused by the receiver."""


def _payload_view(payload: Any) -> memoryview:
    if isinstance(payload, np.ndarray):  # as raw bytes (ml_dtypes arrays export no buffer format)
        payload = np.ascontiguousarray(payload).reshape(-1).view(np.uint8)
    return memoryview(payload).cast("B")


async def write_frame(sock: socket.socket, header: dict[str, Any], payload: Any = b"") -> None:
    """Send one frame on a non-blocking socket (the payload straight from its buffer: no copy)."""
    loop = asyncio.get_running_loop()
    head = json.dumps(header, separators=(",", ":")).encode()
    view = _payload_view(payload)
    await loop.sock_sendall(sock, _HEAD.pack(MAGIC, len(head), view.nbytes) + head)
    if view.nbytes:
        await loop.sock_sendall(sock, view)


async def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    loop = asyncio.get_running_loop()
    got, n = 0, view.nbytes
    while got < n:
        k = await loop.sock_recv_into(sock, view[got:])
        if not k:
            raise asyncio.IncompleteReadError(b"", n)
        got += k


async def read_frame(sock: socket.socket, max_payload: int = DEFAULT_MAX_PAYLOAD) -> tuple[dict[str, Any], bytearray]:
    """One frame: (header, payload), the payload received straight into one buffer. Raises ``TransferError``
    on a malformed frame, ``asyncio.IncompleteReadError`` when the peer closes early."""
    fixed = bytearray(_HEAD.size)
    await _recv_exactly(sock, memoryview(fixed))
    magic, hlen, plen = _HEAD.unpack(fixed)
    if magic != MAGIC:
        raise TransferError(f"not a KV transfer frame (magic {bytes(magic)!r})")
    if hlen > MAX_HEADER_BYTES:
        raise TransferError(f"frame header of {hlen} bytes (limit {MAX_HEADER_BYTES})")
    if plen > max_payload:
        raise TransferError(f"frame payload of {plen} bytes (limit {max_payload})")
    head = bytearray(hlen)
    await _recv_exactly(sock, memoryview(head))
    try:
        header = json.loads(head.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise TransferError(f"frame header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise TransferError("frame header must be a JSON object")
    payload = bytearray(plen)
    await _recv_exactly(sock, memoryview(payload))
    return header, payload


def _tune(sock: socket.socket) -> None:
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)


class KVSender(Protocol):
    """What a prefill worker needs from a transport."""

    async def send(self, peer: str, transfer: KVTransfer, timeout: float) -> dict[str, Any]:
        """Deliver ``transfer`` to the receiver at ``peer``; returns its acknowledgement or raises ``TransferError``."""
        ...


def _split_addr(peer: str) -> tuple[str, int]:
    host, sep, port = peer.rpartition(":")
    if not sep or not port.isdigit():
        raise TransferError(f"bad KV address {peer!r} (want host:port)")
    return host.strip("[]") or "127.0.0.1", int(port)


class TcpKVSender:
    """The process transport's sending side: one connection per transfer, everything under ``timeout``."""

    async def send(self, peer: str, transfer: KVTransfer, timeout: float) -> dict[str, Any]:
        host, port = _split_addr(peer)
        loop = asyncio.get_running_loop()
        sock: socket.socket | None = None
        try:
            async with asyncio.timeout(timeout):
                info = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                family, type_, proto, _, addr = info[0]
                sock = socket.socket(family, type_, proto)
                _tune(sock)
                await loop.sock_connect(sock, addr)
                await write_frame(sock, transfer.descriptor(), transfer.data)
                ack, _ = await read_frame(sock, max_payload=0)
        except TimeoutError:
            raise TransferError(f"KV transfer {transfer.transfer_id} to {peer} did not finish within {timeout} s"
                                ) from None
        except (OSError, asyncio.IncompleteReadError) as e:
            raise TransferError(f"KV transfer {transfer.transfer_id} to {peer} failed: {type(e).__name__}: {e}"
                                ) from None
        finally:
            if sock is not None:
                sock.close()
        if not ack.get("ok"):
            raise TransferError(f"KV transfer {transfer.transfer_id} refused by {peer}: {ack.get('error')}")
        return ack


class TransferStore:
    """Received transfers waiting for their decode request (``take``), dropped after ``ttl`` seconds unclaimed.

    A request whose KV comes from ``parts`` sender ranks (TP) is complete when that many parts arrived.
    ``cancel`` drops a transfer whose request will never come (the router gave up on it) and refuses its
    parts that arrive later, for ``ttl`` seconds.
    """

    def __init__(self, ttl: float = 60.0, max_bytes: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._parts: dict[str, list[KVTransfer]] = {}
        self._born: dict[str, float] = {}
        self._events: dict[str, asyncio.Event] = {}
        self._cancelled: dict[str, float] = {}  # transfer id -> when cancelled (parts arriving later are refused)
        self.nbytes = 0
        self.num_received = 0
        self.num_expired = 0
        self.num_cancelled = 0

    def _event(self, tid: str) -> asyncio.Event:
        ev = self._events.get(tid)
        if ev is None:
            ev = self._events[tid] = asyncio.Event()
        return ev

    def put(self, transfer: KVTransfer) -> None:
        self.expire()
        n = transfer.data.nbytes
        if self.nbytes + n > self.max_bytes:
            raise LayoutError(f"staging full ({self.nbytes} of {self.max_bytes} bytes held); retry later")
        tid = transfer.transfer_id
        if tid in self._cancelled:
            raise LayoutError(f"transfer {tid} was cancelled: its request is gone")
        parts = self._parts.setdefault(tid, [])
        if any(p.layout.tp_rank == transfer.layout.tp_rank for p in parts):
            raise LayoutError(f"transfer {tid}: rank {transfer.layout.tp_rank}'s part arrived twice")
        parts.append(transfer)
        self._born.setdefault(tid, time.monotonic())
        self.nbytes += n
        self.num_received += 1
        self._event(tid).set()

    def _drop(self, tid: str) -> list[KVTransfer]:
        parts = self._parts.pop(tid, [])
        self._born.pop(tid, None)
        self._events.pop(tid, None)
        self.nbytes -= sum(p.data.nbytes for p in parts)
        return parts

    def expire(self) -> int:
        """Drop transfers older than ``ttl`` (their request never came: router or client gone)."""
        now = time.monotonic()
        old = [t for t, b in self._born.items() if now - b > self.ttl]
        for t in old:
            self.discard(t)
            log.warning("dropped KV transfer %s: unclaimed for %.0f s", t, self.ttl)
        self.num_expired += len(old)
        for t in [t for t, c in self._cancelled.items() if now - c > self.ttl]:
            del self._cancelled[t]
        return len(old)

    async def take(self, tid: str, timeout: float) -> list[KVTransfer]:
        """Wait until every part of ``tid`` arrived (parts: the senders' ``tp_size``), remove and return them."""
        async with asyncio.timeout(timeout):
            while True:
                parts = self._parts.get(tid, [])
                if parts and len(parts) >= parts[0].layout.tp_size:
                    return self._drop(tid)
                ev = self._event(tid)
                ev.clear()
                await ev.wait()

    def discard(self, tid: str) -> None:
        """Drop a transfer, releasing device buffers (``DeviceBlocks``) it holds."""
        from .device import release

        for p in self._drop(tid):
            release(p.data)

    def cancel(self, tid: str) -> int:
        """The router gave up on ``tid``'s request: drop what arrived of it (returns how many parts) and
        refuse parts that arrive later. Waiters in ``take`` keep waiting until their own deadline."""
        self.expire()
        n = len(self._parts.get(tid, []))
        self.discard(tid)
        self._cancelled[tid] = time.monotonic()
        self.num_cancelled += 1
        return n

    @property
    def num_pending(self) -> int:
        return len(self._parts)


class TcpKVReceiver:
    """The process transport's receiving side: an asyncio server that checks each transfer's descriptor,
    hands the transfer to ``on_transfer`` (raise ``LayoutError`` to refuse it) and acknowledges it.
    A connection idle for ``timeout`` seconds is dropped with whatever it had sent."""

    def __init__(self, on_transfer: Callable[[KVTransfer], None], *, host: str = "127.0.0.1", port: int = 0,
                 timeout: float = 30.0, max_payload: int = DEFAULT_MAX_PAYLOAD,
                 ops: dict[str, FrameHandler] | None = None) -> None:
        self.on_transfer = on_transfer
        #: handlers of frames whose header names an ``op`` (the NCCL transport's handshakes, nccl.py); each
        #: gets the header, the payload and the socket, and answers on it itself
        self.ops: dict[str, FrameHandler] = dict(ops or {})
        self.host, self.port = host, port
        self.timeout = timeout
        self.max_payload = max_payload
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self._conns: set[asyncio.Task] = set()
        self.bytes_received = 0
        self.seconds_receiving = 0.0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> str:
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(128)
        sock.setblocking(False)
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._accepting = asyncio.create_task(self._accept_loop())
        return self.address

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(BaseException):
                await self._accepting
        for t in list(self._conns):
            t.cancel()
        if self._sock is not None:
            self._sock.close()

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            conn, peer = await loop.sock_accept(self._sock)
            _tune(conn)
            task = asyncio.create_task(self._handle(conn, peer))
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)

    async def _handle(self, sock: socket.socket, peer: Any) -> None:
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout):
                header, payload = await read_frame(sock, self.max_payload)
                op = header.get("op")
                if op is not None:
                    handler = self.ops.get(op) if isinstance(op, str) else None
                    if handler is None:
                        await write_frame(sock, {"ok": False, "error": f"this receiver does not handle op {op!r} "
                                                 f"(it handles {sorted(self.ops)})"})
                        return
                    n = await handler(header, payload, sock)
                    self.bytes_received += int(n or 0)
                    self.seconds_receiving += time.perf_counter() - t0 if n else 0.0
                    return
                try:
                    transfer = KVTransfer.from_descriptor(header, payload)
                    self.on_transfer(transfer)
                except LayoutError as e:
                    await write_frame(sock, {"ok": False, "error": str(e)})
                    return
                self.bytes_received += len(payload)
                self.seconds_receiving += time.perf_counter() - t0
                await write_frame(sock, {"ok": True, "transfer_id": transfer.transfer_id, "bytes": len(payload)})
        except (TimeoutError, OSError, asyncio.IncompleteReadError, TransferError) as e:
            log.warning("KV receive from %s failed: %s: %s", peer, type(e).__name__, e)
        finally:
            sock.close()
