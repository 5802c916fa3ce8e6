"""Calibration: run the unquantized model over calibration sequences and record, per linear layer, the
input's amax (overall and per input channel) and a sample of input rows, and per attention layer the
K/V amax of every KV head.

From those: static activation scales (``amax``, ``percentile`` or ``mse``: the clip value whose
quantize-dequantize error over the sampled inputs is smallest) and per-layer SNR of each candidate
format (``sensitivity``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..ir.graph import Graph, Node
from ..ir.ops.quantized import quantize_activation
from .config import LayerQuant
from .linear import layer_output, quantize_weight, snr_db, static_input_scale
from .runner import run_nodes, split_sequences, step_batches

METHODS = ("amax", "percentile", "mse")


@dataclasses.dataclass
class LinearStats:
    node: str
    weight: str
    shape: tuple[int, int]  # [N, K]
    amax: float = 0.0
    channel_amax: np.ndarray | None = None  # max |x| per input channel [K] (for smoothing, ``ingot.quant.smooth``)
    rows: list[np.ndarray] = dataclasses.field(default_factory=list)
    gram: np.ndarray | None = None  # X^T X over every calibration token (f64 [K, K]); only when asked for

    def sample(self) -> np.ndarray:
        return np.concatenate(self.rows, axis=0) if self.rows else np.zeros((0, self.shape[1]), np.float32)


@dataclasses.dataclass
class CalibStats:
    tokens: int
    linears: dict[str, LinearStats]
    kv: dict[str, tuple[np.ndarray, np.ndarray]]  # attention node -> (k amax [KV], v amax [KV])


def load_calibration_file(path: str | Path, encode: Callable[[str], Sequence[int]] | None) -> list[np.ndarray]:
    """Token sequences from ``.npz`` / ``.npy`` (token ids: 1-D streams or 2-D rows), ``.txt`` (prompts
    separated by blank lines) or ``.jsonl`` (``{"text": ...}`` or ``{"prompt": ...}`` per line)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"calibration data {path}: no such file")
    if path.suffix in (".npz", ".npy"):
        try:
            data = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ValueError(f"calibration data {path}: cannot read it: {e}") from None
        if isinstance(data, np.ndarray):
            arrays = [data]
        else:
            arrays = [data[k] for k in (["input_ids"] if "input_ids" in data.files else data.files)]
        seqs: list[np.ndarray] = []
        for a in arrays:
            if a.dtype.kind not in "iu":
                raise ValueError(f"calibration data {path}: token ids must be integers, got {a.dtype}")
            seqs.extend([np.asarray(a, np.int64).reshape(-1)] if a.ndim <= 1 else [np.asarray(r, np.int64) for r in a])
        return seqs
    if encode is None:
        raise ValueError(f"calibration data {path}: text needs the model's tokenizer, and the model has none")
    text = path.read_text()
    if path.suffix == ".jsonl":
        prompts = []
        for line in text.splitlines():
            if line.strip():
                obj = json.loads(line)
                prompts.append(str(obj.get("text", obj.get("prompt", ""))) if isinstance(obj, dict) else str(obj))
    else:
        prompts = [p for p in text.split("\n\n") if p.strip()]
    return [np.asarray(list(encode(p)), np.int64) for p in prompts if p.strip()]


def collect(graph: Graph, sequences: Sequence[np.ndarray], seq_len: int = 512, rows_per_layer: int = 256,
            tokens_per_step: int = 1024, seed: int = 0, gram: bool = False) -> CalibStats:
    """Run ``graph`` (serving form, unquantized) over ``sequences`` and gather ``CalibStats``;
    ``gram``: also each linear's input Gram matrix (for GPTQ rounding, ``ingot.quant.gptq``)."""
    seqs = [s for seq in sequences for s in split_sequences(seq, seq_len)]
    if not seqs:
        raise ValueError("no calibration sequence has two or more tokens")
    total = sum(len(s) for s in seqs)
    rng = np.random.default_rng(seed)
    linears: dict[str, LinearStats] = {}
    for n in graph.nodes:
        w = n.inputs[1] if n.op.name == "linear" and len(n.inputs) > 1 else None
        if w is not None and w.name in graph.weights and w.type.shape is not None and len(w.type.shape) == 2:
            linears[n.outputs[0].name] = LinearStats(n.outputs[0].name, w.name, tuple(w.type.shape))  # type: ignore
    kv: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    step_rows: dict[str, int] = {}

    def hook(node: Node, args: list) -> None:
        name = node.outputs[0].name
        if name in linears:
            x = np.asarray(args[0], np.float32).reshape(-1, args[0].shape[-1])
            st = linears[name]
            col = np.abs(x).max(axis=0, initial=0.0)
            st.channel_amax = col if st.channel_amax is None else np.maximum(st.channel_amax, col)
            st.amax = max(st.amax, float(col.max(initial=0.0)))
            want = step_rows[name]
            idx = np.sort(rng.choice(len(x), size=min(want, len(x)), replace=False))
            st.rows.append(x[idx].copy())
            if gram:
                x64 = x.astype(np.float64)
                st.gram = x64.T @ x64 if st.gram is None else st.gram + x64.T @ x64
        elif node.op.name in ("paged_attention", "paged_attention_fp8"):
            heads, d = node.op.num_kv_heads, node.op.head_dim
            k = np.abs(np.asarray(args[1], np.float32).reshape(-1, heads, d)).max(axis=(0, 2))
            v = np.abs(np.asarray(args[2], np.float32).reshape(-1, heads, d)).max(axis=(0, 2))
            old = kv.get(name)
            kv[name] = (k, v) if old is None else (np.maximum(old[0], k), np.maximum(old[1], v))

    for feeds, _group in step_batches(graph, seqs, tokens_per_step):
        t = len(feeds["input_ids"])
        for name in linears:
            step_rows[name] = max(1, round(rows_per_layer * t / total))
        run_nodes(graph, feeds, hook)
    return CalibStats(total, linears, kv)


def act_amax(st: LinearStats, q: LayerQuant, method: str = "amax", percentile: float = 99.99) -> float:
    """The clip value for ``q``'s static activation scale on this layer."""
    if method == "amax" or st.amax == 0.0:
        return st.amax
    sample = st.sample()
    if method == "percentile":
        return float(min(st.amax, np.percentile(np.abs(sample), percentile)))
    if method == "mse":
        best, best_err = st.amax, np.inf
        for frac in np.linspace(0.25, 1.0, 31):
            clip = float(st.amax * frac)
            xq = quantize_activation(q.act, q.act_granularity, sample, static_input_scale(q, clip))
            err = float(((xq.astype(np.float64) - sample) ** 2).mean())
            if err < best_err:
                best, best_err = clip, err
        return best
    raise ValueError(f"unknown calibration method {method!r}; known: {', '.join(METHODS)}")


def sensitivity(graph: Graph, stats: CalibStats, specs: Sequence[LayerQuant], method: str = "amax",
                percentile: float = 99.99) -> dict[str, dict[str, float]]:
    """Per layer and spec label: the SNR (dB) of the layer's output on the sampled calibration inputs,
    quantized as that spec against full precision."""
    out: dict[str, dict[str, float]] = {}
    for name, st in stats.linears.items():
        x = st.sample()
        w = graph.weights[st.weight].load().astype(np.float32)
        ref = x @ w.T
        out[name] = {}
        for q in specs:
            scale = static_input_scale(q, act_amax(st, q, method, percentile)) if q.needs_static_scale() else None
            y = layer_output(q, x, w, quantize_weight(w, q) if q.weight != "none" else None, scale)
            out[name][q.label] = snr_db(ref, y)
    return out


def summary(stats: CalibStats, specs: Sequence[LayerQuant] = (), method: str = "amax",
            percentile: float = 99.99) -> dict[str, Any]:
    """What ``graph.meta["quant_calibration"]`` holds (numbers only, for the quantize pass and the
    manifest): per linear its input amax and, for every spec with a static activation scale, the
    calibrated clip value; per attention layer the K/V amax per KV head."""
    static = [q for q in specs if q.needs_static_scale()]
    return {
        "tokens": stats.tokens,
        "method": method,
        "linear": {n: {"amax": s.amax, "clip": {q.label: act_amax(s, q, method, percentile) for q in static}}
                   for n, s in stats.linears.items()},
        "kv": {n: {"k_amax": k.tolist(), "v_amax": v.tolist()} for n, (k, v) in stats.kv.items()},
    }
