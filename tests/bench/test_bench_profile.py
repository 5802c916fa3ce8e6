"""bench/bench_profile.py without a GPU: the grouping of launch times it prints, and its step capture."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.bench_profile import StepCapture, group  # noqa: E402


def test_group_sums_counts_and_orders():
    r = np.random.default_rng()
    ops = r.choice(["linear", "rms_norm", "paged_attention", "swiglu"], size=40)
    rows = [{"launch": i, "op": str(op), "kernel": f"{op}_{i % 3}", "us": float(us)}
            for i, (op, us) in enumerate(zip(ops, r.uniform(1, 50, 40)))]
    by_op = group(rows, "op")
    total = sum(x["us"] for x in rows)
    for g in by_op:
        mine = [x["us"] for x in rows if x["op"] == g["op"]]
        assert g["launches"] == len(mine) and abs(g["us"] - sum(mine)) < 0.01
        assert abs(g["share"] - sum(mine) / total) < 1e-3
    assert [g["us"] for g in by_op] == sorted((g["us"] for g in by_op), reverse=True)
    assert sum(g["launches"] for g in group(rows, "kernel")) == len(rows)


def test_capture_keeps_the_first_matching_step_and_passes_calls_through():
    class Executor:
        def __init__(self):
            self.calls = []

        def run(self, feeds, check=True):
            self.calls.append(("run", len(feeds["input_ids"])))
            return {"logits": np.zeros((len(feeds["seq_lens"]), 4), np.float32)}

        def greedy_tokens(self, feeds):
            self.calls.append(("greedy", len(feeds["input_ids"])))
            return np.zeros(len(feeds["seq_lens"]), np.int64)

    ex = Executor()
    cap = StepCapture(ex)
    cap.want = lambda f: len(f["input_ids"]) > len(f["seq_lens"])  # a prefill step
    decode = {"input_ids": np.arange(2), "seq_lens": np.array([5, 6]), "kv_cache.0": np.zeros(3)}
    prefill = {"input_ids": np.arange(7), "seq_lens": np.array([7]), "kv_cache.0": np.zeros(3)}
    ex.greedy_tokens(decode)
    out = ex.run(prefill)
    prefill["input_ids"][0] = 99  # the capture is a copy
    ex.run({"input_ids": np.arange(9), "seq_lens": np.array([9])})
    assert out["logits"].shape == (1, 4) and ex.calls == [("greedy", 2), ("run", 7), ("run", 9)]
    got = cap.take()
    assert set(got) == {"input_ids", "seq_lens"} and np.array_equal(got["input_ids"], np.arange(7))
