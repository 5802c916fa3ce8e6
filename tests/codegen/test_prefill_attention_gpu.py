"""Tensor-core paged prefill attention (``codegen/kernels/attention/prefill_flash.cu``, and the wgmma kernel
``prefill_wgmma.cu`` on sm_90a) against the numpy reference of ``paged_attention`` on the GPU (``-m gpu``; skipped
without one).

Fresh random caches and queries (the new tokens' K/V written into the cache by the reference, the kernel reads that
cache); block tables drawn as a random permutation (scattered, non-contiguous blocks). Cases: sequences of 1, 17,
300 and 1000 new tokens; chunked prefill after cached prefixes; GQA 32/8 at head_dim 64 and 8/8 at 128; decode
tokens mixed with prefill chunks; softcap with a sliding window and a group (3) that does not divide the CTA's rows;
padding tokens past ``query_start_loc[-1]`` (zeros); 4 and 8 warps; one head and one 64-token sequence (a single
tile per CTA: the first case to read when a layout is wrong). Every case runs the flash kernel and the wgmma kernel,
the latter plain, with the softmax overlapping O += P V (``wgmma-overlap``), with a producer warpgroup and mbarriers
(``wgmma-producer``) and with both (``wgmma-producer-overlap``; these two last, since a broken mbarrier protocol
traps and takes the CUDA context with it): its default config (overlap: 3 stages) where the flash kernel has 4
warps, one consumer warpgroup with 64-position tiles where it has 8 (sm_90a only: skipped elsewhere); then the
opt-in knobs: the heaviest CTAs first (``wgmma-heavy-first``), the mask only on the tiles that need it
(``wgmma-lean-mask``), FlashAttention-3's ping-pong consumers (``wgmma-pingpong``, with overlap
``wgmma-pingpong-overlap``) and all three (``wgmma-all-knobs``). Outputs poisoned with NaN before each launch; every
element compared."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ingot.codegen.kernels.attention.prefill_rule import prefill_spec
from ingot.codegen.kernels.attention.prefill_wgmma_rule import WgmmaConfig, wgmma_spec
from ingot.codegen.target import get_target
from ingot.ir.ops.core import cast_array
from ingot.ir.ops.llm import PagedAttention
from ingot.ir.types import DType
from tests.codegen.test_decode_attention_gpu import paged_step
from tests.helpers import assert_close, rng

pytestmark = pytest.mark.gpu
bf16 = DType.bf16
LENGTHS = [(0, 1), (0, 17), (0, 300), (0, 1000)]

CASES = {
    # name: (heads, kv heads, head_dim, block_size, softcap, window, warps, [(cached, new), ...], padding)
    "lengths-gqa32/8-d64": (32, 8, 64, 16, 0.0, 0, 4, LENGTHS, 0),
    "lengths-mha8/8-d128": (8, 8, 128, 16, 0.0, 0, 4, LENGTHS, 0),
    "lengths-mha8/8-d128-8warps": (8, 8, 128, 16, 0.0, 0, 8, LENGTHS, 0),
    "chunked-prefix-gqa-d128": (32, 8, 128, 16, 0.0, 0, 4, [(700, 300), (4000, 96), (63, 1), (128, 65)], 0),
    "mixed-decode-prefill-d64": (32, 8, 64, 16, 0.0, 0, 4,
                                 [(2000, 1), (0, 257), (31, 1), (500, 1), (900, 130), (0, 1), (1500, 1)], 0),
    "many-decodes-one-range": (32, 8, 64, 32, 0.0, 0, 8, [(int(c), 1) for c in np.arange(40) * 37 + 5] + [(0, 90)],
                               0),
    "softcap-window-group3": (9, 3, 64, 16, 30.0, 200, 4, [(1200, 70), (0, 333), (90, 1)], 0),
    "padding-block32": (16, 4, 128, 32, 0.0, 0, 4, [(100, 150), (0, 40)], 5),
    "one-tile-mha1-d64": (1, 1, 64, 16, 0.0, 0, 4, [(0, 64)], 0),
    "one-tile-mha1-d128": (1, 1, 128, 16, 0.0, 0, 4, [(0, 64)], 0),
    # many K/V tiles per CTA and many CTAs per head (the launch order of heavy_first, the unmasked tiles of
    # lean_mask, long runs of ping-pong turns); a second sequence after a cached prefix
    "long-causal-gqa16/4-d64": (16, 4, 64, 16, 0.0, 0, 4, [(0, 2048), (300, 700)], 0),
    "long-causal-mha8/8-d128": (8, 8, 128, 16, 0.0, 0, 4, [(0, 1500), (1000, 600)], 0),
}
#: the wgmma kernel's config by variant and the case's flash warp count (None: the rule's default)
WGMMA_CONFIGS = {"wgmma": {4: None, 8: WgmmaConfig(1, 64, 3)},
                 "wgmma-overlap": {4: WgmmaConfig(2, 128, 3, True), 8: WgmmaConfig(1, 64, 3, True)},
                 "wgmma-producer": {4: WgmmaConfig(2, 128, 2, producer=True), 8: WgmmaConfig(1, 64, 3, producer=True)},
                 "wgmma-producer-overlap": {4: WgmmaConfig(2, 128, 3, True, True),
                                            8: WgmmaConfig(1, 64, 3, True, True)},
                 # the opt-in knobs (prefill_wgmma_rule.WgmmaConfig), on the configs they would join; ping-pong last
                 # (a broken turn protocol hangs the launch rather than trapping: run these under a timeout)
                 "wgmma-heavy-first": {4: WgmmaConfig(2, 128, 3, producer=True, heavy_first=True),
                                       8: WgmmaConfig(1, 64, 3, heavy_first=True)},
                 "wgmma-lean-mask": {4: WgmmaConfig(2, 128, 3, producer=True, lean_mask=True),
                                     8: WgmmaConfig(1, 64, 3, True, True, lean_mask=True)},
                 # K/V by TMA through the cache's tensor map (runtime/kv_tma.py fills it from the kv_cache buffer)
                 "wgmma-tma": {4: WgmmaConfig(2, 128, 3, producer=True, heavy_first=True, lean_mask=True, tma=True),
                               8: WgmmaConfig(1, 64, 3, producer=True, tma=True)},
                 "wgmma-pingpong": {4: WgmmaConfig(2, 128, 3, producer=True, pingpong=True),
                                    8: WgmmaConfig(2, 64, 3, producer=True, pingpong=True)},
                 "wgmma-pingpong-overlap": {4: WgmmaConfig(2, 128, 3, True, True, pingpong=True),
                                            8: WgmmaConfig(2, 64, 3, True, True, lean_mask=True, pingpong=True)},
                 "wgmma-all-knobs": {4: WgmmaConfig(2, 128, 3, producer=True, heavy_first=True, lean_mask=True,
                                                    pingpong=True),
                                     8: WgmmaConfig(2, 64, 3, producer=True, heavy_first=True, lean_mask=True,
                                                    pingpong=True)},
                 "wgmma-tma-pingpong-overlap": {4: WgmmaConfig(2, 128, 3, True, True, pingpong=True, tma=True),
                                                8: WgmmaConfig(2, 64, 3, True, True, lean_mask=True, pingpong=True,
                                                               tma=True)}}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kernel", ["flash", *WGMMA_CONFIGS])  # kernel by kernel, in this order
def test_prefill_attention_matches_reference(gpu, case, kernel):
    H, KV, D, bs, softcap, window, warps, seqs, padding = CASES[case]
    r = rng()
    tgt = get_target("h200" if gpu.arch == "sm_90a" else "b200")
    if kernel != "flash" and gpu.arch != "sm_90a":
        pytest.skip(f"prefill_wgmma.cu is sm_90a only (this GPU is {gpu.arch})")
    block_tables, seq_lens, qsl, slots, q, k, v, T, num_blocks, max_blocks = paged_step(
        r, seqs, bs, H, KV, D, padding, spare_columns=2, spare_blocks=5)
    cache = cast_array(r.standard_normal((num_blocks, 2, bs, KV, D)).astype(np.float32), bf16)
    scale = float(D ** -0.5)
    op = PagedAttention(num_heads=H, num_kv_heads=KV, head_dim=D, scale=scale, softcap=softcap,
                        sliding_window=window)
    ref = op.ref(q, k, v, cache, block_tables, seq_lens, qsl, slots)  # also writes the new K/V into cache
    if kernel != "flash":
        spec = wgmma_spec(bf16, bf16, H, KV, D, bs, scale, tgt, softcap, window, cfg=WGMMA_CONFIGS[kernel][warps])
    else:
        spec = prefill_spec(bf16, bf16, H, KV, D, bs, scale, tgt, softcap, window, warps=warps)
    print(f"{case} {kernel}: T={T}, grid {spec.grid_dims({'num_tokens': T})}, smem {spec.smem}")
    args = dict(q=gpu.upload(q), kv_cache=gpu.upload(cache), block_tables=gpu.upload(block_tables),
                seq_lens=gpu.upload(seq_lens), query_start_loc=gpu.upload(qsl), num_tokens=T, num_seqs=len(seqs),
                max_blocks=max_blocks)
    for attempt in range(2):
        out = gpu.alloc(q.shape, q.dtype)  # poisoned (NaN)
        gpu.launch(spec, out=out, **args)
        got = gpu.download(out)
        where_wrong(got, ref, H, D)
        assert np.isfinite(got.astype(np.float32)).all(), f"launch {attempt}: unwritten or non-finite outputs"
        assert_close(got, ref, what=f"attention out, launch {attempt}")


TMA_TWINS = {"default-d64": WgmmaConfig(2, 128, 3, producer=True, heavy_first=True, lean_mask=True),
             "default-d128": WgmmaConfig(2, 128, 3, producer=True, heavy_first=True, lean_mask=True, pingpong=True),
             "one-consumer": WgmmaConfig(1, 64, 3, producer=True),
             "pingpong-overlap": WgmmaConfig(2, 128, 3, True, True, lean_mask=True, pingpong=True)}
# the V rows past each context zeroed (v_zero): their second cache holds NaN past every context and in every block no
# sequence uses, which the plain TMA configs would turn into NaN outputs
TMA_TWINS.update({f"vz-{name}": replace(TMA_TWINS[name], v_zero=True)
                  for name in ("default-d64", "default-d128", "one-consumer", "pingpong-overlap")})


@pytest.mark.parametrize("case", ["chunked-prefix-gqa-d128", "softcap-window-group3", "padding-block32",
                                  "long-causal-gqa16/4-d64"])
@pytest.mark.parametrize("twin", sorted(TMA_TWINS))
def test_tma_loads_match_cp_async_bit_for_bit(gpu, case, twin):
    """K/V by TMA (whole cache blocks, the context's last one past its end too) against the same config loading by
    cp.async (zeros past the context): the same bits, on a cache of finite values. A second launch over another
    cache buffer (the tensor map filled again) as well; for the ``vz-`` twins (the V rows past the context zeroed)
    that second cache holds NaN past every context and in the blocks no sequence uses."""
    if gpu.arch != "sm_90a":
        pytest.skip(f"prefill_wgmma.cu is sm_90a only (this GPU is {gpu.arch})")
    H, KV, D, bs, softcap, window, _, seqs, padding = CASES[case]
    r = rng()
    tgt = get_target("h200")
    block_tables, seq_lens, qsl, slots, q, k, v, T, num_blocks, max_blocks = paged_step(
        r, seqs, bs, H, KV, D, padding, spare_columns=2, spare_blocks=5)
    scale = float(D ** -0.5)
    cfg = TMA_TWINS[twin]
    specs = [wgmma_spec(bf16, bf16, H, KV, D, bs, scale, tgt, softcap, window,
                        cfg=replace(cfg, tma=t, v_zero=t and cfg.v_zero)) for t in (False, True)]
    outs = []
    for attempt in range(2):
        values = r.standard_normal((num_blocks, 2, bs, KV, D)).astype(np.float32)
        if attempt and cfg.v_zero:  # what a request whose K/V overflowed may leave for the blocks' next owners
            used = set()
            for s, (cached, new) in enumerate(seqs):
                n = cached + new
                used |= {int(b) for b in block_tables[s, :-(-n // bs)]}
                if n % bs:
                    values[block_tables[s, (n - 1) // bs], :, n % bs:] = np.nan
            values[[b for b in range(num_blocks) if b not in used]] = np.nan
        cache = cast_array(values, bf16)
        args = dict(q=gpu.upload(q), kv_cache=gpu.upload(cache), block_tables=gpu.upload(block_tables),
                    seq_lens=gpu.upload(seq_lens), query_start_loc=gpu.upload(qsl), num_tokens=T,
                    num_seqs=len(seqs), max_blocks=max_blocks)
        got = []
        for spec in specs:
            out = gpu.alloc(q.shape, q.dtype)  # poisoned (NaN)
            gpu.launch(spec, out=out, **args)
            got.append(gpu.download(out))
        assert np.isfinite(got[1].astype(np.float32)).all(), "unwritten or non-finite outputs"
        np.testing.assert_array_equal(got[1].view(np.uint16), got[0].view(np.uint16),
                                      err_msg=f"{case} {twin}: TMA vs cp.async, cache {attempt}")
        outs.append(got[1])
    assert not np.array_equal(outs[0], outs[1]), "the second cache gave the first one's outputs"


def where_wrong(got: np.ndarray, ref: np.ndarray, H: int, D: int) -> None:
    """Print where outputs are off (non-finite, or off by more than 0.05 + 0.05 |ref|), by 64-wide head_dim panel,
    query head and token: a wrong descriptor or fragment layout shows as a whole panel, half the heads or every
    token wrong, a masking bug as some tokens only. Prints nothing when all are close; the assertion is the
    caller's."""
    g = got.astype(np.float32).reshape(-1, H, D)
    r = ref.astype(np.float32).reshape(-1, H, D)
    bad = ~np.isfinite(g) | (np.abs(g - r) > 0.05 + 0.05 * np.abs(r))
    if not bad.any():
        return
    panels = [f"d[{p * 64}:{p * 64 + 64}] {bad[:, :, p * 64:(p + 1) * 64].mean():.2f}" for p in range(D // 64)]
    tokens = np.flatnonzero(bad.any(axis=(1, 2)))
    print(f"  wrong: {bad.mean():.3f} of outputs; by panel {', '.join(panels)}; heads "
          f"{np.flatnonzero(bad.any(axis=(0, 2))).tolist()}; {tokens.size} of {g.shape[0]} tokens, first "
          f"{tokens[:12].tolist()}")
