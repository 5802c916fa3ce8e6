"""W8A8's decode GEMV with the rms_norm prologue (``quant.cu``'s ``PROLOGUE``, ``quant_rule.fused_quant_spec``;
opt-in, ``INGOT_W8A8_NORM_FUSION=1``): the spec, its errors, NVRTC builds without local memory for sm_90a and sm_100a
(with the rope epilogue too), and decode fusion planning it in a W8A8 artifact. Its numerics are checked on a GPU
(``test_quant_norm_prologue_gpu.py``)."""

from __future__ import annotations

import json

import pytest

from ingot.codegen.kernels.gemv import quant_rule
from ingot.codegen.kernels.gemv.rule import ROPE_PARAMS, Prologue, RopeEpilogue, fused_spec
from ingot.codegen.target import get_target
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    needs_compiler,
    sass_opcodes,
    session_kernel_cache,
)

ARCH = {"h200": "sm_90a", "b200": "sm_100a"}
NORM = Prologue("rms_norm", eps=1e-5)


def test_fused_spec_takes_the_norm_weight_and_keeps_the_configuration():
    tgt = get_target("h200")
    plain = quant_rule.quant_gemv_spec(3072, 2048, 8, tgt, "fp8", "fp8", "token")
    f = fused_spec(plain, NORM, tgt)  # rule.fused_spec hands quant.cu variants to quant_rule
    assert f.template == "quant.cu" and f.value("PROLOGUE") == 1 and f.value("EPS") == 1e-5
    assert [p.name for p in f.params] == [p for p, _ in quant_rule.PARAMS] + ["norm_weight"]
    assert quant_rule.spec_config(f) == quant_rule.spec_config(plain) and f.grid == plain.grid
    assert "_rms_norm" in f.entry and f.key != plain.key
    assert plain.value("PROLOGUE") == 0
    roped = quant_rule.with_rope(f, RopeEpilogue(32, 8, 64, False, 16), tgt)  # keeps the prologue
    assert roped.value("PROLOGUE") == 1 and roped.value("ROPE")
    assert [p.name for p in roped.params] == [p for p, _ in quant_rule.PARAMS] + ["norm_weight"] + \
        [p for p, _ in ROPE_PARAMS]


@pytest.mark.parametrize("what", ["swiglu", "weight-only", "any-m", "twice"])
def test_what_the_prologue_does_not_take(what):
    tgt = get_target("h200")
    plain = quant_rule.quant_gemv_spec(2048, 2048, 8, tgt, "fp8", "fp8", "token")
    with pytest.raises(ValueError, match="prologue"):
        if what == "swiglu":
            quant_rule.fused_quant_spec(plain, Prologue("swiglu"), tgt)
        elif what == "weight-only":
            quant_rule.fused_quant_spec(quant_rule.quant_gemv_spec(2048, 2048, 8, tgt, "fp8", "none"), NORM, tgt)
        elif what == "any-m":
            quant_rule.quant_gemv_spec(2048, 2048, 64, tgt, "fp8", "fp8", any_m=True, prologue=NORM)
        else:
            quant_rule.fused_quant_spec(quant_rule.fused_quant_spec(plain, NORM, tgt), NORM, tgt)


def test_switch_reads_0_or_1(monkeypatch):
    monkeypatch.delenv(quant_rule.W8A8_NORM_ENV, raising=False)
    assert not quant_rule.w8a8_norm_fusion_on()
    monkeypatch.setenv(quant_rule.W8A8_NORM_ENV, "1")
    assert quant_rule.w8a8_norm_fusion_on()
    monkeypatch.setenv(quant_rule.W8A8_NORM_ENV, "yes")
    with pytest.raises(ValueError, match=quant_rule.W8A8_NORM_ENV):
        quant_rule.w8a8_norm_fusion_on()


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("gran", ["token", "tensor"])
@pytest.mark.parametrize("rope", [False, True])
def test_fused_variants_compile_without_local_memory(target, gran, rope):
    tgt = get_target(target)
    spec = quant_rule.fused_quant_spec(quant_rule.quant_gemv_spec(3072, 2048, 8, tgt, "fp8", "fp8", gran), NORM, tgt)
    if rope:
        spec = quant_rule.with_rope(spec, RopeEpilogue(32, 8, 64, False, 16), tgt)
    ops = sass_opcodes(spec, ARCH[target])
    assert_no_local_memory(ops, spec.entry)
    assert any(o.startswith("MUFU.RSQ") for o in ops), spec.entry  # the per-token 1 / rms


@pytest.mark.usefixtures("session_kernel_cache")  # whole-model compiles: see common.py
@needs_compiler
@pytest.mark.parametrize("switch", ["1", "0"])
def test_decode_fusion_gives_w8a8_the_norm_prologue_when_asked(tmp_path, monkeypatch, switch):
    """The tiny W8A8 Llama on h200 (the GEMV serving every step: no CUTLASS here): with the switch, each rms_norm that
    feeds a linear (the layers' two, the final norm's lm_head is bf16 and fused as before) is skipped up to 8 rows
    into that linear's bucket-8 variant, which reads the norm's input and weight (the qkv's with the rope epilogue
    too); without it only the bf16 lm_head's norm is fused."""
    from tests.codegen.test_lower_quant import compile_quant, quant_checkpoint

    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    monkeypatch.setenv(quant_rule.W8A8_NORM_ENV, switch)
    path = compile_quant(quant_checkpoint(tmp_path), "h200", {"default": "fp8"}, tmp_path / "q.ingot")
    cuda = json.loads((path / "manifest.json").read_text())["cuda"]
    launches = cuda["launches"]
    norms = [ln for ln in launches if ln["op"] == "rms_norm"]
    skipped = [ln for ln in norms if "skip" in ln]
    into = [launches[ln["skip"]["into"]] for ln in skipped]
    assert {ln["op"] for ln in into} <= {"quantized_linear", "linear"}
    quantized = [(ln, c) for ln, c in zip(skipped, into) if c["op"] == "quantized_linear"]
    if switch == "0":
        assert not quantized
        return
    assert len(quantized) == len(norms) - 1 and len(into) == len(norms)  # every layer norm; the final one as before
    for norm, lin in quantized:
        assert norm["skip"]["max_rows"] == 8
        first, *rest = lin["variants"]
        spec = cuda["variant_kernels"][first["kernel"]]["spec"]
        assert first["max_rows"] == 8 and spec["template"] == "quant.cu" and spec["values"]["PROLOGUE"] == 1
        assert first["args"]["x"] == norm["args"]["x"] and first["args"]["norm_weight"] == norm["args"]["weight"]
        assert all(cuda["variant_kernels"][v["kernel"]]["spec"]["values"]["PROLOGUE"] == 0 for v in rest)
    assert sum(cuda["variant_kernels"][lin["variants"][0]["kernel"]]["spec"]["values"]["ROPE"]
               for _, lin in quantized) == len(quantized) // 2  # the qkv projections'
