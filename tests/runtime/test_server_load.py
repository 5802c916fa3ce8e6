"""Load against ``ingot serve`` (tiny model, CPU backend): 256 concurrent streaming clients get exactly
the tokens offline generation gives them; clients disconnecting at random points leak no KV blocks."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

import ingot  # noqa: E402
from tests.runtime.serving_models import VOCAB, ServerProcess, compile_tiny  # noqa: E402

NUM_CLIENTS = 256
NUM_DISCONNECT = 50
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    artifact = compile_tiny(tmp_path_factory.mktemp("load"))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, VOCAB - 1, int(rng.integers(1, 64))).tolist() for _ in range(NUM_CLIENTS)]
    expected = [c.token_ids for c in ingot.LLM(artifact, num_blocks=2048).generate(
        prompt_token_ids=prompts, max_tokens=MAX_TOKENS, temperature=0.0)]
    server = ServerProcess(artifact, "--num-blocks", "2048", "--max-num-seqs", "256",
                           "--max-num-batched-tokens", "4096")
    yield server, prompts, expected
    server.stop()


async def _client(client, url: str, prompt: list[int], stop_after: int | None) -> list[int] | None:
    """Stream one completion; with ``stop_after``, hang up after that many token chunks (None returned)."""
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True, "return_token_ids": True}
    tokens: list[int] = []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        done = False
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                tokens += json.loads(line[6:])["choices"][0]["token_ids"]
                if stop_after is not None and len(tokens) >= stop_after:
                    return None  # leaving the block closes the connection mid-stream
        assert done
    return tokens


async def _run(url: str, prompts: list[list[int]], stop_after: list[int | None]) -> list[list[int] | None]:
    limits = httpx.Limits(max_connections=NUM_CLIENTS + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.wait_for(
            asyncio.gather(*(_client(client, url, p, s) for p, s in zip(prompts, stop_after))), 120)


def _wait_idle(server: ServerProcess, timeout: float = 20.0) -> float:
    deadline = time.monotonic() + timeout
    while True:
        used = server.metric("ingot_kv_cache_blocks_used")
        running = server.metric("ingot_num_requests_running") + server.metric("ingot_num_requests_waiting")
        if (used == 0 and running == 0) or time.monotonic() > deadline:
            return used
        time.sleep(0.1)


@pytest.mark.slow
def test_256_streaming_clients_match_offline(setup):
    server, prompts, expected = setup
    t0 = time.perf_counter()
    got = asyncio.run(_run(server.url, prompts, [None] * NUM_CLIENTS))
    elapsed = time.perf_counter() - t0
    print(f"256 streaming clients: {elapsed:.1f} s, {sum(map(len, got)) / elapsed:.0f} tokens/s")
    mismatched = [i for i, (g, e) in enumerate(zip(got, expected)) if g != e]
    assert not mismatched, f"{len(mismatched)} clients differ from offline generation, e.g. #{mismatched[0]}"
    assert _wait_idle(server) == 0


@pytest.mark.slow
def test_disconnecting_clients_leak_no_blocks(setup):
    server, prompts, expected = setup
    rng = np.random.default_rng(1)
    leaving = set(rng.choice(NUM_CLIENTS, NUM_DISCONNECT, replace=False).tolist())
    stop_after = [int(rng.integers(1, MAX_TOKENS)) if i in leaving else None for i in range(NUM_CLIENTS)]
    aborted_before = server.metric("ingot_requests_finished_total", 'reason="abort"')
    got = asyncio.run(_run(server.url, prompts, stop_after))
    for i, (g, e) in enumerate(zip(got, expected)):
        if i not in leaving:
            assert g == e, f"client {i}"
    assert _wait_idle(server) == 0, "KV blocks still in use after every client finished or left"
    aborted = server.metric("ingot_requests_finished_total", 'reason="abort"') - aborted_before
    print(f"{NUM_DISCONNECT} clients left mid-stream: {aborted:.0f} requests aborted, no block leaked")
    assert aborted > 0
