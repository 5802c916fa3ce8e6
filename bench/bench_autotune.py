"""Heuristic vs autotuned decode kernels on the GPU (``codegen/autotune.py``), one JSON line per kernel.

    python bench/bench_autotune.py                       # Llama-3.2-1B shapes, buckets 8 and 32, every format
    python bench/bench_autotune.py --mb 8 16 32 64 --formats bf16 fp8-w8a16 --jsonl $OUT/autotune.jsonl

For each decode GEMV variant (bf16 and quantized weights; N x K of the model's layers, token bucket MB) and each
split-KV attention (bf16 and FP8 cache; GQA 32/8, head_dim 128, block 16, context 4096, batches 1/8/32), every
candidate configuration is timed with ``CudaTimer`` (CUDA graph of back-to-back launches, CUDA events, median of
the replays, weights / KV cache rotating over copies >= 256 MB so they come from HBM) on the tunable's workloads
(GEMV: M at the bucket's two edges; attention: the three batches), without the autotune cache. A line holds the
heuristic's and the chosen configuration's total time over the workloads (us), the speedup, both configurations,
and every candidate's time. The kernels' correctness is checked by ``tests/codegen/test_autotune_gpu.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Llama-3.2-1B: qkv (fused), o, gate+up (fused), down, lm_head; [N, K]
SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)]
FORMATS = ("bf16", "fp8-w8a16", "fp8-w8a8", "nvfp4-w4a16")


def us(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e6, 3)


def gemv_specs(shapes, mbs, formats, tgt):
    from ingot.codegen.kernels.gemv.quant_rule import fp8_template, quant_gemv_spec
    from ingot.codegen.kernels.gemv.rule import gemv_spec

    for fmt in formats:
        for n, k in shapes:
            for mb in mbs:
                if fmt == "bf16":
                    yield fmt, gemv_spec(n, k, mb, tgt)
                elif fmt == "fp8-w8a16":  # the template INGOT_GEMV_FP8 picks (kernel.cu by default)
                    yield fmt, (gemv_spec(n, k, mb, tgt, wb=1) if fp8_template() == "kernel.cu"
                                else quant_gemv_spec(n, k, mb, tgt, "fp8", "none"))
                elif fmt == "fp8-w8a8":
                    yield fmt, quant_gemv_spec(n, k, mb, tgt, "fp8", "fp8", "token")
                else:
                    yield fmt, quant_gemv_spec(n, k, mb, tgt, "nvfp4", "none")


def attention_specs(tgt):
    from ingot.codegen.kernels.attention.split_rule import decode_split_spec
    from ingot.ir.types import DType

    yield "attention-bf16", decode_split_spec(DType.bf16, DType.bf16, 32, 8, 128, 16, 128 ** -0.5, tgt)
    yield "attention-fp8", decode_split_spec(DType.bf16, DType.f8e4m3fn, 32, 8, 128, 16, 128 ** -0.5, tgt,
                                             kv_scale=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--shapes", default="", help="N,K;N,K (default: the 1B model's)")
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    ap.add_argument("--no-attention", action="store_true")
    ap.add_argument("--launches", type=int, default=10)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--jsonl", default=None, help="also append the lines to this file")
    a = ap.parse_args(argv)
    from ingot.codegen import autotune as at
    from ingot.codegen.target import get_target

    os.environ.setdefault("INGOT_CACHE_DIR", "/tmp/ingot-kernel-cache")
    gpu = at.detect_gpu()
    if gpu is None:
        print("no CUDA GPU here", file=sys.stderr)
        return 2
    tgt = next((t for t in (get_target("h200"), get_target("b200")) if t.sm == gpu.sm), None)
    if tgt is None:
        print(f"{gpu.name} (sm_{gpu.sm}) is neither sm_90 nor sm_100", file=sys.stderr)
        return 2
    shapes = [tuple(int(v) for v in s.split(",")) for s in a.shapes.split(";")] if a.shapes else SHAPES
    todo = list(gemv_specs(shapes, a.mb, a.formats, tgt)) + ([] if a.no_attention else list(attention_specs(tgt)))
    timer = at.CudaTimer(launches=a.launches, reps=a.reps)
    sink = open(a.jsonl, "a") if a.jsonl else None
    bounds = {"S": 32, "max_blocks": 4096 // 16}
    for kind, spec in todo:
        t0 = time.perf_counter()
        timer.prepare(at.candidates(spec, tgt))
        res = at.autotune([spec], tgt, timer, gpu, bounds=bounds, use_cache=False)[spec.key]
        v = dict(spec.values)
        by_key = {c.key: c for c in at.candidates(spec, tgt)}
        row = {"kind": kind, "kernel": spec.name, "n": v.get("N"), "k": v.get("K"), "mb": v.get("MB"),
               "workloads": res.workloads, "heuristic_us": us(res.heuristic_s), "tuned_us": us(res.chosen_s),
               "speedup": round(res.heuristic_s / res.chosen_s, 4) if res.heuristic_s and res.chosen_s else None,
               "changed": res.changed, "config": res.record()["config"],
               "heuristic_config": res.record()["heuristic_config"],
               "candidates": [{"config": {k: by_key[key].value(k) for k in res.knobs}, "us": us(t)}
                              for key, t in res.times.items()],
               "gpu": gpu.name, "driver": gpu.driver, "seconds": round(time.perf_counter() - t0, 1)}
        line = json.dumps(row)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")
            sink.flush()
    timer.release()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
