"""qkv-rope fusion (``codegen/qkv_rope_fusion.py``) without a GPU: in a Llama table the qkv projection's bucket-8 GEMV
variant gets the rope epilogue (``kernels/gemv/kernel.cu``, ``rule.with_rope``) bound to the rope launch's q buffer,
KV cache, positions, tables and slots, and the rope launch is skipped for steps of at most 8 tokens; every other
launch and variant is unchanged; ``INGOT_QKV_ROPE_FUSION=0`` gives the table without it; in the memory plan q's
bytes are q's from the qkv node on (no buffer the fused variant reads shares them); nothing fuses where the qkv row
has another reader; the epilogue's variants compile for sm_90a and sm_100a without local memory; the rule refuses
what the epilogue cannot do. The kernels run on the GPU in ``test_qkv_rope_fusion_gpu.py`` (bit for bit against the
variant followed by ``rope/qkv_cache.cu``) and ``tests/runtime/test_qkv_rope_fusion_gpu.py`` (same logits)."""

from __future__ import annotations

import json
import re

import pytest

import ingot
from ingot.codegen import qkv_rope_fusion
from ingot.codegen.kernels.gemv.rule import (
    ROPE_PARAMS,
    ROPE_PRELOAD_ENV,
    Prologue,
    RopeEpilogue,
    fused_spec,
    gemv_config,
    gemv_spec,
    rope_preload,
    with_rope,
)
from ingot.codegen.target import get_target
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    compiled,
    disassembled,
    module_kernel_cache,
    needs_compiler,
    sass_opcodes,
    session_kernel_cache,
)
from tests.codegen.test_lower import FIXTURES

ARCH = {"h200": "sm_90a", "b200": "sm_100a"}


def _table(tmp_path, target: str, name: str, monkeypatch, flag: str | None) -> dict:
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    if flag is None:
        monkeypatch.delenv(qkv_rope_fusion.ENV, raising=False)
    else:
        monkeypatch.setenv(qkv_rope_fusion.ENV, flag)
    path = ingot.compile(FIXTURES / "tiny_llama_kv.onnx", target=target, out=tmp_path / f"{name}.ingot", mode="llm")
    return json.loads((path / "manifest.json").read_text())["cuda"]


@pytest.mark.usefixtures("session_kernel_cache")  # whole-model compiles: see common.py
@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
def test_kernel_table_of_the_tiny_llama(tmp_path, target, monkeypatch):
    on = _table(tmp_path, target, "on", monkeypatch, None)  # on by default
    off = _table(tmp_path, target, "off", monkeypatch, "0")
    assert [ln["op"] for ln in on["launches"]] == [ln["op"] for ln in off["launches"]]
    ropes = [j for j, ln in enumerate(on["launches"]) if ln["op"] == "rope_qkv"]
    assert len(ropes) == 2
    assert not any(ln["op"] == "rope_qkv" and "skip" in ln for ln in off["launches"])
    assert not any(k["spec"]["values"].get("ROPE") for k in off["variant_kernels"].values())
    changed = set()
    for j in ropes:
        rope = on["launches"][j]
        assert rope["kernel"] == off["launches"][j]["kernel"] and rope["args"] == off["launches"][j]["args"]
        jc = rope["skip"]["into"]
        assert rope["skip"]["max_rows"] == 8 and rope["rows_arg"] == "num_tokens"
        qkv = on["launches"][jc]
        assert qkv["op"] == "linear" and qkv["args"]["out"] == rope["args"]["qkv"] and jc < j
        assert qkv["args"]["M"] == rope["args"]["num_tokens"]
        for v_on, v_off in zip(qkv["variants"], off["launches"][jc]["variants"]):
            assert v_on["max_rows"] == v_off["max_rows"]
            if v_on["max_rows"] > 8:
                assert v_on == v_off
                continue
            k_on, k_off = on["variant_kernels"][v_on["kernel"]], off["variant_kernels"][v_off["kernel"]]
            values_on, values_off = k_on["spec"]["values"], k_off["spec"]["values"]
            assert values_on["ROPE"] and not values_off["ROPE"]
            assert {n: x for n, x in values_on.items() if not n.startswith("ROPE")} == \
                {n: x for n, x in values_off.items() if not n.startswith("ROPE")}  # same configuration, prologue
            assert [p for p, _ in k_on["params"]] == [p for p, _ in k_off["params"]] + [p for p, _ in ROPE_PARAMS]
            own_off = v_off.get("args", off["launches"][jc]["args"])
            assert v_on["args"] == {**own_off, **{n: rope["args"][n] for n in qkv_rope_fusion.ROPE_ARGS}}
        changed |= {j, jc}
    for j, (a, b) in enumerate(zip(on["launches"], off["launches"])):
        if j not in changed:
            assert a == b


@pytest.mark.usefixtures("session_kernel_cache")  # whole-model compiles: see common.py
@needs_compiler
@pytest.mark.parametrize("decode_fusion", ["1", "0"])
def test_q_is_placed_from_the_qkv_node_on(tmp_path, monkeypatch, decode_fusion):
    """The fused variant writes q at the qkv node, where it reads x (the norm's input with decode fusion, else the
    norm's output, which dies there and whose bytes q could otherwise take): no two of the scratch buffers it
    touches share bytes."""
    monkeypatch.setenv("INGOT_DECODE_FUSION", decode_fusion)
    cuda = _table(tmp_path, "h200", "on", monkeypatch, None)
    buffers = cuda["memory_plan"]["buffers"]
    for ln in cuda["launches"]:
        for v in ln.get("variants", ()):
            if "q" not in v.get("args", {}):
                continue
            scratch = sorted({a["buffer"] for a in v["args"].values()
                              if "buffer" in a and buffers[a["buffer"]]["region"] == "scratch"})
            assert v["args"]["q"]["buffer"] in scratch and len(scratch) >= 2
            spans = sorted((buffers[n]["offset"], buffers[n]["offset"] + buffers[n]["nbytes"], n) for n in scratch)
            for (_, hi, a), (lo, _, b) in zip(spans, spans[1:]):
                assert hi <= lo, f"{a} and {b} share bytes"


@pytest.mark.usefixtures("session_kernel_cache")  # whole-model compiles: see common.py
@needs_compiler
@pytest.mark.parametrize("quant", ["fp8:wo", "fp8", "nvfp4"])
def test_quantized_qkv_gets_the_quant_epilogue(tmp_path, monkeypatch, quant):
    """FP8 / NVFP4 weights on quant.cu: the qkv node's launch with decode variants (after a weight-only format's
    dequantize launch, skipped at decode) gets quant.cu's rope epilogue in its bucket-8 variant, the rope launch
    skipped into it: W8A8 (``fp8``, FP8 activations) by default, the weight-only formats with
    ``INGOT_QKV_ROPE_FUSION=all`` only."""
    from tests.codegen.test_lower_quant import compile_quant, quant_checkpoint

    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    # quant.cu's buckets for FP8 and NVFP4 weight-only too (by default kernel.cu's, whose epilogue is on by default:
    # tests/codegen/test_gemv_fp8.py, parametrized over both)
    monkeypatch.setenv("INGOT_GEMV_FP8", "quant")
    monkeypatch.setenv("INGOT_GEMV_NVFP4", "quant")
    ckpt = quant_checkpoint(tmp_path)
    monkeypatch.delenv(qkv_rope_fusion.ENV, raising=False)  # the default: kernel.cu's variants and W8A8's
    path = compile_quant(ckpt, "h200", {"default": quant}, tmp_path / "default.ingot")
    default = json.loads((path / "manifest.json").read_text())["cuda"]
    fused_by_default = any(ln["op"] == "rope_qkv" and "skip" in ln for ln in default["launches"])
    assert fused_by_default == (quant == "fp8"), quant
    monkeypatch.setenv(qkv_rope_fusion.ENV, "all")
    path = compile_quant(ckpt, "h200", {"default": quant}, tmp_path / "q.ingot")
    cuda = json.loads((path / "manifest.json").read_text())["cuda"]
    if quant == "fp8":
        assert cuda["launches"] == default["launches"]
    ropes = [ln for ln in cuda["launches"] if ln["op"] == "rope_qkv"]
    assert ropes and all(ln["skip"]["max_rows"] == 8 for ln in ropes)
    for rope in ropes:
        qkv = cuda["launches"][rope["skip"]["into"]]
        assert qkv["op"] == "quantized_linear" and qkv["args"]["out"] == rope["args"]["qkv"]
        first, *rest = qkv["variants"]
        spec = cuda["variant_kernels"][first["kernel"]]["spec"]
        assert first["max_rows"] == 8 and spec["template"] == "quant.cu" and spec["values"]["ROPE"]
        assert {n: first["args"][n] for n in qkv_rope_fusion.ROPE_ARGS} == \
            {n: rope["args"][n] for n in qkv_rope_fusion.ROPE_ARGS}
        assert not any(cuda["variant_kernels"][v["kernel"]]["spec"]["values"]["ROPE"] for v in rest)


@pytest.mark.usefixtures("session_kernel_cache")  # whole-model compiles: see common.py
@needs_compiler
def test_nothing_fuses_when_the_qkv_row_has_another_reader(tmp_path, monkeypatch):
    """Without rope-cache fusion the rope launch is qkv.cu (k and v to their own buffers for the cache write): the
    epilogue does what qkv_cache.cu does only, so nothing fuses and the table is the one without the switch."""
    monkeypatch.setenv("INGOT_ROPE_CACHE_FUSION", "0")
    on = _table(tmp_path, "h200", "on", monkeypatch, "1")
    off = _table(tmp_path, "h200", "off", monkeypatch, "0")
    assert on["launches"] == off["launches"]


def test_switch_values(monkeypatch):
    for raw, want in (("", "bf16"), ("1", "bf16"), (" ALL ", "all"), ("0", "off")):
        monkeypatch.setenv(qkv_rope_fusion.ENV, raw)
        assert qkv_rope_fusion.mode() == want
    monkeypatch.setenv(qkv_rope_fusion.ENV, "yes")
    with pytest.raises(ValueError, match=qkv_rope_fusion.ENV):
        qkv_rope_fusion.mode()


def test_rule_refuses_what_the_epilogue_cannot_do():
    tgt = get_target("h200")
    rope = RopeEpilogue(32, 8, 64, False, 16)
    assert rope.rows == 3072
    with pytest.raises(ValueError, match="multiple of 16"):
        RopeEpilogue(4, 2, 72, False, 16)
    with pytest.raises(ValueError, match="qkv row"):
        gemv_spec(2048, 2048, 8, tgt, rope=rope)  # N is not the qkv row
    with pytest.raises(ValueError, match="residual"):
        gemv_spec(3072, 2048, 8, tgt, residual=True, rope=rope)
    done = with_rope(gemv_spec(3072, 2048, 8, tgt), rope, tgt)
    with pytest.raises(ValueError, match="without the rope epilogue"):
        with_rope(done, rope, tgt)


#: (heads, kv heads, head_dim, K, interleaved, cache ctype, table ctype, scaled, bias)
SHAPES = {
    "llama1b": (32, 8, 64, 2048, False, "bf16", "float", False, False),
    "fp8-interleaved": (8, 2, 64, 512, True, "fp8e4m3", "bf16", True, False),
    "llama8b-bias": (32, 8, 128, 4096, False, "bf16", "float", False, True),
}


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_rope_variants_compile_without_local_memory(target, shape):
    nq, nkv, d, k, inter, kt, ct, scaled, bias = SHAPES[shape]
    tgt = get_target(target)
    n = (nq + 2 * nkv) * d
    rope = RopeEpilogue(nq, nkv, d, inter, 16, kt, ct, scaled)
    plain = gemv_spec(n, k, 8, tgt, bias=bias)
    splitk = gemv_spec(n, k, 8, tgt, bias=bias, config=gemv_config(n, k, 8, tgt.num_sms or 132, kwarps=1))
    for base in (plain, splitk, fused_spec(plain, Prologue("rms_norm", eps=1e-5), tgt)):
        spec = with_rope(base, rope, tgt)
        ops = sass_opcodes(spec, ARCH[target])
        assert_no_local_memory(ops, spec.entry)
        assert any(o.startswith("HMMA") for o in ops), sorted(ops)
        if scaled:
            assert any("E4M3" in o for o in ops), sorted(ops)  # the saturating e4m3 conversion


def test_preload_switch(monkeypatch):
    monkeypatch.delenv(ROPE_PRELOAD_ENV, raising=False)
    assert ROPE_PRELOAD_ENV == "INGOT_ROPE_PRELOAD" and rope_preload() is False
    for raw, want in (("", False), ("0", False), (" 1 ", True)):
        monkeypatch.setenv(ROPE_PRELOAD_ENV, raw)
        assert rope_preload() is want
        assert dict(with_rope(gemv_spec(3072, 2048, 8, get_target("h200")), RopeEpilogue(32, 8, 64, False, 16),
                              get_target("h200")).values)["ROPE_PRELOAD"] is want
    monkeypatch.setenv(ROPE_PRELOAD_ENV, "yes")
    with pytest.raises(ValueError, match=ROPE_PRELOAD_ENV):
        rope_preload()


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("wb", [2, 1], ids=["bf16", "fp8"])
@pytest.mark.parametrize("preload", ["0", "1"])
def test_where_the_epilogue_reads_its_slots(target, wb, preload, monkeypatch):
    """``INGOT_ROPE_PRELOAD=1`` (rope_epilogue.cuh): the epilogue's 64-bit reads (slot_mapping and positions of the
    thread's two tokens) come after the grid-dependency wait and before the first MMA; by default after the last
    MMA, where the epilogue stores."""
    monkeypatch.setenv(ROPE_PRELOAD_ENV, preload)
    tgt = get_target(target)
    spec = with_rope(fused_spec(gemv_spec(3072, 2048, 8, tgt, wb=wb), Prologue("rms_norm", eps=1e-5), tgt),
                     RopeEpilogue(32, 8, 64, False, 16), tgt)
    assert spec.value("ROPE_PRELOAD") is (preload == "1")
    assert_no_local_memory(sass_opcodes(spec, ARCH[target]), spec.entry)
    seq = re.findall(r"\b(ACQBULK|HMMA\S*|LDG\.E\.64\S*)", disassembled(compiled(spec), ARCH[target]))
    wait = seq.index("ACQBULK")
    mma = [i for i, o in enumerate(seq) if o.startswith("HMMA")]
    wide = [i for i, o in enumerate(seq) if o.startswith("LDG.E.64")]
    assert len(wide) == 4, seq
    if preload == "1":
        assert all(wait < i < mma[0] for i in wide), seq
    else:
        assert all(i > mma[-1] for i in wide), seq


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("fmt", [("fp8", "none"), ("fp8", "fp8"), ("nvfp4", "none")], ids=["fp8", "fp8-a8", "nvfp4"])
def test_quant_rope_variants_compile_without_local_memory(target, fmt):
    from ingot.codegen.kernels.gemv import quant_rule

    tgt = get_target(target)
    rope = RopeEpilogue(32, 8, 64, False, 16)
    spec = quant_rule.with_rope(quant_rule.quant_gemv_spec(3072, 2048, 8, tgt, *fmt), rope, tgt)
    assert [p.name for p in spec.params] == [p for p, _ in quant_rule.PARAMS + ROPE_PARAMS]
    assert_no_local_memory(sass_opcodes(spec, ARCH[target]), spec.entry)
    with pytest.raises(ValueError, match="without the rope epilogue"):
        quant_rule.with_rope(spec, RopeEpilogue(32, 8, 64, False, 16), tgt)
