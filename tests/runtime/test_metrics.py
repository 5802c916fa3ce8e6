"""The engine's batched latency histograms expose what prometheus_client's Histogram would."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, Histogram, generate_latest  # noqa: E402

from ingot.runtime.metrics import BatchHistogram  # noqa: E402

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.1, 1.0)


def test_batch_histogram_renders_like_histogram():
    values = np.random.default_rng(0).exponential(0.01, 500).tolist() + list(BUCKETS) + [0.0, 50.0]
    ref_registry, registry = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("x_seconds", "doc", ["model"], buckets=BUCKETS, registry=ref_registry).labels("m")
    got = BatchHistogram("x_seconds", "doc", {"model": "m"}, BUCKETS, registry)
    for v in values:
        ref.observe(v)
    got.observe_many(values[:100])
    got.observe_many([])
    got.observe_many(values[100:-1])
    got.observe(values[-1])

    def samples(reg):
        return [(s.name, s.labels, s.value) for m in reg.collect() for s in m.samples
                if not s.name.endswith("_created")]

    a, b = samples(ref_registry), samples(registry)
    assert [x[:2] for x in a] == [x[:2] for x in b]
    assert np.allclose([x[2] for x in a], [x[2] for x in b], rtol=1e-12)
    assert b"x_seconds_bucket{le=\"0.0025\",model=\"m\"}" in generate_latest(registry)
