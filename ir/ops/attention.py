"""Transformer block ops: scaled dot-product attention, rotary embedding, SwiGLU, linear attention,
causal depthwise convolution with state.

``attention`` is the op that later passes fuse decomposed attention onto and lower to a paged
variant. Layouts: ``q`` is ``(B, Hq, Sq, D)`` or ``(B, Sq, Hq*D)`` (then ``num_heads`` splits it);
``k``/``v`` are ``(B, Hkv, Skv, D)`` or ``(B, Skv, Hkv*D)`` (then ``num_kv_heads``), independently of
``q``. The output has ``q``'s layout. Grouped-query attention: ``Hq`` is a multiple of ``Hkv``; query
head ``h`` reads KV head ``h // (Hq // Hkv)``.

Masking composes: an optional ``mask`` (bool: True attends; otherwise additive, broadcast right-aligned
to ``(B, Hq, Sq, Skv)``, a shorter last dim is padded with "masked"), ``causal``, a sliding window
(``window_left``/``window_right``, -1 unbounded) and per-batch valid key counts ``kv_lengths``
(keys ``j >= kv_lengths[b]`` are masked). Causal and window bounds are relative to the absolute
query position ``offset + i``: ``offset = kv_lengths[b] - Sq`` with ``kv_lengths``, else ``Skv - Sq``
(``align="bottom_right"``, the KV-cache case) or ``0`` (``align="top_left"``), plus ``diagonal``
(as in ``tril``; 0 for every LLM, nonzero only when a step appends more keys than it has queries).
A query row with no
key left attends nothing and gives zeros. The reference computes in float32 (float64 for f64).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, OpError, register, require, same_as
from ..types import UNKNOWN, Dim, DType, Shape, TensorType, dim_mul, dims_compatible
from .linalg import from_compute

_FLOATS = (DType.f32, DType.f16, DType.bf16, DType.f64)


def _ct(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _split_heads_type(t: TensorType, heads: int | None, what: str) -> tuple[Dim, Dim, Dim, Dim]:
    """(B, H, S, D) of a 3-D or 4-D attention operand's type."""
    if t.shape is None:
        return (UNKNOWN,) * 4  # type: ignore[return-value]
    if len(t.shape) == 4:
        b, h, s, d = t.shape
        if heads is not None and isinstance(h, int) and h != heads:
            raise OpError(f"{what} has {h} heads, the attribute says {heads}")
        return b, h, s, d
    if len(t.shape) == 3:
        if heads is None or heads <= 0:
            raise OpError(f"{what} is 3-D {t}: its number of heads must be given")
        b, s, hd = t.shape
        if isinstance(hd, int):
            if hd % heads:
                raise OpError(f"{what} hidden size {hd} is not divisible by {heads} heads")
            return b, heads, s, hd // heads
        return b, heads, s, UNKNOWN
    raise OpError(f"{what} must be 3-D or 4-D, got {t}")


def _to_bhsd(x: np.ndarray, heads: int | None) -> np.ndarray:
    if x.ndim == 4:
        return x
    b, s, hd = x.shape
    assert heads
    return x.reshape(b, s, heads, hd // heads).transpose(0, 2, 1, 3)


@dataclass(frozen=True, eq=False)
class _AttentionBase(Op):
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 5)
    scale: float | None = None
    causal: bool = False
    softcap: float = 0.0
    num_heads: int | None = None
    num_kv_heads: int | None = None
    window_left: int = -1
    window_right: int = -1
    align: str = "bottom_right"
    diagonal: int = 0

    def _check(self, inputs: Sequence[TensorType | None]) -> tuple[TensorType, tuple, tuple, tuple]:
        q, k, v = require(inputs[0], "q"), require(inputs[1], "k"), require(inputs[2], "v")
        mask = inputs[3] if len(inputs) > 3 else None
        lens = inputs[4] if len(inputs) > 4 else None
        if q.dtype not in _FLOATS or k.dtype != q.dtype or v.dtype not in _FLOATS:
            raise OpError(f"attention needs float q/k/v of one dtype, got {q.dtype.value}, "
                          f"{k.dtype.value}, {v.dtype.value}")
        if self.align not in ("bottom_right", "top_left"):
            raise OpError(f"align must be 'bottom_right' or 'top_left', got {self.align!r}")
        qd = _split_heads_type(q, self.num_heads, "q")
        kd = _split_heads_type(k, self.num_kv_heads, "k")
        vd = _split_heads_type(v, self.num_kv_heads, "v")
        if not dims_compatible(qd[3], kd[3]):
            raise OpError(f"q head size {qd[3]} differs from k head size {kd[3]}")
        if not (dims_compatible(kd[1], vd[1]) and dims_compatible(kd[2], vd[2])):
            raise OpError(f"k {k} and v {v} differ in heads or length")
        hq, hk = qd[1], kd[1]
        if isinstance(hq, int) and isinstance(hk, int) and hq % hk:
            raise OpError(f"{hq} query heads are not a multiple of {hk} KV heads")
        if mask is not None and mask.shape is not None and len(mask.shape) > 4:
            raise OpError(f"mask must have rank <= 4, got {mask}")
        if lens is not None and lens.dtype not in (DType.i32, DType.i64):
            raise OpError(f"kv_lengths must be integers, got {lens}")
        return q, qd, kd, vd

    # -- the reference -------------------------------------------------------------------------
    def compute(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                kv_lengths: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(y in BHSD, raw scores, softcapped scores, bias, probabilities) in the compute dtype."""
        ct = _ct(q.dtype)
        q4 = _to_bhsd(q, self.num_heads).astype(ct)
        k4 = _to_bhsd(k, self.num_kv_heads).astype(ct)
        v4 = _to_bhsd(v, self.num_kv_heads).astype(ct)
        b, hq, sq, d = q4.shape
        hk, skv = k4.shape[1], k4.shape[2]
        scale = self.scale if self.scale is not None else 1.0 / np.sqrt(d)
        if hq != hk:
            k4 = np.repeat(k4, hq // hk, axis=1)
            v4 = np.repeat(v4, hq // hk, axis=1)
        scores = np.matmul(q4, k4.transpose(0, 1, 3, 2)) * ct.type(scale)
        capped = scores
        if self.softcap > 0:
            capped = ct.type(self.softcap) * np.tanh(scores / ct.type(self.softcap))
        bias = self.bias(mask, kv_lengths, b, sq, skv, ct)
        with np.errstate(invalid="ignore", over="ignore"):
            logits = capped + bias
            dead = np.isneginf(np.max(np.broadcast_to(bias, logits.shape), axis=-1, keepdims=True))
            mx = np.max(logits, axis=-1, keepdims=True)
            e = np.exp(logits - np.where(np.isfinite(mx), mx, 0))
            s = np.sum(e, axis=-1, keepdims=True)
            p = np.where(dead, ct.type(0), e / np.where(s == 0, 1, s))
        y = np.matmul(p, v4)
        return y, scores, capped, logits, p

    def bias(self, mask: np.ndarray | None, kv_lengths: np.ndarray | None, b: int, sq: int, skv: int,
             ct: np.dtype) -> np.ndarray:
        """The additive bias (0 / -inf / mask values), broadcastable to (B, Hq, Sq, Skv)."""
        neg = ct.type(-np.inf)
        bias = np.zeros((1, 1, sq, skv), ct)
        if mask is not None:
            m = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
            if m.shape[-1] < skv:
                pad = [(0, 0)] * 3 + [(0, skv - m.shape[-1])]
                m = np.pad(m, pad, constant_values=False if m.dtype == np.bool_ else -np.inf)
            m = np.where(m, ct.type(0), neg) if m.dtype == np.bool_ else m.astype(ct)
            bias = bias + m
        i = np.arange(sq).reshape(1, 1, sq, 1)
        j = np.arange(skv).reshape(1, 1, 1, skv)
        if kv_lengths is not None:
            lens = kv_lengths.astype(np.int64).reshape(-1, 1, 1, 1)
            offset = lens - sq
            bias = bias + np.where(j < lens, ct.type(0), neg)
        else:
            offset = np.full((1, 1, 1, 1), skv - sq if self.align == "bottom_right" else 0)
        pos = i + offset + self.diagonal
        allowed = np.ones(np.broadcast_shapes(pos.shape, j.shape), bool)
        if self.causal:
            allowed &= j <= pos
        if self.window_left >= 0:
            allowed &= j >= pos - self.window_left
        if self.window_right >= 0:
            allowed &= j <= pos + self.window_right
        if not allowed.all():
            bias = bias + np.where(allowed, ct.type(0), neg)
        return bias


@register
@dataclass(frozen=True, eq=False)
class Attention(_AttentionBase):
    """``softmax(softcap(scale * q @ k^T) + bias) @ v`` (see the module docstring for layouts and
    masking). Inputs: q, k, v, optional mask, optional kv_lengths (B,)."""

    name: ClassVar[str] = "attention"

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        q, qd, kd, vd = self._check(inputs)
        if q.shape is not None and len(q.shape) == 3:
            return [TensorType(q.dtype, (qd[0], qd[2], dim_mul(qd[1], vd[3])))]
        return [TensorType(q.dtype, (qd[0], qd[1], qd[2], vd[3]))]

    def ref(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
            kv_lengths: np.ndarray | None = None) -> np.ndarray:
        y = self.compute(q, k, v, mask, kv_lengths)[0]
        if q.ndim == 3:
            y = y.transpose(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1)
        return from_compute(y, q.dtype)


@register
@dataclass(frozen=True, eq=False)
class AttentionScores(_AttentionBase):
    """The intermediate scores of ``attention`` with the same attributes, shape (B, Hq, Sq, Skv):
    ``mode`` 0: ``scale * q @ k^T``; 1: after softcap; 2: plus the mask/causal bias; 3: the
    probabilities (zero rows where nothing is attended). Used for ONNX Attention's debug output."""

    name: ClassVar[str] = "attention_scores"
    mode: int = 0

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        q, qd, kd, vd = self._check(inputs)
        if self.mode not in (0, 1, 2, 3):
            raise OpError(f"attention_scores mode must be 0..3, got {self.mode}")
        return [TensorType(q.dtype, (qd[0], qd[1], qd[2], kd[2]))]

    def ref(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
            kv_lengths: np.ndarray | None = None) -> np.ndarray:
        y, scores, capped, logits, p = self.compute(q, k, v, mask, kv_lengths)
        out = (scores, capped, logits, p)[self.mode]
        return from_compute(np.ascontiguousarray(out), q.dtype)


# -- rotary embedding ---------------------------------------------------------------------------


@register
@dataclass(frozen=True, eq=False)
class RotaryEmbedding(Op):
    """RoPE on the first ``rotary_dim`` channels of each head (0: the whole head).

    ``x`` is ``(B, H, S, D)`` or ``(B, S, H*D)`` (``num_heads`` given). ``cos``/``sin`` hold
    ``rotary_dim / 2`` values per position: ``(B, S, R/2)``, or ``(max_pos, R/2)`` indexed by
    ``position_ids`` ``(B, S)``. ``interleaved`` rotates pairs ``(x[2i], x[2i+1])`` instead of halves
    ``(x[i], x[i + R/2])``. Computes in float32.
    """

    name: ClassVar[str] = "rotary_embedding"
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 4)
    interleaved: bool = False
    rotary_dim: int = 0
    num_heads: int | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x = require(inputs[0], "x")
        cos, sin = require(inputs[1], "cos"), require(inputs[2], "sin")
        if x.dtype not in _FLOATS or cos.dtype != x.dtype or sin.dtype != x.dtype:
            raise OpError("rotary_embedding needs float x, cos, sin of one dtype")
        if x.shape is not None and len(x.shape) not in (3, 4):
            raise OpError(f"rotary_embedding needs a 3-D or 4-D input, got {x}")
        if x.shape is not None and len(x.shape) == 3 and not self.num_heads:
            raise OpError("rotary_embedding of a 3-D input needs num_heads")
        if self.rotary_dim % 2:
            raise OpError(f"rotary_dim must be even, got {self.rotary_dim}")
        return [same_as(x)]

    def ref(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray,
            position_ids: np.ndarray | None = None) -> np.ndarray:
        x4 = x.reshape(x.shape[0], x.shape[1], self.num_heads, -1) if x.ndim == 3 else x.transpose(0, 2, 1, 3)
        xf = x4.astype(np.float32)  # (B, S, H, D)
        rd = self.rotary_dim or xf.shape[-1]
        if position_ids is not None:
            cos, sin = cos[position_ids], sin[position_ids]
        c = cos.astype(np.float32)[:, :, None, : rd // 2]
        s = sin.astype(np.float32)[:, :, None, : rd // 2]
        rot = xf[..., :rd]
        if self.interleaved:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
        else:
            x1, x2 = rot[..., : rd // 2], rot[..., rd // 2 :]
        real, imag = c * x1 - s * x2, s * x1 + c * x2
        out = xf.copy()
        if self.interleaved:
            out[..., 0:rd:2], out[..., 1:rd:2] = real, imag
        else:
            out[..., : rd // 2], out[..., rd // 2 : rd] = real, imag
        out = out.reshape(x.shape) if x.ndim == 3 else out.transpose(0, 2, 1, 3)
        return from_compute(out, x.dtype)


@register
@dataclass(frozen=True, eq=False)
class SwiGLU(Op):
    """``a * sigmoid(alpha * a) * b`` (the gate ``a`` and value ``b`` have one shape).

    ``packed``: one input ``x`` [..., 2 * I] holding the gate in its first half and the value in its
    second (a fused gate_up projection's output, ``passes/fuse_split_swiglu.py``); the output is [..., I].
    """

    name: ClassVar[str] = "swiglu"
    num_inputs: ClassVar[tuple[int, int | None]] = (1, 2)
    alpha: float = 1.0
    packed: bool = False

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        if self.packed:
            if len(inputs) != 1:
                raise OpError(f"packed swiglu takes one input (gate and value halves), got {len(inputs)}")
            x = require(inputs[0], "x")
            if x.dtype not in _FLOATS:
                raise OpError(f"swiglu needs a float input, got {x}")
            if x.shape is None:
                return [TensorType(x.dtype, None)]
            last = x.shape[-1] if x.shape else None
            if not isinstance(last, int) or last % 2:
                raise OpError(f"packed swiglu needs an even static last dim, got {x}")
            return [TensorType(x.dtype, (*x.shape[:-1], last // 2))]
        if len(inputs) != 2:
            raise OpError(f"swiglu takes two inputs (gate, value), got {len(inputs)}")
        a, b = require(inputs[0], "a"), require(inputs[1], "b")
        if a.dtype not in _FLOATS or b.dtype != a.dtype:
            raise OpError(f"swiglu needs float inputs of one dtype, got {a}, {b}")
        if a.shape is not None and b.shape is not None:
            same = len(a.shape) == len(b.shape) and all(map(dims_compatible, a.shape, b.shape))
            if not same:
                raise OpError(f"swiglu inputs differ in shape: {a}, {b}")
        return [same_as(a)]

    def ref(self, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        if self.packed:
            half = a.shape[-1] // 2
            a, b = a[..., :half], a[..., half:]
        assert b is not None
        ct = _ct(a.dtype)
        af = a.astype(ct)
        with np.errstate(over="ignore"):
            y = af / (1 + np.exp(-ct.type(self.alpha) * af)) * b.astype(ct)
        return from_compute(y, a.dtype)


# -- recurrent (linear) attention and causal convolution ------------------------------------------


@register
@dataclass(frozen=True, eq=False)
class LinearAttention(Op):
    """Recurrent linear attention over a per-head state ``S`` of shape ``(dk, dv)``.

    Inputs (3-D, ``(B, T, H*D)``): query, key, value, optional past_state ``(B, Hkv, dk, dv)``,
    decay (``(B, T, Hkv)`` or ``(B, T, Hkv*dk)``, log-space), beta (``(B, T, Hkv)`` or ``(B, T, 1)``).
    Per step: ``S *= exp(decay)`` (gated), ``v -= S^T k; v *= beta`` (delta), ``S += k v^T``,
    ``y = scale * q S``. ``update_rule``: linear | gated | delta | gated_delta. Outputs y
    ``(B, T, Hq*dv)`` and the present state. Computes in float32.
    """

    name: ClassVar[str] = "linear_attention"
    num_inputs: ClassVar[tuple[int, int | None]] = (3, 6)
    num_heads: int = 1
    num_kv_heads: int = 1
    update_rule: str = "gated_delta"
    scale: float | None = None

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        q, k, v = require(inputs[0], "query"), require(inputs[1], "key"), require(inputs[2], "value")
        past = inputs[3] if len(inputs) > 3 else None
        if self.update_rule not in ("linear", "gated", "delta", "gated_delta"):
            raise OpError(f"unknown update_rule {self.update_rule!r}")
        if self.num_heads <= 0 or self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise OpError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        qd = _split_heads_type(q, self.num_heads, "query")
        kd = _split_heads_type(k, self.num_kv_heads, "key")
        vd = _split_heads_type(v, self.num_kv_heads, "value")
        if q.shape is not None and len(q.shape) != 3:
            raise OpError("linear_attention needs 3-D inputs")
        y = TensorType(q.dtype, (qd[0], qd[2], dim_mul(self.num_heads, vd[3])))
        sdt = past.dtype if past is not None else q.dtype
        return [y, TensorType(sdt, (qd[0], self.num_kv_heads, kd[3], vd[3]))]

    def ref(self, query: np.ndarray, key: np.ndarray, value: np.ndarray, past_state: np.ndarray | None = None,
            decay: np.ndarray | None = None, beta: np.ndarray | None = None) -> list[np.ndarray]:
        hq, hk = self.num_heads, self.num_kv_heads
        q4, k4, v4 = (_to_bhsd(a, h).astype(np.float32) for a, h in ((query, hq), (key, hk), (value, hk)))
        b, _, t, dk = q4.shape
        dv = v4.shape[-1]
        gated = self.update_rule in ("gated", "gated_delta")
        delta = self.update_rule in ("delta", "gated_delta")
        if gated:
            if decay is None:
                raise OpError(f"update_rule {self.update_rule!r} needs decay")
            g4 = (decay.reshape(b, t, hk, 1).transpose(0, 2, 1, 3) if decay.shape[-1] == hk
                  else _to_bhsd(decay, hk)).astype(np.float32)
        if delta:
            if beta is None:
                raise OpError(f"update_rule {self.update_rule!r} needs beta")
            b4 = beta.reshape(b, t, beta.shape[-1], 1).transpose(0, 2, 1, 3).astype(np.float32)
        state = (np.zeros((b, hk, dk, dv), np.float32) if past_state is None
                 else past_state.astype(np.float32).copy())
        scale = 1.0 / np.sqrt(dk) if not self.scale else self.scale
        out = np.zeros((b, hq, t, dv), np.float32)
        for i in range(t):
            kt, vt = k4[:, :, i], v4[:, :, i]
            if gated:
                state = state * np.exp(g4[:, :, i])[..., None]
            if delta:
                vt = b4[:, :, i] * (vt - np.einsum("bhdm,bhd->bhm", state, kt))
            state = state + kt[..., :, None] * vt[..., None, :]
            sr = state if hq == hk else np.repeat(state, hq // hk, axis=1)
            out[:, :, i] = np.float32(scale) * np.einsum("bhd,bhdm->bhm", q4[:, :, i], sr)
        y = out.transpose(0, 2, 1, 3).reshape(b, t, hq * dv)
        sdt = past_state.dtype if past_state is not None else query.dtype
        return [from_compute(y, query.dtype), from_compute(state, sdt)]


@register
@dataclass(frozen=True, eq=False)
class CausalConvWithState(Op):
    """Depthwise causal 1-D convolution carrying the last ``k-1`` inputs as state.

    Inputs: x ``(B, C, L)``, weight ``(C, 1, k)``, optional bias ``(C,)``, optional past_state
    ``(B, C, k-1)`` (zeros when omitted). ``activation``: none | silu. Outputs y ``(B, C, L)`` and the
    present state ``(B, C, k-1)``.
    """

    name: ClassVar[str] = "causal_conv_with_state"
    num_inputs: ClassVar[tuple[int, int | None]] = (2, 4)
    activation: str = "none"

    def infer(self, inputs: Sequence[TensorType | None]) -> list[TensorType]:
        x, w = require(inputs[0], "x"), require(inputs[1], "weight")
        if self.activation not in ("none", "silu"):
            raise OpError(f"unknown activation {self.activation!r}")
        if x.shape is not None and len(x.shape) != 3 or w.shape is not None and len(w.shape) != 3:
            raise OpError(f"causal_conv_with_state needs 3-D x and weight, got {x}, {w}")
        k: Dim = UNKNOWN if w.shape is None else w.shape[2]
        kk: Dim = k - 1 if isinstance(k, int) else UNKNOWN
        shape: Shape = (UNKNOWN,) * 3 if x.shape is None else x.shape
        return [same_as(x), TensorType(x.dtype, (shape[0], shape[1], kk))]

    def ref(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
            past_state: np.ndarray | None = None) -> list[np.ndarray]:
        b, c, n = x.shape
        k = weight.shape[2]
        pad = np.zeros((b, c, k - 1), x.dtype) if past_state is None else past_state.astype(x.dtype)
        padded = np.concatenate([pad, x], axis=2)
        pf, wf = padded.astype(np.float32), weight.astype(np.float32)[:, 0]
        y = np.zeros((b, c, n), np.float32)
        for j in range(k):
            y += pf[:, :, j : j + n] * wf[None, :, j, None]
        if bias is not None:
            y += bias.astype(np.float32)[None, :, None]
        if self.activation == "silu":
            y = from_compute(y, x.dtype).astype(np.float32)
            y = y / (1 + np.exp(-y))
        return [from_compute(y, x.dtype), padded[:, :, n:].copy()]


__all__ = ["Attention", "AttentionScores", "RotaryEmbedding", "SwiGLU", "LinearAttention",
           "CausalConvWithState"]
