"""Prometheus metrics of one engine, in a registry of its own (several engines may share a process).

The engine calls ``record_step`` once per step (from its thread); the server exposes ``render()``
at ``/metrics``. Names follow Prometheus conventions (``_seconds``, ``_total``); token counts of the
prefix cache are in tokens, as the scheduler counts them.

The latency histograms take a step's observations at once (one per running sequence for the
inter-token latency): ``BatchHistogram`` buckets them with numpy, where ``prometheus_client``'s
``Histogram.observe`` would take a lock and search the buckets per value (~1.5 us each, ~0.4 ms a
step at 256 sequences). It exposes the same series (``_bucket``, ``_count``, ``_sum``).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

disable_created_metrics()  # the *_created series only add noise to every scrape

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class BatchHistogram:
    """A Prometheus histogram of one label set, fed many observations per call (``observe_many``)."""

    def __init__(self, name: str, documentation: str, labels: dict[str, str], buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self._label_names, self._label_values = list(labels), list(labels.values())
        self._bounds = np.array([*buckets, np.inf], dtype=np.float64)
        self._le = [floatToGoString(b) for b in self._bounds]
        self._counts = np.zeros(len(self._bounds), dtype=np.int64)  # per bucket, not cumulative
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, value: float) -> None:
        self.observe_many((value,))

    def observe_many(self, values: Sequence[float]) -> None:
        if not len(values):
            return
        x = np.asarray(values, dtype=np.float64)
        # a value goes in the first bucket whose upper bound is >= it, as Histogram.observe does
        counts = np.bincount(np.searchsorted(self._bounds, x), minlength=len(self._bounds))
        total = float(x.sum())
        with self._lock:
            self._counts += counts
            self._sum += total

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self._label_names)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            cumulative, total = np.cumsum(self._counts).tolist(), self._sum
        family = HistogramMetricFamily(self.name, self.documentation, labels=self._label_names)
        family.add_metric(self._label_values, list(zip(self._le, cumulative)), total)
        yield family


class EngineMetrics:
    """TTFT and inter-token latency histograms, queue depth, running sequences, KV blocks in use,
    prefix-cache hits, generated tokens (total and per second over the last ``window_s``)."""

    def __init__(self, model_name: str = "model", registry: CollectorRegistry | None = None,
                 window_s: float = 5.0) -> None:
        self.registry = registry or CollectorRegistry()
        r, labels = self.registry, ["model"]
        model = {"model": model_name}
        self.ttft = BatchHistogram("ingot_time_to_first_token_seconds", "Time from arrival to the first token",
                                   model, _LATENCY_BUCKETS, r)
        self.itl = BatchHistogram("ingot_inter_token_latency_seconds", "Time between two tokens of one sequence",
                                  model, _LATENCY_BUCKETS, r)
        self.e2e = BatchHistogram("ingot_request_latency_seconds", "Time from arrival to the last token",
                                  model, _LATENCY_BUCKETS, r)
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
        self.ttft.observe_many(ttft)
        self.itl.observe_many(itl)
        now = time.monotonic()
        if num_sampled:
            self.generation_tokens.inc(num_sampled)
            self._recent.append((now, num_sampled))
            self._recent_sum += num_sampled
        while self._recent and self._recent[0][0] < now - self._window_s:
            self._recent_sum -= self._recent.popleft()[1]
        span = now - self._recent[0][0] if len(self._recent) > 1 else self._window_s
        self.tokens_per_s.set(self._recent_sum / max(span, 1e-3) if self._recent else 0.0)
        if finished:
            self.e2e.observe_many([now - out.arrival_time for out in finished])
        for out in finished:
            self.prompt_tokens.inc(out.num_prompt_tokens)
            for o in out.outputs:
                self.request_finished(o.finish_reason or "stop")

    def render(self) -> bytes:
        return generate_latest(self.registry)
