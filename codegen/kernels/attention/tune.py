"""What autotuning (``codegen/autotune.py``) may change in the split-KV decode attention, and what it times it on.

The split policy is compiled into ``decode_split.cu`` (``split_rule.split_config``): splitting stops at
``ctas_per_sm x num_sms`` CTAs, a token gets at most ``MAX_SPLITS`` splits of at least ``MIN_CHUNK`` positions.
CUDA-core loop (8-position blocks): candidates vary each around the heuristic's (4, 16, 256) and two combinations.
Tensor-core loop (bf16 or e4m3 cache): the heuristic aims at the CTAs that fit at once (2 per SM, head_dim <= 128);
candidates halve and double that, change the ring depth by one stage (a deeper ring may fit fewer CTAs: the
target follows), halve the smallest split, double the most splits, or both (more, shorter CTAs for small
batches). Workloads: decode batches of 1, 8 and 32 tokens (those within the artifact's ``S``), every sequence at
the artifact's context (its ``max_blocks`` bound, at most ``MAX_CONTEXT``), blocks in a random order; the KV cache
rotates over copies where it is small, so each launch reads it from HBM. The one-pass kernel
(``paged_attention.cu``) has nothing to tune.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ....ir.types import DType
from ...autotune import Tunable, Workload, random_array
from ...kernel import KernelSpec
from ...target import Target
from .split_rule import CTAS_PER_SM, MAX_SPLITS, MIN_CHUNK, SplitConfig, decode_split_spec, split_config

#: (CTAs per SM, most splits, smallest split in positions) tried besides the heuristic's, CUDA-core loop
POLICIES = ((2, MAX_SPLITS, MIN_CHUNK), (2 * CTAS_PER_SM, MAX_SPLITS, MIN_CHUNK),
            (CTAS_PER_SM, 2 * MAX_SPLITS, MIN_CHUNK), (CTAS_PER_SM, MAX_SPLITS // 2, MIN_CHUNK),
            (CTAS_PER_SM, MAX_SPLITS, MIN_CHUNK // 2), (CTAS_PER_SM, MAX_SPLITS, 2 * MIN_CHUNK),
            (2 * CTAS_PER_SM, 2 * MAX_SPLITS, MIN_CHUNK))
KNOBS = ("TARGET_CTAS", "MAX_SPLITS", "MIN_CHUNK_BLOCKS", "TOKEN_CAP", "STAGES")
BATCHES = (1, 8, 32)
MAX_CONTEXT = 4096
CACHE_TYPES = {"bf16": DType.bf16, "fp8e4m3": DType.f8e4m3fn}


def mma_policies(base: SplitConfig, num_sms: int) -> list[dict[str, int]]:
    """``split_config`` keywords tried besides the heuristic's for the tensor-core loop (``base``)."""
    cps = max(1, base.target_ctas // num_sms)
    return [{"ctas_per_sm": max(1, cps // 2)}, {"ctas_per_sm": 2 * cps}, {"stages": base.stages + 1},
            {"stages": max(2, base.stages - 1)}, {"min_chunk": MIN_CHUNK // 2}, {"max_splits": 2 * MAX_SPLITS},
            {"min_chunk": MIN_CHUNK // 2, "max_splits": 2 * MAX_SPLITS}]


def candidates(spec: KernelSpec, target: Target) -> list[KernelSpec]:
    v = dict(spec.values)
    d, kv, g, bs = int(v["HEAD_DIM"]), int(v["KV_HEADS"]), int(v["GROUP"]), int(v["BLOCK_SIZE"])
    cache, sms = CACHE_TYPES[str(v["CT"])], target.num_sms or 132
    base = split_config(d, kv, g, bs, sms, cache_dtype=cache)
    if base.mma:
        policies = mma_policies(base, sms)
    else:
        policies = [{"ctas_per_sm": cps, "max_splits": ms, "min_chunk": mc} for cps, ms, mc in POLICIES]
    out, keys = [spec], {spec.key}
    for policy in policies:
        cfg = split_config(d, kv, g, bs, sms, cache_dtype=cache, **policy)
        cand = decode_split_spec(DType.bf16, cache, g * kv, kv, d, bs, float(v["SCALE"]), target,
                                 float(v["SOFTCAP"]), int(v["SLIDING_WINDOW"]), kv_scale=bool(v["KV_SCALE_PARAM"]),
                                 config=cfg)
        if cand.key not in keys:
            out.append(cand)
            keys.add(cand.key)
    return out


def workloads(spec: KernelSpec, bounds: Mapping[str, int]) -> list[Workload]:
    v = dict(spec.values)
    d, kv, g, bs = int(v["HEAD_DIM"]), int(v["KV_HEADS"]), int(v["GROUP"]), int(v["BLOCK_SIZE"])
    context = min(int(bounds.get("max_blocks", MAX_CONTEXT // bs)) * bs, MAX_CONTEXT)
    blocks = max(1, -(-context // bs))
    cache_dt = "float8_e4m3fn" if v["FP8"] else "bfloat16"
    out = []
    for b in [b for b in BATCHES if b <= int(bounds.get("S", BATCHES[-1]))] or [1]:
        num_blocks = b * blocks + 1
        bufs: dict[str, tuple[str, tuple[int, ...]]] = {
            "q": ("bfloat16", (b, kv * g * d)), "out": ("bfloat16", (b, kv * g * d)),
            "kv_cache": (cache_dt, (num_blocks, 2, bs, kv, d)), "block_tables": ("int32", (b, blocks)),
            "seq_lens": ("int32", (b,)), "query_start_loc": ("int32", (b + 1,))}
        if v["KV_SCALE_PARAM"]:
            bufs["kv_scale"] = ("float32", (2, kv))

        def fill(rng: np.random.Generator, b=b, bufs=bufs, num_blocks=num_blocks) -> dict[str, np.ndarray]:
            arrays = {n: random_array(dt, shape, rng) for n, (dt, shape) in bufs.items() if dt != "int32"}
            arrays["block_tables"] = rng.permutation(num_blocks)[: b * blocks].astype(np.int32).reshape(b, blocks)
            arrays["seq_lens"] = np.full(b, context, np.int32)
            arrays["query_start_loc"] = np.arange(b + 1, dtype=np.int32)
            if "kv_scale" in arrays:
                arrays["kv_scale"] = np.abs(arrays["kv_scale"]) * 1e-2 + 1e-3
            return arrays

        out.append(Workload(f"batch {b} x context {context}", {"num_tokens": b, "num_seqs": b, "max_blocks": blocks},
                            bufs, fill, ("kv_cache",)))
    return out


TUNABLES = [Tunable("split-kv-attention", lambda s: s.family == "attention" and s.template == "decode_split.cu",
                    candidates, workloads, KNOBS)]
