"""Teacher-forced agreement of a quantized model with the unquantized one.

Over an eval token stream cut into sequences, every position's next-token distribution of the
quantized graph is compared with the reference's: top-1 agreement (the argmaxes are equal) and the
mean KL divergence ``KL(p_ref || p_quant)`` in nats. The reference runs once; its final hidden
states (the lm_head's input) are kept, and its logits recomputed from them for each comparison.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from ..ir.graph import Graph
from .runner import logits_node, run_nodes, split_sequences, step_batches


@dataclasses.dataclass
class Agreement:
    top1: float
    kl: float
    tokens: int
    seconds: float

    def as_dict(self) -> dict[str, float]:
        return {"top1": self.top1, "kl": self.kl, "tokens": self.tokens, "seconds": round(self.seconds, 2)}


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def compare_logits(ref: np.ndarray, got: np.ndarray, rows: int = 256) -> tuple[int, float]:
    """(number of rows whose argmax agrees, sum over rows of KL(softmax(ref) || softmax(got)))."""
    agree, kl = 0, 0.0
    for i in range(0, len(ref), rows):
        r, g = ref[i : i + rows], got[i : i + rows]
        agree += int((r.argmax(axis=-1) == g.argmax(axis=-1)).sum())
        lr, lg = _log_softmax(r), _log_softmax(g)
        kl += float((np.exp(lr) * (lr - lg)).sum())
    return agree, kl


class Evaluator:
    """Scores graphs against ``reference`` on ``tokens`` (one stream, cut into ``seq_len`` sequences)."""

    def __init__(self, reference: Graph, tokens: np.ndarray, seq_len: int = 512, tokens_per_step: int = 1024,
                 progress: Callable[[int, int], None] | None = None) -> None:
        self.reference = reference
        self.sequences = split_sequences(tokens, seq_len)
        self.tokens = sum(len(s) for s in self.sequences)
        self.tokens_per_step = tokens_per_step
        self.progress = progress
        self._hidden: list[np.ndarray] | None = None

    def _run(self, graph: Graph) -> list[tuple[np.ndarray, list]]:
        """Per step: the lm_head's input and the lm_head node's other input arrays."""
        head = logits_node(graph)
        out = []
        done = 0
        for feeds, _ in step_batches(graph, self.sequences, self.tokens_per_step):
            env = run_nodes(graph, feeds, until=head)
            args = [None if v is None else env[v] for v in head.inputs]
            out.append((args[0], args))
            done += len(feeds["input_ids"])
            if self.progress:
                self.progress(done, self.tokens)
        return out

    def _reference_hidden(self) -> list[np.ndarray]:
        if self._hidden is None:
            self._hidden = [h for h, _ in self._run(self.reference)]
        return self._hidden

    def score(self, graph: Graph) -> Agreement:
        t0 = time.perf_counter()
        ref_hidden = self._reference_hidden()
        ref_head = logits_node(self.reference)
        ref_args = [None if v is None else self.reference.weights[v.name].load() if v.name in self.reference.weights
                    else None for v in ref_head.inputs]
        agree, kl, n = 0, 0.0, 0
        for h_ref, (h, args) in zip(ref_hidden, self._run(graph)):
            head = logits_node(graph)
            for i in range(0, len(h), 512):
                lq = head.op.run(h[i : i + 512], *args[1:])[0]
                lr = ref_head.op.run(h_ref[i : i + 512], *ref_args[1:])[0]
                a, k = compare_logits(lr, lq)
                agree, kl, n = agree + a, kl + k, n + len(lq)
        return Agreement(agree / n, kl / n, n, time.perf_counter() - t0)
