"""Passes, their registry, pipelines and instruments.

A pass is a small declared object: a kebab-case ``name``, a docstring that says what it runs after,
what it needs and what it preserves, and ``run(graph, ctx) -> bool`` (whether it changed anything).
Only the rewrite driver and a pass's own ``run`` edit the graph. Options live in the ``PassContext``
namespaced by pass name (``ctx.option("fuse-rms-norm", "eps_tolerance", 1e-3)``).

Pipelines are plain lists of pass names, read top to bottom (``PIPELINES``). Third-party passes
register through the Python entry-point group ``ingot.passes``: each entry point names a module or
a ``Pass`` subclass; loading it registers the pass (and may append it to a pipeline with
``extend_pipeline``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from ..ir.graph import Graph
from ..ir.verify import verify


class PassError(ValueError):
    pass


class Pass:
    """Base class. Subclasses set ``name`` and implement ``run``."""

    name: ClassVar[str] = ""
    #: Passes that must have run before this one (checked when a pipeline is built).
    requires: ClassVar[tuple[str, ...]] = ()
    #: Rule hit counts of the last run (filled by rewrite-based passes), for instruments.
    stats: dict[str, int]

    def __init__(self) -> None:
        self.stats = {}

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


PASSES: dict[str, type[Pass]] = {}


def register_pass(cls: type[Pass]) -> type[Pass]:
    if not cls.name or cls.name != cls.name.lower() or " " in cls.name or "_" in cls.name:
        raise PassError(f"{cls.__name__}: pass names are kebab-case, got {cls.name!r}")
    if cls.name in PASSES and PASSES[cls.name] is not cls:
        raise PassError(f"pass {cls.name!r} is registered twice ({PASSES[cls.name].__name__}, {cls.__name__})")
    PASSES[cls.name] = cls
    return cls


def function_pass(name: str, requires: Sequence[str] = ()) -> Callable[[Callable[..., bool]], type[Pass]]:
    """Register a plain function ``fn(graph, ctx) -> bool`` as a pass; its docstring is the pass's."""

    def deco(fn: Callable[[Graph, PassContext], bool]) -> type[Pass]:
        cls = type(
            fn.__name__,
            (Pass,),
            {"name": name, "requires": tuple(requires), "__doc__": fn.__doc__,
             "run": lambda self, g, ctx: bool(fn(g, ctx)), "__module__": fn.__module__},
        )
        return register_pass(cls)

    return deco


_PLUGINS_LOADED = False


def load_plugins() -> list[str]:
    """Import every ``ingot.passes`` entry point once; returns their names."""
    global _PLUGINS_LOADED
    names: list[str] = []
    if _PLUGINS_LOADED:
        return names
    _PLUGINS_LOADED = True
    for ep in importlib.metadata.entry_points(group="ingot.passes"):
        obj = ep.load()
        if isinstance(obj, type) and issubclass(obj, Pass):
            register_pass(obj)
        names.append(ep.name)
    return names


def _ensure_builtin() -> None:
    importlib.import_module("ingot.passes.builtin")
    load_plugins()


def get_pass(name: str) -> type[Pass]:
    _ensure_builtin()
    try:
        return PASSES[name]
    except KeyError:
        known = ", ".join(sorted(PASSES))
        raise PassError(f"unknown pass {name!r}; known passes: {known}") from None


# -- pipelines --------------------------------------------------------------------------------------

PIPELINES: dict[str, list[str]] = {
    "O0": [],
    "O1": ["canonicalize"],
    "O2": ["canonicalize", "fuse", "canonicalize"],
    "llm": ["canonicalize", "fuse", "canonicalize", "llm-lower"],
    # the serving form's last fusions, run by the GPU lowering (codegen/lower.py) after quantization and
    # tensor-parallel sharding, which still read the form's split nodes (docs/SERVING_FORM.md)
    "serving-fuse": ["fuse-split-swiglu", "fuse-split-rope"],
}


def extend_pipeline(pipeline: str, pass_name: str, after: str | None = None) -> None:
    """Add ``pass_name`` to a pipeline (at the end, or after the first ``after``). For plugins."""
    names = PIPELINES.setdefault(pipeline, [])
    if pass_name in names:
        return
    if after is not None and after in names:
        names.insert(names.index(after) + 1, pass_name)
    else:
        names.append(pass_name)


def pipeline_names(pipeline: str | Sequence[str], disabled: Iterable[str] = ()) -> list[str]:
    _ensure_builtin()
    if isinstance(pipeline, str):
        if pipeline not in PIPELINES:
            raise PassError(f"unknown pipeline {pipeline!r}; known: {', '.join(PIPELINES)}")
        names = list(PIPELINES[pipeline])
    else:
        names = list(pipeline)
    off = set(disabled)
    for n in off:
        get_pass(n)  # an unknown name in --disable-pass is an error, not a silent no-op
    return [n for n in names if n not in off]


# -- context and instruments -----------------------------------------------------------------------


class Instrument:
    """Hooks around every pass. Subclass and override what you need."""

    def before(self, p: Pass, graph: Graph, index: int) -> None:  # noqa: B027 - optional hook
        pass

    def after(self, p: Pass, graph: Graph, index: int, changed: bool, seconds: float) -> None:  # noqa: B027
        pass


@dataclasses.dataclass
class PassContext:
    """What passes see besides the graph: the target, per-pass options, instruments."""

    target: Any = "cpu"
    options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    instruments: list[Instrument] = dataclasses.field(default_factory=list)
    verify_each: bool = False

    def option(self, pass_name: str, key: str, default: Any = None) -> Any:
        return self.options.get(pass_name, {}).get(key, default)


@dataclasses.dataclass
class PassRecord:
    name: str
    seconds: float
    changed: bool
    nodes_before: int
    nodes_after: int
    stats: dict[str, int]


class TimingInstrument(Instrument):
    """Records each pass's time, whether it changed the graph, node counts and rule hits."""

    def __init__(self) -> None:
        self.records: list[PassRecord] = []
        self._before = 0

    def before(self, p: Pass, graph: Graph, index: int) -> None:
        self._before = len(graph.nodes)

    def after(self, p: Pass, graph: Graph, index: int, changed: bool, seconds: float) -> None:
        self.records.append(PassRecord(p.name, seconds, changed, self._before, len(graph.nodes), dict(p.stats)))


class DumpIRInstrument(Instrument):
    """Writes the IR after every pass: ``DIR/00-input.ir``, ``DIR/01-canonicalize.ir``, ..."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def before(self, p: Pass, graph: Graph, index: int) -> None:
        if index == 0:
            (self.dir / "00-input.ir").write_text(str(graph))

    def after(self, p: Pass, graph: Graph, index: int, changed: bool, seconds: float) -> None:
        (self.dir / f"{index + 1:02d}-{p.name}.ir").write_text(str(graph))


def run_passes(
    graph: Graph,
    pipeline: str | Sequence[str],
    ctx: PassContext | None = None,
    disabled: Iterable[str] = (),
) -> Graph:
    """Run a pipeline (a name from ``PIPELINES`` or a list of pass names) over ``graph`` in place."""
    ctx = ctx or PassContext()
    names = pipeline_names(pipeline, disabled)
    done: set[str] = set()
    passes = []
    for n in names:
        cls = get_pass(n)
        missing = [r for r in cls.requires if r not in done]
        if missing:
            raise PassError(f"pass {n!r} needs {missing} to run before it")
        passes.append(cls())
        done.add(n)
    for i, p in enumerate(passes):
        for ins in ctx.instruments:
            ins.before(p, graph, i)
        t0 = time.perf_counter()
        p.stats = {}
        changed = p.run(graph, ctx)
        dt = time.perf_counter() - t0
        if ctx.verify_each:
            try:
                verify(graph)
            except ValueError as e:
                raise PassError(f"pass {p.name!r} left an invalid graph: {e}") from e
        for ins in ctx.instruments:
            ins.after(p, graph, i, changed, dt)
    return graph
