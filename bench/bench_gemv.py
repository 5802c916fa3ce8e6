"""Decode GEMV / skinny GEMM (``codegen/kernels/gemv``) against cuBLAS (``torch.matmul``, bf16), on the H200.

    python bench/bench_gemv.py                    # Llama-3.2-1B layer shapes, M = 1, 8, 32
    python bench/bench_gemv.py --sweep            # also time other split-K / warp / stage configurations
    python bench/bench_gemv.py --sweep-kw --shapes "3072,2048;2048,2048;2048,8192" --m 1 8
                                                  # the row-group configurations only (rule.GemvConfig.kwarps)
    python bench/bench_gemv.py --json out.json
    python bench/bench_gemv.py --bulk             # also the bulk-copy variants (bulk.cu, INGOT_GEMV_BULK) per shape
    python bench/bench_gemv.py --chain --m 1 8 32 # a 16-layer qkv -> o -> gate_up -> down chain: kernel.cu, bulk.cu,
                                                  # cuBLAS, in one CUDA graph with PDL (cross-kernel overlap)
    python bench/bench_gemv.py --chain --fused --m 1 8              # qkv / gate_up / down as decode fusion's variants
    python bench/bench_gemv.py --chain --interleave norm --m 1 8    # an rms_norm launch before every GEMV
    python bench/bench_gemv.py --chain --fused --interleave norm --m 1 --dry-run   # CPU: build + compile the specs

Both sides are timed the same way: ``--launches`` back-to-back launches captured in one CUDA graph
(so launch cost is not counted), the graph replayed ``--reps`` times, CUDA events around each replay,
median. Each launch reads another copy of the weights (copies rotate so that they together exceed the
50 MB L2 several times: every launch streams its weights from HBM). Printed per shape and M: weight
bytes, time per launch, TB/s of weights read, the fraction of the 4.19 TB/s copy ceiling
(``../shared/GPU.md``), cuBLAS's time and TB/s, and the speedup. Every configuration is first checked
against a float32 product of the same bf16 values (outputs poisoned first). ``--bulk`` adds a row per shape and M
for the bulk-copy variant (``codegen/kernels/gemv/bulk_rule.py``), timed the same way. Where the rule's
configuration has row groups (warps sharing a CTA's rows, each a part of its K slice: ``rule.GemvConfig.kwarps``),
a ``kw1`` row times the configuration the rule gives without them (``INGOT_GEMV_KW=0``) in the same run. Every
configuration that splits K (the rule's and, with ``--sweep``, the others) is timed beside its twin with the other
reduction (``rule.GemvConfig.cluster``: ``-cl`` / `` cl`` rows reduce in a thread-block cluster, ``-ws`` / `` ws``
rows through the workspace), so one run compares them (JSON rows carry ``cluster``). The rule's choice follows
``INGOT_GEMV_CLUSTER`` (on by default). A ``--sweep`` run prints one row per configuration: on the GPU machine, tar
its log and JSON (a device call returns 8 files at most).

``--chain``: per token count, ``CHAIN_LAYERS`` layers of Llama-3.2-1B's GEMVs (qkv, o + residual, gate_up,
down + residual), every layer with its own weights (~1.9 GB: nothing stays in L2), launched back to back with PDL
in one CUDA graph: ``kernel.cu``'s variants, ``bulk.cu``'s, and cuBLAS (``torch.addmm`` / ``torch.matmul``) in the
same run; printed per layer, with the fraction of 4.19 TB/s. The number that shows the cross-kernel overlap.

``--fused`` and ``--interleave norm`` (with ``--chain``): the plain chain measured bulk.cu 1.17x kernel.cu at M = 1
on the H200, yet end to end the bulk variants gained nothing. The model differs from the chain in two ways, one
option each, so that a run tells which of them takes bulk's advantage away: (a) ``--fused``: with decode fusion
(the default) qkv and gate_up run their rms_norm-prologue variants (x is the norm's input, plus a norm weight) and
down its packed-swiglu-prologue variant (x is the [M, 2 x 8192] gate_up buffer), as ``rule.fused_spec`` makes them
from each family's plain variant (a bulk variant's may fall back to kernel.cu's: listed as ``bulk_fallbacks``); o
stays plain + residual; each fused GEMV is checked against a float32 torch reference (rms_norm with the prologue's
eps, silu(gate) * up with its alpha). (b) ``--interleave norm``: small kernels sit between the GEMVs in the model
(rope and attention before o; unfused, an rms_norm before qkv and gate_up and a swiglu before down): the project's
bf16 rms_norm kernel (``norm_spec``, of the next GEMV's K) is launched with PDL before every GEMV, 4 extra launches a
layer, included in the per-layer time. The two combine. cuBLAS stays the plain chain (no prologues, no norm
launches) in every variant; JSON rows carry ``variant`` (plain, fused, interleave-norm, fused+interleave-norm) and
``extra_launches_per_layer``. ``--dry-run``: builds and compiles (``compile_spec``, no GPU, no torch) every spec the
chosen variant would launch, both families and each M's bucket, prints one line per spec and exits.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ingot.codegen.kernel import KernelSpec
    from ingot.codegen.kernels.gemv.rule import Prologue
    from ingot.codegen.target import Target

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COPY_TBPS = 4.19
#: Llama-3.2-1B: qkv (fused), gate+up (fused), down, lm_head; [N, K]
SHAPES = [(3072, 2048), (16384, 2048), (2048, 8192), (128256, 2048)]
ROTATE_BYTES = 400 << 20


def _cu():
    from cuda.bindings import driver

    return driver


def check(ret):
    cu = _cu()
    err, rest = (ret[0], ret[1:]) if isinstance(ret, tuple) else (ret, ())
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else (rest or None)


def init_gpu() -> None:
    """torch's primary context (the kernels here launch on torch's streams with torch's tensors) and the driver
    API; kernels cached in ``$INGOT_CACHE_DIR`` (default /tmp/ingot-kernel-cache)."""
    import torch

    os.environ.setdefault("INGOT_CACHE_DIR", "/tmp/ingot-kernel-cache")
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    check(_cu().cuInit(0))


def launch_kernel(fn, grid, block, smem: int, stream: int, params_addr: int, pdl: bool = False) -> None:
    """A launch on torch's ``stream`` through the runtime's own ``cuda_driver.launch``: ``pdl`` with programmatic
    stream serialization, as ingot's runtime launches kernels that wait for the previous grid themselves (a kernel
    may then start, e.g. load its first weights, while the one before it finishes)."""
    from types import SimpleNamespace

    from ingot.runtime import cuda_driver

    cuda_driver.launch(fn, tuple(grid), tuple(block), smem, SimpleNamespace(handle=_cu().CUstream(stream)),
                       params_addr, "bench kernel", pdl)


class Kernel:
    """A compiled GEMV spec, launched on torch's current stream with torch tensors."""

    def __init__(self, spec) -> None:
        from ingot.codegen.compile import compile_spec

        cu = _cu()
        self.spec = spec
        self.module = check(cu.cuModuleLoadData(compile_spec(spec).cubin))
        self.fn = check(cu.cuModuleGetFunction(self.module, spec.entry.encode()))
        if spec.smem > 48 * 1024:
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(cu.cuFuncSetAttribute(self.fn, attr, spec.smem))

    def launch(self, x, w, out, m: int, bias=None, residual=None, stream: int | None = None, pdl: bool = False,
               norm_weight=None) -> None:
        """A GEMV launch (``rule.PARAMS``; ``norm_weight`` too for an rms_norm-prologue variant, which reads x as the
        norm's input; a swiglu-prologue variant reads x as the ``[M, 2K]`` gate_up buffer)."""
        self.launch_named(pdl, stream, x=x, weight=w, weight_scale=None, bias=bias, residual=residual, out=out, M=m,
                          norm_weight=norm_weight)

    def launch_named(self, pdl: bool = False, stream: int | None = None, **args: Any) -> None:
        """A launch with arguments by parameter name (tensors, None for a null pointer, ints; names the spec does not
        take are ignored): any spec, e.g. the norm kernel the ``--interleave norm`` chain launches between GEMVs."""
        import torch

        vals: list = []
        for p in self.spec.params:
            a = args[p.name]
            if p.ctype == "ptr":
                vals.append(ctypes.c_uint64(0 if a is None else a.data_ptr()))
            elif p.ctype in ("i32", "i64"):
                vals.append((ctypes.c_int32 if p.ctype == "i32" else ctypes.c_int64)(int(a)))
            else:
                vals.append(ctypes.c_float(float(a)))
        ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        ints = {p.name: int(args[p.name]) for p in self.spec.params if p.ctype in ("i32", "i64")}
        s = torch.cuda.current_stream().cuda_stream if stream is None else stream
        launch_kernel(self.fn, self.spec.grid_dims(ints), self.spec.block, self.spec.smem, s, ctypes.addressof(ptrs),
                      pdl)


def capture_graph(record, launches: int):
    """A CUDA graph of ``launches`` calls ``record(i)`` (three warm-up calls outside the capture first)."""
    import torch

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for i in range(3):  # warm up outside the capture
            record(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(launches):
            record(i)
    g.replay()
    torch.cuda.synchronize()
    return g


def replay_seconds(g, launches: int) -> float:
    """Seconds per launch of one replay of ``g`` (CUDA events)."""
    import torch

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / launches


def time_graph(record, launches: int, reps: int) -> float:
    """Median seconds per launch: ``record(i)`` enqueues launch i; ``launches`` of them form one graph."""
    g = capture_graph(record, launches)
    return statistics.median(replay_seconds(g, launches) for _ in range(reps))


def configs(n: int, k: int, mb: int, sweep: bool, kw_only: bool = False):
    from ingot.codegen.kernels.gemv.rule import SMEM_BUDGET, _round_up, cluster_fits, gemv_config, smem_bytes

    base, old = gemv_config(n, k, mb, 132), gemv_config(n, k, mb, 132, kwarps=1)
    out = [("default", base)]
    if base.kwarps > 1:  # beside it, the rule's configuration without row groups (INGOT_GEMV_KW=0)
        out.append(("kw1", old))
    # beside a split configuration, its twin reduced the other way (a cluster or the workspace: rule.GemvConfig.cluster)
    for name, c in list(out):
        if cluster_fits(mb, c):
            out.append((name + ("-ws" if c.cluster else "-cl"), dataclasses.replace(c, cluster=not c.cluster)))
    if not sweep and not kw_only:
        return out
    seen = {c for _, c in out}
    # (warps, tiles, steps a stage, warps a row group): kernel.cu's shapes, then row groups splitting the CTA's K
    # slice (rule.GemvConfig.kwarps), each with the split-K counts around the rule's
    shapes = [(w, t, u, 1) for w, t, u in ((4, 1, 8), (8, 1, 4), (4, 1, 4), (4, 2, 4), (8, 2, 2), (4, 2, 2))]
    if kw_only:  # --sweep-kw: the rule's configuration without row groups, then the row-group shapes only
        shapes = []
    shapes += [(4, 1, 8, 4), (4, 1, 8, 2), (8, 1, 4, 8), (8, 1, 4, 4), (4, 1, 4, 4), (8, 1, 8, 8), (8, 2, 2, 8)]
    for warps, mt, u, kw in shapes:
        for sk in (1, 2, 4, 8, 16, 32):
            ks = _round_up(-(-k // sk), 32 * u * kw)
            if ks * (sk - 1) >= k or smem_bytes(mb, ks) > SMEM_BUDGET or ks < 32 * u * kw:
                continue
            try:
                c = gemv_config(n, k, mb, 132, warps=warps, stage_steps=u, splitk=sk, tiles=mt, kwarps=kw)
            except ValueError:  # the row group's partials do not fit x's region
                continue
            near = base.splitk / 4 <= c.splitk <= base.splitk * 4 or (kw > 1 and c.splitk <= old.splitk)
            if c not in seen and near:
                seen.add(c)
                out.append((f"w{warps} t{mt} u{u} sk{c.splitk}" + (f" kw{kw}" if kw > 1 else ""), c))
                twin = dataclasses.replace(c, cluster=not c.cluster)
                if cluster_fits(mb, c) and twin not in seen:
                    seen.add(twin)
                    out.append((out[-1][0] + (" ws" if c.cluster else " cl"), twin))
    return out


def bench_shape(n: int, k: int, ms: list[int], sweep: bool, launches: int, reps: int, gen, tgt,
                pdl: bool = True, bulk: bool = False, kw_only: bool = False) -> list[dict]:
    import torch

    from ingot.codegen.kernels.gemv.rule import BUCKETS, gemv_spec

    rows = []
    nbytes = n * k * 2
    copies = max(1, -(-ROTATE_BYTES // nbytes))
    ws = [(torch.randn(n, k, device="cuda", generator=gen) * 0.05).to(torch.bfloat16) for _ in range(copies)]
    for m in ms:
        mb = next(b for b in BUCKETS if b >= m)
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ ws[0].float().t()

        def cublas(i: int, x=x) -> None:
            torch.matmul(x, ws[i % copies].t())

        t_cublas = time_graph(cublas, launches, reps)
        best = None
        todo = [(name, cfg, gemv_spec(n, k, mb, tgt, config=cfg)) for name, cfg in configs(n, k, mb, sweep, kw_only)]
        if bulk:
            from ingot.codegen.kernels.gemv.bulk_rule import bulk_spec, spec_config

            bspec = bulk_spec(n, k, mb, tgt)
            if bspec is not None:
                todo.append(("bulk", spec_config(bspec), bspec))
        for name, cfg, spec in todo:
            kern = Kernel(spec)
            err = 0.0
            for _ in range(2):  # twice: the split-K counters must have been reset by the first launch
                out.fill_(float("nan"))
                kern.launch(x, ws[0], out, m)
                torch.cuda.synchronize()
                err = max(err, float((out.float() - ref).abs().max() / ref.abs().max()))

            def ours(i: int, kern=kern, x=x, out=out, m=m) -> None:
                kern.launch(x, ws[i % copies], out, m)

            def ours_pdl(i: int, kern=kern, x=x, out=out, m=m) -> None:
                kern.launch(x, ws[i % copies], out, m, pdl=True)

            # the runtime's way (PDL) when asked; the plain-launch time is kept beside it
            t_plain = time_graph(ours, launches, reps)
            t = time_graph(ours_pdl, launches, reps) if pdl else t_plain
            tbps = nbytes / t / 1e12
            row = {"n": n, "k": k, "m": m, "mb": mb, "config": name, "splitk": cfg.splitk, "warps": cfg.warps,
                   "tiles": cfg.tiles, "u": getattr(cfg, "stage_steps", 0),
                   "kw": getattr(cfg, "kwarps", 1), "cluster": getattr(cfg, "cluster", False), "us": t * 1e6,
                   "tbps": tbps,
                   "frac": tbps / COPY_TBPS,
                   "pdl": pdl, "plain_us": t_plain * 1e6,
                   "cublas_us": t_cublas * 1e6, "cublas_tbps": nbytes / t_cublas / 1e12,
                   "speedup": t_cublas / t, "rel_err": err, "weight_mb": nbytes / 1e6}
            rows.append(row)
            if name != "bulk" and (best is None or t < best["us"] / 1e6):
                best = row
            print(f"{n:>7}x{k:<6} {m:>3} {mb:>6} {name:>16} {t * 1e6:8.2f} {t_plain * 1e6:8.2f} {tbps:6.2f} "
                  f"{tbps / COPY_TBPS:6.1%} {t_cublas * 1e6:9.2f} {row['cublas_tbps']:6.2f} {row['speedup']:6.2f}x "
                  f"{err:8.1e}", flush=True)
            if not err < 1e-2:
                print(f"  ** {n}x{k} M={m} {name}: relative error {err}", flush=True)
        if (sweep or kw_only) and best is not None:
            print(f"  best: {best['config']} {best['tbps']:.2f} TB/s", flush=True)
    return rows


#: the chain's layers (distinct weights each) and one layer's GEMVs: (name, N, K, residual)
CHAIN_LAYERS = 16
CHAIN = [("qkv", 3072, 2048, False), ("o", 2048, 2048, True), ("gate_up", 16384, 2048, False),
         ("down", 2048, 8192, True)]
#: ``--fused``: the prologue of each GEMV that decode fusion fuses in the model (o stays plain), with Llama-3.2-1B's
#: rms_norm eps and swiglu alpha (SiLU)
CHAIN_PROLOGUES = {"qkv": "rms_norm", "gate_up": "rms_norm", "down": "swiglu"}
CHAIN_EPS, CHAIN_ALPHA = 1e-5, 1.0
#: ``--interleave`` kinds: the kernel launched before every GEMV of the chain
INTERLEAVE_KINDS = ("norm",)


def chain_variant(fused: bool, interleave: str | None) -> str:
    """The JSON rows' ``variant``: plain, fused, interleave-norm or fused+interleave-norm."""
    parts = (["fused"] if fused else []) + ([f"interleave-{interleave}"] if interleave else [])
    return "+".join(parts) or "plain"


def chain_prologue(name: str, fused: bool) -> Prologue | None:
    """The ``rule.Prologue`` of chain GEMV ``name`` (None: the plain variant)."""
    from ingot.codegen.kernels.gemv.rule import Prologue

    kind = CHAIN_PROLOGUES.get(name) if fused else None
    if kind is None:
        return None
    return Prologue("rms_norm", eps=CHAIN_EPS) if kind == "rms_norm" else Prologue("swiglu", alpha=CHAIN_ALPHA)


def chain_specs(mb: int, tgt: Target, fused: bool = False, interleave: str | None = None) -> dict[str, Any]:
    """Every spec one chain variant launches for token bucket ``mb``: ``families`` (``kernel.cu`` and ``bulk.cu``:
    one spec per ``CHAIN`` GEMV; the bulk family takes kernel.cu's variant where ``bulk_rule`` finds no
    configuration, plain or fused), ``bulk_fallbacks`` (those GEMVs' names) and ``norms`` (``--interleave norm``:
    the bf16 rms_norm kernel launched before each GEMV, of that GEMV's K; else empty)."""
    from ingot.codegen.kernels.gemv.bulk_rule import bulk_spec
    from ingot.codegen.kernels.gemv.rule import fused_spec, gemv_spec
    from ingot.codegen.kernels.norm.rule import norm_spec
    from ingot.ir.types import DType

    if interleave not in (None, *INTERLEAVE_KINDS):
        raise ValueError(f"--interleave: one of {INTERLEAVE_KINDS}, got {interleave!r}")
    kern, bulk = [], []
    for name, n, k, r in CHAIN:
        plain = gemv_spec(n, k, mb, tgt, residual=r)
        bplain = bulk_spec(n, k, mb, tgt, residual=r) or plain
        pro = chain_prologue(name, fused)
        kern.append(plain if pro is None else fused_spec(plain, pro, tgt))
        bulk.append(bplain if pro is None else fused_spec(bplain, pro, tgt))
    norms = ([norm_spec("rms", DType.bf16, DType.bf16, k, CHAIN_EPS, tgt) for _, _, k, _ in CHAIN]
             if interleave == "norm" else [])
    return {"families": {"kernel.cu": kern, "bulk.cu": bulk},
            "bulk_fallbacks": [CHAIN[i][0] for i, b in enumerate(bulk) if b.template != "bulk.cu"], "norms": norms}


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """float32 ``x * rsqrt(mean(x^2) + eps) * weight`` over the last axis (torch)."""
    import torch

    x = x.float()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight.float()


def chain_reference(x: torch.Tensor, w: torch.Tensor, prologue: Prologue | None = None,
                    norm_weight: torch.Tensor | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
    """float32 torch reference of one chain GEMV from its launch's inputs: x (rms_norm prologue: the norm's input,
    normalized here with the prologue's eps and ``norm_weight``; swiglu: the ``[M, 2K]`` gate_up buffer, turned into
    ``gate * sigmoid(alpha * gate) * up``), then ``x @ w^T (+ residual)``."""
    import torch

    x = x.float()
    if prologue is not None and prologue.kind == "rms_norm":
        x = rms_norm_reference(x, norm_weight, prologue.eps)
    elif prologue is not None and prologue.kind == "swiglu":
        gate, up = x[:, : x.shape[1] // 2], x[:, x.shape[1] // 2:]
        x = gate * torch.sigmoid(prologue.alpha * gate) * up
    y = x @ w.float().t()
    return y if residual is None else y + residual.float()


def _grid_text(spec: KernelSpec) -> str:
    return "(" + ", ".join(g.size if g.size and g.tile == 1 else f"{g.size}/{g.tile}" if g.size else str(g.const)
                           for g in spec.grid) + ")"


def dry_run_chain(ms: list[int], tgt: Target, fused: bool = False, interleave: str | None = None) -> list[dict]:
    """``--chain --dry-run``: every spec the chosen chain variant launches, for each token count's bucket and both
    families, compiled with ``compile_spec`` (no GPU, no torch); one printed line and one returned dict (``mb``,
    ``family``, ``gemv``, ``spec``, ``built``) per distinct spec."""
    from ingot.codegen.compile import compile_spec
    from ingot.codegen.kernels.gemv.rule import BUCKETS

    os.environ.setdefault("INGOT_CACHE_DIR", "/tmp/ingot-kernel-cache")
    out: list[dict] = []
    seen: set[str] = set()
    print(f"chain dry run [{chain_variant(fused, interleave)}] for {tgt.name} ({tgt.arch}), M = {ms}", flush=True)
    for mb in dict.fromkeys(next(b for b in BUCKETS if b >= m) for m in ms):
        made = chain_specs(mb, tgt, fused, interleave)
        todo = [(fam, CHAIN[i][0], s) for fam, specs in made["families"].items() for i, s in enumerate(specs)]
        todo += [("norm", f"before {CHAIN[i][0]}", s) for i, s in enumerate(made["norms"])]
        for fam, name, spec in todo:
            if spec.key in seen:  # a bulk fallback is kernel.cu's own spec; the 2048-wide norm serves three GEMVs
                continue
            seen.add(spec.key)
            built = compile_spec(spec)
            out.append({"mb": mb, "family": fam, "gemv": name, "spec": spec, "built": built})
            v = dict(spec.values)
            print(f"MB {mb:>2} {fam:>9} {name:>14}  {spec.entry:<52} {spec.template:>9} smem {spec.smem:>6} "
                  f"grid {_grid_text(spec):<12} block {spec.block[0]:>4}  PROLOGUE {v.get('PROLOGUE', '-')}  "
                  f"{len(built.cubin)} B cubin", flush=True)
        if made["bulk_fallbacks"]:
            print(f"MB {mb:>2} bulk.cu falls back to kernel.cu for {made['bulk_fallbacks']}", flush=True)
    return out


def bench_chain(ms: list[int], launches: int, reps: int, gen: torch.Generator, tgt: Target, fused: bool = False,
                interleave: str | None = None) -> list[dict]:
    """Microseconds per layer of the ``--chain`` measurement (module docstring) for each token count; ``fused``:
    qkv and gate_up with their rms_norm prologue, down with its swiglu prologue; ``interleave="norm"``: a bf16
    rms_norm launch (PDL) before every GEMV, counted in the per-layer time."""
    import torch

    from ingot.codegen.kernels.gemv.rule import BUCKETS

    variant = chain_variant(fused, interleave)
    pros = [chain_prologue(name, fused) for name, _, _, _ in CHAIN]
    weights = [[(torch.randn(n, k, device="cuda", generator=gen) * 0.05).to(torch.bfloat16) for _, n, k, _ in CHAIN]
               for _ in range(CHAIN_LAYERS)]
    nbytes = sum(2 * n * k for _, n, k, _ in CHAIN)
    rows = []
    for m in ms:
        mb = next(b for b in BUCKETS if b >= m)
        # x: [M, K] (rms_norm prologue: the norm's input), [M, 2K] for the swiglu prologue (packed gate_up)
        xs = [torch.randn(m, k * (2 if p is not None and p.kind == "swiglu" else 1), device="cuda",
                          generator=gen).to(torch.bfloat16) for (_, _, k, _), p in zip(CHAIN, pros)]
        res = [torch.randn(m, n, device="cuda", generator=gen).to(torch.bfloat16) if r else None
               for _, n, _, r in CHAIN]
        outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _, n, _, _ in CHAIN]
        gs = [(1 + 0.2 * torch.randn(k, device="cuda", generator=gen)).to(torch.bfloat16)
              if p is not None and p.kind == "rms_norm" else None for (_, _, k, _), p in zip(CHAIN, pros)]
        made = chain_specs(mb, tgt, fused, interleave)
        built: dict[str, Kernel] = {}  # one module per distinct spec (a bulk fallback is kernel.cu's own)

        def kernel(spec, built=built) -> Kernel:
            if spec.key not in built:
                built[spec.key] = Kernel(spec)
            return built[spec.key]

        families = {name: [kernel(s) for s in specs] for name, specs in made["families"].items()}
        for name, kerns in families.items():  # each GEMV against torch once (twice: split-K counters)
            for i, (kern, (_, _, _, r)) in enumerate(zip(kerns, CHAIN)):
                ref = chain_reference(xs[i], weights[0][i], pros[i], gs[i], res[i] if r else None)
                for _ in range(2):
                    outs[i].fill_(float("nan"))
                    kern.launch(xs[i], weights[0][i], outs[i], m, residual=res[i], norm_weight=gs[i])
                    torch.cuda.synchronize()
                    err = float(((outs[i].float() - ref).abs().max() / ref.abs().max()).nan_to_num(1.0))
                    if not err < 1e-2:
                        what = f" ({pros[i].kind} prologue)" if pros[i] is not None else ""
                        print(f"  ** chain {name} {CHAIN[i][0]}{what} M={m}: relative error {err:.2e}", flush=True)
        # --interleave norm: the norm before GEMV i reads / writes its own [M, K] buffers (each launch waits for
        # the grid before it whatever it reads: the data flow does not change the timing)
        norms = [kernel(s) for s in made["norms"]]
        widths = sorted({k for _, _, k, _ in CHAIN}) if norms else []
        nsrc = {k: torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16) for k in widths}
        ng = {k: (1 + 0.2 * torch.randn(k, device="cuda", generator=gen)).to(torch.bfloat16) for k in widths}
        nout = {k: torch.empty(m, k, device="cuda", dtype=torch.bfloat16) for k in widths}

        def norm_args(i: int, nsrc=nsrc, ng=ng, nout=nout, m=m) -> dict:
            k = CHAIN[i][2]
            return dict(x=nsrc[k], weight=ng[k], bias=None, residual=None, residual_out=None, out=nout[k], rows=m)

        for k in widths:  # each width's norm kernel against torch once
            i = [c[2] for c in CHAIN].index(k)
            ref = rms_norm_reference(nsrc[k], ng[k], CHAIN_EPS)
            nout[k].fill_(float("nan"))
            norms[i].launch_named(**norm_args(i))
            torch.cuda.synchronize()
            err = float(((nout[k].float() - ref).abs().max() / ref.abs().max()).nan_to_num(1.0))
            if not err < 1e-2:
                print(f"  ** chain rms_norm h{k} M={m}: relative error {err:.2e}", flush=True)

        def ours(kerns, xs=xs, outs=outs, m=m, res=res, gs=gs, norms=norms, norm_args=norm_args):
            def record(_: int) -> None:
                for layer in weights:
                    for i, kern in enumerate(kerns):
                        if norms:
                            norms[i].launch_named(pdl=True, **norm_args(i))
                        kern.launch(xs[i], layer[i], outs[i], m, residual=res[i], pdl=True, norm_weight=gs[i])
            return record

        cxs = xs if not fused else [torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
                                    for _, _, k, _ in CHAIN]

        def cublas(_: int, xs=cxs, outs=outs, res=res) -> None:
            for layer in weights:
                for i, w in enumerate(layer):
                    if res[i] is None:
                        torch.matmul(xs[i], w.t(), out=outs[i])
                    else:
                        torch.addmm(res[i], xs[i], w.t(), out=outs[i])

        t = {name: time_graph(ours(kerns), launches, reps) / CHAIN_LAYERS for name, kerns in families.items()}
        t["cuBLAS"] = time_graph(cublas, launches, reps) / CHAIN_LAYERS
        row = {"chain": "qkv,o,gate_up,down", "variant": variant, "m": m, "mb": mb, "layers": CHAIN_LAYERS,
               "weight_mb": nbytes / 1e6, "bulk_fallbacks": made["bulk_fallbacks"],
               "extra_launches_per_layer": len(norms), "cuBLAS_chain": "plain",
               **{f"{name}_us": v * 1e6 for name, v in t.items()},
               **{f"{name}_frac": nbytes / v / 1e12 / COPY_TBPS for name, v in t.items()}}
        rows.append(row)
        label = "" if variant == "plain" else f" [{variant}]"
        shown = {name if name != "cuBLAS" or variant == "plain" else "cuBLAS (plain chain)": v for name, v in t.items()}
        print(f"chain{label} M={m:>2} (MB {mb}): " + "  ".join(
            f"{name} {v * 1e6:7.2f} us/layer {nbytes / v / 1e12:5.2f} TB/s {nbytes / v / 1e12 / COPY_TBPS:6.1%}"
            for name, v in shown.items()) + f"  bulk vs kernel.cu {t['kernel.cu'] / t['bulk.cu']:5.2f}x, "
            f"vs cuBLAS {t['cuBLAS'] / t['bulk.cu']:5.2f}x"
            + (f"  (kernel.cu for {row['bulk_fallbacks']})" if row["bulk_fallbacks"] else "")
            + (f"  (+{len(norms)} rms_norm launches/layer in ingot's times)" if norms else ""), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--shapes", default="", help="N,K;N,K (default: the 1B model's)")
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-kw", action="store_true",
                    help="time the row-group configurations (warps sharing a CTA's rows, splitting its K slice) only")
    ap.add_argument("--no-pdl", dest="pdl", action="store_false",
                    help="time ingot's kernels with plain launches only (default: with programmatic dependent launch, "
                         "as the runtime launches them, and plain launches in the 'plain us' column)")
    ap.add_argument("--bulk", action="store_true", help="also time the bulk-copy variants (bulk.cu)")
    ap.add_argument("--chain", action="store_true", help="only the 16-layer chain (kernel.cu, bulk.cu, cuBLAS)")
    ap.add_argument("--fused", action="store_true",
                    help="--chain: qkv and gate_up as their rms_norm-prologue variants, down as its swiglu-prologue "
                         "variant (decode fusion's); cuBLAS stays the plain chain")
    ap.add_argument("--interleave", choices=INTERLEAVE_KINDS, default=None,
                    help="--chain: launch this kernel (PDL) before every GEMV (norm: ingot's bf16 rms_norm of the "
                         "GEMV's K), as the unfused model does")
    ap.add_argument("--dry-run", action="store_true",
                    help="--chain: build and compile every spec the chosen chain variant launches (no GPU, no torch), "
                         "print one line per spec and exit")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if (a.fused or a.interleave or a.dry_run) and not a.chain:
        ap.error("--fused, --interleave and --dry-run apply to --chain")
    from ingot.codegen.target import get_target

    tgt = get_target("h200")
    if a.dry_run:
        dry_run_chain(a.m, tgt, a.fused, a.interleave)
        return 0
    import torch

    init_gpu()
    shapes = [tuple(int(v) for v in s.split(",")) for s in a.shapes.split(";")] if a.shapes else SHAPES
    rows = []
    print(f"{'N x K':>14} {'M':>3} {'MB':>6} {'config':>16} {'us':>8} {'plain us':>8} {'TB/s':>6} {'%4.19':>6} "
          f"{'cuBLAS us':>9} {'TB/s':>6} {'speedup':>7} {'rel err':>8}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    if a.chain:
        rows = bench_chain(a.m, max(1, a.launches // 10), a.reps, gen, tgt, a.fused, a.interleave)
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=1))
        return 0
    for n, k in shapes:
        rows += bench_shape(n, k, a.m, a.sweep, a.launches, a.reps, gen, tgt, a.pdl, a.bulk, a.sweep_kw)
        torch.cuda.empty_cache()
    print("\nsummary (default configuration):")
    print(f"{'N x K':>14} {'MB':>7} {'M':>3} {'ingot TB/s':>10} {'% of 4.19':>9} {'cuBLAS TB/s':>11} {'vs cuBLAS':>9} "
          f"{'family':>9}")
    for r in rows:
        if r["config"] in ("default", "bulk"):
            print(f"{r['n']:>7}x{r['k']:<6} {r['weight_mb']:7.1f} {r['m']:>3} {r['tbps']:10.2f} {r['frac']:9.1%} "
                  f"{r['cublas_tbps']:11.2f} {r['speedup']:8.2f}x "
                  f"{'bulk.cu' if r['config'] == 'bulk' else 'kernel.cu':>9}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
