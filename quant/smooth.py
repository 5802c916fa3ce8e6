"""Activation-outlier migration (SmoothQuant, Xiao et al. 2023), folded exactly into the graph.

A few input channels of an LLM's linears carry much larger values than the rest, and per-token
activation quantization spends its range on them. Per input channel ``j`` of a linear,

    s_j = amax(X[:, j]) ** alpha / amax(W[:, j]) ** (1 - alpha)     (calibration amax, alpha in [0, 1])

divides the activation and multiplies the weight's column, so ``X W^T`` is unchanged while the
activation's channels are evened out (``alpha`` moves that much of the difficulty to the weights).
The division is folded into whatever produces ``X``, so no op is added:

::

    rms_norm(h, g) -> linear(W1), linear(W2)       g / s;  W1[:, j] * s, W2[:, j] * s   (one s per norm: every
                                                   linear reading it; amax(W[:, j]) is the max over them)
    linear(P)[v rows] -> paged_attention -> linear(Wo)
                                                   P[v rows] / s;  Wo[:, j] * s  (s is per KV-head channel: the
                                                   query heads reading one V channel share it, GQA; amaxes are
                                                   the max over those heads)
    linear(P)[up rows] -> swiglu(gate, up) -> linear(Wd)
                                                   P[up rows] / s;  Wd[:, j] * s

A site is folded only when the values in between have no other reader (the split's other outputs
are untouched rows) and the producing linear has no bias or residual. In exact arithmetic the
model computes the same function; in float32 it differs by rounding (tested). The rescaled
weights stay lazy (computed from the originals on first load) and keep their names.

The scales are computed from calibration statistics of the *unsmoothed* graph; the smoothed graph's
statistics follow from them (``smooth_stats``: each smoothed linear's input is the original divided
by its s), except the V ranges of an FP8 KV cache, for which the gate calibrates the smoothed graph
again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ..ir.graph import Graph, Node, Value, Weight
from .calibration import CalibStats

#: s is kept in [S_MIN, 1 / S_MIN] (a channel never seen, or an all-zero weight column, gets 1)
S_MIN = 1e-5


@dataclasses.dataclass
class Site:
    """One place where 1/s can be folded: ``linears`` read the smoothed activation (their weight columns
    are multiplied by s); ``target`` is the weight that absorbs 1/s: a 1-D norm weight (``rows`` None)
    or rows ``rows`` of a producing linear's weight. ``heads_per_kv`` > 1: the activation is an
    attention output of ``heads_per_kv * rows-length`` channels, and s is shared per KV-head channel."""

    kind: str  # norm | attention | mlp
    linears: list[Node]
    target: str
    rows: tuple[int, int] | None = None
    heads_per_kv: int = 1
    head_dim: int = 0

    @property
    def node_names(self) -> list[str]:
        return [n.outputs[0].name for n in self.linears]


def _weight_of(g: Graph, node: Node, index: int, uses: dict[Value, list[Node]]) -> str | None:
    """The graph weight at ``node.inputs[index]`` when it is read by ``node`` alone."""
    v = node.inputs[index] if len(node.inputs) > index else None
    if v is None or v.name not in g.weights or len(uses.get(v, [])) != 1:
        return None
    return v.name


def _own_linear(g: Graph, node: Node, uses: dict[Value, list[Node]]) -> bool:
    """A ``linear`` with its own 2-D graph weight (its columns can be rescaled; bias and residual are
    outputs' business and stay)."""
    w = _weight_of(g, node, 1, uses)
    return node.op.name == "linear" and w is not None and g.weights[w].type.rank == 2


def _plain_linear(g: Graph, node: Node, uses: dict[Value, list[Node]]) -> bool:
    """``_own_linear`` with neither bias nor residual (its output rows can be rescaled)."""
    return _own_linear(g, node, uses) and not [v for v in node.inputs[2:] if v is not None]


def _producer_rows(g: Graph, v: Value, uses: dict[Value, list[Node]]) -> tuple[str, tuple[int, int]] | None:
    """(weight, row range) of the linear whose output rows make ``v`` (directly, or one output of a
    last-axis split of it), when only one node reads ``v`` and only the split reads the linear's output."""
    if v.producer is None or len(uses.get(v, [])) != 1:
        return None
    node = v.producer
    if node.op.name == "split":
        src = node.inputs[0]
        sizes = getattr(node.op, "split", None)
        rank = len(src.type.shape) if src is not None and src.type.shape is not None else 0
        if src is None or sizes is None or len(node.inputs) > 1 or node.op.axis not in (-1, rank - 1):
            return None
        if src.producer is None or len(uses.get(src, [])) != 1:
            return None
        i = node.outputs.index(v)
        start = int(sum(sizes[:i]))
        lin, rows = src.producer, (start, start + int(sizes[i]))
    else:
        lin = node
        w = lin.inputs[1] if len(lin.inputs) > 1 else None
        if w is None or w.type.shape is None:
            return None
        rows = (0, int(w.type.shape[0]))
    if not _plain_linear(g, lin, uses):
        return None
    return lin.inputs[1].name, rows  # type: ignore[union-attr]


def find_sites(g: Graph) -> list[Site]:
    """Every place in ``g`` where smoothing can be folded (the patterns in the module docstring)."""
    uses = g.users()
    sites: list[Site] = []
    for node in g.nodes:
        if node.op.name == "rms_norm":
            out = node.outputs[0]
            readers = uses.get(out, [])
            scale = _weight_of(g, node, 1, uses)
            if (scale is None or g.weights[scale].type.rank != 1 or not readers
                    or not all(_own_linear(g, r, uses) and r.inputs[0] is out for r in readers)):
                continue
            if getattr(node.op, "axis", -1) not in (-1, (len(out.type.shape or ()) - 1)):
                continue
            sites.append(Site("norm", list(readers), scale))
        elif _own_linear(g, node, uses):
            x = node.inputs[0]
            if x is None or x.producer is None or len(uses.get(x, [])) != 1:
                continue
            prod = x.producer
            if prod.op.name == "paged_attention":
                v = prod.inputs[2]
                found = _producer_rows(g, v, uses) if v is not None else None
                if found is None:
                    continue
                h, kv, d = prod.op.num_heads, prod.op.num_kv_heads, prod.op.head_dim
                if found[1][1] - found[1][0] != kv * d:
                    continue
                sites.append(Site("attention", [node], found[0], found[1], heads_per_kv=h // kv, head_dim=d))
            elif prod.op.name == "swiglu":
                up = prod.inputs[1]
                found = _producer_rows(g, up, uses) if up is not None else None
                if found is not None:
                    sites.append(Site("mlp", [node], found[0], found[1]))
    return sites


def _scale(x_amax: np.ndarray, w_amax: np.ndarray, alpha: float) -> np.ndarray:
    x = np.asarray(x_amax, np.float64)
    w = np.asarray(w_amax, np.float64)
    ok = (x > 0) & (w > 0)
    s = np.ones_like(x)
    s[ok] = x[ok] ** alpha / w[ok] ** (1.0 - alpha)
    return np.clip(s, S_MIN, 1.0 / S_MIN)


def site_scales(g: Graph, site: Site, stats: CalibStats, alpha: float) -> np.ndarray | None:
    """s over the site's activation channels [K] (None: no calibration statistics for its linears)."""
    x_amax, w_amax = None, None
    for n in site.linears:
        st = stats.linears.get(n.outputs[0].name)
        if st is None or st.channel_amax is None:
            return None
        col = np.abs(g.weights[n.inputs[1].name].load().astype(np.float32)).max(axis=0)  # type: ignore[union-attr]
        x_amax = st.channel_amax if x_amax is None else np.maximum(x_amax, st.channel_amax)
        w_amax = col if w_amax is None else np.maximum(w_amax, col)
    assert x_amax is not None and w_amax is not None
    if site.heads_per_kv > 1:
        shape = (-1, site.heads_per_kv, site.head_dim)
        s_kv = _scale(x_amax.reshape(shape).max(axis=1), w_amax.reshape(shape).max(axis=1), alpha)
        return np.broadcast_to(s_kv[:, None, :], (s_kv.shape[0], site.heads_per_kv, site.head_dim)).reshape(-1)
    return _scale(x_amax, w_amax, alpha)


@dataclasses.dataclass
class _Rescale:
    """Per-weight factors, composed over sites: ``w * rows[:, None] * cols[None, :]`` (2-D) or ``w * cols``."""

    rows: np.ndarray | None = None
    cols: np.ndarray | None = None


def _mul(a: np.ndarray | None, b: np.ndarray) -> np.ndarray:
    return b if a is None else a * b


def _loader(orig: Weight, r: _Rescale) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        w = orig.load().astype(np.float64)
        if r.rows is not None:
            w = w * r.rows[:, None]
        if r.cols is not None:
            w = w * r.cols
        return w.astype(orig.type.dtype.np)

    return load


@dataclasses.dataclass
class Smoothing:
    """``smooth_graph``'s result: the smoothed copy, a JSON summary (alpha, sites by kind, range of s)
    and, per linear node name, the s its input was divided by."""

    graph: Graph
    summary: dict[str, object]
    scales: dict[str, np.ndarray]


def smooth_graph(g: Graph, stats: CalibStats, alpha: float, wanted: Callable[[str], bool] | None = None
                 ) -> Smoothing:
    """A copy of ``g`` with smoothing folded in at every site whose linears include one that ``wanted``
    (a linear's node name -> whether its activations are quantized; default: all)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"smoothing alpha must be in [0, 1], got {alpha}")
    from .gate import clone_graph

    out = clone_graph(g)
    factors: dict[str, _Rescale] = {}
    scales: dict[str, np.ndarray] = {}
    done: dict[str, int] = {}
    lo, hi = np.inf, 0.0
    for site in find_sites(g):
        if wanted is not None and not any(wanted(n) for n in site.node_names):
            continue
        s = site_scales(g, site, stats, alpha)
        if s is None:
            continue
        lo, hi = min(lo, float(s.min())), max(hi, float(s.max()))
        for n in site.linears:
            scales[n.outputs[0].name] = s
            w = n.inputs[1].name  # type: ignore[union-attr]
            f = factors.setdefault(w, _Rescale())
            f.cols = _mul(f.cols, s)
        f = factors.setdefault(site.target, _Rescale())
        if site.rows is None:
            f.cols = _mul(f.cols, 1.0 / s)
        else:
            n_rows = int(g.weights[site.target].type.shape[0])  # type: ignore[index]
            rows = np.ones(n_rows) if f.rows is None else f.rows
            a, b = site.rows
            rows[a:b] = rows[a:b] / (s if site.heads_per_kv == 1 else s.reshape(-1, site.heads_per_kv,
                                                                                site.head_dim)[:, 0, :].reshape(-1))
            f.rows = rows
        done[site.kind] = done.get(site.kind, 0) + 1
    for name, r in factors.items():
        orig = g.weights[name]
        out.weights[name] = Weight(orig.type, _loader(orig, r), source=f"smooth({orig.source})")
    summary: dict[str, object] = {"alpha": alpha, "sites": done, "weights": len(factors),
                                  "s_min": lo if done else None, "s_max": hi if done else None}
    return Smoothing(out, summary, scales)


def smooth_stats(stats: CalibStats, scales: dict[str, np.ndarray]) -> CalibStats:
    """The calibration statistics of the smoothed graph, derived from the original's: a smoothed linear's
    input is the original divided by its s (per channel), so its amaxes, sampled rows and Gram matrix
    follow exactly (up to float32 rounding); other linears are unchanged. K/V ranges are not derived
    (V's channels change inside a head): recalibrate when the KV cache is quantized."""
    linears = {}
    for name, st in stats.linears.items():
        s = scales.get(name)
        if s is None:
            linears[name] = st
            continue
        inv = (1.0 / s).astype(np.float32)
        ch = None if st.channel_amax is None else st.channel_amax * inv
        gram = None if st.gram is None else st.gram / np.outer(s, s)
        linears[name] = dataclasses.replace(st, amax=float(ch.max(initial=0.0)) if ch is not None else st.amax,
                                            channel_amax=ch, rows=[r * inv for r in st.rows], gram=gram)
    return CalibStats(stats.tokens, linears, dict(stats.kv))
