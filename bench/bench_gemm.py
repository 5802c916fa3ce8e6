"""Prefill GEMMs on sm_90a: ingot's CUTLASS wgmma kernels vs cuBLAS (bf16) and cuBLASLt (fp8), same run.

    python bench/bench_gemm.py --build /tmp/gemm_kernels          # CPU machine: build every candidate (nvcc)
    python bench/bench_gemm.py --kernels /tmp/gemm_kernels        # H200: check and time them
    python bench/bench_gemm.py                                    # both, where nvcc, CUTLASS and a GPU are

What is timed: ``out[M, N] = x[M, K] @ w[N, K]^T`` with bf16 output, on square 4096/8192 problems and on
the Llama-3.2-1B layer shapes at M = 8192 prefill tokens (qkv 3072x2048, o 2048x2048, gate+up 16384x2048,
down 2048x8192), for

- ``bf16``: bf16 x and w; reference ``torch.matmul(x, w.T)`` (cuBLAS);
- ``fp8-row``: e4m3 x with a per-token scale f32[M], e4m3 w with a per-channel scale f32[N]; reference
  ``torch._scaled_mm(x, w.T, scale_a=[M, 1], scale_b=[1, N], out_dtype=bf16)`` (rowwise scaling);
- ``fp8-tensor``: the same with one scale per tensor; reference ``torch._scaled_mm`` with scalar scales
  (cuBLASLt);
- ``fp8-row-fast``, ``fp8-tensor-fast``: the same with ``use_fast_accum=True`` against ingot's FP8FastAccum
  candidates (no periodic promotion of the FP8 MMAs' partial sums to f32), the plain modes against the rest.
  ingot's builds read x's scale as an [M] vector (the scalar broadcast); the weight's as an [N] vector too, or, in
  the builds made with ``--weight-scales tensor`` (``linear_cutlass_spec(..., weight_scales="tensor")``, candidates
  ``TAG+wt``, tensorwise modes only), as the one f32 cuBLASLt gets;
- ``fp8-block``: DeepSeek-V3's block scaling, x's scale per row and 128 columns of K, w's per 128 x 128 block;
  reference ``torch._scaled_mm`` with 1x128 and 128x128 scales (cuBLASLt's block-scaled kernels, CUDA 12.9+), against
  the builds made with ``--weight-scales block`` (``TAG+wb``: the scales applied as each k-tile is promoted).
  M, N and K multiples of 128, K of 512 (cuBLASLt's scale layouts without padding).

Every candidate configuration of ``gemm_cutlass/rule.py`` (``SM90_CANDIDATES``, then ``SM90_EXPLORE``: tile,
cluster, schedule; FP8 promotion overlapped or not, raster order, epilogue subtile) is one shape-generic build (the
shim's ``_prepare_nk``): 25 on h200, about 5-8 minutes with ``INGOT_CUTLASS_JOBS=12`` on 16 cores (each nvcc job
takes one core and 3-5 GB). Each is first checked against an f32 matmul of
the same (dequantized) operands on fresh random inputs, output poisoned with NaN before the run; a
candidate that fails the check is reported and not timed. Timing: ``--iters`` back-to-back launches
captured in one CUDA graph, replayed ``--reps`` times between CUDA events, median per launch. The
candidates are screened that way; the ``--top`` fastest (3) are then timed again against the reference with their
graph replays interleaved (``2 * --reps`` each), and the reference's median and the fastest finalist's are the
figures reported (a single screen run is noisy enough to rank two close candidates either way), the winner
timed against the reference once more in a fresh interleaved round so that picking it brings no luck of its own.
``--sustain S`` then runs the reference and the winner each alone for S seconds while nvidia-smi samples the SM
clock and the power draw: whether a gap is the kernels' or the clocks they sustain under the power limit.
``--sustain-all S`` runs the reference and every candidate that passed that way, S seconds each, in two rounds (the
second in reverse order), and reports each one's mean: FP8 GEMMs run at the H200's power limit (690 W) within a
second, so this is their steady rate in a long prefill, which short graph replays (a few ms each, the clock still
settling) rank differently from run to run.
Each sm90 build runs with the tile scheduler's max swizzle the runtime would give it (the build's own, or
``rule.auto_swizzle``'s per problem; the JSON's ``runtime_swizzle``); ``--swizzles 1,8`` times each build at each
of those instead (candidates ``TAG@s1``, ``TAG@s8``: the swizzle is host-side Params, one cubin serves all).
Printed: TFLOP/s of the reference and of ingot's best
candidate, their ratio, and each as a fraction of the measured ceilings (747 TFLOP/s bf16, 1363 fp8;
``shared/GPU.md``). ``--out FILE`` writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_gemv import capture_graph, replay_seconds, time_graph  # noqa: E402

CEILING_TFLOPS = {"bf16": 747.0, "fp8": 1363.0}
SQUARE = ((4096, 4096, 4096), (8192, 8192, 8192))
LLAMA_1B_PREFILL = ((8192, 3072, 2048), (8192, 2048, 2048), (8192, 16384, 2048), (8192, 2048, 8192))
MODES = ("bf16", "fp8-row", "fp8-tensor", "fp8-row-fast", "fp8-tensor-fast", "fp8-block")
#: ``--weight-scales`` -> the candidate tag's suffix
SCALE_TAGS = {"tensor": "+wt", "block": "+wb"}


def _kind(mode: str) -> str:
    return "bf16" if mode == "bf16" else "fp8"


def _fits(mode: str, config: str) -> bool:
    """FP8 modes ending in ``-fast`` compare the FastAccum candidates with ``use_fast_accum=True``, the others the
    candidates that promote partial sums to f32 (CUTLASS's default, or ingot's overlapped promotion: ``ov``) with
    ``use_fast_accum=False``. ``config`` is the tag (``rule.config_tag``): schedule letters, then the tile."""
    schedule = re.match(r"[a-z]*", config).group(0)  # e.g. "coop", "coopfa", "ppov"
    if config.endswith("+wt") and not mode.startswith("fp8-tensor"):
        return False  # one weight scale: the tensorwise modes only
    if config.endswith("+wb") != (mode == "fp8-block"):
        return False  # block scales: their own builds, and those only
    return _kind(mode) == "bf16" or (schedule.endswith("fa") == mode.endswith("-fast"))


# -- build (CPU machine) ----------------------------------------------------------------------------


def build(out_dir: Path, target_name: str = "h200", kinds: tuple[str, ...] = ("bf16", "fp8"),
          only: tuple[str, ...] = (), weight_scales: tuple[str, ...] = ()) -> dict[str, Any]:
    """Build every candidate's cubin and host shim into ``out_dir`` with a ``manifest.json`` (``only``: just the
    configurations with these tags, ``rule.config_tag``; ``weight_scales``: each FP8 one again with these weight
    scales, ``tensor`` (tag ``TAG+wt``) and ``block`` (``TAG+wb``, the configurations that have such a build)."""
    from ingot.codegen.kernels.gemm_cutlass.build import build_shim, compile_cutlass
    from ingot.codegen.kernels.gemm_cutlass.rule import (
        bench_configs,
        config_tag,
        linear_cutlass_spec,
        weight_scales_reason,
    )
    from ingot.codegen.target import get_target

    target = get_target(target_name)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(kind, cfg, scales) for kind in kinds for cfg in bench_configs(kind, target)
            for scales in ("channel", *(weight_scales if kind == "fp8" else ()))
            if (not only or config_tag(cfg) in only) and not weight_scales_reason(kind, cfg, scales)]
    unknown = set(only) - {config_tag(cfg) for _, cfg, _ in jobs}
    if unknown:
        raise SystemExit(f"bench_gemm --only: no {'/'.join(kinds)} configuration named {sorted(unknown)}")

    def one(job: tuple[str, Any, str]) -> dict[str, Any]:
        kind, cfg, scales = job
        spec = linear_cutlass_spec(kind, 0, 0, target, config=cfg, weight_scales=scales)
        kernel = compile_cutlass(spec)
        shim = build_shim(spec)
        (out_dir / f"{spec.entry}.cubin").write_bytes(kernel.cubin)
        shutil.copyfile(shim, out_dir / f"{spec.entry}.so")
        tag = config_tag(cfg) + SCALE_TAGS.get(scales, "")
        print(f"built {kind} {tag} ({spec.entry})", flush=True)
        return {"kind": kind, "config": tag, "entry": spec.entry, "spec": spec.to_dict(with_doc=False),
                "weight_scales": scales}

    with ThreadPoolExecutor(max_workers=max(1, int(os.environ.get("INGOT_CUTLASS_JOBS", "2")))) as pool:
        entries = list(pool.map(one, jobs))
    manifest = {"target": target_name, "arch": target.arch, "kernels": entries}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


# -- run (GPU machine) -----------------------------------------------------------------------------


def _spec_from_dict(d: dict[str, Any]) -> Any:
    from ingot.codegen.kernel import KernelSpec

    return KernelSpec.from_dict(d)


def _operands(torch: Any, mode: str, m: int, n: int, k: int, gen: Any) -> dict[str, Any]:
    """Fresh random operands, the reference callable and the f32 check of one problem."""
    dev = "cuda"
    x = torch.randn(m, k, device=dev, generator=gen)
    w = torch.randn(n, k, device=dev, generator=gen) * (0.5 + torch.rand(n, 1, device=dev, generator=gen))
    if mode == "bf16":
        xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
        return {"x": xb, "w": wb, "xs": None, "ws": None, "ref": lambda: torch.matmul(xb, wb.t()),
                "exact": lambda: xb.float() @ wb.float().t(), "ref_name": "cuBLAS torch.matmul"}
    f8 = torch.float8_e4m3fn
    fmax = torch.finfo(f8).max
    if mode == "fp8-block":  # x per row and 128 columns, w per 128 x 128 block (M, N, K multiples of 128)
        kb = k // 128
        xs = x.abs().reshape(m, kb, 128).amax(dim=2).clamp(min=1e-12) / fmax  # [M, KB]
        ws = w.abs().reshape(n // 128, 128, kb, 128).amax(dim=(1, 3)).clamp(min=1e-12) / fmax  # [NB, KB]
        xs_full, ws_full = xs.repeat_interleave(128, 1), ws.repeat_interleave(128, 0).repeat_interleave(128, 1)
        x8 = (x / xs_full).clamp(-fmax, fmax).to(f8)
        w8 = (w / ws_full).clamp(-fmax, fmax).to(f8)
        xs_cm = xs.float().t().contiguous()  # [KB, M]: cuBLASLt's [M, KB] with strides (1, M), ingot's x_scale
        ws_rm = ws.float().contiguous()  # [NB, KB]: cuBLASLt's [KB, NB] with strides (1, KB), ingot's weight_scale
        w8t = w8.t()

        def ref_block() -> Any:
            return torch._scaled_mm(x8, w8t, scale_a=xs_cm.t(), scale_b=ws_rm.t(), out_dtype=torch.bfloat16)

        def exact_block() -> Any:
            return (x8.float() * xs_full) @ (w8.float() * ws_full).t()

        return {"x": x8, "w": w8, "xs": xs_cm, "ws": ws_rm, "ref": ref_block,
                "exact": exact_block, "ref_name": "torch._scaled_mm 1x128 x 128x128 blocks (cuBLASLt)"}
    if mode.startswith("fp8-row"):
        xs = x.abs().amax(dim=1).clamp(min=1e-12) / fmax
        ws = w.abs().amax(dim=1).clamp(min=1e-12) / fmax
    else:
        xs = (x.abs().amax() / fmax).expand(m).contiguous()
        ws = (w.abs().amax() / fmax).expand(n).contiguous()
    x8 = (x / xs[:, None]).clamp(-fmax, fmax).to(f8)
    w8 = (w / ws[:, None]).clamp(-fmax, fmax).to(f8)
    xs, ws = xs.float().contiguous(), ws.float().contiguous()
    fast = mode.endswith("-fast")
    if mode.startswith("fp8-row"):
        sa, sb = xs[:, None].contiguous(), ws[None, :].contiguous()
        name = "torch._scaled_mm rowwise"
    else:
        sa, sb = xs[:1].reshape(()).contiguous(), ws[:1].reshape(()).contiguous()
        name = "torch._scaled_mm tensorwise (cuBLASLt)"
    name += ", use_fast_accum" if fast else ""
    w8t = w8.t()

    def ref() -> Any:
        return torch._scaled_mm(x8, w8t, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast)

    def exact() -> Any:
        return (x8.float() * xs[:, None]) @ (w8.float() * ws[:, None]).t()

    return {"x": x8, "w": w8, "xs": xs, "ws": ws, "ws_scalar": ws[:1].contiguous(), "ref": ref, "exact": exact,
            "ref_name": name}


def _graph_time(fn: Any, iters: int, reps: int) -> float:
    """Median seconds per call of ``fn``: ``iters`` calls in one CUDA graph, replayed ``reps`` times."""
    return time_graph(lambda i: fn(), iters, reps)


def interleaved_order(n: int, reps: int) -> list[int]:
    """The replay order of ``n`` graphs over ``reps`` rounds: forward, then backward (A B, B A, A B, ...), so that
    no graph always runs first after the host's synchronization (when the clock may have risen) or right after the
    same neighbour."""
    return [i for r in range(reps) for i in (range(n) if r % 2 == 0 else range(n - 1, -1, -1))]


def _ab_time(fns: list[Any], iters: int, reps: int) -> list[float]:
    """Median seconds per call of each of ``fns``, their graph replays interleaved (``interleaved_order``) so clock
    and temperature drift over the run reach every one alike."""
    graphs = [capture_graph(lambda i, fn=fn: fn(), iters) for fn in fns]
    times: list[list[float]] = [[] for _ in fns]
    for i in interleaved_order(len(graphs), reps):
        times[i].append(replay_seconds(graphs[i], iters))
    return [statistics.median(t) for t in times]


def parse_smi(text: str) -> tuple[list[float], list[float]]:
    """SM clocks (MHz) and power draws (W) from ``nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,
    nounits`` lines (``1980, 652.31``); lines that do not parse (``[N/A]``, a partial last line) are skipped."""
    clocks, powers = [], []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            clock, power = float(parts[0]), float(parts[1])
        except (IndexError, ValueError):
            continue
        clocks.append(clock)
        powers.append(power)
    return clocks, powers


def _smi_start(query: str) -> subprocess.Popen | None:
    """``nvidia-smi`` sampling ``query`` (``--query-gpu`` fields) of the current device every 100 ms as CSV without
    header or units; None without nvidia-smi. ``_smi_stop`` ends it and returns its lines."""
    import torch

    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    return subprocess.Popen([smi, f"--query-gpu={query}", "--format=csv,noheader,nounits", "-lms", "100", "-i",
                             str(torch.cuda.current_device())], stdout=subprocess.PIPE, text=True)


def _smi_stop(proc: subprocess.Popen | None) -> str:
    if proc is None:
        return ""
    proc.terminate()
    return proc.communicate(timeout=30)[0]


def _sustained(fn: Any, iters: int, seconds: float, sample: bool = True) -> dict[str, Any]:
    """``fn`` back to back for ``seconds`` (a CUDA graph of ``iters`` launches replayed, after half a second of warm-up)
    while ``nvidia-smi`` samples the SM clock and the power draw every 100 ms: seconds per launch over the whole run
    and the samples' medians. Without nvidia-smi (or ``sample`` False) only the time."""
    import time

    import torch

    g = capture_graph(lambda i: fn(), iters)
    proc = _smi_start("clocks.sm,power.draw") if sample else None
    try:
        t_end = time.perf_counter() + 0.5
        while time.perf_counter() < t_end:  # synchronized: an unbounded queue of replays would run on for seconds
            g.replay()
            torch.cuda.synchronize()
        start, launches = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            g.replay()
            launches += iters
            if launches % (iters * 8) == 0:
                torch.cuda.synchronize()  # keep the queue short, so the time is the GPU's
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    finally:
        text = _smi_stop(proc)
    out: dict[str, Any] = {"seconds": elapsed, "launches": launches, "per_launch_s": elapsed / launches}
    clocks, powers = parse_smi(text)
    if clocks:
        out |= {"sm_clock_mhz": statistics.median(clocks), "power_w": statistics.median(powers),
                "samples": len(clocks)}
    return out


def samples_in_windows(text: str, windows: list[tuple[str, Any, Any]]) -> dict[str, list[tuple[float, float]]]:
    """(SM clock MHz, power W) samples of ``nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader,
    nounits`` lines (``2026/12/02 11:39:20.123, 1980, 652.31``) by the window (name, start, end datetimes) each falls
    in; lines that do not parse are skipped, every name of ``windows`` is a key."""
    import datetime

    out: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in windows}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            when = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
            clock, power = float(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            continue
        for name, t0, t1 in windows:
            if t0 <= when <= t1:
                out[name].append((clock, power))
    return out


def _sustain_all(fns: dict[str, Any], iters: int, seconds: float, flops: float) -> dict[str, dict[str, Any]]:
    """Each of ``fns`` alone for ``seconds`` (``_sustained``), in two rounds, the second in reverse order: TFLOP/s
    over both, and the median SM clock and power of the samples taken while each ran (one nvidia-smi for the whole
    call: starting one a run costs seconds)."""
    import datetime

    proc = _smi_start("timestamp,clocks.sm,power.draw")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in fns}
    windows: list[tuple[str, datetime.datetime, datetime.datetime]] = []
    try:
        for order in (list(fns), list(fns)[::-1]):
            for name in order:
                t0 = datetime.datetime.now()
                runs[name].append(_sustained(fns[name], iters, seconds, sample=False))
                windows.append((name, t0 + datetime.timedelta(seconds=0.6), datetime.datetime.now()))
    finally:
        text = _smi_stop(proc)
    samples = samples_in_windows(text, windows)
    out: dict[str, dict[str, Any]] = {}
    for name, rs in runs.items():
        per_launch = sum(r["seconds"] for r in rs) / sum(r["launches"] for r in rs)
        out[name] = {"tflops": flops / per_launch / 1e12}
        if samples[name]:
            out[name] |= {"sm_clock_mhz": statistics.median(c for c, _ in samples[name]),
                          "power_w": statistics.median(p for _, p in samples[name]), "samples": len(samples[name])}
    return out


def _close(torch: Any, got: Any, exact: Any) -> tuple[bool, float]:
    if not bool(torch.isfinite(got).all()):
        return False, float("nan")
    err = (got.float() - exact).abs().max().item() / max(exact.abs().max().item(), 1e-30)
    return err < 1.5e-2, err  # bf16 output rounding is 2^-9 of each value; K-long f32 sums add a little


def run(kernel_dir: Path, shapes: list[tuple[int, int, int]], modes: list[str], iters: int, reps: int,
        seed: int, top: int = 1, sustain: float = 0.0, sustain_all: float = 0.0,
        swizzles: tuple[int, ...] = (), time_failing: bool = False) -> list[dict[str, Any]]:
    import torch

    from ingot.codegen.kernels.gemm_cutlass.launch import CutlassGemm

    manifest = json.loads((kernel_dir / "manifest.json").read_text())
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the primary context, which CutlassGemm then shares
    gemms: dict[str, list[tuple[str, CutlassGemm]]] = {}
    for e in manifest["kernels"]:
        spec = _spec_from_dict(e["spec"])
        cubin = (kernel_dir / f"{e['entry']}.cubin").read_bytes()
        gemms.setdefault(e["kind"], []).append((e["config"], CutlassGemm(spec, cubin, kernel_dir / f"{e['entry']}.so")))
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    rows = []
    for m, n, k in shapes:
        for mode in modes:
            ops = _operands(torch, mode, m, n, k, gen)
            exact = ops["exact"]()
            flops = 2.0 * m * n * k
            ref_out = ops["ref"]()
            ref_ok, ref_err = _close(torch, ref_out, exact)
            t_ref = _graph_time(ops["ref"], iters, reps)
            row: dict[str, Any] = {"M": m, "N": n, "K": k, "mode": mode, "reference": ops["ref_name"],
                                   "ref_tflops": flops / t_ref / 1e12, "ref_err": ref_err, "ref_ok": ref_ok,
                                   "ref_screen_tflops": flops / t_ref / 1e12,
                                   "candidates": {}}
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ptrs = {"x": ops["x"].data_ptr(), "weight": ops["w"].data_ptr(), "out": out.data_ptr()}
            if ops["xs"] is not None:
                ptrs |= {"x_scale": ops["xs"].data_ptr(), "weight_scale": ops["ws"].data_ptr()}
            launches = {}
            fitting = [(tag, gemm) for tag, gemm in gemms.get(_kind(mode), []) if _fits(mode, tag)]
            entries = [(tag if sw is None else f"{tag}@s{sw}", gemm, sw) for tag, gemm in fitting
                       for sw in (swizzles or (None,))]
            row["runtime_swizzle"] = {tag: gemm.max_swizzle(m, n, k) for tag, gemm in fitting
                                      if gemm.spec.template == "sm90.cu"}
            for tag, gemm, sw in entries:
                scalar = {"weight_scale": ops["ws_scalar"].data_ptr()} if tag.split("@")[0].endswith("+wt") else {}
                try:
                    prepared = gemm.prepare(ptrs | scalar, m, sm_count, N=n, K=k, max_swizzle=sw)
                except RuntimeError as exc:
                    row["candidates"][tag] = {"error": str(exc)}
                    continue
                out.fill_(float("nan"))

                def launch(g: CutlassGemm = gemm, p: Any = prepared) -> None:
                    g.launch(p, torch.cuda.current_stream().cuda_stream)

                launch()
                torch.cuda.synchronize()
                ok, err = _close(torch, out, exact)
                cand: dict[str, Any] = {"ok": ok, "err": err}
                if ok or time_failing:
                    t = _graph_time(launch, iters, reps)
                    cand["tflops"] = flops / t / 1e12
                    launches[tag] = launch
                row["candidates"][tag] = cand
            timed = {t: c["tflops"] for t, c in row["candidates"].items() if "tflops" in c}
            if timed:  # the screen's best `top` against the reference again, interleaved: the figures reported
                finalists = sorted(timed, key=timed.__getitem__, reverse=True)[:top]
                t_ref, *t_fin = _ab_time([ops["ref"], *(launches[t] for t in finalists)], iters, 2 * reps)
                best_i = min(range(len(finalists)), key=t_fin.__getitem__)
                best = finalists[best_i]
                if len(finalists) > 1:  # a fresh interleaved round for the winner: no pick-the-luckiest bias
                    t_ref, t_best = _ab_time([ops["ref"], launches[best]], iters, 2 * reps)
                else:
                    t_best = t_fin[0]
                row |= {"best": best, "ref_tflops": flops / t_ref / 1e12, "ingot_tflops": flops / t_best / 1e12,
                        "ratio": t_ref / t_best,
                        "finalists": {t: flops / tf / 1e12 for t, tf in zip(finalists, t_fin)}}
                if sustain > 0:  # each alone for `sustain` seconds: TFLOP/s at the clock and power it sustains
                    row["sustained"] = {}
                    for who, fn in (("reference", ops["ref"]), ("ingot", launches[best])):
                        st = _sustained(fn, iters, sustain)
                        st["tflops"] = flops / st["per_launch_s"] / 1e12
                        row["sustained"][who] = st
                    print(f"  sustained {sustain:.0f} s: " + "; ".join(
                        f"{who} {st['tflops']:.0f} TFLOP/s"
                        + (f" at {st['sm_clock_mhz']:.0f} MHz, {st['power_w']:.0f} W" if "sm_clock_mhz" in st else "")
                        for who, st in row["sustained"].items()), flush=True)
            if sustain_all > 0 and launches:
                row["sustained_all"] = _sustain_all({"reference": ops["ref"], **launches}, iters, sustain_all, flops)
                st = row["sustained_all"]
                best = max((t for t in st if t != "reference"), key=lambda t: st[t]["tflops"])
                row |= {"sustained_best": best, "sustained_ratio": st[best]["tflops"] / st["reference"]["tflops"]}
                print(f"  sustained {sustain_all:.1f} s x 2: " + "; ".join(
                    f"{t} {v['tflops']:.0f}" + (f" ({v['sm_clock_mhz']:.0f} MHz)" if "sm_clock_mhz" in v else "")
                    for t, v in st.items()) + f"; best {best} {row['sustained_ratio']:.3f}x the reference",
                    flush=True)
            rows.append(row)
            _print_row(row)
            del ops, exact, ref_out, out
            torch.cuda.empty_cache()
    return rows


def _print_row(r: dict[str, Any]) -> None:
    ceiling = CEILING_TFLOPS[_kind(r["mode"])]
    shape = f"{r['M']}x{r['N']}x{r['K']}"
    if "ingot_tflops" not in r:
        print(f"| {shape} | {r['mode']} | {r['ref_tflops']:.0f} | no candidate passed: {r['candidates']} |",
              flush=True)
        return
    print(f"| {shape} | {r['mode']} | {r['ref_tflops']:.0f} ({r['ref_tflops'] / ceiling:.0%}) | "
          f"{r['ingot_tflops']:.0f} ({r['ingot_tflops'] / ceiling:.0%}) | **{r['ratio']:.2f}x** | {r['best']} | "
          + ", ".join(f"{t} {c.get('tflops', 0):.0f}" if c.get("ok") else f"{t} FAIL({c.get('err', c.get('error'))})"
                      for t, c in r["candidates"].items()) + " |", flush=True)


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, default=None, help="build the candidates into this folder and stop")
    ap.add_argument("--kernels", type=Path, default=None, help="folder of prebuilt candidates (from --build)")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--shapes", default="all", help="all | square | llama1b | MxNxK[,MxNxK...]")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--kinds", default="bf16,fp8", help="--build: the operand kinds whose candidates to build")
    ap.add_argument("--iters", type=int, default=20, help="launches per CUDA graph")
    ap.add_argument("--reps", type=int, default=7, help="graph replays timed (median)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--top", type=int, default=3,
                    help="how many of the screen's fastest candidates to time again against the reference, "
                         "interleaved; the fastest of them there is the figure reported")
    ap.add_argument("--sustain", type=float, default=0.0,
                    help="also run the reference and the winner each alone for this many seconds, sampling the SM "
                         "clock and power with nvidia-smi (0: off)")
    ap.add_argument("--sustain-all", type=float, default=0.0,
                    help="also run the reference and every passing candidate alone for this many seconds each, two "
                         "rounds in alternating order (the steady rate at the power limit; 0: off)")
    ap.add_argument("--only", default="", help="--build: only these configurations (config tags, comma-separated)")
    ap.add_argument("--weight-scales", default="",
                    help="--build: each FP8 configuration also with these weight scales (comma-separated): tensor "
                         "(one f32, TAG+wt, timed in the tensorwise modes beside the vector builds), block (1x128 x "
                         "128x128 block scales, TAG+wb, the fp8-block mode; the configurations that have such a "
                         "build)")
    ap.add_argument("--swizzles", default="",
                    help="time each sm90 build at each of these scheduler max swizzles (e.g. 1,8; candidates "
                         "TAG@sN) instead of at the runtime's choice (rule.auto_swizzle, or the build's own)")
    ap.add_argument("--time-failing", action="store_true",
                    help="time candidates that fail the check too (probes that change the arithmetic on purpose, to "
                         "see what a part of it costs); their rows keep ok: false")
    ap.add_argument("--out", type=Path, default=None, help="write all figures as JSON here")
    a = ap.parse_args()
    if a.build is not None:
        build(a.build, a.target, tuple(k for k in a.kinds.split(",") if k), tuple(t for t in a.only.split(",") if t),
              tuple(s for s in a.weight_scales.split(",") if s))
        return
    kernel_dir = a.kernels
    if kernel_dir is None:
        import tempfile

        kernel_dir = Path(tempfile.mkdtemp(prefix="ingot-gemm-"))
        build(kernel_dir, a.target)
    if a.shapes == "all":
        shapes = [*SQUARE, *LLAMA_1B_PREFILL]
    elif a.shapes == "square":
        shapes = list(SQUARE)
    elif a.shapes == "llama1b":
        shapes = list(LLAMA_1B_PREFILL)
    else:
        shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]  # type: ignore[misc]
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    import torch

    print(f"# bench_gemm: commit {_git_commit()}, {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"seed {seed}, {a.iters} launches per graph, median of {a.reps}")
    print("| M x N x K | mode | reference TFLOP/s (of ceiling) | ingot best | ingot / reference | best config | "
          "all candidates |")
    print("|---|---|---|---|---|---|---|")
    rows = run(kernel_dir, shapes, a.modes.split(","), a.iters, a.reps, seed, a.top, a.sustain, a.sustain_all,
               tuple(int(v) for v in a.swizzles.split(",") if v), a.time_failing)
    if a.out is not None:
        a.out.write_text(json.dumps({"commit": _git_commit(), "gpu": torch.cuda.get_device_name(0),
                                     "torch": torch.__version__, "seed": seed, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
