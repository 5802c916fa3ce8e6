"""Paged prefill attention on tensor cores (``prefill_flash.cu``): when it runs, and its launch.

``prefill_flash.cu`` implements ``paged_attention`` (bf16 queries, bf16 cache, head_dim 64 or 128, softcap and
sliding window included) FlashAttention-2 style: a CTA holds 16 x ``WARPS`` query rows, the query-head group of one
KV head side by side (row r = token r / G, head r % G), and streams its sequence's K/V in tiles of 64 positions
through shared memory (see the template's header). Grid ``(ceil(num_tokens / (16 * WARPS / G)), num_kv_heads)``;
dynamic shared memory ``2 * (16 * WARPS + 4 * 64) * head_dim`` bytes.

How it is chosen (``plan_prefill``, called by ``codegen/lower.py`` for the attention launch the family rule picked):
prefill-sized steps run it, decode steps keep the family's kernel (split-KV ``decode_split.cu`` or one-pass
``paged_attention.cu``). The flash kernel becomes the launch's kernel and the family's kernel its variant with
``max_rows = DECODE_MAX_ROWS``: the executor runs the variant when the step's token count (the ``num_tokens``
argument) is at most that. Where the token count is static and at most ``DECODE_MAX_ROWS`` the flash kernel is left
out; FP8 caches (``paged_attention_fp8``), f32/f16 queries and other head dims keep the family's kernel.

Which prefill kernel: ``prefill_kernel()``, the one switch, reads ``INGOT_PREFILL_ATTENTION``: ``wgmma`` (the
default) takes ``prefill_wgmma.cu`` (``prefill_wgmma_rule.py``, Hopper's warpgroup MMA) where it is supported (sm_90a,
the same bf16 head dims) and this kernel elsewhere; ``flash`` takes this kernel everywhere. On the H200 the wgmma
kernel is 1.3-1.5x this one (docs/PERF.md, "The wgmma kernel").
"""

from __future__ import annotations

import os

from ....ir.types import DType
from ...kernel import GridDim, KernelSpec
from ...target import Target
from . import prefill_wgmma_rule
from .split_rule import ATTEND_PARAMS

HEAD_DIMS = (64, 128)
#: positions per K/V tile (fixed in the template)
BLOCK_N = 64
#: warps per CTA (16 query rows each)
WARPS = 4
#: steps with at most this many tokens (decode batches, short chunks) keep the decode kernel: there it reads each
#: context once per token with splits that fill the GPU, while the flash kernel would run one CTA per KV head and
#: range of tokens, decode tokens of a range one after another
DECODE_MAX_ROWS = 256
#: the name of the launch argument that is the step's row count for the variant choice
ROWS_ARG = "num_tokens"
#: the environment variable choosing the prefill kernel, and its values (the first is the default)
KERNEL_ENV = "INGOT_PREFILL_ATTENTION"
KERNELS = ("wgmma", "flash")


def prefill_kernel() -> str:
    """``wgmma`` or ``flash``: the prefill kernel ``INGOT_PREFILL_ATTENTION`` asks for (unset or empty: wgmma)."""
    kernel = os.environ.get(KERNEL_ENV, "") or KERNELS[0]
    if kernel not in KERNELS:
        raise ValueError(f"{KERNEL_ENV}={kernel!r}: expected one of {', '.join(KERNELS)}")
    return kernel


def prefill_supported(dtype: DType, cache_dtype: DType, num_heads: int, num_kv_heads: int, head_dim: int,
                      block_size: int, warps: int = WARPS) -> bool:
    """Whether ``prefill_flash.cu`` takes this attention (bf16 everywhere, at least one whole query-head group per
    CTA; with a group that does not divide the CTA's rows the rows past the last whole group stay idle)."""
    if dtype is not DType.bf16 or cache_dtype is not DType.bf16 or head_dim not in HEAD_DIMS:
        return False
    if num_kv_heads <= 0 or num_heads % num_kv_heads or block_size <= 0:
        return False
    return num_heads // num_kv_heads <= 16 * warps


def tokens_per_cta(num_heads: int, num_kv_heads: int, warps: int = WARPS) -> int:
    return 16 * warps // (num_heads // num_kv_heads)


def smem_bytes(head_dim: int, warps: int = WARPS) -> int:
    """Q rows plus two stages of K and V tiles, bf16."""
    return 2 * (16 * warps + 4 * BLOCK_N) * head_dim


def prefill_spec(dtype: DType, cache_dtype: DType, num_heads: int, num_kv_heads: int, head_dim: int,
                 block_size: int, scale: float, target: Target, softcap: float = 0.0, sliding_window: int = 0,
                 warps: int = WARPS) -> KernelSpec:
    """The attention launch: params ``ATTEND_PARAMS`` (the same as the decode kernels'), grid
    ``(ceil(num_tokens / tokens_per_cta), num_kv_heads)``."""
    if not prefill_supported(dtype, cache_dtype, num_heads, num_kv_heads, head_dim, block_size, warps):
        raise ValueError(f"prefill flash attention does not take {dtype.value}/{cache_dtype.value} "
                         f"{num_heads}x{num_kv_heads}x{head_dim} block {block_size} with {warps} warps")
    group = num_heads // num_kv_heads
    values = {"HEAD_DIM": head_dim, "KV_HEADS": num_kv_heads, "GROUP": group, "BLOCK_SIZE": block_size,
              "WARPS": warps, "Q_STRIDE": num_heads * head_dim, "SCALE": float(scale), "SOFTCAP": float(softcap),
              "SLIDING_WINDOW": int(sliding_window)}
    tag = f"{dtype.value}_{num_heads}x{num_kv_heads}x{head_dim}_b{block_size}_w{warps}"
    tpt = tokens_per_cta(num_heads, num_kv_heads, warps)
    return KernelSpec.make("attention", "prefill_flash.cu", f"paged_attention_prefill_{tag}", target.arch or "",
                           values, ATTEND_PARAMS, warps * 32,
                           [GridDim("num_tokens", tpt), GridDim(const=num_kv_heads)], smem_bytes(head_dim, warps),
                           doc=f"tensor-core prefill attention, {16 * warps} rows ({tpt} tokens) x 64 positions")


def plan_prefill(attend: KernelSpec, num_tokens: int | str, target: Target,
                 kernel: str | None = None) -> KernelSpec | None:
    """The flash kernel to run instead of the family's attention launch ``attend`` for steps of more than
    ``DECODE_MAX_ROWS`` tokens (``attend`` then becomes its variant), or None: ``attend`` is not a bf16
    ``paged_attention.cu`` / ``decode_split.cu`` launch the flash kernel can take, or the token count is static and
    small. ``num_tokens``: the step's token count, an int when static. ``kernel``: ``flash`` or ``wgmma``
    (default: ``prefill_kernel()``); ``wgmma`` gives ``prefill_wgmma.cu`` where ``prefill_wgmma_rule.supported``,
    else the flash kernel."""
    kernel = kernel or prefill_kernel()
    if attend.family != "attention" or attend.template not in ("paged_attention.cu", "decode_split.cu"):
        return None
    if isinstance(num_tokens, int) and num_tokens <= DECODE_MAX_ROWS:
        return None
    v = dict(attend.values)
    if attend.template == "decode_split.cu" and v.get("FP8"):
        return None
    if v.get("DT") != "bf16" or v.get("CT") != "bf16" or not target.is_gpu:
        return None
    d, kv, g, bs = (int(v[k]) for k in ("HEAD_DIM", "KV_HEADS", "GROUP", "BLOCK_SIZE"))
    if int(v["Q_STRIDE"]) != kv * g * d or not prefill_supported(DType.bf16, DType.bf16, kv * g, kv, d, bs):
        return None
    args = (DType.bf16, DType.bf16, kv * g, kv, d, bs, float(v["SCALE"]), target, float(v["SOFTCAP"]),
            int(v["SLIDING_WINDOW"]))
    if kernel == "wgmma" and prefill_wgmma_rule.supported(DType.bf16, DType.bf16, kv * g, kv, d, bs, target):
        return prefill_wgmma_rule.wgmma_spec(*args)
    return prefill_spec(*args)
