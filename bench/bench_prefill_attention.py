"""Paged causal prefill attention (``codegen/kernels/attention/prefill_flash.cu`` and the wgmma kernel
``prefill_wgmma.cu``) against torch SDPA, on the H200.

    python bench/bench_prefill_attention.py                  # 1 x 4096 tokens, 32 x 128 heads; 8 x 2048, GQA 32/8 x 64
    python bench/bench_prefill_attention.py --shapes 1x4096x32x32x128 --json out.json
    python bench/bench_prefill_attention.py --wgmma-configs 2x128x2 2x64x3ov 2x128x2ws  # wgs x positions x stages
    python bench/bench_prefill_attention.py --wgmma-configs 2x128x3ws 2x128x3wshf 2x128x3wslm 2x128x3wspp  # + knobs
    python bench/bench_prefill_attention.py --dry-run        # no GPU: compile every ingot kernel a run would launch

One layer's attention for a whole prompt: every sequence has ``L`` new tokens and no cached prefix (its K/V already
written to a paged cache with ingot's block size 16, blocks drawn at random without reuse). Timed as the other
benchmarks: ``--launches`` back-to-back launches in one CUDA graph, median over ``--reps`` replays (CUDA events).
Printed per shape: ingot's tensor-core kernel (4 and 8 warps per CTA), the wgmma kernel in each of
``--wgmma-configs`` (``default``: the rule's; configs the rule declines for a shape are left out), the one-pass
CUDA-core kernel it replaces
for prefill (``paged_attention.cu``, one graph of ``--old-launches``), and torch SDPA with ``is_causal`` on a
contiguous cache [B, heads, L, D] with the cuDNN, flash and memory-efficient backends (``enable_gqa`` where a
backend takes it, else K/V repeated to every query head), all in the same run. TFLOP/s counts causal flops as
half the full square: ``4 * B * L * L * H * D / 2`` (QK^T and PV, 2 flops per multiply-add; no diagonal
correction). ``ingot_vs_best_sdpa`` is the best SDPA time over ingot's best time (>1: ingot is faster), over all of
ingot's kernels (``ingot_best_kernel`` names it); ``wgmma_vs_best_sdpa`` the same for the best wgmma config alone.
Each ingot kernel's output is first checked against SDPA's math in float32 on the same cache (a kernel off by
more than 2e-2 relative is printed and not counted as best).
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
#: wgmma configs benched by default: warpgroups x K/V positions per tile x stages, then flags in any order: ``ov``:
#: softmax overlapping O += P V, ``ws``: a producer warpgroup with mbarriers, ``hf``: the heaviest CTAs first, ``lm``:
#: the mask only on the tiles that need it, ``pp``: ping-pong consumers (needs ``ws`` and 2 warpgroups), ``tm``: K/V
#: by TMA (needs ``ws``), ``vz``: with ``tm``, the V rows past the context zeroed (``default``: the rule's, with
#: ``vz`` where it loads by TMA; the configs ending in ``tm`` are the default without it)
DEFAULT_WGMMA_CONFIGS = ("default", "2x128x2", "2x128x3", "2x64x3", "1x128x2", "2x128x3ov", "2x64x3ov", "2x128x2ws",
                         "2x128x3ws", "2x64x3ws", "2x128x3ovws", "2x64x3ovws",
                         "2x128x3wshf", "2x64x3wshf", "2x128x3wslm", "2x64x3wslm", "2x128x3wspp", "2x64x3wspp",
                         "2x128x3ovwspp", "2x64x3ovwspp", "2x128x3ovwslmpp", "2x128x3wshflm", "2x64x3wshflm",
                         "2x128x3wshflmpp", "2x64x3wshflmpp", "2x128x3ovwshflmpp", "2x64x3ovwshflmpp",
                         "2x128x3wstm", "2x128x3wshflmpptm", "2x128x3ovwshflmpptm", "2x64x3wshflmtm")


def parse_wgmma_config(name: str, head_dim: int, block_size: int | None = None):
    """``WxNxS`` then any of the rule's flags (``2x128x3ovwspp``, ``prefill_wgmma_rule.parse_config``), or
    ``default`` (the rule's config for a cache of ``block_size``, ``INGOT_PREFILL_WGMMA_CONFIG`` included)."""
    from ingot.codegen.kernels.attention.prefill_wgmma_rule import default_config, parse_config

    return default_config(head_dim, block_size) if name == "default" else parse_config(name)


def wgmma_label(cfg) -> str:
    """The bench label of a config: ``wgmma_WxNxS`` and its flags in the rule's order."""
    from ingot.codegen.kernels.attention.prefill_wgmma_rule import config_name

    return f"wgmma_{config_name(cfg)}"


def ingot_kernels(shape: str, block_size: int, wgmma_configs: list[str]) -> list[tuple[str, object]]:
    """(label, spec) of every ingot prefill kernel benched for ``shape`` (BxLxHxKVxD): the flash kernel at 4 and 8
    warps, then the wgmma kernel in each config the rule takes (duplicates after resolving ``default`` dropped)."""
    from ingot.codegen.kernels.attention.prefill_rule import prefill_spec
    from ingot.codegen.kernels.attention.prefill_wgmma_rule import supported, wgmma_spec
    from ingot.codegen.target import get_target
    from ingot.ir.types import DType

    _, _, H, KV, D = (int(x) for x in shape.split("x"))
    bf16, tgt, scale = DType.bf16, get_target("h200"), D ** -0.5
    found = [(f"w{w}", prefill_spec(bf16, bf16, H, KV, D, block_size, scale, tgt, warps=w)) for w in (4, 8)]
    seen = set()
    for name in wgmma_configs:
        cfg = parse_wgmma_config(name, D, block_size)
        if cfg in seen or not supported(bf16, bf16, H, KV, D, block_size, tgt, cfg):
            continue
        seen.add(cfg)
        found.append((wgmma_label(cfg), wgmma_spec(bf16, bf16, H, KV, D, block_size, scale, tgt, cfg=cfg)))
    return found


def causal_flops(B: int, L: int, H: int, D: int) -> float:
    return 4.0 * B * L * L * H * D / 2


def bench_shape(shape: str, a: argparse.Namespace) -> dict:
    import torch
    import torch.nn.functional as F

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
    best, best_label, best_wgmma = None, None, None
    for label, spec in ingot_kernels(shape, bs, a.wgmma_configs):
        kern = SpecKernel(spec)
        out.fill_(float("nan"))
        kern.launch(**args)
        torch.cuda.synchronize()
        err = float((out.float() - ref).abs().max() / ref.abs().max())  # NaN (unwritten outputs) fails the check
        t = time_graph(lambda i, kern=kern: kern.launch(**args), a.launches, a.reps)
        row[f"ingot_{label}_us"] = t * 1e6
        row[f"ingot_{label}_tflops"] = flops / t / 1e12
        row[f"ingot_{label}_rel_err"] = err
        if not err < 2e-2:
            print(f"  ** {shape} {label}: relative error {err:.3e} against SDPA math", flush=True)
            continue
        if best is None or t < best:
            best, best_label = t, label
        if label.startswith("wgmma") and (best_wgmma is None or t < best_wgmma):
            best_wgmma = t
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
    if best_wgmma is not None:
        row["wgmma_best_tflops"] = flops / best_wgmma / 1e12
        if best_sdpa is not None:
            row["wgmma_vs_best_sdpa"] = best_sdpa / best_wgmma
    if best is not None:
        row["ingot_best_kernel"] = best_label
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
    ap.add_argument("--wgmma-configs", nargs="+", default=list(DEFAULT_WGMMA_CONFIGS),
                    help="wgmma configs: WARPGROUPSxBLOCK_NxSTAGES then flags in any order, or 'default' (ov: "
                         "softmax overlapping PV, ws: a producer warpgroup, hf: heaviest CTAs first, lm: mask only "
                         "boundary tiles, pp: ping-pong consumers, needs ws, tm: K/V by TMA, needs ws)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dry-run", action="store_true", help="no GPU: compile the ingot kernels a run would launch")
    a = ap.parse_args(argv)

    if a.dry_run:
        from ingot.codegen.compile import compile_spec

        for shape in a.shapes:
            for label, spec in ingot_kernels(shape, a.block_size, a.wgmma_configs):
                built = compile_spec(spec)
                print(f"{shape} {label}: {spec.entry}, block {spec.block[0]}, smem {spec.smem}, "
                      f"cubin {len(built.cubin)} bytes", flush=True)
        return 0
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
