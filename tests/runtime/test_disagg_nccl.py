"""The NCCL KV transport without a GPU (docs/SCALE_OUT.md): everything but the CUDA and NCCL calls.

A loopback link stands in for ``NcclLink`` (two ranks in one process, host memory standing in for each
GPU's memory, send/receive matched in order), so these run on the CPU: the copy plan between a paged
cache and the transfer buffer, the buffer pool (reuse, trimming, release by garbage collection), the
descriptor checks, the handshakes over the KV port (unique-id exchange, one transfer per pair at a
time, refusals, a stalled peer that breaks the channel and a fresh one set up on the next transfer),
the engine hooks (``export_kv_device`` / ``Prefilled(kv_blocks=...)``) and a prefill and a decode
worker in one process with ``kv_transport="nccl"`` giving a single engine's greedy tokens. The real
link runs in tests/runtime/test_disagg_gpu.py (two GPUs).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi")

from ingot.runtime.cuda_backend import block_runs, kv_block_copies  # noqa: E402
from ingot.runtime.disagg.device import BufferPool, DeviceBlocks, HostMemory  # noqa: E402
from ingot.runtime.disagg.layout import KVLayout, KVTransfer, LayoutError, parse_descriptor  # noqa: E402
from ingot.runtime.disagg.nccl import NcclKVReceiver, NcclKVSender  # noqa: E402
from ingot.runtime.disagg.transport import TcpKVReceiver, TransferError, TransferStore, read_frame, write_frame  # noqa: E402
from ingot.runtime.engine import EngineRequestError, LLMEngine, Prefilled  # noqa: E402
from ingot.runtime.sampling import SamplingParams  # noqa: E402
from tests.runtime.serving_models import compile_tiny  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return compile_tiny(tmp_path_factory.mktemp("disagg_nccl"))


# -- a loopback link ------------------------------------------------------------------------------

_PAIRS: dict[bytes, _Pair] = {}


class _Pair:
    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.links: dict[int, LoopbackLink] = {}
        self.ops: dict[str, deque] = {"send": deque(), "recv": deque()}
        self.aborted = False


class LoopbackLink:
    """``NcclLink``'s interface over host memory: rank 0's sends are matched in order with rank 1's receives."""

    def __init__(self, memory: HostMemory, stall: threading.Event | None = None) -> None:
        self.mem = memory
        self.stall = stall  # set: sends never start (a peer that stopped working)
        self.pair: _Pair | None = None
        self.rank = -1
        self.closed = False

    @staticmethod
    def new_unique_id() -> bytes:
        uid = os.urandom(128)
        _PAIRS[uid] = _Pair()
        return uid

    def init(self, rank: int, uid: bytes) -> None:
        pair = _PAIRS[uid]
        with pair.cv:
            pair.links[rank] = self
            pair.cv.notify_all()
            if not pair.cv.wait_for(lambda: len(pair.links) == 2, timeout=10):
                raise TimeoutError("the peer never joined")
        self.pair, self.rank = pair, rank

    def _op(self, kind: str, ptr: int, nbytes: int, deadline: float) -> None:
        pair = self.pair
        assert pair is not None
        op = {"mem": self.mem, "ptr": ptr, "n": nbytes, "done": False, "error": None}
        with pair.cv:
            if not (kind == "send" and self.stall is not None and self.stall.is_set()):
                pair.ops[kind].append(op)
            while pair.ops["send"] and pair.ops["recv"]:
                s, r = pair.ops["send"].popleft(), pair.ops["recv"].popleft()
                if s["n"] != r["n"]:
                    s["error"] = r["error"] = f"sizes differ: {s['n']} sent, {r['n']} received"
                else:
                    r["mem"].view(r["ptr"], r["n"])[:] = s["mem"].view(s["ptr"], s["n"])
                s["done"] = r["done"] = True
            pair.cv.notify_all()
            while not op["done"]:
                if pair.aborted:
                    raise RuntimeError("communicator aborted")
                left = deadline - time.monotonic()
                if left <= 0:
                    pair.aborted = True
                    pair.cv.notify_all()
                    raise TimeoutError(f"{kind} of {nbytes} bytes did not complete in time")
                pair.cv.wait(min(left, 0.05))
        if op["error"]:
            raise RuntimeError(op["error"])

    def send_wait(self, ptr: int, nbytes: int, deadline: float) -> None:
        self._op("send", ptr, nbytes, deadline)

    def recv_wait(self, ptr: int, nbytes: int, deadline: float) -> None:
        self._op("recv", ptr, nbytes, deadline)

    def abort(self) -> None:
        if self.pair is not None:
            with self.pair.cv:
                self.pair.aborted = True
                self.pair.cv.notify_all()

    def close(self) -> None:
        self.closed = True


# -- copy plan, pool, descriptor -------------------------------------------------------------------


def test_block_runs_and_copy_plan_gather_and_scatter():
    assert block_runs([]) == []
    assert block_runs([4, 5, 6, 9, 3, 4, 10]) == [(0, 4, 3), (3, 9, 1), (4, 3, 2), (6, 10, 1)]
    # a paged cache of 3 layers x 12 blocks in host memory, gathered into and scattered from a transfer buffer
    mem = HostMemory()
    L, nblocks, blk = 3, 12, (2, 4, 2, 8)
    block_bytes = int(np.prod(blk)) * 4
    caches = [mem.alloc(nblocks * block_bytes) for _ in range(L)]
    rng = np.random.default_rng(0)
    host = rng.standard_normal((L, nblocks, *blk)).astype(np.float32)
    for layer, ptr in enumerate(caches):
        mem.write(ptr, host[layer])
    ids = [7, 8, 9, 2, 11, 0, 1]
    buf = mem.alloc(L * len(ids) * block_bytes)
    copies = kv_block_copies(caches, block_bytes, ids, buf, to_buffer=True)
    assert len(copies) == L * len(block_runs(ids))
    for d, s, n in copies:
        mem.view(d, n)[:] = mem.view(s, n)
    got = np.empty((L, len(ids), *blk), np.float32)
    mem.read(buf, got)
    assert np.array_equal(got, host[:, ids])  # the transfer layout: [layers, blocks in request order, ...]
    # scatter into other blocks of a second cache
    dst_caches = [mem.alloc(nblocks * block_bytes) for _ in range(L)]
    dst_ids = [3, 4, 5, 6, 10, 1, 2]
    for d, s, n in kv_block_copies(dst_caches, block_bytes, dst_ids, buf, to_buffer=False):
        mem.view(d, n)[:] = mem.view(s, n)
    for layer, ptr in enumerate(dst_caches):
        back = np.empty((nblocks, *blk), np.float32)
        mem.read(ptr, back)
        assert np.array_equal(back[dst_ids], host[layer, ids])


def test_buffer_pool_reuses_trims_and_releases_on_gc():
    mem = HostMemory()
    pool = mem.pool(max_cached_bytes=8 << 20, granularity=1 << 20)
    a = pool.acquire(1)
    assert a.capacity == 1 << 20 and pool.stats()["buffers_in_use"] == 1
    a.release()
    a.release()  # idempotent
    b = pool.acquire(1000)
    assert b.ptr == a.ptr and pool.num_allocs == 1  # reused
    big = pool.acquire(5 << 20)
    assert big.capacity == 5 << 20 and pool.num_allocs == 2
    b.release()
    big.release()
    c = pool.acquire(3 << 20)  # the 5 MiB one fits best among the free ones
    assert c.ptr == big.ptr and pool.stats()["bytes_in_use"] == 5 << 20
    c.release()
    huge = pool.acquire(20 << 20)  # over the cache limit: freed at the next acquire after its release
    huge.release()
    pool.acquire(1).release()
    assert pool.stats()["bytes_allocated"] <= 8 << 20 and huge.ptr not in mem.buffers
    # DeviceBlocks dropped without a release go back to the pool
    blocks = DeviceBlocks.allocate(pool, (2, 3, 2, 4, 2, 8), np.float32)
    assert pool.stats()["buffers_in_use"] == 1
    del blocks
    gc.collect()
    assert pool.stats()["buffers_in_use"] == 0 and pool.stats()["bytes_in_use"] == 0
    with pytest.raises(ValueError):
        pool.acquire(0)
    blocks = DeviceBlocks.allocate(pool, (1, 2), np.float32)
    blocks.release()
    with pytest.raises(RuntimeError, match="released"):
        _ = blocks.ptr
    pool.close()
    assert pool.stats()["bytes_allocated"] == 0 and not mem.buffers


def test_parse_descriptor_checks_every_field():
    layout = KVLayout(block_size=4, dtype="bfloat16", num_layers=2, num_kv_heads=2, head_dim=8)
    t = KVTransfer("t1", layout, [5] * 9, np.zeros(layout.block_shape(3), layout.np_dtype))
    tid, lay, toks, shape, nbytes, meta = parse_descriptor(json.loads(json.dumps(t.descriptor())))
    assert (tid, lay, toks, shape, nbytes) == ("t1", layout, [5] * 9, layout.block_shape(3), t.data.nbytes)
    for bad, match in [({"nbytes": 1}, "nbytes"), ({"shape": [1]}, "shape"), ({"num_tokens": 3}, "num_tokens"),
                       ({"token_ids": []}, "token_ids"), ({"transfer_id": ""}, "transfer_id"),
                       ({"meta": [1]}, "meta"), ({"layout": {**layout.to_json(), "x": 1}}, "unknown layout")]:
        with pytest.raises(LayoutError, match=match):
            parse_descriptor({**t.descriptor(), **bad})


def test_tp_nccl_p2p_functions_added_beside_the_all_reduce():
    from ingot.runtime.tp import nccl

    for name in ("send_bytes", "recv_bytes", "group_start", "group_end", "async_error", "p2p_library",
                 "NcclAllReduce", "new_unique_id", "available"):
        assert callable(getattr(nccl, name)), name
    ok, why = nccl.available(2)
    if not ok:  # this machine: no libnccl or fewer than 2 GPUs; the error says which
        assert why


# -- the handshakes over the KV port ---------------------------------------------------------------


def _transfer(layout: KVLayout, pool: BufferPool, mem: HostMemory, n: int, tid: str, seed: int = 0
              ) -> tuple[KVTransfer, np.ndarray]:
    data = np.random.default_rng(seed).standard_normal(layout.block_shape(layout.num_blocks(n))).astype(
        layout.np_dtype)
    blocks = DeviceBlocks.allocate(pool, data.shape, data.dtype)
    mem.write(blocks.ptr, data)
    return KVTransfer(tid, layout, list(range(n)), blocks, meta={"request_id": tid}), data


def test_nccl_protocol_over_loopback_transfers_refusals_and_a_stalled_peer():
    layout = KVLayout(block_size=16, dtype="bfloat16", num_layers=4, num_kv_heads=2, head_dim=16)
    send_mem, recv_mem = HostMemory(), HostMemory()
    send_pool, recv_pool = send_mem.pool(), recv_mem.pool()
    stall = threading.Event()

    def check(lay: KVLayout) -> None:
        if lay.head_dim != layout.head_dim:
            raise LayoutError("not the same model")

    async def main() -> None:
        store = TransferStore(ttl=30, max_bytes=1 << 20)
        nr = NcclKVReceiver(lambda: LoopbackLink(recv_mem), recv_pool, store.put, timeout=1.5, check_layout=check)
        receiver = TcpKVReceiver(store.put, timeout=1.5, ops=nr.ops)
        addr = await receiver.start()
        sender = NcclKVSender(lambda: LoopbackLink(send_mem, stall), sender_id="prefill-a")
        try:
            # several transfers at once: one in flight per pair, all arrive intact
            sent = [_transfer(layout, send_pool, send_mem, n, f"t{i}", seed=i) for i, n in enumerate((1, 17, 40, 64))]
            acks = await asyncio.gather(*(sender.send(addr, t, 5) for t, _ in sent))
            assert all(a["ok"] for a in acks) and len(sender.channels) == 1 and len(nr.channels) == 1
            for t, data in sent:
                t.data.release()
                (got,) = await store.take(t.transfer_id, 1)
                assert isinstance(got.data, DeviceBlocks) and got.token_ids == t.token_ids
                assert np.array_equal(got.data.to_host(), data)
            assert send_pool.stats()["buffers_in_use"] == 0 and recv_pool.stats()["buffers_in_use"] == 0
            cid = next(iter(nr.channels))
            # refused before anything is sent: the channel stays
            other = KVLayout(**{**layout.to_json(), "head_dim": 8})
            t, _ = _transfer(other, send_pool, send_mem, 5, "wrong-model")
            with pytest.raises(TransferError, match="refused.*not the same model"):
                await sender.send(addr, t, 5)
            t, _ = _transfer(layout, send_pool, send_mem, 3000, "too-big")  # 1.5 MB; staging holds 1 MiB
            with pytest.raises(TransferError, match="staging full"):
                await sender.send(addr, t, 5)
            assert list(nr.channels) == [cid] and recv_pool.stats()["buffers_in_use"] == 0
            # a sender that stops after "ready": both sides time out, the channel breaks
            stall.set()
            t, _ = _transfer(layout, send_pool, send_mem, 20, "stalled")
            t0 = time.monotonic()
            with pytest.raises(TransferError, match="stalled"):
                await sender.send(addr, t, 1.0)
            assert time.monotonic() - t0 < 5
            await asyncio.sleep(0.7)  # the receiver's deadline (1.5 s) passes too
            assert nr.channels == {} and recv_pool.stats()["buffers_in_use"] == 0
            # the next transfer sets up a new communicator and goes through
            stall.clear()
            t, data = _transfer(layout, send_pool, send_mem, 33, "after")
            assert (await sender.send(addr, t, 5))["ok"]
            assert len(nr.channels) == 1 and next(iter(nr.channels)) != cid
            (got,) = await store.take("after", 1)
            assert np.array_equal(got.data.to_host(), data)
            assert store.num_pending == 0
        finally:
            sender.close()
            nr.close()
            await receiver.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_unknown_op_and_unknown_channel_are_refused():
    layout = KVLayout(block_size=4, dtype="float32", num_layers=1, num_kv_heads=1, head_dim=4)

    async def ask(addr: str, header: dict[str, Any]) -> dict[str, Any]:
        import socket

        host, port = addr.split(":")
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, int(port)))
        try:
            await write_frame(sock, header)
            reply, _ = await read_frame(sock, 0)
            return reply
        finally:
            sock.close()

    async def main() -> None:
        store = TransferStore()
        mem = HostMemory()
        nr = NcclKVReceiver(lambda: LoopbackLink(mem), mem.pool(), store.put, timeout=2)
        plain = TcpKVReceiver(store.put, timeout=2)
        with_ops = TcpKVReceiver(store.put, timeout=2, ops=nr.ops)
        a, b = await plain.start(), await with_ops.start()
        try:
            r = await ask(a, {"op": "nccl_init", "sender": "x"})
            assert not r["ok"] and "does not handle op 'nccl_init'" in r["error"]
            t = KVTransfer("t", layout, [1, 2], np.zeros(layout.block_shape(1), np.float32))
            r = await ask(b, {**t.descriptor(), "op": "nccl_transfer", "channel": "nope"})
            assert not r["ok"] and "channel nope is unknown" in r["error"]
        finally:
            await plain.stop()
            await with_ops.stop()

    asyncio.run(asyncio.wait_for(main(), 30))


# -- engine hooks ----------------------------------------------------------------------------------


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 259, int(k)).tolist() for k in rng.integers(4, 70, n)]


def test_engine_device_blocks_handoff_matches_one_engine(tiny):
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = _prompts(5, seed=11)
    want = [o.outputs[0].token_ids for o in LLMEngine(tiny, num_blocks=128).generate(prompts, sp)]
    mem = HostMemory()
    pool = mem.pool()
    pre = LLMEngine(tiny, num_blocks=128)
    dec = LLMEngine(tiny, num_blocks=128)
    dec.add_request([9] * 20, sp, request_id="other")  # the decode engine's blocks are not the prefill's
    for i, p in enumerate(prompts):
        rid = pre.add_request(p, sp)
        (first,) = pre.step()
        blocks = pre.export_kv_device(rid, len(p), pool)
        assert blocks.shape == (2, -(-len(p) // 16), 2, 16, 2, 8) and blocks.dtype == np.float32
        assert np.array_equal(blocks.to_host(release=False), pre.export_kv(rid, len(p)))
        pre.detach(rid)
        dec.add_request(p, sp, request_id=f"r{i}", prefilled=Prefilled(first.outputs[0].token_ids, kv_blocks=blocks))
        assert blocks.released and pool.stats()["buffers_in_use"] == 0
    got: dict[str, list[int]] = {}
    while dec.has_unfinished_requests():
        for o in dec.step():
            if o.finished:
                got[o.request_id] = o.outputs[0].token_ids
    assert [got[f"r{i}"] for i in range(len(prompts))] == want
    assert dec.num_prefilled_admitted == len(prompts) and dec.num_prefilled_recomputed == 0
    # blocks of another shape are refused, and still released
    bad = DeviceBlocks.allocate(pool, (2, 1, 2, 16, 2, 4), np.float32)
    with pytest.raises(EngineRequestError, match="prefilled KV blocks"):
        dec.add_request(prompts[0], sp, request_id="bad", prefilled=Prefilled([5], kv_blocks=bad))
    assert bad.released and pool.stats()["buffers_in_use"] == 0


# -- two workers in one process, kv_transport="nccl" over the loopback link -------------------------


class _Body:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = json.dumps(data).encode()

    async def body(self) -> bytes:
        return self.data


def test_workers_with_nccl_transport_match_one_engine(tiny):
    from ingot.runtime.disagg.protocol import params_to_json
    from ingot.runtime.disagg.worker import Worker
    from ingot.runtime.engine import AsyncEngine

    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = _prompts(6, seed=12)
    want = [o.outputs[0].token_ids for o in LLMEngine(tiny, num_blocks=128).generate(prompts, sp)]
    pre_mem, dec_mem = HostMemory(), HostMemory()

    async def main() -> list[list[int]]:
        pw = Worker("prefill", AsyncEngine(LLMEngine(tiny, num_blocks=128)), url="http://prefill",
                    kv_transport="nccl", link_factory=lambda: LoopbackLink(pre_mem), pool=pre_mem.pool())
        dw = Worker("decode", AsyncEngine(LLMEngine(tiny, num_blocks=128)), url="http://decode",
                    kv_transport="nccl", link_factory=lambda: LoopbackLink(dec_mem), pool=dec_mem.pool(),
                    transfer_timeout=10)
        await pw.start()
        await dw.start()
        try:
            async def one(i: int) -> list[int]:
                body = {"request_id": f"r{i}", "prompt_token_ids": prompts[i], "params": params_to_json(sp),
                        "transfer_id": f"t{i}", "kv_addr": dw.kv_addr}
                r = await pw.prefill(_Body(body))
                first = json.loads(r.body)
                assert r.status_code == 200 and first["transferred"], first
                resp = await dw.decode(_Body({**body, "first": first["output"]}))
                toks = list(first["output"]["token_ids"])
                async for line in resp.body_iterator:
                    d = json.loads(line)
                    assert not d.get("error"), d
                    toks += d["token_ids"]
                return toks

            got = await asyncio.gather(*(one(i) for i in range(len(prompts))))
            info_p, info_d = pw.info(), dw.info()
            assert info_p["transfer"]["transport"] == "nccl" and info_p["transfer"]["transfers_sent"] == len(prompts)
            assert info_d["transfer"]["bytes_received"] == info_p["transfer"]["bytes_sent"] > 0
            assert info_d["prefilled"] == {"admitted": len(prompts), "recomputed": 0}
            assert info_p["transfer"]["pool"]["buffers_in_use"] == 0
            assert info_d["transfer"]["pool"]["buffers_in_use"] == 0 and dw.store.num_pending == 0
            return got
        finally:
            await pw.stop()
            await dw.stop()

    assert asyncio.run(asyncio.wait_for(main(), 120)) == want


def test_nccl_transport_on_a_cpu_engine_is_refused(tiny):
    from ingot.runtime.disagg.worker import Worker
    from ingot.runtime.engine import AsyncEngine

    with pytest.raises(ValueError, match="--device cuda"):
        Worker("decode", AsyncEngine(LLMEngine(tiny, num_blocks=16)), url="http://x", kv_transport="nccl")
    with pytest.raises(ValueError, match="kv_transport"):
        Worker("decode", AsyncEngine(LLMEngine(tiny, num_blocks=16)), url="http://x", kv_transport="rdma")
