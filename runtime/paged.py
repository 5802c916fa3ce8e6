"""A minimal CPU driver for serving-form graphs: a paged KV cache, a block allocator and ``step``.

No scheduler: the caller says which sequences get which new tokens in each step. ``step`` lays
those tokens end to end, builds the step inputs of docs/SERVING_FORM.md and runs the graph::

    batch = [(seq a, 6 prompt tokens), (seq b, 1 decode token)]
    input_ids       = [a0 a1 a2 a3 a4 a5 | b0]
    positions       = [ 0  1  2  3  4  5 | 9 ]         (b had 9 tokens cached)
    query_start_loc = [0, 6, 7]      logits_indices = [5, 6]
    slot_mapping    = block_table[pos // block_size] * block_size + pos % block_size

Invariants: a sequence's blocks hold exactly its first ``num_tokens`` tokens' K/V, in order; a
block belongs to at most one sequence; free + used == ``num_blocks``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..ir.graph import Graph
from ..ir.types import DType
from .cpu import CpuExecutor


class CacheFullError(RuntimeError):
    """No free KV cache block is left for a step."""


@dataclass
class SequenceState:
    """One sequence's place in the cache: how many tokens it has there, and in which blocks."""

    num_tokens: int = 0
    block_table: list[int] = field(default_factory=list)


class PagedModel:
    """A serving-form graph with its KV cache (``num_blocks`` blocks per layer) on the CPU backend."""

    def __init__(self, graph: Graph, num_blocks: int) -> None:
        spec = graph.meta.get("kv_cache")
        if not isinstance(spec, dict):
            raise ValueError(f"graph @{graph.name} is not in the serving form: graph.meta has no 'kv_cache' spec")
        self.graph = graph
        self.block_size = int(spec["block_size"])
        self.num_blocks = num_blocks
        shape = (num_blocks, 2, self.block_size, int(spec["num_kv_heads"]), int(spec["head_dim"]))
        dtype = DType(spec["dtype"]).np
        self.caches = {name: np.zeros(shape, dtype) for name in spec["inputs"]}
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self.sequences: dict[int, SequenceState] = {}
        self._next_id = 0
        self._executor = CpuExecutor(graph)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def add_sequence(self) -> int:
        """Register an empty sequence; returns its id."""
        seq_id = self._next_id
        self._next_id += 1
        self.sequences[seq_id] = SequenceState()
        return seq_id

    def free_sequence(self, seq_id: int) -> None:
        """Return a sequence's blocks to the free list."""
        seq = self.sequences.pop(seq_id)
        self._free.extend(reversed(seq.block_table))

    def _reserve(self, seq: SequenceState, num_tokens: int) -> None:
        need = -(-num_tokens // self.block_size) - len(seq.block_table)
        if need > len(self._free):
            raise CacheFullError(f"KV cache full: need {need} more blocks, {len(self._free)} free "
                                 f"of {self.num_blocks} (block size {self.block_size})")
        seq.block_table.extend(self._free.pop() for _ in range(need))

    def step_inputs(self, batch: Sequence[tuple[int, Sequence[int]]]) -> dict[str, np.ndarray]:
        """The step inputs for ``batch`` = [(sequence id, its new token ids)]; reserves cache blocks.

        Every sequence appears once and has at least one new token. The sequences' token counts
        advance only in ``step``.
        """
        if not batch:
            raise ValueError("a step needs at least one sequence")
        ids, pos, slots, seq_lens, starts = [], [], [], [], [0]
        for seq_id, tokens in batch:
            if seq_id not in self.sequences:
                raise KeyError(f"unknown sequence {seq_id}")
            if len(tokens) == 0:
                raise ValueError(f"sequence {seq_id} has no new tokens in this step")
            seq = self.sequences[seq_id]
            total = seq.num_tokens + len(tokens)
            self._reserve(seq, total)
            p = np.arange(seq.num_tokens, total, dtype=np.int64)
            table = np.asarray(seq.block_table, np.int64)
            ids.append(np.asarray(tokens, np.int64))
            pos.append(p)
            slots.append(table[p // self.block_size] * self.block_size + p % self.block_size)
            seq_lens.append(total)
            starts.append(starts[-1] + len(tokens))
        if len({s for s, _ in batch}) != len(batch):
            raise ValueError("a sequence appears twice in one step")
        max_blocks = max(len(self.sequences[s].block_table) for s, _ in batch)
        block_tables = np.zeros((len(batch), max_blocks), np.int32)
        for row, (seq_id, _) in enumerate(batch):
            table = self.sequences[seq_id].block_table
            block_tables[row, : len(table)] = table
        query_start_loc = np.asarray(starts, np.int32)
        return {
            "input_ids": np.concatenate(ids),
            "positions": np.concatenate(pos),
            "slot_mapping": np.concatenate(slots),
            "block_tables": block_tables,
            "seq_lens": np.asarray(seq_lens, np.int32),
            "query_start_loc": query_start_loc,
            "logits_indices": query_start_loc[1:].astype(np.int64) - 1,
            **self.caches,
        }

    def step(self, batch: Sequence[tuple[int, Sequence[int]]]) -> np.ndarray:
        """Run one step; returns next-token logits [len(batch), vocab], one row per sequence."""
        feeds = self.step_inputs(batch)
        logits = self._executor.run(feeds)["logits"]
        for seq_id, tokens in batch:
            self.sequences[seq_id].num_tokens += len(tokens)
        return logits


def _stop_ids(graph: Graph) -> tuple[int, ...]:
    info = graph.meta.get("llm")
    return tuple(info.get("eos_token_ids") or ()) if isinstance(info, dict) else ()


def iter_greedy(graph: Graph, prompt_ids: Sequence[int], max_new_tokens: int, prefill_chunk: int | None = None,
                stop_ids: Sequence[int] | None = None, model: PagedModel | None = None) -> Iterator[int]:
    """Yield greedily decoded tokens one by one; stops after a stop token (yielded) or
    ``max_new_tokens``. ``stop_ids`` defaults to the model's EOS ids (``graph.meta["llm"]``);
    ``prefill_chunk`` prefills the prompt that many tokens per step."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("the prompt is empty")
    stops = set(_stop_ids(graph) if stop_ids is None else stop_ids)
    if model is None:
        bs = int(graph.meta["kv_cache"]["block_size"])  # type: ignore[index]
        model = PagedModel(graph, num_blocks=-(-(len(prompt) + max_new_tokens) // bs))
    seq = model.add_sequence()
    try:
        chunk = prefill_chunk or len(prompt)
        for start in range(0, len(prompt), chunk):
            logits = model.step([(seq, prompt[start : start + chunk])])
        for i in range(max_new_tokens):
            token = int(np.argmax(logits[0]))
            yield token
            if token in stops or i == max_new_tokens - 1:
                break
            logits = model.step([(seq, [token])])
    finally:
        model.free_sequence(seq)


def greedy_generate(graph: Graph, prompt_ids: Sequence[int], max_new_tokens: int,
                    prefill_chunk: int | None = None, stop_ids: Sequence[int] | None = None) -> list[int]:
    """Greedy decoding of one prompt; returns the new token ids (a final stop token included)."""
    return list(iter_greedy(graph, prompt_ids, max_new_tokens, prefill_chunk, stop_ids))
