"""Per-step host overhead of a decode step on the CUDA backend: CUDA-graph replay vs plain launches.

    python bench/bench_decode_step.py                     # SmolLM2-shaped random model, 4 layers
    python bench/bench_decode_step.py --model tiny        # the tiny Llama fixture
    python bench/bench_decode_step.py --layers 30         # SmolLM2's full depth

For batch sizes 1 and 32 (each sequence has a 64-token context), the same decode step runs many
times through ``CudaExecutor.run`` with graphs on and off. Printed side by side, medians:

- ``step``: the whole call, from the host's view (stage inputs, copy, launches or graph, logits back);
- ``issue``: host time until the work is queued (before the logits copy waits for the GPU), the host
  overhead the graph removes: one ``cuGraphLaunch`` instead of one ``cuLaunchKernel`` per kernel;
- ``gpu``: CUDA-event time between the input copy and the logits copy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build(model: str, layers: int, workdir: Path) -> Path:
    import ingot

    if model == "tiny":
        return ingot.compile(ROOT / "tests/fixtures/tiny_llama_kv.onnx", target="h200", out=workdir / "t.ingot",
                             mode="llm")
    from tests.frontend.dense_llama import random_weights, write_checkpoint
    from tests.runtime.test_cuda_backend import SMOLLM2_CONFIG

    cfg = {**SMOLLM2_CONFIG, "num_hidden_layers": layers}
    ckpt = write_checkpoint(workdir / "ckpt", cfg, random_weights(cfg, np.random.default_rng(0)))
    return ingot.compile(ckpt, target="h200", out=workdir / "s.ingot")


def decode_feeds(batch: int, context: int, block_size: int, vocab: int) -> dict[str, np.ndarray]:
    blocks = -(-(context + 1) // block_size)
    tables = np.arange(batch * blocks, dtype=np.int32).reshape(batch, blocks)
    pos = np.full(batch, context, np.int64)
    return {
        "input_ids": np.random.default_rng(0).integers(0, vocab, batch).astype(np.int64),
        "positions": pos,
        "slot_mapping": tables[:, context // block_size].astype(np.int64) * block_size + context % block_size,
        "block_tables": tables,
        "seq_lens": np.full(batch, context + 1, np.int32),
        "query_start_loc": np.arange(batch + 1, dtype=np.int32),
        "logits_indices": np.arange(batch, dtype=np.int64),
    }


def measure(ex, feeds: dict[str, np.ndarray], steps: int) -> dict[str, float]:
    from ingot.runtime import cuda_driver as cd

    cu = cd.driver()
    ev = [cd.check(cu.cuEventCreate(0)) for _ in range(2)]
    orig_htod, orig_dtoh = cd.memcpy_htod, cd.memcpy_dtoh
    marks: dict[str, float] = {}

    def htod(dst, src, n, stream=None):
        orig_htod(dst, src, n, stream)
        if stream is not None:
            cd.check(cu.cuEventRecord(ev[0], stream.handle))

    def dtoh(dst, src, n, stream=None):
        if stream is not None:
            marks["issued"] = time.perf_counter()
            cd.check(cu.cuEventRecord(ev[1], stream.handle))
        orig_dtoh(dst, src, n, stream)

    cd.memcpy_htod, cd.memcpy_dtoh = htod, dtoh
    try:
        for _ in range(10):
            ex.run(feeds, check=False)
        step, issue, gpu = [], [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            ex.run(feeds, check=False)
            t1 = time.perf_counter()
            step.append(t1 - t0)
            issue.append(marks["issued"] - t0)
            gpu.append(cd.check(cu.cuEventElapsedTime(ev[0], ev[1])) / 1e3)
    finally:
        cd.memcpy_htod, cd.memcpy_dtoh = orig_htod, orig_dtoh
    return {k: statistics.median(v) * 1e6 for k, v in (("step_us", step), ("issue_us", issue), ("gpu_us", gpu))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("smollm2-shaped", "tiny"), default="smollm2-shaped")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--json", default=os.environ.get("INGOT_BENCH_JSON"))
    args = ap.parse_args()
    from ingot.runtime.cuda_backend import CudaExecutor

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = build(args.model, args.layers, Path(tmp))
        compile_s = time.perf_counter() - t0
        rows = []
        batches = [int(b) for b in args.batches.split(",")]
        blocks = sum(-(-(args.context + 1) // 16) for _ in range(max(batches))) + 1
        for graphs in (True, False):
            ex = CudaExecutor.from_artifact(path, num_blocks=blocks, cuda_graphs=graphs)
            launches = len(ex.launches)
            vocab = int(ex.graph.outputs[0].type.shape[-1])
            for b in batches:
                feeds = decode_feeds(b, args.context, ex.block_size, vocab)
                rows.append({"batch": b, "graphs": graphs, **measure(ex, feeds, args.steps)})
            ex.close()
    name = args.model + (f" ({args.layers} layers)" if args.model != "tiny" else "")
    print(f"decode step, {name}, {launches} kernel launches per step, context {args.context}, "
          f"median of {args.steps}; compile {compile_s:.1f} s")
    print(f"{'batch':>5} | {'graph: step':>11} {'issue':>8} {'gpu':>8} | {'launches: step':>14} {'issue':>8} "
          f"{'gpu':>8} | {'issue ratio':>11}")
    for b in batches:
        g = next(r for r in rows if r["batch"] == b and r["graphs"])
        e = next(r for r in rows if r["batch"] == b and not r["graphs"])
        print(f"{b:>5} | {g['step_us']:>9.0f}us {g['issue_us']:>6.0f}us {g['gpu_us']:>6.0f}us | "
              f"{e['step_us']:>12.0f}us {e['issue_us']:>6.0f}us {e['gpu_us']:>6.0f}us | "
              f"{e['issue_us'] / g['issue_us']:>10.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": name, "launches": launches, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
