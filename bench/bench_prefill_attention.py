"""Paged causal prefill attention (``codegen/kernels/attention/prefill_flash.cu``) against torch SDPA, on the H200.

    python bench/bench_prefill_attention.py                  # 1 x 4096 tokens, 32 x 128 heads; 8 x 2048, GQA 32/8 x 64
    python bench/bench_prefill_attention.py --shapes 1x4096x32x32x128 --json out.json

One layer's attention for a whole prompt: every sequence has ``L`` new tokens and no cached prefix (its K/V already
written to a paged cache with ingot's block size 16, blocks drawn at random without reuse). Timed as the other
benchmarks: ``--launches`` back-to-back launches in one CUDA graph, median over ``--reps`` replays (CUDA events).
Printed per shape: ingot's tensor-core kernel (4 and 8 warps per CTA), the one-pass CUDA-core kernel it replaces
for prefill (``paged_attention.cu``, one graph of ``--old-launches``), and torch SDPA with ``is_causal`` on a
contiguous cache [B, heads, L, D] with the cuDNN, flash and memory-efficient backends (``enable_gqa`` where a
backend takes it, else K/V repeated to every query head), all in the same run. TFLOP/s counts causal flops as
half the full square: ``4 * B * L * L * H * D / 2`` (QK^T and PV, 2 flops per multiply-add; no diagonal
correction). ``ingot_vs_best_sdpa`` is the best SDPA time over ingot's best time (>1: ingot is faster). ingot's
output is first checked against SDPA's math in float32 on the same cache.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_decode_attention import sdpa_times  # noqa: E402
from bench_gemv import init_gpu, time_graph  # noqa: E402
from bench_gemv_quant import SpecKernel  # noqa: E402

#: B x L x heads x kv heads x head_dim
DEFAULT_SHAPES = ("1x4096x32x32x128", "8x2048x32x8x64")
BF16_PEAK_TFLOPS = 747.0  # cuBLAS bf16 GEMM 8192^3 on this H200 (../shared/GPU.md)


def causal_flops(B: int, L: int, H: int, D: int) -> float:
    return 4.0 * B * L * L * H * D / 2


def bench_shape(shape: str, a: argparse.Namespace) -> dict:
    import torch
    import torch.nn.functional as F

    from ingot.codegen.kernels.attention.prefill_rule import prefill_spec
    from ingot.codegen.kernels.attention.rule import paged_attention_specs
    from ingot.codegen.target import get_target
    from ingot.ir.types import DType

    B, L, H, KV, D = (int(x) for x in shape.split("x"))
    bs, bf16 = a.block_size, DType.bf16
    tgt = get_target("h200")
    scale = D ** -0.5
    gen = torch.Generator(device="cuda").manual_seed(0)
    nb = -(-L // bs)
    num_blocks = B * nb + 1
    tables = torch.randperm(num_blocks, device="cuda", generator=gen)[: B * nb].reshape(B, nb).to(torch.int32)
    seq_lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
    qsl = (torch.arange(B + 1, device="cuda", dtype=torch.int32) * L).to(torch.int32)
    q = torch.randn(B * L, H * D, device="cuda", generator=gen).to(torch.bfloat16)
    kc = torch.randn(B, KV, L, D, device="cuda", generator=gen).to(torch.bfloat16)  # contiguous, for SDPA
    vc = torch.randn(B, KV, L, D, device="cuda", generator=gen).to(torch.bfloat16)
    cache = torch.zeros(num_blocks, 2, bs, KV, D, device="cuda", dtype=torch.bfloat16)
    pos = torch.arange(L, device="cuda")
    for b in range(B):
        blk = tables[b].long()[pos // bs]
        cache[blk, 0, pos % bs] = kc[b].permute(1, 0, 2)
        cache[blk, 1, pos % bs] = vc[b].permute(1, 0, 2)
    qh = q.reshape(B, L, H, D).permute(0, 2, 1, 3).contiguous()
    ref = F.scaled_dot_product_attention(qh.float(), kc.float(), vc.float(), is_causal=True, scale=scale,
                                         enable_gqa=H != KV)
    ref = ref.permute(0, 2, 1, 3).reshape(B * L, H * D)
    flops = causal_flops(B, L, H, D)
    row: dict = {"bench": "prefill_attention", "batch": B, "tokens": L, "heads": H, "kv_heads": KV, "head_dim": D,
                 "block_size": bs, "causal_gflop": flops / 1e9}
    out = torch.empty(B * L, H * D, device="cuda", dtype=torch.bfloat16)
    args = dict(q=q, kv_cache=cache, block_tables=tables, seq_lens=seq_lens, query_start_loc=qsl, out=out,
                num_tokens=B * L, num_seqs=B, max_blocks=nb)
    best = None
    for warps in (4, 8):
        kern = SpecKernel(prefill_spec(bf16, bf16, H, KV, D, bs, scale, tgt, warps=warps))
        out.fill_(float("nan"))
        kern.launch(**args)
        torch.cuda.synchronize()
        err = float((out.float() - ref).abs().max() / ref.abs().max())
        t = time_graph(lambda i, kern=kern: kern.launch(**args), a.launches, a.reps)
        row[f"ingot_w{warps}_us"] = t * 1e6
        row[f"ingot_w{warps}_tflops"] = flops / t / 1e12
        row[f"ingot_w{warps}_rel_err"] = err
        if not err < 2e-2:
            print(f"  ** {shape} warps {warps}: relative error {err:.3e} against SDPA math", flush=True)
        elif best is None or t < best:
            best = t
    old = SpecKernel(paged_attention_specs(bf16, bf16, H, KV, D, bs, scale, tgt)[1])
    t_old = time_graph(lambda i: old.launch(**args), a.old_launches, a.old_reps)
    row["old_paged_attention_us"] = t_old * 1e6
    row["old_paged_attention_tflops"] = flops / t_old / 1e12
    del ref
    best_sdpa = None
    for name, val in sdpa_times(qh, kc, vc, a.launches, a.reps, causal=True,
                                     backends=("cudnn", "flash", "efficient")).items():
        if isinstance(val, float):
            row[f"sdpa_{name}_us"] = val * 1e6
            row[f"sdpa_{name}_tflops"] = flops / val / 1e12
            best_sdpa = val if best_sdpa is None else min(best_sdpa, val)
        else:
            row[f"sdpa_{name}"] = val
    if best is not None:
        row["ingot_best_tflops"] = flops / best / 1e12
        row["ingot_frac_of_747"] = flops / best / 1e12 / BF16_PEAK_TFLOPS
        row["speedup_vs_old"] = t_old / best
        if best_sdpa is not None:
            row["ingot_vs_best_sdpa"] = best_sdpa / best
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="BxLxHxKVxD")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--launches", type=int, default=10)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--old-launches", type=int, default=1, help="the CUDA-core kernel is slow: fewer launches")
    ap.add_argument("--old-reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    init_gpu()
    rows = []
    for shape in a.shapes:
        rows.append(bench_shape(shape, a))
        print(json.dumps(rows[-1]), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
