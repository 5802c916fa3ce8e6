"""Quantized decode GEMV (``codegen/kernels/gemv/quant.cu``) against cuBLASLt FP8 and cuBLAS bf16, on the H200.

    python bench/bench_gemv_quant.py                       # Llama-3.2-1B layer shapes, M = 1, 8, 32
    python bench/bench_gemv_quant.py --json out.json       # also one JSON object per line on stdout
    python bench/bench_gemv_quant.py --bulk                # also the bulk-copy FP8 variants (bulk.cu, INGOT_GEMV_BULK)
    python bench/bench_gemv_quant.py --kernel --formats fp8-w8a16 nvfp4-w4a16
                                                           # also kernel.cu's FP8 / NVFP4 variants
                                                           # (INGOT_GEMV_FP8=kernel, INGOT_GEMV_NVFP4=kernel)
    INGOT_GEMV_KW=all python bench/bench_gemv_quant.py --shapes "3072,2048;2048,2048;2048,8192" --m 1 8
                                                           # quant.cu's row groups (opt-in) beside kw1 rows
    python bench/bench_gemv_quant.py --sweep-kw --shapes "3072,2048;2048,2048" --m 1 8
                                                           # also other row-group configurations (kwarps)
    python bench/bench_gemv_quant.py --kernel --sweep-kernel --formats nvfp4-w4a16 --m 16 32
                                                           # also kernel.cu's other shapes and split-Ks
                                                           # (warps x steps x splits, cluster where it fits)
    python bench/bench_gemv_quant.py --dry-run --m 1 8     # CPU: print and compile the configurations, no GPU
    python bench/bench_gemv_quant.py --formats fp8-w8a8 --pair --m 8 16 32 64 128 256
                                                           # also W8A8's prefill pair (the activation quantizer +
                                                           # the FP8 CUTLASS GEMM, codegen/quant_prefill.py)
    python bench/bench_gemv_quant.py --formats fp8-w8a16 nvfp4-w4a16 --pair --m 64 128 256
                                                           # also weight-only's pair (dequantize + bf16 GEMM)

Formats: ``fp8-w8a16`` (FP8 weights, per-channel scales, bf16 activations), ``fp8-w8a8`` (plus per-token
dynamic FP8 activations, quantized inside the kernel), ``nvfp4-w4a16`` (NVFP4 weights, bf16 activations),
``fp8block-w8a16`` / ``fp8block-w8a8`` (FP8 weights with 128 x 128 block scales, ``fp8:block``).
Timing as ``bench_gemv.py``: ``--launches`` back-to-back launches captured in one CUDA graph, median over
``--reps`` replays, weights rotating over copies totalling >= 400 MB (every launch reads HBM). Weight bytes
count codes and scales. References measured in the same run and the same way: ``torch._scaled_mm`` (FP8 e4m3,
per-row activation x per-column weight scales, bf16 out; M padded to 16, cuBLASLt's minimum) and
``torch.matmul`` in bf16 on the same [N, K]. Each configuration is checked first against a float32 product of the
dequantized operands (outputs poisoned, launched twice). ``--bulk`` adds a ``fp8-w8a16-bulk`` row per shape and M
beside ``fp8-w8a16``: the bulk-copy variant (``codegen/kernels/gemv/bulk_rule.py``'s ``bulk_quant_spec``) on the
same weights, timed the same way; ``--kernel`` a ``fp8-w8a16-kernel`` row: ``kernel.cu`` with e4m3 weights
(``rule.gemv_spec(..., wb=1)``, what ``INGOT_GEMV_FP8=kernel`` compiles), and a ``nvfp4-w4a16-kernel`` row:
``kernel.cu`` with NVFP4 weights (``wb=rule.WB_NVFP4``, what ``INGOT_GEMV_NVFP4=kernel`` compiles). Where the
rule's configuration has row groups (warps sharing a CTA's rows, each a part of its K slice:
``quant_rule.QuantGemvConfig.kwarps``; quant.cu's are opt-in, ``INGOT_GEMV_KW=all``, until they have run on a GPU), a
``<format>-kw1`` row times the configuration the rule
gives without them (``INGOT_GEMV_KW=0``) in the same run; ``--sweep-kw`` adds other row-group shapes
(``<format>-w<warps> t<tiles> u<stage> sk<split> kw<kw>``). Every row records its ``config`` and ``kw``.
M above the largest bucket (64) times the any-M launch (``-any``: 64-token chunks, the weight read once per chunk),
what a W8A8 step of up to 256 rows runs. ``--pair`` adds a ``<format>-pair`` row beside each format: the prefill
pair of ``codegen/quant_prefill.py``, both launches in the timed graph, the shape-generic CUTLASS GEMM's Params
built in Python and prepared once per weight copy as the CUDA backend does. W8A8: the activation quantizer
(``quant_act/fp8.cu``) then the FP8 CUTLASS GEMM (its reference, ``torch._scaled_mm``, is given x already
quantized); weight-only FP8 / NVFP4: the dequantize launch (``dequant/kernel.cu``, the weight as bf16 into a scratch)
then the bf16 CUTLASS GEMM with the column scale in its epilogue.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_gemv import COPY_TBPS, ROTATE_BYTES, _cu, check, init_gpu, launch_kernel, time_graph  # noqa: E402

from ingot.codegen.kernels.gemm_cutlass.rule import Config  # noqa: E402

SHAPES = [(3072, 2048, "qkv"), (2048, 2048, "o"), (16384, 2048, "gate_up"), (2048, 8192, "down"),
          (128256, 2048, "lm_head")]
FORMATS = {"fp8-w8a16": ("fp8", "none"), "fp8-w8a8": ("fp8", "fp8"), "nvfp4-w4a16": ("nvfp4", "none"),
           "fp8block-w8a16": ("fp8_block", "none"), "fp8block-w8a8": ("fp8_block", "fp8")}
#: ``--kernel``: the formats kernel.cu also runs, with its ``wb`` (rule.gemv_spec)
KERNEL_WB = {"fp8-w8a16": 1, "nvfp4-w4a16": 0}


class SpecKernel:
    """A compiled spec launched on torch's current stream with arguments by parameter name (tensors, None, ints)."""

    def __init__(self, spec) -> None:
        from ingot.codegen.compile import compile_spec

        cu = _cu()
        self.spec = spec
        self.module = check(cu.cuModuleLoadData(compile_spec(spec).cubin))
        self.fn = check(cu.cuModuleGetFunction(self.module, spec.entry.encode()))
        if spec.smem > 48 * 1024:
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(cu.cuFuncSetAttribute(self.fn, attr, spec.smem))
        self.tma_region: tuple[int, int] | None = None

    def launch(self, pdl: bool = False, **args) -> None:
        import torch

        from ingot.runtime.kv_tma import tensor_maps

        # a tensor map over the KV cache or the weight, whenever that buffer lies outside the mapped region (the fill
        # is a synchronous copy, not captured in a graph: a graph's launches over several buffers need map_over first)
        for name, fill in tensor_maps(self.spec):
            buf = args[name]
            at, size = buf.data_ptr(), buf.numel() * buf.element_size()
            r = self.tma_region
            if r is None or not (r[0] <= at and at + size <= r[0] + r[1]):
                fill(self.module, self.spec, at, size)
                self.tma_region = (at, size)

        vals = []
        for p in self.spec.params:
            a = args[p.name]
            if p.ctype == "ptr":
                vals.append(ctypes.c_uint64(0 if a is None else a.data_ptr()))
            elif p.ctype == "i32":
                vals.append(ctypes.c_int32(int(a)))
            elif p.ctype == "i64":
                vals.append(ctypes.c_int64(int(a)))
            else:
                vals.append(ctypes.c_float(float(a)))
        ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        ints = {p.name: int(args[p.name]) for p in self.spec.params if p.ctype in ("i32", "i64")}
        grid = self.spec.grid_dims(ints)
        s = torch.cuda.current_stream().cuda_stream
        launch_kernel(self.fn, grid, self.spec.block, self.spec.smem, s, ctypes.addressof(ptrs), pdl)

    def map_over(self, buf) -> None:
        """Fill the kernel's tensor map over the whole of ``buf`` (e.g. every weight copy a graph rotates over, as one
        tensor), so launches on any part of it need no fill."""
        from ingot.runtime.kv_tma import tensor_maps

        for _, fill in tensor_maps(self.spec):
            self.tma_region = (buf.data_ptr(), buf.numel() * buf.element_size())
            fill(self.module, self.spec, *self.tma_region)


class CutlassPair:
    """A prefill pair for one shape and row count, launched like ``SpecKernel`` (the quantized GEMV's argument names):
    a first launch into its own scratch buffers (``first``), then a shape-generic CUTLASS GEMM (``kind``) on them,
    built and launched as the CUDA backend does (the layout's Params blob, prepared once per weight copy)."""

    def __init__(self, kind: str, n: int, k: int, m: int, tgt, config=None) -> None:
        import torch

        from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp

        cu = _cu()
        self.n, self.k, self.m = n, k, m
        self.gemm = cp.generic_linear_spec(kind, tgt, config=config or cp.shape_config(kind, n, k, tgt))
        built, self.layout = cp.build_linear(self.gemm)
        self.module = check(cu.cuModuleLoadData(built.cubin))
        self.fn = check(cu.cuModuleGetFunction(self.module, self.gemm.entry.encode()))
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(cu.cuFuncSetAttribute(self.fn, attr, int(self.layout["smem"])))
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.prepared: dict[tuple[int, int, int], object] = {}

    def first(self, args: dict) -> dict:
        """Launch the first kernel; the GEMM's pointers it leaves (x, weight, x_scale, weight_scale)."""
        raise NotImplementedError

    def launch(self, pdl: bool = False, **args) -> None:
        import torch

        from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp

        # plain launches, as the runtime's (neither first launch has a PDL prologue; the CUTLASS GEMM none either)
        ptrs = self.first(args)
        stream = torch.cuda.current_stream().cuda_stream
        key = (args["weight"].data_ptr(), args["out"].data_ptr(), stream)
        if key not in self.prepared:
            blob, config = cp.build_params(self.layout, {**ptrs, "out": args["out"].data_ptr()}, self.m, self.n,
                                           self.k, self.sms)
            self.prepared[key] = cp.PreparedLaunch(blob, config, stream)
        self.prepared[key](self.fn)


class CutlassGemm(CutlassPair):
    """The bf16 shape-generic CUTLASS GEMM alone (a bf16 ``linear``'s primary launch), as the CUDA backend runs it
    (``config``: another configuration than the runtime's for the shape)."""

    def __init__(self, n: int, k: int, m: int, tgt, config=None) -> None:
        super().__init__("bf16", n, k, m, tgt, config)

    def first(self, args: dict) -> dict:
        return {"x": args["x"].data_ptr(), "weight": args["weight"].data_ptr()}


class W8A8Pair(CutlassPair):
    """W8A8's prefill pair: the activation quantizer into its own x_fp8 / x_scale buffers, then the FP8 CUTLASS GEMM
    on them with the weight's per-channel scale."""

    def __init__(self, n: int, k: int, m: int, tgt, config=None) -> None:
        import torch

        from ingot.codegen.kernels.quant_act.rule import fp8_quantizer_spec

        super().__init__("fp8", n, k, m, tgt, config)
        self.quantizer = SpecKernel(fp8_quantizer_spec(k, tgt, False))
        self.x8 = torch.empty(m, k, device="cuda", dtype=torch.uint8)
        self.xs = torch.empty(m, device="cuda", dtype=torch.float32)

    def first(self, args: dict) -> dict:
        self.quantizer.launch(x=args["x"], input_scale=None, x_fp8=self.x8, x_scale=self.xs, M=self.m)
        return {"x": self.x8.data_ptr(), "weight": args["weight"].data_ptr(), "x_scale": self.xs.data_ptr(),
                "weight_scale": args["weight_scale"].data_ptr()}


class WeightOnlyPair(CutlassPair):
    """Weight-only FP8 / NVFP4's prefill pair (``codegen/quant_prefill.py``): the dequantize launch into a bf16 [N, K]
    scratch (NVFP4: and its f32 [N] column scale), then the bf16 CUTLASS GEMM with that column scale."""

    def __init__(self, wfmt: str, n: int, k: int, m: int, tgt) -> None:
        import torch

        from ingot.codegen.kernels.dequant.rule import dequant_spec

        super().__init__("bf16", n, k, m, tgt)
        self.dequant = SpecKernel(dequant_spec(wfmt, n, k, tgt))
        self.scratch = torch.empty(n, k, device="cuda", dtype=torch.bfloat16)
        self.scale = torch.empty(n, device="cuda", dtype=torch.float32) if wfmt != "fp8" else None

    def first(self, args: dict) -> dict:
        self.dequant.launch(weight=args["weight"], weight_scale=args["weight_scale"],
                            weight_scale_2=args["weight_scale_2"], out=self.scratch, out_scale=self.scale, M=self.m)
        scale = args["weight_scale"] if self.scale is None else self.scale
        return {"x": args["x"].data_ptr(), "weight": self.scratch.data_ptr(), "weight_scale": scale.data_ptr()}


def make_weights(fmt: str, n: int, k: int, copies: int, gen):
    """Device copies of a random quantized weight: (list of {weight, weight_scale, weight_scale_2}, f32 dequant of
    copy 0). Codes and scales are drawn directly (uniform codes, positive scales), then dequantized in torch."""
    import torch

    out = []
    for _ in range(copies):
        if fmt in ("fp8", "fp8_block"):
            w = (torch.randn(n, k, device="cuda", generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
            shape = (n,) if fmt == "fp8" else (-(-n // 128), k // 128)
            s = torch.rand(*shape, device="cuda", generator=gen) * 1e-3 + 1e-4
            out.append({"weight": w, "weight_scale": s, "weight_scale_2": None})
        else:
            w = torch.randint(0, 256, (n, k // 2), device="cuda", generator=gen, dtype=torch.uint8)
            sf = (torch.rand(n, k // 16, device="cuda", generator=gen) * 400 + 1).to(torch.float8_e4m3fn)
            gs = torch.tensor([1e-4], device="cuda")
            out.append({"weight": w, "weight_scale": sf, "weight_scale_2": gs})
    return out, dequant(fmt, out[0], k)


def dequant(fmt: str, wq: dict, k: int):
    import torch

    if fmt == "fp8":
        return wq["weight"].float() * wq["weight_scale"][:, None]
    if fmt == "fp8_block":
        n = wq["weight"].shape[0]
        blocks = wq["weight_scale"].repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
        return wq["weight"].float() * blocks
    lut = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], device="cuda")
    b = wq["weight"].long()
    codes = torch.stack([b & 15, b >> 4], dim=-1).reshape(b.shape[0], k)
    v = lut[codes].reshape(b.shape[0], k // 16, 16) * wq["weight_scale"].float()[..., None]
    return v.reshape(b.shape[0], k) * wq["weight_scale_2"]


#: --sweep-kernel: kernel.cu's (warps, steps a stage) shapes, each with these split-K counts, reduced in a cluster
#: where that fits and through the workspace
KERNEL_SWEEP_SHAPES = ((4, 1), (4, 2), (4, 4), (4, 8), (8, 1), (8, 2), (8, 4), (8, 8))
KERNEL_SWEEP_SPLITS = (1, 2, 4, 8, 16)


def kernel_configs(n: int, k: int, mb: int, wb: int) -> list:
    """(name, GemvConfig) of kernel.cu for ``--sweep-kernel``: the rule's, then ``KERNEL_SWEEP_SHAPES`` x
    ``KERNEL_SWEEP_SPLITS`` without row groups, each reduced in a cluster (where ``cluster_fits``) and through the
    workspace; duplicates and grids of fewer than 32 or more than 16 CTAs an SM skipped."""
    import dataclasses

    from ingot.codegen.kernels.gemv.rule import cluster_fits, gemv_config

    base = gemv_config(n, k, mb, 132, wb=wb)
    out, seen = [("kernel", base)], {base}
    for warps, u in KERNEL_SWEEP_SHAPES:
        for sk in KERNEL_SWEEP_SPLITS:
            try:
                c = gemv_config(n, k, mb, 132, warps=warps, tiles=1, stage_steps=u, splitk=sk, kwarps=1, wb=wb,
                                cluster=False)
            except ValueError:
                continue
            ctas = -(-n // (16 * warps)) * c.splitk
            if c.splitk != sk or not 32 <= ctas <= 16 * 132:
                continue
            for cl in ((True, False) if cluster_fits(mb, c, wb) else (False,)):
                v = dataclasses.replace(c, cluster=cl)
                if v not in seen:
                    seen.add(v)
                    out.append((f"kernel w{warps} u{u} sk{v.splitk}" + (" cl" if cl else ""), v))
    return out


#: --sweep-kw: (warps, tiles, steps a stage, warps a row group), each with split-K 1 and 2
KW_SWEEP = ((4, 1, 8, 4), (4, 1, 8, 2), (4, 1, 4, 4), (8, 1, 4, 8), (8, 1, 4, 4), (8, 2, 2, 8))


def configs(n: int, k: int, mb: int, wfmt: str, act: str, sweep_kw: bool = False) -> list:
    """(name, QuantGemvConfig) to time: the rule's ("default"); where it has row groups, the rule's without them
    ("kw1", as ``INGOT_GEMV_KW=0``); with ``sweep_kw`` other row-group configurations (invalid ones skipped)."""
    from ingot.codegen.kernels.gemv.quant_rule import quant_config

    base = quant_config(n, k, mb, wfmt, act, 132)
    out = [("default", base)]
    if base.kwarps > 1:
        out.append(("kw1", quant_config(n, k, mb, wfmt, act, 132, kwarps=1)))
    if sweep_kw:
        seen = {c for _, c in out}
        for warps, mt, u, kw in KW_SWEEP:
            for sk in (1, 2):
                try:
                    c = quant_config(n, k, mb, wfmt, act, 132, warps=warps, tiles=mt, stage_steps=u, splitk=sk,
                                     kwarps=kw)
                except ValueError:  # the x slice or the row group's partials do not fit
                    continue
                if c not in seen:
                    seen.add(c)
                    out.append((f"w{warps} t{mt} u{c.stage_steps} sk{c.splitk} kw{kw}", c))
    return out


def dry_run(shapes, ms: list[int], fmts: list[str], tgt, sweep_kw: bool, kernel: bool = False,
            sweep_kernel: bool = False) -> None:
    """CPU: each configuration the bench would time, its spec built and compiled (no GPU, no torch)."""
    from ingot.codegen.compile import compile_spec
    from ingot.codegen.kernels.gemv.quant_rule import quant_gemv_spec
    from ingot.codegen.kernels.gemv.rule import BUCKETS, gemv_spec

    for n, k, name in shapes:
        for m in ms:
            mb = next((b for b in BUCKETS if b >= m), None)
            for label in fmts:
                wfmt, act = FORMATS[label]
                todo = ([(cname, quant_gemv_spec(n, k, mb, tgt, wfmt, act, "token", config=cfg))
                         for cname, cfg in configs(n, k, mb, wfmt, act, sweep_kw)] if mb is not None else
                        [("any", quant_gemv_spec(n, k, BUCKETS[-1], tgt, wfmt, act, "token", any_m=True))])
                if kernel and label in KERNEL_WB and mb is not None:
                    todo += ([(cname, gemv_spec(n, k, mb, tgt, config=cfg, wb=KERNEL_WB[label]))
                              for cname, cfg in kernel_configs(n, k, mb, KERNEL_WB[label])] if sweep_kernel
                             else [("kernel", gemv_spec(n, k, mb, tgt, wb=KERNEL_WB[label]))])
                for cname, spec in todo:
                    compile_spec(spec)
                    print(f"{name:>8} {n:>6}x{k:<5} M={m:<3} {label:<12} {cname:<22} {spec.doc} "
                          f"grid {spec.grid_dims({'M': m})}", flush=True)


def quantize_x(x):
    """Per-token FP8 as quantized_linear's reference: scale = amax / 448 (1 if zero), q = e4m3(x / scale)."""
    import torch

    xf = x.float()
    s = xf.abs().amax(dim=1, keepdim=True) / 448.0
    s = torch.where(s > 0, s, torch.ones_like(s))
    return (xf / s).clamp(-448, 448).to(torch.float8_e4m3fn), s


def bench_shape(n: int, k: int, name: str, ms: list[int], fmts: list[str], launches: int, reps: int, gen, tgt,
                emit, pdl: bool = True, bulk: bool = False, sweep_kw: bool = False,
                kernel: bool = False, sweep_kernel: bool = False, pair: bool = False,
                short_m: bool = False) -> list[dict]:
    import torch

    from ingot.codegen.kernels.gemv.quant_rule import quant_gemv_spec, weight_bytes_per_row
    from ingot.codegen.kernels.gemv.rule import BUCKETS

    rows = []
    # the references: bf16 matmul and FP8 _scaled_mm (row/col scales), over rotating copies
    bf_copies = max(1, -(-ROTATE_BYTES // (n * k * 2)))
    wbf = [(torch.randn(n, k, device="cuda", generator=gen) * 0.05).to(torch.bfloat16) for _ in range(bf_copies)]
    f8_copies = max(1, -(-ROTATE_BYTES // (n * k)))
    w8 = [(torch.randn(n, k, device="cuda", generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
          for _ in range(f8_copies)]
    wscale = torch.rand(1, n, device="cuda", generator=gen) + 0.5
    for m in ms:
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        t_bf16 = time_graph(lambda i, x=x: torch.matmul(x, wbf[i % bf_copies].t()), launches, reps)
        m16 = max(16, -(-m // 16) * 16)
        x8 = torch.randn(m16, k, device="cuda", generator=gen).clamp(-448, 448).to(torch.float8_e4m3fn)
        xs = torch.rand(m16, 1, device="cuda", generator=gen) + 0.5
        t_fp8 = None
        try:
            t_fp8 = time_graph(lambda i, x8=x8, xs=xs: torch._scaled_mm(
                x8, w8[i % f8_copies].t(), scale_a=xs, scale_b=wscale, out_dtype=torch.bfloat16), launches, reps)
        except Exception as e:  # noqa: BLE001 - the reference missing is reported, not fatal
            print(f"  torch._scaled_mm failed for {n}x{k} M={m16}: {e}", flush=True)
        for label in fmts:
            wfmt, act = FORMATS[label]
            nbytes = n * weight_bytes_per_row(wfmt, k)
            copies = max(1, -(-ROTATE_BYTES // nbytes))
            wq, wf = make_weights(wfmt, n, k, copies, gen)
            mb = next((b for b in BUCKETS if b >= m), None)
            if mb is None:  # past the buckets: the any-M launch (64-token chunks)
                mb = BUCKETS[-1]
                todo = [(f"{label}-any", "any", 1, quant_gemv_spec(n, k, mb, tgt, wfmt, act, "token", any_m=True))]
            else:
                todo = [(label if cname == "default" else f"{label}-{cname}", cname, cfg.kwarps,
                         quant_gemv_spec(n, k, mb, tgt, wfmt, act, "token", config=cfg))
                        for cname, cfg in configs(n, k, mb, wfmt, act, sweep_kw)]
            if pair:
                todo.append((f"{label}-pair", "pair", 1, None))
            if short_m and act == "fp8":  # W8A8's pair with the short-step FP8 configurations
                from ingot.codegen.kernels.gemm_cutlass.rule import SM90_SHORT_M, config_tag

                todo += [(f"{label}-pair-{config_tag(c)}", config_tag(c), 1, c) for c in SM90_SHORT_M["fp8"]]
            if bulk and label == "fp8-w8a16":
                from ingot.codegen.kernels.gemv.bulk_rule import bulk_quant_spec

                bspec = bulk_quant_spec(n, k, mb, tgt)
                if bspec is not None:
                    todo.append((label + "-bulk", "bulk", 1, bspec))
            if kernel and label in KERNEL_WB:
                from ingot.codegen.kernels.gemv.rule import gemv_spec

                if sweep_kernel:
                    for cname, cfg in kernel_configs(n, k, mb, KERNEL_WB[label]):
                        kspec = gemv_spec(n, k, mb, tgt, config=cfg, wb=KERNEL_WB[label])
                        todo.append((f"{label}-{cname}".replace(" ", "-"), cname, kspec.value("KW"), kspec))
                else:
                    kspec = gemv_spec(n, k, mb, tgt, wb=KERNEL_WB[label])
                    todo.append((label + "-kernel", "kernel", kspec.value("KW"), kspec))
            for variant, cname, kw, spec in todo:
                if spec is None or isinstance(spec, Config):  # a pair, ``spec`` its GEMM's configuration if any
                    kern = W8A8Pair(n, k, m, tgt, spec) if act == "fp8" else WeightOnlyPair(wfmt, n, k, m, tgt)
                    spec = kern.gemm
                else:
                    kern = SpecKernel(spec)
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                if act == "fp8":
                    q, s = quantize_x(x)
                    ref = (q.float() * s) @ wf.t()
                else:
                    ref = x.float() @ wf.t()
                err = 0.0
                for _ in range(2):
                    out.fill_(float("nan"))
                    kern.launch(x=x, weight=wq[0]["weight"], weight_scale=wq[0]["weight_scale"],
                                weight_scale_2=wq[0]["weight_scale_2"], input_scale=None, bias=None, residual=None,
                                out=out, M=m)
                    torch.cuda.synchronize()
                    err = max(err, float((out.float() - ref).abs().max() / ref.abs().max()))

                def ours(i: int, kern=kern, x=x, out=out, m=m, wq=wq, copies=copies, pdl=False) -> None:
                    c = wq[i % copies]
                    kern.launch(x=x, weight=c["weight"], weight_scale=c["weight_scale"],
                                weight_scale_2=c["weight_scale_2"], input_scale=None, bias=None, residual=None,
                                out=out, M=m, pdl=pdl)

                # PDL launches as the runtime does (codegen/kernel.py), plain launches beside them
                t_plain = time_graph(ours, launches, reps)
                t = time_graph(lambda i: ours(i, pdl=True), launches, reps) if pdl else t_plain
                tbps = nbytes / t / 1e12
                row = {"bench": "gemv_quant", "shape": name, "n": n, "k": k, "m": m, "format": variant, "mb": mb,
                       "config": cname, "kw": kw, "splitk": dict(spec.values).get("SPLITK"), "weight_mb": nbytes / 1e6,
                       "us": t * 1e6, "tbps": tbps,
                       "frac_of_4.19": tbps / COPY_TBPS, "rel_err": err, "pdl": pdl, "plain_us": t_plain * 1e6,
                       "bf16_matmul_us": t_bf16 * 1e6, "bf16_matmul_tbps": n * k * 2 / t_bf16 / 1e12,
                       "scaled_mm_m": m16, "scaled_mm_us": None if t_fp8 is None else t_fp8 * 1e6,
                       "scaled_mm_tbps": None if t_fp8 is None else n * k / t_fp8 / 1e12,
                       "speedup_vs_scaled_mm": None if t_fp8 is None else t_fp8 / t, "speedup_vs_bf16": t_bf16 / t}
                rows.append(row)
                emit(row)
                if not err < 1e-2:
                    print(f"  ** {variant} {n}x{k} M={m}: relative error {err:.3e}", flush=True)
            del wq, wf
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    ap.add_argument("--shapes", default="", help="N,K;N,K (default: the 1B model's)")
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--bulk", action="store_true",
                    help="also the bulk-copy FP8 weight-only variants (bulk.cu), a fp8-w8a16-bulk row each")
    ap.add_argument("--kernel", action="store_true",
                    help="also kernel.cu's FP8 / NVFP4 weight-only variants (INGOT_GEMV_FP8=kernel, "
                         "INGOT_GEMV_NVFP4=kernel): fp8-w8a16-kernel / nvfp4-w4a16-kernel rows")
    ap.add_argument("--no-pdl", dest="pdl", action="store_false",
                    help="plain launches only (default: programmatic dependent launch as the runtime, plain beside)")
    ap.add_argument("--sweep-kw", action="store_true",
                    help="also other row-group configurations (warps sharing a CTA's rows, splitting its K slice)")
    ap.add_argument("--sweep-kernel", action="store_true",
                    help="with --kernel: kernel.cu's variants over warps / stage / split-K / cluster configurations "
                         "(KERNEL_SWEEP_SHAPES x KERNEL_SWEEP_SPLITS) instead of the rule's alone")
    ap.add_argument("--pair", action="store_true",
                    help="also the prefill pair (W8A8: activation quantizer + FP8 CUTLASS GEMM; weight-only: "
                         "dequantize + bf16 CUTLASS GEMM), -pair rows")
    ap.add_argument("--short-m", action="store_true",
                    help="W8A8 formats: also the pair with each of gemm_cutlass/rule.py's SM90_SHORT_M FP8 "
                         "configurations (steps of 65-256 rows), -pair-TAG rows")
    ap.add_argument("--dry-run", action="store_true",
                    help="print and compile each configuration that would be timed (no GPU, no torch), then exit")
    a = ap.parse_args(argv)
    from ingot.codegen.target import get_target

    tgt = get_target("h200")
    shapes = ([(*(int(v) for v in s.split(",")), s) for s in a.shapes.split(";")] if a.shapes else SHAPES)
    if a.dry_run:
        dry_run(shapes, a.m, a.formats, tgt, a.sweep_kw, a.kernel, a.sweep_kernel)
        return 0
    import torch

    init_gpu()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict] = []

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)

    for n, k, name in shapes:
        rows += bench_shape(n, k, name, a.m, a.formats, a.launches, a.reps, gen, tgt, emit, a.pdl, a.bulk,
                            a.sweep_kw, a.kernel, a.sweep_kernel, a.pair, a.short_m)
        torch.cuda.empty_cache()
    print("\nsummary: ingot TB/s of weight bytes (fraction of 4.19) | _scaled_mm fp8 TB/s | bf16 matmul TB/s")
    for r in rows:
        ref = "n/a" if r["scaled_mm_tbps"] is None else f"{r['scaled_mm_tbps']:.2f}"
        print(f"{r['shape']:>8} {r['n']:>6}x{r['k']:<5} M={r['m']:<3} {r['format']:<14} kw{r['kw']} {r['tbps']:5.2f} "
              f"({r['frac_of_4.19']:5.1%}) | {ref:>5} | {r['bf16_matmul_tbps']:5.2f}  err {r['rel_err']:.1e}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
