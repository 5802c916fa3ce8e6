"""Apache TVM as a CUDA source generator: TE compute -> scheduled TIR -> CUDA C++ -> kernel records.

``build_module(name, params, outputs, arch)`` takes TE placeholders (by the kernel parameter name
each becomes: ``in0``, ``out0``, ...) and the op's output tensors, schedules the function with
TVM's ``dlight`` default GPU rules (``GeneralReduction`` for softmax/norm-like rows, ``Reduction``,
then ``Fallback``: every block's spatial loops fused and bound to blocks x threads, reductions
serial), compiles it with ``tvm.compile`` for ``cuda`` / ``arch`` and returns a ``TvmModule``: the
CUDA source (TVM's preamble, which includes libcu++ and CUDA headers, replaced by a header-free
one, so NVRTC from the pip wheel compiles it like every other ingot kernel) and, per ``__global__``
kernel in launch order, its name, its pointer parameters in order and its static launch
configuration (read from the scheduled TIR's thread bindings, checked against the source's
``__launch_bounds__``). Shapes are static: a kernel serves exactly the shapes it was built for.

Nothing here is imported without TVM; ``codegen/tvm/rule.py`` imports this module lazily.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("CUDA_PATH", "/usr/local/cuda-13.0")  # TVM's own compile helper looks here

import tvm  # noqa: E402
from tvm import te  # noqa: E402
from tvm.s_tir import dlight as dl  # noqa: E402

#: replaces TVM's preamble (everything before the first kernel): no headers, so NVRTC needs no include path
PREAMBLE = """\
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#define uint unsigned int
#define uchar unsigned char
#define ushort unsigned short
"""


class TvmBuildError(RuntimeError):
    """TVM could not build the op (an unsupported schedule, a construct the source cannot hold)."""


@dataclass
class KernelInfo:
    name: str
    params: list[str]  # ingot parameter names (in0, out0, ...) in the kernel's argument order
    block: tuple[int, int, int]
    grid: tuple[int, int, int]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": list(self.params), "block": list(self.block), "grid": list(self.grid)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> KernelInfo:
        return KernelInfo(d["name"], list(d["params"]), tuple(d["block"]), tuple(d["grid"]))  # type: ignore[arg-type]


@dataclass
class TvmModule:
    source: str
    kernels: list[KernelInfo] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "kernels": [k.to_dict() for k in self.kernels]}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TvmModule:
        return TvmModule(d["source"], [KernelInfo.from_dict(k) for k in d["kernels"]])


def target(arch: str) -> tvm.target.Target:
    return tvm.target.Target({"kind": "cuda", "arch": arch}, host="llvm")


def _launches(func: Any) -> list[dict[str, int]]:
    """Per kernel (outermost thread-bound loop nest, in order): its thread-binding extents by tag."""
    kernels: list[dict[str, int]] = []

    def visit(stmt: Any, current: dict[str, int] | None) -> None:
        if isinstance(stmt, tvm.tirx.For) and stmt.kind == tvm.tirx.ForKind.THREAD_BINDING:
            tag = stmt.thread_binding.thread_tag
            if not isinstance(stmt.extent, tvm.tirx.IntImm):
                raise TvmBuildError(f"thread extent {stmt.extent} is not static")
            if current is None:
                current = {}
                kernels.append(current)
            ext = int(stmt.extent)
            if current.setdefault(tag, ext) != ext:
                raise TvmBuildError(f"{tag} bound with two extents ({current[tag]}, {ext}) in one kernel")
            visit(stmt.body, current)
            return
        for child in _children(stmt):
            visit(child, current)

    visit(func.body, None)
    return kernels


def _children(stmt: Any) -> list[Any]:
    tirx = tvm.tirx
    if isinstance(stmt, tirx.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, tvm.s_tir.SBlockRealize):
        return [stmt.block]
    if isinstance(stmt, tvm.s_tir.SBlock):
        out = [stmt.body]
        if stmt.init is not None:
            out.append(stmt.init)
        return out
    if isinstance(stmt, tirx.IfThenElse):
        return [stmt.then_case] + ([stmt.else_case] if stmt.else_case is not None else [])
    for attr in ("body",):
        if hasattr(stmt, attr):
            return [getattr(stmt, attr)]
    return []


_KERNEL = re.compile(r'extern "C" __global__ void __launch_bounds__\((\d+)\) (\w+)\(([^)]*)\)\s*\{')


def _copy(t: te.Tensor, name: str) -> te.Tensor:
    return te.compute(t.shape, lambda *i: t(*i), name=name)


def build_module(name: str, params: Sequence[tuple[str, te.Tensor]], outputs: Sequence[te.Tensor],
                 arch: str) -> TvmModule:
    """Build ``outputs`` (te tensors over the placeholders in ``params``) into CUDA for ``arch``;
    ``params`` names each placeholder and output: ``[("in0", x), ..., ("out0", y)]``."""
    tensors = []
    for pname, t in params:
        if t.op.name != pname:  # outputs named by their builder (topi's T_*): copy into the parameter's name
            t = _copy(t, pname)
        tensors.append(t)
    by_data = {f"{pname}_ptr": pname for pname, _ in params}
    func = te.create_prim_func(tensors).with_attr("global_symbol", name)
    mod = tvm.IRModule({name: func})
    tgt = target(arch)
    with tgt:
        mod = dl.ApplyDefaultSchedule(dl.gpu.GeneralReduction(), dl.gpu.Reduction(), dl.gpu.Fallback())(mod)
    launches = _launches(mod[name])
    try:
        ex = tvm.compile(mod, target=tgt)
    except Exception as e:  # TVM raises its own error types (tvm.error.*, TVMError)
        raise TvmBuildError(f"tvm.compile failed for {name}: {type(e).__name__}: {str(e).strip()[-800:]}") from None
    src = ex.mod.imports[0].inspect_source("cuda")
    found = list(_KERNEL.finditer(src))
    if not found:
        raise TvmBuildError(f"{name}: no kernel in TVM's CUDA source")
    if len(found) != len(launches):
        raise TvmBuildError(f"{name}: {len(found)} kernels in the source, {len(launches)} thread-bound nests in TIR")
    if "extern __shared__" in src:
        raise TvmBuildError(f"{name}: dynamic shared memory is not supported")
    first_decl = src.find('extern "C" __global__')
    body = src[first_decl:]
    kernels = []
    for m, ext in zip(found, launches):
        bound, kname, args = int(m.group(1)), m.group(2), m.group(3)
        block = (ext.get("threadIdx.x", 1), ext.get("threadIdx.y", 1), ext.get("threadIdx.z", 1))
        grid = (ext.get("blockIdx.x", 1), ext.get("blockIdx.y", 1), ext.get("blockIdx.z", 1))
        if block[0] * block[1] * block[2] != bound:
            raise TvmBuildError(f"{kname}: launch bounds {bound} but threads {block}")
        names = []
        for a in (a.strip() for a in args.split(",") if a.strip()):
            if "*" not in a:
                raise TvmBuildError(f"{kname}: scalar parameter {a!r} (only static shapes are supported)")
            var = a.split()[-1]
            if var not in by_data:
                raise TvmBuildError(f"{kname}: parameter {var!r} is none of {sorted(by_data)}")
            names.append(by_data[var])
        kernels.append(KernelInfo(kname, names, block, grid))
    return TvmModule(PREAMBLE + body, kernels)
