"""What every kernel family's ``rule.py`` shares: the ``Family`` record and small helpers.

A family is a folder ``codegen/kernels/<name>/`` with a ``rule.py`` that defines ``FAMILY`` and
one template per architecture (a single ``kernel.cu`` where the code is the same for both)::

    FAMILY = Family(name="norm", ops=("rms_norm", "layer_norm"), plan=plan)

    def plan(op: Op, inputs: Sequence[TensorType | None], target: Target) -> list[KernelSpec] | None:
        ...  # None: this family does not handle that node on that target

Rules are tried in registry order (``codegen/registry.py``); the first that returns specs wins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..ir.op import Op
from ..ir.types import DType, TensorType
from .kernel import KernelSpec
from .target import Target

Plan = Callable[[Op, Sequence[TensorType | None], Target], list[KernelSpec] | None]


@dataclass(frozen=True)
class Family:
    name: str
    #: IR op names the rule may accept (a quick filter before ``plan`` runs)
    ops: tuple[str, ...]
    plan: Plan


#: element types kernels can load and store, and their C storage types (common.cuh)
CTYPES: dict[DType, str] = {
    DType.f32: "float", DType.bf16: "bf16", DType.f16: "f16", DType.f8e4m3fn: "fp8e4m3",
}
#: types a kernel computes from (activations, norms' inputs); fp8 only as stored weights/caches
ACTIVATION_DTYPES = (DType.f32, DType.bf16, DType.f16)


def ctype(dt: DType) -> str:
    try:
        return CTYPES[dt]
    except KeyError:
        raise ValueError(f"no CUDA storage type for {dt.value}; supported: {[d.value for d in CTYPES]}") from None


def static_dim(t: TensorType | None, axis: int) -> int | None:
    """``t.shape[axis]`` when it is a known integer, else None."""
    if t is None or t.shape is None or not t.shape:
        return None
    d = t.shape[axis]
    return d if isinstance(d, int) else None


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def threads_for(n: int, per_thread: int = 4, lo: int = 32, hi: int = 1024) -> int:
    """A block size (multiple of 32) giving each thread about ``per_thread`` of ``n`` items."""
    return max(lo, min(hi, round_up(-(-n // per_thread), 32)))


def gpu_arch(target: Target) -> str | None:
    return target.arch if target.is_gpu else None


def short(dt: DType) -> str:
    return dt.value


def one_of(t: TensorType | None, dtypes: Sequence[DType]) -> bool:
    return t is not None and t.dtype in dtypes
