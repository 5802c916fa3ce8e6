"""Ops of the LLM serving form: a ragged batch of tokens over a paged KV cache.

The serving form (docs/SERVING_FORM.md) has no batch axis: ``T`` is the number of tokens scheduled
in a step, from ``S`` sequences (prefill chunks and decode tokens mixed). Every per-token op
(embedding, linear, norms, rope with per-token positions, activations) works on ``[T, ...]``;
``paged_attention`` is the only op that sees sequences, through the step's block tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require
from ..types import DType, TensorType, dims_compatible
from .core import cast_array


def _compute(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)


def _back(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return y.astype(dtype) if dtype in (np.float32, np.float64) else cast_array(
        y.astype(np.float32), DType.from_np(dtype)
    )


@register
@dataclass(frozen=True, eq=False)
class Embedding(Op):
    """``table[ids]``: rows of ``table`` [V, H] for integer ``ids`` of any shape -> [*ids, H]."""

    name: ClassVar[str] = "embedding"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 2)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        table, ids = require(inputs[0], "table"), require(inputs[1], "ids")
        if not ids.dtype.is_int:
            raise OpError(f"embedding ids must be integers, got {ids}")
        if table.rank is not None and table.rank != 2:
            raise OpError(f"embedding table must be 2-D, got {table}")
        if ids.shape is None or table.shape is None:
            return [TensorType(table.dtype, None)]
        return [TensorType(table.dtype, (*ids.shape, table.shape[1]))]

    def ref(self, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            raise IndexError(f"token id out of range [0, {table.shape[0]}): {ids.min()}..{ids.max()}")
        return table[ids]


@register
@dataclass(frozen=True, eq=False)
class Linear(Op):
    """``x @ w.T (+ bias) (+ residual)``: x [..., K], w [N, K] (rows are output features).

    The GEMM-epilogue form: bias [N] and a residual [..., N] are optional inputs (``_`` when absent).
    Low-precision inputs are computed in float32 and rounded once at the end.
    """

    name: ClassVar[str] = "linear"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 4)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x, w = require(inputs[0], "x"), require(inputs[1], "weight")
        bias = inputs[2] if len(inputs) > 2 else None
        res = inputs[3] if len(inputs) > 3 else None
        if w.rank is not None and w.rank != 2:
            raise OpError(f"linear weight must be 2-D [N, K], got {w}")
        if not x.dtype.is_float:
            raise OpError(f"linear needs a float input, got {x}")
        if x.shape is None or w.shape is None:
            return [TensorType(x.dtype, None)]
        if not dims_compatible(x.shape[-1], w.shape[1]):
            raise OpError(f"linear: x {x} has K={x.shape[-1]}, weight {w} has K={w.shape[1]}")
        out = TensorType(x.dtype, (*x.shape[:-1], w.shape[0]))
        if bias is not None and bias.shape is not None and (
            len(bias.shape) != 1 or not dims_compatible(bias.shape[0], w.shape[0])
        ):
            raise OpError(f"linear bias must be [{w.shape[0]}], got {bias}")
        if res is not None and res.shape is not None and res.shape != out.shape:
            if len(res.shape) != len(out.shape) or not all(map(dims_compatible, res.shape, out.shape)):
                raise OpError(f"linear residual must be {out}, got {res}")
        return [out]

    def ref(self, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None,
            residual: np.ndarray | None = None) -> np.ndarray:
        y = _compute(x) @ _compute(w).T
        if bias is not None:
            y = y + _compute(bias)
        if residual is not None:
            y = y + _compute(residual)
        return _back(y, x.dtype)


@register
@dataclass(frozen=True, eq=False)
class Rope(Op):
    """Rotary position embedding on ``x`` [T, heads * head_dim] at per-token ``positions`` [T].

    ``cos``/``sin`` [max_positions, rotary_dim / 2] are the tables the model was built with (any
    frequency scaling is already in them). The first ``rotary_dim`` features of every head rotate;
    the rest pass through. ``interleaved`` pairs features (2i, 2i+1); otherwise (rotate-half)
    it pairs (i, i + rotary_dim / 2).
    """

    name: ClassVar[str] = "rope"
    num_inputs: ClassVar[tuple[int, int | None]] = (4, 4)
    head_dim: int = 64
    rotary_dim: int = 64
    interleaved: bool = False

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x, pos = require(inputs[0], "x"), require(inputs[1], "positions")
        cos, sin = require(inputs[2], "cos"), require(inputs[3], "sin")
        if not pos.dtype.is_int:
            raise OpError(f"rope positions must be integers, got {pos}")
        if self.rotary_dim > self.head_dim or self.rotary_dim % 2:
            raise OpError(f"rotary_dim {self.rotary_dim} must be even and <= head_dim {self.head_dim}")
        if x.shape is not None and isinstance(x.shape[-1], int) and x.shape[-1] % self.head_dim:
            raise OpError(f"rope: last dim of {x} is not a multiple of head_dim {self.head_dim}")
        for t in (cos, sin):
            if t.shape is not None and (len(t.shape) != 2 or not dims_compatible(t.shape[1], self.rotary_dim // 2)):
                raise OpError(f"rope cos/sin tables must be [positions, {self.rotary_dim // 2}], got {t}")
        return [TensorType(x.dtype, x.shape)]

    def ref(self, x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        shape = x.shape
        xf = _compute(x).reshape(*shape[:-1], shape[-1] // self.head_dim, self.head_dim)
        c = _compute(cos)[positions][..., None, :]  # [..., 1, R/2]
        s = _compute(sin)[positions][..., None, :]
        r = self.rotary_dim
        rot, rest = xf[..., :r], xf[..., r:]
        if self.interleaved:
            a, b = rot[..., 0::2], rot[..., 1::2]
            out = np.empty_like(rot)
            out[..., 0::2] = a * c - b * s
            out[..., 1::2] = b * c + a * s
        else:
            a, b = rot[..., : r // 2], rot[..., r // 2 :]
            out = np.concatenate([a * c - b * s, b * c + a * s], axis=-1)
        y = np.concatenate([out, rest], axis=-1).reshape(shape)
        return _back(y, x.dtype)


@register
@dataclass(frozen=True, eq=False)
class RopeQKV(Op):
    """``rope`` on the query and key parts of a fused qkv projection's output, in one op.

    ``qkv`` [T, (num_heads + 2 * num_kv_heads) * head_dim] holds q, k, v side by side (that order);
    the outputs are the rotated q [T, num_heads * head_dim], the rotated k and the unchanged v
    [T, num_kv_heads * head_dim]: exactly ``split`` then ``rope(q)``, ``rope(k)`` with the attributes
    of ``rope`` (``passes/fuse_split_rope.py``), computed the same way, so the values are equal.
    """

    name: ClassVar[str] = "rope_qkv"
    num_inputs: ClassVar[tuple[int, int | None]] = (4, 4)
    num_heads: int = 1
    num_kv_heads: int = 1
    head_dim: int = 64
    rotary_dim: int = 64
    interleaved: bool = False

    def rope(self) -> Rope:
        return Rope(head_dim=self.head_dim, rotary_dim=self.rotary_dim, interleaved=self.interleaved)

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        qkv = require(inputs[0], "qkv")
        self.rope().infer(inputs)  # positions, tables, rotary_dim
        width = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        if qkv.shape is not None and (len(qkv.shape) != 2 or not dims_compatible(qkv.shape[1], width)):
            raise OpError(f"rope_qkv: qkv must be [T, {width}] (num_heads {self.num_heads} + 2 * num_kv_heads "
                          f"{self.num_kv_heads} heads of {self.head_dim}), got {qkv}")
        rows = qkv.shape[0] if qkv.shape is not None else "?"
        return [TensorType(qkv.dtype, (rows, n * self.head_dim))
                for n in (self.num_heads, self.num_kv_heads, self.num_kv_heads)]

    def ref(self, qkv: np.ndarray, positions: np.ndarray, cos: np.ndarray,
            sin: np.ndarray) -> list[np.ndarray]:
        nq, nk = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        rope = self.rope()
        q = rope.ref(np.ascontiguousarray(qkv[:, :nq]), positions, cos, sin)
        k = rope.ref(np.ascontiguousarray(qkv[:, nq:nq + nk]), positions, cos, sin)
        return [q, k, np.ascontiguousarray(qkv[:, nq + nk:])]


@register
@dataclass(frozen=True, eq=False)
class PagedAttention(Op):
    """Causal attention of a ragged token batch over a paged KV cache; writes the new K/V first.

    Inputs::

        q               [T, num_heads * head_dim]
        k, v            [T, num_kv_heads * head_dim]   this step's keys/values
        kv_cache        [num_blocks, 2, block_size, num_kv_heads, head_dim]  (K at 0, V at 1)
        block_tables    i32[S, max_blocks]  each sequence's cache blocks, in order
        seq_lens        i32[S]   each sequence's context length including this step's tokens
        query_start_loc i32[S+1] sequence s owns tokens query_start_loc[s] : query_start_loc[s+1]
        slot_mapping    i64[T]   where token t's K/V goes: block * block_size + offset (< 0: skip)

    A sequence's new tokens are the last ``n_s`` of its context, so token j of sequence s sits at
    position ``seq_lens[s] - n_s + j`` and attends to positions ``<=`` its own (causal). Query heads
    map to KV heads in groups (``num_heads / num_kv_heads``). ``softcap > 0`` applies
    ``softcap * tanh(score / softcap)``; ``sliding_window > 0`` limits attention to that many
    positions. The op updates ``kv_cache`` in place (it has side effects).
    """

    name: ClassVar[str] = "paged_attention"
    num_inputs: ClassVar[tuple[int, int | None]] = (8, 8)
    has_side_effects: ClassVar[bool] = True
    num_heads: int = 1
    num_kv_heads: int = 1
    head_dim: int = 64
    scale: float = 0.125
    softcap: float = 0.0
    sliding_window: int = 0

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        q, k, v, cache = (require(inputs[i], n) for i, n in enumerate(("q", "k", "v", "kv_cache")))
        bt, sl, qsl, slots = (require(inputs[i], n) for i, n in
                              zip(range(4, 8), ("block_tables", "seq_lens", "query_start_loc", "slot_mapping")))
        if self.num_heads % self.num_kv_heads:
            raise OpError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        for t, n, w in ((q, "q", self.num_heads), (k, "k", self.num_kv_heads), (v, "v", self.num_kv_heads)):
            if t.shape is not None and (len(t.shape) != 2 or not dims_compatible(t.shape[1], w * self.head_dim)):
                raise OpError(f"paged_attention {n} must be [T, {w * self.head_dim}], got {t}")
        if cache.shape is not None:
            ok = len(cache.shape) == 5 and dims_compatible(cache.shape[1], 2) and dims_compatible(
                cache.shape[3], self.num_kv_heads) and dims_compatible(cache.shape[4], self.head_dim)
            if not ok:
                raise OpError(
                    f"kv_cache must be [blocks, 2, block_size, {self.num_kv_heads}, {self.head_dim}], got {cache}"
                )
        for t, n in ((bt, "block_tables"), (sl, "seq_lens"), (qsl, "query_start_loc"), (slots, "slot_mapping")):
            if not t.dtype.is_int:
                raise OpError(f"paged_attention {n} must be integers, got {t}")
        return [TensorType(q.dtype, q.shape)]

    def ref(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, kv_cache: np.ndarray, block_tables: np.ndarray,
            seq_lens: np.ndarray, query_start_loc: np.ndarray, slot_mapping: np.ndarray) -> np.ndarray:
        H, KV, D = self.num_heads, self.num_kv_heads, self.head_dim
        T = q.shape[0]
        bs = kv_cache.shape[2]
        keep = slot_mapping >= 0
        slots = slot_mapping[keep].astype(np.int64)
        blk, off = slots // bs, slots % bs
        cache_dt = DType.from_np(kv_cache.dtype)
        kv_cache[blk, 0, off] = cast_array(_compute(k.reshape(T, KV, D)[keep]), cache_dt)
        kv_cache[blk, 1, off] = cast_array(_compute(v.reshape(T, KV, D)[keep]), cache_dt)
        out = np.zeros((T, KV, H // KV, D), np.float32)
        qf = _compute(q).reshape(T, KV, H // KV, D)
        for s in range(len(seq_lens)):
            a, b = int(query_start_loc[s]), int(query_start_loc[s + 1])
            n, L = b - a, int(seq_lens[s])
            if n == 0:
                continue
            nb = -(-L // bs)
            blocks = block_tables[s, :nb].astype(np.int64)
            kc = _compute(kv_cache[blocks, 0].reshape(nb * bs, KV, D)[:L])
            vc = _compute(kv_cache[blocks, 1].reshape(nb * bs, KV, D)[:L])
            # batched matmuls (BLAS) rather than einsum, which does not use BLAS for these contractions
            scores = (qf[a:b].transpose(1, 2, 0, 3) @ kc.transpose(1, 2, 0)[:, None]) * np.float32(self.scale)
            if self.softcap > 0:
                scores = self.softcap * np.tanh(scores / self.softcap)
            qpos = L - n + np.arange(n)
            kpos = np.arange(L)
            mask = kpos[None, :] <= qpos[:, None]
            if self.sliding_window > 0:
                mask &= kpos[None, :] > qpos[:, None] - self.sliding_window
            scores = np.where(mask, scores, -np.inf)
            scores = scores - scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            out[a:b] = (p @ vc.transpose(1, 0, 2)[:, None]).transpose(2, 0, 1, 3)
        return _back(out.reshape(T, H * D), q.dtype)
