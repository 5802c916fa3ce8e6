"""Scheduler host time per step: 256 running sequences in steady decode, no model.

One step = ``schedule()`` (scheduling + building the step inputs of docs/SERVING_FORM.md) +
``update_from_output`` with fake sampled tokens (pre-drawn, so drawing them is not timed). The issue's
budget for the engine's host time per step is 2 ms.

All prompts have the same length, so all sequences cross a block boundary in the same step (every
``block_size`` steps: 256 block allocations and 256 blocks hashed and cached at once), the worst case
for the tail. Wall-clock times include whatever else the machine runs; thread CPU time does not.

    python bench/bench_scheduler.py [--seqs 256] [--steps 2000] [--prompt-len 128] [--block-size 16]
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import time

import numpy as np

from ingot.runtime.request import Request
from ingot.runtime.scheduler import CacheConfig, Scheduler, SchedulerConfig

BUDGET_MS = 2.0


def run(
    seqs: int, steps: int, prompt_len: int, block_size: int, seed: int = 0, freeze: bool = False
) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    max_model_len = prompt_len + steps + 64
    num_blocks = seqs * (-(-max_model_len // block_size)) + 16
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=8192, max_model_len=max_model_len),
        CacheConfig(num_blocks=num_blocks, block_size=block_size),
    )
    for i in range(seqs):
        prompt = rng.integers(0, 32000, prompt_len).tolist()
        sched.add_request(Request(f"r{i}", prompt, max_tokens=max_model_len))
    # prefill until every sequence decodes one token per step
    while True:
        out = sched.schedule()
        sched.update_from_output(out, rng.integers(0, 32000, len(out.req_ids)))
        if out.total_num_scheduled_tokens == seqs and len(out.req_ids) == seqs:
            break
    fake = rng.integers(0, 32000, (steps, seqs))
    if freeze:  # what an engine does once it has built its cache: later full collections skip those objects
        gc.collect()
        gc.freeze()
    wall, cpu = [], []
    for k in range(steps):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        out = sched.schedule()
        sched.update_from_output(out, fake[k])
        t1 = time.perf_counter()
        c1 = time.thread_time()
        wall.append(t1 - t0)
        cpu.append(c1 - c0)
        assert out.total_num_scheduled_tokens == seqs
    result = {}
    for name, xs in (("wall", wall), ("cpu", cpu)):
        ms = sorted(t * 1e3 for t in xs)
        result[f"{name}_median_ms"] = statistics.median(ms)
        result[f"{name}_p99_ms"] = ms[int(0.99 * (len(ms) - 1))]
        result[f"{name}_mean_ms"] = statistics.fmean(ms)
        result[f"{name}_max_ms"] = ms[-1]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after setup, as an engine would")
    args = ap.parse_args()
    r = run(args.seqs, args.steps, args.prompt_len, args.block_size, freeze=args.gc_freeze)
    print(
        f"scheduler host time per step, {args.seqs} sequences in decode, {args.steps} steps "
        f"(python {platform.python_version()}, numpy {np.__version__}, gc.freeze: {args.gc_freeze})"
    )
    for name, what in (("wall", "wall clock"), ("cpu", "thread CPU time")):
        ok = "within" if r[f"{name}_p99_ms"] <= BUDGET_MS else "OVER"
        print(
            f"  {what:16s} median {r[f'{name}_median_ms']:.3f} ms   p99 {r[f'{name}_p99_ms']:.3f} ms   "
            f"mean {r[f'{name}_mean_ms']:.3f} ms   max {r[f'{name}_max_ms']:.3f} ms   "
            f"(budget {BUDGET_MS} ms: p99 {ok})"
        )


if __name__ == "__main__":
    main()
