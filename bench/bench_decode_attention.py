"""Split-KV paged decode attention (``codegen/kernels/attention/decode_split.cu``) against torch SDPA, on the H200.

    python bench/bench_decode_attention.py                 # batch 32, 4k context, GQA 32/8, head_dim 128
    python bench/bench_decode_attention.py --json out.json

One decode step of one layer: each of ``--batch`` sequences has ``--context`` cached positions (its new token's
K/V already written) in a paged cache with ingot's block size (16), blocks drawn at random without reuse. Timed
as the GEMV benchmarks: ``--launches`` back-to-back launches in one CUDA graph, median over ``--reps`` replays
(the cache, 537 MB in bf16, is >10x the L2). Printed per cache type (bf16, fp8 e4m3 with per-head kv_scale):
time, TB/s of KV bytes read (K and V of every cached position, codes only), the fraction of 4.19 TB/s, and torch
SDPA on a contiguous bf16 cache [batch, kv_heads, context, head_dim] (``enable_gqa``) with the cuDNN and the flash
backends, measured in the same run the same way. The kernel's output is first checked against SDPA's math on the
same (dequantized) cache.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_gemv import COPY_TBPS, init_gpu, time_graph  # noqa: E402
from bench_gemv_quant import SpecKernel  # noqa: E402


def sdpa_times(q, k, v, launches: int, reps: int, causal: bool = False,
               backends: tuple[str, ...] = ("cudnn", "flash")) -> dict[str, float | str]:
    """q [B, H, Lq, D], k/v [B, KV, L, D]: seconds per SDPA call for each of ``backends`` (``cudnn``, ``flash``,
    ``efficient``), with GQA through ``enable_gqa`` where the backend takes it, else K/V repeated to every query head
    (reads G x the bytes; TB/s still counts the KV heads' bytes); a backend that refuses both says why.
    ``bench/bench_prefill_attention.py`` times its causal references here too."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    by_name = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}
    out: dict[str, float | str] = {}
    g = q.shape[1] // k.shape[1]
    for name in backends:
        backend = by_name[name]
        for mode in ("gqa", "expanded"):
            try:
                if mode == "gqa":
                    kk, vv, kw = k, v, ({"enable_gqa": True} if g > 1 else {})
                elif g == 1:
                    break
                else:
                    kk, vv, kw = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), {}

                def run(i: int, kk=kk, vv=vv, kw=kw, backend=backend) -> None:
                    with sdpa_kernel([backend]):
                        F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, **kw)

                out[name] = time_graph(run, launches, reps)
                out[f"{name}_mode"] = mode
                break
            except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is reported, not fatal
                out[f"{name}_error_{mode}"] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--launches", type=int, default=10)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--caches", default="bf16,fp8", help="comma-separated: bf16, fp8")
    ap.add_argument("--candidates", action="store_true",
                    help="also time every autotuning candidate (codegen/kernels/attention/tune.py) of each kernel")
    a = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from ingot.codegen.kernels.attention.split_rule import decode_split_spec, split_config, split_plan
    from ingot.codegen.target import get_target
    from ingot.ir.types import DType

    init_gpu()
    tgt = get_target("h200")
    B, L, H, KV, D, bs = a.batch, a.context, a.heads, a.kv_heads, a.head_dim, a.block_size
    scale = D ** -0.5
    gen = torch.Generator(device="cuda").manual_seed(0)
    nb = -(-L // bs)
    num_blocks = B * nb + 1
    tables = torch.randperm(num_blocks, device="cuda", generator=gen)[: B * nb].reshape(B, nb).to(torch.int32)
    seq_lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
    qsl = torch.arange(B + 1, device="cuda", dtype=torch.int32)
    q = torch.randn(B, H * D, device="cuda", generator=gen).to(torch.bfloat16)
    rows = []
    for cache_name, cdt in (("bf16", DType.bf16), ("fp8", DType.f8e4m3fn)):
        if cache_name not in a.caches.split(","):
            continue
        base = torch.randn(num_blocks, 2, bs, KV, D, device="cuda", generator=gen)
        if cdt is DType.bf16:
            cache, kv_scale = base.to(torch.bfloat16), None
            deq = cache.float()
        else:
            kv_scale = (torch.rand(2, KV, device="cuda", generator=gen) + 0.5) * (4.0 / 448.0)
            codes = (base * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
            cache = codes
            deq = codes.float() * kv_scale.reshape(1, 2, 1, KV, 1)
        spec = decode_split_spec(DType.bf16, cdt, H, KV, D, bs, scale, tgt, kv_scale=kv_scale is not None)
        kern = SpecKernel(spec)
        out = torch.empty(B, H * D, device="cuda", dtype=torch.bfloat16)
        args = dict(q=q, kv_cache=cache, block_tables=tables, seq_lens=seq_lens, query_start_loc=qsl, out=out,
                    num_tokens=B, num_seqs=B, max_blocks=nb)
        nsplit, per = split_plan(split_config(D, KV, H // KV, bs, tgt.num_sms, cache_dtype=cdt), 0, L - 1, B)
        if kv_scale is not None:
            args["kv_scale"] = kv_scale
        # contiguous [B, KV, L, D] views of the same cache for the check and for SDPA
        kc = deq[tables.long(), 0].reshape(B, nb * bs, KV, D)[:, :L].permute(0, 2, 1, 3).contiguous()
        vc = deq[tables.long(), 1].reshape(B, nb * bs, KV, D)[:, :L].permute(0, 2, 1, 3).contiguous()
        qh = q.reshape(B, H, 1, D)
        ref = F.scaled_dot_product_attention(qh.float(), kc, vc, scale=scale, enable_gqa=True).reshape(B, H * D)
        err = 0.0
        for _ in range(2):
            out.fill_(float("nan"))
            kern.launch(**args)
            torch.cuda.synchronize()
            err = max(err, float((out.float() - ref).abs().max() / ref.abs().max()))
        del deq
        # timed twice, the first discarded: the first graph of a run met a cold GPU (5-13% slower on the H200)
        for _ in range(2):
            t = time_graph(lambda i, kern=kern, args=args: kern.launch(**args), a.launches, a.reps)
        kv_bytes = B * L * KV * D * 2 * (2 if cdt is DType.bf16 else 1)
        if a.candidates:  # each candidate checked against the same reference, then timed the same way
            from ingot.codegen.kernels.attention.tune import KNOBS, candidates

            for cand in candidates(spec, tgt)[1:]:
                ck = SpecKernel(cand)
                out.fill_(float("nan"))
                ck.launch(**args)
                torch.cuda.synchronize()
                cerr = float((out.float() - ref).abs().max() / ref.abs().max())
                ct = time_graph(lambda i, ck=ck, args=args: ck.launch(**args), a.launches, a.reps)
                print(json.dumps({"bench": "decode_attention_candidate", "cache": cache_name, "smem": cand.smem,
                                  **{k: v for k, v in cand.values if k in KNOBS}, "us": ct * 1e6,
                                  "tbps": kv_bytes / ct / 1e12, "vs_heuristic": t / ct, "rel_err": cerr}),
                      flush=True)
        row = {"bench": "decode_attention", "cache": cache_name, "batch": B, "context": L, "heads": H, "kv_heads": KV,
               "head_dim": D, "block_size": bs, "splits": nsplit, "blocks_per_split": per, "us": t * 1e6,
               "kv_mb": kv_bytes / 1e6, "tbps": kv_bytes / t / 1e12, "frac_of_4.19": kv_bytes / t / 1e12 / COPY_TBPS,
               "rel_err_vs_sdpa_math": err}
        kb, vb = kc.to(torch.bfloat16), vc.to(torch.bfloat16)
        bf16_bytes = B * L * KV * D * 2 * 2
        for name, val in sdpa_times(qh, kb, vb, a.launches, a.reps).items():
            if isinstance(val, float):
                row[f"sdpa_{name}_us"] = val * 1e6
                row[f"sdpa_{name}_tbps"] = bf16_bytes / val / 1e12
                row[f"ingot_vs_sdpa_{name}"] = val / t
            else:
                row[f"sdpa_{name}"] = val
        del kb, vb, kc, vc
        torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not err < 2e-2:
            print(f"  ** {cache_name}: relative error {err:.3e} against SDPA math", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
