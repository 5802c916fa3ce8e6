"""The router of disaggregated serving: the OpenAI API in front of prefill and decode workers.

It is ``runtime/server.py``'s app over a ``Router`` in place of the ``AsyncEngine``: request parsing,
chat templates, SSE and error bodies are the single-process server's. Per request it picks the
least-loaded healthy prefill worker and decode worker, has the prefill worker compute the prompt's
KV and first token and send the KV straight to the decode worker, then streams the decode worker's
tokens back::

    client --HTTP--> router --POST /internal/prefill--> prefill worker --KV frames--> decode worker
                            <------ first token --------
                            --POST /internal/decode (NDJSON stream)-------------------> decode worker
    client <--SSE--- router <------ tokens ---------------------------------------------

Faults: every worker call has a deadline; a worker that fails a call or its health check is marked
down and gets no work until a health check (``GET /internal/info``, every ``health_interval`` s) or
its registration (``POST /internal/register``) finds it again. A failed request ends with a 503 body
(or an error event in the stream) naming the worker; other requests are untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from ..engine import EngineRequestError, QueueFullError, RequestOutput, check_prompt_length
from ..sampling import SamplingParams
from ..server import MAX_BODY_BYTES, ApiError, create_app
from .protocol import OutputAccumulator, params_to_json

log = logging.getLogger("ingot.disagg")


class WorkerError(ApiError):
    """A worker failed a request: 503 with a message naming the worker."""

    def __init__(self, message: str, code: str = "worker_failed") -> None:
        super().__init__(503, message, "worker_error", code=code)


@dataclass
class WorkerInfo:
    url: str
    role: str | None = None
    kv_addr: str | None = None
    layout: dict[str, Any] | None = None
    healthy: bool = False
    in_flight: int = 0
    served: int = 0
    failed: int = 0
    down_reason: str = "not checked yet"
    load: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "role": self.role, "kv_addr": self.kv_addr, "healthy": self.healthy,
                "in_flight": self.in_flight, "served": self.served, "failed": self.failed,
                "down_reason": None if self.healthy else self.down_reason, "load": self.load, "layout": self.layout}


class RouterMetrics:
    """Router counters in a registry of their own (``/metrics``)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("ingot_router_requests", "Requests by worker role and outcome", ["role", "outcome"],
                                registry=r)
        self.transfer_bytes = Counter("ingot_router_kv_transfer_bytes", "KV bytes moved prefill -> decode", registry=r)
        self.transfer_seconds = Counter("ingot_router_kv_transfer_seconds", "Time spent moving KV", registry=r)
        self.healthy = Gauge("ingot_router_workers_healthy", "Healthy workers by role", ["role"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RouterModel:
    """What the HTTP layer asks of the model, without weights: name, tokenizer, context length, checks."""

    def __init__(self, artifact: str | Path, *, model_name: str | None = None, max_model_len: int | None = None
                 ) -> None:
        from ..artifact import read_manifest

        self.path = Path(artifact)
        manifest = read_manifest(self.path)
        info = manifest.get("llm") or manifest.get("meta", {}).get("llm") or {}
        if manifest.get("mode") != "llm":
            raise ValueError(f"{self.path}: not an LLM artifact (mode {manifest.get('mode')!r})")
        self.model_name = model_name or self.path.name.removesuffix(".ingot") or "model"
        self.vocab_size = int(info["vocab_size"])
        context = int(info.get("context_length") or 1 << 30)
        self.max_model_len = min(max_model_len or context, context)
        self.tokenizer = None
        if (self.path / "tokenizer.json").is_file():
            from ..tokenizer import Tokenizer

            self.tokenizer = Tokenizer(self.path)
        self.metrics = RouterMetrics()

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise EngineRequestError("this model has no tokenizer: pass token ids, not text", "prompt")
        return self.tokenizer.encode(prompt)

    def check_request(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> int:
        max_tokens = check_prompt_length(prompt_token_ids, params, self.vocab_size, self.max_model_len)
        if params.n != 1:
            raise EngineRequestError("n > 1 is not supported by disaggregated serving; send n requests", "n")
        return max_tokens


class Router:
    """Stands where ``server.py`` expects an ``AsyncEngine``: ``generate``, ``check_admission``, ``start``/``stop``."""

    def __init__(self, model: RouterModel, workers: Sequence[str] = (), *, max_in_flight: int = 4096,
                 health_interval: float = 0.5, health_timeout: float = 2.0, prefill_timeout: float = 120.0,
                 stream_timeout: float = 60.0, connect_timeout: float = 5.0) -> None:
        self.engine = model  # the server reads .engine for the model's name, tokenizer and checks
        self.model = model
        self.metrics = model.metrics
        self.workers: dict[str, WorkerInfo] = {}
        for url in workers:
            self.add_worker(url)
        self.max_in_flight = max_in_flight
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.prefill_timeout = prefill_timeout
        self.stream_timeout = stream_timeout
        self.connect_timeout = connect_timeout
        self.num_in_flight = 0
        self._client: Any = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._ids = itertools.count()
        self._background: set[asyncio.Task] = set()

    # -- workers ----------------------------------------------------------------------------------

    def add_worker(self, url: str, role: str | None = None) -> WorkerInfo:
        url = url.rstrip("/")
        w = self.workers.get(url)
        if w is None:
            w = self.workers[url] = WorkerInfo(url, role)
            log.info("worker %s registered (%s)", url, role)
        return w

    def mark_down(self, w: WorkerInfo, reason: str) -> None:
        if w.healthy:
            log.warning("%s worker %s is down: %s", w.role, w.url, reason)
        w.healthy = False
        w.down_reason = reason
        self._update_gauges()

    def _update_gauges(self) -> None:
        for role in ("prefill", "decode"):
            self.metrics.healthy.labels(role).set(sum(w.healthy and w.role == role for w in self.workers.values()))

    async def check_worker(self, w: WorkerInfo) -> None:
        import httpx

        try:
            r = await self._client.get(w.url + "/internal/info", timeout=self.health_timeout)
            r.raise_for_status()
            info = r.json()
            if info.get("role") not in ("prefill", "decode") or (info["role"] == "decode" and not info.get("kv_addr")):
                raise ValueError(f"not a worker: {str(info)[:200]}")
        except (httpx.HTTPError, ValueError) as e:
            self.mark_down(w, f"health check failed: {type(e).__name__}: {e}")
            return
        if not w.healthy:
            log.info("%s worker %s is up", info["role"], w.url)
        w.role, w.kv_addr, w.layout = info["role"], info.get("kv_addr"), info.get("layout")
        w.load = info.get("load", {})
        w.healthy = True
        self._update_gauges()

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check_worker(w) for w in list(self.workers.values())))

    async def _health_loop(self) -> None:
        while True:
            try:
                await self.check_all()
            except Exception:  # never let the loop die
                log.exception("health check round failed")
            await asyncio.sleep(self.health_interval)

    def pick(self, role: str) -> WorkerInfo:
        """The healthy ``role`` worker with the fewest requests in flight (then the fewest served)."""
        ready = [w for w in self.workers.values() if w.healthy and w.role == role]
        if not ready:
            known = [f"{w.url} ({w.down_reason})" for w in self.workers.values() if w.role in (role, None)]
            raise WorkerError(f"no healthy {role} worker" + (f"; known: {', '.join(known)}" if known else ""),
                              code="no_worker")
        return min(ready, key=lambda w: (w.in_flight, w.served))

    # -- the AsyncEngine surface ------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        import httpx

        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        self._task = self._loop.create_task(self._health_loop())

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new requests; end the health checks (called from a worker thread by the server's lifespan)."""
        self._stopping = True
        deadline = time.monotonic() + (timeout if timeout is not None else 30.0)
        while self.num_in_flight and time.monotonic() < deadline:  # drain
            time.sleep(0.05)
        if self._task is not None and self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._task.cancel)

    def check_admission(self) -> None:
        if self._stopping:
            raise QueueFullError("the server is shutting down")
        if self.num_in_flight >= self.max_in_flight:
            raise QueueFullError(f"too many requests in flight ({self.max_in_flight})")
        for role in ("prefill", "decode"):
            if not any(w.healthy and w.role == role for w in self.workers.values()):
                raise QueueFullError(f"no healthy {role} worker")

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams, *,
                       request_id: str | None = None, priority: int = 0) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs through a prefill worker then a decode worker."""
        ids = [int(t) for t in prompt_token_ids]
        self.model.check_request(ids, params)
        self.check_admission()
        rid = request_id or f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        acc = OutputAccumulator(rid, ids, time.monotonic())
        self.num_in_flight += 1
        decode: WorkerInfo | None = None
        tid = uuid.uuid4().hex
        staged = False  # whether the decode worker may hold this request's KV that no decode call will take
        try:
            prefill, decode = self.pick("prefill"), self.pick("decode")
            body = {"request_id": rid, "prompt_token_ids": ids, "params": params_to_json(params), "priority": priority,
                    "transfer_id": tid}
            staged = True  # from here the prefill worker may send the KV, even if its answer never reaches us
            try:
                first = await self._prefill(prefill, {**body, "kv_addr": decode.kv_addr})
            except WorkerError as e:
                # the prefill worker could not hand the KV to the decode worker: that is the decode
                # worker's failure, and the client should hear its name
                if decode.kv_addr and decode.kv_addr in str(e):
                    raise WorkerError(f"decode worker {decode.url} did not take the KV transfer: {e}") from None
                raise
            staged = bool(first.get("transferred"))
            out = acc.add(first["output"], time.monotonic())
            yield out
            if out.finished:
                return
            if not staged:
                raise WorkerError(f"prefill worker {prefill.url} returned an unfinished request without its KV")
            self.metrics.transfer_bytes.inc(first.get("bytes", 0))
            self.metrics.transfer_seconds.inc(first.get("seconds", 0.0))
            staged = False  # the decode call takes the transfer (or the worker's TTL drops it if that call fails)
            async for out in self._decode(decode, {**body, "first": first["output"]}, acc):
                yield out
        finally:
            self.num_in_flight -= 1
            if staged and decode is not None:
                self._discard_later(decode, tid)

    def _discard_later(self, w: WorkerInfo, tid: str) -> None:
        """Tell decode worker ``w`` that transfer ``tid`` will not be claimed (best effort, in the background:
        this runs in a request's cleanup, possibly a cancelled one). Without it the transfer would hold the
        worker's staging memory until its TTL."""
        if self._loop is None or self._client is None:
            return

        async def discard() -> None:
            import httpx

            try:
                await self._client.post(w.url + "/internal/discard", json={"transfer_id": tid},
                                         timeout=self.health_timeout)
            except httpx.HTTPError as e:  # a dead worker drops its staging anyway
                log.info("discarding transfer %s on %s failed: %s", tid, w.url, e)

        task = self._loop.create_task(discard())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _prefill(self, w: WorkerInfo, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        w.in_flight += 1
        try:
            r = await self._client.post(w.url + "/internal/prefill", json=body,
                                        timeout=httpx.Timeout(self.prefill_timeout, connect=self.connect_timeout))
            data = r.json()
        except (httpx.HTTPError, ValueError) as e:
            w.failed += 1
            self.metrics.requests.labels("prefill", "failed").inc()
            if isinstance(e, httpx.TimeoutException):
                reason = f"no answer within {self.prefill_timeout} s"
            else:
                reason = f"{type(e).__name__}: {e}"
                self.mark_down(w, reason)
            raise WorkerError(f"prefill worker {w.url} failed: {reason}") from None
        finally:
            w.in_flight -= 1
        self._raise_for(r.status_code, data, w, "prefill")
        w.served += 1
        self.metrics.requests.labels("prefill", "ok").inc()
        return data

    def _raise_for(self, status: int, data: Any, w: WorkerInfo, role: str) -> None:
        if status == 200:
            return
        err = data.get("error", {}) if isinstance(data, dict) else {}
        message = str(err.get("message") or data)[:2000]
        self.metrics.requests.labels(role, "failed").inc()
        if 400 <= status < 500 and status != 408:
            raise ApiError(status, message, err.get("type") or "invalid_request_error", err.get("param"),
                           err.get("code"))
        w.failed += 1
        raise WorkerError(f"{role} worker {w.url} failed ({status}): {message}")

    async def _decode(self, w: WorkerInfo, body: dict[str, Any], acc: OutputAccumulator
                      ) -> AsyncIterator[RequestOutput]:
        import json

        import httpx

        w.in_flight += 1
        finished = False
        try:
            async with self._client.stream("POST", w.url + "/internal/decode", json=body, timeout=httpx.Timeout(
                    self.stream_timeout, connect=self.connect_timeout)) as r:
                if r.status_code != 200:
                    raw = await r.aread()
                    try:
                        data = json.loads(raw)
                    except ValueError:
                        data = raw.decode(errors="replace")
                    self._raise_for(r.status_code, data, w, "decode")
                async for line in r.aiter_lines():
                    if not line:
                        continue
                    d = json.loads(line)
                    if d.get("error"):
                        w.failed += 1
                        raise WorkerError(str(d["error"]))
                    out = acc.add(d, time.monotonic())
                    finished = out.finished
                    yield out
                    if finished:
                        break
        except (httpx.HTTPError, ValueError) as e:
            w.failed += 1
            if isinstance(e, httpx.TimeoutException):
                reason = f"no token within {self.stream_timeout} s"
            else:
                reason = f"{type(e).__name__}: {e}"
                self.mark_down(w, reason)
            self.metrics.requests.labels("decode", "failed").inc()
            raise WorkerError(f"decode worker {w.url} failed: {reason}") from None
        finally:
            w.in_flight -= 1
        if not finished:
            self.metrics.requests.labels("decode", "failed").inc()
            self.mark_down(w, "stream ended early")
            raise WorkerError(f"decode worker {w.url} failed: the stream ended before the request finished")
        w.served += 1
        self.metrics.requests.labels("decode", "ok").inc()


def create_router_app(router: Router, *, model_name: str | None = None, api_key: str | None = None,
                      max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The OpenAI app (runtime/server.py) over ``router``, plus ``/internal/register`` and ``/internal/workers``."""
    app = create_app(router, model_name=model_name, api_key=api_key, max_body_bytes=max_body_bytes)  # type: ignore

    @app.post("/internal/register")
    async def register(request: Request) -> dict[str, Any]:
        data = await request.json()
        url, role = data.get("url") if isinstance(data, dict) else None, data.get("role")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")) or role not in ("prefill", "decode"):
            raise ApiError(400, "register: want {\"url\": \"http://host:port\", \"role\": \"prefill\"|\"decode\"}")
        w = router.add_worker(url, role)
        if not w.healthy:
            await router.check_worker(w)
        return {"ok": True, "healthy": w.healthy}

    @app.get("/internal/workers")
    async def workers() -> dict[str, Any]:
        return {"workers": [w.to_json() for w in router.workers.values()], "in_flight": router.num_in_flight}

    return app


def serve_router(artifact: str, *, host: str = "127.0.0.1", port: int = 8000, workers: Sequence[str] = (),
                 api_key: str | None = None, model_name: str | None = None, max_model_len: int | None = None,
                 log_level: str = "info", worker_timeout: float = 120.0) -> None:
    """Run the router until SIGINT/SIGTERM; ``workers``: URLs known up front (others register themselves)."""
    import uvicorn

    model = RouterModel(artifact, model_name=model_name, max_model_len=max_model_len)
    router = Router(model, workers, prefill_timeout=worker_timeout, stream_timeout=worker_timeout)
    app = create_router_app(router, model_name=model_name, api_key=api_key)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=log_level == "debug")
    uvicorn.Server(config).run()
