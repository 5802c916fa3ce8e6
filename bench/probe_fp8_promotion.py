"""How often does an FP8 GEMM promote its tensor-core partial sums to f32? cuBLASLt's, through torch._scaled_mm.

Hopper's FP8 wgmma adds its products into the accumulator with about 13 bits past the largest exponent, so a GEMM
that wants f32-accurate sums over a long K ("no fast accumulation") adds each run of wgmmas into a fresh partial and
promotes it into f32 registers every P columns of K (CUTLASS's default and ingot's ``sm90_fp8_mainloop.cuh``: 4
wgmmas of K = 32, P = 128). "Like for like" against cuBLASLt (issue 7) includes P; this measures it.

Operands: every row of x is ones; column j of w holds ``BIG`` (256) at k0_j and ``SMALL`` (2^-6) everywhere else,
so the exact sum is BIG + (K - 1) SMALL. A partial that holds BIG loses the small terms added into it, so the count
lost, L = (exact - got) / SMALL, is the rest of BIG's promotion chunk: L(k0) = P - 1 - 32 floor((k0 mod P) / 32)
(the terms of BIG's own wgmma are all lost, those of earlier wgmmas in the chunk kept). Fast accumulation never
promotes: P = K. With f32 output L is exact; for bf16 output (rowwise scales, ingot's kernels) BIG is cancelled by
-BIG at k = K - 1, which loses the last wgmma's other 31 terms too, and the sum (< 128) rounds to bf16's 0.5: L to
within 16.

    python bench/probe_fp8_promotion.py            # H200: cuBLASLt, both accumulation modes, f32 and bf16 output
    python bench/probe_fp8_promotion.py --kernels /tmp/gk   # also ingot's FP8 CUTLASS builds there (bf16 output)

``--kernels DIR`` (a ``bench/bench_gemm.py --build`` folder) probes each FP8 candidate built there the same way, bf16
output with per-token / per-channel scales of 1: those that promote (CUTLASS's mainloop, or ingot's overlapped one)
should give P = 128 (the bit-for-bit GPU test compares the two mainloops directly), the FP8FastAccum ones P = K.

Measured on the H200 (docs/PERF.md, "FP8 prefill GEMMs at the power limit"): P = 128 without fast accumulation,
tensorwise and rowwise, on every shape tried; P = K with it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

SMALL = 2.0 ** -6
BIG = 256.0
#: K columns of one FP8 wgmma (m64nNk32)
WGMMA_K = 32


def big_positions(n: int, k: int, stride: int = 8) -> np.ndarray:
    """k0 of each of ``n`` columns: 0, stride, 2 stride, ... in the first half of K (the cancelling -BIG is last)."""
    return (np.arange(n) * stride) % (k // 2)


def probe_weights(n: int, k: int, k0: np.ndarray, cancel: bool) -> np.ndarray:
    """w[n, k] (f32 values exact in e4m3): SMALL everywhere, BIG at (j, k0[j]), and with ``cancel`` -BIG at k - 1."""
    w = np.full((n, k), SMALL, np.float32)
    w[np.arange(n), k0] = BIG
    if cancel:
        w[:, k - 1] = -BIG
    return w


def report(label: str, k0: np.ndarray, got: np.ndarray, k: int, cancel: bool) -> None:
    """One line: the interval found from the column sums ``got`` and the losses of the first columns."""
    lost = lost_terms(got, k, cancel)
    p = promotion_interval(k0, lost, k, cancel)
    pts = " ".join(f"{k0[j]}:{lost[j]:.0f}" for j in range(0, min(64, len(k0)), 4))
    print(f"{label}: P = {p if p is not None else 'no match'} | L(k0) {pts}", flush=True)


def lost_terms(got: np.ndarray, k: int, cancel: bool) -> np.ndarray:
    """L per column from the column sums ``got`` (any row of the output)."""
    exact = (k - 2) * SMALL if cancel else BIG + (k - 1) * SMALL
    return (exact - np.asarray(got, np.float64)) / SMALL


def predicted_lost(k0: np.ndarray, p: int, k: int, cancel: bool) -> np.ndarray:
    """L(k0) with promotion every ``p`` columns (p = K: never). With ``cancel`` the last wgmma's other 31 terms are
    lost too, unless -BIG falls in BIG's chunk, whose terms after BIG are all lost already (less the slot -BIG
    takes)."""
    lost = p - 1 - WGMMA_K * ((k0 % p) // WGMMA_K)
    if cancel:
        lost = np.where(k0 // p == (k - 1) // p, lost - 1, lost + WGMMA_K - 1)
    return lost


def promotion_interval(k0: np.ndarray, lost: np.ndarray, k: int, cancel: bool) -> int | None:
    """The interval P (a power of two from 32 to K) whose predicted losses match ``lost`` (exactly with f32 output;
    with bf16, whose 0.5 at sums below 128 is 32 terms, to within 16), or None where none does."""
    tol = 16.5 if cancel else 0.5
    p = WGMMA_K
    while p <= k:
        if np.all(np.abs(predicted_lost(k0, p, k, cancel) - lost) <= tol):
            return p
        p *= 2
    return None


def simulate(k: int, k0: np.ndarray, p: int, cancel: bool, bits: int = 13) -> np.ndarray:
    """A numpy model of the tensor core's accumulation (for the tests): each wgmma adds its 32 products and the
    partial with everything below 2^(bits) ulps of the largest magnitude dropped (truncated), a fresh partial every
    ``p`` columns promoted into an f64 sum."""
    out = np.empty(len(k0))
    for j, col in enumerate(probe_weights(len(k0), k, k0, cancel).astype(np.float64)):
        total = 0.0
        for c0 in range(0, k, p):
            partial = 0.0
            for w0 in range(c0, min(c0 + p, k), WGMMA_K):
                terms = np.append(col[w0:w0 + WGMMA_K], partial)
                ulp = 2.0 ** (np.floor(np.log2(np.abs(terms).max())) - bits)
                partial = float(np.sum(np.trunc(terms / ulp)) * ulp)
            total += partial
        out[j] = total
    return out


def _measure(shapes: Sequence[tuple[int, int, int]]) -> None:
    import torch

    dev = "cuda"
    for m, n, k in shapes:
        k0 = big_positions(n, k)
        x = torch.ones(m, k, device=dev).to(torch.float8_e4m3fn)
        for cancel in (False, True):
            w = torch.from_numpy(probe_weights(n, k, k0, cancel)).to(dev).to(torch.float8_e4m3fn)
            one = torch.ones((), device=dev)
            cases = {"tensorwise": (one, one), "rowwise": (torch.ones(m, 1, device=dev), torch.ones(1, n, device=dev))}
            for scaling, (sa, sb) in cases.items():
                if scaling == "rowwise" and not cancel:
                    continue  # rowwise scales need bf16 output
                for fast in (False, True):
                    out = torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, use_fast_accum=fast,
                                           out_dtype=torch.bfloat16 if cancel else torch.float32)
                    report(f"{m}x{n}x{k} {scaling} {'bf16' if cancel else 'f32'} out, fast accumulation "
                           f"{'on' if fast else 'off'}", k0, out[0].double().cpu().numpy(), k, cancel)


def _measure_ingot(kernel_dir: Path, shapes: Sequence[tuple[int, int, int]]) -> None:
    import json

    import torch

    from ingot.codegen.kernel import KernelSpec
    from ingot.codegen.kernels.gemm_cutlass.launch import CutlassGemm

    torch.cuda.init()
    torch.empty(1, device="cuda")  # the primary context, which CutlassGemm shares
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    manifest = json.loads((kernel_dir / "manifest.json").read_text())
    for e in manifest["kernels"]:
        if e["kind"] != "fp8":
            continue
        gemm = CutlassGemm(KernelSpec.from_dict(e["spec"]), (kernel_dir / f"{e['entry']}.cubin").read_bytes(),
                           kernel_dir / f"{e['entry']}.so")
        for m, n, k in shapes:
            k0 = big_positions(n, k)
            x = torch.ones(m, k, device="cuda").to(torch.float8_e4m3fn)
            w = torch.from_numpy(probe_weights(n, k, k0, True)).cuda().to(torch.float8_e4m3fn)
            xs, ws = torch.ones(m, device="cuda"), torch.ones(n, device="cuda")
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            ptrs = {"x": x.data_ptr(), "weight": w.data_ptr(), "out": out.data_ptr(), "x_scale": xs.data_ptr(),
                    "weight_scale": ws.data_ptr()}
            gemm.launch(gemm.prepare(ptrs, m, sm_count, N=n, K=k), torch.cuda.current_stream().cuda_stream)
            torch.cuda.synchronize()
            report(f"ingot {e['config']} {m}x{n}x{k} bf16 out", k0, out[0].double().cpu().numpy(), k, True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4096x4096x4096,8192x2048x8192,8192x3072x2048", help="MxNxK[,MxNxK...]")
    ap.add_argument("--kernels", type=Path, default=None,
                    help="also probe the FP8 candidates built here by bench/bench_gemm.py --build")
    a = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    _measure(shapes)  # type: ignore[arg-type]
    if a.kernels is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        _measure_ingot(a.kernels, shapes)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
