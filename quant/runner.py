"""Running a serving-form graph over token sequences on the CPU backend, with hooks.

Calibration and evaluation are teacher-forced: whole sequences go through in prefill steps (several
sequences per step, up to ``tokens_per_step`` tokens), and the logits are computed for every position
(``logits_indices`` = every token) rather than only each sequence's last one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..runtime.paged import PagedModel

Hook = Callable[[Node, list], None]


def run_nodes(graph: Graph, feeds: dict[str, np.ndarray], hook: Hook | None = None,
              until: Node | None = None) -> dict[Value, np.ndarray]:
    """Execute ``graph``'s nodes in order with their references; ``hook(node, args)`` sees each node's
    input arrays before it runs. Stops before ``until`` (its inputs are then in the returned env).
    Intermediates are kept only while something still needs them."""
    env: dict[Value, np.ndarray] = {v: np.asarray(feeds[v.name]) for v in graph.inputs}
    for name, v in graph.weight_values.items():
        env[v] = graph.weights[name].load()
    last: dict[Value, int] = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            if v is not None:
                last[v] = i
    keep = set(graph.outputs) | set(graph.weight_values.values()) | set(graph.inputs)
    if until is not None:
        keep |= {v for v in until.inputs if v is not None}
    for i, n in enumerate(graph.nodes):
        if n is until:
            break
        args = [None if v is None else env[v] for v in n.inputs]
        if hook is not None:
            hook(n, args)
        for v, a in zip(n.outputs, n.op.run(*args)):
            env[v] = a
        for v in n.inputs:
            if v is not None and last.get(v) == i and v not in keep:
                env.pop(v, None)
    return env


def split_sequences(tokens: np.ndarray, seq_len: int) -> list[np.ndarray]:
    """A token stream cut into sequences of ``seq_len`` (a shorter last one is kept if >= 2 tokens)."""
    tokens = np.asarray(tokens, np.int64).reshape(-1)
    seqs = [tokens[i : i + seq_len] for i in range(0, len(tokens), seq_len)]
    return [s for s in seqs if len(s) >= 2]


def logits_node(graph: Graph) -> Node:
    """The node that computes the ``logits`` output (the lm_head)."""
    out = graph.outputs[graph.output_names.index("logits")] if "logits" in graph.output_names else graph.outputs[0]
    if out.producer is None:
        raise ValueError(f"graph @{graph.name}: the logits output is not computed by a node")
    return out.producer


def step_batches(graph: Graph, sequences: Sequence[np.ndarray], tokens_per_step: int = 1024
                 ) -> Iterator[tuple[dict[str, np.ndarray], list[int]]]:
    """Feeds for teacher-forced steps over ``sequences`` (every position's logits), with the indices of
    the sequences in each step. Each sequence starts with an empty cache."""
    spec = graph.meta["kv_cache"]
    bs = int(spec["block_size"])  # type: ignore[index]
    longest = max(len(s) for s in sequences)
    per_step = max(tokens_per_step, longest)
    model = PagedModel(graph, num_blocks=per_step // bs + len(sequences) + 2)
    i = 0
    while i < len(sequences):
        group, total = [i], len(sequences[i])
        while i + len(group) < len(sequences) and total + len(sequences[i + len(group)]) <= per_step:
            total += len(sequences[i + len(group)])
            group.append(i + len(group))
        ids = [model.add_sequence() for _ in group]
        try:
            feeds = model.step_inputs([(sid, sequences[j].tolist()) for sid, j in zip(ids, group)])
            feeds["logits_indices"] = np.arange(total, dtype=np.int64)
            yield feeds, group
        finally:
            for sid in ids:
                model.free_sequence(sid)
        i += len(group)
