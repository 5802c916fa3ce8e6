"""The wgmma skinny GEMM (``codegen/kernels/gemv/skinny.cu``) against cuBLAS and kernel.cu, same run.

    python bench/bench_skinny.py                       # H200: gate_up and lm_head of the 1B model, 8 / 16 / 32 tokens
    python bench/bench_skinny.py --shapes "16384,2048" --m 32 --stages 4 6
    python bench/bench_skinny.py --shapes "3072,2048;2048,8192" --m 32 64 --splitk 2 4 8   # split-K in a cluster
    python bench/bench_skinny.py --m 32 64 --xs        # x streamed beside the weight stages too (label -xs)
    python bench/bench_skinny.py --shapes "3072,2048" --m 64 --splitk 4 --warpgroups 1 2   # 64-row tiles (label -w1)
    python bench/bench_skinny.py --fp8 --m 16 32 64    # e4m3 weights (weight-only FP8): kernel.cu's and skinny wb=1
    python bench/bench_skinny.py --nvfp4 --m 16 32     # NVFP4 weights: kernel.cu's and skinny wb=0
    python bench/bench_skinny.py --shapes "3072,2048;2048,2048;2048,8192" --m 65 128 256
                                                       # past 64 tokens: the any-M variant (skinny_rule.any_m_spec)
                                                       # beside the bf16 CUTLASS GEMM the launch ran before it
    python bench/bench_skinny.py --dry-run             # no GPU: compile every kernel the run would launch

Each kernel is first checked against torch's f32 product of the same bf16 operands (output poisoned with NaN before),
then timed as ``--launches`` back-to-back launches in one CUDA graph (PDL for ingot's kernels, as the runtime
launches them), median of ``--reps`` replays, weights rotating over copies that exceed the 50 MB L2 (so every launch
streams its weight from HBM, as in a model's step). Printed per shape and token count: us, TB/s of weight bytes, %
of 4.19 TB/s (``shared/GPU.md``), and ratios to cuBLAS (``torch.matmul``) timed the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_gemv import Kernel, init_gpu, time_graph  # noqa: E402
from bench_gemv_quant import SpecKernel  # noqa: E402

from ingot.codegen.kernels.gemm_cutlass.rule import Config  # noqa: E402

HBM_TBS = 4.19
DEFAULT_SHAPES = "16384,2048;128256,2048"


def specs(n: int, k: int, m: int, stages: list[int | None], splits: list[int] | None = None, xs: bool = False,
          warpgroups: tuple[int, ...] = (2,), wb: int = 2, short_m: bool = False) -> list[tuple[str, object]]:
    """(label, spec): kernel.cu's rule for the bucket, then the skinny kernel per consumer warpgroup count, split-K
    width (``splits``: 1 is the persistent kernel) and stage count it takes, with ``xs`` each also with x streamed;
    ``wb=1``: their weight-only FP8 forms. Past the buckets: the any-M variant and the bf16 CUTLASS GEMM (``None``),
    with ``short_m`` also the CUTLASS GEMM in each of ``SM90_SHORT_M``'s bf16 configurations (a ``Config``)."""
    from ingot.codegen.kernels.gemv.rule import BUCKETS, gemv_spec
    from ingot.codegen.kernels.gemv.skinny_rule import BUCKETS as SKINNY_BUCKETS
    from ingot.codegen.kernels.gemv.skinny_rule import max_stages, skinny_spec, supported
    from ingot.codegen.target import get_target

    tgt = get_target("h200")
    if m > BUCKETS[-1]:  # past the buckets: the rule's any-M variant (narrow matrices), and bf16's CUTLASS GEMM
        from ingot.codegen.kernels.gemm_cutlass.rule import SM90_SHORT_M, config_tag
        from ingot.codegen.kernels.gemv.skinny_rule import any_m_spec

        any_m = any_m_spec(n, k, tgt, wb=wb)
        short = [(f"cutlass-{config_tag(c)}", c) for c in SM90_SHORT_M["bf16"]] if short_m and wb == 2 else []
        return ([("skinny-any", any_m)] if any_m is not None else []) + ([("cutlass", None)] if wb == 2 else []) \
            + short
    out: list[tuple[str, object]] = [("kernel.cu", gemv_spec(n, k, next(b for b in BUCKETS if b >= m), tgt, wb=wb))]
    mb = next((b for b in SKINNY_BUCKETS if b >= m), None)
    for wg in warpgroups:
        for sk in splits or [1]:
            for stream in (False, True) if xs else (False,):
                for st in stages:
                    st = st or (max_stages(k, mb, tgt, wg, sk, stream, wb) if mb else None)
                    if mb and st and supported(n, k, mb, tgt, wg, st, sk, stream, wb):
                        out.append((f"skinny-s{st}" + (f"-k{sk}" if sk > 1 else "") + ("-xs" if stream else "")
                                    + (f"-w{wg}" if wg != 2 else ""),
                                    skinny_spec(n, k, mb, tgt, wg, st, splitk=sk, x_stream=stream, wb=wb)))
    return out


def weight_code(a: argparse.Namespace) -> int:
    """The kernels' ``WB``: 1 with ``--fp8``, 0 with ``--nvfp4``, 2 (bf16) otherwise."""
    return 1 if a.fp8 else 0 if a.nvfp4 else 2


def bench(n: int, k: int, m: int, a: argparse.Namespace) -> dict:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(n * 31 + m)
    copies = max(2, -(-400 * 2**20 // (n * k * 2)))  # rotate over >= 400 MB of weights
    # one tensor: the skinny kernel's tensor map is filled once over all copies (a fill is not captured in a graph)
    wall = (torch.randn(copies, n, k, device="cuda", generator=gen) * 0.05).to(torch.bfloat16)
    ws = list(wall)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    ref = (x.float() @ ws[0].float().t())
    wb = weight_code(a)
    wbytes = n * k // 2 + n * k // 16 if wb == 0 else n * k * wb  # NVFP4: codes and block scales
    row: dict = {"N": n, "K": k, "M": m, "weight_mb": wbytes / 2**20}
    # the reference: cuBLAS on the bf16 weight (with --fp8 what the model would run without FP8 weights)
    t_cublas = time_graph(lambda i: torch.matmul(x, ws[i % copies].t()), a.launches, a.reps)
    row["cublas_us"] = t_cublas * 1e6
    if a.fp8:  # e4m3 copies of the weight (per-row scales), the reference product of copy 0 dequantized
        fcopies = max(2, -(-400 * 2**20 // (n * k)))
        scale = (wall[0].float().abs().amax(dim=1) / 448.0).clamp(min=1e-8)
        call = torch.stack([(wall[i % copies].float() / scale[:, None]).to(torch.float8_e4m3fn)
                            for i in range(fcopies)])
        cs = list(call)
        ref = x.float() @ (cs[0].float() * scale[:, None]).t()
    if a.nvfp4:  # NVFP4 codes and block scales of copy 0 (ir/quant/formats.py), repeated; the reference dequantized
        import numpy as np

        from ingot.ir.quant import formats as F
        from ingot.ir.quant.packing import pack_e2m1

        w0 = wall[0].float().cpu().numpy()
        gs = F.nvfp4_global_scale(np.abs(w0).max())
        q, sf = F.quantize_nvfp4(w0, gs)
        deq = torch.from_numpy(F.dequantize_nvfp4(q, sf, gs).astype(np.float32)).cuda()
        ref = x.float() @ deq.t()
        ncopies = max(2, -(-400 * 2**20 // wbytes))
        call = torch.from_numpy(pack_e2m1(q)).cuda().unsqueeze(0).repeat(ncopies, 1, 1)
        cs = list(call)
        scale = torch.from_numpy(np.ascontiguousarray(sf).view(np.uint8)).cuda()
        gs_t = torch.tensor([float(gs)], device="cuda", dtype=torch.float32)
    for label, spec in specs(n, k, m, a.stages, a.splitk, a.xs, tuple(a.warpgroups), wb, a.short_m):
        outs = [torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        if spec is None or isinstance(spec, Config):  # the bf16 CUTLASS GEMM a linear's launch runs past its
            # variants (the runtime's build, or ``spec`` a configuration of SM90_SHORT_M)
            from bench_gemv_quant import CutlassGemm

            from ingot.codegen.target import get_target

            kern = CutlassGemm(n, k, m, get_target("h200"), spec)

            def launch(i: int, kern=kern, outs=outs) -> None:
                kern.launch(x=x, weight=ws[i % copies], out=outs[i % copies])
        elif a.fp8 or a.nvfp4:  # kernel.cu's quantized variant and the skinny wb=1 / 0 ones take the quantized
            # linear's inputs by name
            kern = SpecKernel(spec)
            kern.map_over(call)
            s2 = gs_t if a.nvfp4 else None

            def launch(i: int, kern=kern, outs=outs, s2=s2) -> None:
                kern.launch(pdl=True, x=x, weight=cs[i % len(cs)], weight_scale=scale, weight_scale_2=s2,
                            input_scale=None, bias=None, residual=None, out=outs[i % copies], M=m)
        elif spec.template == "skinny.cu":
            kern = SpecKernel(spec)
            kern.map_over(wall)

            def launch(i: int, kern=kern, outs=outs) -> None:
                kern.launch(pdl=True, x=x, weight=ws[i % copies], weight_scale=None, bias=None, residual=None,
                            out=outs[i % copies], M=m)
        else:
            kern = Kernel(spec)

            def launch(i: int, kern=kern, outs=outs) -> None:
                kern.launch(x, ws[i % copies], outs[i % copies], m, pdl=True)
        launch(0)
        torch.cuda.synchronize()
        err = float((outs[0].float() - ref).abs().max() / ref.abs().max())
        row[f"{label}_rel_err"] = err
        if not err < 2e-2:  # NaN (unwritten outputs) fails too
            print(f"  ** {n}x{k} M={m} {label}: relative error {err:.3e} against torch f32", flush=True)
            continue
        t = time_graph(launch, a.launches, a.reps)
        row[f"{label}_us"] = t * 1e6
        row[f"{label}_tbs"] = wbytes / t / 1e12
        row[f"{label}_vs_cublas"] = t_cublas / t
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="N,K;N,K (default: the 1B model's gate_up and lm_head)")
    ap.add_argument("--m", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--stages", type=int, nargs="+", default=[None], help="weight stages (default: as many as fit)")
    ap.add_argument("--splitk", type=int, nargs="+", default=[1],
                    help="split-K widths of the skinny kernel (1: persistent; 2, 4, 8: clusters)")
    ap.add_argument("--xs", action="store_true", help="each skinny configuration also with x streamed")
    ap.add_argument("--warpgroups", type=int, nargs="+", default=[2], choices=[1, 2],
                    help="consumer warpgroups (64-row tiles a warpgroup)")
    ap.add_argument("--fp8", action="store_true", help="e4m3 weights with per-row scales (weight-only FP8), against "
                    "cuBLAS on the bf16 weight")
    ap.add_argument("--nvfp4", action="store_true", help="NVFP4 weights (e2m1 codes, e4m3 block scales, a global "
                    "scale: weight-only), kernel.cu's variant and the skinny wb=0 ones, against cuBLAS on the bf16 "
                    "weight")
    ap.add_argument("--short-m", action="store_true",
                    help="past 64 tokens also the bf16 CUTLASS GEMM in each of gemm_cutlass/rule.py's SM90_SHORT_M "
                         "configurations (cutlass-TAG rows)")
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dry-run", action="store_true", help="no GPU: compile the kernels a run would launch")
    a = ap.parse_args(argv)
    if a.fp8 and a.nvfp4:
        ap.error("--fp8 and --nvfp4 are two weight formats: one at a time")
    shapes = [tuple(int(v) for v in s.split(",")) for s in a.shapes.split(";") if s]
    if a.dry_run:
        from ingot.codegen.compile import compile_spec

        for n, k in shapes:
            for m in a.m:
                for label, spec in specs(n, k, m, a.stages, a.splitk, a.xs, tuple(a.warpgroups), weight_code(a),
                                         a.short_m):
                    if spec is None or isinstance(spec, Config):
                        continue
                    print(f"{n}x{k} M={m} {label}: {spec.entry}, smem {spec.smem}, "
                          f"cubin {len(compile_spec(spec).cubin)} bytes", flush=True)
        return 0
    init_gpu()
    rows = []
    print("| N x K | M | cuBLAS us (TB/s) | kernel | us | TB/s | % of 4.19 | vs cuBLAS |")
    print("|---|---|---|---|---|---|---|---|")
    for n, k in shapes:
        for m in a.m:
            r = bench(n, k, m, a)
            rows.append(r)
            wb = n * k * 2  # the reference's bytes (cuBLAS on the bf16 weight)
            for label, _ in specs(n, k, m, a.stages, a.splitk, a.xs, tuple(a.warpgroups), weight_code(a), a.short_m):
                if f"{label}_us" in r:
                    print(f"| {n}x{k} | {m} | {r['cublas_us']:.2f} ({wb / r['cublas_us'] / 1e6:.2f}) | {label} | "
                          f"{r[label + '_us']:.2f} | {r[label + '_tbs']:.2f} | {r[label + '_tbs'] / HBM_TBS:.1%} | "
                          f"{r[label + '_vs_cublas']:.2f}x |", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
