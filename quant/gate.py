"""The quantization driver: calibrate, plan, quantize, measure, and fall back until the budget holds.

::

    reference (unquantized serving form)
      -> calibration run: input amax + sampled rows per linear, K/V amax per head
      -> sensitivity: each layer's output SNR under each candidate format
      -> plan (config: format per layer) -> quantize pass -> score vs reference on the eval set
      -> budget missed? demote the most sensitive layers one step (NVFP4/MXFP4 -> FP8 -> BF16,
         then the KV cache back to full precision) and score again, until it holds
      -> or fail (QuantizationError): nothing is written

The demotions form one ordered list (every layer's first step, most sensitive first by SNR, then
every layer's second step, ...), so each candidate plan is a prefix of it. The shortest passing
prefix is found by doubling then bisection on a search subset of the eval tokens, then confirmed on
the whole eval set (and extended if the confirmation misses).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..ir.graph import Graph
from ..ir.text import parse_graph, print_graph
from ..passes import PassContext, PassError, run_passes
from . import calibration as C
from .config import Budget, LayerQuant, QuantConfig, fallback
from .evaluate import Agreement, Evaluator
from .linear import weight_nbytes

Log = Callable[[str], None]
Progress = Callable[[str, int, int], None]


class QuantizationError(ValueError):
    """Quantization cannot be done as asked (e.g. the accuracy budget cannot be met)."""


def clone_graph(g: Graph) -> Graph:
    """A structural copy sharing the (lazy, read-only) weight objects."""
    c = parse_graph(print_graph(g))
    for name in c.weight_values:
        c.weights[name] = g.weights[name]
    c.meta = copy.deepcopy(g.meta)
    return c


@dataclasses.dataclass
class Layer:
    node: str
    weight: str
    shape: tuple[int, int]
    spec: LayerQuant  # what the config asked for


def linear_layers(g: Graph, cfg: QuantConfig) -> list[Layer]:
    """The quantizable linears with the spec the config gives them (skipped ones left out)."""
    out = []
    for n in g.nodes:
        if n.op.name != "linear" or len(n.inputs) < 2 or n.inputs[1] is None:
            continue
        w = n.inputs[1]
        if w.name not in g.weights or w.type.rank != 2 or not w.type.is_static:
            continue
        q = cfg.spec_for([n.outputs[0].name, w.name, w.name.removesuffix(".weight")])
        if q is not None and q.weight != "none":
            out.append(Layer(n.outputs[0].name, w.name, tuple(int(d) for d in w.type.shape), q))  # type: ignore
    return out


@dataclasses.dataclass
class Step:
    """One demotion: ``layer`` goes to ``spec`` (``layer`` "kv_cache": the KV cache back to full precision)."""

    layer: str
    spec: LayerQuant | None
    snr_before: float


def fallback_steps(layers: Sequence[Layer], snr: dict[str, dict[str, float]], kv: bool) -> list[Step]:
    steps: list[Step] = []
    current = {la.node: la.spec for la in layers}
    while True:
        level = []
        for la in layers:
            nxt = fallback(current[la.node])
            if nxt is not None:
                level.append(Step(la.node, nxt, snr.get(la.node, {}).get(current[la.node].label, math.inf)))
        if not level:
            break
        level.sort(key=lambda s: s.snr_before)
        for s in level:
            current[s.layer] = s.spec  # type: ignore[assignment]
        steps.extend(level)
    if kv:
        steps.append(Step("kv_cache", None, math.inf))
    return steps


def plan_after(layers: Sequence[Layer], steps: Sequence[Step]) -> tuple[dict[str, LayerQuant], bool]:
    plan = {la.node: la.spec for la in layers}
    kv = True
    for s in steps:
        if s.layer == "kv_cache":
            kv = False
        else:
            plan[s.layer] = s.spec  # type: ignore[assignment]
    return plan, kv


@dataclasses.dataclass
class QuantResult:
    graph: Graph
    report: dict[str, Any]


def quantize_model(
    reference: Graph,
    cfg: QuantConfig,
    *,
    calib_sequences: Sequence[np.ndarray] | None,
    eval_tokens: np.ndarray | None,
    calib_method: str = "amax",
    search_tokens: int = 4096,
    seq_len: int = 512,
    log: Log | None = None,
    progress: Progress | None = None,
    evaluator: Evaluator | None = None,
) -> QuantResult:
    """Quantize ``reference`` (left unchanged) as ``cfg`` says, meeting ``cfg.budget`` on ``eval_tokens``.

    ``evaluator``: an ``Evaluator`` of ``reference`` to reuse (it keeps the reference's hidden states)
    instead of one made from ``eval_tokens``."""
    say = log or (lambda s: None)
    if not isinstance(reference.meta.get("kv_cache"), dict):
        raise QuantizationError("quantization needs an LLM in the serving form (a checkpoint or a lowered decoder)")
    ctx_len = int(reference.meta.get("llm", {}).get("context_length") or seq_len)  # type: ignore[union-attr]
    seq_len = min(seq_len, ctx_len)
    layers = linear_layers(reference, cfg)
    if not layers and not cfg.kv_cache:
        raise QuantizationError("nothing to quantize: every linear layer is skipped by the config")
    budget: Budget | None = cfg.budget
    kv = cfg.kv_cache is not None

    ladder: dict[str, LayerQuant] = {}
    for la in layers:
        q: LayerQuant | None = la.spec
        while q is not None:
            ladder[q.label] = q
            q = fallback(q)
    snr: dict[str, dict[str, float]] = {}
    calib_meta: dict[str, Any] | None = None
    gptq = cfg.rounding == "gptq"
    quantizer = None
    # the graph that gets quantized: the reference, or the reference with smoothing folded in (same function)
    base, smoothed = reference, None
    act_quantized = {la.node for la in layers if la.spec.act != "none"}
    if calib_sequences:
        say(f"calibrating on {sum(len(s) for s in calib_sequences)} tokens ({calib_method})")
        stats = C.collect(reference, calib_sequences, seq_len=seq_len, gram=gptq)
        if cfg.smooth is not None and act_quantized:
            from .smooth import smooth_graph, smooth_stats

            sm = smooth_graph(reference, stats, cfg.smooth, wanted=act_quantized.__contains__)
            base, smoothed = sm.graph, sm.summary
            rng_s = f", s in [{smoothed['s_min']:.3g}, {smoothed['s_max']:.3g}]" if smoothed["sites"] else ""
            say(f"smoothing activation outliers (alpha {cfg.smooth:g}): sites {smoothed['sites']}{rng_s}")
            if kv:  # V's ranges inside a head changed: measure them on the smoothed model
                stats = C.collect(base, calib_sequences, seq_len=seq_len, gram=gptq)
            else:
                stats = smooth_stats(stats, sm.scales)
        calib_meta = C.summary(stats, list(ladder.values()), calib_method)
        snr = C.sensitivity(base, stats, list(ladder.values()), calib_method)
        if gptq:
            quantizer = _gptq_quantizer(stats, cfg, say)
    elif kv or gptq or cfg.smooth is not None or any(q.needs_static_scale() for q in ladder.values()):
        raise QuantizationError("static activation scales, GPTQ rounding, smoothing and an FP8 KV cache need "
                                "calibration data (--calib)")

    def build(plan: dict[str, LayerQuant], with_kv: bool) -> Graph:
        g = clone_graph(base)
        if calib_meta is not None:
            g.meta["quant_calibration"] = calib_meta
        ctx = PassContext(target=cfg.target, options={"quantize": {
            "config": dataclasses.replace(cfg, kv_cache=None, layers={}, default="none"),
            "plan": plan, "kv_cache": cfg.kv_cache if with_kv else None, "weight_quantizer": quantizer}})
        try:
            run_passes(g, ["quantize"], ctx)
        except PassError as e:
            raise QuantizationError(str(e)) from None
        g.meta.pop("quant_calibration", None)
        return g

    if evaluator is not None:
        eval_tokens = np.concatenate(evaluator.sequences)
    elif eval_tokens is not None and len(eval_tokens) >= 2:
        evaluator = Evaluator(reference, eval_tokens, seq_len,
                              progress=(lambda d, t: progress("evaluating", d, t)) if progress else None)
    elif budget is not None:
        raise QuantizationError("an accuracy budget needs eval data (the model's tokenizer or eval tokens)")
    search = None
    if evaluator is not None and budget is not None and search_tokens < evaluator.tokens:
        search = Evaluator(reference, eval_tokens[:search_tokens], seq_len)  # type: ignore[index]

    history: list[dict[str, Any]] = []

    def score(m: int, ev: Evaluator, steps: list[Step]) -> Agreement:
        plan, with_kv = plan_after(layers, steps[:m])
        a = ev.score(build(plan, with_kv))
        history.append({"fallbacks": m, "tokens": a.tokens, "top1": a.top1, "kl": a.kl})
        say(f"  {m:3d} fallbacks: top1 {a.top1:.4f}, KL {a.kl:.5f} ({a.tokens} tokens, {a.seconds:.0f} s)")
        return a

    steps = fallback_steps(layers, snr, kv)
    chosen, final = 0, None
    if evaluator is not None:
        say(f"evaluating against the unquantized model on {evaluator.tokens} tokens")
        final = score(0, evaluator, steps)
        if budget is not None and not budget.met(final.top1, final.kl):
            chosen, final = _search(budget, steps, search or evaluator, evaluator, score, say)
    plan, with_kv = plan_after(layers, steps[:chosen])
    graph = build(plan, with_kv)
    report = _report(reference, cfg, layers, plan, with_kv, steps[:chosen], snr, final, budget, history,
                     calib_meta, graph)
    report["smooth"] = smoothed
    return QuantResult(graph, report)


def _gptq_quantizer(stats: C.CalibStats, cfg: QuantConfig, say: Log) -> Callable[..., dict[str, np.ndarray]]:
    """GPTQ rounding per (weight, spec), computed once and kept: fallback searches rebuild the graph
    many times, and the same layer in the same format is asked for again."""
    from .gptq import gptq_quantize_weight
    from .linear import quantize_weight

    grams = {st.weight: st.gram for st in stats.linears.values() if st.gram is not None}
    opts = {"damp": float(cfg.gptq.get("damp", 0.01)), "block": int(cfg.gptq.get("block", 128)),
            "act_order": bool(cfg.gptq.get("act_order", True))}
    cache: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    done: set[str] = set()

    def quantize(weight: str, w: np.ndarray, q: LayerQuant) -> dict[str, np.ndarray]:
        key = (weight, q.label)
        if key not in cache:
            gram = grams.get(weight)
            if gram is None or q.weight == "bf16":
                cache[key] = quantize_weight(w, q)
            else:
                cache[key] = gptq_quantize_weight(w, q, gram, **opts)
                if q.label not in done:
                    done.add(q.label)
                    say(f"GPTQ rounding ({q.label}, damp {opts['damp']})")
        return cache[key]

    return quantize


def _search(budget: Budget, steps: list[Step], search: Evaluator, full: Evaluator,
            score: Callable[[int, Evaluator, list[Step]], Agreement], say: Log) -> tuple[int, Agreement]:
    """The shortest prefix of ``steps`` whose plan meets ``budget``: doubling, bisection, confirmation."""
    n = len(steps)
    say(f"budget {budget} missed; searching {n} fallback steps on {search.tokens} tokens")
    lo, hi = 0, None  # lo fails; hi passes
    m = max(1, n // 32)
    while hi is None:
        m = min(m, n)
        a = score(m, search, steps)
        if budget.met(a.top1, a.kl):
            hi = m
        elif m == n:
            break
        else:
            lo, m = m, m * 2
    if hi is None:
        a = score(n, full, steps) if search is not full else a
        raise QuantizationError(_impossible(budget, a, steps))
    while hi - lo > max(1, hi // 8):
        mid = (lo + hi) // 2
        a = score(mid, search, steps)
        if budget.met(a.top1, a.kl):
            hi = mid
        else:
            lo = mid
    while True:
        a = score(hi, full, steps) if search is not full else score(hi, full, steps)
        if budget.met(a.top1, a.kl):
            return hi, a
        if hi == n:
            raise QuantizationError(_impossible(budget, a, steps))
        hi = min(n, hi + max(1, hi // 4))


def _impossible(budget: Budget, a: Agreement, steps: list[Step]) -> str:
    return (f"accuracy budget {budget} cannot be met: even with all {len(steps)} fallbacks (every layer back to "
            f"bf16, KV cache in full precision) the model reaches top1={a.top1:.4f}, KL={a.kl:.5f} over "
            f"{a.tokens} eval tokens; loosen the budget or skip more layers. No artifact was written.")


def _report(reference: Graph, cfg: QuantConfig, layers: list[Layer], plan: dict[str, LayerQuant], with_kv: bool,
            taken: list[Step], snr: dict[str, dict[str, float]], final: Agreement | None, budget: Budget | None,
            history: list[dict[str, Any]], calib: dict[str, Any] | None, graph: Graph) -> dict[str, Any]:
    demoted: dict[str, list[Step]] = {}
    for s in taken:
        demoted.setdefault(s.layer, []).append(s)
    rows = []
    for la in layers:
        q = plan[la.node]
        steps = demoted.get(la.node, [])
        reason = None
        if steps:
            reason = (f"budget {budget} missed; {la.spec.label} output SNR {steps[0].snr_before:.1f} dB was among "
                      f"the lowest, fell back to {q.label}")
        rows.append({
            "name": la.node, "weight": la.weight, "shape": list(la.shape), "requested": la.spec.label,
            "format": q.weight, "spec": q.label, "granularity": q.granularity or "-", "activations":
            q.act if q.act == "none" else f"{q.act}/{q.act_granularity}", "weight_bytes": weight_nbytes(la.shape, q),
            "f32_bytes": 4 * la.shape[0] * la.shape[1], "snr_db": _finite(snr.get(la.node, {}).get(q.label)),
            "snr_db_by_format": {k: _finite(v) for k, v in snr.get(la.node, {}).items()},
            "fell_back": bool(steps), "reason": reason,
        })
    params = sum(r["shape"][0] * r["shape"][1] for r in rows)
    fp4 = sum(r["shape"][0] * r["shape"][1] for r in rows if r["format"] in ("nvfp4", "mxfp4"))
    qbytes = sum(r["weight_bytes"] for r in rows)
    by_format: dict[str, int] = {}
    for r in rows:
        by_format[r["format"]] = by_format.get(r["format"], 0) + r["weight_bytes"]
    total_weights = sum((w.type.numel() or 0) * w.type.dtype.itemsize_bits // 8 for w in graph.weights.values())
    return {
        "format": cfg.default,
        "target": cfg.target,
        "budget": None if budget is None else {"top1": budget.top1, "kl": budget.kl},
        "met": None if budget is None or final is None else budget.met(final.top1, final.kl),
        "eval": None if final is None else {**final.as_dict(), "data": "stdlib docstrings (ingot.quant.eval_data)"},
        "calibration": None if calib is None else {"tokens": calib["tokens"], "method": calib["method"]},
        "rounding": cfg.rounding,
        "kv_cache": graph.meta.get("quantization", {}).get("kv_cache") if with_kv else None,  # type: ignore
        "bytes": {"linear_f32": 4 * params, "linear_quantized": qbytes, "linear_by_format": by_format,
                  "fp4_param_fraction": fp4 / params if params else 0.0,
                  "fp4_byte_fraction": by_format.get("nvfp4", 0) / qbytes + by_format.get("mxfp4", 0) / qbytes
                  if qbytes else 0.0,
                  "all_weights": total_weights},
        "fallbacks": len(taken),
        "search": history,
        "layers": rows,
    }


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 3)
