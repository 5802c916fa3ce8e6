"""Split-KV decode attention (``decode_split.cu``) and the FP8 cache write (``cache_write_fp8.cu``).

``decode_split.cu`` implements ``paged_attention`` / ``paged_attention_fp8`` for bf16 queries over a bf16 or
e4m3 cache: grid (token, kv head, split), one CTA reads its KV head's blocks once for the whole query-head group,
and the splits of a token are merged by the last of its CTAs in the same launch (see the template's header).
How many splits a token gets is decided in the kernel from its context and the launch's token count, by the
formula ``split_plan`` mirrors here; the module-scope workspace is sized by ``workspace_bytes``.

When it is chosen (``use_split``): bf16 queries, head_dim 64, 128 or 256, a query-head group of at most 8, the
cache block a whole number of tiles; and, where the shapes are static (graph mode), unless the batch alone fills
the GPU (``num_tokens * num_kv_heads >= TARGET_CTAS``) or every context is short (``max_blocks * block_size <=
SHORT_CONTEXT``): there the one-pass kernel (``paged_attention.cu``) stays. With symbolic shapes (the serving
form) the split kernel is taken; it degenerates to one split per token for short contexts or large batches.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....ir.types import DType
from ...family import ctype, threads_for
from ...kernel import GridDim, KernelSpec
from ...target import Target

ATTEND_PARAMS = [("q", "ptr"), ("kv_cache", "ptr"), ("block_tables", "ptr"), ("seq_lens", "ptr"),
                 ("query_start_loc", "ptr"), ("out", "ptr"), ("num_tokens", "i32"), ("num_seqs", "i32"),
                 ("max_blocks", "i32")]
FP8_ATTEND_PARAMS = [*ATTEND_PARAMS, ("kv_scale", "ptr")]
FP8_WRITE_PARAMS = [("k", "ptr"), ("v", "ptr"), ("kv_cache", "ptr"), ("slot_mapping", "ptr"), ("kv_scale", "ptr"),
                    ("num_tokens", "i64")]
HEAD_DIMS = (64, 128, 256)
MAX_GROUP = 8
WARPS = 4
MAX_SPLITS = 16
#: a split covers at least this many positions
MIN_CHUNK = 256
#: splitting stops once the grid has this many CTAs per SM
CTAS_PER_SM = 4
#: static contexts up to this long keep the one-pass kernel
SHORT_CONTEXT = 512


@dataclass(frozen=True)
class SplitConfig:
    head_dim: int
    num_kv_heads: int
    group: int
    block_size: int
    warps: int
    max_splits: int
    min_chunk_blocks: int
    target_ctas: int
    token_cap: int
    iters: int

    @property
    def lanes_per_position(self) -> int:
        return self.head_dim // 8

    @property
    def positions_per_row(self) -> int:
        return 32 // self.lanes_per_position

    @property
    def tile(self) -> int:
        return self.positions_per_row * self.iters


def split_config(head_dim: int, num_kv_heads: int, group: int, block_size: int, num_sms: int = 132, *,
                 ctas_per_sm: int = CTAS_PER_SM, max_splits: int = MAX_SPLITS,
                 min_chunk: int = MIN_CHUNK) -> SplitConfig:
    """The kernel's configuration; the keyword arguments are the split policy (the defaults are the heuristic's,
    ``codegen/autotune.py`` times others)."""
    if head_dim not in HEAD_DIMS or group > MAX_GROUP:
        raise ValueError(f"split-KV attention: head_dim must be one of {HEAD_DIMS} (got {head_dim}) and the group "
                         f"at most {MAX_GROUP} (got {group})")
    ppw = 32 // (head_dim // 8)
    if block_size % ppw:
        raise ValueError(f"split-KV attention: block_size {block_size} is not a multiple of {ppw} positions")
    iters = 1
    while iters * 2 <= (8 if group <= 4 else 4) and block_size % (ppw * iters * 2) == 0:
        iters *= 2
    target = ctas_per_sm * num_sms
    return SplitConfig(head_dim, num_kv_heads, group, block_size, WARPS, max_splits,
                       max(1, min_chunk // block_size), target, -(-target // num_kv_heads), iters)


def split_plan(cfg: SplitConfig, first: int, qpos: int, num_tokens: int, token: int = 0) -> tuple[int, int]:
    """(splits, cache blocks per split) the kernel uses for a token attending to positions [first, qpos];
    the same integer arithmetic as ``decode_split.cu``."""
    b_first = first // cfg.block_size
    nblk = qpos // cfg.block_size - b_first + 1
    room = -(-cfg.target_ctas // (num_tokens * cfg.num_kv_heads))
    want = min(-(-nblk // cfg.min_chunk_blocks), room, cfg.max_splits)
    if token >= cfg.token_cap:
        want = 1
    want = max(want, 1)
    per = -(-nblk // want)
    return -(-nblk // per), per


def workspace_bytes(cfg: SplitConfig) -> int:
    """The module-scope partials (acc, max/sum) and counters ``decode_split.cu`` declares."""
    slots = cfg.token_cap * cfg.num_kv_heads * cfg.max_splits * cfg.group
    return 4 * (slots * cfg.head_dim + slots * 2 + cfg.token_cap * cfg.num_kv_heads)


def split_supported(dtype: DType, cache_dtype: DType, num_heads: int, num_kv_heads: int, head_dim: int,
                    block_size: int) -> bool:
    if dtype is not DType.bf16 or cache_dtype not in (DType.bf16, DType.f8e4m3fn) or num_heads % num_kv_heads:
        return False
    try:
        split_config(head_dim, num_kv_heads, num_heads // num_kv_heads, block_size)
    except ValueError:
        return False
    return True


def use_split(dtype: DType, cache_dtype: DType, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
              num_tokens: int | None, max_blocks: int | None, target: Target) -> bool:
    """Whether ``decode_split.cu`` is the attention launch (see the module docstring)."""
    if not split_supported(dtype, cache_dtype, num_heads, num_kv_heads, head_dim, block_size):
        return False
    if num_tokens is not None and num_tokens * num_kv_heads >= CTAS_PER_SM * (target.num_sms or 132):
        return False
    if max_blocks is not None and max_blocks * block_size <= SHORT_CONTEXT:
        return False
    return True


def decode_split_spec(dtype: DType, cache_dtype: DType, num_heads: int, num_kv_heads: int, head_dim: int,
                      block_size: int, scale: float, target: Target, softcap: float = 0.0, sliding_window: int = 0,
                      kv_scale: bool = False, config: SplitConfig | None = None) -> KernelSpec:
    """The attention launch: params ``ATTEND_PARAMS`` (``FP8_ATTEND_PARAMS`` with ``kv_scale``), grid
    (num_tokens, num_kv_heads, max_splits). ``config``: another split policy (``split_config``'s keywords)."""
    if not split_supported(dtype, cache_dtype, num_heads, num_kv_heads, head_dim, block_size):
        raise ValueError(f"split-KV attention does not take {dtype.value}/{cache_dtype.value} "
                         f"{num_heads}x{num_kv_heads}x{head_dim} block {block_size}")
    if kv_scale and cache_dtype is not DType.f8e4m3fn:
        raise ValueError("kv_scale needs an f8e4m3fn cache")
    group = num_heads // num_kv_heads
    cfg = config or split_config(head_dim, num_kv_heads, group, block_size, target.num_sms or 132)
    values = {"HEAD_DIM": head_dim, "KV_HEADS": num_kv_heads, "GROUP": group, "BLOCK_SIZE": block_size,
              "DT": ctype(dtype), "CT": ctype(cache_dtype), "FP8": cache_dtype is DType.f8e4m3fn,
              "WARPS": cfg.warps, "MAX_SPLITS": cfg.max_splits, "MIN_CHUNK_BLOCKS": cfg.min_chunk_blocks,
              "TARGET_CTAS": cfg.target_ctas, "TOKEN_CAP": cfg.token_cap, "ITERS": cfg.iters,
              "Q_STRIDE": num_heads * head_dim, "SCALE": float(scale), "SOFTCAP": float(softcap),
              "SLIDING_WINDOW": int(sliding_window),
              "KV_SCALE_PARAM": ", const float* __restrict__ kv_scale" if kv_scale else "",
              "KV_SCALE_PTR": "kv_scale" if kv_scale else "nullptr"}
    tag = f"{dtype.value}_{cache_dtype.value}_{num_heads}x{num_kv_heads}x{head_dim}_b{block_size}"
    return KernelSpec.make("attention", "decode_split.cu", f"paged_attention_split_{tag}", target.arch or "", values,
                           FP8_ATTEND_PARAMS if kv_scale else ATTEND_PARAMS, cfg.warps * 32,
                           [GridDim("num_tokens"), GridDim(const=num_kv_heads), GridDim(const=cfg.max_splits)],
                           doc=f"split-KV decode attention, up to {cfg.max_splits} splits, "
                               f"workspace {workspace_bytes(cfg)} bytes")


def cache_write_fp8_spec(dtype: DType, num_kv_heads: int, head_dim: int, block_size: int,
                         target: Target) -> KernelSpec:
    """``paged_attention_fp8``'s cache write: params ``FP8_WRITE_PARAMS``, one block per token."""
    width = num_kv_heads * head_dim
    block = threads_for(width, per_thread=2, hi=512)
    values = {"HEAD_DIM": head_dim, "KV_HEADS": num_kv_heads, "BLOCK_SIZE": block_size, "DT": ctype(dtype),
              "K_STRIDE": width, "V_STRIDE": width, "BLOCK": block}
    tag = f"{dtype.value}_{num_kv_heads}x{head_dim}_b{block_size}"
    return KernelSpec.make("attention", "cache_write_fp8.cu", f"kv_cache_write_fp8_{tag}", target.arch or "", values,
                           FP8_WRITE_PARAMS, block, [GridDim("num_tokens")])
