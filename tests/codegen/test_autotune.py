"""Autotuning (``codegen/autotune.py``) without a GPU: the candidates are valid specs that compile, the selection
with an injected timer, the JSON cache and what invalidates it, when ``INGOT_AUTOTUNE`` tunes, and artifacts
compiled with tuned kernels (a fake GPU and timer) that still run on the CPU backend. The CUTLASS GEMM's per-shape
tuning (``gemm_cutlass/tune.py``) with shaped specs standing in for the shared generic kernels, and in a compile
with the CUTLASS builds faked (no nvcc needed)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import ingot
from ingot.api import CompileError
from ingot.codegen import autotune as at
from ingot.codegen import compile as cc
from ingot.codegen.kernels.attention.split_rule import decode_split_spec, split_config
from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp
from ingot.codegen.kernels.gemm_cutlass import tune as cutlass_tune
from ingot.codegen.kernels.gemm_cutlass.rule import SM90_CANDIDATES, config_tag, shape_config
from ingot.codegen.kernels.gemv.quant_rule import quant_gemv_spec
from ingot.codegen.kernels.gemv.rule import gemv_spec, spec_config
from ingot.codegen.target import get_target
from ingot.ir.types import DType
from ingot.runtime.artifact import load_graph
from ingot.runtime.paged import PagedModel
from tests.codegen.common import needs_compiler, session_kernel_cache  # noqa: F401 (a fixture)
from tests.helpers import rng

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TINY_KV = FIXTURES / "tiny_llama_kv.onnx"
H200 = get_target("h200")
GPU = at.GpuInfo("NVIDIA H200", 90, 13000, 132)


pytestmark = pytest.mark.usefixtures("session_kernel_cache")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Kernels compile into the session's cache; autotune results go to a fresh one per test (``cache_dir`` is read
    at each use, so the autotune cache is the test's own folder)."""
    monkeypatch.setattr(at, "cache_dir", lambda: tmp_path / "tune-cache")
    monkeypatch.setenv(at.ENV, "auto")
    monkeypatch.setenv(at.CUTLASS_ENV, "1")


@pytest.fixture(autouse=True)
def _fake_cutlass_builds(monkeypatch):
    """The compiles here plan the h200 CUTLASS GEMMs whether or not nvcc and CUTLASS are installed, and never build
    them (a real build takes minutes; tests/codegen/test_gemm_cutlass.py builds them): a stand-in cubin and layout
    per kernel, enough for the kernel table, the CPU backend and ``inspect``. ``built`` lists the entries."""
    built: list[str] = []

    def build_linear(spec, use_cache=True):
        built.append(spec.entry)
        return cc.CompiledKernel(spec.arch, b"\x7fELF" + spec.key.encode(), f"// {spec.entry}", spec.key, "nvcc"), {
            "stand-in": spec.entry}

    monkeypatch.setattr(cp, "cutlass_available", lambda: True)
    monkeypatch.setattr(cp, "build_linear", build_linear)
    return built


def specs():
    return {
        "gemv-bf16": gemv_spec(3072, 2048, 8, H200),
        "gemv-fp8": quant_gemv_spec(2048, 8192, 16, H200, "fp8", "fp8"),
        "gemv-nvfp4": quant_gemv_spec(576, 1024, 32, H200, "nvfp4", bias=True, residual=True),
        "attention": decode_split_spec(DType.bf16, DType.bf16, 32, 8, 128, 16, 128 ** -0.5, H200),
        "attention-fp8": decode_split_spec(DType.bf16, DType.f8e4m3fn, 16, 4, 64, 16, 0.125, H200, kv_scale=True),
        "cutlass-bf16": cutlass_spec(1024, 512, residual=True),
        "cutlass-fp8": cp.shaped(cp.generic_linear_spec("fp8", H200), 1024, 512, 64, True),
    }


def cutlass_spec(n: int, k: int, residual: bool = False, rows: int | str = "T", bias: bool = False):
    """A launch's shaped CUTLASS spec (``cutlass_params.tuning_spec``) with the rule's configuration."""
    generic = cp.generic_linear_spec("bf16", H200, residual=residual, config=shape_config("bf16", n, k, H200))
    return cp.shaped(generic, n, k, rows, bias)


class TableTimer:
    """Seconds per (candidate key, workload label) from a function; counts its calls."""

    def __init__(self, fn) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, spec, workload) -> float:
        self.calls += 1
        return self.fn(spec, workload)


# -- candidates -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(specs()))
def test_candidates_are_valid_specs(name):
    spec = specs()[name]
    cands = at.candidates(spec, H200)
    assert cands[0] == spec and 2 <= len(cands) <= at.MAX_CANDIDATES  # FP8 CUTLASS: two with f32 promotion
    assert len({c.key for c in cands}) == len(cands)
    t = at.tunable_for(spec)
    assert t is not None
    for c in cands:  # same kernel, same parameters: any candidate can stand in for the heuristic's
        # (CUTLASS kernels' names carry their configuration: each is its own shape-generic build)
        assert (c.family, c.template, c.arch, c.params) == (spec.family, spec.template, spec.arch, spec.params)
        assert c.name == spec.name or c.family == "gemm_cutlass"
        fixed = {k: v for k, v in c.values if k not in t.knobs}
        assert fixed == {k: v for k, v in spec.values if k not in t.knobs}
    for w in t.workloads(spec, {"S": 8, "max_blocks": 16}):  # buffers match the parameters and their declarations
        ptrs = {p.name for p in spec.params if p.ctype == "ptr"}
        assert set(w.buffers) <= ptrs and "out" in w.buffers
        assert set(w.ints) == {p.name for p in spec.params if p.ctype != "ptr"}
        arrays = w.fill(rng())
        assert {n: (a.dtype.name, a.shape) for n, a in arrays.items()} == dict(w.buffers)
        assert all(np.isfinite(a.astype(np.float32)).all() for a in arrays.values() if a.dtype.kind == "f" or
                   a.dtype.name.startswith(("bfloat", "float8")))


def test_heuristic_is_what_the_rules_rebuild():
    """The tunables rebuild specs through the rules: with the heuristic's own settings they give the same spec."""
    for spec in (gemv_spec(3072, 2048, 8, H200), gemv_spec(128256, 2048, 32, H200, bias=True)):
        assert gemv_spec(spec.value("N"), spec.value("K"), spec.value("MB"), H200, spec.value("HAS_BIAS"),
                         spec.value("HAS_RESIDUAL"), config=spec_config(spec)).key == spec.key
    attn = specs()["attention"]
    assert decode_split_spec(DType.bf16, DType.bf16, 32, 8, 128, 16, 128 ** -0.5, H200,
                             config=split_config(128, 8, 4, 16, 132)).key == attn.key
    assert at.tunable_for(quant_gemv_spec(3072, 2048, 64, H200, "fp8", any_m=True)) is None  # prefill: not tuned
    # CUTLASS: the candidate of the rule's own configuration is the heuristic's shaped spec (listed once)
    for n, k in ((2048, 8192), (3072, 2048), (16384, 2048)):
        spec = cutlass_spec(n, k)
        cands = at.candidates(spec, H200)
        assert len(cands) == len(SM90_CANDIDATES["bf16"]) and sum(c.key == spec.key for c in cands) == 1
    # unshaped generic specs (no shape to time) and b200's (one configuration) are not tuned
    assert at.tunable_for(cp.generic_linear_spec("bf16", H200)) is None
    assert at.tunable_for(cp.shaped(cp.generic_linear_spec("bf16", get_target("b200")), 2048, 2048, "T", False)) is None


@needs_compiler
@pytest.mark.parametrize("name", ["gemv-bf16", "attention"])
def test_candidates_compile(name):
    for c in at.candidates(specs()[name], H200):
        built = cc.compile_spec(c)
        assert built.cubin[:4] == b"\x7fELF" and c.entry in built.ptx


def test_cutlass_candidates_and_workload():
    """The kind's sm_90a candidates with the heuristic's epilogue and shape, each compiled as its shape-generic
    kernel; FP8 keeps its accumulation; one workload at the launch's row bound, weights rotating."""
    spec = cutlass_spec(2048, 8192, residual=True, bias=True)
    cands = at.candidates(spec, H200)
    assert {config_tag(cutlass_tune.config_of(c)) for c in cands} == {config_tag(c) for c in SM90_CANDIDATES["bf16"]}
    for c in cands:
        assert (c.value("N"), c.value("K"), c.value("ROWS"), c.value("HAS_BIAS"), c.value("HAS_RESIDUAL")) == (
            2048, 8192, "T", True, True)
        kernel = at.kernel_for(c)
        assert kernel.value("N") == kernel.value("K") == 0 and "ROWS" not in dict(kernel.values)
        assert kernel == cp.generic_linear_spec("bf16", H200, residual=True, config=cutlass_tune.config_of(c))
    fp8 = specs()["cutlass-fp8"]
    assert all("FastAccum" not in str(c.value("SCHEDULE")) for c in at.candidates(fp8, H200))
    assert len(at.candidates(fp8, H200)) == sum("FastAccum" not in c.schedule for c in SM90_CANDIDATES["fp8"])
    (w,) = at.tunable_for(spec).workloads(spec, {"T": 16384, "S": 256})
    assert w.ints == {"M": 16384} and w.rotate == ("weight",) and w.label == "M=16384 N=2048 K=8192"
    assert dict(w.buffers) == {"x": ("bfloat16", (16384, 8192)), "weight": ("bfloat16", (2048, 8192)),
                               "out": ("bfloat16", (16384, 2048)), "residual": ("bfloat16", (16384, 2048)),
                               "bias": ("bfloat16", (2048,))}
    lm_head = cutlass_spec(128256, 2048, rows="S")
    assert at.tunable_for(lm_head).workloads(lm_head, {"T": 16384, "S": 256})[0].ints == {"M": 256}
    static = cutlass_spec(3072, 2048, rows=300)
    assert at.tunable_for(static).workloads(static, {"T": 16384})[0].ints == {"M": 300}


# -- choosing -----------------------------------------------------------------------------------------


def test_picks_the_fastest_and_records_both_times():
    spec = specs()["gemv-bf16"]
    cands = at.candidates(spec, H200)
    fastest = cands[2]
    speed = {c.key: 10e-6 for c in cands} | {fastest.key: 6e-6, cands[1].key: 7e-6}
    timer = TableTimer(lambda s, w: speed[s.key])
    res = at.autotune([spec, spec], H200, timer, GPU)[spec.key]
    n_loads = len(at.tunable_for(spec).workloads(spec, {}))
    assert timer.calls == len(cands) * n_loads
    assert res.chosen == fastest and res.changed and not res.cached
    assert res.chosen_s == pytest.approx(6e-6 * n_loads) and res.heuristic_s == pytest.approx(10e-6 * n_loads)
    rec = res.record()
    assert rec["heuristic"] == spec.entry and rec["chosen_us"] == pytest.approx(6 * n_loads)
    assert rec["heuristic_us"] == pytest.approx(10 * n_loads)
    assert rec["config"] == {k: fastest.value(k) for k in at.tunable_for(spec).knobs} != rec["heuristic_config"]
    assert rec["gpu"] == "NVIDIA H200" and rec["candidates"] == rec["timed"] == len(cands)


def test_picks_the_fastest_cutlass_configuration_and_records_it():
    """Shaped specs are timed, the compiled (generic) kernels are the result; two shapes sharing the heuristic's
    kernel are tuned each on its own."""
    down, o = cutlass_spec(2048, 8192, residual=True), cutlass_spec(2048, 2048, residual=True)
    assert at.kernel_for(down) != at.kernel_for(o)  # the rule gives them different configurations
    qkv = cutlass_spec(3072, 2048)
    assert at.kernel_for(qkv) == at.kernel_for(cutlass_spec(2048, 2048))

    def speed(s, w):  # a fake GPU: 256-column tiles fastest on the long-K shape, the default elsewhere
        tag = config_tag(cutlass_tune.config_of(s))
        if s.value("K") == 8192:
            return {"coop128x256x64c2x1": 5e-4, "coop256x128x64c1x2": 7e-4}.get(tag, 9e-4)
        return 4e-4 if tag == "pp128x128x64c2x1" else 6e-4

    timer = TableTimer(speed)
    res = at.autotune([down, o, qkv, qkv], H200, timer, GPU, bounds={"T": 8192})
    assert set(res) == {down.key, o.key, qkv.key} and timer.calls == 3 * len(SM90_CANDIDATES["bf16"])
    r = res[down.key]
    assert r.changed and r.heuristic == at.kernel_for(down)
    assert r.chosen == cp.generic_linear_spec("bf16", H200, residual=True, config=cutlass_tune.config_of(r.chosen))
    assert config_tag(cutlass_tune.config_of(r.chosen)) == "coop128x256x64c2x1"
    assert r.chosen.value("N") == 0 and r.chosen_s == pytest.approx(5e-4) and r.heuristic_s == pytest.approx(7e-4)
    rec = r.record()
    assert rec["heuristic"] == at.kernel_for(down).entry and rec["workloads"] == ["M=8192 N=2048 K=8192"]
    assert (rec["config"]["TILE_N"], rec["heuristic_config"]["TILE_M"]) == (256, 256)
    assert rec["candidates"] == rec["timed"] == len(SM90_CANDIDATES["bf16"])
    assert not res[o.key].changed and res[o.key].chosen == at.kernel_for(o)  # the default: kept
    assert not res[qkv.key].changed
    again = TableTimer(lambda s, w: 1 / 0)  # cached: the same choice, nothing timed
    cached = at.autotune([down], H200, again, GPU, bounds={"T": 8192})[down.key]
    assert again.calls == 0 and cached.cached and cached.chosen == r.chosen
    # another step budget is another workload: tuned again
    assert not at.autotune([down], H200, TableTimer(speed), GPU, bounds={"T": 2048})[down.key].cached


def test_keeps_the_heuristic_within_the_noise():
    spec = specs()["attention"]
    timer = TableTimer(lambda s, w: 10e-6 if s.key == spec.key else 9.9e-6)  # 1% faster: noise
    res = at.autotune([spec], H200, timer, GPU)[spec.key]
    assert res.chosen == spec and not res.changed


def test_failing_candidates_are_dropped_with_a_warning():
    spec = specs()["gemv-fp8"]
    cands = at.candidates(spec, H200)

    def timer(s, w):
        if s.key == cands[1].key:
            raise cc.CompileError("NVRTC failed to compile", "error: something")
        if s.key == cands[2].key and w.label.endswith("16"):
            raise RuntimeError("cuLaunchKernel failed: CUDA_ERROR_LAUNCH_FAILED")
        return 5e-6 if s.key in (cands[1].key, cands[2].key) else 8e-6

    with pytest.warns(at.AutotuneWarning, match="dropped"):
        res = at.autotune([spec], H200, timer, GPU)[spec.key]
    assert res.times[cands[1].key] is None and res.times[cands[2].key] is None
    assert res.chosen == spec and res.record()["timed"] == len(cands) - 2


def test_all_failing_keeps_the_heuristic():
    spec = specs()["attention"]

    def timer(s, w):
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")

    with pytest.warns(at.AutotuneWarning):
        res = at.autotune([spec], H200, timer, GPU)[spec.key]
    assert res.chosen == spec and res.heuristic_s is None and res.chosen_s is None
    assert res.record()["timed"] == 0
    # the heuristic failing alone also keeps it (no evidence the others are right on this machine)
    with pytest.warns(at.AutotuneWarning):
        res = at.autotune([spec], H200, TableTimer(lambda s, w: 1 / 0 if s.key == spec.key else 1e-6), GPU)[spec.key]
    assert res.chosen == spec


# -- the cache ----------------------------------------------------------------------------------------


def test_cache_hit_and_invalidation():
    spec = specs()["gemv-nvfp4"]
    cands = at.candidates(spec, H200)
    speed = {c.key: 10e-6 - i * 1e-6 for i, c in enumerate(cands)}
    first = TableTimer(lambda s, w: speed[s.key])
    res = at.autotune([spec], H200, first, GPU)[spec.key]
    assert first.calls > 0 and res.chosen == cands[-1]

    never = TableTimer(lambda s, w: 1 / 0)  # the same kind of timer (its signature is part of the key)
    again = at.autotune([spec], H200, never, GPU)[spec.key]
    assert never.calls == 0 and again.cached and again.chosen == res.chosen and again.record() == res.record()
    for other in (at.GpuInfo("NVIDIA H100 80GB HBM3", 90, 13000, 132), at.GpuInfo("NVIDIA H200", 90, 12080, 132)):
        timer = TableTimer(lambda s, w: speed[s.key])
        assert not at.autotune([spec], H200, timer, other)[spec.key].cached and timer.calls == first.calls
    timer = TableTimer(lambda s, w: speed[s.key])
    assert not at.autotune([spec], H200, timer, GPU, use_cache=False)[spec.key].cached and timer.calls


def test_cache_key_covers_the_problem():
    spec = specs()["gemv-bf16"]
    cands = at.candidates(spec, H200)
    loads = at.tunable_for(spec).workloads(spec, {})
    key = at.cache_key(spec, cands, loads, GPU, object())
    other = gemv_spec(3072, 2048, 16, H200)
    assert key != at.cache_key(other, at.candidates(other, H200), loads, GPU, object())
    assert key != at.cache_key(spec, cands[:-1], loads, GPU, object())
    assert key != at.cache_key(spec, cands, loads[:1], GPU, object())
    assert key == at.cache_key(spec, cands, loads, GPU, object())


# -- when it runs ---------------------------------------------------------------------------------------


def test_when_it_tunes(monkeypatch):
    monkeypatch.setattr(at, "detect_gpu", lambda: GPU)
    assert at.tuning_gpu(H200) == GPU and at.tuning_gpu(get_target("h100")) == GPU
    monkeypatch.delenv(at.ENV)
    assert at.tuning_gpu(H200) == GPU  # unset: auto, tunes where a GPU of the architecture is present
    monkeypatch.setenv(at.ENV, "auto")
    assert at.tuning_gpu(get_target("b200")) is None  # another architecture: heuristics
    monkeypatch.setenv(at.ENV, "0")
    assert at.tuning_gpu(H200) is None
    monkeypatch.setenv(at.ENV, "1")
    assert at.tuning_gpu(H200) == GPU
    with pytest.raises(at.AutotuneUnavailable, match=r"sm_100.*NVIDIA H200 \(sm_90\)"):
        at.tuning_gpu(get_target("b200"))
    monkeypatch.setattr(at, "detect_gpu", lambda: None)
    with pytest.raises(at.AutotuneUnavailable, match="no usable CUDA GPU"):
        at.tuning_gpu(H200)
    monkeypatch.setenv(at.ENV, "sometimes")
    with pytest.raises(at.AutotuneUnavailable, match="must be 0"):
        at.tuning_gpu(H200)


def test_no_gpu_is_detected_here_without_a_driver():
    if os.environ.get("INGOT_FORCE_NO_GPU") is None:
        try:
            import ctypes

            ctypes.CDLL("libcuda.so.1")
            pytest.skip("this machine has a CUDA driver")
        except OSError:
            pass
    assert at.detect_gpu() is None


# -- in a compile -------------------------------------------------------------------------------------------


#: what the tiny Llama's h200 compile tunes: 11 GEMV variants (15 less bucket 8's four, which a compile leaves to the
#: heuristics: kernels/gemv/tune.py COMPILE_SKIPS_BUCKETS) and the split-KV attention (12), and its CUTLASS GEMMs' 5
#: shapes (qkv, o, gate+up and down at T rows, lm_head at S rows)
TINY_TUNED = 12 + 5


def prefer_wide(s, w) -> float:
    """A fake GPU on which 8-warp GEMVs and more CTAs per SM for attention are faster (CUTLASS: all the same)."""
    v = dict(s.values)
    return 10e-6 / (1 + int(v.get("WARPS", 4)) // 8 + int(v.get("TARGET_CTAS", 0)) // 1000)


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def test_compile_records_tuned_kernels_and_caches(tmp_path, monkeypatch):
    monkeypatch.setattr(at, "detect_gpu", lambda: GPU)
    timer = TableTimer(prefer_wide)
    monkeypatch.setattr(at, "make_timer", lambda: timer)
    lines = []
    path = ingot.compile(TINY_KV, target="h200", out=tmp_path / "t.ingot", mode="llm",
                         progress=lambda step, done, total: lines.append((step, done, total)))
    cuda = _manifest(path)["cuda"]
    assert timer.calls > 0
    assert any(step.startswith(f"autotuning {TINY_TUNED} kernels on NVIDIA H200") for step, _, _ in lines), lines
    tuned = {e: k for e, k in cuda["variant_kernels"].items() if "autotune" in k}
    assert len(tuned) == 12 and cuda["autotune"]["kernels"] == TINY_TUNED and cuda["autotune"]["gpu"] == "NVIDIA H200"
    assert cuda["autotune"]["changed"] > 0
    # batch 1's GEMV bucket keeps the heuristic in a compile (measured slower end to end when tuned alone)
    assert not any(k["spec"]["values"].get("MB") == 8 for k in tuned.values() if k["spec"]["family"] == "gemv")
    assert any(k["spec"]["values"].get("MB") == 8 for k in cuda["variant_kernels"].values()
               if k["spec"]["family"] == "gemv")
    used = {v["kernel"] for ln in cuda["launches"] for v in ln.get("variants", [])}
    assert used == set(cuda["variant_kernels"])
    for entry, k in tuned.items():
        rec = k["autotune"]
        assert rec["chosen_us"] <= rec["heuristic_us"]
        assert k["spec"]["values"]["WARPS"] == rec["config"]["WARPS"]
        assert (path / k["cubin"]).read_bytes()[:4] == b"\x7fELF"
        if rec["heuristic"] != entry:
            assert rec["config"]["WARPS"] == 8 and rec["heuristic_config"]["WARPS"] == 4
    # a second compile times nothing and writes the same kernel table
    calls = timer.calls
    again = ingot.compile(TINY_KV, target="h200", out=tmp_path / "t2.ingot", mode="llm")
    assert timer.calls == calls and _manifest(again)["cuda"] == cuda


def test_cutlass_configurations_are_tuned_only_when_asked(tmp_path, monkeypatch):
    """``INGOT_AUTOTUNE_CUTLASS`` unset: the GEMVs and attention are tuned, the CUTLASS GEMMs keep the rule table."""
    monkeypatch.setattr(at, "detect_gpu", lambda: GPU)
    monkeypatch.setattr(at, "make_timer", lambda: TableTimer(prefer_wide))
    monkeypatch.delenv(at.CUTLASS_ENV)
    cuda = _manifest(ingot.compile(TINY_KV, target="h200", out=tmp_path / "t.ingot", mode="llm"))["cuda"]
    assert cuda["autotune"]["kernels"] == TINY_TUNED - 5
    assert not any("autotune" in k for k in cuda["kernels"].values() if k["spec"]["family"] == "gemm_cutlass")


def test_autotune_off_leaves_the_artifact_as_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(at, "detect_gpu", lambda: None)
    plain = _manifest(ingot.compile(TINY_KV, target="h200", out=tmp_path / "plain.ingot", mode="llm"))
    monkeypatch.setattr(at, "detect_gpu", lambda: GPU)
    monkeypatch.setattr(at, "make_timer", lambda: TableTimer(prefer_wide))
    monkeypatch.setenv(at.ENV, "0")
    off = _manifest(ingot.compile(TINY_KV, target="h200", out=tmp_path / "off.ingot", mode="llm"))
    # the same kernels and launches; only the recorded switches differ (INGOT_AUTOTUNE=0 was set for this one)
    assert {**off["cuda"], "switches": None} == {**plain["cuda"], "switches": None} and off["files"] == plain["files"]
    assert off["cuda"]["switches"][at.ENV] == "0" and "autotune" not in json.dumps(off["cuda"])
    # a GPU of another architecture (b200 wanted, an H200 here) also leaves the heuristics: test_when_it_tunes


def test_autotune_required_without_a_gpu_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setattr(at, "detect_gpu", lambda: None)
    monkeypatch.setenv(at.ENV, "1")
    with pytest.raises(CompileError, match="INGOT_AUTOTUNE=1: autotuning for target h200 needs a GPU"):
        ingot.compile(TINY_KV, target="h200", out=tmp_path / "t.ingot", mode="llm")


def test_a_failing_timer_never_fails_the_compile(tmp_path, monkeypatch):
    monkeypatch.setattr(at, "detect_gpu", lambda: GPU)

    def broken():
        raise RuntimeError("cuInit failed")

    monkeypatch.setattr(at, "make_timer", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = ingot.compile(TINY_KV, target="h200", out=tmp_path / "t.ingot", mode="llm")
    assert any(issubclass(w.category, at.AutotuneWarning) for w in caught)
    assert "autotune" not in json.dumps(_manifest(path)["cuda"])


def test_tuned_artifact_runs_on_the_cpu_backend(tmp_path, monkeypatch):
    monkeypatch.setattr(at, "detect_gpu", lambda: GPU)
    monkeypatch.setattr(at, "make_timer", lambda: TableTimer(prefer_wide))
    tuned = ingot.compile(TINY_KV, target="h200", out=tmp_path / "tuned.ingot", mode="llm")
    monkeypatch.setenv(at.ENV, "0")
    plain = ingot.compile(TINY_KV, target="h200", out=tmp_path / "plain.ingot", mode="llm")
    assert "autotune" in _manifest(tuned)["cuda"]
    ids = [int(i) for i in rng().integers(0, 256, 11)]
    logits = []
    for path in (tuned, plain):
        graph, _ = load_graph(path)
        m = PagedModel(graph, num_blocks=4)
        sid = m.add_sequence()
        logits.append(np.stack([m.step([(sid, ids)])[0], m.step([(sid, [ids[0]])])[0]]))
    assert np.isfinite(logits[0]).all()
    np.testing.assert_array_equal(logits[0], logits[1])


def test_inspect_shows_the_autotuned_kernels(tmp_path, monkeypatch, capsys):
    from ingot.cli import main

    monkeypatch.setattr(at, "detect_gpu", lambda: GPU)
    monkeypatch.setattr(at, "make_timer", lambda: TableTimer(prefer_wide))
    monkeypatch.setenv("INGOT_GEMV_KW", "1")  # a compile-time switch: inspect names it
    path = ingot.compile(TINY_KV, target="h200", out=tmp_path / "t.ingot", mode="llm")
    capsys.readouterr()
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"autotuned kernels ({TINY_TUNED}," in text and "NVIDIA H200" in text and "WARPS 8 / 4" in text
    assert "compiled with: " in text and "INGOT_GEMV_KW=1" in text


def test_compile_tunes_each_cutlass_shape(tmp_path, monkeypatch, _fake_cutlass_builds):
    """A fake GPU on which 256-column tiles are faster for the down projection only: its launches (both layers)
    move to that configuration's shape-generic kernel, the other linears keep the rule's kernels, the chosen
    kernel's entry records the tuning; with tuning off the artifact has the rule's kernels alone."""
    monkeypatch.setattr(at, "detect_gpu", lambda: GPU)

    def down_wide(s, w):
        if s.family != "gemm_cutlass":
            return 1e-5
        wide = config_tag(cutlass_tune.config_of(s)) == "coop128x256x64c2x1"
        return 5e-6 if wide and s.value("N") == 64 and s.value("K") == 128 else 1e-5

    monkeypatch.setattr(at, "make_timer", lambda: TableTimer(down_wide))
    cuda = _manifest(ingot.compile(TINY_KV, target="h200", out=tmp_path / "t.ingot", mode="llm"))["cuda"]
    linears = {ln["args"]["weight"]["buffer"]: ln["kernel"] for ln in cuda["launches"] if ln["op"] == "linear"}
    down = {w: e for w, e in linears.items() if "down_proj" in w}
    assert len(down) == 2 and all(e.startswith("linear_cutlass_bf16_res_coop128x256x64c2x1_") for e in down.values())
    others = {e for w, e in linears.items() if w not in down}
    assert {e.rsplit("_", 1)[0] for e in others} == {"linear_cutlass_bf16", "linear_cutlass_bf16_res"}
    (wide,) = set(down.values())
    rec = cuda["kernels"][wide]["autotune"]
    assert rec["heuristic"].startswith("linear_cutlass_bf16_res_") and rec["heuristic"] in others
    assert rec["config"]["TILE_N"] == 256 and rec["heuristic_config"]["TILE_N"] == 128
    assert rec["workloads"] == ["M=2048 N=64 K=128"] and rec["chosen_us"] < rec["heuristic_us"]
    assert cuda["kernels"][wide]["cutlass"] == {"stand-in": wide}  # built (as any kernel) with its layout
    assert cuda["autotune"]["kernels"] == TINY_TUNED and cuda["autotune"]["changed"] == 1
    assert set(_fake_cutlass_builds) == {e for e in linears.values()}  # candidates were timed, not built
    monkeypatch.setenv(at.ENV, "0")
    off = _manifest(ingot.compile(TINY_KV, target="h200", out=tmp_path / "off.ingot", mode="llm"))["cuda"]
    assert {ln["kernel"] for ln in off["launches"] if ln["op"] == "linear"} == others


def test_compile_leaves_bucket_8_gemvs_to_the_heuristics():
    """``kernels/gemv/tune.py`` COMPILE_SKIPS_BUCKETS: a compile does not tune batch 1's GEMV bucket (``in_compile``),
    ``autotune`` itself (bench/bench_autotune.py) still matches it."""
    from ingot.codegen.kernels.gemv.tune import COMPILE_SKIPS_BUCKETS

    assert COMPILE_SKIPS_BUCKETS == (8,)
    for wb in (2, 1):
        for mb, tuned in ((8, False), (16, True), (64, True)):
            spec = gemv_spec(3072, 2048, mb, H200, wb=wb)
            t = at.tunable_for(spec)
            assert t is not None and t.in_compile is not None and t.in_compile(spec) is tuned
