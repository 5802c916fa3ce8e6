"""What to quantize and how: per-layer format specs, the config file, the accuracy budget.

A layer's format is a spec string ``FORMAT[:OPTION...]``:

==============  ================================================================================
``fp8``         E4M3 weights with per-output-channel scales, activations E4M3 per token (W8A8)
``fp8:tensor``  ... per-tensor weight scale; ``fp8:block``: 128x128 block scales
``fp8:static``  ... activations with one calibrated static scale per tensor
``fp8:wo``      weight-only (activations stay in float)
``nvfp4``       NVFP4 weights (E2M1, E4M3 scale per 16, f32 global scale); weight-only, except on
                targets with FP4 tensor cores (b200), where activations are NVFP4 too (W4A4)
``nvfp4:w4a4``  NVFP4 activations with a calibrated static global scale (``:dynamic``: per token)
``nvfp4:wo``    weight-only
``mxfp4``       MXFP4 weights (E2M1, E8M0 scale per 32); ``mxfp4:w4a4``: MXFP4 activations too
``bf16``        no quantization; the weight is stored in bfloat16 (the last fallback)
``none``        left exactly as it is
==============  ================================================================================

A config file (JSON or YAML)::

    {"default": "nvfp4", "layers": {"model.layers.0.*": "fp8"}, "skip": ["*.mlp_out"],
     "kv_cache": "fp8:head", "calibration": {"method": "mse", "tokens": 2048}, "rounding": "gptq", "smooth": 0.5}

``layers`` patterns are globs matched (first match wins, in file order) against a linear's node name
(``layers.0.qkv``), its weight's name (``model.layers.0.self_attn.qkv_proj.weight``) and that name
without ``.weight``. ``skip`` adds to the default skip-list (embeddings, lm_head, norms: only
``linear`` ops are ever quantized, and the lm_head / tied embedding is skipped unless a ``layers``
entry names it).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

FORMATS = ("fp8", "nvfp4", "mxfp4")
#: One step down the ladder when a layer misses the accuracy budget.
FALLBACK = {"nvfp4": "fp8", "mxfp4": "fp8", "fp8": "bf16", "bf16": None}
DEFAULT_SKIP = ("*embed*", "lm_head", "lm_head.*", "logits", "*norm*")
#: Targets whose tensor cores take FP4 activations (W4A4 by default there).
FP4_TARGETS = ("b200",)


class QuantConfigError(ValueError):
    """A quantization spec, config file or budget is malformed."""


@dataclasses.dataclass(frozen=True)
class LayerQuant:
    """How one linear layer is quantized."""

    weight: str  # fp8 | nvfp4 | mxfp4 | bf16 | none
    granularity: str = ""  # fp8: tensor | channel | block; fp4: block
    act: str = "none"  # none | fp8 | nvfp4 | mxfp4
    act_granularity: str = "token"  # token (dynamic) | tensor (static, calibrated)

    @property
    def quantized(self) -> bool:
        return self.weight in FORMATS

    @property
    def label(self) -> str:
        """The spec string that parses back to this."""
        if not self.quantized:
            return self.weight
        opts = []
        if self.weight == "fp8" and self.granularity != "channel":
            opts.append(self.granularity)
        if self.act == "none":
            opts.append("wo")
        elif self.weight in ("nvfp4", "mxfp4"):
            opts.append("w4a4")
        if self.act != "none" and self.act_granularity == "tensor" and self.act != "mxfp4":
            opts.append("static")
        elif self.act == "nvfp4" and self.act_granularity == "token":
            opts.append("dynamic")
        return ":".join([self.weight, *opts])

    @property
    def weight_bits(self) -> float:
        """Bits per weight element including scales (for byte counts)."""
        return {"fp8": 8.0, "nvfp4": 4.0 + 8 / 16, "mxfp4": 4.0 + 8 / 32, "bf16": 16.0, "none": 32.0}[self.weight]

    def needs_static_scale(self) -> bool:
        return self.act in ("fp8", "nvfp4") and self.act_granularity == "tensor"


def parse_spec(spec: str, target: str = "cpu") -> LayerQuant:
    """``"nvfp4:w4a4"`` -> ``LayerQuant``; see the module docstring for the grammar."""
    parts = [p.strip().lower() for p in str(spec).split(":") if p.strip()]
    if not parts:
        raise QuantConfigError("empty quantization spec")
    fmt, opts = parts[0], parts[1:]
    if fmt in ("bf16", "none", "f32"):
        if opts:
            raise QuantConfigError(f"{spec!r}: {fmt} takes no options")
        return LayerQuant("none" if fmt == "f32" else fmt)
    if fmt not in FORMATS:
        raise QuantConfigError(f"unknown quantization format {fmt!r} in {spec!r}; known: fp8, nvfp4, mxfp4, bf16, none")
    if fmt == "fp8":
        q = LayerQuant("fp8", "channel", "fp8", "token")
    else:
        w4a4 = target in FP4_TARGETS
        q = LayerQuant(fmt, "block", fmt if w4a4 else "none", "tensor" if fmt == "nvfp4" else "token")
    for o in opts:
        if o in ("tensor", "channel", "block") and fmt == "fp8":
            q = dataclasses.replace(q, granularity=o)
        elif o in ("wo", "w8a16", "w4a16"):
            q = dataclasses.replace(q, act="none")
        elif o in ("w8a8", "w4a4"):
            q = dataclasses.replace(q, act=fmt, act_granularity="tensor" if fmt == "nvfp4" else "token")
        elif o == "static" and fmt != "mxfp4":
            q = dataclasses.replace(q, act=fmt if q.act == "none" else q.act, act_granularity="tensor")
        elif o == "dynamic":
            q = dataclasses.replace(q, act=fmt if q.act == "none" else q.act, act_granularity="token")
        else:
            raise QuantConfigError(f"unknown option {o!r} in {spec!r} for {fmt}")
    return q


def fallback(q: LayerQuant) -> LayerQuant | None:
    """The next, more precise format on the ladder NVFP4/MXFP4 -> FP8 -> BF16; None at the end.

    The activations keep their class: a weight-only layer falls back to weight-only FP8 (quantizing
    its activations on the way would add error, not remove it), a layer with quantized activations
    (W4A4) to W8A8 FP8 with per-token activations."""
    nxt = FALLBACK.get(q.weight)
    if nxt is None:
        return None
    if nxt == "fp8" and q.act == "none":
        return parse_spec("fp8:wo")
    return parse_spec(nxt)


@dataclasses.dataclass(frozen=True)
class Budget:
    """Minimum top-1 agreement and/or maximum mean KL against the unquantized model."""

    top1: float | None = None
    kl: float | None = None

    def met(self, top1: float, kl: float) -> bool:
        return (self.top1 is None or top1 >= self.top1) and (self.kl is None or kl <= self.kl)

    def __str__(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in (("top1", self.top1), ("kl", self.kl)) if v is not None)


def parse_budget(text: str | Mapping[str, float] | Budget | None) -> Budget | None:
    """``"top1=0.95,kl=0.01"`` (either part optional) -> ``Budget``."""
    if text is None or isinstance(text, Budget):
        return text
    items: dict[str, Any]
    if isinstance(text, Mapping):
        items = dict(text)
    else:
        items = {}
        for part in str(text).split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise QuantConfigError(f"accuracy budget {text!r}: expected KEY=VALUE items (top1=0.95,kl=0.01)")
            k, v = part.split("=", 1)
            items[k.strip().lower()] = v.strip()
    unknown = set(items) - {"top1", "kl"}
    if unknown:
        raise QuantConfigError(f"accuracy budget: unknown key(s) {sorted(unknown)}; known: top1, kl")
    try:
        b = Budget(**{k: float(v) for k, v in items.items()})
    except ValueError:
        raise QuantConfigError(f"accuracy budget {text!r}: values must be numbers") from None
    if b.top1 is None and b.kl is None:
        raise QuantConfigError(f"accuracy budget {text!r} sets neither top1 nor kl")
    if b.top1 is not None and not 0.0 <= b.top1 <= 1.0:
        raise QuantConfigError(f"accuracy budget: top1={b.top1:g} must be in [0, 1]")
    if b.kl is not None and b.kl < 0:
        raise QuantConfigError(f"accuracy budget: kl={b.kl:g} must be >= 0")
    return b


@dataclasses.dataclass
class QuantConfig:
    """The whole quantization request: formats per layer, skip-list, KV cache, calibration, budget."""

    default: str = "fp8"
    layers: dict[str, str] = dataclasses.field(default_factory=dict)
    skip: list[str] = dataclasses.field(default_factory=list)
    kv_cache: str | None = None
    calibration: dict[str, Any] = dataclasses.field(default_factory=dict)
    budget: Budget | None = None
    eval_tokens: int | None = None
    target: str = "cpu"
    #: how weights land on the grid: ``nearest`` (round-to-nearest-even) or ``gptq`` (error-compensating,
    #: needs calibration data; options in ``gptq``: damp, block, act_order)
    rounding: str = "nearest"
    gptq: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: SmoothQuant-style activation-outlier migration strength alpha (``ingot.quant.smooth``) for layers
    #: with quantized activations; None: off
    smooth: float | None = None

    def spec_for(self, names: Sequence[str]) -> LayerQuant | None:
        """The spec of the linear known by ``names`` (node name, weight name); None when skipped."""
        for pattern, spec in self.layers.items():
            if any(fnmatch.fnmatchcase(n, pattern) for n in names):
                q = parse_spec(spec, self.target)
                return q if q.weight != "none" else None
        if any(fnmatch.fnmatchcase(n, p) for n in names for p in (*DEFAULT_SKIP, *self.skip)):
            return None
        return parse_spec(self.default, self.target)

    def validate(self) -> None:
        for spec in [self.default, *self.layers.values()]:
            parse_spec(spec, self.target)
        if self.kv_cache is not None:
            parse_kv_spec(self.kv_cache)
        if self.rounding not in ROUNDINGS:
            raise QuantConfigError(f"rounding {self.rounding!r}: expected one of {', '.join(ROUNDINGS)}")
        unknown = set(self.gptq) - {"damp", "block", "act_order"}
        if unknown:
            raise QuantConfigError(f"quantization config: unknown 'gptq' option(s) {sorted(unknown)}; "
                                   "known: act_order, block, damp")
        damp = self.gptq.get("damp", 0.01)
        if not isinstance(damp, (int, float)) or not damp > 0:
            raise QuantConfigError(f"gptq damp must be a positive number, got {damp!r}")
        if self.smooth is not None and (isinstance(self.smooth, bool) or not isinstance(self.smooth, (int, float))
                                        or not 0.0 <= self.smooth <= 1.0):
            raise QuantConfigError(f"smooth (alpha) must be a number in [0, 1] or null, got {self.smooth!r}")
        block = self.gptq.get("block", 128)
        if not isinstance(block, int) or block < 1:
            raise QuantConfigError(f"gptq block must be a positive integer, got {block!r}")


def parse_kv_spec(spec: str) -> str:
    """``fp8`` / ``fp8:head`` -> ``head``; ``fp8:tensor`` -> ``tensor`` (the scale granularity)."""
    parts = [p.strip().lower() for p in spec.split(":")]
    if parts[0] != "fp8" or len(parts) > 2 or (len(parts) == 2 and parts[1] not in ("head", "tensor")):
        raise QuantConfigError(f"kv_cache {spec!r}: expected fp8, fp8:head or fp8:tensor")
    return parts[1] if len(parts) == 2 else "head"


_KEYS = {"default", "layers", "skip", "kv_cache", "calibration", "accuracy_budget", "eval_tokens", "rounding", "gptq",
         "smooth"}
#: ``"smooth": true`` means this alpha
SMOOTH_ALPHA = 0.5
ROUNDINGS = ("nearest", "gptq")


def load_config(source: str | Path | Mapping[str, Any] | None, *, default: str | None = None,
                target: str = "cpu") -> QuantConfig:
    """A ``QuantConfig`` from a JSON/YAML file, a mapping, or nothing (``default`` everywhere)."""
    data: dict[str, Any]
    if source is None:
        data = {}
    elif isinstance(source, Mapping):
        data = dict(source)
    else:
        data = _read_file(Path(source))
    unknown = set(data) - _KEYS
    if unknown:
        raise QuantConfigError(f"quantization config: unknown key(s) {sorted(unknown)}; known: {sorted(_KEYS)}")
    layers = data.get("layers") or {}
    if not isinstance(layers, dict) or not all(isinstance(v, str) for v in layers.values()):
        raise QuantConfigError("quantization config: 'layers' must map glob patterns to format specs")
    skip = data.get("skip") or []
    if not isinstance(skip, list):
        raise QuantConfigError("quantization config: 'skip' must be a list of glob patterns")
    cfg = QuantConfig(
        default=str(data.get("default") or default or "fp8"),
        layers={str(k): v for k, v in layers.items()},
        skip=[str(s) for s in skip],
        kv_cache=data.get("kv_cache"),
        calibration=dict(data.get("calibration") or {}),
        budget=parse_budget(data.get("accuracy_budget")),
        eval_tokens=data.get("eval_tokens"),
        target=target,
        rounding=str(data.get("rounding") or "nearest"),
        gptq=dict(data.get("gptq") or {}),
        smooth=_smooth_alpha(data.get("smooth")),
    )
    if default is not None and "default" not in data:
        cfg.default = default
    cfg.validate()
    return cfg


def _smooth_alpha(value: Any) -> float | None:
    """The config's ``smooth``: an alpha, ``true`` (``SMOOTH_ALPHA``), or ``false`` / null (off)."""
    if value is None or value is False:
        return None
    if value is True:
        return SMOOTH_ALPHA
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise QuantConfigError(f"smooth (alpha) must be a number in [0, 1] or null, got {value!r}") from None
    return value


def with_overrides(source: str | Path | Mapping[str, Any] | None,
                   **overrides: Any) -> str | Path | Mapping[str, Any] | None:
    """``source`` (a config path, a mapping or None) with the non-None ``overrides`` set on top, as a
    mapping; ``source`` itself when there is nothing to override (for command-line options such as
    ``--quant-smooth``)."""
    extra = {k: v for k, v in overrides.items() if v is not None}
    if not extra:
        return source
    if source is None:
        base: dict[str, Any] = {}
    elif isinstance(source, Mapping):
        base = dict(source)
    else:
        base = _read_file(Path(source))
    return {**base, **extra}


def _read_file(path: Path) -> dict[str, Any]:
    """A JSON or YAML config file's top-level mapping."""
    try:
        text = path.read_text()
    except OSError as e:
        raise QuantConfigError(f"quantization config {path}: {e.strerror or e}") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise QuantConfigError(f"{path}: reading YAML needs PyYAML (pip install pyyaml)") from None
        data = yaml.safe_load(text) or {}
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise QuantConfigError(f"quantization config {path}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise QuantConfigError(f"quantization config {path}: expected a mapping at the top level")
    return data
