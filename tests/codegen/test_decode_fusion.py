"""Decode fusion (``codegen/decode_fusion.py``) without a GPU: which launches pair up in a Llama layer and what the
kernel table says about them, the memory plan keeping the skipped launches' inputs alive, the fused GEMV compiled
for sm_90a and sm_100a (tensor cores, cp.async staging, no spills; in the SASS the first weight stage loads before
the grid-dependency wait, x and the residual after it), and numpy models of the prologues' index arithmetic (every
column of the slice staged once; the 9-shuffle sums of squares) and arithmetic (the norm factor applied to the f32
sums, the slices' sums of squares added; the swiglu through ex2 / rcp) against the numpy reference ops."""

from __future__ import annotations

import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import ingot
from ingot.codegen import decode_fusion
from ingot.codegen.kernel import PDL_MARKER
from ingot.codegen.kernels.gemv import skinny_rule
from ingot.codegen.kernels.gemv.rule import (
    BUCKETS,
    PROLOGUES,
    GemvConfig,
    Prologue,
    fused_spec,
    gemv_config,
    gemv_spec,
    is_plain,
    spec_config,
    weights_first_all,
)
from ingot.codegen.kernels.gemv.skinny_rule import is_skinny
from ingot.codegen.lower import default_bindings, gemv_variant_plans, plan_launches, to_device_dtypes
from ingot.codegen.memory_plan import plan_memory
from ingot.codegen.target import get_target
from ingot.ir.ops.attention import SwiGLU
from ingot.ir.ops.core import Cast
from ingot.ir.ops.norm import RmsNorm
from ingot.ir.types import DType
from ingot.passes import PassContext, run_passes
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    compiled,
    disassembled,
    module_kernel_cache,
    needs_compiler,
    sass_opcodes,
    session_kernel_cache,
)
from tests.codegen.test_fuse_split_lower import _graph
from tests.codegen.test_prefill_wgmma import _registers
from tests.helpers import rng

H200 = get_target("h200")
BF16 = ml_dtypes.bfloat16
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture(autouse=True)
def _workspace_split_k(monkeypatch):
    """The workspace split-K and row groups these tests were written for (``INGOT_GEMV_CLUSTER=0``); the cluster
    reduction, the default, has its own tests (test_gemv_cluster.py, test_gemv_cluster_gpu.py)."""
    monkeypatch.setenv("INGOT_GEMV_CLUSTER", "0")


@pytest.fixture(autouse=True)
def _fusion_on(monkeypatch):
    """Decode fusion is on by default (``INGOT_DECODE_FUSION=0`` turns it off); these tests set it on explicitly
    (a developer's environment may have it off) unless they say otherwise."""
    monkeypatch.setenv(decode_fusion.ENV, "1")


def _lowered(tmp_path, layers: int = 1):
    g = _graph(tmp_path, layers)
    run_passes(g, "serving-fuse", PassContext())
    to_device_dtypes(g)
    return g


def _plan(g):
    launches = plan_launches(g, H200)
    return launches, decode_fusion.plan(g, launches, gemv_variant_plans(launches, H200), H200)


# -- pairing -------------------------------------------------------------------------------------------------------


def test_split_bucket_8_fuses_both_of_its_variants(tmp_path, monkeypatch):
    """By default (``INGOT_GEMV_SKINNY`` unset: ``split8``) a wide matrix's bucket 8 is two variants, kernel.cu's up to
    4 tokens and the skinny kernel's (4 stages) for 5-8; decode fusion gives both the rms_norm prologue and skips the
    norm up to 8 tokens."""
    monkeypatch.delenv("INGOT_GEMV_SKINNY", raising=False)
    g = _lowered(tmp_path)
    launches, fusion = _plan(g)
    by_output = {launches[j][1].outputs[0].name: j for j in fusion.skips}
    j = by_output["layers.0.mlp_norm"]  # before gate_up (16384 rows: wide)
    assert fusion.skips[j][1] == 8
    (one, f1, own1), (eight, f8, own8), *rest = fusion.variants[fusion.into[j]]
    assert (one, eight) == (skinny_rule.SPLIT8_ROWS, 8) == (4, 8)
    assert is_plain(fusion.made_from[f1.key]) and is_skinny(f8)
    assert f1.value("PROLOGUE") == f8.value("PROLOGUE") == 1 and f8.value("STAGES") == skinny_rule.SPLIT8_STAGES
    assert own1 == own8 and "norm_weight" in own1
    assert [mr for mr, _, _ in rest] == [16, 32, 64] and all(a is None for _, _, a in rest)
    for norm in ("layers.0.attn_norm", "final_norm"):  # before qkv and the lm_head (vocab 512): narrow, bucket 8 whole
        j = by_output[norm]
        assert fusion.skips[j][1] == 8 and [mr for mr, _, _ in fusion.variants[fusion.into[j]]] == list(BUCKETS)


def test_a_llama_layer_fuses_both_norms_the_swiglu_and_the_final_norm(tmp_path, monkeypatch):
    # bucket 8 whole on kernel.cu (the split bucket 8 of wide matrices: test_split_bucket_8_fuses_both_of_its_variants)
    monkeypatch.setenv("INGOT_GEMV_SKINNY", "from16")
    g = _lowered(tmp_path)
    launches, fusion = _plan(g)
    plans = gemv_variant_plans(launches, H200)
    skipped = {launches[j][1].outputs[0].name: j for j in fusion.skips}
    assert set(skipped) == {"layers.0.attn_norm", "layers.0.mlp_norm", "0", "final_norm"}  # "0": the swiglu output
    for j, (rows_arg, max_rows) in fusion.skips.items():
        _, node, spec, args = launches[j]
        jc = fusion.into[j]
        _, consumer, _, cargs = launches[jc]
        assert consumer.op.name == "linear" and consumer.inputs[0] is node.outputs[0]
        assert max_rows == decode_fusion.MAX_ROWS[node.op.name] == 8
        assert rows_arg == {"rms_norm": "rows", "swiglu": "num_tokens"}[node.op.name]
        assert args[rows_arg] == cargs["M"]  # the same dim: T for the layers, S for the lm_head
        variants = fusion.variants[jc]
        # the buckets; down (K 8192: narrow, long) also the skinny GEMM's any-M variant for 65-256 rows
        n, k = consumer.inputs[1].type.shape
        long_k = k >= skinny_rule.ANY_MIN_K
        assert [mr for mr, _, _ in variants] == list(BUCKETS) + ([skinny_rule.ANY_M_ROWS] if long_k else [])
        assert any(mr == skinny_rule.ANY_M_ROWS for mr, _, _ in variants) == (node.op.name == "swiglu")
        (_, fused, own), *rest = variants
        # the larger buckets unfused, as the rule planned them: kernel.cu's, or the skinny wgmma GEMM's (persistent
        # on the wide gate_up, 16384 rows, at 16 / 32; split-K on the narrower matrices whose K slice fits)
        assert [(mr, s, a) for mr, s, a in rest] == [(mr, s, None) for mr, s in plans[jc][1:]]
        assert all(is_skinny(s) == (skinny_rule.choice(n, k, min(mr, 64), H200) is not None)
                   and (is_skinny(s) or is_plain(s)) for mr, s, _ in rest)
        assert any(is_skinny(s) for _, s, _ in rest)
        plain = plans[jc][0][1]
        # the plain variant's configuration; a row-group one whose long slice leaves no room for the swiglu
        # prologue's x region (gate's and up's) gives way to the rule's configuration without row groups
        want = spec_config(plain)
        if node.op.name == "swiglu" and want.kwarps > 1:
            want = gemv_config(plain.value("N"), plain.value("K"), plain.value("MB"), H200.num_sms, kwarps=1)
        assert spec_config(fused) == want and fusion.made_from[fused.key] == plain
        assert fused.value("PROLOGUE") == PROLOGUES[node.op.name]
        assert {p.name for p in fused.params} == set(own)
        assert {k: v for k, v in own.items() if k not in ("x", "norm_weight")} == \
            {k: v for k, v in cargs.items() if k != "x"}
        assert fused.value("WEIGHTS_FIRST") and plain.value("WEIGHTS_FIRST") == weights_first_all()
        if node.op.name == "rms_norm":
            assert own["x"] == args["x"] and own["norm_weight"] == args["weight"]
            assert fused.value("EPS") == spec.value("EPS")
        else:
            assert own["x"] == args["a"] == {"buffer": "layers.0.gate_up"} and "norm_weight" not in own
            assert fused.value("ALPHA") == spec.value("ALPHA")
    assert launches[fusion.into[skipped["final_norm"]]][3]["M"] == {"dim": "S"}


def test_bulk_variants_get_bulk_fused_variants(tmp_path, monkeypatch):
    """With ``INGOT_GEMV_BULK=1`` the plain variants are bulk.cu's and so are the fused ones (the same bucket, N, K
    and epilogue, the same arguments); without it kernel.cu's, as in the test above."""
    from ingot.codegen.kernels.gemv import bulk_rule

    g = _lowered(tmp_path)
    monkeypatch.delenv(bulk_rule.ENV, raising=False)
    _, off = _plan(g)
    monkeypatch.setenv(bulk_rule.ENV, "1")
    launches, on = _plan(g)
    assert on.skips == off.skips and set(on.variants) == set(off.variants)
    for jc, variants in on.variants.items():
        (mr, fused, own), *_ = variants
        plain = on.made_from[fused.key]
        assert plain.template == fused.template == "bulk.cu" and mr == 8, fused.entry
        assert fused.value("PROLOGUE") != 0 and {p.name for p in fused.params} == set(own)
        assert all(fused.value(v) == plain.value(v) for v in ("N", "K", "MB", "HAS_BIAS", "HAS_RESIDUAL"))
        off_fused = off.variants[jc][0][1]
        assert off_fused.template == "kernel.cu" and off.variants[jc][0][2] == own
        assert off_fused.value("PROLOGUE") == fused.value("PROLOGUE") and off_fused.params == fused.params


def test_values_with_other_readers_and_graph_outputs_keep_their_launch(tmp_path):
    g = _lowered(tmp_path)
    mlp_norm = next(n.outputs[0] for n in g.nodes if n.outputs[0].name == "layers.0.mlp_norm")
    final = next(n.outputs[0] for n in g.nodes if n.outputs[0].name == "final_norm")
    g.outputs.append(g.add1(Cast(to=DType.f32), [mlp_norm], "mlp_norm.f32", "probe"))  # a second reader
    g.outputs.append(final)
    launches, fusion = _plan(g)
    skipped = {launches[j][1].outputs[0].name for j in fusion.skips}
    assert skipped == {"layers.0.attn_norm", "0"}


def test_without_gemv_variants_nothing_fuses(tmp_path):
    g = _lowered(tmp_path)
    launches = plan_launches(g, H200)
    assert decode_fusion.plan(g, launches, {}, H200).skips == {}


def test_the_memory_plan_keeps_fused_inputs_alive(tmp_path):
    """Without the extra reads the down projection's output takes gate_up's bytes (gate_up dies at the swiglu):
    the fused down GEMV would overwrite its own input."""
    g = _lowered(tmp_path)
    launches, fusion = _plan(g)
    table = [{"node": i, "args": args,
              "variants": [{"args": a} for _, _, a in fusion.variants[j] if a is not None]} if j in fusion.variants
             else {"node": i, "args": args} for j, (i, _, _, args) in enumerate(launches)]
    reads = decode_fusion.variant_reads(table)
    index = {n.outputs[0].name: i for i, n in enumerate(g.nodes)}
    assert reads["embed"] == index["layers.0.qkv"] and reads["last_hidden"] == index["logits"]
    assert reads["layers.0.gate_up"] == index["layers.0.mlp_out"]
    assert reads["layers.0.attn_out"] == index["layers.0.mlp_out"]  # x of the gate_up variant, the down's residual
    bindings = default_bindings(g, {})

    def overlap(plan, a: str, b: str) -> bool:
        x, y = plan.buffers[a], plan.buffers[b]
        return x.region == y.region and x.offset < y.offset + y.nbytes and y.offset < x.offset + x.nbytes

    pairs = [("embed", "layers.0.qkv"), ("layers.0.attn_out", "layers.0.gate_up"),
             ("layers.0.gate_up", "layers.0.mlp_out"), ("last_hidden", "logits")]
    assert overlap(plan_memory(g, bindings), "layers.0.gate_up", "layers.0.mlp_out")  # why reads exist
    fused = plan_memory(g, bindings, reads=reads)
    assert not any(overlap(fused, a, b) for a, b in pairs)


@pytest.mark.usefixtures("session_kernel_cache")  # whole-model compiles: see common.py
@needs_compiler
def test_kernel_table_of_the_tiny_llama(tmp_path, monkeypatch):
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    monkeypatch.setenv("INGOT_QKV_ROPE_FUSION", "0")  # its own table test: tests/codegen/test_qkv_rope_fusion.py
    on = json.loads((ingot.compile(FIXTURES / "tiny_llama_kv.onnx", target="h200", out=tmp_path / "on.ingot",
                                   mode="llm") / "manifest.json").read_text())["cuda"]
    monkeypatch.setenv(decode_fusion.ENV, "0")
    off = json.loads((ingot.compile(FIXTURES / "tiny_llama_kv.onnx", target="h200", out=tmp_path / "off.ingot",
                                    mode="llm") / "manifest.json").read_text())["cuda"]
    assert [ln["kernel"] for ln in on["launches"]] == [ln["kernel"] for ln in off["launches"]]
    skipped = [ln for ln in on["launches"] if "skip" in ln]
    assert {ln["op"] for ln in skipped} == {"rms_norm", "swiglu"}
    for ln in skipped:
        assert ln["skip"]["max_rows"] == 8 and ln["rows_arg"] == {"rms_norm": "rows", "swiglu": "num_tokens"}[ln["op"]]
        consumer = on["launches"][ln["skip"]["into"]]
        assert consumer["op"] == "linear" and ln["args"][ln["rows_arg"]] == consumer["args"]["M"]
        first, *rest = consumer["variants"]
        assert first["max_rows"] == 8 and "args" in first and not any("args" in v for v in rest)
        k = on["variant_kernels"][first["kernel"]]
        assert {p for p, _ in k["params"]} == set(first["args"])
        assert k["spec"]["values"]["PROLOGUE"] == PROLOGUES[ln["op"]] and k["pdl"]
        assert first["args"]["x"] == (ln["args"]["x"] if ln["op"] == "rms_norm" else ln["args"]["a"])
        assert (tmp_path / "on.ingot" / k["cubin"]).read_bytes()[:4] == b"\x7fELF"
    # every rms_norm and swiglu of the tiny Llama feeds a GEMV-capable linear
    assert len(skipped) == sum(ln["op"] in ("rms_norm", "swiglu") for ln in on["launches"])
    used = {v["kernel"] for ln in on["launches"] for v in ln.get("variants", ())}
    assert used == set(on["variant_kernels"])
    # switched off: the table as without fusion
    assert not any("skip" in ln or any("args" in v for v in ln.get("variants", ())) for ln in off["launches"])
    assert all(k["spec"]["values"].get("PROLOGUE", 0) == 0 for k in off["variant_kernels"].values())
    assert sorted(off["variant_kernels"]) != sorted(on["variant_kernels"])
    assert decode_fusion.variant_reads(off["launches"]) == {}


# -- the fused kernels -----------------------------------------------------------------------------------------------


def _fused(n: int, k: int, mb: int, kind: str, target: str, residual: bool = False, weights_first: bool | None = None):
    tgt = get_target(target)
    pro = Prologue("rms_norm", eps=1e-5) if kind == "rms_norm" else Prologue("swiglu", alpha=1.0)
    return fused_spec(gemv_spec(n, k, mb, tgt, residual=residual), pro, tgt, weights_first=weights_first)


#: SASS: the streaming weight loads (.nc), the first stage's coherent ones (weights first), x's loads after the wait
#: (coherent; .nc in plain variants), the cp.async copies, the grid-dependency wait, the residual's loads
W_NC, W_FIRST, X_LOAD, X_NC, CP_ASYNC, WAIT = ("LDG.E.NA.LTC256B.128.CONSTANT", "LDG.E.NA.LTC256B.128",
                                               "LDG.E.128", "LDG.E.128.CONSTANT", "LDGSTS.E.BYPASS.128", "ACQBULK")


def sass_sequence(sass: str) -> list[str]:
    """The opcodes (with modifiers) of a disassembly in program order, predicates dropped."""
    out = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            out.append(m.group(1))
    return out


def check_pdl_order(seq: list[str], first_stage: int, reads_after: tuple[str, ...]) -> None:
    """The first weight stage's loads (coherent; at least ``first_stage`` of them: predicated ones past K may stay)
    all come before the one wait; everything in ``reads_after`` (x, the norm weight, gate_up, the residual) after
    it."""
    assert seq.count(WAIT) == 1, seq.count(WAIT)
    wait = seq.index(WAIT)
    assert seq[:wait].count(W_FIRST) >= first_stage and W_FIRST not in seq[wait:], seq[: wait + 1]
    assert not any(o in reads_after or o == X_NC for o in seq[:wait]), seq[: wait + 1]
    for o in reads_after:
        assert o in seq[wait:], (o, "missing after the wait")


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("n,k,mb,kind", [
    (3072, 2048, 8, "rms_norm"),    # Llama-3.2-1B qkv: split-K 8 x 256, one chunk a slice
    (16384, 2048, 8, "rms_norm"),   # its gate_up: no split-K, 8 chunks a slice (two a warp)
    (2048, 8192, 8, "swiglu"),      # its down projection (+ residual)
    (128256, 2048, 8, "rms_norm"),  # its lm_head
    (576, 576, 8, "rms_norm"),      # SmolLM2: K not a multiple of the 256-column chunk
    (1024, 8192, 16, "rms_norm"),   # a 16-token bucket: two groups of 8 tokens
    (1000, 4128, 8, "swiglu"),      # K past the last slice's end
])
def test_fused_gemv_compiles_without_spills(target, n, k, mb, kind):
    spec = _fused(n, k, mb, kind, target, residual=kind == "swiglu")
    ops = sass_opcodes(spec, "sm_90a" if target == "h200" else "sm_100a")
    assert any(o.startswith("HMMA.16816.F32.BF16") for o in ops), sorted(ops)
    assert W_FIRST in ops and CP_ASYNC in ops, sorted(ops)  # (one stage only, 256 columns: no W_NC)
    assert ("MUFU.EX2" in ops) == (kind == "swiglu") and ("SHFL.BFLY" in ops) == (kind == "rms_norm")
    assert_no_local_memory(ops, "the fused GEMV")


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("kind", ["rms_norm", "swiglu"])
@pytest.mark.parametrize("row_groups", ["0", "1"], ids=["kw-off", "kw-on"])
def test_fused_gemv_loads_its_first_weight_stage_before_the_wait(target, kind, row_groups, monkeypatch):
    """In the SASS, not only the source: the first stage's 16 weight loads (8 steps x rows g, g + 8; with and without
    the rule's row groups, ``INGOT_GEMV_KW``: then each warp's part of K starts at its own column) are issued before
    the grid-dependency wait, everything the previous kernel wrote (x by cp.async, the norm weight, the residual)
    after it. With ``weights_first=False`` ptxas puts the wait first, as in the plain variants."""
    monkeypatch.setenv("INGOT_GEMV_KW", row_groups)
    arch = "sm_90a" if target == "h200" else "sm_100a"
    spec = _fused(3072, 2048, 8, kind, target, residual=True)
    assert (spec.value("U"), spec.value("MT"), spec.value("KW")) == (8, 1, 1 if row_groups == "0" else 4)
    reads = (CP_ASYNC, "LDG.E.U16") + ((X_LOAD,) if kind == "rms_norm" else ())
    check_pdl_order(sass_sequence(disassembled(compiled(spec), arch)), 16, reads)
    late = sass_sequence(disassembled(compiled(_fused(3072, 2048, 8, kind, target, True, weights_first=False)), arch))
    assert late.index(WAIT) < late.index(W_NC) and W_FIRST not in late


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
def test_fused_gemv_registers_keep_four_ctas_a_sm(target):
    """cp.async stages x without holding registers across the copies: the 1B shapes' fused variants take at most 128
    registers a thread, 4 CTAs of 128 threads a SM (plain: about 96, 5; the first version's register staging: ~158)."""
    for n, k, kind, residual in ((3072, 2048, "rms_norm", False), (2048, 8192, "swiglu", True),
                                 (16384, 2048, "rms_norm", False), (128256, 2048, "rms_norm", False)):
        assert _registers(compiled(_fused(n, k, 8, kind, target, residual)).cubin) <= 128, (n, k, kind)


@pytest.mark.parametrize("kind", ["rms_norm", "swiglu"])
def test_fused_gemv_reads_its_inputs_after_the_wait(kind):
    """In the source: the first weight stage loads before the grid-dependency wait; x (the skipped launch's input,
    written by the kernel before it) and the norm weight only after."""
    src = _fused(3072, 2048, 8, kind, "h200").source()
    body = src[src.index('extern "C" __global__'):]
    assert body.count(PDL_MARKER) == 1
    wait = body.index(PDL_MARKER)
    assert body.index("gemv_ld_before_wait(") < wait
    reads = [m.start() for m in re.finditer(r"gemv_(ld_after_wait|cp16)\(", body)]
    assert reads and min(reads) > wait


def test_prologue_specs():
    with pytest.raises(ValueError, match="prologue"):
        Prologue("gelu")
    with pytest.raises(ValueError, match="not a plain"):
        fused_spec(_fused(512, 2048, 8, "swiglu", "h200"), Prologue("swiglu"), H200)
    plain = gemv_spec(2048, 8192, 8, H200, residual=True)
    swiglu, rms = _fused(2048, 8192, 8, "swiglu", "h200", True), _fused(2048, 8192, 8, "rms_norm", "h200", True)
    assert swiglu.smem == 2 * plain.smem and rms.smem == plain.smem  # swiglu stages up beside x
    assert [p.name for p in rms.params] == [p.name for p in plain.params] + ["norm_weight"]
    assert spec_config(swiglu) == spec_config(plain) and plain.value("WEIGHTS_FIRST") == weights_first_all()
    # a plain variant with row groups (4 warps a row group, the whole of K a CTA: a tuned configuration may be one)
    # has an 8192-column x slice, too wide for gate and up together: its swiglu variant takes the rule's
    # configuration without row groups (the one above), its rms_norm variant keeps the row groups
    rowgroups = gemv_spec(2048, 8192, 8, H200, residual=True,
                          config=gemv_config(2048, 8192, 8, 132, warps=4, stage_steps=8, kwarps=4))
    assert spec_config(rowgroups).kwarps == 4 and spec_config(rowgroups).slice_k == 8192
    assert spec_config(fused_spec(rowgroups, Prologue("swiglu"), H200)) == spec_config(plain)
    assert spec_config(fused_spec(rowgroups, Prologue("rms_norm", 1e-5), H200)) == spec_config(rowgroups)
    assert gemv_spec(2048, 8192, 8, H200, weights_first=True).value("WEIGHTS_FIRST")
    # a slice whose gate and up do not fit shared memory together: no fused variant (decode fusion keeps the pair)
    wide = gemv_spec(128, 8192, 8, H200, config=GemvConfig(4, 1, 1, 8, 8192))
    assert wide.smem <= 227 * 1024
    with pytest.raises(ValueError, match="shared memory"):
        fused_spec(wide, Prologue("swiglu"), H200)


# -- numpy models of the prologues ----------------------------------------------------------------------------------


def staged_columns(ks: int, warps: int) -> list[int]:
    """The slice columns gemv/kernel.cu's prologue stages, lane by lane: warp w, chunk j, lane l takes the 8 columns
    from 8 ((w + j warps) 32 + l) while they are inside the slice."""
    chunks = -(-(ks // 8) // 32)
    chw = -(-chunks // warps)
    return [c for w in range(warps) for j in range(chw) for lane in range(32)
            if (c := 8 * ((w + j * warps) * 32 + lane)) < ks]


@pytest.mark.parametrize("n,k,mb", [(3072, 2048, 8), (16384, 2048, 8), (2048, 8192, 8), (128256, 2048, 8),
                                    (576, 576, 8), (1000, 4128, 8), (200, 96, 64), (1024, 8192, 16)])
def test_every_slice_column_is_staged_once(n, k, mb):
    c = gemv_config(n, k, mb, 132)
    cols = staged_columns(c.slice_k, c.warps)
    assert sorted(cols) == list(range(0, c.slice_k, 8))


def transposed_warp_sums(ss: np.ndarray) -> np.ndarray:
    """The rms_norm prologue's reduction, lane by lane: ``ss[lane, token]`` (32 x 8, f32) -> each lane's result
    (lane L holds token (L >> 2) & 7's sum over the warp)."""
    lanes = np.arange(32)
    v = ss.astype(np.float32).copy()
    n = 4
    for o in (16, 8, 4):
        upper = (lanes & o) != 0
        keep = np.where(upper[:, None], v[:, n:2 * n], v[:, :n])
        give = np.where(upper[:, None], v[:, :n], v[:, n:2 * n])
        v = (keep + give[lanes ^ o]).astype(np.float32)
        n //= 2
    r = v[:, 0]
    for o in (2, 1):
        r = (r + r[lanes ^ o]).astype(np.float32)
    return r


def test_the_nine_shuffle_reduction_sums_each_token():
    r = rng()
    ss = (r.standard_normal((32, 8)) ** 2 * r.uniform(0.01, 100)).astype(np.float32)
    got = transposed_warp_sums(ss)
    want = ss.astype(np.float64).sum(axis=0)
    for lane in range(32):
        t = (lane >> 2) & 7
        assert abs(float(got[lane]) - want[t]) <= 1e-6 * want[t], (lane, t)


def f32(a) -> np.ndarray:
    return np.asarray(a, np.float32)


def bf16_round(a: np.ndarray) -> np.ndarray:
    return f32(a).astype(BF16).astype(np.float32)


def fused_rms_linear(x: np.ndarray, g: np.ndarray, w: np.ndarray, eps: float, slice_k: int,
                     residual: np.ndarray | None = None) -> np.ndarray:
    """What the fused GEMV computes: bf16(x * g) staged, f32 products, each slice's sum of x^2 added in slice order,
    the accumulators times rsqrt(sum / K + eps), (+ residual), rounded to bf16."""
    k = x.shape[-1]
    xf, gf = x.astype(np.float32), g.astype(np.float32)
    staged = bf16_round(xf * gf)
    acc = staged.astype(np.float64) @ w.astype(np.float64).T
    ss = np.zeros(x.shape[0], np.float32)
    for kb in range(0, k, slice_k):
        ss = f32(ss + f32(np.sum(xf[:, kb:kb + slice_k] ** 2, axis=1)))
    inv = f32(1 / np.sqrt(f32(ss * f32(1 / k) + f32(eps))))
    y = acc * inv[:, None]
    if residual is not None:
        y = y + residual.astype(np.float64)
    return y.astype(np.float32).astype(BF16)


def fused_swiglu_staged(gate_up: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """The swiglu prologue's staged x: a * b / (1 + 2^(-alpha log2(e) a)) in f32, rounded to bf16 (the kernel's
    ex2.approx / rcp.approx are within a few f32 ulps of this)."""
    k = gate_up.shape[-1] // 2
    a, b = gate_up[:, :k].astype(np.float32), gate_up[:, k:].astype(np.float32)
    with np.errstate(over="ignore"):
        e = f32(np.exp2(f32(np.float32(-alpha * 1.4426950408889634) * a)))
    return (a * f32(1 / f32(1 + e)) * b).astype(BF16)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    g, w = got.astype(np.float64), want.astype(np.float64)
    return float(np.abs(g - w).max() / np.abs(w).max())


@pytest.mark.parametrize("n,k,mb", [(3072, 2048, 8), (16384, 2048, 8), (576, 576, 8), (1024, 8192, 16)])
def test_rms_prologue_model_matches_the_reference(n, k, mb):
    """The model of the fused kernel's arithmetic (norm factor on the f32 sums, slices' sums of squares) against
    rms_norm's and linear's numpy references at the kernel's own split-K slices, within the GEMV tests' tolerance."""
    r = rng()
    cfg = gemv_config(n, k, mb, 132)
    g = (1 + 0.2 * r.standard_normal(k)).astype(BF16)
    w = (0.05 * r.standard_normal((n, k))).astype(BF16)
    for m, scale in ((1, 1.0), (mb, 37.0), (3, 1e-3)):
        x = (scale * r.standard_normal((m, k))).astype(BF16)
        res = r.standard_normal((m, n)).astype(BF16)
        normed = RmsNorm(eps=1e-5).ref(x, g)
        want = normed.astype(np.float64) @ w.astype(np.float64).T + res.astype(np.float64)
        got = fused_rms_linear(x, g, w, 1e-5, cfg.slice_k, res)
        assert relative_error(got, want) < 1e-2, (m, scale)


def test_swiglu_prologue_model_matches_the_reference():
    r = rng()
    gate_up = (3 * r.standard_normal((5, 2 * 1536))).astype(BF16)
    gate_up[0, :4] = [-200, 200, 0, -0.0]  # 2^+inf: silu 0; 2^-inf: silu a
    staged = fused_swiglu_staged(gate_up)
    want = SwiGLU(packed=True).ref(gate_up)
    assert np.isfinite(staged.astype(np.float32)).all()
    np.testing.assert_allclose(staged.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-3)
