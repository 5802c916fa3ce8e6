"""The CUDA backend's launches: one kernel-table entry (``codegen/lower.py``) each, argument blocks packed once.

``Launch`` is a template kernel with its decode variants (chosen by the step's row count), skipped steps (decode
fusion) and PDL; ``CutlassLaunch`` a CUTLASS GEMM launched from its cubin with a Params blob built here;
``CollectiveLaunch`` a tensor-parallel ``all_reduce`` through NCCL; ``GreedyArgmax`` the greedy-sampling kernel.
``CudaExecutor`` (``runtime/cuda_backend.py``) builds them from the kernel table and enqueues them in order.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..codegen.kernel import KernelSpec
from . import cuda_driver as cd


class CudaArtifactError(ValueError):
    """The artifact cannot run on this device (no CUDA kernels, another architecture, bounds exceeded)."""


def address_of(handle: Any) -> int:
    """A driver handle's (CUstream's) value as an integer, for C APIs called through ctypes (NCCL)."""
    try:
        return int(handle)
    except TypeError:
        return int(ctypes.c_void_p.from_address(int(handle.getPtr())).value or 0)


class Arguments:
    """A kernel's argument block, packed once (pointers fixed in the arena); its integer arguments set per step."""

    def __init__(self, spec: KernelSpec, args: Mapping[str, Mapping[str, Any]], address: Any) -> None:
        self.values: list[Any] = []
        self.dims: list[tuple[str, Any, Any]] = []  # (param name, ctypes object, dim expression)
        for p in spec.params:
            a = args[p.name]
            if p.ctype == "ptr":
                v = ctypes.c_uint64(0 if "null" in a else address(a["buffer"]))
            else:
                ctor = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float}[p.ctype]
                v = ctor(0)
                if "dim" in a:
                    self.dims.append((p.name, v, a["dim"]))
                else:
                    v.value = a["value"]
            self.values.append(v)
        self.params = (ctypes.c_void_p * len(self.values))(*[ctypes.addressof(v) for v in self.values])
        self.addr = ctypes.addressof(self.params)

    def set(self, dims: Mapping[Any, int]) -> dict[str, int]:
        """Write the step's integer arguments; returns them by name (for the grid)."""
        ints = {}
        for name, obj, expr in self.dims:
            obj.value = ints[name] = dims[expr]
        return ints


#: a launch's variant: (max rows, function, spec, its own argument block or None: the launch's); the function a
#: ``CutlassRunner`` for a CUTLASS GEMM variant
Variant = tuple[int, Any, KernelSpec, Arguments | None]


class Launch:
    """One kernel launch with its argument block packed once; integer arguments set per step.

    ``variants``: ``(max_rows, fn, spec, args)``, smallest first, kernels run instead when the ``rows_arg`` argument
    (the step's row count: ``M`` for linears, ``num_tokens`` for attention) is at most ``max_rows`` (the decode GEMV
    for ``linear``, the decode kernel beside the prefill attention kernel, ``codegen/lower.py``), with the launch's
    arguments or, where ``args`` is given, their own (a fused decode GEMV reading a skipped launch's input,
    ``codegen/decode_fusion.py``). ``skip_rows``: nothing is launched when the row count is at most this (that
    launch's work is done by a later launch's fused variant). A CUDA graph captured for a bucket holds what was
    chosen for that bucket."""

    def __init__(self, fn: Any, spec: KernelSpec, args: Mapping[str, Mapping[str, Any]],
                 address: Any, what: str, variants: Sequence[Variant] = (),
                 rows_arg: str = "M", pdl: frozenset[str] = frozenset(), skip_rows: int = 0) -> None:
        self.fn, self.spec, self.what = fn, spec, what
        #: launched with programmatic stream serialization (their kernels wait for the grid before them)
        self.pdl = spec.entry in pdl
        self.variant_pdl = [v[2].entry in pdl for v in variants]
        self.variants = list(variants)
        self.variant_launches = 0
        self.skip_rows, self.skips = skip_rows, 0
        self.args = Arguments(spec, args, address)
        self.values, self.params_addr = self.args.values, self.args.addr
        names = [p.name for p in spec.params]
        chooses = self.variants or skip_rows > 0
        self.rows = self.values[names.index(rows_arg)] if chooses and rows_arg in names else None

    def _enqueue_variant(self, m: int, ints: Mapping[str, int], dims: Mapping[Any, int],
                         stream: cd.Stream) -> str | None:
        """Launch the first variant covering ``m`` rows; its entry, or None when none does."""
        for (max_rows, fn, spec, own), pdl in zip(self.variants, self.variant_pdl):
            if m <= max_rows:
                self.variant_launches += 1
                if isinstance(fn, CutlassRunner):  # another CUTLASS configuration (the launch's own arguments)
                    return fn(m, stream)
                if own is None:
                    cd.launch(fn, spec.grid_dims(ints), spec.block, spec.smem, stream, self.params_addr, self.what,
                              pdl)
                else:
                    cd.launch(fn, spec.grid_dims(own.set(dims)), spec.block, spec.smem, stream, own.addr, self.what,
                              pdl)
                return spec.entry
        return None

    def enqueue(self, dims: Mapping[Any, int], stream: cd.Stream) -> str | None:
        """Queue the launch for the step's ``dims``; returns the kernel entry launched (None: an empty grid or a
        skipped launch)."""
        ints = self.args.set(dims)
        grid = self.spec.grid_dims(ints)
        if min(grid) <= 0:
            return None
        if self.rows is not None:
            m = int(self.rows.value)
            if m <= self.skip_rows:
                self.skips += 1
                return None
            entry = self._enqueue_variant(m, ints, dims, stream)
            if entry is not None:
                return entry
        cd.launch(self.fn, grid, self.spec.block, self.spec.smem, stream, self.params_addr, self.what, self.pdl)
        return self.spec.entry


def cutlass_nk(weight: Mapping[str, Any]) -> tuple[int, int]:
    """N and K of a CUTLASS GEMM launch from its weight buffer's memory-plan entry (``dtype``, ``shape``): ``[N, K]``,
    or ``u8[N, K/2]`` for packed E2M1 pairs (the block-scaled GEMM of W4A4 linears)."""
    n, k = (int(d) for d in weight["shape"])
    return n, 2 * k if weight["dtype"] == "u8" else k


#: prepared CUTLASS launches kept per launch (a few KB each: the decode buckets and the usual prefill sizes fit; a
#: rebuild costs ~0.1 ms of host time)
PREPARED_MAX = 64


class CutlassRunner:
    """A CUTLASS GEMM's launches from its cubin alone (``codegen/kernels/gemm_cutlass/cutlass_params.py``): the Params
    blob built from the kernel table's layout once per row count M and stream (buffers are fixed in the arena), then
    launched with its cluster shape. A ``CutlassLaunch``'s primary kernel, or one of its variants (a short-step
    configuration, ``gemm_cutlass/rule.py`` ``SHORT_M_TIERS``)."""

    def __init__(self, fn: Any, entry: str, layout: Mapping[str, Any], pointers: Mapping[str, int], n: int, k: int,
                 sm_count: int) -> None:
        self.fn, self.entry, self.layout, self.pointers = fn, entry, layout, dict(pointers)
        self.n, self.k, self.sm_count = n, k, sm_count
        #: (row count, stream) -> the launch prepared for it (Params blob and driver objects built once); at most
        #: PREPARED_MAX, then started afresh (chunked prefill makes a new row count almost every step)
        self.prepared: dict[tuple[int, int], Any] = {}

    def __call__(self, m: int, stream: cd.Stream) -> str:
        from ..codegen.kernels.gemm_cutlass import cutlass_params

        key = (m, address_of(stream.handle))
        prepared = self.prepared.get(key)
        if prepared is None:
            if len(self.prepared) >= PREPARED_MAX:
                self.prepared.clear()
            blob, config = cutlass_params.build_params(self.layout, self.pointers, m, self.n, self.k, self.sm_count)
            prepared = self.prepared[key] = cutlass_params.PreparedLaunch(blob, config, stream.handle)
        prepared(self.fn)
        return self.entry


def pointer_args(spec: KernelSpec, args: Arguments) -> dict[str, int]:
    """A packed argument block's pointers by parameter name (a CUTLASS GEMM's Params take them by name)."""
    return {p.name: int(v.value or 0) for v, p in zip(args.values, spec.params) if p.ctype == "ptr"}


class CutlassLaunch(Launch):
    """A launch of a CUTLASS GEMM (``CutlassRunner``); small M still runs the launch's variants, GEMV ones or other
    CUTLASS configurations (a variant whose function is a ``CutlassRunner``)."""

    def __init__(self, fn: Any, spec: KernelSpec, args: Mapping[str, Mapping[str, Any]], address: Any, what: str,
                 variants: Sequence[Variant], layout: Mapping[str, Any], n: int, k: int,
                 sm_count: int, pdl: frozenset[str] = frozenset()) -> None:
        super().__init__(fn, spec, args, address, what, variants, pdl=pdl)
        self.runner = CutlassRunner(fn, spec.entry, layout, pointer_args(spec, self.args), n, k, sm_count)
        names = [p.name for p in spec.params]
        self.m_value = self.values[names.index("M")]

    def enqueue(self, dims: Mapping[Any, int], stream: cd.Stream) -> str | None:
        ints = self.args.set(dims)
        m = int(self.m_value.value)
        if m <= 0:
            return None
        entry = self._enqueue_variant(m, ints, dims, stream)
        if entry is not None:
            return entry
        return self.runner(m, stream)


class CollectiveLaunch:
    """An ``all_reduce`` node of a tensor-parallel rank's kernel table (``codegen/lower.py``): ``ncclAllReduce``
    of the ``x`` buffer into ``out`` on the executor's stream (captured into the decode graphs like a kernel).
    The communicator (``runtime/tp/nccl.py``) is attached by the TP runtime (``CudaExecutor.set_communicator``)."""

    def __init__(self, entry: Mapping[str, Any], address: Any) -> None:
        args = entry["args"]
        self.send, self.recv = address(args["x"]["buffer"]), address(args["out"]["buffer"])
        self.count = args["count"]["dim"]
        self.dtype = str(entry["dtype"])
        self.what = f"all_reduce {entry.get('source', '')}".strip()
        self.communicator: Any = None
        self.variant_launches = 0

    def enqueue(self, dims: Mapping[Any, int], stream: cd.Stream) -> str | None:
        if self.communicator is None:
            raise CudaArtifactError(f"{self.what}: this artifact is one rank of a tensor-parallel group; run it "
                                    "through the TP runtime (ingot.LLM / ingot.load on the TP artifact)")
        self.communicator.all_reduce(self.send, self.recv, int(dims[self.count]), self.dtype, address_of(stream.handle))
        return "all_reduce"


class GreedyArgmax(Launch):
    """The greedy-sampling kernel (``codegen/kernels/sampling``) over the logits buffer: ``S`` rows' argmax into
    a device ``i64`` buffer (``num_rows`` is the ``S`` dim), read back through a pinned copy of its own."""

    def __init__(self, fn: Any, spec: KernelSpec, logits: int, max_rows: int) -> None:
        self.tokens = cd.DeviceMemory(max_rows * 8)
        self.host = cd.PinnedBuffer(max_rows * 8)
        buffers = {"logits": logits, "tokens": self.tokens.ptr}
        args = {"logits": {"buffer": "logits"}, "tokens": {"buffer": "tokens"}, "num_rows": {"dim": "S"}}
        super().__init__(fn, spec, args, buffers.__getitem__, "greedy argmax")

    def read(self, rows: int, stream: cd.Stream) -> np.ndarray:
        """The first ``rows`` ids, once the stream has computed them."""
        cd.memcpy_dtoh(self.host.ptr, self.tokens.ptr, rows * 8, stream)
        stream.synchronize()
        return self.host.view(0, np.int64, (rows,)).copy()

    def free(self) -> None:
        self.tokens.free()
        self.host.free()
