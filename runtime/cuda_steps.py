"""Decode steps on the CUDA executor: ``K`` greedy decode steps queued without a host round trip, and two such
submissions in flight at once (the engine's overlap, runtime/engine.py "Overlap"). ``DecodeSteps`` holds
``CudaExecutor``'s methods for them (the executor mixes it in; runtime/cuda_backend.py has the rest of a step:
staging, the bucket graphs, the argmax).

**One graph of the K steps** (``K >= 2`` by default, ``steps_graph_enabled``): the steps of one bucket run as one
CUDA graph, captured once per (bucket, ``K``, staging parity) on first use, never waiting for the host in between.
All ``K`` steps' inputs are staged up front, padded as for a decode graph (runtime/cuda_backend.py), into one pinned
buffer (step ``j`` at ``j * stride``, ``stride`` the bucket's input bytes rounded up to 256) and sent in one copy to
a device buffer of the same layout. In the graph, a small kernel (``codegen/kernels/copy/step_inputs.cu``) before
each step's launches copies that step's bytes into the io region (from the second step on with the previous step's
argmax ids as ``input_ids``) and files the previous step's ids in a device ``i64[K, bucket]`` buffer; one more after
the last step files its ids. The ids come back in one copy; the host keeps the first ``S`` of each row (padding rows
feed on their own argmax, any valid id, and write no KV)::

    H2D(steps 0..K-1) | graph[ in(0) step0 | in(1) step1 | ... | step(K-1) ids(K) ] | D2H(ids)

The step kernels are PDL launches like the model's: between two steps there is a kernel boundary, no stream copy and
no graph boundary. The engine cuts ``K`` where rows end, so a bucket may collect a graph (of ``K`` steps' nodes, and
its own staging) for each ``K`` up to its ``decode_steps``. The staging of every step comes before any GPU work;
with the overlap (the next ``K`` steps staged and queued while the GPU runs these) that costs nothing, and on the
H200 the one graph gave 1,106 batch-1 tok/s at ``K = 8`` against 1,085 for the graph per step (docs/PERF.md,
"Overlap of the host with the GPU").

**A graph per step** (``K = 1``, where it was 1% faster; ``INGOT_STEPS_GRAPH=0``; or no step kernel): each step is
staged in a pinned copy of its own and the bucket's graph launched once per step with stream copies in between
(``INGOT_STEPS_GRAPH=1``: one graph at ``K = 1`` too)::

    H2D(step 0) graph D2D(ids->out[0]) | H2D(step 1) D2D(ids->input_ids) graph D2D(ids->out[1]) | ... | D2H(out)

**Submissions** (``submit_greedy_steps`` -> ticket, ``collect_greedy_steps(ticket)`` -> ids): two may be in flight,
each with its own staging parity (pinned staging copies, device and host ids, the one graph of its ``K`` steps, an
event after its copy back); a third waits for the older. A ``chained`` submission takes step 0's ids from the
previous submission's last argmax on the device, so the engine can queue the next plan before it reads the last.
``greedy_tokens_steps`` is a submission collected at once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..codegen.memory_plan import eval_dim
from ..ir.types import DType
from . import cuda_driver as cd
from .cuda_launch import Launch

if TYPE_CHECKING:
    from ..codegen.kernel import KernelSpec
    from .cuda_launch import GreedyArgmax

#: where a bucket's inputs lie in the io region: name -> (byte offset, dtype, shape at the bucket's dims)
Layout = Mapping[str, tuple[int, np.dtype, tuple[int, ...]]]


def layout_end(layout: Layout) -> int:
    """The end of the last non-empty input of ``layout``: the bytes a step's inputs span in the io region."""
    ends = (off + int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize for off, dt, shape in layout.values())
    return max((e for e, (off, _, _) in zip(ends, layout.values()) if e > off), default=0)


class StagedBucket:
    """Typed views of a decode bucket's inputs in a pinned staging buffer, laid out as in the io region from byte
    ``base`` on (``CudaExecutor._write_decode``), and ``end``: the bytes one step copies, counted from ``base``."""

    def __init__(self, staging: cd.PinnedBuffer, layout: Layout, base: int = 0) -> None:
        self.views = {name: staging.view(base + off, dt, shape) for name, (off, dt, shape) in layout.items()}
        self.end = layout_end(layout)


#: ``INGOT_STEPS_GRAPH``: how ``submit_greedy_steps`` runs K steps (``steps_graph_enabled``, module docstring)
STEPS_GRAPH_ENV = "INGOT_STEPS_GRAPH"
#: bytes between two steps' inputs in a ``StepsGraph``'s staging (the device copy's 16-byte units stay aligned)
STEP_STRIDE_ALIGN = 256


def steps_graph_enabled(k: int) -> bool:
    """Whether ``k`` decode steps run as one CUDA graph: ``INGOT_STEPS_GRAPH`` (after stripping spaces) ``1``:
    always; ``0``: never (the bucket's graph per step); unset or anything else: for ``k >= 2`` (with the engine's
    overlap the faster of the two on the H200 at ``K = 8``, the graph per step at ``K = 1``; docs/PERF.md, "Overlap
    of the host with the GPU")."""
    raw = os.environ.get(STEPS_GRAPH_ENV, "").strip()
    return raw == "1" or (raw != "0" and k >= 2)


class StepsGraph:
    """``K`` decode steps of one bucket as one CUDA graph (``CudaExecutor.greedy_tokens_steps``) with its buffers:
    the pinned staging of every step's inputs (``steps[j]``: step ``j``'s views, ``j * stride`` bytes in), the
    device copy the graph's step kernels read, and the device ids ``i64[K, bucket]`` with their pinned host copy."""

    def __init__(self, bucket: int, k: int, layout: Layout) -> None:
        self.bucket, self.k = bucket, k
        self.end = layout_end(layout)
        self.stride = -(-self.end // STEP_STRIDE_ALIGN) * STEP_STRIDE_ALIGN
        self.staging = cd.PinnedBuffer(k * self.stride)
        self.staged = cd.DeviceMemory(k * self.stride)
        self.steps = [StagedBucket(self.staging, layout, j * self.stride) for j in range(k)]
        self.ids = cd.DeviceMemory(k * bucket * 8)
        self.ids_host = cd.PinnedBuffer(k * bucket * 8)
        self.graph: cd.CudaGraph | None = None

    def enqueue(self, stream: cd.Stream, ids_from: tuple[int, int, int] | None = None) -> None:
        """Every step's staged inputs in (one copy), the graph, every step's ids out (one copy). ``ids_from``
        (device address, offset of ``input_ids`` in the layout, rows): step 0's ids copied from that address on the
        device after the staged inputs (a chained submission: the previous one's last ids)."""
        if self.graph is None:
            raise RuntimeError(f"the decode steps graph of bucket {self.bucket}, K = {self.k} was not captured")
        cd.memcpy_htod(self.staged.ptr, self.staging.ptr, (self.k - 1) * self.stride + self.end, stream)
        if ids_from is not None:
            src, offset, rows = ids_from
            cd.memcpy_dtod(self.staged.ptr + offset, src, rows * 8, stream)
        self.graph.launch(stream)
        cd.memcpy_dtoh(self.ids_host.ptr, self.ids.ptr, self.k * self.bucket * 8, stream)

    def free(self) -> None:
        if self.graph is not None:
            self.graph.destroy()
        for b in (self.staging, self.staged, self.ids, self.ids_host):
            b.free()


class StepsTicket:
    """A ``submit_greedy_steps`` call: ``K`` steps of ``S`` rows queued with staging parity ``parity`` (-1: run at
    once), the pinned host copy of their ids (``i64[K, width]``, the first ``S`` of each row theirs) and the event
    after it, ``seq`` its submission's number; ``ids`` once collected."""

    __slots__ = ("k", "s", "parity", "host", "width", "done", "seq", "ids")

    def __init__(self, k: int, s: int, parity: int, host: cd.PinnedBuffer | None = None,
                 width: int | None = None) -> None:
        self.k, self.s, self.parity, self.host = k, s, parity, host
        self.width = s if width is None else width
        self.done: cd.Event | None = None
        self.seq = -1
        self.ids: np.ndarray | None = None


class DecodeSteps:
    """``CudaExecutor``'s decode-steps methods (module docstring). Mixed into the executor, whose staging, bucket
    graphs, argmax and stream they use."""

    if TYPE_CHECKING:  # the executor's, used here
        argmax: GreedyArgmax | None
        step_kernel: tuple[Any, KernelSpec] | None
        steps_graphs: dict[tuple[int, int, int], StepsGraph]
        stats: dict[str, int]
        stream: cd.Stream
        ctx: cd.Context
        staging: cd.PinnedBuffer
        buffers: dict[str, dict[str, Any]]
        inputs: list[Any]
        cuda_graphs: bool
        _staged_bucket: list[int | None]

    def _init_submissions(self) -> None:
        """The state of ``submit_greedy_steps``: staging copies (``_step_staging[0]`` is ``staging``; step ``j`` of a
        submission of parity ``p`` uses copy ``1 + 2 * j + p``), and per parity the device ``i64[K, S]`` ids with
        their pinned host copy (grown on demand), the event after their copy back, and the submission in flight."""
        self._step_staging: list[cd.PinnedBuffer] = [self.staging]
        self._steps_ids: list[tuple[cd.DeviceMemory, cd.PinnedBuffer] | None] = [None, None]
        self._steps_done: list[cd.Event | None] = [None, None]
        self._pending: list[StepsTicket | None] = [None, None]
        self._submits = 0
        #: the last submission, while the argmax ids on the device are its last step's (a chained one's input)
        self._last_ticket: StepsTicket | None = None

    def greedy_tokens_steps(self, steps: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
        """``K = len(steps)`` decode steps back to back, ``i64[K, S]``: step ``j > 0`` takes step ``j - 1``'s ids as
        its ``input_ids`` (its own are placeholders), so only the first step's ids must be real (module docstring,
        "Decode steps"). For ``K >= 2`` (``steps_graph_enabled``) and with the step kernel built, the ``K`` steps run
        as one CUDA graph, captured once per (bucket, ``K``, parity), after one copy of every step's inputs; else the
        bucket's graph runs once per step with stream copies in between, no host round trip. The ids are those of
        ``greedy_tokens`` step by step. Without the device argmax or CUDA graphs, or for steps that are not one
        decode token per sequence, it runs ``greedy_tokens`` step by step (same ids, host in between)."""
        return self.collect_greedy_steps(self.submit_greedy_steps(steps))

    def submit_greedy_steps(self, steps: Sequence[Mapping[str, np.ndarray]], chained: bool = False) -> StepsTicket:
        """Queue ``greedy_tokens_steps(steps)`` and return at once; ``collect_greedy_steps`` waits for its ids (the
        engine's overlap, runtime/engine.py "Overlap"). ``chained``: step 0's ``input_ids`` are the last ids of the
        previous submission, which must be this executor's last work and have the same rows (fed on the device;
        its own are placeholders). Two submissions may be in flight, each with its own staging, ids and (for one
        graph of the ``K`` steps) graph: a third waits for the older. Without the device argmax or CUDA graphs, or
        for steps that are not one decode token per sequence, the steps run before this returns."""
        k = len(steps)
        if not k:
            raise ValueError("decode steps: no steps")
        s = len(steps[0]["seq_lens"])
        for j, feeds in enumerate(steps):
            if len(feeds["seq_lens"]) != s:
                raise ValueError(f"decode steps: step {j} has {len(feeds['seq_lens'])} sequences, step 0 has {s}")
        prev = self._last_ticket
        if chained and (prev is None or prev.s != s):
            raise ValueError("chained decode steps need the previous submission's ids for the same rows, and it must "
                             "be the executor's last work")
        ids_in = next((v for v in self.inputs if v.name == "input_ids"), None)
        bucket = self._decode_bucket(steps[0]) if self.cuda_graphs and self.argmax is not None else None
        if bucket is None or ids_in is None or ids_in.type.dtype != DType.i64:
            if chained:
                steps = [{**steps[0], "input_ids": self.collect_greedy_steps(prev)[-1]}, *steps[1:]]
            for t in self._pending:
                if t is not None:
                    self.collect_greedy_steps(t)
            out: list[np.ndarray] = []
            for feeds in steps:
                out.append(self.greedy_tokens(feeds if not out else {**feeds, "input_ids": out[-1]}))
            ticket = StepsTicket(k, s, -1)
            ticket.ids = np.stack(out)
            self._last_ticket = ticket
            return ticket
        self.ctx.make_current()
        p = self._free_parity()
        stream = self.stream
        tokens = self.argmax.tokens.ptr
        if self.step_kernel is not None and steps_graph_enabled(k):
            sg = self._steps_graph(bucket, k, p)
            for st, feeds in zip(sg.steps, steps):
                self._write_decode(st, feeds)
            ids_offset = int(self.buffers["input_ids"]["offset"])
            sg.enqueue(stream, (tokens, ids_offset, s) if chained else None)
            return self._submitted(StepsTicket(k, s, p, sg.ids_host, width=bucket), chained)
        graph = self._bucket_graph(bucket)
        dev, host = self._steps_ids_buffers(k * s * 8, p)
        io = self.arena.ptr + self.base["io"]
        input_ids = self.address("input_ids")
        for j, feeds in enumerate(steps):
            copy = 1 + 2 * j + p
            staging = self._staging_copy(copy)
            end = self._stage_decode(feeds, bucket, copy)
            cd.memcpy_htod(io, staging.ptr, end, stream)
            if j or chained:
                cd.memcpy_dtod(input_ids, tokens, s * 8, stream)
            graph.launch(stream)
            cd.memcpy_dtod(dev.ptr + j * s * 8, tokens, s * 8, stream)
        cd.memcpy_dtoh(host.ptr, dev.ptr, k * s * 8, stream)
        return self._submitted(StepsTicket(k, s, p, host), chained)

    def _free_parity(self) -> int:
        """The staging parity for the next submission: one with nothing in flight (0 first, so that calls one at a
        time keep to one set of buffers), else the older submission's, after waiting for it."""
        for p, t in enumerate(self._pending):
            if t is None:
                return p
        oldest = min((t for t in self._pending if t is not None), key=lambda t: t.seq)
        self.collect_greedy_steps(oldest)
        return oldest.parity

    def _submitted(self, ticket: StepsTicket, chained: bool) -> StepsTicket:
        """Record the event after ``ticket``'s queued work and file it as its parity's submission in flight."""
        p = ticket.parity
        done = self._steps_done[p]
        if done is None:
            done = self._steps_done[p] = cd.Event()
        done.record(self.stream)
        ticket.done = done
        ticket.seq = self._submits
        self._submits += 1
        self._pending[p] = ticket
        self._last_ticket = ticket
        self.stats["graph_steps"] += ticket.k
        self.stats["argmax_steps"] += ticket.k
        self.stats["multi_steps"] += 1
        self.stats["chained_submits"] += int(chained)
        return ticket

    def collect_greedy_steps(self, ticket: StepsTicket) -> np.ndarray:
        """The ids ``i64[K, S]`` of a ``submit_greedy_steps`` call, once its copy back is done (waits for it only)."""
        if ticket.ids is None:
            assert ticket.done is not None and ticket.host is not None
            ticket.done.synchronize()
            ticket.ids = ticket.host.view(0, np.int64, (ticket.k, ticket.width))[:, : ticket.s].copy()
            if self._pending[ticket.parity] is ticket:
                self._pending[ticket.parity] = None
        return ticket.ids

    def _steps_graph(self, bucket: int, k: int, parity: int = 0) -> StepsGraph:
        """The (bucket, K) graph with its buffers, captured on first use: for each step ``j`` the step kernel
        (``step = j``: step ``j``'s inputs into the io region, the previous step's ids into ``input_ids`` and row
        ``j - 1`` of the ids) and the bucket's launches and argmax (``_record_graph``); last, the step kernel with
        ``step = K`` (row ``K - 1`` of the ids). The staging's constant inputs are written here, once."""
        sg = self.steps_graphs.get((bucket, k, parity))
        if sg is not None:
            return sg
        assert self.step_kernel is not None and self.argmax is not None
        sg = StepsGraph(bucket, k, self._bucket_layout(bucket))
        for st in sg.steps:
            self._write_constants(st, bucket)
        fn, spec = self.step_kernel
        buffers = {"staged": sg.staged.ptr, "io": self.arena.ptr + self.base["io"], "tokens": self.argmax.tokens.ptr,
                   "out_ids": sg.ids.ptr}
        args = {p.name: {"buffer": p.name} if p.ctype == "ptr" else {"dim": p.name} for p in spec.params}
        feed = Launch(fn, spec, args, buffers.__getitem__, "decode step inputs",
                      pdl=frozenset((spec.entry,)) if cd.pdl_enabled() else frozenset())
        ints = {"nbytes": sg.end, "stride": sg.stride, "steps": k, "rows": bucket,
                "ids_offset": int(self.buffers["input_ids"]["offset"])}
        dims = self._graph_dims(bucket)

        def record() -> None:
            for j in range(k):
                feed.enqueue({**ints, "step": j}, self.stream)
                self._record_graph(dims)
            feed.enqueue({**ints, "step": k}, self.stream)

        self.stream.synchronize()
        try:
            sg.graph = cd.CudaGraph(self.stream, record)
        except BaseException:
            sg.free()
            raise
        self.steps_graphs[(bucket, k, parity)] = sg
        self.stats["steps_graphs"] += 1
        return sg

    def _staging_copy(self, j: int) -> cd.PinnedBuffer:
        """Pinned staging copy ``j`` for ``submit_greedy_steps`` (0: ``staging``), made on first use."""
        if len(self._step_staging) <= j:
            # up to the end of the largest bucket's inputs (``staging`` also spans the outputs: the logits)
            dims = self._graph_dims(self.buckets[-1])
            nbytes = max(int(self.buffers[v.name]["offset"]) + v.type.dtype.np.itemsize * int(
                np.prod([eval_dim(d, dims) for d in (v.type.shape or ())], dtype=np.int64)) for v in self.inputs)
            while len(self._step_staging) <= j:
                self._step_staging.append(cd.PinnedBuffer(min(nbytes, self.staging.nbytes)))
                self._staged_bucket.append(None)
        return self._step_staging[j]

    def _steps_ids_buffers(self, nbytes: int, parity: int) -> tuple[cd.DeviceMemory, cd.PinnedBuffer]:
        bufs = self._steps_ids[parity]
        if bufs is None or bufs[0].nbytes < nbytes:
            if bufs is not None:
                self.stream.synchronize()
                for b in bufs:
                    b.free()
            bufs = self._steps_ids[parity] = (cd.DeviceMemory(nbytes), cd.PinnedBuffer(nbytes))
        return bufs

    def _free_submissions(self) -> None:
        """Free the K-step graphs and the submissions' buffers (``close``)."""
        for sg in self.steps_graphs.values():
            sg.free()
        self.steps_graphs.clear()
        for staging in self._step_staging:  # [0] is the executor's staging
            staging.free()
        for bufs in self._steps_ids:
            for b in bufs or ():
                b.free()
        for ev in self._steps_done:
            if ev is not None:
                ev.destroy()
