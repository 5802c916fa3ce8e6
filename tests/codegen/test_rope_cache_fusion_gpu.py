"""The fused rope + KV-cache-write kernel (``codegen/kernels/rope/qkv_cache.cu``) on the GPU (``-m gpu``; skipped
without an sm_90a / sm_100a one): q and the cache bit for bit what ``qkv.cu`` followed by the attention family's cache
write (``cache_write.cu``, ``cache_write_fp8.cu`` with saturating K/V scales) give for the same inputs, and the numpy
references (``check_outputs``): bf16, f32 and FP8 caches, head_dim 64 / 80 / 128, GQA, interleaved and partial
rotary, negative slots, steps of 1 to 300 tokens. Fresh random inputs; q poisoned, the cache random before each
launch, so a missed or stray write shows.

    python -m pytest tests/codegen/test_rope_cache_fusion_gpu.py -m gpu -v
"""

from __future__ import annotations

import numpy as np
import pytest

from ingot.codegen.target import get_target
from tests.codegen.test_rope_cache_fusion import CASES, check_outputs, draw, fused_spec, two_launch_specs
from tests.helpers import rng

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tokens", [1, 9, 300])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_kernel_writes_what_the_two_launches_write(gpu, case, tokens):
    tgt = get_target({"sm_90a": "h200", "sm_100a": "b200"}[gpu.arch])
    fused = fused_spec(case, tgt)
    rope, write = two_launch_specs(case, tgt)
    inputs = draw(rng(), case, tokens)
    dt, nq, nkv, d = CASES[case][0], *CASES[case][4:7]
    scaled = CASES[case][3]
    tables = {n: gpu.upload(inputs[n]) for n in ("qkv", "positions", "cos", "sin")}
    slots = gpu.upload(inputs["slot_mapping"])
    scale = gpu.upload(inputs["kv_scale"]) if scaled else None
    q, cache = gpu.alloc((tokens, nq * d), dt.np), gpu.upload(inputs["kv_cache"])  # q poisoned (0xFF: NaN)
    gpu.launch(fused, **tables, q=q, kv_cache=cache, slot_mapping=slots, kv_scale=scale, num_tokens=tokens)
    q2, k2, v2 = (gpu.alloc((tokens, h * d), dt.np) for h in (nq, nkv, nkv))
    gpu.launch(rope, **tables, q=q2, k=k2, v=v2, num_tokens=tokens)
    cache2 = gpu.upload(inputs["kv_cache"])
    gpu.launch(write, k=k2, v=v2, kv_cache=cache2, slot_mapping=slots, num_tokens=tokens,
               **({"kv_scale": scale} if scaled else {}))
    got_q, got_cache = gpu.download(q), gpu.download(cache)
    assert np.array_equal(got_q.view(np.uint8), gpu.download(q2).view(np.uint8)), "q differs from qkv.cu's"
    assert np.array_equal(got_cache.view(np.uint8), gpu.download(cache2).view(np.uint8)), \
        "the cache differs from the cache write's"
    check_outputs(case, inputs, got_q, got_cache, gpu.download(k2), gpu.download(v2))
