"""``ingot bench serve``: a load generator for an OpenAI-compatible ``/v1/completions`` endpoint.

Clients stream completions (httpx, SSE) either with a fixed ``concurrency`` (a new request as soon as
one finishes) or arriving as a Poisson process at ``request_rate`` per second. Prompts are random
token ids (no tokenizer needed), their lengths and the output lengths drawn from a distribution
(``fixed``, ``uniform`` within +-50%, or ``exponential`` around the mean); ``ignore_eos`` makes each
request produce exactly its output length. Reports throughput and TTFT / inter-token latency / end-to-end
percentiles, writes them as JSON, and a PNG of the latency distributions if matplotlib is installed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 95, 99)


@dataclass
class RequestResult:
    prompt_len: int
    output_len: int = 0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    error: str | None = None


def draw_lengths(rng: np.random.Generator, mean: int, dist: str, n: int) -> np.ndarray:
    if dist == "fixed":
        x = np.full(n, mean)
    elif dist == "uniform":
        x = rng.integers(max(1, mean // 2), mean + mean // 2 + 1, n)
    elif dist == "exponential":
        x = np.ceil(rng.exponential(mean, n))
    else:
        raise ValueError(f"unknown length distribution {dist!r} (fixed, uniform, exponential)")
    return np.maximum(x, 1).astype(int)


async def _one(client: Any, url: str, model: str | None, prompt: list[int], max_tokens: int,
               headers: dict[str, str]) -> RequestResult:
    res = RequestResult(prompt_len=len(prompt))
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True, "ignore_eos": True}
    if model:
        body["model"] = model
    t0 = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if not chunk.get("choices"):
                    continue
                now = time.perf_counter()
                if res.ttft is None:
                    res.ttft = now - t0
                else:
                    res.itl.append(now - last)
                last = now
                res.output_len += 1
    except Exception as e:  # a load generator reports failures, it does not stop
        res.error = f"{type(e).__name__}: {e}"
    res.latency = time.perf_counter() - t0
    return res


def _pct(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    a = np.asarray(values) * 1e3
    return {"mean_ms": float(a.mean()), **{f"p{p}_ms": float(np.percentile(a, p)) for p in PERCENTILES}}


async def run_benchmark(url: str, *, num_prompts: int = 64, concurrency: int | None = 8,
                        request_rate: float | None = None, input_len: int = 128, output_len: int = 64,
                        input_dist: str = "uniform", output_dist: str = "uniform", vocab: int = 256,
                        model: str | None = None, api_key: str | None = None, seed: int = 0,
                        timeout: float = 600.0) -> dict[str, Any]:
    """Run the load and return the summary (see the module docstring)."""
    import httpx

    rng = np.random.default_rng(seed)
    in_lens = draw_lengths(rng, input_len, input_dist, num_prompts)
    out_lens = draw_lengths(rng, output_len, output_dist, num_prompts)
    prompts = [rng.integers(3, max(vocab, 4), n).tolist() for n in in_lens]
    endpoint = url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max(concurrency or 0, 1024), max_keepalive_connections=None)
    results: list[RequestResult] = []
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()
        if request_rate:
            tasks = []
            for i in range(num_prompts):
                tasks.append(asyncio.create_task(_one(client, endpoint, model, prompts[i], int(out_lens[i]), headers)))
                await asyncio.sleep(rng.exponential(1 / request_rate))
            results = list(await asyncio.gather(*tasks))
        else:
            next_i = 0

            async def worker() -> None:
                nonlocal next_i
                while next_i < num_prompts:
                    i = next_i
                    next_i += 1
                    results.append(await _one(client, endpoint, model, prompts[i], int(out_lens[i]), headers))

            await asyncio.gather(*(worker() for _ in range(min(concurrency or 1, num_prompts))))
        duration = time.perf_counter() - t0
    ok = [r for r in results if r.error is None]
    out_tokens = sum(r.output_len for r in ok)
    return {
        "url": url, "num_prompts": num_prompts, "concurrency": None if request_rate else concurrency,
        "request_rate": request_rate, "input_len": input_len, "output_len": output_len,
        "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:10],
        "duration_s": duration, "request_throughput": len(ok) / duration,
        "output_token_throughput": out_tokens / duration,
        "total_token_throughput": (out_tokens + sum(r.prompt_len for r in ok)) / duration,
        "ttft": _pct([r.ttft for r in ok if r.ttft is not None]),
        "itl": _pct([x for r in ok for x in r.itl]),
        "latency": _pct([r.latency for r in ok]),
        "requests": [asdict(r) for r in results],
    }


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"requests: {s['completed']} ok, {s['failed']} failed in {s['duration_s']:.2f} s",
             f"throughput: {s['request_throughput']:.2f} req/s, {s['output_token_throughput']:.1f} output tok/s, "
             f"{s['total_token_throughput']:.1f} total tok/s"]
    for name in ("ttft", "itl", "latency"):
        p = s[name]
        if p:
            lines.append(f"{name:8s} mean {p['mean_ms']:.1f} ms  " + "  ".join(
                f"p{q} {p[f'p{q}_ms']:.1f}" for q in PERCENTILES))
    lines += [f"error: {e}" for e in s["errors"]]
    return "\n".join(lines)


def write_plot(s: dict[str, Any], path: Path) -> bool:
    """A PNG with TTFT, ITL and latency histograms; False if matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    reqs = [r for r in s["requests"] if r["error"] is None]
    data = {"TTFT (ms)": [r["ttft"] * 1e3 for r in reqs if r["ttft"] is not None],
            "inter-token latency (ms)": [x * 1e3 for r in reqs for x in r["itl"]],
            "request latency (s)": [r["latency"] for r in reqs]}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (title, values) in zip(axes, data.items()):
        if values:
            ax.hist(values, bins=40)
        ax.set_title(title)
    fig.suptitle(f"{s['url']}: {s['completed']} requests, {s['output_token_throughput']:.0f} output tok/s")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
