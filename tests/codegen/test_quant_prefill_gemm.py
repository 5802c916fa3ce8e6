"""The quantized prefill GEMM (``codegen/quant_prefill.py``, on unless ``INGOT_QUANT_PREFILL_GEMM=0``) without a GPU.

The tiny quantized Llama of ``tests/codegen/test_lower_quant.py`` compiled for h200 / b200 with the switch on: every
weight-only ``quantized_linear`` is a dequantize launch (skipped up to 256 rows, into the next launch) and the bf16
GEMM a ``linear`` of its shape gets (here CUTLASS, with stand-in builds: a real one takes minutes and is
``tests/codegen/test_gemm_cutlass.py``'s subject), whose variants are the quantized GEMV buckets with the node's own
arguments; the scratch weights are memory-plan temporaries that share bytes across layers. With the switch off, or
with FP8 activations, the kernel table is the GEMV's. The dequantize kernel compiles for sm_90a and sm_100a with
wide loads and stores and no spills, and its numpy model (``dequant_reference``) and its bit placement decode
every code as ``ir/ops/quantized.py``'s ``dequantize_weight`` does. GPU runs: ``tests/codegen/test_dequant_gpu.py``,
``tests/runtime/test_quant_prefill_cuda.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen import compile as cc
from ingot.codegen import qkv_rope_fusion, quant_prefill
from ingot.codegen.decode_fusion import variant_reads
from ingot.codegen.kernels.dequant.rule import CHUNK_CODES, PARAMS, dequant_reference, dequant_spec
from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp
from ingot.codegen.kernels.gemm_cutlass.rule import shape_config
from ingot.codegen.kernels.gemv.quant_rule import PARAMS as GEMV_PARAMS
from ingot.codegen.kernels.quant_act.rule import FP8_PARAMS
from ingot.codegen.memory_plan import plan_memory
from ingot.codegen.target import get_target
from ingot.ir.ops.quantized import dequantize_weight
from ingot.ir.quant import formats as F
from ingot.ir.quant.packing import pack_e2m1, unpack_e2m1
from ingot.runtime.artifact import load_graph
from ingot.runtime.paged import PagedModel
from tests.codegen import test_lower_quant
from tests.codegen.common import (  # noqa: F401 (session_kernel_cache: a fixture)
    assert_no_local_memory,
    needs_compiler,
    sass_opcodes,
    session_kernel_cache,
)
from tests.codegen.test_lower import live_ranges
from tests.codegen.test_lower_quant import ARCH, compile_quant
from tests.helpers import rng

#: weight-only cases the prefill GEMM takes (on b200 ``nvfp4`` means W4A4; ``nvfp4:wo`` there: test_nvfp4_wo_for_b200;
#: ``fp8:tensor:wo``: per-tensor weight scales, broadcast to per-channel ones by ``fp8-channel-scales``)
CASES = {"fp8-wo": {"default": "fp8:wo"}, "nvfp4": {"default": "nvfp4"},
         "fp8-tensor-wo": {"default": "fp8:tensor:wo"}}
#: the tiny Llama's quantized linears: (suffix of the output value, N, K, residual)
LINEARS = {"qkv": (512, 128, False), "attn_out": (128, 256, True), "gate_up": (512, 128, False),
           "mlp_out": (128, 256, True)}
#: the tiny quantized Llama's checkpoint (a module-scoped fixture)
ckpt = test_lower_quant.ckpt


pytestmark = pytest.mark.usefixtures("session_kernel_cache")


@pytest.fixture(autouse=True)
def _kernel_cache(monkeypatch):
    monkeypatch.delenv(quant_prefill.ENV, raising=False)
    # the GEMV buckets as quant.cu's: FP8 and NVFP4 weight-only ones are kernel.cu's by default, with the decode
    # fusions' own arguments in their bucket-8 variants (that lowering, with this step, for both formats:
    # tests/codegen/test_gemv_fp8.py)
    monkeypatch.setenv("INGOT_GEMV_FP8", "quant")
    monkeypatch.setenv("INGOT_GEMV_NVFP4", "quant")


@pytest.fixture
def fake_cutlass(monkeypatch):
    """Plan the CUTLASS GEMMs whether or not nvcc and CUTLASS are here, and never build them: a stand-in cubin and
    layout per kernel (as tests/codegen/test_autotune.py does). Returns the entries 'built'."""
    built: list[str] = []

    def build_linear(spec, use_cache=True):
        built.append(spec.entry)
        return cc.CompiledKernel(spec.arch, b"\x7fELF" + spec.key.encode(), f"// {spec.entry}", spec.key, "nvcc"), {
            "stand-in": spec.entry}

    monkeypatch.delenv("INGOT_NO_CUTLASS", raising=False)
    monkeypatch.setattr(cp, "cutlass_available", lambda: True)
    monkeypatch.setattr(cp, "build_linear", build_linear)
    return built


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _compile(ckpt: Path, target: str, case: str | dict, out: Path, monkeypatch, on: bool = True) -> tuple[Path, dict]:
    """``case``: a name of ``CASES``, a format spec, or a quant config."""
    monkeypatch.setenv(quant_prefill.ENV, "1" if on else "0")
    config = case if isinstance(case, dict) else CASES.get(case) or {"default": case}
    path = compile_quant(ckpt, target, config, out)
    return path, _manifest(path)


def _gemv_variants() -> list[int]:
    """The weight-only GEMM launch's variants' max rows at this test's ``INGOT_WO_GEMM_ROWS``: the GEMV buckets up to
    the boundary (64 by default), then the any-M GEMV where it is GEMV_MAX_ROWS."""
    rows = quant_prefill.wo_gemm_rows()
    return [b for b in (8, 16, 32, 64) if b <= rows] + ([rows] if rows == quant_prefill.GEMV_MAX_ROWS else [])


def _check_pairs(path: Path, cuda: dict, fmt: str, cutlass: bool, target: str) -> None:
    launches = cuda["launches"]
    variants = _gemv_variants()
    qls = [(j, ln) for j, ln in enumerate(launches) if ln["op"] == "quantized_linear"]
    assert len(qls) == 16  # 2 layers x (qkv, o_proj, gate_up, down) x (dequantize, GEMM)
    seen = set()
    for (jd, dq), (jg, gemm) in zip(qls[::2], qls[1::2]):
        assert jg == jd + 1 and dq["node"] == gemm["node"]
        out = gemm["args"]["out"]["buffer"]
        n, k, residual = LINEARS[out.split(".")[-1]]
        seen.add(out)
        # 1. the dequantize launch: skipped where the GEMV variants run, its scratch the GEMM's weight
        spec = cuda["kernels"][dq["kernel"]]["spec"]
        assert spec["family"] == "dequant" and spec["values"] == {"N": n, "K": k, "WFMT": {"fp8": 0, "nvfp4": 1}[fmt],
                                                                 "THREADS": 256}
        assert [p for p, _ in spec["params"]] == [p for p, _ in PARAMS]
        assert dq["skip"] == {"max_rows": variants[-1], "into": jg} and dq["rows_arg"] == "M"
        assert "variants" not in dq
        scratch = f"{out}{quant_prefill.WEIGHT_SUFFIX}"
        assert dq["args"]["out"] == gemm["args"]["weight"] == {"buffer": scratch}
        assert dq["args"]["weight"]["buffer"].endswith("proj.weight") and dq["args"]["M"] == {"dim": "T"}
        assert dq["args"]["weight_scale"]["buffer"].endswith("proj.weight_scale")
        # 2. the GEMM: what a bf16 linear of this shape gets, the column scale in its epilogue
        gspec = cuda["kernels"][gemm["kernel"]]["spec"]
        if cutlass:
            assert gspec["family"] == "gemm_cutlass" and gspec["values"]["ABI"] == cp.ABI, gemm["kernel"]
            assert gemm["kernel"].startswith("linear_cutlass_bf16" + ("_res" if residual else ""))
            assert gspec["template"] == ("sm90.cu" if target == "h200" else "sm100.cu")
            alt = cuda["alternative_kernels"][gemm["alternatives"][0]["kernel"]]["spec"]
        else:
            assert "alternatives" not in gemm
            alt = gspec
        assert alt["family"] == "gemm" and alt["template"] == "mma.cu" and alt["values"]["WT"] == "bf16"
        assert alt["values"]["HAS_SCALE"] and alt["values"]["HAS_RESIDUAL"] == residual
        assert (alt["values"]["N"], alt["values"]["K"]) == (n, k)
        if fmt == "fp8":  # the weight's own per-channel scale; the kernel writes no scale
            assert gemm["args"]["weight_scale"] == dq["args"]["weight_scale"] and dq["args"]["out_scale"] == {
                "null": True}
            assert dq["args"]["weight_scale_2"] == {"null": True}
        else:  # NVFP4: the global scale, copied to N entries by the dequantize kernel
            scale = {"buffer": f"{out}{quant_prefill.SCALE_SUFFIX}"}
            assert gemm["args"]["weight_scale"] == dq["args"]["out_scale"] == scale
            assert dq["args"]["weight_scale_2"]["buffer"].endswith(".weight_scale_2")
        assert ("buffer" in gemm["args"]["residual"]) == residual and gemm["args"]["bias"] == {"null": True}
        # its variants: the quantized GEMV buckets, with the node's own (quantized) arguments
        assert [v["max_rows"] for v in gemm["variants"]] == variants
        for v in gemm["variants"]:  # the buckets (then the any-M GEMV the launch had without this step, at 256)
            vspec = cuda["variant_kernels"][v["kernel"]]["spec"]
            any_m = v["max_rows"] == quant_prefill.GEMV_MAX_ROWS
            assert vspec["template"] == "quant.cu" and vspec["values"]["ANY_M"] == any_m
            assert vspec["values"]["AFMT"] == 0
            assert [p for p, _ in vspec["params"]] == [p for p, _ in GEMV_PARAMS]
            assert v["args"]["weight"] == dq["args"]["weight"] and v["args"]["x"] == gemm["args"]["x"]
            assert v["args"]["out"] == gemm["args"]["out"] and v["args"]["residual"] == gemm["args"]["residual"]
            assert v["args"]["weight_scale"] == dq["args"]["weight_scale"]
            assert v["args"]["weight_scale_2"] == dq["args"]["weight_scale_2"]
    assert len(seen) == 8
    assert not any(ln["kernel"].startswith("gemv_") and "_any_" in ln["kernel"] for ln in launches)
    for k in (*cuda["kernels"].values(), *cuda["variant_kernels"].values()):
        assert (path / k["cubin"]).read_bytes()[:4] == b"\x7fELF"


def _check_scratch(graph, cuda: dict, off: dict, fmt: str) -> None:
    """The scratch weights are planned temporaries of their node, sharing bytes across layers."""
    plan = cuda["memory_plan"]
    temps = quant_prefill.temporaries(graph, cuda["launches"])
    assert len(temps) == (8 if fmt == "fp8" else 16)
    for name, (node, t) in temps.items():
        b = plan["buffers"][name]
        assert b["region"] == "scratch" and b["dtype"] == t.dtype.value and b["shape"] == list(t.shape), name
        assert graph.nodes[node].outputs[0].name == name.rsplit(".", 1)[0]
    # the plan is the one the graph and the table give
    again = plan_memory(graph, plan["bindings"], reads=variant_reads(cuda["launches"]), temporaries=temps)
    assert again.to_dict() == plan
    # lives never overlap across nodes: the region grows by at most the largest node's temporaries, though without
    # reuse they would add up (8 weights of 64-128 KB here; 64 MB each for a 1B model's gate_up)
    per_node: dict[int, int] = {}
    for name, (node, _) in temps.items():
        per_node[node] = per_node.get(node, 0) + plan["buffers"][name]["nbytes"]
    grown = plan["regions"]["scratch"] - off["regions"]["scratch"]
    assert grown <= max(per_node.values()), (grown, per_node)
    assert plan["scratch_without_reuse"] - off["scratch_without_reuse"] == sum(
        plan["buffers"][n]["nbytes"] for n in temps)
    assert sum(plan["buffers"][n]["nbytes"] for n in temps) > 2 * max(per_node.values())
    # and no scratch buffer shares bytes with another one live at the same node (a temporary lives at its node)
    live = live_ranges(graph, {n: (i, i) for n, (i, _) in temps.items()})
    scratch = [(n, b) for n, b in plan["buffers"].items() if b["region"] == "scratch"]
    for a, (na, ba) in enumerate(scratch):
        for nb, bb in scratch[a + 1:]:
            (s1, e1), (s2, e2) = live[na], live[nb]
            if not (e1 < s2 or e2 < s1):
                assert ba["offset"] + ba["nbytes"] <= bb["offset"] or bb["offset"] + bb["nbytes"] <= ba["offset"], (
                    na, nb)


@pytest.mark.parametrize("case", sorted(CASES))
def test_weight_only_linears_lower_to_dequantize_and_gemm_for_h200(ckpt, tmp_path, monkeypatch, fake_cutlass, case):
    fmt = case.split("-")[0]
    _, off = _compile(ckpt, "h200", case, tmp_path / "off.ingot", monkeypatch, on=False)
    path, manifest = _compile(ckpt, "h200", case, tmp_path / "on.ingot", monkeypatch)
    cuda = manifest["cuda"]
    assert cuda["arch"] == ARCH["h200"]
    _check_pairs(path, cuda, fmt, cutlass=True, target="h200")
    assert fake_cutlass  # the CUTLASS GEMMs were planned (stand-in builds)
    graph, _ = load_graph(path)
    _check_scratch(graph, cuda, off["cuda"]["memory_plan"], fmt)
    # everything else is as without the switch: same launches for the other ops, same lm_head
    others = [(ln["op"], ln["kernel"]) for ln in cuda["launches"] if ln["op"] != "quantized_linear"]
    assert others == [(ln["op"], ln["kernel"]) for ln in off["cuda"]["launches"] if ln["op"] != "quantized_linear"]
    # the graph is unchanged: the CPU backend runs it, as before
    m = PagedModel(graph, num_blocks=8)
    logits = m.step([(m.add_sequence(), [int(t) for t in rng().integers(3, 259, 70)])])
    assert logits.shape == (1, 260) and np.isfinite(logits).all()


@pytest.mark.parametrize("rows,variants", [("256", [8, 16, 32, 64, 256]), ("16", [8, 16]), ("0", [])])
def test_wo_gemm_rows_moves_the_boundary(ckpt, tmp_path, monkeypatch, fake_cutlass, rows, variants):
    """``INGOT_WO_GEMM_ROWS``: the weight-only GEMV keeps the steps up to that many rows (256: its any-M launch too,
    the default before 2026-12-03), the dequantize + GEMM pair the rest (0: every step)."""
    monkeypatch.setenv(quant_prefill.WO_ENV, rows)
    assert _gemv_variants() == variants
    path, manifest = _compile(ckpt, "h200", "nvfp4", tmp_path / "x.ingot", monkeypatch)
    cuda = manifest["cuda"]
    gemms = [ln for ln in cuda["launches"] if ln["op"] == "quantized_linear" and ln["kernel"].startswith("linear")]
    assert len(gemms) == 8
    for ln in gemms:
        assert [v["max_rows"] for v in ln.get("variants", [])] == variants
    dequants = [ln for ln in cuda["launches"] if ln["kernel"].startswith("dequant_")]
    assert [("skip" in ln) for ln in dequants] == [bool(variants)] * 8
    if rows == "0":
        return
    _check_pairs(path, cuda, "nvfp4", cutlass=True, target="h200")


def test_wo_gemm_rows_names_what_it_takes(monkeypatch):
    monkeypatch.delenv(quant_prefill.WO_ENV, raising=False)
    assert quant_prefill.wo_gemm_rows() == quant_prefill.WO_GEMM_ROWS == 64
    monkeypatch.setenv(quant_prefill.WO_ENV, " 256 ")
    assert quant_prefill.wo_gemm_rows() == quant_prefill.GEMV_MAX_ROWS
    monkeypatch.setenv(quant_prefill.WO_ENV, "100")
    with pytest.raises(ValueError, match="INGOT_WO_GEMM_ROWS='100': expected one of"):
        quant_prefill.wo_gemm_rows()


def test_template_gemm_without_cutlass(ckpt, tmp_path, monkeypatch):
    """Without CUTLASS (``INGOT_NO_CUTLASS=1`` or no nvcc) the GEMM is the template GEMM, as for a bf16 linear."""
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    path, manifest = _compile(ckpt, "h200", "fp8-wo", tmp_path / "t.ingot", monkeypatch)
    _check_pairs(path, manifest["cuda"], "fp8", cutlass=False, target="h200")
    assert "alternative_kernels" not in manifest["cuda"]


def test_fp8_wo_for_b200(ckpt, tmp_path, monkeypatch, fake_cutlass):
    path, manifest = _compile(ckpt, "b200", "fp8-wo", tmp_path / "b200.ingot", monkeypatch)
    assert manifest["cuda"]["arch"] == "sm_100a"
    _check_pairs(path, manifest["cuda"], "fp8", cutlass=True, target="b200")


def test_nvfp4_wo_for_b200(ckpt, tmp_path, monkeypatch, fake_cutlass):
    """Weight-only NVFP4 on b200: pack-sm100 leaves its scales linear (no block-scaled MMA reads them), so it lowers
    as on h200: the dequantize launch + the bf16 CUTLASS GEMM (sm100.cu) with the quantized GEMV as its variants, and
    with ``INGOT_GEMV_NVFP4`` at its default the decode buckets are kernel.cu's NVFP4 ones, compiled for sm_100a."""
    path, manifest = _compile(ckpt, "b200", "nvfp4:wo", tmp_path / "b200.ingot", monkeypatch)
    cuda = manifest["cuda"]
    assert cuda["arch"] == "sm_100a"
    _check_pairs(path, cuda, "nvfp4", cutlass=True, target="b200")
    graph, _ = load_graph(path)
    qls = [n for n in graph.nodes if n.op.name == "quantized_linear"]
    assert len(qls) == 8 and all(n.op.weight_format == "nvfp4" and n.op.act_format == "none"
                                 and n.op.scale_layout == "linear" for n in qls)
    m = PagedModel(graph, num_blocks=8)
    logits = m.step([(m.add_sequence(), [int(t) for t in rng().integers(3, 259, 21)])])
    assert logits.shape == (1, 260) and np.isfinite(logits).all()
    monkeypatch.delenv("INGOT_GEMV_NVFP4")  # the default: kernel.cu's decode buckets
    _, manifest = _compile(ckpt, "b200", "nvfp4:wo", tmp_path / "b200-kernel.ingot", monkeypatch)
    for ln in (ln for ln in manifest["cuda"]["launches"] if "variants" in ln and ln["op"] == "quantized_linear"):
        assert [v["max_rows"] for v in ln["variants"]] == [8, 16, 32, 64]
        for v in ln["variants"]:
            spec = manifest["cuda"]["variant_kernels"][v["kernel"]]["spec"]
            assert v["kernel"].startswith("gemv_nvfp4w_") and spec["template"] == "kernel.cu", v["kernel"]
            assert spec["values"]["WB"] == 0 and spec["arch"] == "sm_100a"


def test_switch_off_and_fp8_activations_keep_the_gemv(ckpt, tmp_path, monkeypatch):
    """On by default (unset: the table ``=1`` gives); off (``0``), the kernel table is the quantized GEMV's (any-M
    launch + buckets); on, W8A8 linears keep it too without CUTLASS (``INGOT_NO_CUTLASS=1``: there is no plain FP8
    GEMM; the bf16 GEMM would not quantize x as the reference does)."""
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    _, on = _compile(ckpt, "h200", "fp8-wo", tmp_path / "on.ingot", monkeypatch)
    monkeypatch.delenv(quant_prefill.ENV)
    unset = _manifest(compile_quant(ckpt, "h200", CASES["fp8-wo"], tmp_path / "unset.ingot"))
    # the same artifact but for the recorded switches (INGOT_QUANT_PREFILL_GEMM=1 was set for ``on``)
    assert {**unset["cuda"], "switches": None} == {**on["cuda"], "switches": None}
    assert any(ln["kernel"].startswith("dequant_") for ln in on["cuda"]["launches"])
    _, off = _compile(ckpt, "h200", "fp8-wo", tmp_path / "off.ingot", monkeypatch, on=False)
    for m in (off, _compile(ckpt, "h200", "fp8", tmp_path / "w8a8.ingot", monkeypatch)[1]):
        launches = m["cuda"]["launches"]
        qls = [ln for ln in launches if ln["op"] == "quantized_linear"]
        assert len(qls) == 8 and all(ln["kernel"].startswith("gemv_fp8_") and "_any_" in ln["kernel"] for ln in qls)
        assert not any(ln["kernel"].startswith("dequant_") for ln in launches)
        assert not any("dequant" in b for b in m["cuda"]["memory_plan"]["buffers"])


@pytest.mark.parametrize("target,spec", [("h200", "fp8:block:wo"), ("b200", "fp8:block")])
def test_block_scaled_fp8_keeps_the_gemv_where_no_pair_takes_it(ckpt, tmp_path, monkeypatch, fake_cutlass, target,
                                                                spec):
    """Weight-only FP8 in 128 x 128 blocks has no dequantize + GEMM pair (the dequantize kernel writes exact bf16 codes
    and leaves one scale per channel to the GEMM's epilogue), W8A8 in blocks no block-scaled FP8 GEMM on b200: the
    fp8_block GEMV (its any-M launch and buckets) takes every step there."""
    _, m = _compile(ckpt, target, spec, tmp_path / "block.ingot", monkeypatch)
    launches = m["cuda"]["launches"]
    qls = [ln for ln in launches if ln["op"] == "quantized_linear"]
    assert len(qls) == 8 and all(ln["kernel"].startswith("gemv_fp8_block_") and "_any_" in ln["kernel"] for ln in qls)
    assert not any(ln["kernel"].startswith(("dequant_", "quant_act_")) for ln in launches)
    assert not any(e.startswith("linear_cutlass_fp8") for e in fake_cutlass)


def test_without_gemv_variants_the_pair_runs_every_step(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    monkeypatch.setenv("INGOT_NO_GEMV", "1")
    _, manifest = _compile(ckpt, "h200", "fp8-wo", tmp_path / "nogemv.ingot", monkeypatch)
    launches = manifest["cuda"]["launches"]
    dq = [ln for ln in launches if ln["kernel"].startswith("dequant_")]
    qls = [ln for ln in launches if ln["op"] == "quantized_linear"]
    assert len(dq) == 8 and len(qls) == 16 and not any("skip" in ln or "variants" in ln for ln in qls)
    assert not any(k.startswith("gemv_") for k in manifest["cuda"]["variant_kernels"])


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("n,k", [(16384, 2048), (200, 256), (1000, 4224)])
def test_dequant_kernel_compiles_without_spills(target, fmt, n, k):
    tgt = get_target(target)
    spec = dequant_spec(fmt, n, k, tgt)
    assert spec.grid[0].const <= 8 * tgt.num_sms
    ops = sass_opcodes(spec, tgt.arch)
    assert any(o.startswith("LDG") and ".128" in o for o in ops), sorted(ops)
    assert any(o.startswith("STG") and ".128" in o for o in ops), sorted(ops)
    assert_no_local_memory(ops, "the dequantize kernel")


def test_dequant_spec_refuses_what_it_cannot_convert():
    h200 = get_target("h200")
    with pytest.raises(ValueError, match="mxfp4"):
        dequant_spec("mxfp4", 64, 256, h200)
    with pytest.raises(ValueError, match="multiple of 32"):
        dequant_spec("nvfp4", 64, 48, h200)
    assert CHUNK_CODES == {"fp8": 16, "nvfp4": 32}


def quantized_weight(fmt: str, n: int, k: int) -> dict:
    """A random weight quantized by ir/quant/formats.py, with saturated, tiny (subnormal scales) and zero parts."""
    r = rng()
    w = (r.standard_normal((n, k)) * 0.05).astype(np.float32)
    w[1::7] *= 1e-3
    w[0, :32] = 0.0
    if fmt == "fp8":
        q, s = F.quantize_fp8(w, "channel", scale=F.fp8_scale(w, "channel") * np.float32(0.5))
        return {"weight": q, "weight_scale": s, "weight_scale_2": None}
    gs = F.nvfp4_global_scale(np.abs(w).max()) * np.float32(0.25)
    q, sf = F.quantize_nvfp4(w, gs)
    return {"weight": pack_e2m1(q), "weight_scale": sf, "weight_scale_2": np.asarray(gs, np.float32).reshape(())}


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_dequant_reference_is_dequantize_weight(fmt):
    """The scratch holds exact values (no rounding in the bf16), and scratch * column scale is the reference's
    dequantized weight bit for bit: the GEMM's epilogue applies the same scale to the same values."""
    n, k = 96, 512
    wq = quantized_weight(fmt, n, k)
    scratch, column = dequant_reference(fmt, wq["weight"], wq["weight_scale"], wq["weight_scale_2"])
    assert scratch.dtype == ml_dtypes.bfloat16 and scratch.shape == (n, k)
    assert column.dtype == np.float32 and column.shape == (n,)
    want = dequantize_weight(fmt, "channel", (), "linear", k, wq["weight"], wq["weight_scale"], wq["weight_scale_2"])
    got = scratch.astype(np.float32) * column[:, None]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    if fmt == "fp8":
        exact = wq["weight"].astype(np.float64)
    else:  # e2m1 * block scale, in f64: the bf16 holds it exactly (2 x 4 significant bits)
        sf = wq["weight_scale"].astype(np.float64).repeat(16, axis=1)
        exact = unpack_e2m1(wq["weight"]).astype(np.float64) * sf
    assert np.array_equal(scratch.astype(np.float64), exact)
    assert (scratch.astype(np.float32) != 0).mean() > 0.5  # not a vacuous comparison


def _bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, np.uint32) << 16).view(np.float32)


def test_kernel_bit_placement_decodes_every_code():
    """kernel.cu's conversions, emulated: an e4m3 code's 7 magnitude bits << 4 (times 2^120), and an e2m1 code's
    ((c & 7) << 6) | ((c & 8) << 12) (times the block scale * 2^118, then 2^8), give the codes' values exactly, for
    every e4m3 code but NaN and every e2m1 code times every finite e4m3 block scale."""
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint32)
    e4m3 = _bf16_bits(((codes & 0x80) << 8) | ((codes & 0x7F) << 4)) * np.float32(2.0**120)
    want = codes.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(e4m3, want)
    assert np.array_equal(e4m3.astype(ml_dtypes.bfloat16).astype(np.float32), e4m3)  # each step exact in bf16
    nib = np.arange(16, dtype=np.uint32)
    e2m1 = _bf16_bits(((nib & 7) << 6) | ((nib & 8) << 12)).astype(np.float64)  # value * 2^-126 (0.5: subnormal)
    values = nib.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    assert np.array_equal(e2m1 * 2.0**126, values)
    sf = want.astype(np.float64)  # every finite e4m3 block scale
    step1 = (e2m1[:, None] * (sf[None, :] * 2.0**118))  # the first bf16x2 multiply: e2m1 * sf * 2^-8
    assert np.array_equal(step1.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64), step1)
    assert np.abs(step1).max() < 3.0e38 and np.abs(step1[step1 != 0]).min() >= 2.0**-126  # normal, no overflow
    assert np.array_equal(step1 * 2.0**8, values[:, None] * sf[None, :])
    # the byte order: byte b holds element 2j in its low nibble (pack_e2m1), the bf16x2's low half
    pair = lambda b: ((b & 7) << 6) | ((b & 8) << 12) | ((b & 0x70) << 18) | ((b & 0x80) << 24)  # noqa: E731
    b = np.arange(256, dtype=np.uint32)
    assert np.array_equal(pair(b) & 0xFFFF, ((b & 0xF & 7) << 6) | ((b & 0xF & 8) << 12))
    assert np.array_equal(pair(b) >> 16, (((b >> 4) & 7) << 6) | (((b >> 4) & 8) << 12))


def test_cutlass_tuning_shape_of_a_quantized_linear():
    """Autotuning (on a GPU of the target's arch) asks about the GEMM's shaped spec: K is ``in_features`` (an NVFP4
    weight holds K/2 bytes a row) and the bias is input 5 (input 2 is the weight's scale)."""
    from ingot.ir.graph import Node, Value
    from ingot.ir.ops.quantized import QuantizedLinear
    from ingot.ir.types import DType, TensorType

    generic = cp.generic_linear_spec("bf16", get_target("h200"))
    op = QuantizedLinear(weight_format="nvfp4", in_features=256)
    types = [TensorType(DType.bf16, ("T", 256)), TensorType(DType.u8, (64, 128)), TensorType(DType.f8e4m3fn, (64, 16)),
             TensorType(DType.f32, ()), None, TensorType(DType.bf16, (64,))]
    values = [Value(f"v{i}", t) if t is not None else None for i, t in enumerate(types)]
    for bias in (False, True):
        node = Node(op, values if bias else values[:5], [Value("out", TensorType(DType.bf16, ("T", 64)))])
        shaped = cp.tuning_spec(generic, node)
        assert shaped is not None
        v = dict(shaped.values)
        assert (v["N"], v["K"], v["ROWS"], v["HAS_BIAS"]) == (64, 256, "T", bias)
        assert cp.kernel_spec(shaped) == generic


@pytest.mark.parametrize("any_m", [False, True])
def test_executor_launches_pick_per_step(ckpt, tmp_path, monkeypatch, any_m):
    """The kernel table runs on the executor's launches unchanged (``runtime/cuda_launch.Launch``, built as
    ``CudaExecutor`` builds them; the driver's launch recorded, no GPU): up to 64 rows (``any_m``,
    ``INGOT_WO_GEMM_ROWS=256``: 256) the dequantize launch is skipped and the GEMM launch runs the quantized GEMV (a
    bucket up to 64 rows, the any-M launch up to 256) with the quantized weight's pointers; above, the dequantize
    kernel writes the scratch and the GEMM reads it."""
    from ingot.codegen.kernel import KernelSpec
    from ingot.runtime import cuda_driver
    from ingot.runtime import cuda_launch as cl

    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    monkeypatch.setenv(quant_prefill.WO_ENV, "256" if any_m else "")
    _, manifest = _compile(ckpt, "h200", "fp8-wo", tmp_path / "x.ingot", monkeypatch)
    cuda = manifest["cuda"]
    buffers = cuda["memory_plan"]["buffers"]
    base = {"weights": 0, "io": 1 << 40, "scratch": 2 << 40}
    address = {n: base[b["region"]] + b["offset"] for n, b in buffers.items() if b["region"] != "kv"}.__getitem__
    specs = {e: KernelSpec.from_dict(k["spec"]) for e, k in {**cuda["kernels"], **cuda["variant_kernels"]}.items()}
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(cuda_driver, "launch", lambda fn, grid, block, smem, stream, params, what, pdl=False:
                        calls.append((fn, params)))
    j = next(j for j, ln in enumerate(cuda["launches"]) if ln["kernel"].startswith("dequant_"))
    dq_ln, gemm_ln = cuda["launches"][j], cuda["launches"][j + 1]
    dq = cl.Launch(dq_ln["kernel"], specs[dq_ln["kernel"]], dq_ln["args"], address, "dequant",
                   rows_arg=dq_ln["rows_arg"], skip_rows=dq_ln["skip"]["max_rows"])
    variants = [(v["max_rows"], v["kernel"], specs[v["kernel"]], cl.Arguments(specs[v["kernel"]], v["args"], address))
                for v in gemm_ln["variants"]]
    gemm = cl.Launch(gemm_ln["kernel"], specs[gemm_ln["kernel"]], gemm_ln["args"], address, "gemm", variants)
    scratch, weight = address(gemm_ln["args"]["weight"]["buffer"]), address(dq_ln["args"]["weight"]["buffer"])
    assert scratch >= base["scratch"] and weight < base["io"]
    most = variants[-1][0]
    assert most == (quant_prefill.GEMV_MAX_ROWS if any_m else 64)
    for t in (1, 8, 9, 17, 64, 65, 256, 257, 310, 2048):
        calls.clear()
        dq.enqueue({"T": t}, None)  # type: ignore[arg-type]
        gemm.enqueue({"T": t}, None)  # type: ignore[arg-type]
        if t <= most:
            bucket = next(v for v in variants if t <= v[0])
            assert bool(dict(bucket[2].values)["ANY_M"]) == (t > 64), bucket[1]
            assert [c[0] for c in calls] == [bucket[1]], t
            own = bucket[3]
            names = [p.name for p in bucket[2].params]
            assert calls[0][1] == own.addr and own.values[names.index("weight")].value == weight
            assert own.values[names.index("M")].value == t
        else:
            assert [c[0] for c in calls] == [dq_ln["kernel"], gemm_ln["kernel"]], t
            dnames, gnames = [p.name for p in dq.spec.params], [p.name for p in gemm.spec.params]
            assert dq.values[dnames.index("out")].value == scratch == gemm.values[gnames.index("weight")].value
            assert calls[1][1] == gemm.params_addr and gemm.values[gnames.index("M")].value == t
    assert (dq.skips, gemm.variant_launches) == ((7, 7) if any_m else (5, 5))


W8A8_CASES = {**test_lower_quant.CASES, "fp8-tensor": {"default": "fp8:tensor"},
              "fp8-tensor-static": {"default": "fp8:tensor:static"}}


@pytest.mark.parametrize("target,case", [("h200", "fp8"), ("h200", "fp8-static"), ("b200", "fp8"),
                                         ("h200", "fp8-tensor"), ("h200", "fp8-tensor-static"),
                                         ("b200", "fp8-tensor"), ("h200", "fp8-block")])
def test_w8a8_linears_lower_to_quantizer_and_fp8_gemm(ckpt, tmp_path, monkeypatch, fake_cutlass, target, case):
    """A W8A8 FP8 linear (per token, or the static calibrated scale) becomes the activation quantizer (skipped up to
    16 rows, ``W8A8_GEMM_ROWS``, into the GEMM) and the shape-generic FP8 CUTLASS GEMM reading its codes and row scales
    with the weight's own per-channel scale (weights quantized per tensor: their scale broadcast to [N] by
    ``fp8-channel-scales``, the same kernels); the GEMM's variants are the W8A8 GEMV's buckets 8 and 16 with the
    node's arguments, the quantized activations temporaries of their node (e4m3 [T, K], f32 [T]) in the scratch
    region. FP8 weights in 128 x 128 blocks: the GEMM's block-rows build (the block scales [ceil(N/128)][K/128] in
    its mainloop, x's per-row scale in its epilogue), the GEMV's fp8_block variants."""
    monkeypatch.delenv(quant_prefill.W8A8_ENV, raising=False)
    static, per_tensor, block = case.endswith("-static"), case.startswith("fp8-tensor"), case == "fp8-block"
    path, manifest = _compile(ckpt, target, W8A8_CASES[case], tmp_path / "on.ingot", monkeypatch)
    cuda, tgt = manifest["cuda"], get_target(target)
    launches = cuda["launches"]
    qls = [(j, ln) for j, ln in enumerate(launches) if ln["op"] == "quantized_linear"]
    assert len(qls) == 16
    gemv = {}  # one case against the GEMV's own launches without this step (a second compile: seconds each)
    if (target, case) == ("h200", "fp8"):
        _, off = _compile(ckpt, target, test_lower_quant.CASES[case], tmp_path / "off.ingot", monkeypatch, on=False)
        gemv = {ln["node"]: ln for ln in off["cuda"]["launches"] if ln["op"] == "quantized_linear"}
    seen = set()
    for (jq, q), (jg, gemm) in zip(qls[::2], qls[1::2]):
        assert jg == jq + 1 and q["node"] == gemm["node"]
        out = gemm["args"]["out"]["buffer"]
        n, k, residual = LINEARS[out.split(".")[-1]]
        seen.add(out)
        # the node's quantized-GEMV arguments (bucket 16's: the qkv's bucket 8 adds the rope epilogue's, qkv-rope
        # fusion's default for W8A8)
        own = gemm["variants"][-1]["args"]
        if gemv:
            assert own == gemv[q["node"]]["args"]
            assert [v["kernel"] for v in gemm["variants"]] == [v["kernel"] for v in gemv[q["node"]]["variants"][:2]]
        assert own["x"]["buffer"] != out and own["out"] == {"buffer": out} and own["M"] == {"dim": "T"}
        # 1. the quantizer: x -> the temporaries, the static scale where there is one
        qspec = cuda["kernels"][q["kernel"]]["spec"]
        assert qspec["family"] == "quant_act" and qspec["template"] == "fp8.cu"
        assert qspec["values"] == {"K": k, "STATIC": static, "BLOCK": 256}
        assert [p for p, _ in qspec["params"]] == [p for p, _ in FP8_PARAMS]
        assert q["skip"] == {"max_rows": quant_prefill.W8A8_GEMM_ROWS, "into": jg} and q["rows_arg"] == "M"
        xq, xs = ({"buffer": f"{out}{sfx}"} for sfx in (quant_prefill.X_FP8_SUFFIX, quant_prefill.X_SCALE_SUFFIX))
        assert q["args"] == {"x": own["x"], "input_scale": own["input_scale"] if static else {"null": True},
                             "x_fp8": xq, "x_scale": xs, "M": {"dim": "T"}}
        assert ("buffer" in q["args"]["input_scale"]) == static
        # 2. the FP8 GEMM: the generic CUTLASS spec of the shape's configuration, no plain alternative
        gspec = cuda["kernels"][gemm["kernel"]]["spec"]
        if block:
            want = cp.generic_linear_spec("fp8", tgt, residual=residual, weight_scales="block-rows")
        else:
            want = cp.generic_linear_spec("fp8", tgt, residual=residual, config=shape_config("fp8", n, k, tgt))
        assert gemm["kernel"] == want.entry and gspec["values"]["ABI"] == cp.ABI, gemm["kernel"]
        assert gspec["values"]["WEIGHT_SCALES"] == (3 if block else 0)  # 128 x 128 blocks with row scales; channel
        scale = cuda["memory_plan"]["buffers"][own["weight_scale"]["buffer"]]
        assert scale["dtype"] == "f32" and scale["shape"] == ([-(-n // 128), k // 128] if block else [n]), scale
        assert gspec["template"] == ("sm90.cu" if target == "h200" else "sm100.cu")
        assert [p for p, _ in gspec["params"]] == [p for p, _ in cp.FP8_LINEAR_PARAMS]
        assert gemm["args"] == {"x": xq, "weight": own["weight"], "x_scale": xs, "weight_scale": own["weight_scale"],
                                "bias": own["bias"], "residual": own["residual"], "out": own["out"],
                                "M": {"dim": "T"}}
        assert "alternatives" not in gemm and "skip" not in gemm
        # its variants: the W8A8 GEMV's buckets up to W8A8_GEMM_ROWS, each with the node's own arguments (the
        # GEMV's own variants without this step)
        assert [v["max_rows"] for v in gemm["variants"]] == [8, 16] == [quant_prefill.W8A8_GEMM_ROWS // 2,
                                                                    quant_prefill.W8A8_GEMM_ROWS]
        for v, mb in zip(gemm["variants"], (8, 16)):
            vspec = cuda["variant_kernels"][v["kernel"]]["spec"]
            assert vspec["template"] == "quant.cu" and vspec["values"]["AFMT"] == (2 if static else 1)
            assert vspec["values"]["WFMT"] == (2 if block else 0)
            assert (vspec["values"]["MB"], vspec["values"]["N"], vspec["values"]["K"]) == (mb, n, k)
            rope = out.endswith(".qkv") and mb == 8  # its rope launch skipped into this variant
            assert bool(vspec["values"]["ROPE"]) == rope, (out, mb)
            assert {a: v["args"][a] for a in own} == own
            assert set(v["args"]) - set(own) == (set(qkv_rope_fusion.ROPE_ARGS) if rope else set())
    assert len(seen) == 8
    # the temporaries: planned per node in the scratch region, the plan the table rebuilds
    graph, _ = load_graph(path)
    qnodes = [nd for nd in graph.nodes if nd.op.name == "quantized_linear"]
    assert len(qnodes) == 8 and all(nd.op.weight_granularity == ("block" if block else "channel") for nd in qnodes)
    if per_tensor:  # every row's scale the tensor's one
        assert all(len(set(graph.weights[nd.inputs[2].name].load().tolist())) == 1 for nd in qnodes)
    plan = cuda["memory_plan"]
    temps = quant_prefill.temporaries(graph, launches)
    assert len(temps) == 16
    for name, (node, t) in temps.items():
        b = plan["buffers"][name]
        assert b["region"] == "scratch" and b["dtype"] == t.dtype.value and b["shape"] == list(t.shape), name
        x = graph.nodes[node].inputs[0]
        assert b["shape"][0] == x.type.shape[0] and b["dtype"] in ("f8e4m3fn", "f32")
    again = plan_memory(graph, plan["bindings"], reads=variant_reads(launches), temporaries=temps)
    assert again.to_dict() == plan
    assert fake_cutlass and all(e.startswith("linear_cutlass_fp8") for e in fake_cutlass)


@pytest.mark.parametrize("rows,variants", [("0", []), ("64", [8, 16, 32, 64])])
def test_w8a8_gemm_rows_moves_the_boundary(ckpt, tmp_path, monkeypatch, fake_cutlass, rows, variants):
    """``INGOT_W8A8_GEMM_ROWS``: the W8A8 GEMV keeps the steps up to that many rows (its buckets up to it; 256: its
    any-M launch too, checked without compiling by ``test_w8a8_gemm_rows_names_what_it_takes``), the quantizer is
    skipped up to it, the pair takes the rest; 0: the pair at every step."""
    monkeypatch.setenv(quant_prefill.W8A8_ENV, rows)
    _, manifest = _compile(ckpt, "h200", "fp8", tmp_path / "w8a8.ingot", monkeypatch)
    launches = manifest["cuda"]["launches"]
    quantizers = [j for j, ln in enumerate(launches) if ln["kernel"].startswith("quant_act_fp8_")]
    assert len(quantizers) == 8
    for j in quantizers:
        gemm = launches[j + 1]
        assert gemm["kernel"].startswith("linear_cutlass_fp8")
        assert [v["max_rows"] for v in gemm.get("variants", [])] == variants
        assert ("skip" in launches[j]) == bool(variants)
        if variants:
            assert launches[j]["skip"] == {"max_rows": variants[-1], "into": j + 1}
    assert manifest["cuda"]["switches"][quant_prefill.W8A8_ENV] == rows


def test_w8a8_gemm_rows_names_what_it_takes(monkeypatch):
    monkeypatch.delenv(quant_prefill.W8A8_ENV, raising=False)
    assert quant_prefill.w8a8_gemm_rows() == quant_prefill.W8A8_GEMM_ROWS == 16
    for rows in ("0", "8", "64", "256"):
        monkeypatch.setenv(quant_prefill.W8A8_ENV, f" {rows} ")
        assert quant_prefill.w8a8_gemm_rows() == int(rows)
    monkeypatch.setenv(quant_prefill.W8A8_ENV, "100")
    with pytest.raises(ValueError, match="INGOT_W8A8_GEMM_ROWS='100': expected one of"):
        quant_prefill.w8a8_gemm_rows()
