"""The kernel families, in the order their rules are tried (first applicable wins).

Adding a family: make ``codegen/kernels/<name>/`` with ``rule.py`` (defining ``FAMILY``) and its
templates, add the name here, and add its compile and GPU tests in ``tests/codegen/``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from functools import cache

from ..ir.graph import Node
from ..ir.op import Op
from ..ir.types import TensorType
from .family import Family
from .kernel import KernelSpec
from .target import Target, get_target

FAMILY_NAMES = ("embedding", "norm", "rope", "activation", "gemm", "gemv", "attention", "sampling")


#: families built with nvcc from library headers (CUTLASS: 20-60 s a build), tried after the ones above.
#: They launch through a host shim (``kernels/gemm_cutlass/build.py``), not the plain parameter list.
LIBRARY_FAMILY_NAMES = ("gemm_cutlass",)

#: the fallback, tried last: kernels generated through Apache TVM for any node with static shapes
#: (``codegen/tvm/``; without TVM installed it plans only what its kernel cache already holds)
FALLBACK_FAMILY_NAMES = ("tvm",)

#: families that add small-M *variants* to another family's launch (``gemv`` is also in ``FAMILY_NAMES``: after
#: ``gemm``, so a bf16 ``linear`` keeps the GEMM as its launch, while ``quantized_linear``, which no GEMM takes,
#: gets the any-M quantized GEMV as its own launch) (``variants(op, inputs, target)`` in their
#: rule: ``[(max_rows, spec), ...]``, smallest first, each taking the launch's own parameters). The executor
#: runs the first variant whose ``max_rows`` covers the step's row count ``M``, else the launch's own kernel
#: (``codegen/lower.py``: the launch's ``variants``; ``runtime/cuda_backend.py``: the choice at launch).
VARIANT_FAMILY_NAMES = ("gemv",)


@cache
def families() -> tuple[Family, ...]:
    return tuple(importlib.import_module(f"{__package__}.kernels.{n}.rule").FAMILY for n in FAMILY_NAMES)


@cache
def library_families() -> tuple[Family, ...]:
    return tuple(importlib.import_module(f"{__package__}.kernels.{n}.rule").FAMILY for n in LIBRARY_FAMILY_NAMES)


@cache
def variant_modules() -> tuple[object, ...]:
    return tuple(importlib.import_module(f"{__package__}.kernels.{n}.rule") for n in VARIANT_FAMILY_NAMES)


@cache
def fallback_families() -> tuple[Family, ...]:
    return tuple(importlib.import_module(f"{__package__}.{n}.rule").FAMILY for n in FALLBACK_FAMILY_NAMES)


def plan_op(op: Op, inputs: Sequence[TensorType | None], target: Target | str,
            fallback: bool = True) -> list[KernelSpec] | None:
    """The launches implementing ``op`` on ``target``, from the first family that accepts it; None if none does.
    ``fallback=False`` leaves out the generated (TVM) family."""
    tgt = get_target(target)
    for family in (*families(), *library_families(), *(fallback_families() if fallback else ())):
        if op.name in family.ops:
            specs = family.plan(op, inputs, tgt)
            if specs is not None:
                return specs
    return None


def plan_node(node: Node, target: Target | str, fallback: bool = True) -> list[KernelSpec] | None:
    return plan_op(node.op, [v.type if v is not None else None for v in node.inputs], target, fallback)


def plan_variants(node: Node, target: Target | str) -> list[tuple[int, KernelSpec]]:
    """Small-M variants of ``node``'s launch (``VARIANT_FAMILY_NAMES``): ``(max_rows, spec)``, smallest first."""
    tgt = get_target(target)
    inputs = [v.type if v is not None else None for v in node.inputs]
    for module in variant_modules():
        found = module.variants(node.op, inputs, tgt)  # type: ignore[attr-defined]
        if found:
            return list(found)
    return []
