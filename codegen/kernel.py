"""Kernel specs: what a family's rule decides, and how a spec becomes CUDA source.

A rule (``codegen/kernels/<family>/rule.py``) looks at an IR op, its input types and the target
and returns a list of ``KernelSpec``: the launches that implement the op, in order. A spec holds
every decision: which template, the values substituted into it, the kernel's parameters (names and
C types, in order, so a runtime can bind buffers by name) and the launch configuration. The grid
is written in terms of the kernel's own integer parameters (``GridDim("T")`` = one block per token,
``GridDim("N", 64)`` = ``ceil(N / 64)`` blocks), so one compiled kernel serves every step size.

Templates are CUDA files with ``${NAME}`` placeholders (``string.Template``); they only substitute
values, all choices are made here in Python. ``#include "x.cuh"`` lines (paths relative to the including
file, inside ``codegen/kernels/``) are inlined, so a rendered source is self-contained.
Every rendered source starts with a comment naming its spec and how to regenerate it::

    python -m ingot.codegen.kernel '<spec json>'      # prints the source
"""

from __future__ import annotations

import hashlib
import json
import re
import string
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .switches import env_choice

KERNELS_DIR = Path(__file__).resolve().parent / "kernels"

#: kernel parameter C types a spec may declare (what a launcher packs for each)
PARAM_TYPES = ("ptr", "i32", "i64", "f32")

Value = int | float | bool | str


@dataclass(frozen=True)
class Param:
    """One kernel argument: a device pointer or a scalar."""

    name: str
    ctype: str

    def __post_init__(self) -> None:
        if self.ctype not in PARAM_TYPES:
            raise ValueError(f"param {self.name}: ctype must be one of {PARAM_TYPES}, got {self.ctype!r}")


@dataclass(frozen=True)
class GridDim:
    """One grid dimension: ``ceil(size / tile)`` for an integer parameter ``size``, else ``const``."""

    size: str | None = None
    tile: int = 1
    const: int = 1

    def resolve(self, args: Mapping[str, int]) -> int:
        if self.size is None:
            return self.const
        return -(-int(args[self.size]) // self.tile)


@dataclass(frozen=True)
class KernelSpec:
    """One launch: template + substituted values + parameters + launch configuration."""

    family: str
    template: str
    #: base of the entry symbol; the symbol gets a hash of the spec appended (see ``entry``)
    name: str
    arch: str
    values: tuple[tuple[str, Value], ...]
    params: tuple[Param, ...]
    block: tuple[int, int, int]
    grid: tuple[GridDim, GridDim, GridDim]
    smem: int = 0
    doc: str = field(default="", compare=False)

    @staticmethod
    def make(family: str, template: str, name: str, arch: str, values: Mapping[str, Value],
             params: list[tuple[str, str]], block: int | tuple[int, int, int],
             grid: list[GridDim], smem: int = 0, doc: str = "") -> KernelSpec:
        """Build a spec from plain Python values (sorted values, padded block/grid)."""
        blk = (block, 1, 1) if isinstance(block, int) else tuple(block)
        g = list(grid) + [GridDim()] * (3 - len(grid))
        return KernelSpec(family, template, name, arch, tuple(sorted(values.items())),
                          tuple(Param(n, t) for n, t in params), blk, (g[0], g[1], g[2]), smem, doc)

    @cached_property
    def entry(self) -> str:
        """The ``extern "C"`` symbol: unique per spec, so an artifact can hold many variants."""
        return f"{self.name}_{self.key[:10]}"

    @cached_property
    def key(self) -> str:
        """A hash of the spec (its JSON without the doc); computed once (a sha256 of the JSON costs ~10 us, and the
        CUDA backend's launches name their entry on every launch)."""
        return hashlib.sha256(self.to_json(with_doc=False).encode()).hexdigest()

    def value(self, name: str) -> Value:
        return dict(self.values)[name]

    def grid_dims(self, args: Mapping[str, int]) -> tuple[int, int, int]:
        """The grid for one launch, from the kernel's integer arguments."""
        gx, gy, gz = (d.resolve(args) for d in self.grid)
        return gx, gy, gz

    def to_dict(self, with_doc: bool = True) -> dict:
        d = {
            "family": self.family, "template": self.template, "name": self.name, "arch": self.arch,
            "values": dict(self.values), "params": [[p.name, p.ctype] for p in self.params],
            "block": list(self.block), "smem": self.smem,
            "grid": [{"size": g.size, "tile": g.tile, "const": g.const} for g in self.grid],
        }
        if with_doc and self.doc:
            d["doc"] = self.doc
        return d

    def to_json(self, with_doc: bool = True) -> str:
        return json.dumps(self.to_dict(with_doc), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_dict(d: Mapping) -> KernelSpec:
        grid = [GridDim(g["size"], g["tile"], g["const"]) for g in d["grid"]]
        return KernelSpec.make(d["family"], d["template"], d["name"], d["arch"], d["values"],
                               [tuple(p) for p in d["params"]], tuple(d["block"]), grid,
                               d.get("smem", 0), d.get("doc", ""))

    def source(self) -> str:
        return render(self)


_INCLUDE = re.compile(r'^\s*#include\s+"([A-Za-z0-9_./-]+)"\s*$', re.M)


def _read_template(path: Path, seen: set[Path]) -> str:
    path = path.resolve()
    if KERNELS_DIR not in path.parents:
        raise FileNotFoundError(f"kernel template {path} is outside {KERNELS_DIR}")
    if not path.is_file():
        raise FileNotFoundError(f"kernel template {path} not found")
    if path in seen:
        return ""
    seen.add(path)

    def inline(m: re.Match[str]) -> str:
        body = _read_template(path.parent / m.group(1), seen)
        return f"// ---- {m.group(1)} ----\n{body}// ---- end {m.group(1)} ----"

    return _INCLUDE.sub(inline, path.read_text())


#: the programmatic-dependent-launch prologue every template kernel starts with (not CUTLASS's, not TVM's): wait
#: until the grid before it in the stream has finished and its writes are visible, then let the next grid be
#: scheduled. Harmless in an ordinary launch (nothing to wait for); launched with the
#: PROGRAMMATIC_STREAM_SERIALIZATION attribute (``runtime/cuda_driver.py``), the next kernel's launch and block
#: scheduling overlap this one's run, saving the launch gap between back-to-back kernels (a decode step is ~150
#: of them). Kernel tables mark kernels that have it (``"pdl": true``) so older artifacts never launch that way.
PDL_PROLOGUE = """
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
"""
#: the same with the trigger first (``INGOT_PDL_TRIGGER=early`` at compile time; experimental: on the H200 it cost
#: kernel.cu's GEMV chain 4.4 us a layer and gave bulk.cu back 3.5, docs/PERF.md "Bulk-copy GEMV"):
#: the grid after this one may be scheduled as soon as every CTA of this one has started, not only once this one's
#: wait has returned. The order of the data is unchanged (every template kernel still waits before it reads what
#: an earlier grid wrote, and a grid completes only after its own wait), but a kernel that loads weights before its
#: wait (``gemv/bulk.cu``, ``kernel.cu``'s ``weights_first`` variants) then streams them during the tail of the
#: kernel *two* launches back, across a small kernel in between (rope, attention, an unfused norm): with the wait
#: first, such a small kernel holds the next one's scheduling until the kernel before it has finished.
PDL_PROLOGUE_EARLY = """
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
"""
#: compile-time switch for the prologue's order: ``wait`` (the default) or ``early`` (``PDL_PROLOGUE_EARLY``)
PDL_TRIGGER_ENV = "INGOT_PDL_TRIGGER"
PDL_MARKER = "griddepcontrol.wait"
#: where a template places the prologue itself (``${PDL_WAIT}``): a kernel may start work that reads nothing the
#: grid before it writes (weights: loads into registers, L2 prefetches) before the wait, so that it overlaps the
#: previous kernel's tail. A template that uses it gets no prologue at the start of any of its kernels.
PDL_PLACEHOLDER = "${PDL_WAIT}"
#: a second place for the wait in a template that uses ``${PDL_WAIT}``: the prologue goes there instead when the trigger
#: is early. For a template that reads, before ``${PDL_WAIT}``, the step's inputs (sequence lengths, block tables):
#: with the trigger after the wait, a kernel starts only once the one two launches back has finished, so those are
#: written (no kernel between them and the reader writes them); with it early that holds only after the wait.
PDL_WAIT_EARLY = "${PDL_WAIT_EARLY}"
#: families whose kernels are not rendered with the prologue
NO_PDL_FAMILIES = ("gemm_cutlass", "tvm")
_KERNEL_BODY = re.compile(r'(extern "C" __global__[^{;]*\{)')


def pdl_prologue() -> str:
    """The prologue ``render`` gives template kernels: ``PDL_PROLOGUE``, or ``PDL_PROLOGUE_EARLY`` with
    ``INGOT_PDL_TRIGGER=early``; another value is an error naming the variable."""
    return env_choice(PDL_TRIGGER_ENV, {"": PDL_PROLOGUE, "wait": PDL_PROLOGUE, "early": PDL_PROLOGUE_EARLY},
                      "'wait' (the default) or 'early'")


def has_pdl(source: str) -> bool:
    """True when ``source``'s kernels start with the PDL prologue."""
    return PDL_MARKER in source


def render(spec: KernelSpec) -> str:
    """The CUDA source for ``spec``: the template with its includes inlined and values substituted; every
    ``extern "C" __global__`` kernel body starts with ``PDL_PROLOGUE`` (but CUTLASS's and TVM's), unless the
    template places it itself with ``${PDL_WAIT}`` (``pdl_prologue``: ``PDL_PROLOGUE_EARLY`` with
    ``INGOT_PDL_TRIGGER=early``)."""
    body = _read_template(KERNELS_DIR / spec.family / spec.template, set())
    values = {k: _c_literal(v) for k, v in spec.values}
    values["KERNEL"] = spec.entry
    pdl = spec.family not in NO_PDL_FAMILIES
    placed = PDL_PLACEHOLDER in body  # the template puts the wait itself (after work that needs no input)
    prologue = pdl_prologue() if pdl else ""
    values["PDL_WAIT"] = prologue
    if PDL_WAIT_EARLY in body:  # a template's second place, for the early trigger (see PDL_WAIT_EARLY)
        early = prologue == PDL_PROLOGUE_EARLY
        values["PDL_WAIT_EARLY"], values["PDL_WAIT"] = (prologue, "") if early else ("", prologue)
    try:
        text = string.Template(body).substitute(values)
    except KeyError as e:
        raise KeyError(f"template {spec.family}/{spec.template} needs value {e.args[0]!r}; "
                       f"the spec gives {sorted(values)}") from None
    if pdl and not placed:
        text = _KERNEL_BODY.sub(lambda m: m.group(1) + prologue, text)
    header = (
        f"// Generated by ingot.codegen from kernel spec {spec.family}/{spec.template} for {spec.arch}.\n"
        f"// Do not edit; regenerate with: python -m ingot.codegen.kernel '{spec.to_json(with_doc=False)}'\n"
    )
    return header + text


def _c_literal(v: Value) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError(f"template value {v} has no C literal")
        return f"{v!r}f" if "e" in repr(v) or "." in repr(v) else f"{v!r}.0f"
    return v


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m ingot.codegen.kernel '<spec json>'", file=sys.stderr)
        return 2
    sys.stdout.write(render(KernelSpec.from_dict(json.loads(args[0]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
