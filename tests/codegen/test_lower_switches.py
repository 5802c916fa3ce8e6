"""Every lowering switch at once, without a GPU: the kernel table stays coherent.

Five steps change the launch list after ``plan_launches``, each tested alone beside its module: rope-cache fusion (on by
default, ``INGOT_ROPE_CACHE_FUSION=0`` turns it off; drops the attention's cache-write launch), the quantized prefill
GEMM (on by default, ``INGOT_QUANT_PREFILL_GEMM=0`` turns it off; one launch becomes two), the wgmma prefill attention
(the default on sm_90a, ``INGOT_PREFILL_ATTENTION=flash`` turns it off), decode fusion (on by default,
``INGOT_DECODE_FUSION=0`` turns it off; skips launches by index) and qkv-rope fusion (on by default for bf16 weights,
``all`` here for the FP8 ones too; skips the rope launch into the qkv GEMV before it). Here they run together on the
tiny quantized Llama (FP8 weight-only, and unquantized) for h200, and the table is checked as the executor reads it:
every launch and variant binds exactly its kernel's parameters to buffers of the memory plan (or null / a dim), every
``skip`` points at a launch of the right node (forward, or back at the qkv GEMV for the rope launch), every named
kernel is in the table, and each switch left its mark (as many launches removed and added as its own test predicts).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ingot
from ingot.codegen import decode_fusion, qkv_rope_fusion, quant_prefill, rope_cache_fusion
from ingot.codegen.kernels.attention import prefill_rule
from ingot.runtime.artifact import load_graph
from tests.codegen import test_lower_quant
from tests.codegen.common import needs_compiler, session_kernel_cache  # noqa: F401 (a fixture)
from tests.codegen.test_lower_quant import FAST

SWITCHES = {rope_cache_fusion.ENV: "1", quant_prefill.ENV: "1", "INGOT_PREFILL_ATTENTION": "wgmma",
            "INGOT_DECODE_FUSION": "1", qkv_rope_fusion.ENV: "all"}
#: each switch's off value (all five are on by default, qkv-rope fusion for bf16 weights)
OFF = {rope_cache_fusion.ENV: "0", quant_prefill.ENV: "0", "INGOT_PREFILL_ATTENTION": "flash",
       "INGOT_DECODE_FUSION": "0", qkv_rope_fusion.ENV: "0"}
LAYERS = 2
#: quantized linears of the tiny Llama: qkv, o_proj, gate_up, down per layer (the lm_head stays bf16)
QUANTIZED = 4 * LAYERS

pytestmark = [needs_compiler, pytest.mark.usefixtures("session_kernel_cache")]
#: the tiny quantized Llama's checkpoint (a module-scoped fixture)
ckpt = test_lower_quant.ckpt


@pytest.fixture(autouse=True)
def _environment(monkeypatch):
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")  # the template GEMMs: no nvcc builds (CUTLASS: their own tests)
    monkeypatch.setenv("INGOT_AUTOTUNE", "0")
    for k in SWITCHES:
        monkeypatch.delenv(k, raising=False)


def _compile(ckpt: Path, out: Path, quant: dict | None, monkeypatch, on: bool) -> dict:
    with monkeypatch.context() as mp:
        for k, v in (SWITCHES if on else OFF).items():
            mp.setenv(k, v)
        path = ingot.compile(ckpt, target="h200", out=out, quant_config={**quant, **FAST} if quant else None)
    return json.loads((path / "manifest.json").read_text())


def _check_binding(what: str, spec: dict, args: dict, buffers: dict) -> None:
    params = [p for p, _ in spec["params"]]
    assert set(args) == set(params), (what, sorted(args), params)
    for name, a in args.items():
        assert set(a) <= {"buffer", "null", "dim", "value", "offset"} and a, (what, name, a)
        if "buffer" in a:
            assert a["buffer"] in buffers, (what, name, a["buffer"])


@pytest.mark.parametrize("quant", ["fp8-wo", "bf16"])
def test_all_switches_at_once_keep_the_kernel_table_coherent(ckpt, tmp_path, monkeypatch, quant):
    config = {"default": "fp8:wo"} if quant == "fp8-wo" else None
    assert quant_prefill.enabled() and prefill_rule.prefill_kernel() == "wgmma"  # the defaults
    assert decode_fusion.enabled() and rope_cache_fusion.enabled()
    off = _compile(ckpt, tmp_path / "off.ingot", config, monkeypatch, on=False)["cuda"]
    manifest = _compile(ckpt, tmp_path / "on.ingot", config, monkeypatch, on=True)
    cuda = manifest["cuda"]
    launches = cuda["launches"]
    kernels = {**cuda["kernels"], **cuda.get("variant_kernels", {}), **cuda.get("alternative_kernels", {})}
    buffers = cuda["memory_plan"]["buffers"]

    for j, ln in enumerate(launches):
        assert ln["kernel"] in kernels, (j, ln["kernel"])
        _check_binding(f"launch {j}", kernels[ln["kernel"]]["spec"], ln["args"], buffers)
        for v in ln.get("variants", []):
            assert v["kernel"] in kernels, (j, v["kernel"])
            _check_binding(f"launch {j} variant {v['kernel']}", kernels[v["kernel"]]["spec"], v.get("args", ln["args"]),
                           buffers)
        for alt in ln.get("alternatives", []):
            _check_binding(f"launch {j} alternative {alt['kernel']}", kernels[alt["kernel"]]["spec"], ln["args"],
                           buffers)
        skip = ln.get("skip")
        if skip:  # the launch that computes the skipped one's work in small steps, counting the same rows: later,
            into = launches[skip["into"]]  # or for the rope launch the qkv GEMV whose output it reads
            back = ln["op"] == "rope_qkv" and into["args"].get("out") == ln["args"]["qkv"]
            assert (skip["into"] < j if back else skip["into"] > j) and into.get("variants"), (j, skip)
            assert max(v["max_rows"] for v in into["variants"]) >= skip["max_rows"], (j, skip)
            rows = ln["args"][ln["rows_arg"]]
            assert rows in (into["args"].get("M"), into["args"].get(into.get("rows_arg", "M"))), (j, rows)

    # each switch's mark, counted against the same model lowered with every switch off
    def count(table: list[dict], prefix: str) -> int:
        return sum(ln["kernel"].startswith(prefix) for ln in table)

    rope_fused = [ln for ln in launches if ln["op"] == "rope_qkv" and "kv_cache" in ln["args"]]
    assert len(rope_fused) == LAYERS
    dequant = count(launches, "dequant_")
    assert dequant == (QUANTIZED if quant == "fp8-wo" else 0)
    assert len(launches) == len(off["launches"]) - LAYERS + dequant
    attention = [ln for ln in launches if ln["op"] == "paged_attention"]
    assert len(attention) == LAYERS and all("wgmma" in kernels[ln["kernel"]]["spec"]["template"] for ln in attention)
    assert all(ln["variants"][0]["max_rows"] == prefill_rule.DECODE_MAX_ROWS for ln in attention)
    fused_skips = [ln for ln in launches if ln.get("skip") and not ln["kernel"].startswith("dequant_")]
    assert fused_skips, "decode fusion skipped nothing (at least the final norm into the bf16 lm_head)"
    assert sum(ln["op"] == "rope_qkv" and "skip" in ln for ln in launches) == LAYERS  # qkv-rope fusion

    # the graph in the artifact is the CPU backend's, unchanged by the lowering's switches
    graph, _ = load_graph(tmp_path / "on.ingot")
    graph_off, _ = load_graph(tmp_path / "off.ingot")
    assert [n.op.name for n in graph.nodes] == [n.op.name for n in graph_off.nodes]
