"""The KV layout descriptor that travels with every transfer, and the conversions done on receive.

A transfer carries one request's KV for its first ``num_tokens`` tokens, as the sender's cache
blocks, exactly as they sit in the sender's cache (docs/SERVING_FORM.md)::

    data: DT[num_layers, num_blocks, 2, block_size, num_kv_heads, head_dim]   (K at [:, :, 0], V at [:, :, 1])
    num_blocks = ceil(num_tokens / block_size); the tail of the last block is padding

The receiver turns them into its own layout through a token-major form ``[num_layers, 2, num_tokens,
heads, head_dim]``: other block size (re-blocking), other dtype (cast, FP8 with its per-tensor
scales), other TP size (a sender rank holds heads ``[kv_head_start, kv_head_start + num_kv_heads)``
of ``total_kv_heads``; the receiver gathers every rank's part, then keeps its own heads).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

#: dtypes a descriptor may name (numpy names; the FP8 ones come from ml_dtypes)
_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
_IR_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f8e4m3fn": "float8_e4m3fn",
             "f8e5m2": "float8_e5m2"}


class LayoutError(ValueError):
    """A descriptor that is malformed, or that the receiver cannot convert to its layout."""


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype of a descriptor's ``dtype`` (``float32``, ``bfloat16``, ``float8_e4m3fn``, ...)."""
    name = _IR_NAMES.get(name, name)
    if name not in _DTYPES:
        raise LayoutError(f"KV dtype {name!r} is not one of {list(_DTYPES)}")
    if name in ("float32", "float16"):
        return np.dtype(name)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


@dataclass(frozen=True)
class KVLayout:
    """How one rank stores KV: what a receiver needs to read a sender's blocks."""

    block_size: int
    dtype: str  # numpy name: float32, float16, bfloat16, float8_e4m3fn, float8_e5m2
    num_layers: int
    num_kv_heads: int  # per rank
    head_dim: int
    total_kv_heads: int = 0  # 0: num_kv_heads (no TP split)
    kv_head_start: int = 0  # this rank's first head
    tp_rank: int = 0
    tp_size: int = 1
    k_scale: float = 1.0  # FP8 KV: stored = value / scale
    v_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("block_size", "num_layers", "num_kv_heads", "head_dim", "tp_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise LayoutError(f"layout {name} must be a positive integer, got {v!r}")
        object.__setattr__(self, "dtype", _IR_NAMES.get(self.dtype, self.dtype))
        np_dtype(self.dtype)
        if not self.total_kv_heads:
            object.__setattr__(self, "total_kv_heads", self.num_kv_heads)
        if not 0 <= self.kv_head_start <= self.total_kv_heads - self.num_kv_heads:
            raise LayoutError(f"heads [{self.kv_head_start}, {self.kv_head_start + self.num_kv_heads}) are not "
                              f"within the {self.total_kv_heads} KV heads")
        if not 0 <= self.tp_rank < self.tp_size:
            raise LayoutError(f"tp_rank {self.tp_rank} is not in [0, {self.tp_size})")
        for name in ("k_scale", "v_scale"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise LayoutError(f"layout {name} must be a finite number > 0, got {v!r}")

    @classmethod
    def from_spec(cls, spec: dict[str, Any], block_size: int | None = None) -> KVLayout:
        """From an artifact's ``kv_cache`` spec (one rank holding every head)."""
        return cls(block_size=int(block_size or spec["block_size"]), dtype=str(spec["dtype"]),
                   num_layers=int(spec["num_layers"]), num_kv_heads=int(spec["num_kv_heads"]),
                   head_dim=int(spec["head_dim"]))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> KVLayout:
        if not isinstance(d, dict):
            raise LayoutError("the layout must be a JSON object")
        known = set(cls.__dataclass_fields__)
        extra = sorted(set(d) - known)
        if extra:
            raise LayoutError(f"unknown layout fields {extra}")
        try:
            return cls(**d)
        except TypeError as e:
            raise LayoutError(f"bad layout: {e}") from None

    @property
    def np_dtype(self) -> np.dtype:
        return np_dtype(self.dtype)

    def block_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (self.num_layers, num_blocks, 2, self.block_size, self.num_kv_heads, self.head_dim)

    def num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def nbytes(self, num_tokens: int) -> int:
        return math.prod(self.block_shape(self.num_blocks(num_tokens))) * self.np_dtype.itemsize


@dataclass
class KVTransfer:
    """One request's KV from one sender rank: the descriptor fields plus the block data."""

    transfer_id: str
    layout: KVLayout
    token_ids: list[int]  # the tokens whose K/V the blocks hold, in order (len == num_tokens)
    data: np.ndarray  # layout.block_shape(num_blocks), layout.np_dtype
    meta: dict[str, Any] = field(default_factory=dict)  # free-form (request id, sender), JSON

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def descriptor(self) -> dict[str, Any]:
        """The JSON descriptor sent ahead of the raw bytes."""
        return {"transfer_id": self.transfer_id, "layout": self.layout.to_json(), "num_tokens": self.num_tokens,
                "token_ids": list(self.token_ids), "shape": list(self.data.shape), "nbytes": int(self.data.nbytes),
                "meta": self.meta}

    @classmethod
    def from_descriptor(cls, desc: Any, payload: bytes | bytearray | memoryview) -> KVTransfer:
        """Check a received descriptor against its payload and view the bytes as the block array (no copy)."""
        tid, layout, toks, shape, nbytes, meta = parse_descriptor(desc)
        if len(payload) != nbytes:
            raise LayoutError(f"payload of {len(payload)} bytes; the descriptor needs {nbytes}")
        data = np.frombuffer(payload, dtype=layout.np_dtype).reshape(shape)
        return cls(tid, layout, toks, data, meta)


def parse_descriptor(desc: Any) -> tuple[str, KVLayout, list[int], tuple[int, ...], int, dict[str, Any]]:
    """A received descriptor checked field by field: ``(transfer_id, layout, token_ids, shape, nbytes, meta)``.
    Raises ``LayoutError`` naming the first field that is wrong."""
    if not isinstance(desc, dict):
        raise LayoutError("the descriptor must be a JSON object")
    tid, toks = desc.get("transfer_id"), desc.get("token_ids")
    if not isinstance(tid, str) or not tid or len(tid) > 256:
        raise LayoutError("descriptor transfer_id must be a non-empty string")
    if not isinstance(toks, list) or not toks or not all(isinstance(t, int) and t >= 0 for t in toks):
        raise LayoutError("descriptor token_ids must be a non-empty list of token ids")
    layout = KVLayout.from_json(desc.get("layout"))
    if desc.get("num_tokens") != len(toks):
        raise LayoutError(f"descriptor num_tokens {desc.get('num_tokens')} != {len(toks)} token ids")
    shape = layout.block_shape(layout.num_blocks(len(toks)))
    if desc.get("shape") != list(shape):
        raise LayoutError(f"descriptor shape {desc.get('shape')} does not match the layout ({list(shape)})")
    want = layout.nbytes(len(toks))
    if desc.get("nbytes") != want:
        raise LayoutError(f"descriptor nbytes {desc.get('nbytes')}; the layout needs {want}")
    meta = desc.get("meta") or {}
    if not isinstance(meta, dict):
        raise LayoutError("descriptor meta must be a JSON object")
    return tid, layout, list(toks), shape, want, meta


# -- conversions -----------------------------------------------------------------------------------


def blocks_to_tokens(data: np.ndarray, num_tokens: int) -> np.ndarray:
    """``[L, nb, 2, bs, H, D]`` blocks -> ``[L, 2, num_tokens, H, D]`` (a copy)."""
    L, nb, two, bs, H, D = data.shape
    if nb * bs < num_tokens:
        raise LayoutError(f"{nb} blocks of {bs} hold fewer than {num_tokens} tokens")
    return data.transpose(0, 2, 1, 3, 4, 5).reshape(L, two, nb * bs, H, D)[:, :, :num_tokens].copy()


def tokens_to_blocks(tokens: np.ndarray, block_size: int) -> np.ndarray:
    """``[L, 2, n, H, D]`` -> ``[L, ceil(n / bs), 2, bs, H, D]``, the last block zero-padded."""
    L, two, n, H, D = tokens.shape
    nb = -(-n // block_size)
    if nb * block_size != n:
        pad = np.zeros((L, two, nb * block_size - n, H, D), tokens.dtype)
        tokens = np.concatenate([tokens, pad], axis=2)
    return np.ascontiguousarray(tokens.reshape(L, two, nb, block_size, H, D).transpose(0, 2, 1, 3, 4, 5))


def _cast(x: np.ndarray, src: KVLayout, dst: KVLayout) -> np.ndarray:
    """Cast token-major KV ``[L, 2, n, H, D]`` from the sender's dtype and scales to the receiver's."""
    if src.dtype == dst.dtype and src.k_scale == dst.k_scale and src.v_scale == dst.v_scale:
        return x
    f = x.astype(np.float32)
    f[:, 0] *= np.float32(src.k_scale / dst.k_scale)
    f[:, 1] *= np.float32(src.v_scale / dst.v_scale)
    if dst.dtype.startswith("float8"):
        import ml_dtypes

        lim = float(ml_dtypes.finfo(dst.np_dtype).max)
        np.clip(f, -lim, lim, out=f)  # saturate, as an FP8 cache write does
    return f.astype(dst.np_dtype)


def check_compatible(src: KVLayout, dst: KVLayout) -> None:
    """Raise ``LayoutError`` unless KV in ``src`` can become KV in ``dst`` (same model shape)."""
    for name in ("num_layers", "head_dim", "total_kv_heads"):
        if getattr(src, name) != getattr(dst, name):
            raise LayoutError(f"the sender has {name} {getattr(src, name)}, the receiver {getattr(dst, name)}: "
                              "not the same model")


def assemble_tokens(parts: Sequence[KVTransfer], dst: KVLayout) -> np.ndarray:
    """The KV of one request from every sender rank's part, in ``dst``'s dtype and heads: ``[L, 2, n, H_dst, D]``.

    ``parts`` must cover all ``total_kv_heads`` heads (one part per sender rank) and agree on the tokens.
    """
    if not parts:
        raise LayoutError("no KV parts")
    first = parts[0]
    for p in parts:
        check_compatible(p.layout, dst)
        if p.token_ids != first.token_ids:
            raise LayoutError(f"transfer {first.transfer_id}: the parts hold different tokens")
    covered = sorted((p.layout.kv_head_start, p.layout.kv_head_start + p.layout.num_kv_heads) for p in parts)
    pos = 0
    for a, b in covered:
        if a != pos:
            raise LayoutError(f"transfer {first.transfer_id}: KV heads {covered} do not tile "
                              f"[0, {dst.total_kv_heads}) exactly")
        pos = b
    if pos != dst.total_kv_heads:
        raise LayoutError(f"transfer {first.transfer_id}: KV heads {covered} do not cover all {dst.total_kv_heads}")
    n = first.num_tokens
    lo, hi = dst.kv_head_start, dst.kv_head_start + dst.num_kv_heads
    out = np.empty((dst.num_layers, 2, n, dst.num_kv_heads, dst.head_dim), dst.np_dtype)
    for p in sorted(parts, key=lambda q: q.layout.kv_head_start):
        a = p.layout.kv_head_start
        b = a + p.layout.num_kv_heads
        if b <= lo or a >= hi:
            continue  # none of this rank's heads are ours
        tok = blocks_to_tokens(p.data, n)[:, :, :, max(lo, a) - a : min(hi, b) - a]
        out[:, :, :, max(lo, a) - lo : min(hi, b) - lo] = _cast(tok, p.layout, dst)
    return out


def split_heads(layout: KVLayout, tp_size: int) -> list[KVLayout]:
    """The per-rank layouts of ``layout`` (all heads on one rank) sharded over ``tp_size`` ranks."""
    if layout.total_kv_heads % tp_size:
        raise LayoutError(f"{layout.total_kv_heads} KV heads do not split over {tp_size} ranks")
    h = layout.total_kv_heads // tp_size
    d = layout.to_json()
    return [KVLayout(**{**d, "num_kv_heads": h, "kv_head_start": r * h, "tp_rank": r, "tp_size": tp_size})
            for r in range(tp_size)]
