"""Programmatic dependent launch (``codegen/kernel.py`` ``PDL_PROLOGUE``): every template kernel starts by waiting
for the grid before it (``griddepcontrol.wait``) and then lets the next one be scheduled; the kernel table marks
those kernels ``"pdl": true`` and only those are launched with programmatic stream serialization
(``runtime/cuda_driver.py``). The GPU check (same logits with and without) is in tests/runtime/test_cuda_backend.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import ingot
from ingot.codegen.compile import compile_spec
from ingot.codegen.kernel import PDL_MARKER, PDL_PLACEHOLDER, PDL_TRIGGER_ENV, has_pdl
from ingot.codegen.kernels.gemm_cutlass.rule import linear_cutlass_spec
from ingot.codegen.kernels.gemv.quant_rule import quant_gemv_spec
from ingot.codegen.kernels.gemv.rule import gemv_spec
from ingot.codegen.kernels.norm.rule import norm_spec
from ingot.codegen.sass import disassemble, opcodes
from ingot.codegen.target import get_target
from ingot.ir.types import DType
from ingot.runtime import cuda_driver
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    module_kernel_cache,
    needs_compiler,
    needs_cuobjdump,
    session_kernel_cache,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_template_kernels_start_with_the_prologue():
    src = norm_spec("rms", DType.bf16, DType.bf16, 2048, 1e-6, get_target("h200")).source()
    kernels = re.findall(r'extern "C" __global__[^{;]*\{', src)
    assert kernels and src.count(PDL_MARKER) == len(kernels)
    body = src[src.index(kernels[0]) + len(kernels[0]):]
    assert body.lstrip().startswith("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900")
    assert body.index("griddepcontrol.wait") < body.index("griddepcontrol.launch_dependents") < body.index("#endif")


def test_gemv_waits_after_its_first_weight_stage():
    """The bf16 decode GEMV places the wait itself: in the source its first stage of weight loads comes before it,
    every read of x (the previous kernel's output) after it; one wait per kernel, none injected at the start. (The
    quantized GEMV has nothing to do before its wait: it starts with the injected prologue.) The source order only:
    in a plain variant's SASS ptxas moves those ``ld.global.nc`` loads behind the wait (docs/PERF.md, "Decode fusion
    v2"); ``weights_first`` variants (the fused ones) keep them first, which
    tests/codegen/test_decode_fusion.py::test_fused_gemv_loads_its_first_weight_stage_before_the_wait checks."""
    src = gemv_spec(2048, 2048, 8, get_target("h200")).source()
    assert PDL_PLACEHOLDER not in src and src.count(PDL_MARKER) == 1
    body = src[src.index('extern "C" __global__'):]
    wait = body.index(PDL_MARKER)
    assert body.index("gemv_ld_stream(") < wait < body.index("griddepcontrol.launch_dependents")
    reads = [m.start() for m in re.finditer(r"gemv_ld_x\(x", body)]
    assert reads and min(reads) > wait
    quant = quant_gemv_spec(2048, 2048, 8, get_target("h200"), "fp8", "fp8", "token").source()
    qbody = quant[quant.index('extern "C" __global__'):]
    assert quant.count(PDL_MARKER) == 1 and qbody.index(PDL_MARKER) < qbody.index("qg_ld_x(x")


def test_cutlass_kernels_have_no_prologue():
    assert not has_pdl(linear_cutlass_spec("bf16", 0, 0, get_target("h200")).source())


@needs_compiler
@needs_cuobjdump
@pytest.mark.parametrize("target", ["h200", "b200"])
def test_prologue_is_in_the_sass(target):
    ops = opcodes(disassemble(compile_spec(gemv_spec(2048, 2048, 8, get_target(target))).cubin))
    assert "ACQBULK" in ops and "PREEXIT" in ops  # griddepcontrol.wait / .launch_dependents


@pytest.mark.usefixtures("session_kernel_cache")  # whole-model compiles: see common.py
@needs_compiler
def test_kernel_table_marks_pdl_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    path = ingot.compile(FIXTURES / "tiny_llama_kv.onnx", target="h200", out=tmp_path / "t.ingot", mode="llm")
    cuda = json.loads((path / "manifest.json").read_text())["cuda"]
    tables = {**cuda["kernels"], **cuda.get("variant_kernels", {}), **cuda.get("alternative_kernels", {})}
    assert tables
    for entry, k in tables.items():
        source = (path / k["source"]).read_text()
        assert k.get("pdl", False) == has_pdl(source), entry
        assert k.get("pdl") == (k["spec"]["family"] not in ("gemm_cutlass", "tvm")), entry


def test_switch(monkeypatch):
    monkeypatch.delenv("INGOT_PDL", raising=False)
    assert cuda_driver.pdl_enabled()
    monkeypatch.setenv("INGOT_PDL", "0")
    assert not cuda_driver.pdl_enabled()


def _body(src: str) -> str:
    return src[src.index('extern "C" __global__'):]


def test_early_trigger_puts_launch_dependents_before_the_wait(monkeypatch):
    """``INGOT_PDL_TRIGGER=early`` (compile time): the injected prologue and the one a template places itself both
    trigger the next grid before waiting; every read of the previous kernel's output stays after the wait, and each
    kernel still has exactly one wait. Unset or ``wait``: today's order. Another value: an error naming it."""
    h200 = get_target("h200")
    for value, early in (("", False), ("wait", False), ("early", True), (" EARLY ", True)):
        monkeypatch.setenv(PDL_TRIGGER_ENV, value)
        norm = _body(norm_spec("rms", DType.bf16, DType.bf16, 2048, 1e-6, h200).source())
        assert norm.count(PDL_MARKER) == 1
        assert (norm.index("griddepcontrol.launch_dependents") < norm.index(PDL_MARKER)) is early, value
        gemv = _body(gemv_spec(2048, 2048, 8, h200).source())
        wait = gemv.index(PDL_MARKER)
        assert gemv.count(PDL_MARKER) == 1 and min(m.start() for m in re.finditer(r"gemv_ld_x\(x", gemv)) > wait
        assert (gemv.index("griddepcontrol.launch_dependents") < wait) is early, value
    monkeypatch.setenv(PDL_TRIGGER_ENV, "sometimes")
    with pytest.raises(ValueError, match="INGOT_PDL_TRIGGER='sometimes'"):
        norm_spec("rms", DType.bf16, DType.bf16, 2048, 1e-6, h200).source()


@needs_compiler
@needs_cuobjdump
def test_early_trigger_order_survives_ptxas(monkeypatch):
    """In the SASS of an early-trigger kernel PREEXIT (launch_dependents) comes before ACQBULK (the wait); by
    default after it."""
    for value, early in (("early", True), ("", False)):
        monkeypatch.setenv(PDL_TRIGGER_ENV, value)
        sass = disassemble(compile_spec(norm_spec("rms", DType.bf16, DType.bf16, 2048, 1e-6,
                                                  get_target("h200"))).cubin)
        order = re.findall(r"\b(PREEXIT|ACQBULK)\b", sass)
        assert order and set(order) == {"PREEXIT", "ACQBULK"}, order
        assert (order[0] == "PREEXIT") is early, (value, order)
