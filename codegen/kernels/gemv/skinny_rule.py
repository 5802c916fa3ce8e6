"""The wgmma skinny GEMM (``skinny.cu``, experimental): decode steps of 8-32 tokens on wide bf16 matrices on sm_90a.

``skinny.cu`` streams the weight through shared memory by TMA (a producer warp, ``stages`` stages of ``64 x
warpgroups`` rows by 64 columns) and multiplies on the tensor cores with ``wgmma m64nMBk16`` (weights as A, the
step's tokens as B, x staged once per CTA), persistent over the row tiles. It is what kernel.cu's mma.sync GEMV lacks
on large matrices from 8 tokens on (docs/PERF.md, "Split-K in a cluster": gate_up at 32 tokens 0.77x cuBLAS). Not
yet chosen by any rule or the lowering: ``bench/bench_skinny.py`` times it against cuBLAS and kernel.cu, and
``tests/codegen/test_gemv_skinny_gpu.py`` checks it on a GPU. The loader fills its weight tensor map
(``runtime/kv_tma.fill_w_tma``) before the first launch.
"""

from __future__ import annotations

from ...kernel import GridDim, KernelSpec
from ...target import Target

#: the kernel's parameters (those of a plain GEMV a skinny launch would replace, without the optional vectors)
PARAMS = [("x", "ptr"), ("weight", "ptr"), ("out", "ptr"), ("M", "i64")]
#: token buckets the kernel takes (wgmma's N)
BUCKETS = (8, 16, 32)


def smem_bytes(k: int, mb: int, warpgroups: int = 2, stages: int = 4) -> int:
    """x (mb x k bf16), the weight stages (64 x warpgroups rows x 128 bytes each), their full / empty mbarriers,
    and 1 KB to align the swizzled panels."""
    return 1024 + mb * k * 2 + stages * 64 * warpgroups * 128 + 16 * stages


def max_stages(k: int, mb: int, target: Target, warpgroups: int = 2) -> int:
    """The most weight stages (up to 8) that fit beside x in a CTA's shared memory on ``target``: more bytes in flight
    per SM."""
    return max((s for s in range(2, 9) if smem_bytes(k, mb, warpgroups, s) <= target.smem_per_block), default=0)


def supported(n: int, k: int, mb: int, target: Target, warpgroups: int = 2, stages: int = 4) -> bool:
    """sm_90a, K a multiple of 64, a bucket of 8, 16 or 32 tokens, x and the stages within shared memory."""
    return (target.arch == "sm_90a" and target.wgmma and n > 0 and k > 0 and k % 64 == 0 and mb in BUCKETS
            and warpgroups in (1, 2) and 2 <= stages <= 8
            and smem_bytes(k, mb, warpgroups, stages) <= target.smem_per_block)


def skinny_spec(n: int, k: int, mb: int, target: Target, warpgroups: int = 2, stages: int | None = None) -> KernelSpec:
    """The launch for ``out[M, n] = x[M, k] @ w[n, k]^T`` with ``M <= mb``: one persistent CTA per SM (at most one
    per row tile of ``64 x warpgroups`` rows), ``128 x (warpgroups + 1)`` threads; ``stages`` by default as many as
    fit (``max_stages``)."""
    stages = stages or max_stages(k, mb, target, warpgroups)
    if not supported(n, k, mb, target, warpgroups, stages):
        raise ValueError(f"skinny wgmma GEMM does not take N={n} K={k} for {mb} tokens with {warpgroups} warpgroups "
                         f"and {stages} stages on {target.name} (sm_90a, K % 64 == 0, buckets {BUCKETS}, shared "
                         f"memory {smem_bytes(k, mb, warpgroups, stages)} of {target.smem_per_block} bytes)")
    rows = 64 * warpgroups
    tiles = -(-n // rows)
    values = {"N": n, "K": k, "MB": mb, "WGS": warpgroups, "STAGES": stages, "W_TMA": True}
    return KernelSpec.make("gemv", "skinny.cu", f"skinny_bf16_n{n}_k{k}_m{mb}_wg{warpgroups}_s{stages}",
                           target.arch or "", values, PARAMS, 128 * (warpgroups + 1),
                           [GridDim(const=min(tiles, target.num_sms))], smem=smem_bytes(k, mb, warpgroups, stages),
                           doc=f"skinny wgmma GEMM (experimental), M <= {mb}, {rows}-row tiles by TMA, {stages} "
                               f"stages, persistent")
