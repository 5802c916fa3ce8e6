"""The CPU backend: runs any IR graph with the ops' numpy reference implementations."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..ir.graph import Graph, Value
from ..ir.types import DType, TensorType, dims_compatible


class FeedError(ValueError):
    """A feed is missing, unexpected, or has the wrong dtype or shape."""


def check_feeds(g: Graph, feeds: Mapping[str, np.ndarray]) -> dict[Value, np.ndarray]:
    """Match feeds to graph inputs by name; symbolic dims must bind consistently."""
    by_name = {v.name: v for v in g.inputs}
    unknown = sorted(set(feeds) - set(by_name))
    if unknown:
        raise FeedError(f"unknown input(s) {unknown}; the model's inputs are {sorted(by_name)}")
    missing = sorted(set(by_name) - set(feeds))
    if missing:
        raise FeedError(f"missing input(s) {missing}")
    bound: dict[str, int] = {}
    out: dict[Value, np.ndarray] = {}
    for name, arr in feeds.items():
        v = by_name[name]
        arr = np.asarray(arr)
        try:
            got = DType.from_np(arr.dtype)
        except TypeError as e:
            raise FeedError(f"input {name!r}: {e}") from None
        if got != v.type.dtype:
            raise FeedError(f"input {name!r} must be {v.type.dtype.value}, got {got.value}")
        if v.type.shape is not None:
            if arr.ndim != len(v.type.shape):
                raise FeedError(
                    f"input {name!r} must have rank {len(v.type.shape)} ({v.type}), got shape {arr.shape}"
                )
            for d, n in zip(v.type.shape, arr.shape):
                if isinstance(d, int):
                    ok = d == n
                elif d == "?":
                    ok = True
                else:
                    ok = bound.setdefault(d, n) == n
                if not ok:
                    raise FeedError(
                        f"input {name!r} must have shape {v.type}, got {arr.shape}"
                        + (f" (dim {d} is {bound[d]} from another input)" if isinstance(d, str) else "")
                    )
        out[v] = arr
    return out


class CpuExecutor:
    """Executes a graph node by node, freeing each intermediate after its last use.

    ``overrides``: op name -> ``fn(op, *inputs) -> outputs`` run instead of the op's reference (the
    tensor-parallel runtime routes ``all_reduce`` to its transport this way: ``runtime/tp/comm.py``).
    """

    def __init__(self, graph: Graph,
                 overrides: Mapping[str, Callable[..., Sequence[np.ndarray]]] | None = None) -> None:
        self.graph = graph
        self.overrides = dict(overrides or {})
        last_use: dict[Value, int] = {}
        for i, n in enumerate(graph.nodes):
            for v in n.inputs:
                if v is not None:
                    last_use[v] = i
        keep = set(graph.outputs) | set(graph.weight_values.values())
        self._free_after: list[list[Value]] = [[] for _ in graph.nodes]
        for v, i in last_use.items():
            if v not in keep:
                self._free_after[i].append(v)
        self._last_ids: np.ndarray | None = None  # the last submitted plan's last step's ids (a chained plan's input)

    def run(self, feeds: Mapping[str, np.ndarray], check: bool = True) -> dict[str, np.ndarray]:
        g = self.graph
        env: dict[Value, np.ndarray] = check_feeds(g, feeds) if check else {
            v: np.asarray(feeds[v.name]) for v in g.inputs
        }
        for name, v in g.weight_values.items():
            env[v] = g.weights[name].load()
        for i, n in enumerate(g.nodes):
            args = [None if v is None else env[v] for v in n.inputs]
            try:
                fn = self.overrides.get(n.op.name) if self.overrides else None
                outs = n.op.run(*args) if fn is None else fn(n.op, *args)
            except Exception as e:
                where = f" (node {n.source!r})" if n.source else ""
                raise RuntimeError(f"{n.op.name}{where} failed: {type(e).__name__}: {e}") from e
            if len(outs) < len(n.outputs):
                raise RuntimeError(f"{n.op.name}: produced {len(outs)} outputs, expected {len(n.outputs)}")
            for v, a in zip(n.outputs, outs):
                if check and not _matches(v.type, a):
                    raise RuntimeError(
                        f"{n.op.name} (node {n.source!r}): output %{v.name} is "
                        f"{a.dtype}{list(a.shape)}, type inference said {v.type}"
                    )
                env[v] = a
            for v in self._free_after[i]:
                env.pop(v, None)
        return {name: env[v] for v, name in zip(g.outputs, g.output_names)}

    def greedy_tokens(self, step_inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """A serving-form step's ``argmax(logits, axis=1)`` (``i64[S]``): the interface of the CUDA executor,
        which takes it on the GPU (``runtime/engine.py``, "Device sampling"); here numpy's argmax of the logits."""
        return np.argmax(self.run(step_inputs, check=False)["logits"], axis=1)

    def greedy_tokens_steps(self, steps: Sequence[Mapping[str, np.ndarray]]) -> np.ndarray:
        """Decode steps back to back (``runtime/engine.py``, "Decode steps"): ``greedy_tokens`` of each, step
        ``j > 0`` taking step ``j - 1``'s ids as its ``input_ids`` (its own are placeholders); ``i64[K, S]``."""
        ids: list[np.ndarray] = []
        for feeds in steps:
            if ids:
                feeds = {**feeds, "input_ids": ids[-1].astype(np.int64)}
            ids.append(self.greedy_tokens(feeds))
        return np.stack(ids)

    def submit_greedy_steps(self, steps: Sequence[Mapping[str, np.ndarray]], chained: bool = False) -> np.ndarray:
        """``greedy_tokens_steps``, run now (nothing runs beside the host here); the CUDA executor queues it instead
        (``runtime/engine.py``, "Overlap"). ``chained``: step 0's ``input_ids`` are the previous call's last ids
        (its own are placeholders). Returns the ticket for ``collect_greedy_steps``: here the ids ``i64[K, S]``."""
        if chained:
            if self._last_ids is None or len(self._last_ids) != len(steps[0]["seq_lens"]):
                raise ValueError("chained decode steps need the previous submission's ids for the same rows")
            steps = [{**steps[0], "input_ids": self._last_ids}, *steps[1:]]
        ids = self.greedy_tokens_steps(steps)
        self._last_ids = ids[-1].astype(np.int64)
        return ids

    def collect_greedy_steps(self, ticket: np.ndarray) -> np.ndarray:
        """The ids ``i64[K, S]`` of a ``submit_greedy_steps`` call."""
        return ticket


def _matches(t: TensorType, a: np.ndarray) -> bool:
    if a.dtype != t.dtype.np:
        return False
    if t.shape is None:
        return True
    return a.ndim == len(t.shape) and all(
        not isinstance(d, int) or dims_compatible(d, n) for d, n in zip(t.shape, a.shape)
    )


def run_graph(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return CpuExecutor(graph).run(feeds)
