"""Where a step's GPU time goes: every launch of one decode step and one prefill step of an artifact, timed alone.

Runs the artifact in ``LLMEngine`` (device cuda) the way ``bench/bench_e2e.py`` does: ``--prefill`` prompts of
random tokens (the first step that has more tokens than sequences is the prefill step profiled), then ``--batch``
requests with ``--context``-token prompts decoding (the first step with one token per sequence and ``--batch``
sequences is the decode step profiled). Each captured step is replayed through ``CudaExecutor.profile``: plain
launches, each between two CUDA events, median of ``--repeats`` runs. The tables group the launches by op and by
kernel, with their share of the step; the sum is larger than a CUDA-graph step (graphs and programmatic dependent
launch hide the launch gaps, and events keep PDL launches from overlapping), so read shares, not absolute sums.

    python bench/bench_profile.py /tmp/e2e/bf16.ingot --json $OUT/profile.json
    python bench/bench_profile.py /tmp/e2e/bf16.ingot --batch 64 --prefill 8x2048 --max-num-batched-tokens 16384

Needs a GPU and a CUDA artifact for it (``bench/bench_e2e.py --compile-only --workdir W`` makes them).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def group(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Launch times summed per ``key`` (``op`` or ``kernel``), largest first, with launches and share."""
    total = sum(r["us"] for r in rows) or 1.0
    acc: dict[str, dict[str, Any]] = {}
    for r in rows:
        g = acc.setdefault(str(r[key]), {key: str(r[key]), "launches": 0, "us": 0.0})
        g["launches"] += 1
        g["us"] += r["us"]
    out = sorted(acc.values(), key=lambda g: -g["us"])
    for g in out:
        g["us"] = round(g["us"], 2)
        g["share"] = round(g["us"] / total, 4)
    return out


def print_groups(title: str, rows: list[dict[str, Any]], key: str, top: int) -> None:
    groups = group(rows, key)
    total = sum(r["us"] for r in rows)
    print(f"\n{title}: {len(rows)} launches, {total:.1f} us summed")
    print(f"  {'us':>10} {'share':>6} {'n':>5}  {key}")
    for g in groups[:top]:
        print(f"  {g['us']:10.1f} {g['share'] * 100:5.1f}% {g['launches']:5d}  {g[key]}")
    if len(groups) > top:
        rest = groups[top:]
        print(f"  {sum(g['us'] for g in rest):10.1f} {sum(g['share'] for g in rest) * 100:5.1f}% "
              f"{sum(g['launches'] for g in rest):5d}  ({len(rest)} more)")


class StepCapture:
    """Wraps an engine's executor so that the first step matching ``want`` (step inputs -> bool) is kept."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor
        self.want: Any = None
        self.captured: dict[str, np.ndarray] | None = None
        for name in ("run", "greedy_tokens"):
            orig = getattr(executor, name)
            setattr(executor, name, self._wrap(orig))

    def _wrap(self, orig: Any) -> Any:
        def call(feeds: Mapping[str, np.ndarray], *args: Any, **kwargs: Any) -> Any:
            if self.captured is None and self.want is not None and self.want(feeds):
                self.captured = {k: np.array(v, copy=True) for k, v in feeds.items() if not k.startswith("kv_cache")}
            return orig(feeds, *args, **kwargs)

        return call

    def take(self) -> dict[str, np.ndarray]:
        if self.captured is None:
            raise RuntimeError("no step matched")
        out, self.captured, self.want = self.captured, None, None
        return out


def run(path: Path, a: argparse.Namespace) -> dict[str, Any]:
    from ingot.runtime.engine import LLMEngine
    from ingot.runtime.sampling import SamplingParams

    prompts, length = (int(x) for x in a.prefill.lower().split("x"))
    budget = {} if a.max_num_batched_tokens is None else {"max_num_batched_tokens": a.max_num_batched_tokens}
    engine = LLMEngine(path, device="cuda", max_num_seqs=max(a.batch, prompts), enable_prefix_caching=False,
                       **budget)  # no budget given: the engine's default, clamped to the artifact's
    # the overlapped decode path (INGOT_DECODE_OVERLAP, on for the GPU) queues steps through submit_greedy_steps,
    # which StepCapture does not wrap: the plain path's steps run the same launches
    engine.decode_overlap = False
    res: dict[str, Any] = {"artifact": str(path)}
    try:
        cap = StepCapture(engine.executor)
        rng = np.random.default_rng(0)
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

        cap.want = lambda f: len(f["input_ids"]) > len(f["seq_lens"])
        for _ in range(prompts):
            engine.add_request([int(t) for t in rng.integers(0, engine.vocab_size, length)], params)
        while engine.has_unfinished_requests():
            engine.step()
        pre = cap.take()
        res["prefill"] = {"tokens": int(len(pre["input_ids"])), "sequences": int(len(pre["seq_lens"])),
                          "launches": engine.executor.profile(pre, a.repeats)}

        cap.want = lambda f: len(f["input_ids"]) == len(f["seq_lens"]) == a.batch
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        for _ in range(a.batch):
            engine.add_request([int(t) for t in rng.integers(0, engine.vocab_size, a.context)], params)
        while engine.has_unfinished_requests():
            engine.step()
        dec = cap.take()
        res["decode"] = {"batch": a.batch, "context": a.context, "launches": engine.executor.profile(dec, a.repeats)}
    finally:
        engine.close()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifacts", nargs="+", type=Path, help="CUDA artifacts (NAME.ingot directories)")
    ap.add_argument("--batch", type=int, default=1, help="sequences of the profiled decode step (default 1)")
    ap.add_argument("--context", type=int, default=128, help="prompt tokens of the decode requests (default 128)")
    ap.add_argument("--prefill", default="8x2048", help="PROMPTSxTOKENS added at once (default 8x2048)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None, help="step token budget (default: the "
                    "artifact's compiled bound)")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each step; medians (default 5)")
    ap.add_argument("--top", type=int, default=12, help="rows per table (default 12)")
    ap.add_argument("--json", type=Path, default=None, help="write every launch's time here")
    a = ap.parse_args(argv)
    results = []
    for path in a.artifacts:
        res = run(path, a)
        results.append(res)
        print(f"\n== {path}")
        for step in ("prefill", "decode"):
            r = res[step]
            what = (f"prefill step ({r['tokens']} tokens, {r['sequences']} sequences)" if step == "prefill"
                    else f"decode step (batch {r['batch']}, context {r['context']})")
            print_groups(f"{what} by op", r["launches"], "op", a.top)
            print_groups(f"{what} by kernel", r["launches"], "kernel", a.top)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
