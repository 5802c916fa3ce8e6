"""The scheduler: continuous batching under a per-step token budget, with no prefill or decode phases.

Every request has tokens (prompt + generated so far) and a number of them already computed (their
K/V in the cache). A step lets computed tokens catch up with tokens::

    request A (prefill, chunked):  |==== computed ====|++ new ++|.... still to compute ....|
    request B (decode):            |=========== computed ===========|+|
    request C (new, prefix hit):   |== cached ==|+++++ new +++++|......|
                                    ^ full blocks found in the prefix cache (never all tokens)

    = computed (K/V in cache)   + scheduled this step   . left for later steps

``schedule()`` gives each request a number of new tokens, ``{request_id: num_new_tokens}``, such that
the sum stays within ``max_num_batched_tokens`` and at most ``max_num_seqs`` requests run. A long
prompt takes several steps (chunked prefill; ``long_prefill_token_threshold`` caps one request's
share of a step). Order:

1. running requests, in the order they started running: each gets all its remaining tokens (up to
   the threshold and the budget). When the cache cannot hold them, the lowest-priority running
   request (``policy="fcfs"``: the latest arrived; ``"priority"``: the highest ``priority`` value,
   then the latest arrived) is preempted: its blocks are freed, its ``num_computed_tokens`` set to
   0, and it goes back to the front of the waiting queue. It recomputes when resumed, though the
   prefix cache usually gives most of its blocks back. If the request being scheduled is itself the
   lowest, it is the one preempted.
2. waiting requests (FCFS, or ``priority`` then arrival), unless a preemption happened in this step:
   each first takes the longest cached prefix (``KVCacheManager.get_computed_blocks``), then new
   blocks for the rest of its scheduled tokens; the first one that does not fit stops the loop.
   Waiting requests hold no blocks (so a preemption always frees something that helps).

A request samples a token only in the step that brings its computed tokens up to all its tokens
(``SchedulerOutput.do_sample``); a prefill chunk that stops short samples nothing.

``schedule()`` also builds the step inputs of docs/SERVING_FORM.md (``build_step_inputs``: numpy, no
per-token Python loop), so the engine only executes, samples, and calls ``update_from_output`` with
the sampled tokens. That appends them, finishes requests (``max_tokens``, ``max_model_len``, eos and
stop token ids; stop strings arrive through ``finish_request``) and frees their blocks. Calls
alternate: ``schedule``, execute, ``update_from_output``, ``schedule``, ...

Decode steps (the engine's ``decode_steps``, runtime/engine.py): when every row of a step is one decode
token, ``plan_decode_steps`` extends the step to ``k`` decode steps run back to back, each row's input at
step ``j > 0`` being the token it sampled at step ``j - 1`` (fed on the device). Blocks for the ``k - 1``
extra tokens are allocated up front (or nothing happens: no preemption for them); positions, slots and
sequence lengths are known without the tokens. ``update_from_decode_step`` then takes the steps' tokens one
step at a time, exactly as ``update_from_output`` takes a single step's::

    request, k = 4:   |===== computed =====|t|a|b|c|      t: last token (input of step 0)
    step 0 computes t and samples a; step 1 computes a, samples b; ...; step 3 computes c, samples d
    after update j:   computed = tokens - 1 (the usual decode state), blocks published as they fill

A request that stops at step ``j`` (eos, a stop token, max_tokens, or the engine's stop string) finishes
there: the later steps' tokens are discarded with its blocks, which hold their K/V but are never published.

Host cost (bench/bench_scheduler.py, docs/PERF.md): ~0.3 ms per step for 256 decoding sequences;
per request and step a few dict/list operations, no per-token Python loop. The engine should run
``gc.collect(); gc.freeze()`` once after building the scheduler, so that full collections do not walk
the cache's block objects.

Prefix caching in the step: the blocks a request computes become findable in the step that
computes them (``paged_attention`` writes every token's K/V before any attention reads), so ``n``
requests with one prompt admitted together compute the shared full blocks once. Running requests'
blocks are published only after the running loop, when no preemption can unschedule them anymore.
So the engine must execute a step as scheduled, even for a request aborted since ``schedule()``
(its published blocks are then written by that step; ``update_from_output`` skips the request).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from .block_pool import HashFn, hash_block_tokens
from .kv_cache import KVCacheManager
from .request import Request, RequestStatus


@dataclass
class SchedulerConfig:
    """Limits of one step and of one request; ``policy`` is ``"fcfs"`` or ``"priority"`` (lower value first)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    long_prefill_token_threshold: int = 0  # 0: no cap on one request's tokens per step
    policy: str = "fcfs"
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {self.policy!r}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_model_len < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and max_model_len must be >= 1")


@dataclass
class CacheConfig:
    """The KV cache: ``num_blocks`` (from the artifact's KV spec and free memory, or a flag) of ``block_size``."""

    num_blocks: int
    block_size: int = 16
    enable_prefix_caching: bool = True
    hash_fn: HashFn = hash_block_tokens


@dataclass
class StepInputs:
    """The step inputs of docs/SERVING_FORM.md, for ``S`` sequences and ``T`` tokens."""

    input_ids: np.ndarray  # i64[T]
    positions: np.ndarray  # i64[T]
    slot_mapping: np.ndarray  # i64[T]
    block_tables: np.ndarray  # i32[S, max_blocks]
    seq_lens: np.ndarray  # i32[S]
    query_start_loc: np.ndarray  # i32[S+1]
    logits_indices: np.ndarray  # i64[S]

    def as_feeds(self) -> dict[str, np.ndarray]:
        """The graph inputs by name (without the ``kv_cache.{i}`` tensors)."""
        return {
            "input_ids": self.input_ids,
            "positions": self.positions,
            "slot_mapping": self.slot_mapping,
            "block_tables": self.block_tables,
            "seq_lens": self.seq_lens,
            "query_start_loc": self.query_start_loc,
            "logits_indices": self.logits_indices,
        }


@dataclass
class SchedulerOutput:
    """One step's plan. Row ``s`` of the step inputs is ``req_ids[s]`` (running requests first)."""

    req_ids: list[str]
    requests: list[Request]  # aligned with req_ids (their sampling_params, for the sampler)
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    do_sample: np.ndarray  # bool[S]: row s's logits give a token (its computed tokens catch up)
    step_inputs: StepInputs
    #: joined the running set since the last step (new, resumed after preemption, or forked)
    new_req_ids: list[str] = field(default_factory=list)
    preempted_req_ids: list[str] = field(default_factory=list)
    finished_req_ids: list[str] = field(default_factory=list)  # finished or aborted since the last schedule()

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class DecodeSteps:
    """``output``'s decode rows run for ``num_steps`` steps at once (``Scheduler.plan_decode_steps``).

    ``step_inputs[0]`` is ``output.step_inputs``; step ``j > 0`` computes each row's token at one position
    further, whose id is what step ``j - 1`` sampled: its ``input_ids`` are placeholders (zeros) that the
    executor replaces on the device."""

    output: SchedulerOutput
    step_inputs: list[StepInputs]
    #: planned by ``plan_next_decode_steps`` before the previous plan's tokens were taken: step 0's ids are the
    #: previous plan's last ones too (fed on the device), and step 0's token is counted computed in its update
    chained: bool = False

    @property
    def num_steps(self) -> int:
        return len(self.step_inputs)


@dataclass
class SchedulerStats:
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    prefix_cache_queries: int  # tokens looked up
    prefix_cache_hits: int  # tokens found
    num_preemptions: int

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


def build_step_inputs(
    input_ids: Sequence[int],
    num_computed: Sequence[int],
    num_new: Sequence[int],
    rows: Sequence[int],
    block_table: np.ndarray,
    block_size: int,
) -> StepInputs:
    """The step inputs for sequences ``s`` with ``num_new[s]`` tokens after ``num_computed[s]`` cached ones.

    ``input_ids`` are the scheduled tokens laid end to end; ``block_table[rows[s]]`` is sequence
    ``s``'s block table. Token ``j`` of sequence ``s`` sits at position ``num_computed[s] + j`` and
    goes to slot ``block_table[row, pos // bs] * bs + pos % bs``.
    """
    S = len(num_new)
    n = np.array(num_new, np.int64)
    start = np.array(num_computed, np.int64)
    row_idx = np.array(rows, np.intp)
    qsl = np.zeros(S + 1, np.int64)
    np.cumsum(n, out=qsl[1:])
    T = int(qsl[-1])
    seq_lens = start + n
    if T == S:  # all decode: one token per sequence
        positions = start
        tok_rows = row_idx
    else:
        positions = np.arange(T, dtype=np.int64) + np.repeat(start - qsl[:-1], n)
        tok_rows = np.repeat(row_idx, n)
    blk, off = np.divmod(positions, block_size)
    slot_mapping = block_table[tok_rows, blk].astype(np.int64)
    slot_mapping *= block_size
    slot_mapping += off
    width = max(1, -(-int(seq_lens.max()) // block_size)) if S else 1
    return StepInputs(
        input_ids=np.array(input_ids, np.int64),
        positions=positions,
        slot_mapping=slot_mapping,
        block_tables=block_table[row_idx, :width],
        seq_lens=seq_lens.astype(np.int32),
        query_start_loc=qsl.astype(np.int32),
        logits_indices=qsl[1:] - 1,
    )


def decode_steps_inputs(first: np.ndarray, num_steps: int, rows: Sequence[int], block_table: np.ndarray,
                        block_size: int) -> list[StepInputs]:
    """``build_step_inputs`` of decode steps ``1 .. num_steps - 1`` of one-token rows whose step 0 computes position
    ``first[s]`` (``Scheduler.plan_decode_steps``), all steps in one pass of array operations: step ``j`` computes
    position ``first[s] + j`` with a placeholder id (0). The same arrays as ``build_step_inputs`` gives per step
    (the block tables as views of one gather; ``query_start_loc``, ``logits_indices`` and the ids shared between
    the steps, read-only)."""
    num_rows = len(first)
    row_idx = np.array(rows, np.intp)
    positions = np.asarray(first, np.int64)[None, :] + np.arange(1, num_steps, dtype=np.int64)[:, None]
    blk, off = np.divmod(positions, block_size)
    slots = block_table[row_idx[None, :], blk].astype(np.int64)
    slots *= block_size
    slots += off
    seq_lens = (positions + 1).astype(np.int32)
    widths = (-(-(positions.max(axis=1, initial=0) + 1) // block_size)).clip(min=1).tolist()
    tables = block_table[row_idx, : max(widths, default=1)]
    ids = np.zeros(num_rows, np.int64)
    qsl = np.arange(num_rows + 1, dtype=np.int32)
    last = np.arange(num_rows, dtype=np.int64)
    return [StepInputs(ids, positions[j], slots[j], tables[:, :w], seq_lens[j], qsl, last)
            for j, w in enumerate(widths)]


class _WaitingQueue:
    """FCFS: a deque (preempted requests go to the front). Priority: a heap on (priority, arrival, seq)."""

    def __init__(self, policy: str) -> None:
        self.priority = policy == "priority"
        self._dq: deque[Request] = deque()
        self._heap: list[tuple[int, float, int, Request]] = []

    def __len__(self) -> int:
        return len(self._heap) if self.priority else len(self._dq)

    def __iter__(self) -> Iterator[Request]:
        return (e[3] for e in sorted(self._heap)) if self.priority else iter(self._dq)

    def add(self, req: Request, *, front: bool = False) -> None:
        if self.priority:
            heapq.heappush(self._heap, (req.priority, req.arrival_time, req._seq, req))
        elif front:
            self._dq.appendleft(req)
        else:
            self._dq.append(req)

    def peek(self) -> Request:
        return self._heap[0][3] if self.priority else self._dq[0]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3] if self.priority else self._dq.popleft()

    def remove(self, req: Request) -> None:
        if self.priority:
            self._heap = [e for e in self._heap if e[3] is not req]
            heapq.heapify(self._heap)
        else:
            self._dq.remove(req)


class Scheduler:
    """Continuous batching over one ``KVCacheManager`` (see the module docstring)."""

    def __init__(self, config: SchedulerConfig, cache_config: CacheConfig) -> None:
        self.config = config
        self.block_size = cache_config.block_size
        self.kv = KVCacheManager(
            cache_config.num_blocks,
            cache_config.block_size,
            max_blocks_per_request=-(-config.max_model_len // cache_config.block_size),
            enable_prefix_caching=cache_config.enable_prefix_caching,
            hash_fn=cache_config.hash_fn,
        )
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting = _WaitingQueue(config.policy)
        self.running: list[Request] = []
        self._finished_ids: list[str] = []
        self._joined: list[str] = []  # forked children that joined the running set since the last schedule()
        self._seq = 0
        self.num_preemptions = 0
        if config.policy == "priority":
            self._victim_key = lambda r: (r.priority, r.arrival_time, r._seq)
        else:
            self._victim_key = lambda r: (r.arrival_time, r._seq)

    # -- requests in and out ----------------------------------------------------------------------

    def _check_fits(self, request: Request) -> None:
        cfg = self.config
        if request.request_id in self.requests:
            raise ValueError(f"request {request.request_id!r} already exists")
        if request.num_prompt_tokens > cfg.max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: prompt of {request.num_prompt_tokens} tokens exceeds "
                f"max_model_len {cfg.max_model_len}"
            )
        if not cfg.enable_chunked_prefill and request.num_prompt_tokens > cfg.max_num_batched_tokens:
            raise ValueError(
                f"request {request.request_id!r}: prompt of {request.num_prompt_tokens} tokens exceeds "
                f"max_num_batched_tokens {cfg.max_num_batched_tokens} without chunked prefill"
            )
        # the most tokens whose K/V it will hold (the last sampled token is never computed)
        max_kv = min(request.num_prompt_tokens + request.max_tokens - 1, cfg.max_model_len)
        need = -(-max_kv // self.block_size)
        if need > self.kv.num_blocks:
            raise ValueError(
                f"request {request.request_id!r} may need {need} KV blocks; the cache has {self.kv.num_blocks}"
            )

    def add_request(self, request: Request) -> None:
        """Queue a new request (raises ValueError if it could never run: too long for the model or the cache)."""
        self._check_fits(request)
        request._seq = self._seq
        self._seq += 1
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def fork_request(self, parent_id: str, child: Request) -> None:
        """Add ``child`` (``n > 1``: same prompt as ``parent_id``) sharing the parent's computed full blocks.

        If the running set has room, the child joins it at once holding a reference on those blocks
        (no copy), with their tokens computed; it computes the rest like any running request (and
        may be preempted like one). Otherwise it is queued as a new request (holding nothing: the
        waiting queue never holds blocks) and the prefix cache may share the blocks when it starts.
        """
        parent = self.requests.get(parent_id)
        if parent is None:
            raise KeyError(f"no unfinished request {parent_id!r}")
        self._check_fits(child)
        if len(self.running) >= self.config.max_num_seqs:
            self.add_request(child)
            return
        child._seq = self._seq
        self._seq += 1
        child.num_computed_tokens = self.kv.fork(parent, child)
        child.num_cached_tokens = child.num_computed_tokens
        child.status = RequestStatus.RUNNING
        self.requests[child.request_id] = child
        self.running.append(child)
        self._joined.append(child.request_id)

    def _remove(self, request: Request, status: RequestStatus) -> None:
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._finalize(request, status)

    def _finalize(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        self.kv.free(request)
        del self.requests[request.request_id]
        self._finished_ids.append(request.request_id)

    def abort_request(self, request_id: str) -> bool:
        """Cancel a request and free its blocks now; False if it is unknown or already finished."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        self._remove(req, RequestStatus.FINISHED_ABORTED)
        return True

    def finish_request(self, request_id: str, reason: str = "stop", stop_reason: int | str | None = None) -> bool:
        """End a request from outside (a stop string found by the detokenizer): ``reason`` "stop", "length" or
        "abort". Frees its blocks now; False if it is unknown or already finished."""
        status = {
            "stop": RequestStatus.FINISHED_STOPPED,
            "length": RequestStatus.FINISHED_LENGTH,
            "abort": RequestStatus.FINISHED_ABORTED,
        }[reason]
        req = self.requests.get(request_id)
        if req is None:
            return False
        req.stop_reason = stop_reason
        self._remove(req, status)
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def stats(self) -> SchedulerStats:
        ps = self.kv.prefix_stats
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_blocks_used=self.kv.num_used_blocks,
            kv_blocks_total=self.kv.num_blocks,
            prefix_cache_queries=ps.queries,
            prefix_cache_hits=ps.hits,
            num_preemptions=self.num_preemptions,
        )

    # -- the step ---------------------------------------------------------------------------------

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add(req, front=True)

    def schedule(self) -> SchedulerOutput:
        """Choose this step's tokens (see the module docstring) and build the step inputs."""
        cfg = self.config
        kv = self.kv
        budget = cfg.max_num_batched_tokens
        thr = cfg.long_prefill_token_threshold
        running = self.running
        blocks_of = kv.req_blocks
        bs = self.block_size
        sched: dict[str, int] = {}  # request id -> new tokens, in batch order
        preempted: list[str] = []

        # 1. running requests
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = len(req.all_token_ids) - req.num_computed_tokens
            if thr and n > thr:
                n = thr
            if n > budget:
                n = budget
            if n <= 0:
                i += 1
                continue
            scheduled = True
            held = blocks_of.get(req.request_id)
            while (held is None or req.num_computed_tokens + n > len(held) * bs) and kv.allocate_slots(req, n) is None:
                victim = max(running, key=self._victim_key)
                vi = running.index(victim)
                del running[vi]
                vn = sched.pop(victim.request_id, None)
                if vn is not None:
                    budget += vn
                if vi < i:
                    i -= 1
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                break
            sched[req.request_id] = n
            budget -= n
            i += 1
        # publish the full blocks running requests compute in this step: no preemption undoes them now
        requests = self.requests
        for rid, n in sched.items():
            c = requests[rid].num_computed_tokens
            if (c + n) // bs > c // bs:
                kv.cache_blocks(requests[rid], c + n)

        # 2. waiting requests
        new_ids = self._joined
        self._joined = []
        if not preempted:
            waiting = self.waiting
            while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
                req = waiting.peek()
                hit_blocks, num_hit = kv.get_computed_blocks(req)  # waiting requests hold no blocks
                n = len(req.all_token_ids) - num_hit
                if thr and n > thr:
                    n = thr
                if n > budget:
                    if not cfg.enable_chunked_prefill:
                        break
                    n = budget
                if kv.allocate_slots(req, n, hit_blocks, num_hit) is None:
                    break
                waiting.pop()
                if req.num_preemptions == 0 and req.num_cached_tokens < 0:
                    kv.record_prefix_lookup(len(req.all_token_ids), num_hit)
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = num_hit
                req.num_computed_tokens = num_hit
                req.status = RequestStatus.RUNNING
                running.append(req)
                kv.cache_blocks(req, req.num_computed_tokens + n)
                sched[req.request_id] = n
                new_ids.append(req.request_id)
                budget -= n

        # 3. step inputs; computed tokens move forward now (the step will compute them)
        reqs: list[Request] = []
        input_ids: list[int] = []
        starts: list[int] = []
        rows: list[int] = []
        do_sample: list[bool] = []
        req_rows = kv.req_rows
        for rid, n in sched.items():
            req = requests[rid]
            reqs.append(req)
            c = req.num_computed_tokens
            toks = req.all_token_ids
            starts.append(c)
            rows.append(req_rows[rid])
            if n == 1:
                input_ids.append(toks[c])
            else:
                input_ids.extend(toks[c : c + n])
            c += n
            req.num_computed_tokens = c
            do_sample.append(c == len(toks))
        num_new = list(sched.values())
        step = build_step_inputs(input_ids, starts, num_new, rows, kv.block_table, self.block_size)
        finished = self._finished_ids
        self._finished_ids = []
        return SchedulerOutput(
            req_ids=list(sched),
            requests=reqs,
            num_scheduled_tokens=sched,
            total_num_scheduled_tokens=len(input_ids),
            do_sample=np.array(do_sample, bool),
            step_inputs=step,
            new_req_ids=new_ids,
            preempted_req_ids=preempted,
            finished_req_ids=finished,
        )

    def update_from_output(self, scheduler_output: SchedulerOutput, sampled_token_ids: Sequence[int]) -> list[Request]:
        """Append the step's sampled tokens (one per row of ``scheduler_output``; rows without
        ``do_sample`` are ignored), finish requests that stop, free their blocks.

        Returns the requests that got a token, in row order; a finished one has a final ``status``
        (its ``finish_reason``). Requests aborted or finished since ``schedule()`` are skipped.
        """
        toks = sampled_token_ids.tolist() if isinstance(sampled_token_ids, np.ndarray) else sampled_token_ids
        if len(toks) != len(scheduler_output.requests):
            raise ValueError(f"{len(toks)} sampled tokens for {len(scheduler_output.requests)} scheduled rows")
        max_len = self.config.max_model_len
        RUNNING = RequestStatus.RUNNING
        out: list[Request] = []
        any_finished = False
        for req, ds, t in zip(scheduler_output.requests, scheduler_output.do_sample.tolist(), toks):
            if not ds or req.status is not RUNNING:
                continue
            req.all_token_ids.append(t)
            outs = req.output_token_ids
            outs.append(t)
            n_out = len(outs)
            status = None
            if n_out >= req.min_tokens and (t == req.eos_token_id or t in req.stop_token_ids):
                status = RequestStatus.FINISHED_STOPPED
                if t != req.eos_token_id:
                    req.stop_reason = t
            elif n_out >= req.max_tokens or len(req.all_token_ids) >= max_len:
                status = RequestStatus.FINISHED_LENGTH
            if status is not None:
                self._finalize(req, status)
                any_finished = True
            out.append(req)
        if any_finished:
            self.running = [r for r in self.running if r.status is RUNNING]
        return out

    def waiting_can_join(self) -> bool:
        """A waiting request could join the running set at the next ``schedule()``: one waits and a seat is free
        (fewer than ``max_num_seqs`` run). Plans of several decode steps, and plans queued ahead, are refused then:
        the request would wait for them. With every seat taken it can only join once a running request ends; a plan
        under way then delays it by at most the plan's remaining steps (and a plan queued ahead by one plan more),
        the price of the plans' throughput on a saturated server."""
        return bool(len(self.waiting)) and len(self.running) < self.config.max_num_seqs

    def plan_decode_steps(self, output: SchedulerOutput, num_steps: int, min_steps: int = 2) -> DecodeSteps | None:
        """Extend ``output``, just returned by ``schedule()``, to ``num_steps`` decode steps of the same rows
        (module docstring, "Decode steps"); call ``update_from_decode_step`` for each step instead of
        ``update_from_output``.

        ``num_steps`` is cut to the fewest tokens a row may still generate (``max_tokens``, ``max_model_len``).
        None, changing nothing, when fewer than ``min_steps`` steps remain (1: a plan of ``output``'s one step,
        which ``plan_next_decode_steps`` can follow), when a row is not one sampled decode token, when a waiting
        request could join (``waiting_can_join``: it would wait ``num_steps`` steps), or when the free blocks do not
        hold every row's ``num_steps - 1`` more tokens.
        """
        reqs = output.requests
        num_rows = len(reqs)
        if (num_steps < min_steps or not num_rows or output.total_num_scheduled_tokens != num_rows
                or not output.do_sample.all() or self.waiting_can_join()):
            return None
        k = self._steps_left(reqs, num_steps)
        if k < max(min_steps, 1):
            return None
        if k == 1:
            return DecodeSteps(output, [output.step_inputs])
        # after schedule(), num_computed_tokens == num_tokens: step 0 computes the last token's position
        first = np.array([r.num_computed_tokens - 1 for r in reqs], np.int64)
        rows = self._hold_steps(reqs, first, k)
        if rows is None:
            return None
        steps = decode_steps_inputs(first, k, rows, self.kv.block_table, self.block_size)
        return DecodeSteps(output, [output.step_inputs, *steps])

    def _steps_left(self, reqs: Sequence[Request], num_steps: int, planned: int = 0) -> int:
        """``num_steps`` cut to the fewest tokens a request of ``reqs`` may still generate (``max_tokens``,
        ``max_model_len``) after the ``planned`` steps already queued for it."""
        max_len = self.config.max_model_len
        k = num_steps
        for req in reqs:
            k = min(k, req.max_tokens - len(req.output_token_ids) - planned,
                    max_len - len(req.all_token_ids) - planned)
        return k

    def _hold_steps(self, reqs: Sequence[Request], first: np.ndarray, k: int) -> list[int] | None:
        """Blocks for ``k`` decode steps of ``reqs`` whose step 0 computes position ``first[s]``: each request then
        holds ``first[s] + k`` tokens. Returns the requests' block-table rows; None, allocating nothing, when the
        free blocks do not hold them all."""
        kv = self.kv
        bs = self.block_size
        held = kv.req_blocks
        ends = (first + k).tolist()
        need = sum(max(0, -(-e // bs) - len(held[r.request_id])) for r, e in zip(reqs, ends))
        if need > kv.num_free_blocks:
            return None
        for req, e in zip(reqs, ends):
            if kv.allocate_slots(req, e - req.num_computed_tokens) is None:  # counted above: cannot fail
                raise RuntimeError(f"request {req.request_id!r}: no blocks for its decode steps")
        return [kv.req_rows[r.request_id] for r in reqs]

    def plan_next_decode_steps(self, plan: DecodeSteps, num_steps: int) -> DecodeSteps | None:
        """The ``num_steps`` decode steps that follow ``plan``, planned before ``plan``'s tokens are taken (the
        engine's overlap, runtime/engine.py "Overlap"): the same rows, each at its position after ``plan``'s last
        step, whose step 0 takes the token ``plan``'s last step samples (on the device). Every plan before ``plan``
        must have been taken (``update_from_decode_step``), ``plan`` itself not yet; take the result's steps after
        ``plan``'s, with the same calls.

        ``num_steps`` is cut to the fewest tokens a row may still generate after ``plan``'s. None, changing nothing,
        when fewer than 1 step remains, when one of ``plan``'s requests no longer runs (finished, aborted) or a
        running request is not one of its rows, when a waiting request could join (``waiting_can_join``), or when
        the free blocks do not hold every row's tokens to the end of the new steps. A row that stops during ``plan``
        (known only when its tokens are taken) still computes the new steps: their tokens are discarded with its
        blocks, as for a stop inside a plan (module docstring, "Decode steps").
        """
        reqs = plan.output.requests
        if num_steps < 1 or self.waiting_can_join() or len(reqs) != len(self.running):
            return None
        running = RequestStatus.RUNNING
        if any(r.status is not running for r in reqs):
            return None
        k0 = plan.num_steps
        k = self._steps_left(reqs, num_steps, k0)
        if k < 1:
            return None
        first = plan.step_inputs[0].positions + k0  # the position the new step 0 computes, per row
        rows = self._hold_steps(reqs, first, k)
        if rows is None:
            return None
        # decode_steps_inputs gives steps 1 .. k of a plan whose step 0 computes first - 1
        steps = decode_steps_inputs(first - 1, k + 1, rows, self.kv.block_table, self.block_size)
        return DecodeSteps(plan.output, steps, chained=True)

    def update_from_decode_step(self, plan: DecodeSteps, step: int, sampled_token_ids: Sequence[int]) -> list[Request]:
        """``update_from_output`` for step ``step`` of ``plan``; call it for steps 0, 1, ... in order.

        Before step ``j > 0``'s tokens (every step's, for a ``chained`` plan), each request still running counts
        the token the step before gave it as computed (step ``j`` wrote its K/V) and publishes the block that token
        fills. A request finished at an earlier step, by its own stop or by ``finish_request``, is skipped: its
        later tokens are discarded.
        """
        if step or plan.chained:
            bs = self.block_size
            kv = self.kv
            RUNNING = RequestStatus.RUNNING
            for req in plan.output.requests:
                if req.status is RUNNING:
                    c = req.num_computed_tokens + 1
                    req.num_computed_tokens = c
                    if c % bs == 0:
                        kv.cache_blocks(req, c)
        return self.update_from_output(plan.output, sampled_token_ids)
