"""The CUDA backend: runs a GPU artifact's kernel table (``codegen/lower.py``) on one device.

Loading (``CudaExecutor``): the primary context of the device; the artifact's architecture checked
against the device's (an ``sm_100a`` artifact on an H200 fails with a message naming both); one
arena allocation laid out by the artifact's memory plan (weights | io | scratch | KV cache, the last
sized here from ``num_blocks`` or the free memory); the weights uploaded once; one module per kernel
from its cubin; one non-blocking stream. Every driver call is checked (``runtime/cuda_driver.py``).

A step: the inputs are written into a pinned host staging copy of the io region and sent in one
``cuMemcpyHtoDAsync``; the launches follow in node order, their integer arguments and grids
evaluated from the step's dims (``T``, ``S``, ...); the outputs come back with ``cuMemcpyDtoHAsync``.
Inputs larger than the compiled bounds are refused with a message naming the bound.

**Decode steps run as CUDA graphs** (serving form): a step in which every sequence has exactly one
new token (``T == S``) is padded to the next batch-size bucket (1, 2, 4, ..., up to the compiled
``S``), its inputs copied into the fixed io buffers, and the bucket's graph, captured once on first
use (``cuStreamBeginCapture`` / ``cuGraphInstantiate``), is replayed (``cuGraphLaunch``). Padding rows
write no KV (slot -1) and attend to one position of block 0; their logits are dropped. The padded inputs
are written straight into typed views of the pinned staging copy (no per-step arrays). With
``device_argmax`` the graph ends with the greedy-sampling kernel (docs/SERVING_FORM.md, "Greedy sampling on
the device"), whose ids ``greedy_tokens`` copies back instead of the logits. Steps with
prefill tokens, or more sequences than the largest bucket, run as plain launches.

**Decode steps** (``greedy_tokens_steps`` / ``submit_greedy_steps``, the engine's ``decode_steps`` and its overlap):
``K`` decode steps of one bucket queued without a host round trip, as one CUDA graph or the bucket's graph per step,
two submissions in flight at once: ``runtime/cuda_steps.py`` (``DecodeSteps``, which ``CudaExecutor`` mixes in).

**The engine's interface** (``runtime/engine.py`` and ``runtime/paged.py`` call the CPU backend the
same way)::

    ex = CudaExecutor.from_artifact("m.ingot", num_blocks=1024)     # or CudaExecutor(graph, manifest)
    logits = ex.run(step_inputs)["logits"]    # step_inputs: docs/SERVING_FORM.md's names, numpy arrays
    logits = ex.logits(step_inputs)           # the same, as the array
    ids = ex.greedy_tokens(step_inputs)       # argmax per row, i64[S]; with device_argmax=True taken on the GPU
    ids = ex.greedy_tokens_steps([s0, s1, ...])  # i64[K, S]: step j + 1's input ids are step j's ids

``run(feeds, check=False)`` has ``CpuExecutor.run``'s signature and result (a dict of output arrays), so
an engine can hold either executor. The KV cache lives on the device, owned by the executor
(``ex.num_blocks`` blocks of ``ex.block_size`` tokens): ``kv_cache.*`` feeds are ignored, and the
engine should not allocate host caches for this device. ``CudaPagedModel`` is ``PagedModel`` (the CPU
paged driver) over this executor; ``CudaModel`` is ``ingot.load(..., device="cuda")``'s graph-mode model.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..codegen.kernel import KernelSpec
from ..codegen.memory_plan import ALIGN, eval_dim
from ..ir.graph import Graph
from ..ir.types import DType
from . import cuda_driver as cd
from .artifact import GraphSignature
from .cuda_driver import CudaUnavailable  # noqa: F401  (re-exported for callers)
from .cuda_launch import (
    Arguments,
    CollectiveLaunch,
    CudaArtifactError,
    CutlassLaunch,
    CutlassRunner,
    GreedyArgmax,
    Launch,
    cutlass_nk,
    pointer_args,
)
from .cuda_steps import DecodeSteps, Layout, StagedBucket, StepsGraph
from .kv_tma import fill_kv_tma, fill_w_tma, needs_kv_tma, needs_w_tma, w_tma_region
from .paged import PagedModel, SequenceState

if TYPE_CHECKING:
    from ..codegen.target import Target

log = logging.getLogger("ingot.cuda")

#: decode batch-size buckets captured as CUDA graphs (capped by the compiled max_num_seqs)
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: share of the free device memory the KV cache takes when neither num_blocks nor kv_cache_bytes is given
DEFAULT_KV_FRACTION = 0.5


def device_arch(ctx: cd.Context) -> str:
    major, minor = ctx.compute_capability
    return f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


#: dynamic shared memory a kernel may use without raising its limit (cuFuncSetAttribute)
DEFAULT_SMEM_LIMIT = 48 * 1024


def block_runs(block_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(position in block_ids, first block id, count)`` of each run of consecutive block ids (one copy each)."""
    runs: list[tuple[int, int, int]] = []
    for j, b in enumerate(int(x) for x in block_ids):
        if runs and runs[-1][1] + runs[-1][2] == b:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((j, b, 1))
    return runs


def kv_block_copies(layer_addrs: Sequence[int], block_bytes: int, block_ids: Sequence[int], buffer: int,
                    to_buffer: bool) -> list[tuple[int, int, int]]:
    """The ``(dst, src, nbytes)`` copies between a paged KV cache and a contiguous transfer buffer.

    The cache of layer ``l`` holds ``[num_blocks, 2, block_size, kv_heads, head_dim]`` at ``layer_addrs[l]``;
    the buffer holds ``[num_layers, len(block_ids), 2, block_size, kv_heads, head_dim]`` (the transfer's
    layout, runtime/disagg/layout.py): block ``block_ids[j]`` of layer ``l`` at ``(l * len(block_ids) + j) *
    block_bytes``. Runs of consecutive block ids are one copy per layer."""
    nb = len(block_ids)
    runs = block_runs(block_ids)
    copies = []
    for layer, base in enumerate(layer_addrs):
        for j, b, k in runs:
            cache, buf = base + b * block_bytes, buffer + (layer * nb + j) * block_bytes
            copies.append((buf, cache, k * block_bytes) if to_buffer else (cache, buf, k * block_bytes))
    return copies


#: ``CudaExecutor.profile``'s stream gate: one thread spinning on the global nanosecond timer
_SPIN_SOURCE = """
extern "C" __global__ void ingot_spin(long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
}
"""


class CudaExecutor(DecodeSteps):
    """A GPU artifact's graph on one device; ``run`` has ``CpuExecutor.run``'s interface (module docstring)."""

    def __init__(self, graph: Graph, manifest: Mapping[str, Any], path: str | os.PathLike | None = None, *,
                 num_blocks: int | None = None, kv_cache_bytes: int | None = None, device: int = 0,
                 cuda_graphs: bool = True, device_argmax: bool = False) -> None:
        cuda = manifest.get("cuda")
        target = manifest.get("target", "?")
        if not isinstance(cuda, dict):
            raise CudaArtifactError(f"{path or 'artifact'}: compiled for target {target!r}, it has no CUDA kernels; "
                                    "recompile with --target h200, h100 or b200 to run it with device='cuda'")
        if path is None:
            raise CudaArtifactError("the CUDA backend needs the artifact's directory (its kernels/*.cubin)")
        self.path = Path(path)
        self.graph, self.manifest, self.cuda = graph, manifest, cuda
        self.ctx = cd.Context(device)
        arch = device_arch(self.ctx)
        if cuda["arch"] != arch:
            raise CudaArtifactError(
                f"{self.path}: compiled for {cuda['arch']} (target {target}), but device {device} is {self.ctx.name} "
                f"({arch}); recompile with --target {'b200' if arch.startswith('sm_100') else 'h200'}")
        plan = cuda["memory_plan"]
        self.plan = plan
        self.bounds: dict[str, int] = {k: int(v) for k, v in plan["bindings"].items()}
        self.buffers: dict[str, dict[str, Any]] = plan["buffers"]
        regions = plan["regions"]
        kv = plan["kv_cache"]
        self.kv_inputs: list[str] = list(kv["inputs"])
        spec = manifest.get("kv_cache") if isinstance(manifest.get("kv_cache"), dict) else None
        self.serving = spec is not None
        self.block_size = int(spec["block_size"]) if spec else 0
        per_block = int(kv["bytes_per_block"]) * max(len(self.kv_inputs), 1)
        self.stream = cd.Stream()
        fixed = _align(regions["weights"]) + _align(regions["io"]) + _align(regions["scratch"])
        if self.kv_inputs:
            if num_blocks is None:
                budget = kv_cache_bytes if kv_cache_bytes else int(
                    (self.ctx.mem_info()[0] - fixed) * DEFAULT_KV_FRACTION)
                num_blocks = budget // per_block
            if num_blocks < 1:
                raise CudaArtifactError(f"the KV cache budget holds no block ({per_block} bytes per block)")
        self.num_blocks = int(num_blocks or 0)
        self.kv_layer_bytes = int(kv["bytes_per_block"]) * self.num_blocks
        self.base = {"weights": 0, "io": _align(regions["weights"])}
        self.base["scratch"] = self.base["io"] + _align(regions["io"])
        self.base["kv"] = self.base["scratch"] + _align(regions["scratch"])
        total = self.base["kv"] + self.kv_layer_bytes * len(self.kv_inputs)
        self.arena = cd.DeviceMemory(total)
        self.arena_bytes = total
        cd.memset(self.arena.ptr + self.base["io"], total - self.base["io"], 0)
        self._upload_weights()
        self.modules: dict[str, cd.Module] = {}
        self.launches: list[Launch] = []
        functions = {}
        tables = (cuda["kernels"], cuda.get("variant_kernels", {}), cuda.get("alternative_kernels", {}))
        skinny_reads: dict[str, list[str]] | None = None  # the skinny GEMMs' weights, on the first such module
        for entry, k in {key: v for table in tables for key, v in table.items()}.items():
            module = cd.Module((self.path / k["cubin"]).read_bytes(), entry)
            self.modules[entry] = module
            fn, kspec = module.function(entry), KernelSpec.from_dict(k["spec"])
            # a CUTLASS GEMM's dynamic shared memory is its layout's (the spec's is the most a block may take: a
            # kernel with static shared memory too, the FP8 direct epilogue's, may not opt into all of it)
            smem = int(k["cutlass"]["smem"]) if "cutlass" in k else kspec.smem
            if smem > DEFAULT_SMEM_LIMIT:
                attr = cd.driver().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                cd.check(cd.driver().cuFuncSetAttribute(fn, attr, smem), f"cuFuncSetAttribute({entry})")
            functions[entry] = (fn, kspec)
            if needs_kv_tma(kspec):  # K/V by TMA: the tensor map over the whole KV region (every layer's cache)
                if not self.kv_inputs:
                    raise CudaArtifactError(f"{entry} loads a KV cache by TMA, but the artifact has no KV cache")
                fill_kv_tma(module.handle, kspec, self.arena.ptr + self.base["kv"],
                            self.kv_layer_bytes * len(self.kv_inputs))
            if needs_w_tma(kspec):  # the skinny GEMM: its weight's tensor map over the weights region
                skinny_reads = self._skinny_weight_reads(cuda) if skinny_reads is None else skinny_reads
                self._fill_w_tma(module, kspec, entry, skinny_reads.get(entry, ()))
        use_cutlass = os.environ.get("INGOT_NO_CUTLASS", "") in ("", "0")
        # kernels with the PDL prologue, as the kernel table marks them (codegen/kernel.py); INGOT_PDL=0: none
        pdl = frozenset(e for table in tables for e, k in table.items() if k.get("pdl")) if cd.pdl_enabled() \
            else frozenset()
        self.pdl_kernels = pdl
        self.collectives: list[CollectiveLaunch] = []
        for ln in cuda["launches"]:
            if "collective" in ln:  # tensor parallelism: an all_reduce between the ranks (runtime/tp)
                self.collectives.append(CollectiveLaunch(ln, self.address))
                self.launches.append(self.collectives[-1])  # type: ignore[arg-type]
                continue
            fn, kspec = functions[ln["kernel"]]
            layout = cuda["kernels"].get(ln["kernel"], {}).get("cutlass")
            n = k = 0
            if layout is not None:
                n, k = cutlass_nk(self.buffers[ln["args"]["weight"]["buffer"]])
            variants = []
            for v in ln.get("variants", ()):
                vfn, vspec = functions[v["kernel"]]
                own = Arguments(vspec, v["args"], self.address) if "args" in v else None
                vlayout = cuda.get("variant_kernels", {}).get(v["kernel"], {}).get("cutlass")
                if vlayout is not None:  # another CUTLASS configuration for short steps (gemm_cutlass SHORT_M_TIERS)
                    if not use_cutlass:  # the plain alternative takes those steps too
                        continue
                    ptrs = pointer_args(vspec, own or Arguments(vspec, ln["args"], self.address))
                    vfn = CutlassRunner(vfn, vspec.entry, vlayout, ptrs, n, k, self.ctx.num_sms)
                variants.append((int(v["max_rows"]), vfn, vspec, own))
            if layout is not None and use_cutlass:  # a CUTLASS GEMM: Params built here (codegen/lower.py)
                self.launches.append(CutlassLaunch(fn, kspec, ln["args"], self.address, f"{ln['op']} {ln['kernel']}",
                                                    variants, layout, n, k, self.ctx.num_sms, pdl))
                continue
            if layout is not None:  # the launch's plain alternative, taking the same arguments
                if not ln.get("alternatives"):  # the block-scaled FP4 GEMM (W4A4 on b200), the W8A8 FP8 one: none
                    raise CudaArtifactError(f"{ln['op']} {ln['kernel']}: a CUTLASS GEMM without a plain alternative; "
                                            "this artifact needs the CUTLASS launch path (unset INGOT_NO_CUTLASS)")
                fn, kspec = functions[ln["alternatives"][0]["kernel"]]
            self.launches.append(Launch(fn, kspec, ln["args"], self.address, f"{ln['op']} {ln['kernel']}",
                                         variants, ln.get("rows_arg", "M"), pdl,
                                         int(ln["skip"]["max_rows"]) if "skip" in ln else 0))
        self.exprs = {a["dim"] for ln in cuda["launches"]
                      for args in (ln["args"], *(v["args"] for v in ln.get("variants", ()) if "args" in v))
                      for a in args.values() if "dim" in a}
        self.staging = cd.PinnedBuffer(regions["io"])
        out_bytes = max((self.buffers[v.name]["nbytes"] for v in graph.outputs), default=1)
        self.out_staging = cd.PinnedBuffer(out_bytes)
        self.inputs = [v for v in graph.inputs if v.name not in self.kv_inputs]
        self.cuda_graphs = cuda_graphs and self.serving
        self.buckets = [b for b in GRAPH_BUCKETS if b <= self.bounds.get("S", 0)]
        self.graphs: dict[int, cd.CudaGraph] = {}
        #: ``steps_graphs``: captures of K-step graphs (``greedy_tokens_steps``), one per (bucket, K)
        self.stats = {"graph_steps": 0, "eager_steps": 0, "captures": 0, "argmax_steps": 0, "multi_steps": 0,
                      "steps_graphs": 0, "chained_submits": 0}
        self._staged: dict[tuple[int, int], StagedBucket] = {}  # (staging copy, bucket) -> views
        #: per staging copy, the bucket whose constant inputs it holds (copy 0 is ``staging``)
        self._staged_bucket: list[int | None] = [None]
        self._init_submissions()
        #: the greedy-sampling kernel (``greedy_tokens``); None: ``greedy_tokens`` takes the argmax on the host
        self.argmax: GreedyArgmax | None = self._load_argmax() if device_argmax and self.serving else None
        #: ``greedy_tokens_steps``' one graph per (bucket, K), and the kernel that feeds its steps (function, spec);
        #: None: the steps run one bucket graph each
        self.steps_graphs: dict[tuple[int, int, int], StepsGraph] = {}
        self.step_kernel: tuple[Any, KernelSpec] | None = self._load_step_kernel() if self.argmax is not None else None
        self.ctx.synchronize()

    @staticmethod
    def _skinny_weight_reads(cuda: Mapping[str, Any]) -> dict[str, list[str]]:
        """Skinny GEMM kernel entry -> the weight buffers its launches read (``skinny_rule.weight_reads``)."""
        from ..codegen.kernels.gemv.skinny_rule import weight_reads

        specs = {e: k["spec"] for e, k in cuda.get("variant_kernels", {}).items()}
        out: dict[str, list[str]] = {}
        for entry, name, _ in weight_reads(cuda["launches"], specs):
            out.setdefault(entry, []).append(name)
        return out

    def _fill_w_tma(self, module: cd.Module, kspec: KernelSpec, entry: str, names: Sequence[str]) -> None:
        """Fill the skinny GEMM module's weight tensor map over the weights region, after checking that every weight
        its launches read (``names``) starts a whole row from the region's start (``kv_tma.w_tma_region``)."""
        from ..codegen.kernels.gemv.skinny_rule import row_bytes

        pitch = row_bytes(kspec.values)
        weights = {}
        for name in names:
            buf = self.buffers[name]
            if buf["region"] != "weights":
                raise CudaArtifactError(f"{entry}: its weight {name} is not in the weights region")
            weights[name] = (int(buf["offset"]), int(buf["nbytes"]))
        try:
            nbytes = w_tma_region(int(self.plan["regions"]["weights"]), self.arena_bytes - self.base["weights"],
                                  pitch, weights)
        except ValueError as e:
            raise CudaArtifactError(f"{self.path}: {entry}: {e}") from None
        fill_w_tma(module.handle, kspec, self.arena.ptr + self.base["weights"], nbytes)

    def set_communicator(self, communicator: Any) -> None:
        """The tensor-parallel group's all-reduce (``runtime/tp/nccl.py``) for this rank's ``all_reduce`` launches."""
        for c in self.collectives:
            c.communicator = communicator

    def _load_argmax(self) -> GreedyArgmax | None:
        """Build the greedy-sampling kernel for the logits (``_runtime_kernel``); None, logged, where the artifact has
        no f32 ``logits [S, vocab]`` or no compiler is installed."""
        from ..codegen.kernels.sampling.rule import greedy_spec

        names = self.graph.output_names
        out = self.graph.outputs[names.index("logits")] if "logits" in names else None
        vocab = out.type.shape[-1] if out is not None and out.type.shape and len(out.type.shape) == 2 else None
        if out is None or out.type.dtype != DType.f32 or not isinstance(vocab, int):
            log.info("device argmax off: the artifact has no f32 logits [S, vocab] output")
            return None
        if "S" not in self.bounds:
            return None
        built = self._runtime_kernel(lambda target: greedy_spec(DType.f32, vocab, target),
                                     "device argmax off (greedy steps copy the logits to the host)")
        if built is None:
            return None
        return GreedyArgmax(built[0], built[1], self.address(out.name), self.bounds["S"])

    def _load_step_kernel(self) -> tuple[Any, KernelSpec] | None:
        """Build the kernel that feeds each step of a K-step graph (``codegen/kernels/copy/step_inputs.cu``); None,
        logged, where it does not compile."""
        from ..codegen.kernels.copy.step_rule import step_inputs_spec

        return self._runtime_kernel(step_inputs_spec, "decode steps as one graph off (one graph per step)")

    def _runtime_kernel(self, make: Callable[[Target], KernelSpec], off: str) -> tuple[Any, KernelSpec] | None:
        """A kernel the runtime adds to the artifact's (``make(target)`` for this executor's architecture), built by
        NVRTC or nvcc through the kernel cache and loaded: (function, spec); None where no target has the
        architecture, or, logged as ``off``, where it does not compile."""
        from ..codegen.compile import CompileError, CompilerUnavailable, compile_spec
        from ..codegen.target import gpu_targets

        target = next((t for t in gpu_targets() if t.arch == self.cuda["arch"]), None)
        if target is None:
            return None
        spec = make(target)
        try:
            cubin = compile_spec(spec).cubin
        except (CompilerUnavailable, CompileError, OSError) as e:
            log.warning("%s: %s", off, e)
            return None
        module = cd.Module(cubin, spec.entry)
        self.modules[spec.entry] = module
        return module.function(spec.entry), spec

    @classmethod
    def from_artifact(cls, path: str | os.PathLike, **kwargs: Any) -> CudaExecutor:
        from .artifact import load_graph

        graph, manifest = load_graph(path)
        return cls(graph, manifest, path, **kwargs)

    # -- memory --------------------------------------------------------------------------------------
    def address(self, name: str) -> int:
        b = self.buffers[name]
        if b["region"] == "kv":
            return self.arena.ptr + self.base["kv"] + int(b["offset"]) * self.kv_layer_bytes
        return self.arena.ptr + self.base[b["region"]] + int(b["offset"])

    def _upload_weights(self) -> None:
        for name, w in self.graph.weights.items():
            b = self.buffers[name]
            arr = np.ascontiguousarray(w.load())
            if arr.dtype != DType(b["dtype"]).np or arr.nbytes != b["nbytes"]:
                raise CudaArtifactError(f"weight {name}: {arr.dtype}{list(arr.shape)} does not match the memory plan")
            cd.memcpy_htod(self.address(name), arr.ctypes.data, arr.nbytes)
            w.release()

    def kv_cache(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s KV cache copied to the host (for tests)."""
        name = self.kv_inputs[layer]
        b = self.buffers[name]
        dt = DType(b["dtype"]).np
        out = np.empty((self.num_blocks, *[int(d) for d in b["shape"][1:]]), dt)
        self.ctx.synchronize()
        cd.memcpy_dtoh(out.ctypes.data, self.address(name), out.nbytes)
        return out

    # -- a request's KV blocks in and out (disaggregated serving, runtime/disagg) -------------------
    @property
    def kv_block_shape(self) -> tuple[int, ...]:
        """One layer's block: ``(2, block_size, kv_heads, head_dim)``."""
        return tuple(int(d) for d in self.buffers[self.kv_inputs[0]]["shape"][1:])

    @property
    def kv_dtype(self) -> np.dtype:
        return DType(self.buffers[self.kv_inputs[0]]["dtype"]).np

    @property
    def kv_block_bytes(self) -> int:
        return int(self.plan["kv_cache"]["bytes_per_block"])

    def _kv_copies(self, block_ids: Sequence[int], buffer: int, to_buffer: bool) -> list[tuple[int, int, int]]:
        if not self.kv_inputs:
            raise CudaArtifactError("this artifact has no KV cache")
        bad = [int(b) for b in block_ids if not 0 <= int(b) < self.num_blocks]
        if bad:
            raise ValueError(f"KV block ids {bad[:8]} are not in [0, {self.num_blocks})")
        return kv_block_copies([self.address(n) for n in self.kv_inputs], self.kv_block_bytes, block_ids, buffer,
                               to_buffer)

    def copy_kv_blocks_out(self, block_ids: Sequence[int], dst: int) -> None:
        """Copy the blocks (every layer) into the device buffer at ``dst`` in the transfer layout
        ``[layers, len(block_ids), 2, block_size, kv_heads, head_dim]``; returns when the copy is done. On the
        executor's stream, so it reads what the last step wrote and before the next step reuses the blocks."""
        self.ctx.make_current()
        for d, s, n in self._kv_copies(block_ids, dst, to_buffer=True):
            cd.memcpy_dtod(d, s, n, self.stream)
        self.stream.synchronize()

    def copy_kv_blocks_in(self, block_ids: Sequence[int], src: int) -> None:
        """The reverse of ``copy_kv_blocks_out``: the device buffer at ``src`` into the blocks; returns when done."""
        self.ctx.make_current()
        for d, s, n in self._kv_copies(block_ids, src, to_buffer=False):
            cd.memcpy_dtod(d, s, n, self.stream)
        self.stream.synchronize()

    def read_kv_blocks(self, block_ids: Sequence[int]) -> np.ndarray:
        """The blocks copied to the host: ``[layers, len(block_ids), 2, block_size, kv_heads, head_dim]``."""
        out = np.empty((len(self.kv_inputs), len(block_ids), *self.kv_block_shape), self.kv_dtype)
        self.ctx.make_current()
        self.stream.synchronize()
        base = out.ctypes.data
        for d, s, n in self._kv_copies(block_ids, base, to_buffer=True):
            cd.memcpy_dtoh(d, s, n)
        return out

    def write_kv_blocks(self, block_ids: Sequence[int], blocks: np.ndarray) -> None:
        """Host blocks (``read_kv_blocks``'s layout and dtype) into the cache."""
        want = (len(self.kv_inputs), len(block_ids), *self.kv_block_shape)
        if tuple(blocks.shape) != want or blocks.dtype != self.kv_dtype:
            raise ValueError(f"KV blocks {blocks.dtype}{list(blocks.shape)}, the cache needs "
                             f"{self.kv_dtype}{list(want)}")
        blocks = np.ascontiguousarray(blocks)
        self.ctx.make_current()
        for d, s, n in self._kv_copies(block_ids, blocks.ctypes.data, to_buffer=False):
            cd.memcpy_htod(d, s, n, self.stream)
        self.stream.synchronize()

    # -- steps ---------------------------------------------------------------------------------------
    def _bind(self, feeds: Mapping[str, np.ndarray], check: bool) -> tuple[dict[str, int], list[np.ndarray]]:
        dims: dict[str, int] = {}
        arrays = []
        for v in self.inputs:
            if v.name not in feeds:
                raise ValueError(f"missing input {v.name!r}")
            a = np.asarray(feeds[v.name])
            want = v.type.dtype.np
            if a.dtype != want:
                if check or a.dtype.kind != want.kind:
                    raise ValueError(f"input {v.name!r} must be {v.type.dtype.value}, got {a.dtype}")
                a = a.astype(want)
            shape = v.type.shape or ()
            if a.ndim != len(shape):
                raise ValueError(f"input {v.name!r} must have shape {v.type}, got {a.shape}")
            for d, n in zip(shape, a.shape):
                if isinstance(d, int):
                    if d != n:
                        raise ValueError(f"input {v.name!r} must have shape {v.type}, got {a.shape}")
                elif d.isidentifier():
                    if dims.setdefault(d, n) != n:
                        raise ValueError(f"input {v.name!r}: dim {d} is {n} here and {dims[d]} in another input")
            arrays.append(a)
        for d, n in dims.items():
            bound = self.bounds.get(d)
            if bound is not None and n > bound:
                what = {"T": "max_num_batched_tokens", "S": "max_num_seqs", "max_blocks": "max_model_len / block_size"}
                raise CudaArtifactError(
                    f"dim {d} = {n} exceeds the bound {bound} the artifact was compiled for"
                    f"{' (' + what[d] + ')' if d in what else ''}; recompile with a larger limit")
        return dims, arrays

    def _stage(self, arrays: Sequence[np.ndarray]) -> int:
        end = 0
        for v, a in zip(self.inputs, arrays):
            off = int(self.buffers[v.name]["offset"])
            n = a.nbytes
            if n:
                self.staging.array[off : off + n] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            end = max(end, off + n)
        return end

    def _enqueue(self, dims: Mapping[str, int]) -> None:
        values = {e: eval_dim(e, dims) for e in self.exprs}
        for ln in self.launches:
            ln.enqueue(values, self.stream)

    def _outputs(self, dims: Mapping[str, int]) -> dict[str, np.ndarray]:
        results = []
        off = 0
        for v in self.graph.outputs:
            shape = tuple(eval_dim(d, dims) for d in (v.type.shape or ()))
            dt = v.type.dtype.np
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            cd.memcpy_dtoh(self.out_staging.ptr, self.address(v.name), n, self.stream)
            self.stream.synchronize()
            results.append(self.out_staging.view(off, dt, shape).copy())
        return dict(zip(self.graph.output_names, results))

    def run(self, feeds: Mapping[str, np.ndarray], check: bool = True) -> dict[str, np.ndarray]:
        """One step (any graph): inputs by name (``kv_cache.*`` ignored), outputs by name."""
        return self._outputs(self._launch_step(feeds, check, argmax=False))

    def logits(self, step_inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The serving form's next-token logits ``f32[S, vocab]`` for one step."""
        return self.run(step_inputs, check=False)["logits"]

    def greedy_tokens(self, step_inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """One step, returning ``argmax(logits, axis=1)`` (``i64[S]``) instead of the logits: numpy's argmax
        exactly (first index on ties, NaN above every number). With ``device_argmax`` the argmax runs on the
        GPU (in the decode graphs, or launched after an eager step) and only ``S`` ids come back."""
        if self.argmax is None:
            return np.argmax(self.logits(step_inputs), axis=1)
        dims = self._launch_step(step_inputs, False, argmax=True)
        self.stats["argmax_steps"] += 1
        return self.argmax.read(int(dims["S"]), self.stream)

    def _launch_step(self, feeds: Mapping[str, np.ndarray], check: bool, argmax: bool) -> dict[str, int]:
        """Stage the inputs and queue one step (a decode graph, else plain launches, then the argmax when asked
        for); returns the step's dims (``S``: its sequences)."""
        self.ctx.make_current()
        self._last_ticket = None  # the argmax ids on the device are no longer a submission's
        if self.cuda_graphs:
            bucket = self._decode_bucket(feeds)
            if bucket is not None:
                return self._launch_graph(feeds, bucket)
        dims, arrays = self._bind(feeds, check)
        end = self._stage(arrays)
        self._staged_bucket[0] = None
        cd.memcpy_htod(self.arena.ptr + self.base["io"], self.staging.ptr, end, self.stream)
        self._enqueue(dims)
        if argmax and self.argmax is not None:
            self.argmax.enqueue({"S": dims["S"]}, self.stream)
        self.stats["eager_steps"] += 1
        return dims

    def profile(self, step_inputs: Mapping[str, np.ndarray], repeats: int = 5) -> list[dict[str, Any]]:
        """The GPU time of every launch of one step: ``[{"launch", "op", "source", "kernel", "us"}]`` in launch
        order, ``kernel`` the entry that ran (a variant for small steps), ``us`` the median over ``repeats`` runs
        of the step, each launch between two CUDA events. The stream is held by a spinning kernel while the step's
        launches and events are queued (Python queues a launch in tens of microseconds, slower than small kernels
        run), so the events see the GPU's own pace; plain launches, no CUDA graph, and the events keep PDL launches
        from overlapping, so the sum exceeds a graph step's time by the gaps that graphs and PDL hide. The step
        runs ``repeats`` times: its KV-cache writes repeat the same values. ``bench/bench_profile.py`` prints it
        grouped by op. Needs a CUDA compiler (NVRTC) for the spinning kernel."""
        from ..codegen.compile import compile_source

        self.ctx.make_current()
        dims, arrays = self._bind(step_inputs, False)
        end = self._stage(arrays)
        self._staged_bucket[0] = None
        values = {e: eval_dim(e, dims) for e in self.exprs}
        spin_mod = cd.Module(compile_source(_SPIN_SOURCE, self.cuda["arch"], "ingot_spin.cu").cubin, "ingot_spin")
        spin = spin_mod.function("ingot_spin")
        spin_ns = ctypes.c_int64(0)
        spin_params = (ctypes.c_void_p * 1)(ctypes.addressof(spin_ns))
        events = [cd.Event() for _ in range(len(self.launches) + 1)]
        times: list[list[float]] = [[] for _ in self.launches]
        ran: list[str | None] = [None] * len(self.launches)
        try:
            for _ in range(max(1, repeats)):
                cd.memcpy_htod(self.arena.ptr + self.base["io"], self.staging.ptr, end, self.stream)
                spin_ns.value = 200_000 + 100_000 * len(self.launches)  # longer than queueing the step takes
                cd.launch(spin, (1, 1, 1), (1, 1, 1), 0, self.stream, ctypes.addressof(spin_params), "ingot_spin")
                events[0].record(self.stream)
                for i, ln in enumerate(self.launches):
                    ran[i] = ln.enqueue(values, self.stream)
                    events[i + 1].record(self.stream)
                events[-1].synchronize()
                for i in range(len(self.launches)):
                    times[i].append(events[i + 1].elapsed_ms(events[i]) * 1e3)
        finally:
            self.stream.synchronize()
            for e in events:
                e.destroy()
            spin_mod.unload()
        return [{"launch": i, "op": ln["op"], "source": ln.get("source"), "kernel": ran[i],
                 "us": round(float(np.median(times[i])), 3)}
                for i, ln in enumerate(self.cuda["launches"]) if ran[i] is not None]

    # -- CUDA graphs for decode ------------------------------------------------------------------
    def _decode_bucket(self, feeds: Mapping[str, np.ndarray]) -> int | None:
        ids, lens = feeds.get("input_ids"), feeds.get("seq_lens")
        if ids is None or lens is None:
            return None
        t, s = len(ids), len(lens)
        if t != s or s == 0:
            return None
        qsl = np.asarray(feeds["query_start_loc"])
        if qsl[0] != 0 or not np.all(np.diff(qsl) == 1):
            return None
        for b in self.buckets:
            if b >= s:
                return b
        return None

    def _graph_dims(self, bucket: int) -> dict[str, int]:
        return {"T": bucket, "S": bucket, "max_blocks": self.bounds["max_blocks"], "num_blocks": self.num_blocks}

    def _record_graph(self, dims: Mapping[str, int]) -> None:
        """What a decode graph holds: the step's launches and, with ``device_argmax``, the argmax of every row."""
        self._enqueue(dims)
        if self.argmax is not None:
            self.argmax.enqueue(dims, self.stream)

    def _bucket_layout(self, bucket: int) -> Layout:
        dims = self._graph_dims(bucket)
        return {v.name: (int(self.buffers[v.name]["offset"]), v.type.dtype.np,
                         tuple(eval_dim(d, dims) for d in (v.type.shape or ()))) for v in self.inputs}

    def _staged_views(self, bucket: int, copy: int = 0) -> StagedBucket:
        views = self._staged.get((copy, bucket))
        if views is None:
            views = StagedBucket(self._step_staging[copy], self._bucket_layout(bucket))
            self._staged[(copy, bucket)] = views
        return views

    def _stage_decode(self, feeds: Mapping[str, np.ndarray], bucket: int, copy: int = 0) -> int:
        """Write a decode step padded to ``bucket`` straight into pinned staging copy ``copy`` (0: ``staging``;
        others: ``greedy_tokens_steps``' per-step path); returns its end. ``query_start_loc`` and
        ``logits_indices`` are written only when the copy's bucket changes."""
        st = self._staged_views(bucket, copy)
        self._write_decode(st, feeds)
        if self._staged_bucket[copy] != bucket:
            self._write_constants(st, bucket)
            self._staged_bucket[copy] = bucket
        return st.end

    def _write_decode(self, st: StagedBucket, feeds: Mapping[str, np.ndarray]) -> None:
        """A decode step's per-step inputs into the views ``st``, padded to their bucket. Padding rows: token 0 at
        position 0, slot -1 (no KV write), context 1, block table all block 0."""
        s = len(feeds["seq_lens"])
        tables = np.asarray(feeds["block_tables"])
        cap = self.bounds["max_blocks"]
        if tables.shape[1] > cap:
            raise CudaArtifactError(f"block_tables has {tables.shape[1]} columns, the compiled bound is {cap}")
        for name, pad in (("input_ids", 0), ("positions", 0), ("slot_mapping", -1), ("seq_lens", 1)):
            view = st.views[name]
            view[:s] = feeds[name]
            view[s:] = pad
        bt = st.views["block_tables"]
        bt[:s, : tables.shape[1]] = tables
        bt[:s, tables.shape[1] :] = 0
        bt[s:] = 0

    @staticmethod
    def _write_constants(st: StagedBucket, bucket: int) -> None:
        """The inputs every decode step of ``bucket`` shares: one token per row."""
        st.views["query_start_loc"][:] = np.arange(bucket + 1)
        st.views["logits_indices"][:] = np.arange(bucket)

    def _bucket_graph(self, bucket: int) -> cd.CudaGraph:
        """The bucket's decode graph, captured on first use."""
        graph = self.graphs.get(bucket)
        if graph is None:
            dims = self._graph_dims(bucket)
            self.stream.synchronize()
            graph = cd.CudaGraph(self.stream, lambda: self._record_graph(dims))
            self.graphs[bucket] = graph
            self.stats["captures"] += 1
        return graph

    def _launch_graph(self, feeds: Mapping[str, np.ndarray], bucket: int) -> dict[str, int]:
        end = self._stage_decode(feeds, bucket)
        graph = self._bucket_graph(bucket)
        cd.memcpy_htod(self.arena.ptr + self.base["io"], self.staging.ptr, end, self.stream)
        graph.launch(self.stream)
        self.stats["graph_steps"] += 1
        return {**self._graph_dims(bucket), "S": len(feeds["seq_lens"])}

    def capture_all(self, max_batch: int | None = None) -> float:
        """Capture every bucket's graph up front (up to ``max_batch``); returns the seconds it took."""
        t0 = time.perf_counter()
        for b in self.buckets:
            if max_batch is not None and b > max_batch:
                break
            if b not in self.graphs:
                dims = self._graph_dims(b)
                self.graphs[b] = cd.CudaGraph(self.stream, lambda dims=dims: self._record_graph(dims))
                self.stats["captures"] += 1
        return time.perf_counter() - t0

    def close(self) -> None:
        """Free the graphs, modules, buffers and the arena (also done at interpreter exit by the driver)."""
        for g in self.graphs.values():
            g.destroy()
        self.graphs.clear()
        for m in self.modules.values():
            m.unload()
        self.modules.clear()
        self._free_submissions()
        self.out_staging.free()
        if self.argmax is not None:
            self.argmax.free()
        self.arena.free()
        self.stream.destroy()


class CudaPagedModel(PagedModel):
    """``PagedModel`` (runtime/paged.py: sequences, blocks, ``step``) with the KV cache and the
    model on the GPU; ``iter_greedy(graph, ..., model=CudaPagedModel(...))`` drives it."""

    def __init__(self, executor: CudaExecutor, num_blocks: int | None = None) -> None:
        spec = executor.graph.meta.get("kv_cache") or executor.manifest.get("kv_cache")
        if not isinstance(spec, dict):
            raise ValueError("CudaPagedModel needs a serving-form (llm) artifact")
        if num_blocks is not None and num_blocks > executor.num_blocks:
            raise ValueError(f"num_blocks {num_blocks} > the executor's cache ({executor.num_blocks} blocks)")
        self.graph = executor.graph
        self.block_size = int(spec["block_size"])
        self.num_blocks = num_blocks or executor.num_blocks
        self.caches = {}
        self._free = list(range(self.num_blocks - 1, -1, -1))
        self.sequences: dict[int, SequenceState] = {}
        self._next_id = 0
        self._executor = executor  # type: ignore[assignment]


class CudaModel(GraphSignature):
    """``ingot.load(path, device="cuda")``: ``run`` maps input names to arrays, returns output arrays."""

    def __init__(self, path: str | os.PathLike, **kwargs: Any) -> None:
        from .artifact import load_graph

        self.path = Path(path)
        self.graph, self.manifest = load_graph(self.path)
        self.executor = CudaExecutor(self.graph, self.manifest, self.path, **kwargs)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.executor.run(feeds)

    def paged(self, num_blocks: int | None = None) -> CudaPagedModel:
        """A ``PagedModel``-style driver over this model's device KV cache (llm artifacts)."""
        return CudaPagedModel(self.executor, num_blocks)

    def __repr__(self) -> str:
        return f"CudaModel({self.path}, {self.executor.ctx.name}, inputs={self.inputs}, outputs={self.outputs})"
