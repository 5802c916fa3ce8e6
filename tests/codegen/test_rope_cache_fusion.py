"""Rope-cache fusion (``codegen/rope_cache_fusion.py``) without a GPU: in a Llama layer the ``rope_qkv`` launch becomes
``rope/qkv_cache.cu`` bound to q's buffer, the layer's KV cache, ``slot_mapping`` and (FP8 caches) ``kv_scale``, and
the attention's cache-write launch is gone; nothing fuses where k or v have other readers or are graph outputs;
switched off (the default) the kernel table is unchanged; the fused kernel compiles for sm_90a and sm_100a (bf16 and
FP8 caches, head_dim 64 and 128, GQA, interleaved pairs) with 16-byte loads and no local memory, and, built for the
host (``host_emulation.py``: every thread run in turn), writes the same q and cache bytes as ``qkv.cu`` followed by
the cache write, and what the numpy references give. The kernels run on the GPU in
``test_rope_cache_fusion_gpu.py``."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import ingot
from ingot.codegen import rope_cache_fusion
from ingot.codegen.kernel import KernelSpec
from ingot.codegen.kernels.attention.rule import paged_attention_specs
from ingot.codegen.kernels.attention.split_rule import cache_write_fp8_spec
from ingot.codegen.kernels.rope.cache_rule import rope_qkv_cache_spec, vec_width
from ingot.codegen.kernels.rope.rule import rope_qkv_spec, rope_spec
from ingot.codegen.lower import plan_launches, to_device_dtypes
from ingot.codegen.target import Target, get_target
from ingot.ir.ops.core import Cast, cast_array
from ingot.ir.ops.llm import RopeQKV
from ingot.ir.quant.formats import to_e4m3
from ingot.ir.types import DType
from ingot.passes import PassContext, run_passes
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    module_kernel_cache,
    needs_compiler,
    sass_opcodes,
    session_kernel_cache,
)
from tests.codegen.host_emulation import CXX, HostKernel, aligned
from tests.codegen.test_fuse_split_lower import LAYER, _graph
from tests.codegen.test_lower import FIXTURES
from tests.helpers import assert_close, rng

bf16, f32, f8 = DType.bf16, DType.f32, DType.f8e4m3fn
ARCH = {"h200": "sm_90a", "b200": "sm_100a"}


@pytest.fixture(autouse=True)
def _fusion_on(monkeypatch):
    """The fusion is on by default (``INGOT_ROPE_CACHE_FUSION=0`` turns it off); these tests set it on explicitly
    unless they say otherwise."""
    monkeypatch.setenv(rope_cache_fusion.ENV, "1")


def _lowered(tmp_path, layers: int = 2):
    """The Llama-3.2-1B-shaped serving form (GQA 32:8, head_dim 64), ``layers`` layers, as the lowering sees it."""
    g = _graph(tmp_path, layers)
    run_passes(g, "serving-fuse", PassContext())
    to_device_dtypes(g)
    return g


def _ops(launches, layer: int) -> list[str]:
    return [node.op.name for _, node, _, _ in launches if node.source == f"layers.{layer}"]


# -- the plan --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["h200", "b200"])
def test_each_layer_loses_its_cache_write(tmp_path, target):
    tgt = get_target(target)
    g = _lowered(tmp_path)
    launches = plan_launches(g, tgt)
    fusion = rope_cache_fusion.plan(g, launches, tgt)
    fused = fusion.apply(launches)
    assert len(fused) == len(launches) - 2 and len(fusion.fused) == len(fusion.drops) == 2
    want = list(LAYER)
    want.remove("paged_attention")
    for layer in (0, 1):
        assert _ops(fused, layer) == want
        (j,) = [j for j, (_, n, _, _) in enumerate(launches)
                if n.op.name == "rope_qkv" and n.source == f"layers.{layer}"]
        _, node, plain, args = launches[j]
        _, attn_node, write, wargs = launches[fusion.drops[j]]
        assert write.template == "cache_write.cu" and attn_node.inputs[1:3] == node.outputs[1:]
        spec, bound = fusion.fused[j]
        v = dict(spec.values)
        assert (spec.family, spec.template) == ("rope", "qkv_cache.cu")
        assert (v["NQ"], v["NKV"], v["HEAD_DIM"], v["ROT"], v["INTERLEAVED"]) == (32, 8, 64, 64, False)
        assert (v["DT"], v["CT"], v["KT"], v["KV_SCALED"], v["VEC"]) == ("bf16", "float", "bf16", False, 8)
        assert v["BLOCK_SIZE"] == write.value("BLOCK_SIZE") == attn_node.inputs[3].type.shape[2]
        assert spec.block[0] == (40 * (64 - 32) + 8 * 64) // 8 == 224  # one 8-element unit per thread
        assert bound == {"qkv": {"buffer": f"layers.{layer}.qkv"}, "positions": {"buffer": "positions"},
                         "cos": args["cos"], "sin": args["sin"], "q": {"buffer": f"layers.{layer}.q_rot"},
                         "kv_cache": {"buffer": f"kv_cache.{layer}"}, "slot_mapping": {"buffer": "slot_mapping"},
                         "kv_scale": {"null": True}, "num_tokens": {"dim": "T"}}
        assert bound["kv_cache"] == wargs["kv_cache"] and bound["slot_mapping"] == wargs["slot_mapping"]
        assert {p.name for p in spec.params} == set(bound) and plain.template == "qkv.cu"
        assert [ln for ln in fused if ln[1] is node] == [(launches[j][0], node, spec, bound)]
    # the attention's own launch, untouched; k and v are named by no launch any more
    rest = [ln for j, ln in enumerate(launches) if j not in fusion.drops.values() and j not in fusion.fused]
    assert rest == [ln for ln in fused if ln[1].op.name != "rope_qkv"]
    assert fusion.unused == {f"layers.{i}.{n}" for i in (0, 1) for n in ("k_rot", "v")}
    named = {a["buffer"] for _, _, _, args in fused for a in args.values() if "buffer" in a}
    assert not named & fusion.unused


def test_values_with_other_readers_and_graph_outputs_keep_the_cache_write(tmp_path):
    g = _lowered(tmp_path, layers=3)
    values = {v.name: v for n in g.nodes for v in n.outputs}
    g.outputs.append(g.add1(Cast(to=DType.f32), [values["layers.0.k_rot"]], "k0.f32", "probe"))  # a second reader
    g.outputs.append(values["layers.1.v"])  # a graph output
    tgt = get_target("h200")
    launches = plan_launches(g, tgt)
    fusion = rope_cache_fusion.plan(g, launches, tgt)
    assert {launches[j][1].source for j in fusion.fused} == {"layers.2"}
    assert fusion.unused == {"layers.2.k_rot", "layers.2.v"}


def test_a_cache_read_by_another_node_keeps_the_cache_write(tmp_path):
    """The write moves from the attention node to the rope_qkv node: a node reading the cache in between (or anywhere)
    would see it written early."""
    g = _lowered(tmp_path, layers=1)
    cache = next(v for v in g.inputs if v.name == "kv_cache.0")
    g.outputs.append(g.add1(Cast(to=DType.f32), [cache], "cache.f32", "probe"))
    tgt = get_target("h200")
    assert rope_cache_fusion.plan(g, plan_launches(g, tgt), tgt).fused == {}


def test_off_leaves_the_launches_alone(tmp_path, monkeypatch):
    g = _lowered(tmp_path, layers=1)
    tgt = get_target("h200")
    launches = plan_launches(g, tgt)
    monkeypatch.setenv(rope_cache_fusion.ENV, "0")
    assert not rope_cache_fusion.enabled()
    assert rope_cache_fusion.fuse(g, launches, tgt) == launches
    for flag in ("", "1"):  # on by default
        monkeypatch.setenv(rope_cache_fusion.ENV, flag)
        assert len(rope_cache_fusion.fuse(g, launches, tgt)) == len(launches) - 1


# -- the kernel table ------------------------------------------------------------------------------------------------


def _table(tmp_path, target: str, name: str, monkeypatch, flag: str, decode_fusion: str = "0") -> dict:
    monkeypatch.setenv(rope_cache_fusion.ENV, flag)
    # decode fusion (on by default) numbers its skips by launch index: off unless asked, so that the tables compare
    # the rope launches alone (both together: test_with_decode_fusion_the_skips_point_at_their_linears); qkv-rope
    # fusion (on by default, on top of this one) off: tests/codegen/test_qkv_rope_fusion.py
    monkeypatch.setenv("INGOT_DECODE_FUSION", decode_fusion)
    monkeypatch.setenv("INGOT_QKV_ROPE_FUSION", "0")
    path = ingot.compile(FIXTURES / "tiny_llama_kv.onnx", target=target, out=tmp_path / f"{name}.ingot", mode="llm")
    return json.loads((path / "manifest.json").read_text())["cuda"]


@pytest.mark.usefixtures("session_kernel_cache")  # whole-model compiles: see common.py
@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
def test_kernel_table_of_the_tiny_llama(tmp_path, target, monkeypatch):
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    on = _table(tmp_path, target, "on", monkeypatch, "1")
    off = _table(tmp_path, target, "off", monkeypatch, "0")
    writes = [j for j, ln in enumerate(off["launches"])
              if off["kernels"][ln["kernel"]]["spec"]["template"] == "cache_write.cu"]
    ropes = [j for j, ln in enumerate(off["launches"]) if ln["op"] == "rope_qkv"]
    assert len(writes) == len(ropes) == 2  # two layers
    # off: today's table (qkv.cu, then the attention's two launches)
    assert all(off["kernels"][off["launches"][j]["kernel"]]["spec"]["template"] == "qkv.cu" for j in ropes)
    assert not any(k["spec"]["template"] == "qkv_cache.cu" for k in off["kernels"].values())
    # on: one launch fewer per layer, every other launch as it was
    assert len(on["launches"]) == len(off["launches"]) - 2
    kept = [ln for j, ln in enumerate(off["launches"]) if j not in writes]
    assert [ln["op"] for ln in on["launches"]] == [ln["op"] for ln in kept]
    for a, b in zip(on["launches"], kept):
        if a["op"] != "rope_qkv":
            assert a == b
    for j, w in zip(ropes, writes):
        rope, write = off["launches"][j], off["launches"][w]
        (fused,) = [ln for ln in on["launches"] if ln["op"] == "rope_qkv" and ln["node"] == rope["node"]]
        k = on["kernels"][fused["kernel"]]
        assert k["spec"]["template"] == "qkv_cache.cu" and k["pdl"] and "variants" not in fused
        assert {p for p, _ in k["params"]} == set(fused["args"])
        assert fused["args"] == {**{n: rope["args"][n] for n in ("qkv", "positions", "cos", "sin", "q", "num_tokens")},
                                 "kv_cache": write["args"]["kv_cache"], "slot_mapping": write["args"]["slot_mapping"],
                                 "kv_scale": {"null": True}}
        assert (tmp_path / "on.ingot" / k["cubin"]).read_bytes()[:4] == b"\x7fELF"
        # k and v: still in the memory plan (every graph value is), read and written by no launch
        for name in (rope["args"]["k"]["buffer"], rope["args"]["v"]["buffer"]):
            assert name in on["memory_plan"]["buffers"]
            assert not any(a.get("buffer") == name for ln in on["launches"]
                           for args in (ln["args"], *(v.get("args", {}) for v in ln.get("variants", ())))
                           for a in args.values())


@pytest.mark.usefixtures("session_kernel_cache")  # whole-model compiles: see common.py
@needs_compiler
def test_fp8_kv_cache_binds_kv_scale(tmp_path, monkeypatch):
    from tests.codegen.test_lower_quant import CASES, compile_quant, quant_checkpoint

    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    ckpt = quant_checkpoint(tmp_path)
    cuda = {}
    for flag in ("0", "1"):
        monkeypatch.setenv(rope_cache_fusion.ENV, flag)
        path = compile_quant(ckpt, "h200", CASES["fp8-kv"], tmp_path / f"fp8kv-{flag}.ingot")
        cuda[flag] = json.loads((path / "manifest.json").read_text())["cuda"]
    assert len(cuda["1"]["launches"]) == len(cuda["0"]["launches"]) - 2
    fused = [ln for ln in cuda["1"]["launches"] if ln["op"] == "rope_qkv"]
    attn = [ln for ln in cuda["1"]["launches"] if ln["op"] == "paged_attention_fp8"]
    assert len(fused) == len(attn) == 2
    for layer, (ln, at) in enumerate(zip(fused, attn)):
        v = cuda["1"]["kernels"][ln["kernel"]]["spec"]["values"]
        assert (v["KT"], v["KV_SCALED"], v["NQ"], v["NKV"], v["HEAD_DIM"]) == ("fp8e4m3", True, 4, 2, 64)
        assert ln["args"]["kv_scale"] == at["args"]["kv_scale"] == {"buffer": f"layers.{layer}.attn.kv_scale"}
        assert ln["args"]["kv_cache"] == at["args"]["kv_cache"] == {"buffer": f"kv_cache.{layer}"}
        assert cuda["1"]["kernels"][at["kernel"]]["spec"]["template"] == "decode_split.cu"
    assert not any(k["spec"]["template"] == "cache_write_fp8.cu" for k in cuda["1"]["kernels"].values())


# -- the kernel ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,head_dim,rot,inter,want", [
    (bf16, 64, 64, False, 8), (bf16, 128, 128, True, 8), (bf16, 128, 64, False, 8), (f32, 80, 32, True, 4),
    (bf16, 64, 24, False, 4), (bf16, 80, 80, False, 8), (bf16, 72, 36, False, 2), (bf16, 7, 6, True, None),
    (bf16, 7, 6, False, 1)])
def test_unit_width(dtype, head_dim, rot, inter, want):
    assert vec_width(dtype, head_dim, rot, inter) == want


def test_the_rope_kernels_share_the_rotation():
    """kernel.cu, qkv.cu and qkv_cache.cu rotate through rotate.cuh's spelled-out roundings, nothing left to the
    compiler's multiply-add contraction (which chose differently for the vectorized kernel: a * s fused in one,
    b * c in the other)."""
    tgt = get_target("h200")
    for spec in (rope_spec(bf16, f32, 32, 64, 64, False, tgt), rope_qkv_spec(bf16, f32, 32, 8, 64, 64, False, tgt),
                 rope_qkv_cache_spec(bf16, f32, f8, 32, 8, 64, 64, True, 16, True, tgt)):
        src = spec.source()
        assert "__fmaf_rn(a, c, -__fmul_rn(b, s))" in src and "__fmaf_rn(a, s, __fmul_rn(b, c))" in src
        body = src[src.index('extern "C" __global__'):]
        assert "rotate_pair(" in body and not re.search(r"\b[abcs] \* [abcs]\b", body)


CASES = {  # dtype, table, cache, scaled, NQ, NKV, head_dim, rot, interleaved, block size
    "llama1b-bf16": (bf16, f32, bf16, False, 32, 8, 64, 64, False, 16),
    "llama1b-fp8": (bf16, f32, f8, True, 32, 8, 64, 64, False, 16),
    "llama8b-bf16": (bf16, f32, bf16, False, 32, 8, 128, 128, False, 16),
    "d128-fp8-interleaved": (bf16, f32, f8, True, 8, 1, 128, 128, True, 32),
    "smollm2-bf16": (bf16, f32, bf16, False, 9, 3, 64, 64, False, 16),
    "partial-rotary-fp8": (bf16, bf16, f8, True, 16, 4, 128, 64, False, 16),
    "f32": (f32, f32, f32, False, 4, 2, 80, 32, True, 16),
}


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_kernel_compiles_without_spills(target, case):
    dt, ct, kt, scaled, nq, nkv, d, rot, inter, bs = CASES[case]
    ops = sass_opcodes(rope_qkv_cache_spec(dt, ct, kt, nq, nkv, d, rot, inter, bs, scaled, get_target(target)),
                       ARCH[target])
    assert any(o.startswith("LDG") and ".128" in o for o in ops), sorted(ops)  # 16-byte loads of the qkv row
    assert any(o.startswith("STG") and (".128" in o or (kt is f8 and ".64" in o)) for o in ops), sorted(ops)
    assert_no_local_memory(ops, "the fused kernel")
    if scaled:
        assert any("E4M3" in o for o in ops), sorted(ops)  # the saturating e4m3 conversion


# -- the kernel's values (on the host here, on the GPU in test_rope_cache_fusion_gpu.py) ----------------------------


def fused_spec(case: str, target: Target) -> KernelSpec:
    dt, ct, kt, scaled, nq, nkv, d, rot, inter, bs = CASES[case]
    return rope_qkv_cache_spec(dt, ct, kt, nq, nkv, d, rot, inter, bs, scaled, target)


def two_launch_specs(case: str, target: Target) -> tuple[KernelSpec, KernelSpec]:
    """What the fused kernel replaces: ``qkv.cu`` and the attention family's cache write."""
    dt, ct, kt, scaled, nq, nkv, d, rot, inter, bs = CASES[case]
    write = (cache_write_fp8_spec(dt, nkv, d, bs, target) if scaled
             else paged_attention_specs(dt, kt, nq, nkv, d, bs, 0.125, target)[0])
    return rope_qkv_spec(dt, ct, nq, nkv, d, rot, inter, target), write


def _cast(x: np.ndarray, dtype: DType) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return x if dtype is f32 else cast_array(x, dtype)


def draw(r: np.random.Generator, case: str, tokens: int, max_pos: int = 512) -> dict[str, np.ndarray | None]:
    """One step's inputs: the qkv rows, positions, f32 or bf16 tables, a random cache with room for every token, the
    slots (distinct, about a quarter and the last token negative) and, for FP8 caches, K/V scales from each head's
    largest value, halved for every other head so that some written values saturate at 448."""
    dt, ct, kt, scaled, nq, nkv, d, rot, inter, bs = CASES[case]
    qkv = _cast(r.standard_normal((tokens, (nq + 2 * nkv) * d)) * (4.0 if scaled else 1.0), dt)
    ang = np.arange(max_pos)[:, None] * (10000.0 ** (-np.arange(rot // 2) / (rot // 2)))[None]
    num_blocks = tokens // bs + 3
    slots = r.permutation(num_blocks * bs)[:tokens].astype(np.int64)
    slots[r.random(tokens) < 0.25] = -1
    slots[-1] = -1
    cache = _cast(r.standard_normal((num_blocks, 2, bs, nkv, d)) * (60.0 if kt is f8 else 1.0), kt)
    kv_scale = None
    if scaled:
        kv = np.abs(qkv[:, nq * d:].astype(np.float32)).reshape(tokens, 2, nkv, d)
        kv_scale = (kv.max(axis=(0, 3)) / 448.0).astype(np.float32)
        kv_scale[:, ::2] *= 0.5
    return {"qkv": qkv, "positions": r.integers(0, max_pos, tokens).astype(np.int64),
            "cos": _cast(np.cos(ang), ct), "sin": _cast(np.sin(ang), ct), "kv_cache": cache, "slot_mapping": slots,
            "kv_scale": kv_scale}


def check_outputs(case: str, inputs: dict, q: np.ndarray, cache: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """The fused kernel's q and cache against the numpy references: q, and the two-launch path's k and v (``qkv.cu``'s
    outputs for the same inputs, which the caller has compared with the fused cache bit for bit), within the tolerance
    of their type of ``RopeQKV.ref``; the cache exactly what the cache write makes of k and v (rounded to the cache
    type, or ``to_e4m3(x / kv_scale)``) at the slots of tokens with one, every other byte unchanged."""
    dt, ct, kt, scaled, nq, nkv, d, rot, inter, bs = CASES[case]
    op = RopeQKV(num_heads=nq, num_kv_heads=nkv, head_dim=d, rotary_dim=rot, interleaved=inter)
    rq, rk, rv = op.ref(inputs["qkv"], inputs["positions"], inputs["cos"], inputs["sin"])
    assert_close(q, rq, what="q")
    assert_close(k, rk, what="k")
    assert np.array_equal(v.view(np.uint8), rv.view(np.uint8)), "v is a copy"
    want = inputs["kv_cache"].copy()
    for t, slot in enumerate(inputs["slot_mapping"]):
        if slot < 0:
            continue
        blk, off = divmod(int(slot), bs)
        for i, x in enumerate((k[t], v[t])):
            x = x.astype(np.float32).reshape(nkv, d)
            want[blk, i, off] = to_e4m3(x / inputs["kv_scale"][i][:, None]) if scaled else _cast(x, kt)
    assert np.array_equal(cache.view(np.uint8), want.view(np.uint8)), "cache bytes"


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_kernel_on_the_host_writes_what_the_two_launches_write(case):
    tgt = get_target("h200")
    fused = HostKernel(fused_spec(case, tgt))
    rope, write = (HostKernel(s) for s in two_launch_specs(case, tgt))
    r = rng()
    for tokens in (37, 1):  # a prefill-sized step; a decode step of one token without a slot (padding)
        inputs = {n: aligned(a) if a is not None else None for n, a in draw(r, case, tokens).items()}
        tables = {n: inputs[n] for n in ("qkv", "positions", "cos", "sin")}
        scale = {"kv_scale": inputs["kv_scale"]} if CASES[case][3] else {}
        dt, nq, nkv, d = CASES[case][0], *CASES[case][4:7]
        q = aligned(np.full((tokens, nq * d), np.nan, np.float32).astype(dt.np))  # poisoned
        cache = aligned(inputs["kv_cache"])
        fused.launch(**tables, q=q, kv_cache=cache, slot_mapping=inputs["slot_mapping"],
                     kv_scale=inputs["kv_scale"], num_tokens=tokens)
        q2, k2, v2 = (aligned(np.full((tokens, h * d), np.nan, np.float32).astype(dt.np)) for h in (nq, nkv, nkv))
        rope.launch(**tables, q=q2, k=k2, v=v2, num_tokens=tokens)
        cache2 = aligned(inputs["kv_cache"])
        write.launch(k=k2, v=v2, kv_cache=cache2, slot_mapping=inputs["slot_mapping"], num_tokens=tokens, **scale)
        assert np.array_equal(q.view(np.uint8), q2.view(np.uint8)), "q differs from qkv.cu's"
        assert np.array_equal(cache.view(np.uint8), cache2.view(np.uint8)), "the cache differs from the cache write's"
        check_outputs(case, inputs, q, cache, k2, v2)
        written = (inputs["slot_mapping"] >= 0).sum()
        changed = (cache.view(np.uint8) != inputs["kv_cache"].view(np.uint8)).any(axis=(2, 3, 4)).sum()
        assert changed <= 2 * written and (written == 0 or changed > 0)


@pytest.mark.usefixtures("session_kernel_cache")  # whole-model compiles: see common.py
@needs_compiler
def test_with_decode_fusion_the_skips_point_at_their_linears(tmp_path, monkeypatch):
    """Both fusions on (both are the default): rope-cache fusion removes launches
    before decode fusion numbers them, so every skipped launch's ``into`` is still the linear that reads its
    output."""
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    cuda = _table(tmp_path, "h200", "both", monkeypatch, "1", decode_fusion="1")
    launches = cuda["launches"]
    assert sum(cuda["kernels"][ln["kernel"]]["spec"]["template"] == "qkv_cache.cu" for ln in launches) == 2
    skipped = [ln for ln in launches if "skip" in ln]
    assert len(skipped) == 2 * 3 + 1
    for ln in skipped:
        consumer = launches[ln["skip"]["into"]]
        assert consumer["op"] == "linear" and consumer["node"] > ln["node"]
        assert consumer["variants"][0]["args"]["x"] == (ln["args"]["x"] if ln["op"] == "rms_norm" else ln["args"]["a"])
