"""End to end on the Llama-3.2-1B shape (issue 7): ingot's CUDA engine vs Hugging Face transformers, one run.

    python bench/bench_e2e.py --out $OUT/e2e.json                      # one H200: 16 layers, everything
    python bench/bench_e2e.py --layers 2 --skip-compile --out e2e.json # quick: 2 layers, no torch.compile reference
    python bench/bench_e2e.py --dry-run                                # no GPU, no torch: tiny shape, CPU backend
    python bench/bench_e2e.py --compile-only --workdir W               # then: --reuse --workdir W (two calls)

The full run is meant to fit 8 minutes on an H200 (the step counts are small); a fresh machine's first compile
builds every kernel (CUTLASS GEMMs through nvcc where installed), so when that is slow, split it into the two calls
of the last line (the kernel cache and W stay on a warm machine).

What one run does:

1. Makes the checkpoint with ``bench/make_llama1b.py`` (random weights; hidden 2048, 16 layers, 32/8 heads,
   head_dim 64, intermediate 8192, vocab 128256, tied embeddings; ``--layers`` for quick runs) in ``--workdir``
   (default: a temp dir, removed at the end).
2. Compiles it with ``ingot.compile`` for ``--target`` (default: GPU 0's) three ways: ``bf16``; ``fp8-w8a16``
   (FP8 weights, weight-only: quant config ``{"default": "fp8:wo"}``); ``fp8-w8a8`` (``quant="fp8"``: FP8 weights
   and per-token FP8 activations; reported as skipped when it does not compile for the target). On request
   (``--formats ...,fp8-w8a16-lmhead``) also FP8 weights with the lm_head quantized too (the default skip-list
   keeps it bf16: 525 MB of the 1.5 GB an FP8 step reads at batch 1).
3. Runs each artifact in the serving engine (``LLMEngine``, device cuda, greedy, ``ignore_eos``, no ``max_tokens``:
   every request decodes until the bench aborts it), as ``bench/bench_tp.py`` does: per decode batch (``--batches``,
   default 1,64) ``batch`` requests of ``--context`` random tokens are prefilled, ``--warmup`` decode steps run (the
   CUDA graph of the batch's bucket is captured), then ``--steps`` steps are timed (default 64 for batch 1, 32 for
   batch 64): tokens/s = tokens out / seconds, engine host time included. Batch 1 then runs ``--breakdown-steps``
   more steps with probes: the whole ``engine.step()``, the executor call inside it (``CudaExecutor.run``, or
   ``greedy_tokens`` where the engine samples on the device), and the GPU time between the step's input copy and
   its first copy back (CUDA events, as ``bench/bench_decode_step.py``). ``--decode-steps 1,8`` runs the decode
   figures once per ``K`` (the engine's ``decode_steps``, runtime/engine.py "Decode steps": ``K`` greedy decode
   steps per ``engine.step()``; default: the engine's, ``INGOT_DECODE_STEPS`` or 1): an engine step then makes ``K``
   tokens per request, tokens/s counts every one of them, ``step_ms`` and the breakdown are per engine step (so per
   ``K`` tokens; the breakdown's executor call is ``greedy_tokens_steps``, its GPU time spans the ``K`` steps), and
   ``token_step_ms`` is ``step_ms / K``. Prefill (``--prefill``,
   default 8x2048): the prompts are added at once, one warm-up round, then ``--prefill-repeats`` timed rounds
   (default 5, the median reported; the same for the references); tokens/s =
   prompt tokens / time until the last of them has its first token (TTFT of all 8). The engine chunks the
   prompts by ``--max-num-batched-tokens`` (default 2048, the bound the artifacts are compiled for).
4. The references, same checkpoint, ``LlamaForCausalLM`` bf16 on cuda with SDPA attention: ``generate``
   (greedy, EOS off, fixed ``max_new_tokens``) eager and with ``cache_implementation="static"`` (HF's automatic
   ``torch.compile`` of the decode step, mode reduce-overhead, static shapes); steady-state decode is timed
   from per-step timestamps (a stopping criterion that synchronizes and records the time; it never stops) over
   the same ``--steps`` after ``--warmup``. Prefill: one forward of the ``--prefill`` batch (``use_cache=False``,
   ``logits_to_keep=1``), eager and ``torch.compile``d, after one warm-up, ``--prefill-repeats`` rounds. Compile
   (first-call) seconds are printed apart and excluded. ``--skip-hf``, ``--skip-compile`` leave them out.
5. Prints the environment (git commit, torch/transformers versions, GPU), one table (config | ingot | HF eager |
   HF torch.compile | ingot / best reference | batch-1 fraction of the weight-bandwidth bound: bytes of weights
   read per token, from the checkpoint's tensors, lm_head once for the tied embedding, linears at 1 byte + an f32
   scale per output channel in the FP8 rows, over 4.19 TB/s), and writes every figure as JSON to ``--out``.

``--dry-run`` (alias ``--cpu``): the same pipeline on a tiny shape (hidden 256, 2 layers, vocab 2048) with the
CPU backend and target cpu (``--target h200`` compiles the GPU kernels too, still run on the CPU backend), small
step counts; the HF reference runs on the CPU when torch and transformers are installed (eager; the compile
column only without ``--skip-compile``). Its figures only show that every stage ran.

Exit code 0 when every requested measurement ran, 1 when one failed (the others still run and are reported),
2 when the machine cannot run it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: device-to-device copy on the H200, bytes read + written (docs/PERF.md, ../shared/GPU.md)
HBM_BYTES_PER_S = 4.19e12
#: the --dry-run shape (make_llama1b's config with these entries replaced); FP8 kernels need K % 64 == 0
DRY_SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 64, "vocab_size": 2048, "bos_token_id": 1, "eos_token_id": 2}
#: the artifacts: name -> ingot.compile's quantization arguments
FORMATS: dict[str, dict[str, Any]] = {
    "bf16": {},
    "fp8-w8a16": {"quant_config": {"default": "fp8:wo"}},  # FP8 weights, activations stay bf16
    "fp8-w8a8": {"quant": "fp8"},  # FP8 weights and per-token dynamic FP8 activations
    # FP8 weights with the lm_head too (the default skip-list keeps it bf16; a `layers` entry names it: its node is
    # `logits` or `lm_head` depending on the frontend); not built unless asked (--formats)
    "fp8-w8a16-lmhead": {"quant_config": {"default": "fp8:wo", "layers": {"lm_head": "fp8:wo", "logits": "fp8:wo"}}},
    # NVFP4 weights (e2m1 codes, an e4m3 scale per 16, a global scale), activations bf16; not built unless asked
    "nvfp4-w4a16": {"quant_config": {"default": "nvfp4:wo"}},
}
#: what --formats builds when not given
DEFAULT_FORMATS = ("bf16", "fp8-w8a16", "fp8-w8a8")
LABELS = {"bf16": "BF16", "fp8-w8a16": "FP8 weights (fp8:wo)", "fp8-w8a8": "FP8 W8A8 (fp8)",
          "fp8-w8a16-lmhead": "FP8 weights incl. lm_head (fp8:wo)", "nvfp4-w4a16": "NVFP4 weights (nvfp4:wo)"}


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def stage(results: dict[str, Any], key: str, fn: Callable[[], Any]) -> Any:
    """Run one measurement; a failure is recorded as ``{"error": ...}`` under ``key`` and the run goes on."""
    try:
        results[key] = fn()
    except Exception as e:  # noqa: BLE001 - reported, the other measurements still run
        results[key] = {"error": f"{type(e).__name__}: {e}"}
        emit(error=f"{key}: {type(e).__name__}: {e}")
        traceback.print_exc()
    return results[key]


def failed(x: Any) -> bool:
    return isinstance(x, dict) and "error" in x


# -- the model ------------------------------------------------------------------------------------


def make_model(out: Path, layers: int | None, dry: bool) -> Path:
    """The checkpoint, by ``bench/make_llama1b.py``; ``dry``: its config with ``DRY_SHAPE`` swapped in."""
    from bench import make_llama1b

    if not dry:
        return make_llama1b.make_checkpoint(out, layers)
    saved = dict(make_llama1b.LLAMA_1B)
    make_llama1b.LLAMA_1B.update(DRY_SHAPE)  # make_checkpoint reads the module's dict; restored below
    try:
        return make_llama1b.make_checkpoint(out, layers)
    finally:
        make_llama1b.LLAMA_1B.clear()
        make_llama1b.LLAMA_1B.update(saved)


def weight_bytes(ckpt: Path) -> dict[str, int]:
    """Bytes of weights one decode step reads at batch 1, per format, from the checkpoint's tensors.

    Every tensor is read once, except the embedding table: a step gathers one row of it, and with tied
    embeddings it is read whole as the lm_head (so it counts once); an untied model's ``lm_head.weight`` counts
    and its embedding does not. FP8 rows: the linears of the layers (2-D ``model.layers.*`` tensors; the
    lm_head and norms stay bf16, as the quantizer's default skip-list says) at 1 byte per weight plus one f32
    scale per output channel (``quant/linear.py`` ``weight_nbytes``)."""
    from ingot.quant.config import parse_spec
    from ingot.quant.linear import weight_nbytes
    from ingot.runtime.safetensors_io import SafetensorsFile

    cfg = json.loads((ckpt / "config.json").read_text())
    fp8, nvfp4 = parse_spec("fp8:wo"), parse_spec("nvfp4:wo")
    tied = cfg.get("tie_word_embeddings", False)
    total = {"bf16": 0, "fp8": 0, "fp8_lm_head": 0, "nvfp4": 0}
    for f in sorted(ckpt.glob("*.safetensors")):
        st = SafetensorsFile(f)
        for name in st.keys():
            dtype, shape = st.info(name)
            if name == "model.embed_tokens.weight" and not tied:
                continue  # one row per token; the separate lm_head.weight is the full read
            n = int(np.prod(shape)) * dtype.np.itemsize
            total["bf16"] += n
            linear = name.startswith("model.layers.") and len(shape) == 2
            q = weight_nbytes((int(shape[0]), int(shape[1])), fp8) if len(shape) == 2 else n
            total["fp8"] += q if linear else n
            total["nvfp4"] += weight_nbytes((int(shape[0]), int(shape[1])), nvfp4) if linear else n
            lm_head = name == "lm_head.weight" or (tied and name == "model.embed_tokens.weight")
            total["fp8_lm_head"] += q if linear or lm_head else n
    return {"bf16": total["bf16"], "fp8-w8a16": total["fp8"], "fp8-w8a8": total["fp8"],
            "fp8-w8a16-lmhead": total["fp8_lm_head"], "nvfp4-w4a16": total["nvfp4"]}


def artifact_switches(path: Path) -> dict[str, str] | None:
    """The ``INGOT_*`` switches an artifact was compiled with (its manifest's ``cuda.switches``; None for a CPU
    artifact or one made before they were recorded)."""
    try:
        cuda = json.loads((path / "manifest.json").read_text()).get("cuda")
    except (OSError, ValueError):
        return None
    return cuda.get("switches") if isinstance(cuda, dict) else None


def compile_format(ckpt: Path, workdir: Path, fmt: str, target: str, limits: dict[str, int],
                   reuse: bool = False) -> dict[str, Any]:
    """One artifact; W8A8 that does not compile for ``target`` is ``{"skipped": why}`` (the others must compile).
    ``reuse``: an artifact already in ``workdir`` is taken as it is."""
    import ingot
    from ingot.api import CompileError
    from ingot.passes import PassContext

    t0 = time.perf_counter()
    out = workdir / f"llama1b_{fmt}.ingot"
    if reuse and (out / "manifest.json").is_file():
        switches = artifact_switches(out)
        emit(event="compile", format=fmt, reused=True, path=str(out), switches=switches)
        return {"path": str(out), "reused": True, "switches": switches}
    if reuse:  # --reuse with no artifact: compiled now, with this process's INGOT_* switches (said, not silent)
        emit(event="compile", format=fmt, note="--reuse: no artifact here, compiling one with this environment",
             path=str(out))
    try:
        ingot.compile(ckpt, target=target, out=out,
                      pass_context=PassContext(target=target, options={"cuda": limits}), **FORMATS[fmt])
    except CompileError as e:
        if fmt != "fp8-w8a8":
            raise
        emit(event="compile", format=fmt, target=target, skipped=str(e))
        return {"skipped": f"does not compile for {target}: {e}"}
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    res = {"path": str(out), "seconds": round(time.perf_counter() - t0, 1), "artifact_bytes": size,
           "switches": artifact_switches(out)}
    emit(event="compile", format=fmt, target=target, **res)
    return res


# -- ingot ----------------------------------------------------------------------------------------


class StepProbe:
    """Times each ``engine.step()`` run inside it: the executor call that runs the model (``run``, or
    ``greedy_tokens`` where the engine samples on the device; wrapped on the instance, the outermost call timed)
    and, on the CUDA backend, the GPU time from the step's input copy to its first copy back (CUDA events
    recorded by hooks on ``cuda_driver.memcpy_htod`` / ``memcpy_dtoh``, as ``bench/bench_decode_step.py`` does).
    Slightly perturbs what it measures: use it after the clean timing. The engine's overlap (runtime/engine.py,
    "Overlap") is off while it probes: with a plan queued behind the one being waited for, the executor's calls and
    the GPU time of one step could not be told apart."""

    METHODS = ("run", "greedy_tokens", "greedy_tokens_steps")

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.run_s: list[float] = []
        self.gpu_s: list[float] = []
        self.calls: dict[str, int] = {}
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> StepProbe:
        ex = self.engine.executor
        engine = self.engine
        if getattr(engine, "decode_overlap", False):
            engine.decode_overlap = False
            self._undo.append(lambda: setattr(engine, "decode_overlap", True))
        events = self._hook_copies() if self.engine.device == "cuda" else None
        depth = [0]

        def timed(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                outer = depth[0] == 0
                if outer and events is not None:
                    events["marks"].clear()
                depth[0] += 1
                t0 = time.perf_counter()
                try:
                    out = orig(*args, **kwargs)
                finally:
                    depth[0] -= 1
                if outer:
                    self.run_s.append(time.perf_counter() - t0)
                    self.calls[name] = self.calls.get(name, 0) + 1
                    if events is not None and events["marks"] == {"start", "end"}:
                        self.gpu_s.append(events["end"].elapsed_ms(events["start"]) / 1e3)
                return out

            return call

        for name in self.METHODS:
            if callable(getattr(ex, name, None)):
                setattr(ex, name, timed(name, getattr(ex, name)))
                self._undo.append(lambda name=name: delattr(ex, name))
        return self

    def _hook_copies(self) -> dict[str, Any]:
        from ingot.runtime import cuda_driver as cd

        ev: dict[str, Any] = {"start": cd.Event(), "end": cd.Event(), "marks": set()}
        htod, dtoh = cd.memcpy_htod, cd.memcpy_dtoh

        def hooked_htod(dst: int, src: int, n: int, stream: Any = None) -> None:
            htod(dst, src, n, stream)
            if stream is not None and "start" not in ev["marks"]:
                ev["start"].record(stream)
                ev["marks"].add("start")

        def hooked_dtoh(dst: int, src: int, n: int, stream: Any = None) -> None:
            if stream is not None and "end" not in ev["marks"]:
                ev["end"].record(stream)
                ev["marks"].add("end")
            dtoh(dst, src, n, stream)

        cd.memcpy_htod, cd.memcpy_dtoh = hooked_htod, hooked_dtoh

        def undo() -> None:
            cd.memcpy_htod, cd.memcpy_dtoh = htod, dtoh
            ev["start"].destroy()
            ev["end"].destroy()

        self._undo.append(undo)
        return ev

    def __exit__(self, *exc: Any) -> None:
        while self._undo:
            self._undo.pop()()


def _median_ms(xs: list[float]) -> float | None:
    return round(statistics.median(xs) * 1e3, 4) if xs else None


def engine_decode(engine: Any, batch: int, context: int, warmup: int, steps: int, seed: int,
                  probe_steps: int = 0) -> dict[str, Any]:
    """``batch`` requests of ``context`` random tokens: prefill, ``warmup`` decode steps, ``steps`` timed steps,
    then ``probe_steps`` steps under a ``StepProbe`` (the per-step breakdown). With ``engine.decode_steps`` = K > 1
    each engine step makes K tokens per request (the requests have no ``max_tokens``: room for all of them), and the
    step counts are divided by K (rounded up), so every K decodes about as many tokens over the same context
    lengths: K = 8 over 64 steps' contexts, not 512."""
    from bench.bench_tp import decode_rate

    k = getattr(engine, "decode_steps", 1)
    warmup, steps, probe_steps = (-(-n // k) for n in (warmup, steps, probe_steps))

    def probe() -> dict[str, Any]:
        step_s: list[float] = []
        tokens = 0
        with StepProbe(engine) as p:
            for _ in range(probe_steps):
                t1 = time.perf_counter()
                outs = engine.step()
                step_s.append(time.perf_counter() - t1)
                tokens += sum(len(o.outputs[0].delta_token_ids) for o in outs)
        return {"breakdown": {"steps": probe_steps, "engine_step_ms": _median_ms(step_s),
                              "executor_run_ms": _median_ms(p.run_s), "gpu_ms": _median_ms(p.gpu_s),
                              "executor_calls": p.calls, "tokens_per_step": tokens / max(probe_steps * batch, 1)}}

    res = decode_rate(engine, batch, context, warmup, steps, seed, after=probe if probe_steps else None)
    if res["tokens"] != batch * steps * k:
        raise RuntimeError(f"batch {batch}: {res['tokens']} tokens in {steps} steps, expected {batch * steps * k}")
    res.update(expected_tokens=batch * steps * k, decode_steps=k, token_step_ms=round(res["step_ms"] / k, 4))
    return res


def engine_prefill(engine: Any, prompts: int, length: int, seed: int) -> dict[str, Any]:
    """``prompts`` random prompts of ``length`` tokens added at once, one token each: prompt tokens per second
    until the last first token, and the TTFTs."""
    from ingot.runtime.sampling import SamplingParams

    r = np.random.default_rng(seed)
    batch = [[int(t) for t in r.integers(0, engine.vocab_size, length)] for _ in range(prompts)]
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    first: dict[str, float] = {}
    steps = 0
    t0 = time.perf_counter()
    ids = [engine.add_request(p, params) for p in batch]
    while len(first) < prompts:
        outs = engine.step()
        steps += 1
        now = time.perf_counter()
        for o in outs:
            if o.outputs[0].token_ids and o.request_id not in first:
                first[o.request_id] = now - t0
        if now - t0 > 600:
            raise RuntimeError(f"prefill of {prompts} x {length} tokens did not finish in 600 s")
    while engine.has_unfinished_requests():
        engine.step()
    ttft = [first[i] for i in ids]
    return {"tokens_per_s": round(prompts * length / max(ttft), 1), "ttft_all_ms": round(max(ttft) * 1e3, 2),
            "ttft_mean_ms": round(statistics.fmean(ttft) * 1e3, 2), "steps": steps}


def run_ingot(path: Path, fmt: str, a: argparse.Namespace, num_blocks: int) -> dict[str, Any]:
    from ingot.runtime.engine import LLMEngine

    t0 = time.perf_counter()
    engine = LLMEngine(path, device=a.device, num_blocks=num_blocks,
                       max_num_seqs=max(*a.batches, a.prefill_prompts),
                       max_num_batched_tokens=a.max_num_batched_tokens, enable_prefix_caching=False)
    emit(event="load", format=fmt, seconds=round(time.perf_counter() - t0, 1), num_blocks=engine.num_blocks,
         max_num_seqs=engine.args.max_num_seqs, max_num_batched_tokens=engine.args.max_num_batched_tokens,
         max_model_len=engine.max_model_len)
    res: dict[str, Any] = {"decode": {}}
    try:
        for k in a.decode_steps or [engine.decode_steps]:
            engine.decode_steps = k
            for bs, steps in zip(a.batches, a.steps):
                d = stage(res["decode"], decode_key(bs, k), lambda bs=bs, steps=steps: engine_decode(
                    engine, bs, a.context, a.warmup, steps, seed=bs, probe_steps=a.breakdown_steps if bs == 1 else 0))
                emit(bench="ingot_decode", format=fmt, batch=bs, context=a.context, steps=steps, **d)
        pre: dict[str, Any] = {}
        stage(pre, "warmup", lambda: engine_prefill(engine, a.prefill_prompts, a.prefill_len, seed=100))
        for i in range(a.prefill_repeats):
            stage(pre, f"run{i}", lambda i=i: engine_prefill(engine, a.prefill_prompts, a.prefill_len, seed=101 + i))
        res["prefill"] = _best_prefill(pre, a.prefill_repeats)
        emit(bench="ingot_prefill", format=fmt, prompts=a.prefill_prompts, length=a.prefill_len, **res["prefill"])
        stats = getattr(engine.executor, "stats", None)
        if isinstance(stats, dict):
            res["executor_stats"] = dict(stats)
    finally:
        engine.close()
    return res


def decode_key(batch: int, k: int) -> str:
    """A decode figure's key in the results: the batch size, ``:kK`` added for K decode steps per engine step."""
    return str(batch) if k == 1 else f"{batch}:k{k}"


def _best_prefill(runs: dict[str, Any], repeats: int) -> dict[str, Any]:
    """The median run (by tokens/s) of the timed rounds, or the first error."""
    ok = [runs[f"run{i}"] for i in range(repeats) if not failed(runs.get(f"run{i}"))]
    if not ok:
        return next((v for v in runs.values() if failed(v)), {"error": "no prefill round ran"})
    ok.sort(key=lambda r: r["tokens_per_s"])
    return {**ok[len(ok) // 2], "rounds": len(ok)}


# -- Hugging Face ---------------------------------------------------------------------------------


def hf_load(ckpt: Path, device: str) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(ckpt), dtype=torch.bfloat16, attn_implementation="sdpa")
    model.to(device).eval()
    # EOS off (ignore_eos): no EOS stopping criterion or processor; outputs are checked for their full length
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _sync(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def hf_decode(model: Any, batch: int, context: int, warmup: int, steps: int, static: bool, seed: int,
              device: str) -> dict[str, Any]:
    """``generate`` on ``batch`` random prompts: a warm-up call (for ``static``: same shapes, it compiles), then a
    timed call of ``1 + warmup + steps`` new tokens whose per-step timestamps give the steady-state decode rate."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    sync = _sync(device)

    class StepClock(StoppingCriteria):
        """Records when each step's token is there (after a device sync); never stops generation."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
            sync()
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, context), generator=g).to(device)
    new = 1 + warmup + steps
    kw: dict[str, Any] = {"attention_mask": torch.ones_like(ids), "do_sample": False}
    if static:
        from transformers import CompileConfig

        cc = CompileConfig(dynamic=False)  # each batch size compiles with static shapes
        if device != "cuda":
            cc._compile_all_devices = True  # --dry-run: HF compiles only on accelerators unless told
        kw.update(cache_implementation="static", compile_config=cc)
    t0 = time.perf_counter()
    # the static cache's shape depends on max_new_tokens: the warm-up uses the timed call's, so nothing recompiles
    model.generate(ids, max_new_tokens=new if static else min(new, 4), **kw)
    sync()
    first_s = time.perf_counter() - t0
    clock = StepClock()
    t0 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new, stopping_criteria=StoppingCriteriaList([clock]), **kw)
    sync()
    total_s = time.perf_counter() - t0
    got = int(out.shape[1]) - context
    if got != new or len(clock.times) < new:
        raise RuntimeError(f"generate made {got} tokens ({len(clock.times)} steps timed), expected {new}")
    dt = clock.times[new - 1] - clock.times[new - 1 - steps]
    res = {"tokens_per_s": round(batch * steps / dt, 1), "step_ms": round(dt / steps * 1e3, 4),
           "tokens": batch * steps, "first_call_s": round(first_s, 2), "generate_s": round(total_s, 3),
           "prefill_s": round(clock.times[0] - t0, 4)}
    if static:
        res["compiled"] = hasattr(model, "_compiled_call")  # set by HF's get_compiled_call: the decode step compiled
    return res


def hf_prefill(model: Any, prompts: int, length: int, compiled: bool, repeats: int, seed: int,
               device: str) -> dict[str, Any]:
    """One forward of ``prompts`` x ``length`` tokens (no cache, last position's logits), after a warm-up."""
    import torch

    sync = _sync(device)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (prompts, length), generator=g).to(device)
    fwd = torch.compile(model.forward, dynamic=False) if compiled else model.forward
    times = []
    with torch.inference_mode():
        t0 = time.perf_counter()
        fwd(input_ids=ids, use_cache=False, logits_to_keep=1)
        sync()
        first_s = time.perf_counter() - t0
        for _ in range(repeats):
            t0 = time.perf_counter()
            fwd(input_ids=ids, use_cache=False, logits_to_keep=1)
            sync()
            times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    return {"tokens_per_s": round(prompts * length / t, 1), "ttft_all_ms": round(t * 1e3, 2),
            "first_call_s": round(first_s, 2), "rounds": repeats}


def run_hf(ckpt: Path, a: argparse.Namespace, device: str) -> dict[str, Any]:
    import torch

    t0 = time.perf_counter()
    model = hf_load(ckpt, device)
    emit(event="hf_load", seconds=round(time.perf_counter() - t0, 1), device=device)
    res: dict[str, Any] = {}
    modes = [("eager", False)] + ([] if a.skip_compile else [("compile", True)])
    try:
        for mode, static in modes:
            r: dict[str, Any] = {"decode": {}}
            for bs, steps in zip(a.batches, a.steps):
                d = stage(r["decode"], str(bs), lambda bs=bs, steps=steps, static=static: hf_decode(
                    model, bs, a.context, a.warmup, steps, static, seed=bs, device=device))
                emit(bench="hf_decode", mode=mode, batch=bs, context=a.context, steps=steps, **d)
            stage(r, "prefill", lambda static=static: hf_prefill(model, a.prefill_prompts, a.prefill_len, static,
                                                                 a.prefill_repeats, seed=7, device=device))
            emit(bench="hf_prefill", mode=mode, prompts=a.prefill_prompts, length=a.prefill_len, **r["prefill"])
            res[mode] = r
    finally:
        model = None  # the weights go before the caller goes on
        if device == "cuda":
            torch.cuda.empty_cache()
    return res


# -- the report -----------------------------------------------------------------------------------


def _fig(x: Any, key: str) -> float | None:
    return None if not isinstance(x, dict) or failed(x) else x.get(key)


def table_rows(results: dict[str, Any], a: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per (measure, format): ingot's figure, the bf16 references, the ratio to the better reference and
    for batch 1 the fraction of the weight-bandwidth bound."""
    hf = results.get("hf") or {}
    rows = []
    # (name, ingot's figure, the references' figure, higher is better)
    measures: list[tuple[str, Callable[[dict[str, Any]], Any], Callable[[dict[str, Any]], Any], bool]] = []
    for k in decode_ks(results, a):
        for bs in a.batches:
            def get(r: dict[str, Any], key: str = decode_key(bs, k)) -> Any:
                return _fig((r.get("decode") or {}).get(key), "tokens_per_s")

            measures.append((f"decode bs={bs},{f' K={k},' if k > 1 else ''} tok/s", get,
                             lambda r, key=str(bs): _fig((r.get("decode") or {}).get(key), "tokens_per_s"), True))
    pre = f"{a.prefill_prompts}x{a.prefill_len}"
    prefill = lambda r: _fig(r.get("prefill"), "tokens_per_s")  # noqa: E731
    ttft = lambda r: _fig(r.get("prefill"), "ttft_all_ms")  # noqa: E731
    measures.append((f"prefill {pre}, prompt tok/s", prefill, prefill, True))
    measures.append((f"TTFT all {a.prefill_prompts} of {pre}, ms", ttft, ttft, False))
    for name, get, get_ref, higher_better in measures:
        refs = {mode: get_ref(hf[mode]) if isinstance(hf.get(mode), dict) else None for mode in ("eager", "compile")}
        known = [v for v in refs.values() if v]
        best = (max(known) if higher_better else min(known)) if known else None
        for fmt in a.formats:
            ing = results["ingot"].get(fmt)
            v = get(ing) if isinstance(ing, dict) and not failed(ing) else None
            row = {"config": f"{name}, {LABELS[fmt]}", "format": fmt, "ingot": v, "hf_eager": refs["eager"],
                   "hf_compile": refs["compile"], "ingot_over_best_ref": round(v / best, 3) if v and best else None}
            if name.startswith("decode bs=1,") and v:
                bound = HBM_BYTES_PER_S / results["model"]["weight_bytes_per_token"][fmt]
                row["bound_tok_s"] = round(bound, 1)
                row["fraction_of_bound"] = float(f"{v / bound:.4g}")
            rows.append(row)
    return rows


def decode_ks(results: dict[str, Any], a: argparse.Namespace) -> list[int]:
    """The decode steps per engine step that were measured (``--decode-steps``, else what the engines ran)."""
    if a.decode_steps:
        return list(a.decode_steps)
    ran = {r.get("decode_steps", 1) for ing in results["ingot"].values() if isinstance(ing, dict)
           for r in (ing.get("decode") or {}).values() if isinstance(r, dict)}
    return sorted(ran) or [1]


def print_table(rows: list[dict[str, Any]]) -> None:
    def f(x: Any) -> str:
        return "-" if x is None else f"{x:,.1f}" if isinstance(x, float) else str(x)

    print("\n| config | ingot | HF eager | HF torch.compile | ingot / best reference | bs=1: % of weight-BW bound |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        bound = (f"{100 * r['fraction_of_bound']:.1f}% of {r['bound_tok_s']:,.0f}" if "fraction_of_bound" in r
                 else "-")
        ratio = "-" if r["ingot_over_best_ref"] is None else f"{r['ingot_over_best_ref']:.2f}x"
        print(f"| {r['config']} | {f(r['ingot'])} | {f(r['hf_eager'])} | {f(r['hf_compile'])} | {ratio} | {bound} |")
    print("HF columns: bf16 in every row (the FP8 rows compare against the bf16 references). TTFT row: the ratio is "
          "of times (below 1: ingot faster).", flush=True)


def print_details(results: dict[str, Any], a: argparse.Namespace) -> None:
    """The batch-1 step breakdown per format and the compile / first-call times the table leaves out."""
    print("\nbatch-1 decode step, medians (ms): engine.step() | executor call | GPU (input copy -> copy back) | "
          "engine outside the executor | executor outside the GPU | engine.step() per token (K tokens a step)")
    for k in decode_ks(results, a):
        for fmt in a.formats:
            b = _fig(((results["ingot"].get(fmt) or {}).get("decode") or {}).get(decode_key(1, k)), "breakdown") or {}
            step, run, gpu = b.get("engine_step_ms"), b.get("executor_run_ms"), b.get("gpu_ms")
            per = b.get("tokens_per_step")
            cells = [step, run, gpu, step - run if step and run else None, run - gpu if run and gpu else None,
                     step / per if step and per else None]
            print(f"  {LABELS[fmt]}{f', K={k}' if k > 1 else ''}: "
                  + " | ".join("-" if c is None else f"{c:.3f}" for c in cells)
                  + (f"  ({', '.join(f'{m} x{n}' for m, n in b.get('executor_calls', {}).items())})" if b else ""))
    wb = results["model"]["weight_bytes_per_token"]
    if "bf16" in wb:  # issue 7 asks FP8 weights for 1.7x the bf16 rate: this is the most the bytes allow
        print("batch-1 weight-bandwidth bound over bf16's (the largest speedup a format's bytes allow): " + ", ".join(
            f"{fmt} {wb['bf16'] / wb[fmt]:.2f}x" for fmt in a.formats if fmt != "bf16" and wb.get(fmt)))
    compiled = {fmt: _fig(results["compile"].get(fmt), "seconds") for fmt in a.formats}
    print("ingot compile s: " + ", ".join(f"{fmt} {'-' if s is None else s}" for fmt, s in compiled.items()))
    hf = results.get("hf") if isinstance(results.get("hf"), dict) else {}
    for mode in ("eager", "compile"):
        r = hf.get(mode)
        if not isinstance(r, dict):
            continue
        firsts = [f"decode bs={bs} {_fig(d, 'first_call_s')}" for bs, d in r.get("decode", {}).items()]
        firsts.append(f"prefill {_fig(r.get('prefill'), 'first_call_s')}")
        print(f"HF {mode}: first call s (warm-up{', compile' if mode == 'compile' else ''}; excluded): "
              + ", ".join(firsts))
    print(flush=True)


def environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {"python": sys.version.split()[0], "numpy": np.__version__,
                           **{k: os.environ.get(k) for k in ("INGOT_AUTOTUNE", "INGOT_DEVICE_SAMPLING",
                                                             "INGOT_DECODE_STEPS", "CUDA_VISIBLE_DEVICES")}}
    try:
        env["git_commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                           text=True, check=True).stdout.strip()
        env["git_dirty"] = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD"]).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        env["git_commit"] = None
    for mod in ("torch", "transformers"):
        try:
            env[mod] = __import__(mod).__version__
        except ImportError:
            env[mod] = None
    if device == "cuda":
        try:
            from ingot.runtime.cuda_driver import Context

            ctx = Context(0)
            env["gpu"], env["sm"] = ctx.name, ctx.sm
        except Exception as e:  # noqa: BLE001 - reported
            env["gpu"] = f"unknown ({type(e).__name__}: {e})"
    else:
        env["gpu"] = None
    return env


def gpu_target() -> str:
    from bench.bench_tp import gpu_target as target

    return target()


@contextlib.contextmanager
def workdir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="ingot-bench-e2e-") as tmp:
        yield Path(tmp)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=None, help="checkpoint and artifacts (default: a temp dir)")
    ap.add_argument("--layers", type=int, default=None, help="depth of the model (default 16; --dry-run 2)")
    ap.add_argument("--target", default=None, help="h200 / h100 / b200 (default: GPU 0's; --dry-run: cpu)")
    ap.add_argument("--formats", default=",".join(DEFAULT_FORMATS), help=f"artifacts to build and run, from "
                    f"{','.join(FORMATS)} (default {','.join(DEFAULT_FORMATS)})")
    ap.add_argument("--batches", default=None, help="decode batch sizes (default 1,64; --dry-run 1,4)")
    ap.add_argument("--steps", default=None, help="timed decode steps per batch size, same order (default 64,32)")
    ap.add_argument("--warmup", type=int, default=None, help="decode steps before timing (default 8)")
    ap.add_argument("--context", type=int, default=None, help="prompt tokens of the decode requests (default 128)")
    ap.add_argument("--breakdown-steps", type=int, default=None, help="probed batch-1 steps (default 32)")
    ap.add_argument("--decode-steps", default=None, help="decode steps per engine step to measure, e.g. 1,8 (the "
                    "engine's decode_steps; default: the engine's, INGOT_DECODE_STEPS or 1)")
    ap.add_argument("--prefill", default=None, help="PROMPTSxTOKENS of the prefill figure (default 8x2048)")
    ap.add_argument("--prefill-repeats", type=int, default=5,
                    help="timed prefill rounds after the warm-up, ingot's and each HF mode's (default 5, ~0.1 s "
                         "each; the median is reported: single rounds varied +-3-4%% between runs on the H200)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None,
                    help="token budget per engine step, the compiled bound T (default 2048)")
    ap.add_argument("--skip-hf", action="store_true", help="no Hugging Face reference")
    ap.add_argument("--skip-compile", action="store_true", help="no torch.compile reference (HF eager only)")
    ap.add_argument("--compile-only", action="store_true", help="make the checkpoint and the artifacts, then stop")
    ap.add_argument("--reuse", action="store_true", help="take the checkpoint and artifacts already in --workdir "
                                                         "(made with the same options) instead of making them")
    ap.add_argument("--dry-run", "--cpu", dest="dry_run", action="store_true",
                    help="tiny shape on the CPU backend (no GPU, no torch needed)")
    ap.add_argument("--out", type=Path, default=None, help="write every figure as JSON here (default: stdout only)")
    a = ap.parse_args(argv)
    dry = a.dry_run
    a.device = "cpu" if dry else "cuda"
    a.layers = a.layers or (2 if dry else None)
    a.batches = [int(b) for b in (a.batches or ("1,4" if dry else "1,64")).split(",") if b.strip()]
    a.steps = [int(s) for s in (a.steps or ("4,4" if dry else "64,32")).split(",") if s.strip()]
    if not a.batches or min(a.batches) < 1 or len(a.steps) != len(a.batches) or min(a.steps) < 1:
        ap.error("--batches and --steps: positive integers, one step count per batch size (e.g. 1,64 and 64,32)")
    a.decode_steps = [int(k) for k in (a.decode_steps or "").split(",") if k.strip()]
    if a.decode_steps and min(a.decode_steps) < 1:
        ap.error("--decode-steps: positive integers, e.g. 1,8")
    a.warmup = a.warmup if a.warmup is not None else (2 if dry else 8)
    a.context = a.context or (16 if dry else 128)
    a.breakdown_steps = a.breakdown_steps if a.breakdown_steps is not None else (4 if dry else 32)
    try:
        n, length = (a.prefill or ("2x64" if dry else "8x2048")).lower().split("x")
        a.prefill_prompts, a.prefill_len = int(n), int(length)
    except ValueError:
        ap.error("--prefill: PROMPTSxTOKENS, e.g. 8x2048")
    a.max_num_batched_tokens = a.max_num_batched_tokens or (64 if dry else 2048)
    a.formats = [f.strip() for f in a.formats.split(",") if f.strip()]
    unknown = set(a.formats) - set(FORMATS)
    if unknown or not a.formats:
        ap.error(f"--formats: from {', '.join(FORMATS)}")
    if a.prefill_repeats < 1:
        ap.error("--prefill-repeats: at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.device == "cuda" and not a.compile_only:
        try:
            a.target = a.target or gpu_target()
        except BaseException as e:  # noqa: BLE001 - SystemExit / CudaUnavailable: reported as JSON
            emit(error=f"cannot run: {type(e).__name__}: {e}")
            return 2
    a.target = a.target or ("cpu" if a.dry_run else "h200")
    results: dict[str, Any] = {"env": environment(a.device), "args": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}, "ingot": {}}
    emit(event="env", **results["env"])
    ok = True
    with workdir(a.workdir) as wd:
        t0 = time.perf_counter()
        ckpt = wd / "llama1b-ckpt"
        if not (a.reuse and (ckpt / "config.json").is_file()):
            ckpt = make_model(ckpt, a.layers, a.dry_run)
        cfg = json.loads((ckpt / "config.json").read_text())
        results["model"] = {"layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"],
                            "vocab": cfg["vocab_size"], "weight_bytes_per_token": weight_bytes(ckpt),
                            "checkpoint_s": round(time.perf_counter() - t0, 1)}
        emit(event="checkpoint", path=str(ckpt), **results["model"])
        block = 16
        from ingot.runtime.engine import decode_steps_default

        kmax = max(a.decode_steps or [decode_steps_default()])  # tokens per request and decode step
        need = max(a.context + kmax * (a.warmup + max(a.steps) + a.breakdown_steps + 1) + 64, a.prefill_len + 8)
        max_len = -(-need // 256) * 256
        limits = {"max_num_seqs": max(*a.batches, a.prefill_prompts),
                  "max_num_batched_tokens": a.max_num_batched_tokens, "max_model_len": max_len}
        num_blocks = max(max(a.batches) * -(-max_len // block), a.prefill_prompts * -(-(a.prefill_len + 8) // block))
        num_blocks += 64
        built: dict[str, Any] = {}
        for fmt in a.formats:
            stage(built, fmt, lambda fmt=fmt: compile_format(ckpt, wd, fmt, a.target, limits, a.reuse))
        results["compile"] = built
        if a.compile_only:
            ok = not any(failed(v) for v in built.values())
        else:
            for fmt in a.formats:
                if failed(built[fmt]) or "skipped" in built[fmt]:
                    results["ingot"][fmt] = built[fmt]
                    continue
                stage(results["ingot"], fmt, lambda fmt=fmt: run_ingot(Path(built[fmt]["path"]), fmt, a, num_blocks))
            if not a.skip_hf:
                stage(results, "hf", lambda: run_hf(ckpt, a, a.device))
            results["table"] = table_rows(results, a)
            print_table(results["table"])
            print_details(results, a)
            ok = not _any_error(results)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(results, indent=1) + "\n")
        emit(event="written", path=str(a.out))
    return 0 if ok else 1


def _any_error(x: Any) -> bool:
    if isinstance(x, dict):
        return "error" in x or any(_any_error(v) for v in x.values())
    if isinstance(x, list):
        return any(_any_error(v) for v in x)
    return False


if __name__ == "__main__":
    sys.exit(main())
