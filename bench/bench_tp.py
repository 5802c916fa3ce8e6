"""Tensor parallelism on the GPU: TP=1 vs TP=2 decode tokens/s of a Llama-3.2-1B-shaped model (random weights).

    python bench/bench_tp.py                              # makes the checkpoint (bench/make_llama1b.py), 16 layers
    python bench/bench_tp.py --ckpt DIR                   # an existing HF checkpoint directory
    python bench/bench_tp.py --layers 2 --steps 16        # quick
    python bench/bench_tp.py --compile-only --target h200 # no GPU needed: the two artifacts only

Needs 2 GPUs and NCCL (``pip install 'ingot[cuda]'``). For each TP size (1, then 2) the serving engine
(``ingot.runtime.engine.LLMEngine``, device="cuda") runs, per batch size (default 1 and 64): ``batch``
requests with ``--context`` random prompt tokens are prefilled, ``--warmup`` decode steps run (the
CUDA graph of the batch bucket is captured, with the NCCL all-reduce inside for TP=2), then
``--steps`` decode steps are timed: tokens/s = batch * steps / seconds (engine host time included,
the same for both). Then the greedy tokens of ``--check-prompts`` prompts are compared between TP=1
and TP=2 (a divergence is reported with TP=1's top-2 logprob gap at that token: bf16 sums in another
order can flip a near-tie).

Prints one JSON line per measurement (``"bench": "tp_decode"``), per check (``"check": "greedy"``), and a
summary (``"summary"``: speedups). Exit code 0 when everything ran and the greedy tokens agree (or
diverge only at near-ties, top-2 gap < 1e-2), 1 otherwise, 2 when the machine cannot run it.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NEAR_TIE = 1e-2


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def gpu_target() -> str:
    from ingot.runtime.cuda_driver import Context

    sm = Context(0).sm
    if sm == 90:
        return "h200"
    if sm == 100:
        return "b200"
    raise SystemExit(f"GPU 0 is sm_{sm}; ingot builds kernels for sm_90a (h100/h200) and sm_100a (b200)")


def compile_artifacts(ckpt: Path, workdir: Path, target: str, limits: dict[str, int],
                      reuse: bool = False) -> dict[int, Path]:
    import ingot
    from ingot.passes import PassContext

    paths = {}
    for tp in (1, 2):
        t0 = time.perf_counter()
        out = workdir / f"llama1b_tp{tp}.ingot"
        if reuse and (out / "manifest.json").is_file():
            paths[tp] = out
            emit(event="compile", tp=tp, reused=True, path=str(out))
            continue
        paths[tp] = ingot.compile(ckpt, target=target, out=out, tp=tp,
                                  pass_context=PassContext(target=target, options={"cuda": dict(limits)}))
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        emit(event="compile", tp=tp, target=target, seconds=round(time.perf_counter() - t0, 1), artifact_bytes=size,
             path=str(out))
    return paths


def prefill_steps(batch: int, context: int, args) -> int:
    return -(-batch * context // args.max_num_batched_tokens) + 1


def decode_rate(engine, batch: int, context: int, warmup: int, steps: int, seed: int, after=None) -> dict:
    """``batch`` requests of ``context`` random tokens: prefill, ``warmup`` decode steps, ``steps`` timed steps;
    then ``after()`` (more steps of the same requests), whose dict joins the result. ``min_step_tokens``: the fewest
    tokens a timed step made (``batch`` times the engine's decode steps when every request decoded in every one)."""
    from ingot.runtime.sampling import SamplingParams

    r = np.random.default_rng(seed)
    # no max_tokens (the model's length): requests prefilled in an early chunk decode while the others still prefill,
    # for as many steps as the scheduler's chunking and the engine's overlap make (more than the prompt tokens over
    # the budget: the decodes take part of each step's budget), and every request must still be decoding through the
    # timed steps; the requests are aborted at the end. (With max_tokens counted from the prefill steps, early
    # requests finished inside the timed window in some runs: batch 256 measured at half its rate, 2026-12-03.)
    params = SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request([int(t) for t in r.integers(0, engine.vocab_size, context)], params)
           for _ in range(batch)]
    started: set[str] = set()
    t0 = time.perf_counter()
    while len(started) < batch:  # prefill (chunked by the token budget) until every request has its first token
        for o in engine.step():
            if o.outputs[0].token_ids:
                started.add(o.request_id)
        if time.perf_counter() - t0 > 600:
            raise RuntimeError(f"prefill of {batch} x {context} tokens did not finish in 600 s")
    prefill_s = time.perf_counter() - t0
    for _ in range(warmup):
        engine.step()
    per_step = []
    t0 = time.perf_counter()
    for _ in range(steps):
        outs = engine.step()
        per_step.append(sum(len(o.outputs[0].delta_token_ids) for o in outs))
    dt = time.perf_counter() - t0
    tokens = sum(per_step)
    res = {"tokens_per_s": round(tokens / dt, 1), "step_ms": round(dt / steps * 1e3, 4), "tokens": tokens,
           "expected_tokens": batch * steps, "prefill_s": round(prefill_s, 3),
           "min_step_tokens": min(per_step, default=0)}
    if after is not None:
        res |= after()
    for rid in ids:
        engine.abort(rid)
    return res


def greedy_tokens(engine, prompts: list[list[int]], max_tokens: int) -> list:
    from ingot.runtime.sampling import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=2)
    return engine.generate(prompts, params)


def run_tp(path: Path, tp: int, a: argparse.Namespace, num_blocks: int, prompts: list[list[int]],
           before_close: Any = None) -> tuple[dict, list]:
    from ingot.runtime.engine import LLMEngine

    t0 = time.perf_counter()
    engine = LLMEngine(path, device="cuda", num_blocks=num_blocks, max_num_seqs=max(a.batches),
                       max_num_batched_tokens=a.max_num_batched_tokens, enable_prefix_caching=False)
    emit(event="load", tp=tp, seconds=round(time.perf_counter() - t0, 1), num_blocks=engine.num_blocks,
         max_num_seqs=engine.args.max_num_seqs, max_model_len=engine.max_model_len)
    rates = {}
    try:
        for bs in a.batches:
            res = decode_rate(engine, bs, a.context, a.warmup, a.steps, seed=bs)
            rates[bs] = res["tokens_per_s"]
            emit(bench="tp_decode", tp=tp, batch=bs, context=a.context, steps=a.steps, layers=a.layers_used, **res)
        outs = greedy_tokens(engine, prompts, a.check_tokens)
        stats = getattr(engine.executor, "stats", {})
        emit(event="executor_stats", tp=tp, **{k: v for k, v in dict(stats).items() if isinstance(v, int | float)})
        if before_close is not None:
            before_close(rates, outs)
    finally:
        # watchdog: a hang while shutting the ranks down prints every thread's stack and exits
        faulthandler.dump_traceback_later(30, exit=True)
        t0 = time.perf_counter()
        engine.close()
        faulthandler.cancel_dump_traceback_later()
        emit(event="closed", tp=tp, seconds=round(time.perf_counter() - t0, 2))
    return rates, outs


def compare(one: list, two: list) -> tuple[bool, list[dict]]:
    ok, notes = True, []
    for i, (w, g) in enumerate(zip(one, two)):
        for j, (b, a) in enumerate(zip(w.outputs[0].token_ids, g.outputs[0].token_ids)):
            if a != b:
                lp = w.outputs[0].logprobs[j].top_logprobs
                gap = float(lp[0] - lp[1]) if len(lp) > 1 else float("inf")
                near = gap < NEAR_TIE
                ok = ok and near
                notes.append({"prompt": i, "token": j, "tp1": int(b), "tp2": int(a), "tp1_top2_gap": gap,
                              "near_tie": near})
                break
    return ok, notes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", type=Path, default=None, help="HF checkpoint dir (default: make the Llama-1B shape)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where the checkpoint and artifacts go (default: a temp dir, removed at the end)")
    ap.add_argument("--layers", type=int, default=None, help="depth of the made checkpoint (default 16)")
    ap.add_argument("--batches", default="1,64", help="decode batch sizes (default 1,64)")
    ap.add_argument("--context", type=int, default=128, help="prompt tokens per request (default 128)")
    ap.add_argument("--warmup", type=int, default=8, help="decode steps before timing (default 8)")
    ap.add_argument("--steps", type=int, default=64, help="timed decode steps (default 64)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--check-prompts", type=int, default=8, help="prompts for the greedy TP=2 == TP=1 check")
    ap.add_argument("--check-tokens", type=int, default=32, help="tokens generated per check prompt")
    ap.add_argument("--target", default=None, help="h200 / h100 / b200 (default: GPU 0's)")
    ap.add_argument("--compile-only", action="store_true", help="build the two artifacts and stop (no GPU needed)")
    ap.add_argument("--reuse", action="store_true", help="reuse the checkpoint and artifacts already in --workdir")
    a = ap.parse_args()
    a.batches = [int(b) for b in a.batches.split(",") if b.strip()]
    if not a.batches or min(a.batches) < 1:
        raise SystemExit("--batches: positive batch sizes, e.g. 1,64")

    if not a.compile_only:
        try:
            from ingot.runtime.tp.nccl import available, version

            ok, why = available(2)
            if not ok:
                emit(error=f"cannot run: {why}")
                return 2
            emit(event="env", nccl_version=version(), cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
        except Exception as e:  # noqa: BLE001 - reported as JSON
            emit(error=f"cannot run: {type(e).__name__}: {e}")
            return 2
    target = a.target or ("h200" if a.compile_only else gpu_target())
    tmp = None
    if a.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ingot-bench-tp-")
        a.workdir = Path(tmp.name)
    a.workdir.mkdir(parents=True, exist_ok=True)
    try:
        ckpt = a.ckpt
        made = a.workdir / "llama1b-ckpt"
        if ckpt is None and a.reuse and (made / "config.json").is_file():
            ckpt = made
        if ckpt is None:
            from bench.make_llama1b import make_checkpoint

            t0 = time.perf_counter()
            ckpt = make_checkpoint(made, a.layers)
            emit(event="checkpoint", path=str(ckpt), seconds=round(time.perf_counter() - t0, 1))
        a.layers_used = json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]
        block = 16
        need = a.context + a.warmup + a.steps + prefill_steps(max(a.batches), a.context, a) + 4
        max_len = max(need, 256 + a.check_tokens)
        max_len = -(-max_len // 256) * 256
        limits = {"max_num_seqs": max(max(a.batches), a.check_prompts),
                  "max_num_batched_tokens": a.max_num_batched_tokens, "max_model_len": max_len}
        paths = compile_artifacts(ckpt, a.workdir, target, limits, a.reuse)
        if a.compile_only:
            return 0
        num_blocks = max(a.batches) * -(-max_len // block) + 64
        r = np.random.default_rng(0)
        vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
        prompts = [[int(t) for t in r.integers(0, vocab, n)] for n in np.linspace(8, 200, a.check_prompts).astype(int)]
        rates, outs = {}, {}
        result: dict[str, bool] = {}

        def check(tp2_rates: dict, tp2_outs: list) -> None:  # reported before TP=2 shuts down
            ok, notes = compare(outs[1], tp2_outs)
            result["ok"] = ok
            emit(check="greedy", prompts=len(prompts), tokens_per_prompt=a.check_tokens,
                 equal_prompts=len(prompts) - len(notes), ok=ok, divergences=notes)
            emit(summary="tp_decode", batches=a.batches, layers=a.layers_used,
                 tokens_per_s={str(tp): {str(b): v for b, v in r.items()} for tp, r in ((1, rates[1]), (2, tp2_rates))},
                 speedup_tp2={str(b): round(tp2_rates[b] / rates[1][b], 3) for b in a.batches}, greedy_ok=ok)

        rates[1], outs[1] = run_tp(paths[1], 1, a, num_blocks, prompts)
        rates[2], outs[2] = run_tp(paths[2], 2, a, num_blocks, prompts, before_close=check)
        return 0 if result.get("ok") else 1
    except Exception as e:  # noqa: BLE001 - one JSON line saying what failed, then the traceback
        emit(error=f"{type(e).__name__}: {e}")
        traceback.print_exc()
        return 1
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
