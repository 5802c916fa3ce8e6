"""``quantize``: linear layers -> ``quantized_linear`` (FP8 / NVFP4 / MXFP4), optionally an FP8 KV cache.

Runs after: ``llm-lower`` or a checkpoint frontend (the serving form), and ``calibrate`` when a layer
has static activation scales or the KV cache is quantized (it reads ``graph.meta["quant_calibration"]``).
Needs: ``linear`` nodes whose weight is a 2-D graph weight.
Preserves: every value's name and type (outputs keep their dtype); the KV cache inputs become
``f8e4m3fn`` when it is quantized.

Options (``ctx.option("quantize", ...)``):

- ``config``: a ``QuantConfig``, a mapping or a JSON/YAML path (``ingot.quant.config``); ``format``:
  the default spec when no config says one (``fp8``).
- ``plan``: ``{node name: spec}`` overriding the config (the accuracy gate's fallbacks).
- ``kv_cache``: ``fp8``, ``fp8:head`` or ``fp8:tensor`` (overrides the config's).
- ``weight_quantizer``: ``fn(weight_name, w, spec) -> stored arrays`` replacing round-to-nearest
  (the accuracy gate passes GPTQ rounding here, ``ingot.quant.gptq``).

Weights stay lazy: the stored codes and scales are computed from the original weight when first
loaded. Names follow ModelOpt's checkpoints: ``<base>.weight``, ``.weight_scale``,
``.weight_scale_2``, ``.input_scale``. ``graph.meta["quantization"]`` records what each layer got.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..ir.graph import Graph, Node, Value, Weight
from ..ir.ops.quantized import PagedAttentionFp8
from ..ir.quant import formats as F
from ..ir.types import DType, TensorType
from ..quant.config import LayerQuant, QuantConfig, QuantConfigError, load_config, parse_kv_spec, parse_spec
from ..quant.linear import make_op, quantize_weight, static_input_scale, weight_nbytes
from .manager import Pass, PassContext, PassError, register_pass

#: (weight name, f32 weight [N, K], spec) -> the stored arrays (``quantize_weight``'s layout)
WeightQuantizer = Callable[[str, np.ndarray, LayerQuant], dict[str, np.ndarray]]


class _Memo:
    """Computes the quantized arrays of one weight once, on first use."""

    def __init__(self, fn: Callable[[], dict[str, np.ndarray]]) -> None:
        self.fn, self.value = fn, None

    def get(self, key: str) -> np.ndarray:
        if self.value is None:
            self.value = self.fn()
        return self.value[key]


def _stored_types(q: LayerQuant, n: int, k: int) -> dict[str, TensorType]:
    if q.weight == "bf16":
        return {"weight": TensorType(DType.bf16, (n, k))}
    if q.weight == "fp8":
        scale = {"tensor": (), "channel": (n,), "block": (-(-n // 128), -(-k // 128))}[q.granularity]
        return {"weight": TensorType(DType.f8e4m3fn, (n, k)), "weight_scale": TensorType(DType.f32, scale)}
    vec = F.NVFP4_BLOCK if q.weight == "nvfp4" else F.MX_BLOCK
    types = {"weight": TensorType(DType.u8, (n, k // 2)),
             "weight_scale": TensorType(DType.f8e4m3fn if q.weight == "nvfp4" else DType.f8e8m0, (n, k // vec))}
    if q.weight == "nvfp4":
        types["weight_scale_2"] = TensorType(DType.f32, ())
    return types


def resolve_config(ctx: PassContext) -> QuantConfig:
    cfg = ctx.option("quantize", "config")
    target = ctx.target if isinstance(ctx.target, str) else "cpu"
    try:
        if isinstance(cfg, QuantConfig):
            return cfg
        return load_config(cfg, default=ctx.option("quantize", "format"), target=target)
    except QuantConfigError as e:
        raise PassError(str(e)) from None


def _replace_weight(g: Graph, old: Value, users: int, name: str) -> str:
    """Free ``name`` for reuse when ``old`` (named so) has no other user; returns the name to use."""
    if users == 1 and old.name == name:
        g.weights.pop(name)
        g.weight_values.pop(name)
        g._names.discard(name)
    return name


def _nearest(weight_name: str, w: np.ndarray, q: LayerQuant) -> dict[str, np.ndarray]:
    return quantize_weight(w, q)


def quantize_linear_node(g: Graph, node: Node, q: LayerQuant, calib: dict[str, Any] | None,
                         users: dict[Value, list[Node]], quantizer: WeightQuantizer = _nearest) -> dict[str, Any]:
    """Rewrite one ``linear`` node as ``q`` says; returns its ``meta["quantization"]`` entry.
    ``quantizer(weight_name, w, q)`` makes the stored arrays (default: round-to-nearest)."""
    x, w = node.inputs[0], node.inputs[1]
    assert x is not None and w is not None
    n, k = (int(d) for d in w.type.shape)  # type: ignore[union-attr]
    out_name = node.outputs[0].name
    entry = {"spec": q.label, "weight": w.name, "shape": [n, k], "bytes": weight_nbytes((n, k), q)}
    vec = {"nvfp4": F.NVFP4_BLOCK, "mxfp4": F.MX_BLOCK}.get(q.weight, 1)
    if k % vec or (q.act in ("nvfp4", "mxfp4") and k % vec):
        raise PassError(f"{out_name}: {q.label} needs K ({k}) to be a multiple of {vec}")
    scale = None
    if q.needs_static_scale():
        stats = (calib or {}).get("linear", {}).get(out_name)
        if stats is None:
            raise PassError(f"{out_name}: {q.label} has a static activation scale; run the calibrate pass first")
        clip = stats.get("clip", {}).get(q.label, stats["amax"])
        scale = static_input_scale(q, float(clip))
        entry["input_amax"] = float(clip)
    orig = g.weights[w.name]
    memo = _Memo(lambda: quantizer(w.name, orig.load(), q))
    base = w.name[: -len(".weight")] if w.name.endswith(".weight") else w.name
    if len(users.get(w, [])) > 1:
        base = out_name
    new: dict[str, Value] = {}
    for key, t in _stored_types(q, n, k).items():
        name = _replace_weight(g, w, len(users.get(w, [])), f"{base}.{key}") if key == "weight" else f"{base}.{key}"
        new[key] = g.add_weight(name, Weight(t, lambda key=key: memo.get(key), source=f"quantize({orig.source})"))
    if scale is not None:
        new["input_scale"] = g.add_weight(f"{base}.input_scale", Weight.from_array(scale, "calibration"))
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    residual = node.inputs[3] if len(node.inputs) > 3 else None
    if q.weight == "bf16":
        inputs = [x, new["weight"], bias, residual]
    else:
        inputs = [x, new["weight"], new["weight_scale"], new.get("weight_scale_2"), new.get("input_scale"), bias,
                  residual]
    while inputs[-1] is None:
        inputs.pop()
    node.op = make_op(q, k)
    node.inputs = inputs
    return entry


def quantize_kv_cache(g: Graph, granularity: str, calib: dict[str, Any] | None) -> dict[str, Any]:
    """Every ``paged_attention`` -> ``paged_attention_fp8`` with calibrated K/V scales; cache inputs -> fp8."""
    kv = (calib or {}).get("kv", {})
    scales = {}
    for node in g.nodes:
        if node.op.name != "paged_attention":
            continue
        name = node.outputs[0].name
        if name not in kv:
            raise PassError(f"{name}: an FP8 KV cache needs calibrated K/V ranges; run the calibrate pass first")
        amax = np.asarray([kv[name]["k_amax"], kv[name]["v_amax"]], np.float32)
        if granularity == "tensor":
            amax = np.repeat(amax.max(axis=1, keepdims=True), amax.shape[1], axis=1)
        scale = np.where(amax > 0, amax / np.float32(F.E4M3_MAX), np.float32(1)).astype(np.float32)
        attrs = {k: v for k, v in node.op.attrs().items()}
        node.op = PagedAttentionFp8(**attrs, kv_granularity=granularity)
        node.inputs = [*node.inputs, g.add_weight(f"{name}.kv_scale", Weight.from_array(scale, "calibration"))]
        cache = node.inputs[3]
        assert cache is not None
        cache.type = TensorType(DType.f8e4m3fn, cache.type.shape)
        scales[name] = scale.tolist()
    spec = g.meta.get("kv_cache")
    if isinstance(spec, dict):
        spec = dict(spec)
        per_elem = spec["bytes_per_token"] // DType(spec["dtype"]).np.itemsize
        spec["dtype"], spec["bytes_per_token"] = DType.f8e4m3fn.value, per_elem
        g.meta["kv_cache"] = spec
    return {"format": "fp8", "granularity": granularity, "scales": scales}


@register_pass
class Quantize(Pass):
    __doc__ = __doc__
    name = "quantize"

    def run(self, graph: Graph, ctx: PassContext) -> bool:
        cfg = resolve_config(ctx)
        plan = ctx.option("quantize", "plan") or {}
        target = ctx.target if isinstance(ctx.target, str) else "cpu"
        try:
            plan = {k: v if isinstance(v, LayerQuant) else parse_spec(v, target) for k, v in plan.items()}
            kv_spec = ctx.option("quantize", "kv_cache", cfg.kv_cache)
            kv_gran = parse_kv_spec(kv_spec) if kv_spec else None
        except QuantConfigError as e:
            raise PassError(str(e)) from None
        calib = graph.meta.get("quant_calibration")
        calib = calib if isinstance(calib, dict) else None
        users = graph.users()
        quantizer = ctx.option("quantize", "weight_quantizer") or _nearest
        layers: dict[str, Any] = {}
        for node in list(graph.nodes):
            if node.op.name != "linear" or len(node.inputs) < 2:
                continue
            w = node.inputs[1]
            if w is None or w.name not in graph.weights or w.type.rank != 2 or not w.type.is_static:
                continue
            names = [node.outputs[0].name, w.name, w.name.removesuffix(".weight")]
            q = plan.get(names[0]) if names[0] in plan else cfg.spec_for(names)
            if q is None or q.weight == "none":
                continue
            layers[names[0]] = quantize_linear_node(graph, node, q, calib, users, quantizer)
            self.stats[q.label] = self.stats.get(q.label, 0) + 1
        meta: dict[str, Any] = {"layers": layers}
        if kv_gran is not None:
            meta["kv_cache"] = quantize_kv_cache(graph, kv_gran, calib)
        graph.meta["quantization"] = meta
        graph.remove_unused()
        return bool(layers) or kv_gran is not None
