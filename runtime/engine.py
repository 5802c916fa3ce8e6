"""The engine: requests in, streamed outputs out; one ``step()`` at a time.

::

    add_request(prompt, SamplingParams) --> Scheduler (waiting queue)
    step():  schedule()  -> step inputs + which rows sample
             executor.run(step inputs + kv_cache.{i})  -> logits[S, vocab]
             Sampler(logits[rows that sample])          -> one token per row
               (or, when every row that samples is plain greedy: executor.greedy_tokens(step inputs) -> ids[S],
                the argmax taken where the logits are, on the GPU for the CUDA executor; see ``device_sampling``)
             update_from_output(tokens)                 -> finished requests free their blocks
             detokenize, stop strings (finish_request)  -> list[RequestOutput] (deltas + totals)

A request asking for ``n > 1`` completions is ``n`` scheduler requests (``{id}#{i}``) under one
group id; they are admitted together, so the prefix cache computes the shared prompt blocks once.
Every ``RequestOutput`` of a group carries all ``n`` completions: cumulative text and tokens, and
this step's delta.

``LLMEngine`` is single-threaded: only one thread may call it. ``AsyncEngine`` runs the step loop on
its own thread and hands outputs to per-request asyncio queues through ``loop.call_soon_threadsafe``;
adds and aborts reach the engine thread through a command list, so the scheduler is only ever
touched by that thread.

**Device sampling.** A step whose sampling rows all ask for plain greedy decoding (temperature 0, no
penalties, no logprobs; ``_Seq.device_greedy``), or that samples no row, calls ``executor.greedy_tokens``
instead of ``executor.run``: the CUDA executor takes the argmax on the GPU and copies back ``S`` ids instead of
the ``f32[S, vocab]`` logits (33 MB at 64 rows of a 128k vocabulary), and the host sampler is skipped. The ids
are numpy's argmax of the same logits (first index on ties, NaN first), so the tokens are those of the host
path; any other step (one row sampling, with penalties or logprobs) runs the host path unchanged.
``EngineArgs.device_sampling`` (default: on, unless ``INGOT_DEVICE_SAMPLING=0``) switches it; executors without
``greedy_tokens`` (tensor parallelism, test stand-ins) always take the host path.

**Decode steps** (opt-in: ``EngineArgs.decode_steps`` or ``INGOT_DECODE_STEPS=K``; default 1, off). A step whose rows
are all decode tokens sampled on the device (as above) runs ``K`` decode steps back to back in one executor call,
``executor.greedy_tokens_steps``: step ``j + 1``'s input ids are step ``j``'s argmax, fed on the device (the CUDA
executor runs the ``K`` steps as one CUDA graph and copies ``K x S`` ids back once; runtime/cuda_steps.py), positions,
slots and sequence lengths are computed up front (``Scheduler.plan_decode_steps``, which allocates the blocks of the
``K - 1`` extra tokens). The host work of ``K - 1`` steps disappears behind the GPU. The engine then takes the tokens
one step at a time with its usual stop checks (eos, stop token ids, max_tokens, stop strings): tokens after a stop are
discarded and their blocks freed with the request. ``K`` is cut to the fewest tokens a row may still generate; a step
runs alone whenever the plan does not fit: a row sampling otherwise (temperature, penalties, logprobs), a prefill chunk,
a waiting request that could join (a seat free among ``max_num_seqs``), too few free blocks, fewer than 2 tokens left,
tensor parallelism, or an executor without ``greedy_tokens_steps``. Outputs arrive in bursts of up to ``K`` tokens (one
``RequestOutput`` per request and step; the inter-token latencies recorded are the ones a client sees: one gap, then
zeros).

**Overlap** (``EngineArgs.decode_overlap``; default: on for ``device="cuda"``, off on the CPU backend;
``INGOT_DECODE_OVERLAP=0``/``1`` sets it). A step that runs device-sampled decode steps (the plan above, ``K`` >= 1)
queues them (``executor.submit_greedy_steps``), then queues the steps that follow them before their tokens are known
(``Scheduler.plan_next_decode_steps``: the same rows one plan further, step 0 fed on the device with the last ids), and
only then waits for the first plan's ids (``executor.collect_greedy_steps``) and takes them. The next ``step()`` finds
that second plan in flight: it queues a third, takes the second, and so on. So the GPU always has the next plan queued
while the host takes tokens, detokenizes and schedules, and the host's time per step leaves the GPU's critical path. The
chain stops (the plan in flight is only taken, and the next ``step()`` schedules as usual) when a waiting request could
join (it would otherwise wait for ever), when one of the rows stopped or was aborted, or when the free blocks do not
hold the next plan. A row that stops inside a plan has computed the plan after it for nothing: those tokens are
discarded with its blocks (never published, so no other request reads them). Outputs and tokens are those of the engine
without overlap, with one caveat on the GPU: the rows that go on after another stopped run one plan longer in the larger
batch's graph (a bucket's kernels may round differently from a smaller one's, as with ``K`` itself). A stopping row
costs one plan of wasted work. Executors without ``submit_greedy_steps`` run without overlap.

Host time per step (bench/bench_engine_step.py, docs/PERF.md): ~1.2 ms for 256 decoding sequences,
the model excluded. Per request and step: one ``DecodeStream`` call (detokenizer.py), one
``CompletionOutput`` and ``RequestOutput`` that share the sequence's token list instead of copying
it, and the inter-token latencies go to the metrics as one batch.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .detokenizer import IncrementalDetokenizer
from .kv_cache import num_blocks_for_memory
from .request import Request, RequestStatus
from .sampling import Sampler, SamplingParams, TokenLogprobs
from .scheduler import CacheConfig, DecodeSteps, Scheduler, SchedulerConfig

log = logging.getLogger("ingot.engine")

DEFAULT_KV_CACHE_BYTES = 1 << 30  # CPU backend: at most this much (and half the available memory)

#: engines whose load froze the collector (``hold_gc_freeze``); the freeze ends when the last of them closes
_gc_holders: weakref.WeakSet[Any] = weakref.WeakSet()


def freeze_gc() -> None:
    """``gc.collect(); gc.freeze()``: the objects alive now (an engine's graph, executor, cache and block pool, the
    server) leave the collector's generations, so a full (generation-2) collection no longer walks them in the middle
    of a step. Unfrozen, one took 42-47 ms about every 100 decode steps of the 1B model's engine at batch 256 (2.7 ms
    steps: a timed window of 32 steps that caught one measured 0.45-0.7x the others; docs/PERF.md "A full garbage
    collection in the timed steps"). ``LLMEngine`` calls it once loaded on the GPU (``hold_gc_freeze``),
    ``AsyncEngine`` after its first (warm-up) step."""
    gc.collect()
    gc.freeze()


_gc_frozen_once = False


def freeze_gc_once() -> None:
    """``freeze_gc()`` the first time it is called in a process."""
    global _gc_frozen_once
    if not _gc_frozen_once:
        _gc_frozen_once = True
        freeze_gc()


def hold_gc_freeze(holder: Any) -> None:
    """``freeze_gc()`` for ``holder`` (an engine), which gives it back with ``release_gc_freeze``."""
    freeze_gc()
    _gc_holders.add(holder)


def release_gc_freeze(holder: Any) -> None:
    """``holder`` no longer needs the freeze; when no live holder does, ``gc.unfreeze()``: the frozen objects go back
    to the oldest generation, so the closed engines' reference cycles can be collected (a frozen cycle never is)."""
    if holder in _gc_holders:
        _gc_holders.discard(holder)
        if not _gc_holders:
            gc.unfreeze()


class EngineRequestError(ValueError):
    """A request the engine cannot take; ``param`` names the offending field (OpenAI's ``param``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class QueueFullError(RuntimeError):
    """Too many requests are waiting; retry later."""


@dataclass
class EngineArgs:
    """How to size and run the engine. ``num_blocks`` None: from ``kv_cache_bytes`` (None: a default)."""

    num_blocks: int | None = None
    kv_cache_bytes: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: the model's context length, capped by the cache
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    block_size: int | None = None  # None: the artifact's; the CPU backend takes any (its cache shape says it)
    device_sampling: bool | None = None  # greedy steps' argmax on the executor; None: on unless INGOT_DEVICE_SAMPLING=0
    decode_steps: int | None = None  # decode steps per engine step (module docstring); None: INGOT_DECODE_STEPS or 1
    decode_overlap: bool | None = None  # queue the next decode steps before taking tokens (module docstring, "Overlap")


def device_sampling_default() -> bool:
    """``EngineArgs.device_sampling`` when not given: on, unless the environment sets ``INGOT_DEVICE_SAMPLING=0``
    (to compare against the host path without changing code)."""
    return os.environ.get("INGOT_DEVICE_SAMPLING", "1").strip().lower() not in ("0", "false", "off", "no")


def decode_steps_default() -> int:
    """``EngineArgs.decode_steps`` when not given: ``INGOT_DECODE_STEPS`` (a positive integer), else 1 (off)."""
    raw = os.environ.get("INGOT_DECODE_STEPS", "").strip()
    if not raw:
        return 1
    try:
        k = int(raw)
    except ValueError:
        k = 0
    if k < 1:
        raise ValueError(f"INGOT_DECODE_STEPS={raw!r}: a positive integer (1: one decode step per engine step)")
    return k


def decode_overlap_default(device: str) -> bool:
    """``EngineArgs.decode_overlap`` when not given: ``INGOT_DECODE_OVERLAP`` (``0``/``false``/``off``/``no``: off,
    ``1``/``true``/``on``/``yes``: on), else on for ``device="cuda"`` and off on the CPU backend, where nothing runs
    beside the host and a stopping row's wasted plan would only cost time."""
    raw = os.environ.get("INGOT_DECODE_OVERLAP", "").strip().lower()
    if not raw:
        return device == "cuda"
    if raw in ("0", "false", "off", "no"):
        return False
    if raw in ("1", "true", "on", "yes"):
        return True
    raise ValueError(f"INGOT_DECODE_OVERLAP={raw!r}: use 1 (on) or 0 (off), or leave it unset (on for the GPU)")


def check_prompt_length(prompt_token_ids: Sequence[int], params: SamplingParams, vocab_size: int,
                        max_model_len: int) -> int:
    """A request's prompt ids and length against the model; returns its ``max_tokens``.

    Shared by the engine and the disaggregation router, which answer bad requests the same way.
    """
    n = len(prompt_token_ids)
    if n == 0:
        raise EngineRequestError("the prompt is empty", "prompt")
    if any(not 0 <= int(t) < vocab_size for t in prompt_token_ids):
        raise EngineRequestError(f"prompt token ids must be in [0, {vocab_size})", "prompt")
    if n >= max_model_len:
        raise EngineRequestError(
            f"this model's maximum context length is {max_model_len} tokens; the prompt has {n} tokens "
            "(at least one must be left to generate)", "prompt")
    max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len - n
    if n + max_tokens > max_model_len:
        raise EngineRequestError(
            f"this model's maximum context length is {max_model_len} tokens; you requested "
            f"{n + max_tokens} tokens ({n} in the prompt, {max_tokens} for the completion)", "max_tokens")
    return max_tokens


class CompletionOutput:
    """One of a request's ``n`` completions: totals so far and this step's delta.

    The engine does not copy a sequence's whole token (and logprob) list into every step's output: it hands
    out the list with its length at this step, copied on first read of ``token_ids`` (``logprobs``). Those
    lists only grow, so a later read, from any thread, still gives this step's totals.
    """

    __slots__ = ("index", "text", "_token_ids", "_num_token_ids", "_logprobs", "_num_logprobs", "finish_reason",
                 "stop_reason", "delta_text", "delta_token_ids", "delta_logprobs")
    _FIELDS = ("index", "text", "token_ids", "logprobs", "finish_reason", "stop_reason", "delta_text",
               "delta_token_ids", "delta_logprobs")

    def __init__(self, index: int, text: str = "", token_ids: list[int] | None = None,
                 logprobs: list[TokenLogprobs] | None = None,
                 finish_reason: str | None = None,  # "stop", "length", "abort"; None while running
                 stop_reason: int | str | None = None,  # the stop token id or stop string that ended it
                 delta_text: str = "", delta_token_ids: list[int] | None = None,
                 delta_logprobs: list[TokenLogprobs] | None = None, *,
                 num_token_ids: int | None = None, num_logprobs: int | None = None) -> None:
        """``num_token_ids`` (``num_logprobs``): the totals are the first that many of ``token_ids``
        (``logprobs``), a list that may grow meanwhile; None: all of it."""
        self.index = index
        self.text = text
        self._token_ids = [] if token_ids is None else token_ids
        self._num_token_ids = num_token_ids
        self._logprobs = logprobs
        self._num_logprobs = num_logprobs
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self.delta_text = delta_text
        self.delta_token_ids = [] if delta_token_ids is None else delta_token_ids
        self.delta_logprobs = delta_logprobs

    @property
    def token_ids(self) -> list[int]:
        if self._num_token_ids is not None:
            self._token_ids, self._num_token_ids = self._token_ids[: self._num_token_ids], None
        return self._token_ids

    @token_ids.setter
    def token_ids(self, value: list[int]) -> None:
        self._token_ids, self._num_token_ids = value, None

    @property
    def logprobs(self) -> list[TokenLogprobs] | None:
        if self._num_logprobs is not None:
            self._logprobs, self._num_logprobs = self._logprobs[: self._num_logprobs], None
        return self._logprobs

    @logprobs.setter
    def logprobs(self, value: list[TokenLogprobs] | None) -> None:
        self._logprobs, self._num_logprobs = value, None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def __eq__(self, other: object) -> bool:
        if type(other) is not CompletionOutput:
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self._FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable, like a dataclass

    def __repr__(self) -> str:
        return f"CompletionOutput({', '.join(f'{f}={getattr(self, f)!r}' for f in self._FIELDS)})"


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache (first completion)
    arrival_time: float = 0.0
    first_token_time: float | None = None
    error: str | None = None  # set when the engine failed this request (AsyncEngine)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)


@dataclass
class Prefilled:
    """What a prefill worker computed for a request: its first token(s) and the prompt's KV in this engine's
    cache layout, token-major (``[layers, 2, prompt_len, kv_heads, head_dim]``; None: recompute it here).

    ``kv_blocks`` (instead of ``kv``): the KV as blocks of this engine's block size, dtype and heads,
    ``[layers, ceil(prompt_len / block_size), 2, block_size, kv_heads, head_dim]``, in a device buffer on this
    engine's GPU (``runtime.disagg.device.DeviceBlocks``, from the NCCL transport). The engine copies it into
    the request's blocks and releases it, also when the request cannot use it."""

    output_token_ids: list[int]
    kv: np.ndarray | None = None
    logprobs: list[TokenLogprobs] | None = None
    kv_blocks: Any = None


class _Group:
    __slots__ = ("request_id", "prompt_token_ids", "seqs", "arrival_time", "first_token_time", "num_unfinished")

    def __init__(self, request_id: str, prompt_token_ids: list[int], arrival_time: float) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.seqs: list[_Seq] = []
        self.arrival_time = arrival_time
        self.first_token_time: float | None = None
        self.num_unfinished = 0


class _Seq:
    """One scheduler request's engine-side state; also the sampler's ``SamplingSequence``."""

    __slots__ = ("request", "index", "sampling_params", "generator", "prompt_token_ids", "output_token_ids",
                 "detok", "pending_text", "logprobs", "finish_reason", "stop_reason", "last_token_time", "delta_start",
                 "delta_logprobs_start", "group", "device_greedy")

    def __init__(self, request: Request, index: int, params: SamplingParams,
                 detok: IncrementalDetokenizer | None, group: _Group) -> None:
        self.group = group
        self.request = request
        self.index = index
        self.sampling_params = params
        #: the token is the argmax of the raw logits (no penalties) and nothing else of them is returned
        self.device_greedy = params.greedy and not params.has_penalties and params.logprobs is None
        self.generator = params.make_generator(index)
        self.prompt_token_ids = request.prompt_token_ids
        self.output_token_ids = request.output_token_ids
        self.detok = detok
        self.pending_text = ""  # text decoded since the last output
        self.logprobs: list[TokenLogprobs] | None = [] if params.logprobs is not None else None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.last_token_time = 0.0
        self.delta_start = 0
        self.delta_logprobs_start = 0


def _default_kv_bytes() -> int:
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return DEFAULT_KV_CACHE_BYTES
    return max(1 << 26, min(DEFAULT_KV_CACHE_BYTES, avail // 2))


class LLMEngine:
    """An LLM artifact (serving form) with its KV cache, scheduler and sampler, on the CPU backend or, with
    ``device="cuda"``, on the first GPU (``runtime/cuda_backend.py``: the artifact must be compiled for the GPU's
    target). On the GPU the executor owns the KV cache (no host cache is allocated): its block count is
    ``num_blocks``, else what ``kv_cache_bytes`` holds, else a share of the free GPU memory capped at what
    ``max_num_seqs`` full-length sequences need; ``max_num_seqs``, ``max_num_batched_tokens`` and the context
    are clamped to the bounds the artifact was compiled for."""

    def __init__(self, artifact: str | os.PathLike, args: EngineArgs | None = None, *, device: str = "cpu",
                 metrics: Any = None, **kwargs: Any) -> None:
        from ..ir.types import DType
        from .artifact import load_graph
        from .cpu import CpuExecutor

        if device not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {device!r}; use 'cpu' or 'cuda'")
        args = args or EngineArgs(**kwargs)
        self.device = device
        self.path = Path(artifact)
        #: greedy steps take their ids from ``executor.greedy_tokens`` (module docstring, "Device sampling")
        self.device_sampling = device_sampling_default() if args.device_sampling is None else args.device_sampling
        #: decode steps one engine step may run (module docstring, "Decode steps"); 1: one; may be changed between steps
        self.decode_steps = decode_steps_default() if args.decode_steps is None else int(args.decode_steps)
        if self.decode_steps < 1:
            raise ValueError(f"decode_steps must be >= 1, got {self.decode_steps}")
        #: queue the next decode steps before taking a plan's tokens (module docstring, "Overlap"); may be changed
        #: between steps
        self.decode_overlap = (decode_overlap_default(device) if args.decode_overlap is None
                               else bool(args.decode_overlap))
        #: the decode steps queued by the last ``step()`` and their executor ticket, taken by the next ``step()``
        self._inflight: tuple[DecodeSteps, Any] | None = None
        from .tp.artifact import is_tp_artifact, load_tp

        #: a tensor-parallel artifact: ``self.executor`` is a ``TpExecutor`` (runtime/tp) owning the ranks' caches
        self.tp = is_tp_artifact(self.path)
        self.graph, self.manifest = load_tp(self.path) if self.tp else load_graph(self.path)
        spec = self.manifest.get("kv_cache") or self.graph.meta.get("kv_cache")
        info = self.manifest.get("llm") or self.graph.meta.get("llm") or {}
        if self.manifest.get("mode") != "llm" or not isinstance(spec, dict):
            raise ValueError(f"{self.path}: not an LLM artifact (mode {self.manifest.get('mode')!r}); compile a "
                             "decoder in mode 'llm'")
        self.model_name = self.path.name.removesuffix(".ingot") or "model"
        self.block_size = int(args.block_size or spec["block_size"])
        self.vocab_size = int(info.get("vocab_size") or self.graph.outputs[0].type.shape[-1])
        self.eos_token_ids: tuple[int, ...] = tuple(info.get("eos_token_ids") or ())
        bytes_per_token = int(spec["bytes_per_token"])
        self.executor: Any = None
        if device == "cuda":
            args = self._cuda_executor(args, spec, info, bytes_per_token)
            num_blocks = self.executor.num_blocks
        else:
            num_blocks = args.num_blocks or num_blocks_for_memory(
                args.kv_cache_bytes or _default_kv_bytes(), bytes_per_token, self.block_size, fraction=1.0)
        if num_blocks < 1:
            raise ValueError("the KV cache budget holds no block; raise num_blocks or kv_cache_bytes")
        self.args = args
        self.num_blocks = num_blocks
        context = int(info.get("context_length") or num_blocks * self.block_size)
        self.max_model_len = min(args.max_model_len or context, context, num_blocks * self.block_size)
        shape = (num_blocks, 2, self.block_size, int(spec["num_kv_heads"]), int(spec["head_dim"]))
        dtype = DType(spec["dtype"]).np
        if self.tp and device == "cpu":
            from .tp.executor import TpExecutor

            self.executor = TpExecutor(self.path, device="cpu", num_blocks=num_blocks, block_size=self.block_size)
        owned = device == "cuda" or self.tp  # the executor owns the KV cache
        self.kv_caches = {} if owned else {name: np.zeros(shape, dtype) for name in spec["inputs"]}
        self.scheduler = Scheduler(
            SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                            max_model_len=self.max_model_len,
                            long_prefill_token_threshold=args.long_prefill_token_threshold, policy=args.policy),
            CacheConfig(num_blocks=num_blocks, block_size=self.block_size,
                        enable_prefix_caching=args.enable_prefix_caching),
        )
        if self.executor is None:
            self.executor = CpuExecutor(self.graph)
        self.sampler = Sampler()
        self.tokenizer = self._load_tokenizer()
        self.metrics = metrics
        self._seqs: dict[str, _Seq] = {}  # scheduler request id -> state
        self._groups: dict[str, _Group] = {}
        self._ids = itertools.count()
        #: prefilled requests (disaggregated serving) started from their transferred KV / recomputing their prompt
        self.num_prefilled_admitted = 0
        self.num_prefilled_recomputed = 0
        #: model steps whose tokens came from ``executor.greedy_tokens(_steps)`` (no logits on the host)
        self.num_device_sampled_steps = 0
        #: engine steps that ran several decode steps in one ``executor.greedy_tokens_steps`` call
        self.num_multi_steps = 0
        #: plans of decode steps queued before the previous plan's tokens were taken (module docstring, "Overlap")
        self.num_overlapped_plans = 0
        if device == "cuda":
            # a full collection walking the loaded graph stalls the GPU's next step by tens of ms (``freeze_gc``);
            # the CPU backend's steps are long enough not to mind, and its engines (tests) are not always closed
            hold_gc_freeze(self)

    def _cuda_executor(self, args: EngineArgs, spec: dict[str, Any], info: dict[str, Any],
                       bytes_per_token: int) -> EngineArgs:
        """Make ``self.executor`` (a ``CudaExecutor``) and return ``args`` clamped to the artifact's bounds."""
        import dataclasses

        from .cuda_backend import CudaExecutor

        if self.block_size != int(spec["block_size"]):
            raise ValueError(f"block_size {self.block_size}: the GPU backend uses the artifact's "
                             f"({spec['block_size']}); recompile to change it")
        cuda = self.manifest.get("cuda")
        bounds = cuda.get("memory_plan", {}).get("bindings", {}) if isinstance(cuda, dict) else {}
        max_seqs = min(args.max_num_seqs, int(bounds.get("S", args.max_num_seqs)))
        max_tokens = min(args.max_num_batched_tokens, int(bounds.get("T", args.max_num_batched_tokens)))
        context = int(info.get("context_length") or 0) or None
        cap_len = int(bounds["max_blocks"]) * self.block_size if "max_blocks" in bounds else None
        lens = [x for x in (args.max_model_len, context, cap_len) if x]
        max_len = min(lens) if lens else None
        num_blocks = args.num_blocks
        if num_blocks is None and args.kv_cache_bytes is None and max_len:
            # enough for max_num_seqs full-length sequences (+1), unless the free-memory share is smaller
            want = max_seqs * -(-max_len // self.block_size) + 1
            per_block = bytes_per_token * self.block_size
            from .cuda_driver import Context

            free = Context(0).mem_info()[0]
            num_blocks = max(1, min(want, int(free * 0.5) // max(per_block, 1)))
        if self.tp:
            from .tp.executor import TpExecutor

            self.executor = TpExecutor(self.path, device="cuda", num_blocks=num_blocks,
                                       kv_cache_bytes=args.kv_cache_bytes)
        else:
            self.executor = CudaExecutor(self.graph, self.manifest, self.path, num_blocks=num_blocks,
                                         kv_cache_bytes=args.kv_cache_bytes, device_argmax=self.device_sampling)
        return dataclasses.replace(args, max_num_seqs=max_seqs, max_num_batched_tokens=max_tokens,
                                   max_model_len=max_len)

    def close(self) -> None:
        """Free the GPU executor's memory (``device="cuda"``) and stop a tensor-parallel model's worker
        processes; the engine is unusable afterwards."""
        self._drop_inflight()
        if (self.device == "cuda" or self.tp) and self.executor is not None:
            self.executor.close()
            self.executor = None
        release_gc_freeze(self)

    def _load_tokenizer(self) -> Any:
        if not (self.path / "tokenizer.json").is_file():
            return None
        from .tokenizer import Tokenizer

        return Tokenizer(self.path)

    # -- requests ---------------------------------------------------------------------------------

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise EngineRequestError("this model has no tokenizer: pass token ids, not text", "prompt")
        return self.tokenizer.encode(prompt)

    def check_request(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> int:
        """Validate a request against the model and the cache; returns its ``max_tokens``. Reads no
        mutable state, so any thread may call it."""
        n = len(prompt_token_ids)
        max_tokens = check_prompt_length(prompt_token_ids, params, self.vocab_size, self.max_model_len)
        if params.n > self.args.max_num_seqs:
            raise EngineRequestError(f"n must be at most max_num_seqs ({self.args.max_num_seqs})", "n")
        if -(-(n + max_tokens - 1) // self.block_size) > self.num_blocks:
            raise EngineRequestError(f"the request needs more KV cache blocks than the cache has ({self.num_blocks})",
                                     "max_tokens")
        return max_tokens

    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, priority: int = 0, arrival_time: float | None = None,
                    prefilled: Prefilled | None = None) -> str:
        """Queue a request (text or token ids); returns its id. Raises ``EngineRequestError`` if it cannot run.

        ``prefilled``: the prompt's KV and first token were computed elsewhere (disaggregated serving);
        the request starts running from them (see ``_admit_prefilled``).
        """
        if prefilled is not None and prefilled.kv_blocks is not None:
            try:  # the device buffer goes back to its pool whatever happens to the request
                return self._add_request(prompt, params, request_id, priority, arrival_time, prefilled)
            finally:
                prefilled.kv_blocks.release()
        return self._add_request(prompt, params, request_id, priority, arrival_time, prefilled)

    def _add_request(self, prompt: str | Sequence[int], params: SamplingParams | None, request_id: str | None,
                     priority: int, arrival_time: float | None, prefilled: Prefilled | None) -> str:
        params = params or SamplingParams()
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        max_tokens = self.check_request(ids, params)
        if prefilled is not None:
            if params.n != 1:
                raise EngineRequestError("a prefilled request must have n = 1", "n")
            rid = request_id if request_id is not None else f"req-{next(self._ids)}"
            if rid in self._groups:
                raise EngineRequestError(f"request id {rid!r} is in use")
            return self._admit_prefilled(rid, ids, params, max_tokens, priority, arrival_time, prefilled)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._groups:
            raise EngineRequestError(f"request id {rid!r} is in use")
        group = _Group(rid, ids, time.monotonic() if arrival_time is None else arrival_time)
        eos = None if params.ignore_eos or not self.eos_token_ids else self.eos_token_ids[0]
        stops = tuple(params.stop_token_ids) + (() if params.ignore_eos else self.eos_token_ids[1:])
        added: list[str] = []
        try:
            for i in range(params.n):
                sid = rid if params.n == 1 else f"{rid}#{i}"
                req = Request(sid, ids, max_tokens=max_tokens, eos_token_id=eos, stop_token_ids=stops,
                              priority=priority, arrival_time=group.arrival_time, sampling_params=params)
                self.scheduler.add_request(req)
                added.append(sid)
                detok = None
                if self.tokenizer is not None:
                    detok = IncrementalDetokenizer.from_params(self.tokenizer, params, ids)
                seq = _Seq(req, i, params, detok, group)
                self._seqs[sid] = seq
                group.seqs.append(seq)
        except ValueError as e:
            for sid in added:
                self.scheduler.abort_request(sid)
                self._seqs.pop(sid, None)
            raise EngineRequestError(str(e), "max_tokens") from None
        group.num_unfinished = params.n
        self._groups[rid] = group
        return rid

    def _admit_prefilled(self, rid: str, ids: list[int], params: SamplingParams, max_tokens: int, priority: int,
                         arrival_time: float | None, pre: Prefilled) -> str:
        """Start a request whose prompt KV (``pre.kv``: ``[layers, 2, len(ids), kv_heads, head_dim]`` in this
        cache's dtype) and first token came from a prefill worker: it joins the running set holding blocks with
        that KV, its first token already generated (not streamed again). When the cache has no room it waits
        like a preempted request and recomputes its tokens instead."""
        sched = self.scheduler
        n = len(ids)
        eos = None if params.ignore_eos or not self.eos_token_ids else self.eos_token_ids[0]
        stops = tuple(params.stop_token_ids) + (() if params.ignore_eos else self.eos_token_ids[1:])
        now = time.monotonic()
        group = _Group(rid, ids, now if arrival_time is None else arrival_time)
        req = Request(rid, ids, max_tokens=max_tokens, eos_token_id=eos, stop_token_ids=stops, priority=priority,
                      arrival_time=group.arrival_time, sampling_params=params)
        try:
            sched._check_fits(req)
        except ValueError as e:
            raise EngineRequestError(str(e), "max_tokens") from None
        device_kv = pre.kv_blocks  # released by add_request
        kv = None if self.tp else pre.kv  # TP caches are split over the ranks: recompute the prompt there
        bs = self.block_size
        nb = -(-n // bs)
        if device_kv is not None and not self.tp:
            want = (len(self._kv_layers()), nb, 2, bs, *self._kv_block_tail())
            if tuple(device_kv.shape) != want or device_kv.dtype != self._kv_dtype():
                raise EngineRequestError(f"prefilled KV blocks {device_kv.dtype}{list(device_kv.shape)}; this cache "
                                         f"needs {self._kv_dtype()}{list(want)}", "prompt")
        elif device_kv is not None:
            device_kv = None
        admitted = False
        if (kv is not None or device_kv is not None) and len(sched.running) < sched.config.max_num_seqs:
            if kv is not None and kv.shape[2] != n:
                raise EngineRequestError(f"prefilled KV holds {kv.shape[2]} tokens, the prompt has {n}", "prompt")
            if sched.kv.allocate_slots(req, n) is not None:
                blocks = np.asarray(sched.kv.get_block_ids(rid)[:nb], np.intp)
                if device_kv is not None and self.device == "cuda":
                    self.executor.copy_kv_blocks_in(blocks.tolist(), device_kv.ptr)
                else:
                    if device_kv is not None:  # the CPU backend: a host-memory stand-in (tests)
                        padded = device_kv.to_host(release=False)
                    else:
                        padded = np.zeros((kv.shape[0], 2, nb * bs) + kv.shape[3:], kv.dtype)
                        padded[:, :, :n] = kv
                        padded = padded.reshape(kv.shape[0], 2, nb, bs, *kv.shape[3:]).swapaxes(1, 2)
                    if self.device == "cuda":
                        self.executor.write_kv_blocks(blocks.tolist(), np.ascontiguousarray(padded))
                    else:
                        for layer, cache in enumerate(self.kv_caches.values()):
                            cache[blocks] = padded[layer]
                req._seq = sched._seq
                sched._seq += 1
                req.num_computed_tokens = req.num_cached_tokens = n
                req.status = RequestStatus.RUNNING
                sched.requests[rid] = req
                sched.running.append(req)
                sched._joined.append(rid)
                admitted = True
        for t in pre.output_token_ids:
            req.append_output_token(int(t))
        if admitted:
            self.num_prefilled_admitted += 1
        else:
            self.num_prefilled_recomputed += 1
            sched.add_request(req)  # recomputes prompt + first token(s) when scheduled, like a preempted request
        detok = IncrementalDetokenizer.from_params(self.tokenizer, params, ids) if self.tokenizer else None
        seq = _Seq(req, 0, params, detok, group)
        if detok is not None:
            detok.push(list(req.output_token_ids))  # already streamed by the prefill worker
        if seq.logprobs is not None and pre.logprobs:
            seq.logprobs.extend(pre.logprobs)
        if not params.greedy and seq.generator is not None:
            for _ in req.output_token_ids:  # the draws the prefill worker made: seeded streams match one engine
                seq.generator.random()
        seq.delta_start = len(req.output_token_ids)
        seq.delta_logprobs_start = len(seq.logprobs) if seq.logprobs is not None else 0
        seq.last_token_time = group.first_token_time = now
        self._seqs[rid] = seq
        group.seqs.append(seq)
        group.num_unfinished = 1
        self._groups[rid] = group
        return rid

    def _export_block_ids(self, request_id: str, num_tokens: int | None) -> list[int]:
        req = self.scheduler.get_request(request_id)
        if req is None:
            raise KeyError(f"no unfinished request {request_id!r}")
        if self.tp:
            raise NotImplementedError("export_kv of a tensor-parallel model: its KV cache is split over the ranks")
        n = req.num_computed_tokens if num_tokens is None else num_tokens
        return [int(b) for b in self.scheduler.kv.get_block_ids(request_id)[: -(-n // self.block_size)]]

    def export_kv(self, request_id: str, num_tokens: int | None = None) -> np.ndarray:
        """A copy of the request's KV blocks holding its first ``num_tokens`` (default: computed) tokens:
        ``[layers, blocks, 2, block_size, kv_heads, head_dim]``, this cache's dtype."""
        ids = self._export_block_ids(request_id, num_tokens)
        if self.device == "cuda":
            return self.executor.read_kv_blocks(ids)
        idx = np.asarray(ids, np.intp)
        return np.stack([cache[idx] for cache in self.kv_caches.values()])

    def export_kv_device(self, request_id: str, num_tokens: int | None, pool: Any) -> Any:
        """``export_kv`` into a buffer from ``pool`` (``runtime.disagg.device.BufferPool``): a ``DeviceBlocks``
        on this engine's GPU, copied on the executor's stream (so before the next step may reuse the blocks).
        On the CPU backend the pool's memory is host memory (tests)."""
        from .disagg.device import DeviceBlocks

        ids = self._export_block_ids(request_id, num_tokens)
        out = DeviceBlocks.allocate(pool, (len(self._kv_layers()), len(ids), 2, self.block_size,
                                           *self._kv_block_tail()), self._kv_dtype())
        try:
            if self.device == "cuda":
                self.executor.copy_kv_blocks_out(ids, out.ptr)
            else:
                idx = np.asarray(ids, np.intp)
                pool.write(out.ptr, np.stack([cache[idx] for cache in self.kv_caches.values()]))
        except BaseException:
            out.release()
            raise
        return out

    def _kv_layers(self) -> list[str]:
        return list(self.executor.kv_inputs) if self.device == "cuda" else list(self.kv_caches)

    def _kv_block_tail(self) -> tuple[int, int]:
        """``(kv_heads, head_dim)`` of this engine's cache."""
        spec = self.manifest.get("kv_cache") or self.graph.meta["kv_cache"]
        return int(spec["num_kv_heads"]), int(spec["head_dim"])

    def _kv_dtype(self) -> np.dtype:
        if self.device == "cuda":
            return self.executor.kv_dtype
        return next(iter(self.kv_caches.values())).dtype

    def detach(self, request_id: str) -> bool:
        """Drop a request and free its blocks without counting it as aborted (its KV went elsewhere)."""
        group = self._groups.pop(request_id, None)
        if group is None:
            return False
        for seq in group.seqs:
            self.scheduler.abort_request(seq.request.request_id)
            self._seqs.pop(seq.request.request_id, None)
        return True

    def abort(self, request_id: str) -> bool:
        """Cancel a request (all its completions) and free its blocks; False if it is unknown or done."""
        group = self._groups.pop(request_id, None)
        if group is None:
            return False
        for seq in group.seqs:
            self.scheduler.abort_request(seq.request.request_id)
            self._seqs.pop(seq.request.request_id, None)
        if self.metrics is not None:
            self.metrics.request_finished("abort")
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self._groups)

    @property
    def num_requests(self) -> int:
        return len(self._groups)

    # -- the step ---------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, sample, update; returns the outputs of requests that progressed."""
        if self._inflight is not None:
            plan, ticket = self._inflight
            self._inflight = None
            results = self._run_overlapped(plan, ticket, time.monotonic())
            if results or self._inflight is not None:
                return results
            # the plan in flight gave nothing (its requests were all aborted): schedule now rather than return nothing
        sched = self.scheduler
        out = sched.schedule()
        t_start = time.monotonic()
        if out.is_empty:
            self._record(t_start, 0, 0)
            return []
        rows = np.flatnonzero(out.do_sample)
        seqs = [self._seqs[out.req_ids[r]] for r in rows.tolist()]
        greedy_tokens = self._greedy_tokens(seqs)
        if greedy_tokens is not None and not self.tp:
            submit = self._overlap_submit()
            if submit is not None:
                plan = sched.plan_decode_steps(out, self.decode_steps, min_steps=1)
                if plan is not None:
                    return self._run_overlapped(plan, submit(self._plan_feeds(plan), chained=False), t_start)
            steps_fn = getattr(self.executor, "greedy_tokens_steps", None) if self.decode_steps > 1 else None
            plan = sched.plan_decode_steps(out, self.decode_steps) if steps_fn is not None else None
            if plan is not None:
                return self._run_decode_steps(plan, steps_fn, t_start)
        feeds = out.step_inputs.as_feeds()
        feeds.update(self.kv_caches)
        tokens = np.zeros(len(out.req_ids), np.int64)
        logprobs: list[TokenLogprobs | None] = []
        if greedy_tokens is not None:
            ids = greedy_tokens(feeds)
            tokens[rows] = ids[rows]
            self.num_device_sampled_steps += 1
        else:
            logits = self.executor.run(feeds, check=False)["logits"]
            if len(rows):
                sampled = self.sampler(logits[rows] if len(rows) < len(out.req_ids) else logits, seqs)
                tokens[rows] = sampled.token_ids
                logprobs = sampled.logprobs
        lp_by_id = ({out.req_ids[r]: lp for r, lp in zip(rows.tolist(), logprobs) if lp is not None}
                    if any(lp is not None for lp in logprobs) else {})
        updated = sched.update_from_output(out, tokens)
        touched: dict[str, _Group] = {}
        itl: list[float] = []
        ttft: list[float] = []
        self._take_tokens(updated, lp_by_id, time.monotonic(), touched, itl, ttft)
        results = [self._make_output(g) for g in touched.values()]
        self._record(t_start, len(updated), out.total_num_scheduled_tokens, itl, ttft,
                     [r for r in results if r.finished])
        return results

    def _plan_feeds(self, plan: DecodeSteps) -> list[dict[str, np.ndarray]]:
        feeds = []
        for step_inputs in plan.step_inputs:
            f = step_inputs.as_feeds()
            f.update(self.kv_caches)
            feeds.append(f)
        return feeds

    def _run_decode_steps(self, plan: DecodeSteps, steps_fn: Callable[[list[Any]], np.ndarray],
                          t_start: float) -> list[RequestOutput]:
        """Run ``plan``'s decode steps in one executor call, then take their tokens step by step (module
        docstring, "Decode steps")."""
        ids = steps_fn(self._plan_feeds(plan))  # [K, S]
        self.num_multi_steps += 1
        return self._take_plan(plan, ids, t_start)

    def _overlap_submit(self) -> Callable[..., Any] | None:
        """The executor's ``submit_greedy_steps`` when the overlap is on (module docstring, "Overlap"), else None."""
        if not self.decode_overlap or self.tp:
            return None
        return getattr(self.executor, "submit_greedy_steps", None)

    def _run_overlapped(self, plan: DecodeSteps, ticket: Any, t_start: float) -> list[RequestOutput]:
        """``plan`` is queued (``ticket``): queue the plan after it when the chain goes on, then wait for ``plan``'s
        ids and take them (module docstring, "Overlap"). The plan queued here is the next ``step()``'s."""
        submit = self._overlap_submit() if self.device_sampling else None
        nxt = self.scheduler.plan_next_decode_steps(plan, self.decode_steps) if submit is not None else None
        if nxt is not None:
            self._inflight = (nxt, submit(self._plan_feeds(nxt), chained=True))
            self.num_overlapped_plans += 1
        ids = self.executor.collect_greedy_steps(ticket)  # [K, S]
        if plan.num_steps > 1:
            self.num_multi_steps += 1
        return self._take_plan(plan, ids, t_start)

    def _drop_inflight(self) -> None:
        """Wait for the plan in flight and discard it: its requests go back to the decode state before it (the
        tokens it computed are recomputed by the next step), its blocks stay with them."""
        if self._inflight is None:
            return
        ticket = self._inflight[1]
        self._inflight = None
        if self.executor is not None:
            self.executor.collect_greedy_steps(ticket)

    def _take_plan(self, plan: DecodeSteps, ids: np.ndarray, t_start: float) -> list[RequestOutput]:
        """Take ``plan``'s tokens ``ids`` (``[K, S]``) step by step, with the usual stop checks."""
        sched = self.scheduler
        self.num_device_sampled_steps += plan.num_steps
        now = time.monotonic()
        touched: dict[str, _Group] = {}
        itl: list[float] = []
        ttft: list[float] = []
        num_sampled = 0
        for j in range(plan.num_steps):
            updated = sched.update_from_decode_step(plan, j, ids[j])
            num_sampled += len(updated)
            self._take_tokens(updated, {}, now, touched, itl, ttft)
        results = [self._make_output(g) for g in touched.values()]
        self._record(t_start, num_sampled, plan.output.total_num_scheduled_tokens * plan.num_steps, itl, ttft,
                     [r for r in results if r.finished])
        return results

    def _take_tokens(self, updated: Sequence[Request], lp_by_id: dict[str, TokenLogprobs], now: float,
                     touched: dict[str, _Group], itl: list[float], ttft: list[float]) -> None:
        """The engine's side of one new token per request of ``updated`` (``Scheduler.update_from_output``):
        logprobs, latencies, detokenization, stop strings (which finish the request in the scheduler), and the
        request's group into ``touched``."""
        sched = self.scheduler
        live = self._seqs
        for req in updated:
            seq = live.get(req.request_id)
            if seq is None:
                continue
            if lp_by_id and seq.logprobs is not None and (lp := lp_by_id.get(req.request_id)) is not None:
                seq.logprobs.append(lp)
            if len(req.output_token_ids) > 1:
                itl.append(now - seq.last_token_time)
            seq.last_token_time = now
            detok = seq.detok
            if detok is not None:
                seq.pending_text += detok.push(req.output_token_ids[-1])
            if req.is_finished:
                seq.finish_reason, seq.stop_reason = req.finish_reason, req.stop_reason
                if detok is not None:
                    seq.pending_text += detok.finish()
            elif detok is not None and detok.finished:  # a stop string
                sched.finish_request(req.request_id, "stop", detok.stop_reason)
                seq.finish_reason, seq.stop_reason = "stop", detok.stop_reason
            group = seq.group
            if group.first_token_time is None:
                group.first_token_time = now
                ttft.append(now - group.arrival_time)
            touched[group.request_id] = group

    def _greedy_tokens(self, seqs: Sequence[_Seq]) -> Callable[[Any], np.ndarray] | None:
        """The executor's ``greedy_tokens`` when it gives this step's tokens: device sampling on and every
        sampling row plain greedy (also when no row samples: the logits would go unused); else None."""
        if not self.device_sampling or not all(s.device_greedy for s in seqs):
            return None
        return getattr(self.executor, "greedy_tokens", None)

    def _make_output(self, group: _Group) -> RequestOutput:
        outputs = []
        for seq in group.seqs:
            req = seq.request
            if seq.finish_reason is not None and req.request_id in self._seqs:
                del self._seqs[req.request_id]
                group.num_unfinished -= 1
            ids, lps = req.output_token_ids, seq.logprobs
            n_ids, n_lps = len(ids), None if lps is None else len(lps)
            outputs.append(CompletionOutput(
                seq.index, seq.detok.output_text if seq.detok is not None else "", ids, lps, seq.finish_reason,
                seq.stop_reason, seq.pending_text, ids[seq.delta_start:],
                None if lps is None else lps[seq.delta_logprobs_start:], num_token_ids=n_ids, num_logprobs=n_lps))
            seq.delta_start = n_ids
            seq.pending_text = ""
            if lps is not None:
                seq.delta_logprobs_start = n_lps
        finished = group.num_unfinished == 0
        if finished:
            del self._groups[group.request_id]
        cached = max(group.seqs[0].request.num_cached_tokens, 0)
        return RequestOutput(group.request_id, group.prompt_token_ids, outputs, finished, cached,
                             group.arrival_time, group.first_token_time)

    def _record(self, t_start: float, num_sampled: int, num_tokens: int, itl: Sequence[float] = (),
                ttft: Sequence[float] = (), finished: Sequence[RequestOutput] = ()) -> None:
        if self.metrics is None:
            return
        self.metrics.record_step(self.scheduler.stats(), num_sampled=num_sampled, num_scheduled_tokens=num_tokens,
                                 itl=itl, ttft=ttft, finished=finished)

    # -- offline generation -----------------------------------------------------------------------

    def generate(self, prompts: Sequence[str | Sequence[int]], params: SamplingParams | Sequence[SamplingParams],
                 ) -> list[RequestOutput]:
        """Run ``prompts`` to completion, batched; one final output per prompt, in order."""
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        done: dict[str, RequestOutput] = {}
        while self.has_unfinished_requests():
            for o in self.step():
                if o.finished:
                    done[o.request_id] = o
        return [done[i] for i in ids]


class AsyncEngine:
    """``LLMEngine`` on a thread of its own, with asyncio streams per request.

    ``max_queue``: requests beyond ``max_num_seqs`` running that may wait; more raise
    ``QueueFullError`` (the server's 503). ``stop()`` refuses new requests and lets running ones
    finish (drain) before the thread ends.
    """

    def __init__(self, engine: LLMEngine, max_queue: int = 1024,
                 on_outputs: Callable[[list[RequestOutput]], list[RequestOutput]] | None = None) -> None:
        self.engine = engine
        self.max_queue = max_queue
        #: called on the engine thread with each step's outputs before they are delivered (may replace them)
        self.on_outputs = on_outputs
        self._cv = threading.Condition()
        self._commands: list[tuple[str, Any]] = []
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._ids = itertools.count()
        self.num_in_flight = 0  # admitted requests not yet finished (event-loop side count)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="ingot-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new requests, finish the running ones, end the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def _submit(self, kind: str, payload: Any) -> None:
        with self._cv:
            self._commands.append((kind, payload))
            self._cv.notify()

    def _loop(self) -> None:
        engine = self.engine
        while True:
            with self._cv:
                while not self._commands and not engine.has_unfinished_requests() and not self._stopping:
                    self._cv.wait()
                commands, self._commands = self._commands, []
                if self._stopping and not commands and not engine.has_unfinished_requests():
                    return
            for kind, payload in commands:
                if kind == "add":
                    rid, prompt_ids, params, priority, arrival, prefilled = payload
                    try:
                        engine.add_request(prompt_ids, params, request_id=rid, priority=priority,
                                           arrival_time=arrival, prefilled=prefilled)
                    except Exception as e:  # validated before; report, never kill the loop
                        self._fail([rid], f"{type(e).__name__}: {e}")
                else:
                    engine.abort(payload)
            if not engine.has_unfinished_requests():
                continue
            try:
                outputs = engine.step()
            except Exception as e:
                log.exception("engine step failed; failing the running requests")
                ids = list(engine._groups)
                for rid in ids:
                    engine.abort(rid)
                self._fail(ids, f"internal engine error: {type(e).__name__}: {e}")
                continue
            if outputs and self.on_outputs is not None:
                outputs = self.on_outputs(outputs)
            if outputs:
                self._deliver(outputs)
            freeze_gc_once()  # after the first (warm-up) step

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, RequestOutput]]] = {}
        queues = self._queues
        for o in outputs:
            entry = queues.get(o.request_id)
            if entry is not None:
                by_loop.setdefault(entry[0], []).append((entry[1], o))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the loop is closed: nobody is listening
                pass

    def _fail(self, ids: Sequence[str], message: str) -> None:
        now = time.monotonic()
        self._deliver([RequestOutput(rid, [], [], True, arrival_time=now, error=message) for rid in ids])

    def check_admission(self) -> None:
        """Raise ``QueueFullError`` when no more requests may wait (call before ``generate``)."""
        if self._stopping:
            raise QueueFullError("the server is shutting down")
        if self.num_in_flight >= self.engine.args.max_num_seqs + self.max_queue:
            raise QueueFullError(f"too many requests waiting ({self.max_queue} queued)")

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams, *,
                       request_id: str | None = None, priority: int = 0,
                       prefilled: Prefilled | None = None) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs; the last has ``finished``. Leaving the loop early (or being
        cancelled) aborts the request and frees its blocks. ``prefilled``: see ``LLMEngine.add_request``."""
        ids = [int(t) for t in prompt_token_ids]
        self.engine.check_request(ids, params)
        self.check_admission()
        rid = request_id or f"req-{next(self._ids)}"
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._queues[rid] = (asyncio.get_running_loop(), queue)
        self.num_in_flight += 1
        finished = False
        try:
            self._submit("add", (rid, ids, params, priority, time.monotonic(), prefilled))
            while not finished:
                out = await queue.get()
                finished = out.finished
                if out.error is not None:
                    raise RuntimeError(out.error)
                yield out
        finally:
            self.num_in_flight -= 1
            self._queues.pop(rid, None)
            if not finished:
                self._submit("abort", rid)

    def abort(self, request_id: str) -> None:
        self._submit("abort", request_id)


def _put_all(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for q, o in items:
        q.put_nowait(o)
