"""Split-KV decode attention (``decode_split.cu``) and the FP8 cache write (``cache_write_fp8.cu``).

``decode_split.cu`` implements ``paged_attention`` / ``paged_attention_fp8`` for bf16 queries over a bf16 or
e4m3 cache: grid (token, kv head, split), one CTA reads its KV head's blocks once for the whole query-head group,
and the splits of a token are merged by the last of its CTAs in the same launch (see the template's header).
How many splits a token gets is decided in the kernel from its context and the launch's token count, by the
formula ``split_plan`` mirrors here; the module-scope workspace is sized by ``workspace_bytes``.

Two inner loops, one template (``SplitConfig.mma``): a cache whose block size is a multiple of 16 takes the
tensor-core loop (16-position K/V tiles streamed through a per-warp ring of ``stages`` shared-memory stages by
cp.async, QK^T and PV on ``mma.sync``: bf16 for a bf16 cache; f16 for an e4m3 cache, each tile converted exactly to
f16 in shared memory and the query scaled by a power of two into f16's range); other block sizes keep the CUDA-core
loop. The ring is dynamic shared memory (``smem_bytes``); ``MMA_RING_BYTES`` per CTA leaves room for two CTAs per
SM, and the split policy fills the CTAs that fit at once (``resident_ctas``) without a second wave: splits =
floor(resident CTAs / (tokens x KV heads)), at least 1. With ``stages - 1`` tiles in flight per warp one wave keeps
well over the ~32 KB per SM in flight that HBM needs (4.19 TB/s x ~1 us / 132 SMs); on the H200 (batch 32, 4k
context, 256 CTAs of 2 MB) it read 4.0 TB/s, where 2 waves of 1 MB CTAs read 3.6 and the CUDA-core loop 2.8.

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
#: positions per tensor-core tile (the M of S^T = K Q^T, the K of O^T += V^T P^T)
MMA_TILE = 16
#: shared memory for the tensor-core loop's rings, per CTA: stages = this / (warps x one K+V tile), 2 to 8
MMA_RING_BYTES = 108 * 1024
#: shared memory the driver keeps per resident CTA, and a bound on the template's static shared memory
SMEM_RESERVED_PER_CTA = 1024
STATIC_SMEM = 4096


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
    #: the tensor-core loop (block size a multiple of MMA_TILE); else the CUDA-core loop
    mma: bool = False
    #: shared-memory stages of each warp's K/V ring (tensor-core loop)
    stages: int = 0

    @property
    def lanes_per_position(self) -> int:
        return self.head_dim // 8

    @property
    def positions_per_row(self) -> int:
        return 32 // self.lanes_per_position

    @property
    def tile(self) -> int:
        return self.positions_per_row * self.iters

    #: bytes per cached element (2: bf16, 1: e4m3)
    elem_bytes: int = 2

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per CTA: the warps' rings (and f16 tiles); none for the CUDA-core loop."""
        return mma_smem_bytes(self.head_dim, self.stages, self.elem_bytes, self.warps) if self.mma else 0


def mma_stage_bytes(head_dim: int, elem_bytes: int = 2) -> int:
    """One stage of a warp's ring: the K and V rows of a tile as cached, each row padded by 16 bytes."""
    return 2 * MMA_TILE * (elem_bytes * head_dim + 16)


def mma_smem_bytes(head_dim: int, stages: int, elem_bytes: int = 2, warps: int = WARPS) -> int:
    """The tensor-core loop's shared memory: per warp, ``stages`` ring stages plus, for an FP8 cache, the f16 copy
    of one tile (K and V) that the mma reads."""
    conv = mma_stage_bytes(head_dim) if elem_bytes == 1 else 0
    return warps * (stages * mma_stage_bytes(head_dim, elem_bytes) + conv)


def mma_stages(head_dim: int, elem_bytes: int = 2, warps: int = WARPS) -> int:
    """Ring stages per warp for the tensor-core loop: ``MMA_RING_BYTES`` per CTA, 2 to 8."""
    free = MMA_RING_BYTES - mma_smem_bytes(head_dim, 0, elem_bytes, warps)
    return max(2, min(8, free // (warps * mma_stage_bytes(head_dim, elem_bytes))))


def resident_ctas(smem_bytes: int, warps: int = WARPS, smem_per_sm: int = 228 * 1024) -> int:
    """CTAs of the kernel an SM holds at once, as far as shared memory and threads decide (registers stay under
    128 per thread: ``test_decode_attention.py`` checks the compile)."""
    by_smem = smem_per_sm // (smem_bytes + STATIC_SMEM + SMEM_RESERVED_PER_CTA) if smem_bytes else 64
    return max(1, min(by_smem, 2048 // (32 * warps), 8))


def split_config(head_dim: int, num_kv_heads: int, group: int, block_size: int, num_sms: int = 132, *,
                 cache_dtype: DType = DType.bf16, ctas_per_sm: int | None = None, max_splits: int = MAX_SPLITS,
                 min_chunk: int = MIN_CHUNK, stages: int | None = None) -> SplitConfig:
    """The kernel's configuration; the keyword arguments are the split policy (the defaults are the heuristic's,
    ``codegen/autotune.py`` times others). ``ctas_per_sm``: splitting stops at this many CTAs per SM (default: the
    tensor-core loop's resident CTAs, else ``CTAS_PER_SM``); ``stages``: the tensor-core loop's ring depth."""
    if head_dim not in HEAD_DIMS or group > MAX_GROUP:
        raise ValueError(f"split-KV attention: head_dim must be one of {HEAD_DIMS} (got {head_dim}) and the group "
                         f"at most {MAX_GROUP} (got {group})")
    ppw = 32 // (head_dim // 8)
    if block_size % ppw:
        raise ValueError(f"split-KV attention: block_size {block_size} is not a multiple of {ppw} positions")
    iters = 1
    while iters * 2 <= (8 if group <= 4 else 4) and block_size % (ppw * iters * 2) == 0:
        iters *= 2
    mma = block_size % MMA_TILE == 0
    esz = 1 if cache_dtype is DType.f8e4m3fn else 2
    nstages = (stages or mma_stages(head_dim, esz)) if mma else 0
    if ctas_per_sm is None:
        ctas_per_sm = resident_ctas(mma_smem_bytes(head_dim, nstages, esz)) if mma else CTAS_PER_SM
    target = ctas_per_sm * num_sms
    return SplitConfig(head_dim, num_kv_heads, group, block_size, WARPS, max_splits,
                       max(1, min_chunk // block_size), target, -(-target // num_kv_heads), iters, mma, nstages, esz)


def split_plan(cfg: SplitConfig, first: int, qpos: int, num_tokens: int, token: int = 0) -> tuple[int, int]:
    """(splits, cache blocks per split) the kernel uses for a token attending to positions [first, qpos];
    the same integer arithmetic as ``decode_split.cu``."""
    b_first = first // cfg.block_size
    nblk = qpos // cfg.block_size - b_first + 1
    pairs = num_tokens * cfg.num_kv_heads
    room = cfg.target_ctas // pairs if cfg.mma else -(-cfg.target_ctas // pairs)  # MMA: one wave of resident CTAs
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


#: positions of a CTA's range whose K and V rows the kernel asks L2 for before its grid-dependency wait (the
#: template's header, "Before the wait"): the whole range of a short context (the 1B model's batch-1 decode), the
#: pipeline's first tiles of a long one
PREFETCH_ROWS = 64


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
    cfg = config or split_config(head_dim, num_kv_heads, group, block_size, target.num_sms or 132,
                                 cache_dtype=cache_dtype)
    if cfg.mma and block_size % MMA_TILE or cfg.elem_bytes != (1 if cache_dtype is DType.f8e4m3fn else 2):
        raise ValueError(f"config {cfg} does not fit a {cache_dtype.value} cache with blocks of {block_size}")
    values = {"HEAD_DIM": head_dim, "KV_HEADS": num_kv_heads, "GROUP": group, "BLOCK_SIZE": block_size,
              "DT": ctype(dtype), "CT": ctype(cache_dtype), "FP8": cache_dtype is DType.f8e4m3fn,
              "WARPS": cfg.warps, "MAX_SPLITS": cfg.max_splits, "MIN_CHUNK_BLOCKS": cfg.min_chunk_blocks,
              "TARGET_CTAS": cfg.target_ctas, "TOKEN_CAP": cfg.token_cap, "ITERS": cfg.iters,
              "MMA": cfg.mma, "STAGES": max(cfg.stages, 1), "MIN_CTAS": ", 1" if cfg.mma else "",
              "Q_STRIDE": num_heads * head_dim, "SCALE": float(scale), "SOFTCAP": float(softcap),
              "SLIDING_WINDOW": int(sliding_window), "PREFETCH_ROWS": PREFETCH_ROWS,
              "KV_SCALE_PARAM": ", const float* __restrict__ kv_scale" if kv_scale else "",
              "KV_SCALE_PTR": "kv_scale" if kv_scale else "nullptr"}
    tag = f"{dtype.value}_{cache_dtype.value}_{num_heads}x{num_kv_heads}x{head_dim}_b{block_size}"
    loop = f"tensor cores, {cfg.stages}-stage rings" if cfg.mma else "CUDA cores"
    return KernelSpec.make("attention", "decode_split.cu", f"paged_attention_split_{tag}", target.arch or "", values,
                           FP8_ATTEND_PARAMS if kv_scale else ATTEND_PARAMS, cfg.warps * 32,
                           [GridDim("num_tokens"), GridDim(const=num_kv_heads), GridDim(const=cfg.max_splits)],
                           cfg.smem_bytes, doc=f"split-KV decode attention ({loop}), up to {cfg.max_splits} splits, "
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
