"""The serving form of a Llama-family decoder, built directly from a checkpoint's tensors.

Both checkpoint frontends (``hf.py``, ``gguf.py``) read their format into a ``LlamaConfig`` and a
``TensorSource`` that yields tensors under Hugging Face names (``model.layers.0.self_attn.q_proj
.weight``, ...), already in HF layout (rows are output features, rotate-half RoPE order). This
module turns them into the graph docs/SERVING_FORM.md fixes::

    embedding -> per layer:
        rms_norm -> linear(qkv, fused) -> split -> rope(q), rope(k) -> paged_attention
        -> linear(o_proj, residual) -> rms_norm -> linear(gate_up, fused) -> split -> swiglu
        -> linear(down_proj, residual)
    -> gather(logits_indices) -> rms_norm -> linear(lm_head)

Weights stay lazy: a fused weight's loader concatenates its parts only when something (the CPU
executor, the artifact writer) asks for it. Activations and weights are f32 here; narrowing them is
the quantization passes' business.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.graph import Graph, Value, Weight
from ..ir.ops.attention import SwiGLU
from ..ir.ops.indexing import Gather
from ..ir.ops.llm import Embedding, Linear, PagedAttention, Rope
from ..ir.ops.norm import RmsNorm
from ..ir.ops.shape import Split
from ..ir.types import DType, TensorType

#: The KV cache's default block size (tokens per block).
BLOCK_SIZE = 16


class CheckpointError(ValueError):
    """The checkpoint is malformed or of an architecture the frontend does not build."""


@dataclass(frozen=True)
class LlamaConfig:
    """What the builder needs to know about a Llama-family model. Biases need no flag: a bias
    tensor present in the checkpoint is used."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: Mapping[str, Any] | None = None
    partial_rotary_factor: float = 1.0
    tie_word_embeddings: bool = False
    sliding_window: int = 0
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor) // 2 * 2


@dataclass(frozen=True)
class Tensor:
    """A checkpoint tensor not read yet: its shape and a loader returning f32 [rows, cols]."""

    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]
    source: str = ""


#: Tensors by Hugging Face name; a missing optional tensor (a bias) is simply absent.
TensorSource = Mapping[str, Tensor]


def rope_tables(cfg: LlamaConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [max_position_embeddings, rotary_dim / 2] in f32, with any frequency scaling applied.

    Computed as transformers does (f32 inverse frequencies, f32 angle products), so positions map to
    the same angles bit for bit. Supports no scaling (``default``), ``linear``, ``llama3``, ``yarn``
    and ``dynamic`` (which equals ``default`` within the trained context).
    """
    rot = cfg.rotary_dim
    inv = (1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, rot, 2, dtype=np.int64).astype(np.float32) / rot))
           ).astype(np.float32)
    scaling = dict(cfg.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    attention_factor = 1.0
    if kind == "linear":
        inv = (inv / np.float32(scaling["factor"])).astype(np.float32)
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = np.where(medium, smoothed, scaled).astype(np.float32)
    elif kind == "yarn":
        factor = float(scaling["factor"])
        old_ctx = float(scaling.get("original_max_position_embeddings") or cfg.max_position_embeddings / factor)
        beta_fast, beta_slow = float(scaling.get("beta_fast", 32)), float(scaling.get("beta_slow", 1))
        attention_factor = float(scaling.get("attention_factor") or 0.1 * math.log(factor) + 1.0)

        def correction_dim(n_rot: float) -> float:
            return rot * math.log(old_ctx / (n_rot * 2 * math.pi)) / (2 * math.log(cfg.rope_theta))

        lo = max(math.floor(correction_dim(beta_fast)), 0)
        hi = min(math.ceil(correction_dim(beta_slow)), rot - 1)
        ramp = np.clip((np.arange(rot // 2, dtype=np.float32) - lo) / max(hi - lo, 1e-3), 0, 1)
        extrapolation = 1 - ramp
        inv = (inv / factor * (1 - extrapolation) + inv * extrapolation).astype(np.float32)
    elif kind not in ("default", "dynamic"):
        raise CheckpointError(f"rope scaling {kind!r} is not supported (supported: linear, llama3, yarn, dynamic)")
    pos = np.arange(cfg.max_position_embeddings, dtype=np.float32)
    angles = (pos[:, None] * inv[None, :]).astype(np.float32)
    cos = (np.cos(angles) * np.float32(attention_factor)).astype(np.float32)
    sin = (np.sin(angles) * np.float32(attention_factor)).astype(np.float32)
    return cos, sin


def kv_cache_spec(cfg: LlamaConfig, block_size: int = BLOCK_SIZE, dtype: DType = DType.f32) -> dict[str, Any]:
    """The manifest's ``kv_cache`` entry (docs/SERVING_FORM.md)."""
    itemsize = dtype.np.itemsize
    return {
        "num_layers": cfg.num_layers,
        "num_kv_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "dtype": dtype.value,
        "block_size": block_size,
        "bytes_per_token": cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * itemsize,
        "inputs": [f"kv_cache.{i}" for i in range(cfg.num_layers)],
    }


def llm_info(cfg: LlamaConfig) -> dict[str, Any]:
    """The manifest's ``llm`` entry: what the serving runtime needs beyond the graph."""
    return {
        "architecture": cfg.architecture,
        "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_position_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_ids": list(cfg.eos_token_ids),
        "num_layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
    }


def _f32(t: Tensor) -> Callable[[], np.ndarray]:
    return lambda: np.ascontiguousarray(t.load(), dtype=np.float32)


def _fused(parts: list[Tensor]) -> Callable[[], np.ndarray]:
    return lambda: np.concatenate([np.asarray(p.load(), np.float32) for p in parts], axis=0)


class _Builder:
    def __init__(self, cfg: LlamaConfig, tensors: TensorSource, name: str,
                 tables: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.cfg, self.tensors = cfg, tensors
        self.tables = tables
        self.g = Graph(name)

    def tensor(self, name: str) -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(f"the checkpoint has no tensor {name!r}") from None

    def weight(self, name: str, shape: tuple[int, ...], parts: list[str] | None = None) -> Value:
        """A graph weight named ``name`` of ``shape``: one tensor, or ``parts`` stacked by rows."""
        tensors = [self.tensor(p) for p in (parts or [name])]
        rows = sum(t.shape[0] for t in tensors)
        got = (rows, *tensors[0].shape[1:])
        if got != shape or any(t.shape[1:] != shape[1:] for t in tensors):
            where = ", ".join(f"{p} {list(t.shape)}" for p, t in zip(parts or [name], tensors))
            raise CheckpointError(f"{name}: expected shape {list(shape)}, the checkpoint has {where}")
        loader = _fused(tensors) if parts else _f32(tensors[0])
        source = "+".join(t.source or p for p, t in zip(parts or [name], tensors))
        return self.g.add_weight(name, Weight(TensorType(DType.f32, shape), loader, source))

    def optional_bias(self, name: str, size: int, parts: list[str]) -> Value | None:
        present = [p in self.tensors for p in parts]
        if not any(present):
            return None
        if not all(present):
            raise CheckpointError(f"{name}: some of {parts} are missing")
        return self.weight(name, (size,), parts)

    def linear(self, inputs: list[Value | None], name: str, source: str = "") -> Value:
        while inputs[-1] is None:  # no trailing "_" for absent bias
            inputs = inputs[:-1]
        return self.g.add1(Linear(), inputs, name, source)

    def build(self) -> Graph:
        cfg, g = self.cfg, self.g
        H, D, NH, KV, I = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size
        bs = BLOCK_SIZE
        input_ids = g.add_input("input_ids", TensorType(DType.i64, ("T",)))
        positions = g.add_input("positions", TensorType(DType.i64, ("T",)))
        slot_mapping = g.add_input("slot_mapping", TensorType(DType.i64, ("T",)))
        block_tables = g.add_input("block_tables", TensorType(DType.i32, ("S", "max_blocks")))
        seq_lens = g.add_input("seq_lens", TensorType(DType.i32, ("S",)))
        query_start_loc = g.add_input("query_start_loc", TensorType(DType.i32, ("(S+1)",)))
        logits_indices = g.add_input("logits_indices", TensorType(DType.i64, ("S",)))
        caches = [g.add_input(f"kv_cache.{i}", TensorType(DType.f32, ("num_blocks", 2, bs, KV, D)))
                  for i in range(cfg.num_layers)]

        embed = self.weight("model.embed_tokens.weight", (cfg.vocab_size, H))
        cos_np, sin_np = self.tables if self.tables is not None else rope_tables(cfg)
        cos = g.add_weight("rope.cos", Weight.from_array(cos_np, "rope tables"))
        sin = g.add_weight("rope.sin", Weight.from_array(sin_np, "rope tables"))
        x = g.add1(Embedding(), [embed, input_ids], "embed")
        rope = Rope(head_dim=D, rotary_dim=cfg.rotary_dim, interleaved=False)
        attention = PagedAttention(num_heads=NH, num_kv_heads=KV, head_dim=D, scale=1.0 / math.sqrt(D),
                                   sliding_window=cfg.sliding_window)
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            src = f"layers.{i}"
            h = g.add1(RmsNorm(eps=cfg.rms_norm_eps), [x, self.weight(p + "input_layernorm.weight", (H,))],
                       f"{src}.attn_norm", src)
            qkv_parts = [a + "q_proj.", a + "k_proj.", a + "v_proj."]
            wqkv = self.weight(a + "qkv_proj.weight", ((NH + 2 * KV) * D, H), [s + "weight" for s in qkv_parts])
            bqkv = self.optional_bias(a + "qkv_proj.bias", (NH + 2 * KV) * D, [s + "bias" for s in qkv_parts])
            qkv = self.linear([h, wqkv, bqkv], f"{src}.qkv", src)
            q, k, v = g.add(Split(axis=1, num_outputs=3, split=(NH * D, KV * D, KV * D)), [qkv],
                            [f"{src}.q", f"{src}.k", f"{src}.v"], src)
            q = g.add1(rope, [q, positions, cos, sin], f"{src}.q_rot", src)
            k = g.add1(rope, [k, positions, cos, sin], f"{src}.k_rot", src)
            att = g.add1(attention, [q, k, v, caches[i], block_tables, seq_lens, query_start_loc, slot_mapping],
                         f"{src}.attn", src)
            wo = self.weight(a + "o_proj.weight", (H, NH * D))
            bo = self.optional_bias(a + "o_proj.bias", H, [a + "o_proj.bias"])
            x = self.linear([att, wo, bo, x], f"{src}.attn_out", src)
            h = g.add1(RmsNorm(eps=cfg.rms_norm_eps), [x, self.weight(p + "post_attention_layernorm.weight", (H,))],
                       f"{src}.mlp_norm", src)
            gu_parts = [m + "gate_proj.", m + "up_proj."]
            wgu = self.weight(m + "gate_up_proj.weight", (2 * I, H), [s + "weight" for s in gu_parts])
            bgu = self.optional_bias(m + "gate_up_proj.bias", 2 * I, [s + "bias" for s in gu_parts])
            gu = self.linear([h, wgu, bgu], f"{src}.gate_up", src)
            gate, up = g.add(Split(axis=1, num_outputs=2, split=(I, I)), [gu], [f"{src}.gate", f"{src}.up"], src)
            act = g.add1(SwiGLU(), [gate, up], f"{src}.act", src)
            wd = self.weight(m + "down_proj.weight", (H, I))
            bd = self.optional_bias(m + "down_proj.bias", H, [m + "down_proj.bias"])
            x = self.linear([act, wd, bd, x], f"{src}.mlp_out", src)

        last = g.add1(Gather(axis=0), [x, logits_indices], "last_hidden")
        h = g.add1(RmsNorm(eps=cfg.rms_norm_eps), [last, self.weight("model.norm.weight", (H,))], "final_norm")
        if cfg.tie_word_embeddings or "lm_head.weight" not in self.tensors:
            lm_head = embed
        else:
            lm_head = self.weight("lm_head.weight", (cfg.vocab_size, H))
        logits = self.linear([h, lm_head], "logits")
        g.add_output(logits, "logits")
        g.meta["kv_cache"] = kv_cache_spec(cfg)
        g.meta["llm"] = llm_info(cfg)
        return g


def build_llama(cfg: LlamaConfig, tensors: TensorSource, name: str = "main",
                rope_tables: tuple[np.ndarray, np.ndarray] | None = None) -> Graph:
    """The serving-form graph of a Llama-family model (docs/SERVING_FORM.md).

    ``rope_tables``: explicit f32 cos/sin [max_position_embeddings, rotary_dim / 2] (e.g. evaluated
    from an exported graph) instead of computing them from ``cfg``'s rope parameters.
    """
    if rope_tables is not None:
        want = (cfg.max_position_embeddings, cfg.rotary_dim // 2)
        rope_tables = tuple(np.ascontiguousarray(t, np.float32) for t in rope_tables)  # type: ignore[assignment]
        if any(t.shape != want for t in rope_tables):  # type: ignore[union-attr]
            raise CheckpointError(f"rope_tables must be two arrays of shape {list(want)}, got "
                                  f"{[list(t.shape) for t in rope_tables]}")  # type: ignore[union-attr]
    if cfg.num_heads % cfg.num_kv_heads:
        raise CheckpointError(f"num_heads {cfg.num_heads} is not a multiple of num_kv_heads {cfg.num_kv_heads}")
    return _Builder(cfg, tensors, name, rope_tables).build()
