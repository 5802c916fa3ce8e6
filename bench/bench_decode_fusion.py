"""Decode fusion's GEMVs (``codegen/decode_fusion.py``) against the launches they replace, on the H200.

    python bench/bench_decode_fusion.py                     # Llama-3.2-1B's pairs and a layer chain, M = 1, 8
    python bench/bench_decode_fusion.py --m 1 --json $OUT/fusion.json

Timed as ``bench/bench_gemv.py`` times GEMVs: ``--launches`` back-to-back groups of launches captured in one CUDA
graph, launched with programmatic dependent launch as the runtime launches them (``--no-pdl``: plain launches),
the graph replayed ``--reps`` times, median per group; every GEMV of a group reads another copy of its weights
(copies rotate over >= 400 MB, so each launch streams from HBM). In the same run, per pair (attn_norm -> qkv,
mlp_norm -> gate_up, swiglu -> down (+ residual), final norm -> lm_head) and token count (bucket 8):

- ``unfused``: the producer (norm / activation kernel) then the plain variant: what decode steps run today;
- ``plain``: the plain variant alone (the floor for the fused one);
- ``fused``: the fused variant as the lowering makes it (first weight stage before the grid-dependency wait);
- ``fused/wait``: the fused variant with its wait first (``weights_first=False``, as the plain variants);
- ``plain/wts``: the plain variant with its first weight stage before the wait (``weights_first=True``).

and one ``layer`` chain per group, the pairs with their real neighbours (a GEMV before each fused GEMV, so PDL
overlaps what it would in a step): ``o(+res) -> norm -> gate_up -> swiglu -> down(+res) -> norm -> qkv`` against
``o(+res) -> fused gate_up -> fused down(+res) -> fused qkv``. The target (issue: fused <= plain + 0.5 us) reads off
``fused - plain``; the saving per decode step off ``fused - unfused`` (x 16 layers, + the lm_head pair once). Each
fused variant is first checked against the unfused launches (relative error of the largest output, < 1e-2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_gemv import ROTATE_BYTES, init_gpu, time_graph  # noqa: E402
from bench_gemv_quant import SpecKernel  # noqa: E402

HIDDEN, INTER, EPS = 2048, 8192, 1e-5
#: Llama-3.2-1B: (name, N, K, prologue, residual)
PAIRS = [("qkv", 3072, HIDDEN, "rms_norm", False), ("gate_up", 2 * INTER, HIDDEN, "rms_norm", False),
         ("down", HIDDEN, INTER, "swiglu", True), ("lm_head", 128256, HIDDEN, "rms_norm", False)]


class Pair:
    """The kernels of one producer -> linear pair at bucket ``mb``, and buffers for token count ``m``."""

    def __init__(self, name: str, n: int, k: int, kind: str, residual: bool, m: int, mb: int, tgt, gen) -> None:
        import torch

        from ingot.codegen.kernels.activation.rule import gated_spec
        from ingot.codegen.kernels.gemv.rule import Prologue, fused_spec, gemv_spec
        from ingot.codegen.kernels.norm.rule import norm_spec
        from ingot.ir.types import DType

        self.name, self.n, self.k, self.kind, self.m = name, n, k, kind, m
        plain = gemv_spec(n, k, mb, tgt, residual=residual)
        pro = Prologue("rms_norm", eps=EPS) if kind == "rms_norm" else Prologue("swiglu", alpha=1.0)
        self.producer = SpecKernel(norm_spec("rms", DType.bf16, DType.bf16, k, EPS, tgt) if kind == "rms_norm" else
                                   gated_spec("swiglu", DType.bf16, k, tgt, 1.0, 2 * k, 2 * k, k))
        self.plain = SpecKernel(plain)
        self.plain_wts = SpecKernel(gemv_spec(n, k, mb, tgt, residual=residual, weights_first=True))
        self.fused = SpecKernel(fused_spec(plain, pro, tgt))
        self.fused_wait = SpecKernel(fused_spec(plain, pro, tgt, weights_first=False))
        copies = max(2, -(-ROTATE_BYTES // (n * k * 2)))
        self.w = [(torch.randn(n, k, device="cuda", generator=gen) * 0.05).to(torch.bfloat16) for _ in range(copies)]
        width = 2 * k if kind == "swiglu" else k
        self.src = (torch.randn(m, width, device="cuda", generator=gen) * 2).to(torch.bfloat16)  # producer's input
        self.g = (1 + 0.2 * torch.randn(k, device="cuda", generator=gen)).to(torch.bfloat16)
        self.x = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)  # the producer's output
        self.res = torch.randn(m, n, device="cuda", generator=gen).to(torch.bfloat16) if residual else None
        self.out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    def produce(self, pdl: bool) -> None:
        if self.kind == "rms_norm":
            self.producer.launch(pdl, x=self.src, weight=self.g, bias=None, residual=None, residual_out=None,
                                 out=self.x, rows=self.m)
        else:
            self.producer.launch(pdl, a=self.src, b=self.src, out=self.x, num_tokens=self.m)

    def linear(self, kern: SpecKernel, i: int, pdl: bool) -> None:
        args = dict(weight=self.w[i % len(self.w)], weight_scale=None, bias=None, residual=self.res, out=self.out,
                    M=self.m)
        if kern in (self.fused, self.fused_wait):
            args["x"] = self.src
            if self.kind == "rms_norm":
                args["norm_weight"] = self.g
        else:
            args["x"] = self.x
        kern.launch(pdl, **args)

    def check(self) -> float:
        """The fused variants (and the plain one with its weights first) against the unfused launches: the largest
        relative error of the largest output."""
        import torch

        self.produce(False)
        self.linear(self.plain, 0, False)
        want = self.out.float().clone()
        worst = 0.0
        for kern in (self.fused, self.fused_wait, self.plain_wts):
            for _ in range(2):  # twice: split-K counters
                self.out.fill_(float("nan"))
                self.linear(kern, 0, False)
                torch.cuda.synchronize()
                worst = max(worst, float(((self.out.float() - want).abs().max() / want.abs().max()).nan_to_num(1.0)))
        return worst

    def times(self, launches: int, reps: int, pdl: bool) -> dict[str, float]:
        """Microseconds per group of each way (see the module docstring)."""
        def unfused(i: int) -> None:
            self.produce(pdl)
            self.linear(self.plain, i, pdl)

        def alone(kern: SpecKernel):
            return lambda i: self.linear(kern, i, pdl)

        ways = {"unfused": unfused, "plain": alone(self.plain), "fused": alone(self.fused),
                "fused/wait": alone(self.fused_wait), "plain/wts": alone(self.plain_wts)}
        return {name: time_graph(rec, launches, reps) * 1e6 for name, rec in ways.items()}


class Layer:
    """The MLP and the next layer's qkv with their neighbours: o(+res) -> [mlp_norm] gate_up [swiglu] down(+res)
    [attn_norm] qkv; the bracketed launches are what fusion skips."""

    def __init__(self, m: int, mb: int, tgt, gen) -> None:
        import torch

        from ingot.codegen.kernels.gemv.rule import gemv_spec

        self.m = m
        self.o = SpecKernel(gemv_spec(HIDDEN, HIDDEN, mb, tgt, residual=True))
        self.gate_up = Pair("gate_up", 2 * INTER, HIDDEN, "rms_norm", False, m, mb, tgt, gen)
        self.down = Pair("down", HIDDEN, INTER, "swiglu", True, m, mb, tgt, gen)
        self.qkv = Pair("qkv", 3072, HIDDEN, "rms_norm", False, m, mb, tgt, gen)
        per_layer = 2 * (HIDDEN * HIDDEN + 2 * INTER * HIDDEN + HIDDEN * INTER + 3072 * HIDDEN)
        copies = max(2, -(-ROTATE_BYTES // per_layer))
        self.wo = [(torch.randn(HIDDEN, HIDDEN, device="cuda", generator=gen) * 0.05).to(torch.bfloat16)
                   for _ in range(copies)]
        self.attn = torch.randn(m, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
        self.h = torch.randn(m, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
        # the chain's data flow: o's output is gate_up's producer input and down's residual; gate_up's output is
        # down's producer input; down's output is qkv's producer input
        self.gate_up.src = self.h2 = torch.empty(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
        self.down.src = self.gate_up.out
        self.down.res = self.h2
        self.qkv.src = self.down.out

    def run(self, i: int, fused: bool, pdl: bool) -> None:
        self.o.launch(pdl, x=self.attn, weight=self.wo[i % len(self.wo)], weight_scale=None, bias=None,
                      residual=self.h, out=self.h2, M=self.m)
        for p in (self.gate_up, self.down, self.qkv):
            if fused:
                p.linear(p.fused, i, pdl)
            else:
                p.produce(pdl)
                p.linear(p.plain, i, pdl)

    def times(self, launches: int, reps: int, pdl: bool) -> dict[str, float]:
        return {"unfused": time_graph(lambda i: self.run(i, False, pdl), launches, reps) * 1e6,
                "fused": time_graph(lambda i: self.run(i, True, pdl), launches, reps) * 1e6}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 8], help="token counts (at most 8: the fused bucket)")
    ap.add_argument("--pairs", nargs="+", default=[p[0] for p in PAIRS], choices=[p[0] for p in PAIRS])
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-pdl", dest="pdl", action="store_false", help="plain launches (default: PDL, as the runtime)")
    ap.add_argument("--no-layer", dest="layer", action="store_false", help="skip the layer chain")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import torch

    from ingot.codegen.decode_fusion import MAX_ROWS
    from ingot.codegen.target import get_target

    init_gpu()
    tgt = get_target("h200")
    mb = max(MAX_ROWS.values())
    if max(a.m) > mb:
        ap.error(f"--m: fused variants exist for up to {mb} tokens")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict] = []
    ways = ("unfused", "plain", "fused", "fused/wait", "plain/wts")
    print(f"{'pair':>8} {'M':>2} " + " ".join(f"{w:>9}" for w in ways) + f" {'f-plain':>8} {'f-unfused':>9} "
          f"{'rel err':>8}   (us per group, PDL {'on' if a.pdl else 'off'})", flush=True)
    for m in a.m:
        for name, n, k, kind, residual in PAIRS:
            if name not in a.pairs:
                continue
            pair = Pair(name, n, k, kind, residual, m, mb, tgt, gen)
            err = pair.check()
            t = pair.times(a.launches, a.reps, a.pdl)
            row = {"pair": name, "m": m, "n": n, "k": k, "prologue": kind, "pdl": a.pdl, "rel_err": err,
                   **{f"{w}_us": t[w] for w in ways}}
            rows.append(row)
            print(f"{name:>8} {m:>2} " + " ".join(f"{t[w]:9.2f}" for w in ways) +
                  f" {t['fused'] - t['plain']:+8.2f} {t['fused'] - t['unfused']:+9.2f} {err:8.1e}"
                  + ("  ** differs" if not err < 1e-2 else ""), flush=True)
            del pair
            torch.cuda.empty_cache()
        if a.layer:
            layer = Layer(m, mb, tgt, gen)
            t = layer.times(a.launches, a.reps, a.pdl)
            rows.append({"pair": "layer", "m": m, "pdl": a.pdl, "unfused_us": t["unfused"], "fused_us": t["fused"]})
            print(f"{'layer':>8} {m:>2} {t['unfused']:9.2f} {'':>9} {t['fused']:9.2f} {'':>9} {'':>9} {'':>8} "
                  f"{t['fused'] - t['unfused']:+9.2f}   (o, gate_up, down, qkv with their norms / swiglu)", flush=True)
            del layer
            torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
