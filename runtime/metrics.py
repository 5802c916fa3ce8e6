"""Prometheus metrics of one engine, in a registry of its own (several engines may share a process).

The engine calls ``record_step`` once per step (from its thread); the server exposes ``render()``
at ``/metrics``. Names follow Prometheus conventions (``_seconds``, ``_total``); token counts of the
prefix cache are in tokens, as the scheduler counts them.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

disable_created_metrics()  # the *_created series only add noise to every scrape

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class EngineMetrics:
    """TTFT and inter-token latency histograms, queue depth, running sequences, KV blocks in use,
    prefix-cache hits, generated tokens (total and per second over the last ``window_s``)."""

    def __init__(self, model_name: str = "model", registry: CollectorRegistry | None = None,
                 window_s: float = 5.0) -> None:
        self.registry = registry or CollectorRegistry()
        r, labels = self.registry, ["model"]
        self.ttft = Histogram("ingot_time_to_first_token_seconds", "Time from arrival to the first token",
                              labels, buckets=_LATENCY_BUCKETS, registry=r).labels(model_name)
        self.itl = Histogram("ingot_inter_token_latency_seconds", "Time between two tokens of one sequence",
                             labels, buckets=_LATENCY_BUCKETS, registry=r).labels(model_name)
        self.e2e = Histogram("ingot_request_latency_seconds", "Time from arrival to the last token",
                             labels, buckets=_LATENCY_BUCKETS, registry=r).labels(model_name)
        self.waiting = Gauge("ingot_num_requests_waiting", "Requests in the waiting queue", labels,
                             registry=r).labels(model_name)
        self.running = Gauge("ingot_num_requests_running", "Sequences running", labels, registry=r).labels(model_name)
        self.blocks_used = Gauge("ingot_kv_cache_blocks_used", "KV cache blocks in use", labels,
                                 registry=r).labels(model_name)
        self.blocks_total = Gauge("ingot_kv_cache_blocks_total", "KV cache blocks", labels,
                                  registry=r).labels(model_name)
        self.prefix_queries = Counter("ingot_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      labels, registry=r).labels(model_name)
        self.prefix_hits = Counter("ingot_prefix_cache_hits", "Prompt tokens found in the prefix cache",
                                   labels, registry=r).labels(model_name)
        self.prefix_hit_rate = Gauge("ingot_prefix_cache_hit_rate", "Prefix-cache hits / queries (tokens)",
                                     labels, registry=r).labels(model_name)
        self.preemptions = Counter("ingot_num_preemptions", "Requests preempted (recompute)", labels,
                                   registry=r).labels(model_name)
        self.generation_tokens = Counter("ingot_generation_tokens", "Tokens generated", labels,
                                         registry=r).labels(model_name)
        self.prompt_tokens = Counter("ingot_prompt_tokens", "Prompt tokens of finished requests", labels,
                                     registry=r).labels(model_name)
        self.tokens_per_s = Gauge("ingot_generation_tokens_per_second", "Tokens generated per second (recent)",
                                  labels, registry=r).labels(model_name)
        self.steps = Counter("ingot_engine_steps", "Engine steps", labels, registry=r).labels(model_name)
        self._finished = Counter("ingot_requests_finished", "Requests finished, by reason", ["model", "reason"],
                                 registry=r)
        self._model = model_name
        self._window_s = window_s
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._recent_sum = 0
        self._last = (0, 0, 0)  # prefix queries, hits, preemptions already counted

    def request_finished(self, reason: str) -> None:
        self._finished.labels(self._model, reason).inc()

    def record_step(self, stats: Any, *, num_sampled: int, num_scheduled_tokens: int, itl: Sequence[float] = (),
                    ttft: Sequence[float] = (), finished: Sequence[Any] = ()) -> None:
        """One engine step: ``stats`` is the scheduler's ``SchedulerStats``."""
        self.waiting.set(stats.num_waiting)
        self.running.set(stats.num_running)
        self.blocks_used.set(stats.kv_blocks_used)
        self.blocks_total.set(stats.kv_blocks_total)
        q, h, p = self._last
        if stats.prefix_cache_queries > q:
            self.prefix_queries.inc(stats.prefix_cache_queries - q)
        if stats.prefix_cache_hits > h:
            self.prefix_hits.inc(stats.prefix_cache_hits - h)
        if stats.num_preemptions > p:
            self.preemptions.inc(stats.num_preemptions - p)
        self._last = (stats.prefix_cache_queries, stats.prefix_cache_hits, stats.num_preemptions)
        self.prefix_hit_rate.set(stats.prefix_cache_hit_rate)
        if num_scheduled_tokens:
            self.steps.inc()
        for x in ttft:
            self.ttft.observe(x)
        for x in itl:
            self.itl.observe(x)
        now = time.monotonic()
        if num_sampled:
            self.generation_tokens.inc(num_sampled)
            self._recent.append((now, num_sampled))
            self._recent_sum += num_sampled
        while self._recent and self._recent[0][0] < now - self._window_s:
            self._recent_sum -= self._recent.popleft()[1]
        span = now - self._recent[0][0] if len(self._recent) > 1 else self._window_s
        self.tokens_per_s.set(self._recent_sum / max(span, 1e-3) if self._recent else 0.0)
        for out in finished:
            self.prompt_tokens.inc(out.num_prompt_tokens)
            self.e2e.observe(now - out.arrival_time)
            for o in out.outputs:
                self.request_finished(o.finish_reason or "stop")

    def render(self) -> bytes:
        return generate_latest(self.registry)
