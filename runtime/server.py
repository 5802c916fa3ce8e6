"""The OpenAI-compatible HTTP server: FastAPI on uvicorn, in front of an ``AsyncEngine``.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``,
``GET /metrics`` (Prometheus). The server only speaks HTTP: it parses and validates requests,
renders the chat template, turns engine outputs into OpenAI JSON or SSE chunks; all scheduling and
stepping happens in the engine thread.

Errors are always 4xx (or 503 when overloaded) with OpenAI's body
``{"error": {"message", "type", "param", "code"}}``: the body is read under a size limit, decoded as
strict UTF-8, parsed as JSON and validated with pydantic by hand, so no malformed input reaches a
handler's logic. A client that disconnects (streaming or not) aborts its request, which frees its
KV blocks. Over ``max_num_seqs + max_queue`` requests in flight: 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .engine import AsyncEngine, EngineRequestError, QueueFullError, RequestOutput
from .sampling import MAX_LOGPROBS, MAX_N, SamplingParams, SamplingParamsError

MAX_BODY_BYTES = 4 << 20


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers


def error_body(message: str, type_: str, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(error_body(e.message, e.type, e.param, e.code), status_code=e.status, headers=e.headers)


# -- request models -------------------------------------------------------------------------------

PositiveInt = Annotated[StrictInt, Field(ge=1)]


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    max_tokens: PositiveInt | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: StrictInt = -1
    min_p: float = Field(0.0, ge=0, le=1)
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = 1
    stream: StrictBool = False
    stream_options: dict[str, StrictBool] | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[Annotated[StrictInt, Field(ge=0)]] | None = None
    seed: StrictInt | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0)
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    logit_bias: dict[str, float] | None = None
    priority: StrictInt = 0
    user: StrictStr | None = None
    return_token_ids: StrictBool = False  # vLLM's extension: each choice also carries its token ids

    def sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        if self.logit_bias:
            raise ApiError(400, "logit_bias is not supported", param="logit_bias")
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if any(not s for s in stop):
            raise ApiError(400, "stop strings must not be empty", param="stop")
        try:
            return SamplingParams(
                n=self.n, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                repetition_penalty=self.repetition_penalty, presence_penalty=self.presence_penalty,
                frequency_penalty=self.frequency_penalty, seed=self.seed, max_tokens=max_tokens, stop=tuple(stop),
                stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos, logprobs=logprobs,
                skip_special_tokens=self.skip_special_tokens,
            )
        except SamplingParamsError as e:
            raise ApiError(400, str(e), param=str(e).split(":", 1)[0]) from None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


TokenIds = list[Annotated[StrictInt, Field(ge=0)]]


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictStr] | TokenIds | list[TokenIds]
    max_tokens: PositiveInt | None = 16
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: StrictBool = False
    suffix: StrictStr | None = None
    best_of: StrictInt | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: list[Any] | None = None
    add_generation_prompt: StrictBool = True


def _validation_error(e: ValidationError) -> ApiError:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()) if not isinstance(p, int) and p not in (
        "str", "list[str]", "list[int]", "list[list[int]]", "constrained-int", "function-after[text()]"))
    param = loc.split(".")[0] if loc else None
    msg = err.get("msg", "invalid value")
    return ApiError(400, f"{loc or 'body'}: {msg}" + (f" ({len(e.errors())} errors)" if len(e.errors()) > 1 else ""),
                    param=param)


# -- the app --------------------------------------------------------------------------------------


class Server:
    """The HTTP side of one model: request parsing, prompt building, response shaping."""

    def __init__(self, engine: AsyncEngine, *, model_name: str | None = None, api_key: str | None = None,
                 max_body_bytes: int = MAX_BODY_BYTES, metrics: Any = None) -> None:
        self.engine = engine
        self.llm = engine.engine
        self.model_name = model_name or self.llm.model_name
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics if metrics is not None else self.llm.metrics
        self.created = int(time.time())

    # -- plumbing ---------------------------------------------------------------------------------

    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer ...)", "authentication_error",
                           code="invalid_api_key")

    async def read_json(self, request: Request, model: type[BaseModel]) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise ApiError(413, f"request body larger than {self.max_body_bytes} bytes", code="body_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise ApiError(413, f"request body larger than {self.max_body_bytes} bytes", code="body_too_large")
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ApiError(400, f"the request body is not valid UTF-8 (byte {e.start})") from None
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the request body must be a JSON object")
        try:
            req = model.model_validate(data)
        except ValidationError as e:
            raise _validation_error(e) from None
        name = getattr(req, "model", None)
        if name is not None and name != self.model_name:
            raise ApiError(404, f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                           "not_found_error", "model", "model_not_found")
        return req

    def encode(self, text: str, param: str) -> list[int]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, f"{param}: the text is not valid Unicode (lone surrogate)", param=param) from None
        try:
            return self.llm.encode(text)
        except EngineRequestError as e:
            raise ApiError(400, str(e), param=param) from None

    def token_text(self, token_id: int) -> str:
        tok = self.llm.tokenizer
        return "" if tok is None else tok.decode([token_id], skip_special_tokens=False)

    def check(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        try:
            self.llm.check_request(prompt_ids, params)
        except EngineRequestError as e:
            raise ApiError(400, str(e), param=e.param, code="context_length_exceeded"
                           if "context length" in str(e) else None) from None
        try:
            self.engine.check_admission()
        except QueueFullError as e:
            raise ApiError(503, f"server overloaded: {e}", "server_overloaded", code="queue_full",
                           headers={"Retry-After": "1"}) from None

    # -- streams ----------------------------------------------------------------------------------

    async def merged(self, prompts: list[list[int]], params: SamplingParams, priority: int
                     ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """The outputs of one engine request per prompt, interleaved as they come: (prompt index, output)."""
        if len(prompts) == 1:
            async for out in self.engine.generate(prompts[0], params, priority=priority):
                yield 0, out
            return
        queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

        async def pump(i: int, ids: list[int]) -> None:
            try:
                async for out in self.engine.generate(ids, params, priority=priority):
                    queue.put_nowait((i, out))
            except Exception as e:
                queue.put_nowait((i, e))

        tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(prompts)]
        try:
            left = len(tasks)
            while left:
                i, item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                assert item is not None
                if item.finished:
                    left -= 1
                yield i, item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def until_disconnect(self, request: Request, work: Any) -> Any:
        """Run ``work`` (a coroutine); if the client disconnects first, cancel it (aborting the request)."""
        task = asyncio.ensure_future(work)

        async def watch() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if task not in done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            return None
        return task.result()

    # -- completions ------------------------------------------------------------------------------

    def completion_prompts(self, req: CompletionRequest) -> list[list[int]]:
        p = req.prompt
        if isinstance(p, str):
            return [self.encode(p, "prompt")]
        if not p:
            raise ApiError(400, "prompt: must not be empty", param="prompt")
        if isinstance(p[0], str):
            return [self.encode(s, "prompt") for s in p]  # type: ignore[arg-type]
        if isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return [list(x) for x in p]  # type: ignore[union-attr]

    def completion_logprobs(self, lps: Sequence[Any], offset: int) -> dict[str, Any]:
        tokens, token_lps, tops, offsets = [], [], [], []
        for lp in lps:
            t = self.token_text(lp.token_id)
            tokens.append(t)
            token_lps.append(lp.logprob)
            tops.append({self.token_text(i): v for i, v in zip(lp.top_token_ids, lp.top_logprobs)})
            offsets.append(offset)
            offset += len(t)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}

    async def completions(self, request: Request) -> Response:
        self.check_auth(request)
        req: CompletionRequest = await self.read_json(request, CompletionRequest)
        if req.echo:
            raise ApiError(400, "echo is not supported", param="echo")
        if req.suffix:
            raise ApiError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise ApiError(400, "best_of is not supported (other than best_of == n)", param="best_of")
        params = req.sampling_params(req.max_tokens, req.logprobs)
        prompts = self.completion_prompts(req)
        for ids in prompts:
            self.check(ids, params)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        base = {"id": rid, "object": "text_completion", "created": created, "model": self.model_name}
        n = params.n

        def choice(i: int, c: Any, text: str, lps: Sequence[Any] | None, offset: int,
                   token_ids: list[int]) -> dict[str, Any]:
            ch = {"index": i * n + c.index, "text": text, "finish_reason": c.finish_reason,
                  "logprobs": None if lps is None else self.completion_logprobs(lps, offset)}
            if req.return_token_ids:
                ch["token_ids"] = token_ids
            return ch

        if req.stream:
            async def events() -> AsyncIterator[str]:
                sent_final: set[int] = set()
                offsets: dict[int, int] = {}
                prompt_tokens = completion_tokens = cached = 0
                async for i, out in self.merged(prompts, params, req.priority):
                    for c in out.outputs:
                        key = i * n + c.index
                        if key in sent_final or (not c.delta_token_ids and not c.delta_text and not c.finished):
                            continue
                        if c.finished:
                            sent_final.add(key)
                        ch = choice(i, c, c.delta_text, c.delta_logprobs, offsets.get(key, 0), c.delta_token_ids)
                        offsets[key] = offsets.get(key, 0) + len(c.delta_text)
                        yield _sse({**base, "choices": [ch]})
                    if out.finished:
                        prompt_tokens += out.num_prompt_tokens
                        completion_tokens += out.num_generated_tokens
                        cached += out.num_cached_tokens
                if req.include_usage:
                    yield _sse({**base, "choices": [], "usage": _usage(prompt_tokens, completion_tokens, cached)})
                yield "data: [DONE]\n\n"

            return _event_stream(events())

        async def collect() -> dict[str, Any]:
            finals: dict[int, RequestOutput] = {}
            async for i, out in self.merged(prompts, params, req.priority):
                if out.finished:
                    finals[i] = out
            choices = [choice(i, c, c.text, c.logprobs, 0, c.token_ids)
                       for i in sorted(finals) for c in finals[i].outputs]
            usage = _usage(sum(o.num_prompt_tokens for o in finals.values()),
                           sum(o.num_generated_tokens for o in finals.values()),
                           sum(o.num_cached_tokens for o in finals.values()))
            return {**base, "choices": choices, "usage": usage}

        body = await self.until_disconnect(request, collect())
        return JSONResponse(body) if body is not None else Response(status_code=499)

    # -- chat -------------------------------------------------------------------------------------

    def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        tok = self.llm.tokenizer
        if tok is None or not tok.chat_template:
            raise ApiError(400, "this model has no chat template; use /v1/completions", param="messages")
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        for m in messages:
            try:
                m["content"].encode("utf-8")
            except UnicodeEncodeError:
                raise ApiError(400, "messages: the text is not valid Unicode (lone surrogate)",
                               param="messages") from None
        try:
            text = tok.apply_chat_template(messages, add_generation_prompt=req.add_generation_prompt)
        except Exception as e:  # a template's raise_exception (e.g. roles out of order)
            raise ApiError(400, f"messages: the chat template rejected them: {e}", param="messages") from None
        return tok.encode(text, add_special_tokens=False)

    def chat_logprobs(self, lps: Sequence[Any]) -> dict[str, Any]:
        def entry(tid: int, lp: float) -> dict[str, Any]:
            t = self.token_text(tid)
            return {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8", "replace"))}

        return {"content": [
            {**entry(lp.token_id, lp.logprob),
             "top_logprobs": [entry(i, v) for i, v in zip(lp.top_token_ids, lp.top_logprobs)]} for lp in lps]}

    async def chat_completions(self, request: Request) -> Response:
        self.check_auth(request)
        req: ChatCompletionRequest = await self.read_json(request, ChatCompletionRequest)
        if req.tools:
            raise ApiError(400, "tools are not supported", param="tools")
        if req.top_logprobs is not None and not req.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        params = req.sampling_params(req.max_completion_tokens or req.max_tokens,
                                     (req.top_logprobs or 0) if req.logprobs else None)
        ids = self.chat_prompt(req)
        self.check(ids, params)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        base = {"id": rid, "created": created, "model": self.model_name}

        if req.stream:
            async def events() -> AsyncIterator[str]:
                chunk = {**base, "object": "chat.completion.chunk"}
                for i in range(params.n):
                    yield _sse({**chunk, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                      "logprobs": None, "finish_reason": None}]})
                sent_final: set[int] = set()
                last: RequestOutput | None = None
                async for _, out in self.merged([ids], params, req.priority):
                    last = out
                    for c in out.outputs:
                        if c.index in sent_final or (not c.delta_token_ids and not c.delta_text and not c.finished):
                            continue
                        if c.finished:
                            sent_final.add(c.index)
                        delta = {"content": c.delta_text} if c.delta_text or not c.finished else {}
                        ch = {"index": c.index, "delta": delta, "finish_reason": c.finish_reason,
                              "logprobs": None if c.delta_logprobs is None else self.chat_logprobs(c.delta_logprobs)}
                        if req.return_token_ids:
                            ch["token_ids"] = c.delta_token_ids
                        yield _sse({**chunk, "choices": [ch]})
                if req.include_usage and last is not None:
                    yield _sse({**chunk, "choices": [], "usage": _usage(
                        last.num_prompt_tokens, last.num_generated_tokens, last.num_cached_tokens)})
                yield "data: [DONE]\n\n"

            return _event_stream(events())

        async def collect() -> dict[str, Any]:
            final = None
            async for _, out in self.merged([ids], params, req.priority):
                final = out
            assert final is not None
            choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                        "logprobs": None if c.logprobs is None else self.chat_logprobs(c.logprobs),
                        "finish_reason": c.finish_reason} for c in final.outputs]
            if req.return_token_ids:
                for ch, c in zip(choices, final.outputs):
                    ch["token_ids"] = c.token_ids
            return {**base, "object": "chat.completion", "choices": choices,
                    "usage": _usage(final.num_prompt_tokens, final.num_generated_tokens, final.num_cached_tokens)}

        body = await self.until_disconnect(request, collect())
        return JSONResponse(body) if body is not None else Response(status_code=499)

    # -- the rest ---------------------------------------------------------------------------------

    def models(self, request: Request) -> dict[str, Any]:
        self.check_auth(request)
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                            "owned_by": "ingot", "max_model_len": self.llm.max_model_len}]}


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _EventStream(StreamingResponse):
    """SSE whose event generator is always closed when the response ends, so a client gone mid-stream
    aborts its request at once (not when the generator is garbage collected)."""

    async def stream_response(self, send: Any) -> None:
        try:
            await super().stream_response(send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()


async def _guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """``events``, ending in an OpenAI error event (then ``[DONE]``) if producing them fails mid-stream: the
    status line went out with the first event, so the error must travel in the stream."""
    try:
        async for e in events:
            yield e
    except ApiError as e:
        yield _sse(error_body(e.message, e.type, e.param, e.code if e.code is not None else e.status))
        yield "data: [DONE]\n\n"
    except Exception as e:
        yield _sse(error_body(f"internal error: {type(e).__name__}: {e}", "internal_error", code=500))
        yield "data: [DONE]\n\n"
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


def _event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    return _EventStream(_guarded(events), media_type="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def create_app(engine: AsyncEngine, *, model_name: str | None = None, api_key: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The FastAPI app for ``engine``; starts the engine thread on startup and drains it on shutdown."""
    server = Server(engine, model_name=model_name, api_key=api_key, max_body_bytes=max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, engine.stop)

    app = FastAPI(title="ingot", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        return _error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(e.detail), kind, code=e.status_code), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(str(e.errors()[:1]), "invalid_request_error"), status_code=400)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        return JSONResponse(error_body(f"internal error: {type(e).__name__}: {e}", "internal_error"), status_code=500)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await server.completions(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await server.chat_completions(request)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        return server.models(request)

    @app.get("/health")
    async def health() -> Response:
        ok = engine.running
        return JSONResponse({"status": "ok" if ok else "engine not running"}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        from .metrics import CONTENT_TYPE

        m = server.metrics
        return Response(m.render() if m is not None else b"", media_type=CONTENT_TYPE)

    return app


def serve(artifact: str, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          max_queue: int = 1024, model_name: str | None = None, log_level: str = "info",
          max_body_bytes: int = MAX_BODY_BYTES, drain_timeout: float | None = None, **engine_args: Any) -> None:
    """Load ``artifact`` and serve it until SIGINT/SIGTERM (which finish the running requests first)."""
    import uvicorn

    from .engine import LLMEngine
    from .metrics import EngineMetrics

    llm = LLMEngine(artifact, **engine_args)
    llm.metrics = EngineMetrics(model_name or llm.model_name)
    engine = AsyncEngine(llm, max_queue=max_queue)
    app = create_app(engine, model_name=model_name, api_key=api_key, max_body_bytes=max_body_bytes)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=drain_timeout,
                            access_log=log_level in ("debug", "info"))
    uvicorn.Server(config).run()
