"""Decode fusion (``codegen/decode_fusion.py``) without a GPU: which launches pair up in a Llama layer and what the
kernel table says about them, the memory plan keeping the skipped launches' inputs alive, the fused GEMV compiled
for sm_90a and sm_100a (tensor cores, no spills, PDL order), and numpy emulations of the prologues: the rms_norm
prologue's sum of squares in the fused kernel's lane order is bit-identical to the norm kernel's block order."""

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
from ingot.codegen.kernels.gemv.rule import BUCKETS, PROLOGUES, Prologue, fused_spec, gemv_spec, is_plain, spec_config
from ingot.codegen.kernels.norm.rule import norm_spec
from ingot.codegen.lower import default_bindings, gemv_variant_plans, plan_launches, to_device_dtypes
from ingot.codegen.memory_plan import plan_memory
from ingot.codegen.sass import disassemble, find_cuobjdump, opcodes
from ingot.codegen.target import get_target
from ingot.ir.ops.attention import SwiGLU
from ingot.ir.ops.core import Cast
from ingot.ir.ops.norm import RmsNorm
from ingot.ir.types import DType
from ingot.passes import PassContext, run_passes
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    compiled,
    module_kernel_cache,
    needs_compiler,
)
from tests.codegen.test_fuse_split_lower import _graph
from tests.helpers import rng

H200 = get_target("h200")
BF16 = ml_dtypes.bfloat16
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture(autouse=True)
def _fusion_on(monkeypatch):
    """Decode fusion is opt-in (``INGOT_DECODE_FUSION=1``); these tests lower with it unless they say otherwise."""
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


def test_a_llama_layer_fuses_both_norms_the_swiglu_and_the_final_norm(tmp_path):
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
        assert [mr for mr, _, _ in variants] == list(BUCKETS)
        (_, fused, own), *rest = variants
        assert all(a is None and is_plain(s) for _, s, a in rest)
        plain = plans[jc][0][1]
        assert spec_config(fused) == spec_config(plain) and fusion.made_from[fused.key] == plain
        assert fused.value("PROLOGUE") == PROLOGUES[node.op.name]
        assert {p.name for p in fused.params} == set(own)
        assert {k: v for k, v in own.items() if k not in ("x", "norm_weight")} == \
            {k: v for k, v in cargs.items() if k != "x"}
        if node.op.name == "rms_norm":
            assert own["x"] == args["x"] and own["norm_weight"] == args["weight"]
            assert (fused.value("NORM_BLOCK"), fused.value("NORM_P"), fused.value("EPS")) == (
                spec.value("BLOCK"), spec.value("PER_THREAD"), spec.value("EPS"))
        else:
            assert own["x"] == args["a"] == {"buffer": "layers.0.gate_up"} and "norm_weight" not in own
            assert fused.value("ALPHA") == spec.value("ALPHA")
    assert launches[fusion.into[skipped["final_norm"]]][3]["M"] == {"dim": "S"}


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


@needs_compiler
def test_kernel_table_of_the_tiny_llama(tmp_path, monkeypatch):
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
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


def _fused(n: int, k: int, mb: int, kind: str, target: str, residual: bool = False):
    tgt = get_target(target)
    if kind == "rms_norm":
        ns = norm_spec("rms", DType.bf16, DType.bf16, k, 1e-5, tgt)
        pro = Prologue("rms_norm", eps=1e-5, block=ns.value("BLOCK"), per_thread=ns.value("PER_THREAD"))
    else:
        pro = Prologue("swiglu", alpha=1.0)
    return fused_spec(gemv_spec(n, k, mb, tgt, residual=residual), pro, tgt)


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("n,k,mb,kind", [
    (3072, 2048, 8, "rms_norm"),   # Llama-3.2-1B qkv: norm block 256 (one pass)
    (2048, 8192, 8, "swiglu"),     # its down projection
    (576, 576, 8, "rms_norm"),     # SmolLM2: norm block 96, 6 per thread
    (1024, 8192, 16, "rms_norm"),  # norm block 1024: four passes of 256 norm threads
    (128256, 4096, 8, "rms_norm"),  # a Llama-3-8B lm_head
])
def test_fused_gemv_compiles_without_spills(target, n, k, mb, kind):
    spec = _fused(n, k, mb, kind, target, residual=kind == "swiglu")
    built = compiled(spec)
    if find_cuobjdump() is None:
        pytest.skip("no cuobjdump for the SASS check")
    ops = opcodes(disassemble(built.cubin))
    assert any(o.startswith("HMMA.16816.F32.BF16") for o in ops), sorted(ops)
    assert any(o.startswith("LDG") and ".128" in o for o in ops), sorted(ops)
    assert_no_local_memory(ops, "the fused GEMV")


@pytest.mark.parametrize("kind", ["rms_norm", "swiglu"])
def test_fused_gemv_reads_its_inputs_after_the_wait(kind):
    """The first weight stage loads before the grid-dependency wait; x (the skipped launch's input, written by the
    kernel before it) and the norm weight only after."""
    src = _fused(3072, 2048, 8, kind, "h200").source()
    body = src[src.index('extern "C" __global__'):]
    assert body.count(PDL_MARKER) == 1
    wait = body.index(PDL_MARKER)
    assert body.index("gemv_ld_stream(") < wait
    reads = [m.start() for m in re.finditer(r"gemv_ld_x\((x|norm_weight)", body)]
    assert reads and min(reads) > wait


def test_prologue_values_are_checked():
    with pytest.raises(ValueError, match="prologue"):
        Prologue("gelu")
    with pytest.raises(ValueError, match="norm block"):
        gemv_spec(512, 2048, 8, H200, prologue=Prologue("rms_norm", block=128, per_thread=8))
    with pytest.raises(ValueError, match="not a plain"):
        fused_spec(_fused(512, 2048, 8, "swiglu", "h200"), Prologue("swiglu"), H200)


# -- numpy emulations of the prologues ------------------------------------------------------------------------------


def _butterfly(v: np.ndarray) -> np.ndarray:
    """common.cuh warp_sum over the last axis (32 lanes): v += shfl_xor(v, o) for o = 16, 8, 4, 2, 1, in f32."""
    lanes = np.arange(32)
    for o in (16, 8, 4, 2, 1):
        v = (v + v[..., lanes ^ o]).astype(np.float32)
    return v


def norm_kernel_sumsq(x: np.ndarray, block: int, per_thread: int) -> np.float32:
    """norm/kernel.cu: thread j adds x[j + i block]^2 (i = 0, 1, ...; zero past the row), then block_sum: a
    butterfly per warp, the warps' sums (zeros past the last warp) through one more. a * a of a bf16 value is exact
    in f32, so the FFMA the compiler makes of ``s += a * a`` rounds as this add does."""
    h = len(x)
    s = np.zeros(block, np.float32)
    for i in range(per_thread):
        idx = np.arange(block) + i * block
        a = np.where(idx < h, x[np.minimum(idx, h - 1)], np.float32(0)).astype(np.float32)
        s = (s + a * a).astype(np.float32)
    partial = _butterfly(s.reshape(block // 32, 32))[:, 0]
    v = np.zeros(32, np.float32)
    v[: len(partial)] = partial
    return _butterfly(v)[0]


def fused_sumsq(x: np.ndarray, block: int, per_thread: int) -> np.float32:
    """gemv/kernel.cu's rms_norm prologue, lane by lane: lane L holds norm threads 256 p + 8 L + e of pass p as s[L, e];
    xor 16 / 8 are the shuffles with lanes L ^ 2 / L ^ 1, xor 4, 2, 1 mix e within the lane; lane l then takes norm
    warp l's sum from lane 4 (l % 8) of pass l // 8, and one butterfly adds them."""
    h, lanes, es = len(x), np.arange(32), np.arange(8)
    npass = -(-block // 256)
    parts = np.zeros((npass, 32), np.float32)
    for p in range(npass):
        s = np.zeros((32, 8), np.float32)
        for lane in range(32):
            j0 = 256 * p + 8 * lane
            if j0 >= block:
                continue
            for i in range(per_thread):
                col = j0 + i * block
                if col < h:
                    a = x[col : col + 8]
                    s[lane] = (s[lane] + a * a).astype(np.float32)
        s = (s + s[lanes ^ 2]).astype(np.float32)
        s = (s + s[lanes ^ 1]).astype(np.float32)
        for o in (4, 2, 1):
            s = (s + s[:, es ^ o]).astype(np.float32)
        parts[p] = s[:, 0]
    v = np.array([parts[lane // 8, 4 * (lane % 8)] if lane < block // 32 else 0.0 for lane in range(32)], np.float32)
    return _butterfly(v)[0]


def _normalized(x: np.ndarray, w: np.ndarray, sumsq: np.float32, eps: float) -> np.ndarray:
    """The norm kernel's (and the prologue's) y = x * inv * w with inv = 1 / sqrtf(s / H + eps), rounded to bf16."""
    inv = np.float32(1) / np.sqrt(np.float32(sumsq / np.float32(len(x)) + np.float32(eps)))
    return ((x * inv).astype(np.float32) * w).astype(np.float32).astype(BF16)


@pytest.mark.parametrize("hidden", [64, 576, 960, 2048, 3072, 4096, 8192])
def test_rms_prologue_sums_as_the_norm_kernel(hidden):
    spec = norm_spec("rms", DType.bf16, DType.bf16, hidden, 1e-5, H200)
    block, per_thread = spec.value("BLOCK"), spec.value("PER_THREAD")
    r = rng()
    w = (1 + 0.1 * r.standard_normal(hidden)).astype(BF16)
    for scale in (1.0, 37.0, 1e-3):
        x = (scale * r.standard_normal((3, hidden))).astype(BF16)
        for row in x:
            xf = row.astype(np.float32)
            ref = norm_kernel_sumsq(xf, block, per_thread)
            got = fused_sumsq(xf, block, per_thread)
            assert got.tobytes() == ref.tobytes(), (hidden, scale, got, ref)
            assert abs(float(got) - float(np.sum(xf.astype(np.float64) ** 2))) <= 1e-5 * float(got)
        y = np.stack([_normalized(row.astype(np.float32), w.astype(np.float32),
                                  fused_sumsq(row.astype(np.float32), block, per_thread), 1e-5) for row in x])
        want = RmsNorm(eps=1e-5).ref(x, w)  # the numpy reference op: within bf16 rounding of it
        np.testing.assert_allclose(y.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2 * scale)


def test_swiglu_prologue_stages_gate_times_up():
    """The staged x of a CTA's K slice: silu(gate_up[:, kb + c]) * gate_up[:, K + kb + c], as the activation kernel
    computes it (f32, rounded to bf16), against the packed swiglu reference op."""
    r = rng()
    k, ks = 1536, 256
    gate_up = (2 * r.standard_normal((5, 2 * k))).astype(BF16)
    staged = np.zeros((5, k), BF16)
    for kb in range(0, k, ks):
        g = gate_up[:, kb : kb + ks].astype(np.float32)
        u = gate_up[:, k + kb : k + kb + ks].astype(np.float32)
        staged[:, kb : kb + ks] = ((g / (np.float32(1) + np.exp(-g))).astype(np.float32) * u).astype(BF16)
    want = SwiGLU(packed=True).ref(gate_up)
    np.testing.assert_allclose(staged.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-3)
