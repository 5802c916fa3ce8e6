"""Prefill and decode workers: an engine each, behind a small internal HTTP API for the router.

Prefill worker (``ingot serve --role prefill``)::

    POST /internal/prefill {request_id, prompt_token_ids, params, transfer_id, kv_addr}
      -> runs the prompt, samples the first token; if the request goes on, copies its KV blocks out,
         frees them, sends them to the decode worker's receiver at kv_addr (process transport) and
      <- {"output": first-token delta, "transferred": true, "bytes", "seconds"}

Decode worker (``ingot serve --role decode``)::

    TCP kv_addr: receives transfers (runtime/disagg/transport.py) into a staging store
    POST /internal/decode {request_id, prompt_token_ids, params, transfer_id, first: delta}
      -> waits (bounded) for the transfer, converts it to its own layout, starts the request from it
      <- NDJSON stream of output deltas; the last has "finished": true
    POST /internal/discard {transfer_id}
      -> the router gave up on the request (its prefill worker failed after sending, or its client left
         before the decode began): drops what was staged and refuses the transfer's later parts
      <- {"ok": true, "dropped": number of parts dropped}

With ``kv_transport="nccl"`` (``--kv-transport nccl``, both workers on GPUs) the KV blocks go GPU to GPU
(runtime/disagg/nccl.py): the prefill worker copies them into a device buffer, the descriptor still
goes over the KV port's TCP frames, the bytes over NCCL, and the decode worker copies them from its
device buffer into the request's blocks.

Both: ``GET /health``, ``GET /internal/info`` (role, KV address and layout, load, transfers), ``GET /metrics``;
with ``router`` set they register with it every ``heartbeat_s`` seconds (so a restarted worker
comes back). Errors are OpenAI-shaped JSON bodies that name this worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ..engine import AsyncEngine, EngineRequestError, LLMEngine, Prefilled, QueueFullError, RequestOutput
from ..server import _EventStream, error_body
from .device import BufferPool, DeviceBlocks, cuda_pool, release
from .layout import KVLayout, KVTransfer, LayoutError, assemble_tokens, check_compatible
from .protocol import delta_to_json, logprobs_from_json, params_from_json
from .transport import KVSender, TcpKVReceiver, TcpKVSender, TransferError, TransferStore

log = logging.getLogger("ingot.disagg")

ROLES = ("prefill", "decode")
KV_TRANSPORTS = ("tcp", "nccl")


def engine_layout(llm: LLMEngine) -> KVLayout:
    """The KV layout of an engine's cache (one rank, every head)."""
    spec = llm.manifest.get("kv_cache") or llm.graph.meta["kv_cache"]
    return KVLayout.from_spec(spec, block_size=llm.block_size)


def _err(status: int, message: str, type_: str = "worker_error", code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code=code), status_code=status)


class Worker:
    """One prefill or decode worker: its engine, KV transport side, and the internal API handlers."""

    def __init__(self, role: str, engine: AsyncEngine, *, url: str, router: str | None = None,
                 kv_host: str = "127.0.0.1", kv_port: int = 0, transfer_timeout: float = 30.0,
                 heartbeat_s: float = 1.0, sender: KVSender | None = None, staging_ttl: float = 60.0,
                 kv_transport: str = "tcp", link_factory: Any = None, pool: BufferPool | None = None) -> None:
        """``kv_transport``: ``tcp`` (KV bytes through the host, any backend) or ``nccl`` (GPU to GPU, nccl.py;
        both workers ``device="cuda"``). ``link_factory`` / ``pool``: the NCCL link and device buffer pool
        (default: NCCL on this engine's GPU; the tests pass a loopback link over host memory)."""
        if role not in ROLES:
            raise ValueError(f"worker role must be one of {ROLES}, got {role!r}")
        if kv_transport not in KV_TRANSPORTS:
            raise ValueError(f"kv_transport must be one of {KV_TRANSPORTS}, got {kv_transport!r}")
        self.role = role
        self.engine = engine
        self.llm = engine.engine
        self.url = url.rstrip("/")
        self.router = router.rstrip("/") if router else None
        self.layout = engine_layout(self.llm)
        self.transfer_timeout = transfer_timeout
        self.heartbeat_s = heartbeat_s
        self.worker_id = uuid.uuid4().hex[:12]
        self._tasks: list[asyncio.Task] = []
        self.exported: dict[str, Any] = {}  # request id -> KV blocks (np.ndarray or DeviceBlocks)
        self.sender: KVSender = sender or TcpKVSender()
        self.bytes_sent = 0
        self.seconds_sending = 0.0
        self.transfers_sent = 0
        self.store: TransferStore | None = None
        self.receiver: TcpKVReceiver | None = None
        self.kv_transport = kv_transport
        self.pool: BufferPool | None = None
        self.nccl_receiver: Any = None
        ops: dict[str, Any] = {}
        if kv_transport == "nccl":
            from .nccl import NcclKVReceiver, NcclKVSender, NcclLink

            if link_factory is None:
                if self.llm.device != "cuda" or self.llm.tp:
                    raise ValueError("the NCCL KV transport moves KV between GPUs: run the worker with --device cuda "
                                     "(and a model without tensor parallelism)")
                ctx = self.llm.executor.ctx
                link_factory = lambda: NcclLink(ctx)  # noqa: E731
                pool = pool or cuda_pool(ctx)
            if pool is None:
                raise ValueError("a link_factory needs its pool")
            self.pool = pool
            if role == "prefill" and sender is None:
                self.sender = NcclKVSender(link_factory, sender_id=f"{self.url}#{self.worker_id}")
            if role == "decode":
                self.nccl_receiver = NcclKVReceiver(link_factory, pool, self._on_transfer, timeout=transfer_timeout,
                                                    check_layout=lambda lay: check_compatible(lay, self.layout))
                ops = self.nccl_receiver.ops
        if role == "prefill":
            engine.on_outputs = self._detach_prefilled
        else:
            self.store = TransferStore(ttl=staging_ttl)
            self.receiver = TcpKVReceiver(self._on_transfer, host=kv_host, port=kv_port, timeout=transfer_timeout,
                                          ops=ops)

    # -- engine thread ----------------------------------------------------------------------------

    def _detach_prefilled(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Prefill role, on the engine thread right after a step: a request that got its first token and
        goes on leaves this engine, its prompt KV copied out first."""
        res = []
        for o in outputs:
            if not o.finished and o.outputs and o.outputs[0].token_ids:
                n = len(o.prompt_token_ids)
                self.exported[o.request_id] = (self.llm.export_kv_device(o.request_id, n, self.pool)
                                               if self.pool is not None else self.llm.export_kv(o.request_id, n))
                self.llm.detach(o.request_id)
                o = dataclasses.replace(o, finished=True)
            res.append(o)
        m = self.llm.metrics
        if m is not None:  # the step's gauges were set before the requests left
            st = self.llm.scheduler.stats()
            m.blocks_used.set(st.kv_blocks_used)
            m.running.set(st.num_running)
        return res

    # -- decode: receiving ------------------------------------------------------------------------

    def _on_transfer(self, transfer: KVTransfer) -> None:
        check_compatible(transfer.layout, self.layout)
        assert self.store is not None
        self.store.put(transfer)

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def kv_addr(self) -> str | None:
        return self.receiver.address if self.receiver is not None else None

    async def start(self) -> None:
        self.engine.start()
        if self.receiver is not None:
            await self.receiver.start()
        self._tasks.append(asyncio.create_task(self._housekeeping()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.receiver is not None:
            await self.receiver.stop()
        await asyncio.get_running_loop().run_in_executor(None, self.engine.stop)
        for side in (self.sender, self.nccl_receiver):
            close = getattr(side, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()

    async def _housekeeping(self) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                if self.store is not None:
                    self.store.expire()
                if self.router:
                    try:
                        await client.post(self.router + "/internal/register", json={"url": self.url, "role": self.role})
                    except httpx.HTTPError as e:
                        log.debug("registering with %s failed: %s", self.router, e)
                await asyncio.sleep(self.heartbeat_s)

    def info(self) -> dict[str, Any]:
        st = self.llm.scheduler.stats()
        return {"role": self.role, "url": self.url, "worker_id": self.worker_id, "kv_addr": self.kv_addr,
                "layout": self.layout.to_json(), "model": self.llm.model_name, "max_model_len": self.llm.max_model_len,
                "load": {"in_flight": self.engine.num_in_flight, "running": st.num_running, "waiting": st.num_waiting,
                         "kv_blocks_used": st.kv_blocks_used, "kv_blocks_total": st.kv_blocks_total,
                         "staged_transfers": self.store.num_pending if self.store else 0,
                         "staged_expired": self.store.num_expired if self.store else 0,
                         "staged_cancelled": self.store.num_cancelled if self.store else 0},
                "transfer": {"transport": self.kv_transport, "bytes_sent": self.bytes_sent,
                             "seconds_sending": self.seconds_sending, "transfers_sent": self.transfers_sent,
                             "bytes_received": self.receiver.bytes_received if self.receiver else 0,
                             "seconds_receiving": self.receiver.seconds_receiving if self.receiver else 0.0,
                             "channels": self._channel_stats(),
                             "pool": self.pool.stats() if self.pool is not None else None},
                "prefilled": {"admitted": self.llm.num_prefilled_admitted,
                              "recomputed": self.llm.num_prefilled_recomputed}}

    def _channel_stats(self) -> dict[str, Any]:
        side = self.nccl_receiver if self.nccl_receiver is not None else self.sender
        stats = getattr(side, "stats", None)
        return stats() if callable(stats) else {}

    # -- handlers ---------------------------------------------------------------------------------

    async def _body(self, request: Request) -> dict[str, Any]:
        data = json.loads(await request.body())
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return data

    def _check(self, ids: list[int], params: Any) -> JSONResponse | None:
        try:
            self.llm.check_request(ids, params)
            self.engine.check_admission()
        except EngineRequestError as e:
            return JSONResponse(error_body(str(e), "invalid_request_error", e.param), status_code=400)
        except QueueFullError as e:
            return _err(503, f"{self.role} worker {self.url} overloaded: {e}", code="queue_full")
        return None

    async def prefill(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            rid, tid, kv_addr = str(body["request_id"]), str(body["transfer_id"]), str(body["kv_addr"])
            ids = [int(t) for t in body["prompt_token_ids"]]
            params = params_from_json(body["params"])
        except (ValueError, KeyError, TypeError) as e:
            return _err(400, f"bad prefill request: {type(e).__name__}: {e}", "invalid_request_error")
        bad = self._check(ids, params)
        if bad is not None:
            return bad
        out: RequestOutput | None = None
        try:
            async for o in self.engine.generate(ids, params, request_id=rid, priority=int(body.get("priority", 0))):
                out = o
            kv = self.exported.pop(rid, None)
        except RuntimeError as e:
            return _err(500, f"prefill worker {self.url}: {e}")
        finally:
            release(self.exported.pop(rid, None))
        assert out is not None
        if kv is None:  # finished at its first token (stop, eos, max_tokens 1): nothing to send
            return JSONResponse({"output": delta_to_json(out), "transferred": False})
        transfer = KVTransfer(tid, self.layout, ids, kv, meta={"request_id": rid, "sender": self.url})
        t0 = time.perf_counter()
        try:
            await self.sender.send(kv_addr, transfer, self.transfer_timeout)
        except TransferError as e:
            return _err(502, f"prefill worker {self.url}: {e}", code="kv_transfer_failed")
        finally:
            release(kv)
        dt = time.perf_counter() - t0
        self.bytes_sent += kv.nbytes
        self.seconds_sending += dt
        self.transfers_sent += 1
        return JSONResponse({"output": delta_to_json(out, finished=False), "transferred": True,
                             "bytes": int(kv.nbytes), "seconds": dt})

    async def decode(self, request: Request) -> Response:
        assert self.store is not None
        try:
            body = await self._body(request)
            rid, tid = str(body["request_id"]), str(body["transfer_id"])
            ids = [int(t) for t in body["prompt_token_ids"]]
            params = params_from_json(body["params"])
            first = body["first"]
            first_ids = [int(t) for t in first["token_ids"]]
            first_lps = logprobs_from_json(first.get("logprobs"))
        except (ValueError, KeyError, TypeError) as e:
            return _err(400, f"bad decode request: {type(e).__name__}: {e}", "invalid_request_error")
        try:
            parts = await self.store.take(tid, self.transfer_timeout)
        except TimeoutError:
            return _err(504, f"decode worker {self.url}: KV transfer {tid} did not arrive within "
                        f"{self.transfer_timeout} s", code="kv_transfer_timeout")
        try:
            pre = self._prefilled(parts, ids, params, tid, first_ids, first_lps)
        finally:
            del parts
        if isinstance(pre, Response):
            return pre

        priority = int(body.get("priority", 0))

        async def lines() -> AsyncIterator[str]:
            try:
                async for out in self.engine.generate(ids, params, request_id=rid, priority=priority, prefilled=pre):
                    yield json.dumps(delta_to_json(out), ensure_ascii=False) + "\n"
            except (QueueFullError, EngineRequestError) as e:  # refused before the engine took the request
                release(pre.kv_blocks)
                yield json.dumps({"finished": True, "error": f"decode worker {self.url}: {e}"}) + "\n"
            except RuntimeError as e:
                yield json.dumps({"finished": True, "error": f"decode worker {self.url}: {e}"}) + "\n"

        return _EventStream(lines(), media_type="application/x-ndjson")


    async def discard(self, request: Request) -> Response:
        assert self.store is not None
        try:
            tid = str((await self._body(request))["transfer_id"])
        except (ValueError, KeyError, TypeError) as e:
            return _err(400, f"bad discard request: {type(e).__name__}: {e}", "invalid_request_error")
        return JSONResponse({"ok": True, "dropped": self.store.cancel(tid)})

    def _prefilled(self, parts: list[KVTransfer], ids: list[int], params: Any, tid: str, first_ids: list[int],
                   first_lps: Any) -> Prefilled | Response:
        """The received parts as the engine's ``Prefilled``, or the error response (releasing device blocks).
        One part in this engine's exact layout on the device goes in as it is (``kv_blocks``); anything else is
        converted on the host (``assemble_tokens``)."""
        handed = False
        try:
            bad = self._check(ids, params)
            if bad is not None:
                return bad
            if parts[0].token_ids != ids:
                return _err(400, f"decode worker {self.url}: transfer {tid} holds other tokens than the prompt",
                            "invalid_request_error", code="kv_layout")
            if len(parts) == 1 and isinstance(parts[0].data, DeviceBlocks) and parts[0].layout == self.layout:
                handed = True
                return Prefilled(first_ids, None, first_lps, kv_blocks=parts[0].data)
            for p in parts:
                if isinstance(p.data, DeviceBlocks):
                    p.data = p.data.to_host()
            try:
                kv = assemble_tokens(parts, self.layout)
            except LayoutError as e:
                return _err(400, f"decode worker {self.url}: {e}", "invalid_request_error", code="kv_layout")
            return Prefilled(first_ids, kv, first_lps)
        finally:
            if not handed:
                for p in parts:
                    release(p.data)


def create_worker_app(worker: Worker) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await worker.start()
        try:
            yield
        finally:
            await worker.stop()

    app = FastAPI(title=f"ingot {worker.role} worker", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.get("/health")
    async def health() -> Response:
        ok = worker.engine.running
        return JSONResponse({"status": "ok" if ok else "engine not running", "role": worker.role},
                            status_code=200 if ok else 503)

    @app.get("/internal/info")
    async def info() -> dict[str, Any]:
        return worker.info()

    @app.get("/metrics")
    async def metrics() -> Response:
        from ..metrics import CONTENT_TYPE

        m = worker.llm.metrics
        return Response(m.render() if m is not None else b"", media_type=CONTENT_TYPE)

    if worker.role == "prefill":
        app.post("/internal/prefill")(worker.prefill)
    else:
        app.post("/internal/decode")(worker.decode)
        app.post("/internal/discard")(worker.discard)
    return app


def serve_worker(artifact: str, role: str, *, host: str = "127.0.0.1", port: int = 8001, router: str | None = None,
                 kv_port: int = 0, transfer_timeout: float = 30.0, max_queue: int = 1024, log_level: str = "info",
                 kv_transport: str = "tcp", **engine_args: Any) -> None:
    """Load ``artifact`` and run a ``role`` worker until SIGINT/SIGTERM."""
    import uvicorn

    from ..metrics import EngineMetrics

    llm = LLMEngine(artifact, **engine_args)
    llm.metrics = EngineMetrics(llm.model_name)
    engine = AsyncEngine(llm, max_queue=max_queue)
    worker = Worker(role, engine, url=f"http://{host}:{port}", router=router, kv_host=host, kv_port=kv_port,
                    transfer_timeout=transfer_timeout, kv_transport=kv_transport)
    config = uvicorn.Config(create_worker_app(worker), host=host, port=port, log_level=log_level,
                            access_log=log_level == "debug")
    uvicorn.Server(config).run()
