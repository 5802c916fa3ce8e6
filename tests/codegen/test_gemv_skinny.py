"""The wgmma skinny GEMM (``codegen/kernels/gemv/skinny.cu``, ``skinny_rule.py``) without a GPU: what it takes, which
decode variants the GEMV rule makes with it (``INGOT_GEMV_SKINNY``), its launch, its sm_90a build (wgmma with the step's
tokens as N, the weight by TMA, no local memory, the grid-dependency wait in the consumers' code only), and the
memory plan's alignment of the weights its tensor map reads. Its numbers: ``test_gemv_skinny_gpu.py``,
``tests/runtime/test_cuda_backend.py::test_skinny_gemm_variants_match_cpu`` and ``bench/bench_skinny.py`` on an
H200."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from ingot.codegen.kernels.gemv import rule as gemv
from ingot.codegen.kernels.gemv.skinny_rule import (
    ENV,
    PARAMS,
    SPLITK_ENV,
    STAGES_ENV,
    XS_ENV,
    is_skinny,
    max_stages,
    skinny_spec,
    smem_bytes,
    supported,
    weight_pitches,
)
from ingot.codegen.target import get_target
from ingot.ir.ops.llm import Linear
from ingot.ir.types import DType, TensorType
from ingot.runtime.kv_tma import needs_kv_tma, needs_w_tma, w_tma_region
from tests.codegen.common import needs_compiler

H200, B200 = get_target("h200"), get_target("b200")


def test_supported_and_declined():
    assert supported(16384, 2048, 32, H200) and supported(128256, 2048, 8, H200)
    assert not supported(16384, 2048, 32, B200)  # wgmma is sm_90a's
    assert not supported(16384, 2048, 64, H200) and not supported(16384, 2048, 4, H200)  # 64: x does not fit whole
    # x streamed: any K, 64 tokens, at least 4 stages (the ring's distance)
    assert supported(16384, 2048, 64, H200, stages=8, x_stream=True) and supported(2048, 8192, 32, H200, x_stream=True)
    assert not supported(16384, 2048, 64, H200, stages=3, x_stream=True)
    with pytest.raises(ValueError, match="no split-K, x staged"):
        skinny_spec(16384, 2048, 8, H200, x_stream=True, prologue=gemv.Prologue("rms_norm", 1e-5))
    assert not supported(16384, 2000, 8, H200)  # K a multiple of 64
    assert not supported(2048, 8192, 32, H200)  # x (512 KB) does not fit beside the stages
    assert not supported(16384, 2048, 8, H200, warpgroups=3) and not supported(16384, 2048, 8, H200, stages=1)
    with pytest.raises(ValueError, match="does not take N=2048 K=8192 for 32 tokens"):
        skinny_spec(2048, 8192, 32, H200)


def _variants(n: int, k: int, bias: bool = False, target=H200, residual: bool = False) -> dict[int, str]:
    """The GEMV rule's decode variants of a bf16 ``linear`` ``w[n, k]``: bucket -> template, ``skinny.cu/sk4``
    for split-K, ``/xs`` with x streamed."""
    x, w = TensorType(DType.bf16, ("T", k)), TensorType(DType.bf16, (n, k))
    inputs = [x, w, TensorType(DType.bf16, (n,)) if bias else None]
    if residual:
        inputs.append(TensorType(DType.bf16, ("T", n)))
    out = {}
    for mb, spec in gemv.variants(Linear(), inputs, target):
        v = dict(spec.values)
        out[mb] = spec.template + (f"/sk{v['SPLITK']}" if is_skinny(spec) and v["SPLITK"] > 1 else "") \
            + ("/xs" if is_skinny(spec) and v["XS"] else "")
        if is_skinny(spec):
            assert (v["HAS_BIAS"], v["HAS_RESIDUAL"]) == (bias, residual)
    return out


def test_rule_persistent_on_wide_matrices_split_k_on_narrow_ones(monkeypatch):
    for var in (ENV, SPLITK_ENV, XS_ENV):
        monkeypatch.delenv(var, raising=False)
    # the 1B model's gate_up (128 row tiles on 132 SMs) and lm_head: the persistent kernel at buckets 16-64, x
    # streamed at 64 (256 KB do not fit whole); bucket 8 split: kernel.cu up to 4 tokens (its decode fusions), the
    # persistent kernel for 5-8
    wide = {4: "kernel.cu", 8: "skinny.cu", 16: "skinny.cu", 32: "skinny.cu", 64: "skinny.cu/xs"}
    for n in (16384, 128256):
        assert _variants(n, 2048) == wide
    assert _variants(16384, 2048, bias=True) == wide  # bias and residual in the epilogue
    # qkv and o (24 / 16 row tiles): split-K over 4 CTAs at 16-64 tokens; down (K 8192) too, at 64 tokens with x
    # streamed (its quarter of x, 256 KB, does not fit)
    narrow = {8: "kernel.cu", 16: "skinny.cu/sk4", 32: "skinny.cu/sk4", 64: "skinny.cu/sk4"}
    assert _variants(3072, 2048) == _variants(2048, 2048, residual=True) == narrow
    assert _variants(2048, 8192, residual=True) == {**narrow, 64: "skinny.cu/sk4/xs", 256: "skinny.cu/sk4/xs"}
    assert set(_variants(3072, 2112).values()) == {"kernel.cu"}  # K (33 x 64) not a multiple of 4 x 64
    assert set(_variants(16384, 2048, target=B200).values()) == {"kernel.cu"}  # wgmma: sm_90a
    # K 4096: x of 32 tokens (256 KB) does not fit whole, 16 tokens does
    assert _variants(16384, 4096) == {**wide, 32: "skinny.cu/xs"}
    monkeypatch.setenv(XS_ENV, "0")  # x never streamed: what does not fit whole stays kernel.cu's
    assert _variants(16384, 4096) == {**wide, 32: "kernel.cu", 64: "kernel.cu"}
    assert _variants(2048, 8192) == {**narrow, 64: "kernel.cu"} and _variants(16384, 2048) == {**wide, 64: "kernel.cu"}
    monkeypatch.setenv(XS_ENV, "yes")
    with pytest.raises(ValueError, match="INGOT_GEMV_SKINNY_XS='yes': expected 0 or 1"):
        _variants(16384, 2048)
    monkeypatch.delenv(XS_ENV)
    for only in ("32,64", "64+32"):
        monkeypatch.setenv(SPLITK_ENV, only)
        assert _variants(3072, 2048) == {**narrow, 16: "kernel.cu"}
    monkeypatch.setenv(SPLITK_ENV, "0")
    assert set(_variants(3072, 2048).values()) == {"kernel.cu"} and _variants(16384, 2048) == wide
    monkeypatch.setenv(SPLITK_ENV, "32,48")
    with pytest.raises(ValueError, match="INGOT_GEMV_SKINNY_SPLITK='32,48': expected 0, 1 or buckets of"):
        _variants(3072, 2048)
    monkeypatch.delenv(SPLITK_ENV)
    monkeypatch.setenv(ENV, "from16")  # bucket 8 all kernel.cu's
    from16 = {8: "kernel.cu", 16: "skinny.cu", 32: "skinny.cu", 64: "skinny.cu/xs"}
    assert _variants(16384, 2048) == from16 and _variants(3072, 2048) == narrow
    monkeypatch.setenv(ENV, "all")
    assert _variants(16384, 2048) == {**from16, 8: "skinny.cu"}
    assert _variants(3072, 2048) == narrow
    monkeypatch.setenv(ENV, "force")  # tests: the persistent kernel for any N at every bucket
    assert _variants(3072, 2048) == {8: "skinny.cu", 16: "skinny.cu", 32: "skinny.cu", 64: "skinny.cu/xs"}
    monkeypatch.setenv(ENV, "0")
    assert set(_variants(16384, 2048).values()) == set(_variants(3072, 2048).values()) == {"kernel.cu"}
    for split8 in ("split8", "1"):  # (the default) bucket 8 of wide matrices: kernel.cu up to 4 tokens, skinny 5-8
        monkeypatch.setenv(ENV, split8)
        assert _variants(16384, 2048) == wide
    x, w = TensorType(DType.bf16, ("T", 2048)), TensorType(DType.bf16, (16384, 2048))
    split = gemv.variants(Linear(), [x, w], H200)
    assert [(mr, s.template) for mr, s in split[:2]] == [(4, "kernel.cu"), (8, "skinny.cu")]
    assert split[0][1] == gemv.gemv_spec(16384, 2048, 8, H200) and dict(split[1][1].values)["STAGES"] == 4
    assert [(mr, s) for mr, s in split[2:]] == [(mb, s) for mb, s in gemv.variants(Linear(), [x, w], H200)[2:]]
    assert _variants(3072, 2048) == narrow  # narrow matrices: as by default
    monkeypatch.setenv(ENV, "wide")
    with pytest.raises(ValueError, match="INGOT_GEMV_SKINNY='wide': expected 0, 1, split8, from16, all or force"):
        _variants(16384, 2048)


def test_stage_cap(monkeypatch):
    """INGOT_GEMV_SKINNY_STAGES caps the rule's weight stages (as many as fit by default)."""
    monkeypatch.delenv(ENV, raising=False)
    x, w = TensorType(DType.bf16, ("T", 2048)), TensorType(DType.bf16, (16384, 2048))

    def stages() -> dict[int, int]:
        return {mb: dict(s.values)["STAGES"] for mb, s in gemv.variants(Linear(), [x, w], H200) if is_skinny(s)}

    monkeypatch.delenv(STAGES_ENV, raising=False)
    # 64: x streamed, 24 KB a stage; 8 (5-8 tokens of the split bucket): SPLIT8_STAGES
    assert stages() == {8: 4, 16: 8, 32: 6, 64: 8}
    monkeypatch.setenv(STAGES_ENV, "4")
    assert stages() == {8: 4, 16: 4, 32: 4, 64: 4}
    monkeypatch.setenv(STAGES_ENV, "8")
    assert stages() == {8: 4, 16: 8, 32: 6, 64: 8}  # no more than fit
    monkeypatch.setenv(STAGES_ENV, "12")  # e4m3 stages are half as large: up to 16
    assert stages() == {8: 4, 16: 8, 32: 6, 64: 8}
    for bad in ("1", "17", "four"):
        monkeypatch.setenv(STAGES_ENV, bad)
        with pytest.raises(ValueError, match=f"INGOT_GEMV_SKINNY_STAGES='{bad}': expected an integer from 2 to 16"):
            stages()


def test_its_variant_takes_the_plain_variants_arguments():
    """The executor binds a variant to the GEMM launch's arguments by name (``lower.gemv_variant_plans``)."""
    plain = gemv.gemv_spec(16384, 2048, 16, H200)
    skinny = skinny_spec(16384, 2048, 16, H200)
    assert [p.name for p in skinny.params] == [p.name for p in plain.params]
    assert is_skinny(skinny) and not is_skinny(plain) and not gemv.is_plain(skinny)


def test_weight_pitches_name_every_weight_a_skinny_variant_reads():
    specs = {"sk2048": skinny_spec(16384, 2048, 16, H200).to_dict(), "sk1024": skinny_spec(16384, 1024, 16, H200)
             .to_dict(), "plain": gemv.gemv_spec(16384, 2048, 8, H200).to_dict()}

    def launch(weight: str, *kernels: str, own: str | None = None) -> dict:
        return {"args": {"weight": {"buffer": weight}}, "variants": [
            {"kernel": k, "max_rows": 8, **({"args": {"weight": {"buffer": own}}} if own else {})} for k in kernels]}

    table = [launch("w0", "plain", "sk2048"), launch("w1", "plain"), launch("w2", "sk1024"),
             launch("wq", "sk2048", own="w3"), {"collective": "all_reduce", "args": {}}]
    assert weight_pitches(table, specs) == {"w0": 4096, "w2": 2048, "w3": 4096}
    with pytest.raises(ValueError, match="weight w0 read with row pitches 4096 and 2048 bytes"):
        weight_pitches([launch("w0", "sk2048"), launch("w0", "sk1024")], specs)


def test_the_map_region_and_misplaced_weights():
    # rounded up to whole rows where the arena has room, else down
    assert w_tma_region(10_000, 20_000, 4096, {"a": (0, 4096), "b": (4096, 4096)}) == 12288
    assert w_tma_region(10_000, 10_000, 4096, {"a": (0, 4096), "b": (4096, 4096)}) == 8192
    with pytest.raises(ValueError, match="weight b at offset 4352 .* must start at a multiple of 4096"):
        w_tma_region(10_000, 20_000, 4096, {"b": (4352, 4096)})
    with pytest.raises(ValueError, match="end within 8192 bytes"):
        w_tma_region(10_000, 10_000, 4096, {"c": (8192, 1808)})


def test_memory_plan_aligns_the_weights_to_their_pitch(tmp_path):
    from ingot.codegen.memory_plan import ALIGN, plan_memory
    from tests.codegen.test_fuse_split_lower import _graph

    g = _graph(tmp_path)
    names = list(g.weights)
    pitch = 2048 * 2 * 3  # 12 KB: no multiple of the 256-byte alignment's, as a K of 3 x 2048 would give
    plain = plan_memory(g, {"T": 64, "S": 8, "max_blocks": 4}).buffers
    off = [n for n in names[1:] if plain[n].offset % pitch]
    assert off, "every weight already aligned: the test would show nothing"
    aligned = plan_memory(g, {"T": 64, "S": 8, "max_blocks": 4}, weight_align={n: pitch for n in off}).buffers
    assert all(aligned[n].offset % pitch == 0 and aligned[n].offset % ALIGN == 0 for n in off)
    others = [n for n in names if n not in off]
    assert all(aligned[n].offset % ALIGN == 0 for n in others)
    # no overlap, nothing lost
    spans = sorted((b.offset, b.offset + b.nbytes) for b in aligned.values() if b.region == "weights")
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])) and len(spans) == len(names)


def test_split_k_launch():
    """Split-K in a cluster (opt-in): a grid of row tiles x splits (no persistence), x's K slice only in shared
    memory, so 64 tokens fit; no prologue; K slices a multiple of 64."""
    spec = skinny_spec(3072, 2048, 32, H200, splitk=4)
    assert spec.grid_dims({"M": 32}) == (24, 4, 1) and dict(spec.values)["SPLITK"] == 4 and "_sk4" in spec.entry
    assert spec.smem == smem_bytes(2048, 32, 2, dict(spec.values)["STAGES"], 4) <= H200.smem_per_block
    assert not supported(16384, 2048, 64, H200) and supported(16384, 2048, 64, H200, stages=3, splitk=2)
    assert not supported(2048, 2048, 8, H200, splitk=3) and not supported(2048, 96 * 8, 8, H200, splitk=8)
    with pytest.raises(ValueError, match="needs all of K in one CTA"):
        skinny_spec(3072, 2048, 8, H200, splitk=2, prologue=gemv.Prologue("rms_norm", 1e-5))
    with pytest.raises(ValueError, match="needs all of K in one CTA"):  # decode fusion leaves such a pair unfused
        gemv.fused_spec(skinny_spec(3072, 2048, 8, H200, splitk=2), gemv.Prologue("rms_norm", 1e-5), H200)


def test_any_m_variant_of_narrow_long_k_matrices(monkeypatch):
    """Narrow matrices with K >= ANY_MIN_K (the 1B model's down) take the split-K variant of bucket 64 in 64-token
    chunks on grid.z for steps of 65-256 tokens (``any_m_spec``); K = 2048 ones (qkv, o) and wide ones (whose GEMM
    fills the SMs) keep the GEMM there; ``INGOT_GEMV_SKINNY_ANY=0``: none. No prologue; none for e4m3 weights (their
    bucket 64 at such K is kernel.cu's)."""
    from ingot.codegen.kernels.gemv.skinny_rule import ANY_ENV, ANY_M_ROWS, ANY_MIN_K, any_m_on, any_m_spec

    for var in (ENV, SPLITK_ENV, XS_ENV, ANY_ENV):
        monkeypatch.delenv(var, raising=False)
    assert any_m_on() and (ANY_M_ROWS, ANY_MIN_K) == (256, 8192)
    narrow = {8: "kernel.cu", 16: "skinny.cu/sk4", 32: "skinny.cu/sk4", 64: "skinny.cu/sk4"}
    assert _variants(2048, 8192, residual=True) == {**narrow, 64: "skinny.cu/sk4/xs", 256: "skinny.cu/sk4/xs"}
    assert _variants(3072, 2048) == _variants(2048, 2048, residual=True) == narrow  # K = 2048: the GEMM's
    assert 256 not in _variants(16384, 2048) and 256 not in _variants(128256, 2048)  # wide: the GEMM's
    assert 256 not in _variants(2048, 8192, target=B200)
    spec = any_m_spec(2048, 8192, H200, residual=True)
    v = dict(spec.values)
    assert (v["CHUNKS"], v["MB"], v["SPLITK"], v["XS"], v["HAS_RESIDUAL"]) == (True, 64, 4, True, True)
    assert spec.grid_dims({"M": 65}) == (16, 4, 2) and spec.grid_dims({"M": 256}) == (16, 4, 4)
    assert spec.entry.rsplit("_", 1)[0].endswith("_sk4_xs_r_any") and "any M in chunks of 64" in spec.doc
    assert not dict(skinny_spec(2048, 8192, 64, H200, splitk=4, x_stream=True).values)["CHUNKS"]
    # e4m3 weights: at K >= 8192 x's quarter (64 x 2048 tokens) is streamed, and that bucket 64 is kernel.cu's
    assert any_m_spec(2048, 8192, H200, wb=1) is None and any_m_spec(1024, 8192, H200, wb=1) is None
    monkeypatch.setenv(ANY_ENV, "0")
    assert _variants(2048, 8192) == {**narrow, 64: "skinny.cu/sk4/xs"} and any_m_spec(2048, 8192, H200) is None
    with pytest.raises(ValueError, match="any-M launch takes no prologue"):
        skinny_spec(3072, 2048, 64, H200, prologue=gemv.Prologue("rms_norm", 1e-5), any_m=True)
    monkeypatch.setenv(ANY_ENV, "yes")
    with pytest.raises(ValueError, match="INGOT_GEMV_SKINNY_ANY='yes': expected 0 or 1"):
        any_m_on()


@needs_compiler
@pytest.mark.parametrize("n,k,splitk,xs,residual,wb", [(3072, 2048, 4, False, False, 2),
                                                       (2048, 8192, 4, True, True, 2), (2048, 2048, 4, False, True, 1)])
def test_any_m_compiles_with_the_chunk_offsets(n, k, splitk, xs, residual, wb):
    """The any-M build: the bucket-64 kernel with its rows offset by grid.z's chunk (ctaid.z), wgmma m64n64, no local
    memory, the one grid-dependency wait."""
    from ingot.codegen.compile import compile_spec
    from ingot.codegen.sass import disassemble

    spec = skinny_spec(n, k, 64, H200, splitk=splitk, x_stream=xs, bias=residual, residual=residual, wb=wb,
                       any_m=True)
    built = compile_spec(spec)
    assert "%ctaid.z" in built.ptx and not re.search(r"\.local\b", built.ptx)
    assert f"wgmma.mma_async.sync.aligned.m64n64k16.f32.{'f16.f16' if wb == 1 else 'bf16.bf16'}" in built.ptx
    sass = disassemble(built.cubin)
    ops = Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.x]*)", sass))
    assert ops["ACQBULK"] == 1 and not any(o.startswith(("LDL", "STL")) for o in ops)
    assert "S2R" in ops and "SR_CTAID.Z" in sass
    plain = compile_spec(skinny_spec(n, k, 64, H200, splitk=splitk, x_stream=xs, bias=residual, residual=residual,
                                     wb=wb))
    assert "%ctaid.z" not in plain.ptx


def test_bias_and_residual_in_the_epilogue():
    """o and down carry the residual stream: their variants add it (and a bias) in the epilogue, the launch is the
    plain one's; the kernel names say so."""
    plain = skinny_spec(2048, 2048, 32, H200, splitk=4)
    both = skinny_spec(2048, 2048, 32, H200, splitk=4, bias=True, residual=True)
    v = dict(both.values)
    assert (v["HAS_BIAS"], v["HAS_RESIDUAL"]) == (True, True) and not dict(plain.values)["HAS_RESIDUAL"]
    assert both.entry.rsplit("_", 1)[0].endswith("_sk4_b_r") and "bias, residual" in both.doc
    assert (both.block, both.smem, both.grid_dims({"M": 9})) == (plain.block, plain.smem, plain.grid_dims({"M": 9}))
    assert [p.name for p in both.params] == [p.name for p in plain.params] == [n for n, _ in PARAMS]
    fused = gemv.fused_spec(skinny_spec(16384, 2048, 8, H200, residual=True), gemv.Prologue("rms_norm", 1e-5), H200)
    assert dict(fused.values)["HAS_RESIDUAL"] and dict(fused.values)["PROLOGUE"] == 1


def test_fp8_weights_variant(monkeypatch):
    """Weight-only FP8 (``wb=1``): the quantized linear's parameters by name, the bf16 variant's launch, stages of
    half the bytes (64-byte rows), so up to 16 of them where x leaves room; rows of K bytes for the map and the memory
    plan; no prologue. The quant rule gives them by default (``INGOT_GEMV_SKINNY_FP8=0``: never), the bf16 rule's
    choices but split-K with x streamed."""
    from ingot.codegen.kernels.gemv.quant_rule import quant_variants
    from ingot.codegen.kernels.gemv.skinny_rule import FP8_ENV, row_bytes
    from ingot.ir.ops.quantized import QuantizedLinear

    fp8 = skinny_spec(2048, 2048, 32, H200, splitk=4, residual=True, wb=1)
    bf = skinny_spec(2048, 2048, 32, H200, splitk=4, residual=True)
    assert [p.name for p in fp8.params] == [n for n, _ in gemv.QUANT_PARAMS] and fp8.entry.startswith("skinny_fp8w_")
    assert (fp8.block, fp8.grid_dims({"M": 9})) == (bf.block, bf.grid_dims({"M": 9}))
    assert (dict(bf.values)["STAGES"], dict(fp8.values)["STAGES"]) == (8, 16)  # x: 32 tokens x 512 columns
    # 16 stages of 8 KB: the bytes of 8 bf16 stages, and 8 more barrier pairs
    assert fp8.smem == smem_bytes(2048, 32, 2, 16, 4, wb=1) == bf.smem + 8 * 16
    # gate_up at 32 tokens: x (128 KB) leaves room for 6 bf16 stages of 16 KB, 12 e4m3 ones of 8 KB
    assert max_stages(2048, 32, H200) == 6 and max_stages(2048, 32, H200, wb=1) == 12
    with pytest.raises(ValueError, match="17 stages"):
        skinny_spec(300, 1024, 16, H200, stages=17, wb=1)
    assert row_bytes(fp8.values) == 2048 and row_bytes(bf.values) == 4096 and "e4m3 weights" in fp8.doc
    with pytest.raises(ValueError, match=r"wb must be 2 .*, 1 .* or 0 .*without a prologue"):
        skinny_spec(16384, 2048, 8, H200, wb=1, prologue=gemv.Prologue("rms_norm", 1e-5))
    with pytest.raises(ValueError, match="wb must be"):
        skinny_spec(16384, 2048, 8, H200, wb=3)

    def templates(n: int, k: int = 2048) -> dict[int, str]:
        op = QuantizedLinear(weight_format="fp8", weight_granularity="channel", act_format="none", in_features=k)
        inputs = [TensorType(DType.bf16, ("T", k)), TensorType(DType.f8e4m3fn, (n, k)), TensorType(DType.f32, (n,))]
        out = {}
        for mb, spec in quant_variants(op, inputs, H200):
            v = dict(spec.values)
            assert v["WB"] == 1, spec.entry
            out[mb] = spec.template + (f"/sk{v['SPLITK']}" if is_skinny(spec) and v["SPLITK"] > 1 else "") + \
                ("/xs" if is_skinny(spec) and v["XS"] else "")
        return out

    for var in (ENV, SPLITK_ENV, XS_ENV, FP8_ENV):
        monkeypatch.delenv(var, raising=False)
    # the default: the bf16 rule's choices from bucket 16 on, but not split-K with x streamed (down at 64 tokens)
    assert templates(3072) == {8: "kernel.cu", 16: "skinny.cu/sk4", 32: "skinny.cu/sk4", 64: "skinny.cu/sk4"}
    assert templates(16384) == {8: "kernel.cu", 16: "skinny.cu", 32: "skinny.cu", 64: "skinny.cu/xs"}
    assert templates(2048, 8192) == {8: "kernel.cu", 16: "skinny.cu/sk4", 32: "skinny.cu/sk4", 64: "kernel.cu"}
    monkeypatch.setenv(FP8_ENV, "1")
    assert templates(16384) == {8: "kernel.cu", 16: "skinny.cu", 32: "skinny.cu", 64: "skinny.cu/xs"}
    monkeypatch.setenv(ENV, "all")  # bucket 8 stays kernel.cu's for FP8 weights (no prologue on their skinny form)
    assert templates(16384) == {8: "kernel.cu", 16: "skinny.cu", 32: "skinny.cu", 64: "skinny.cu/xs"}
    monkeypatch.delenv(ENV)
    monkeypatch.setenv(FP8_ENV, "0")
    assert set(templates(3072).values()) == set(templates(16384).values()) == {"kernel.cu"}
    monkeypatch.setenv(FP8_ENV, "on")
    with pytest.raises(ValueError, match="INGOT_GEMV_SKINNY_FP8='on': expected 0 or 1"):
        templates(3072)


def test_nvfp4_weights_variant(monkeypatch):
    """Weight-only NVFP4 (``wb=0``): the quantized linear's parameters, rows of K / 2 bytes, stages of 32-byte rows (up
    to 32), x staged whole and K slices of whole 256-column scale groups (else not supported: kernel.cu's); the quant
    rule gives them only with INGOT_GEMV_SKINNY_NVFP4=1 (opt-in), the bf16 rule's choices where supported."""
    from ingot.codegen.kernels.gemv.quant_rule import quant_variants
    from ingot.codegen.kernels.gemv.skinny_rule import NVFP4_ENV, row_bytes, stage_limit, supported
    from ingot.ir.ops.quantized import QuantizedLinear

    spec = skinny_spec(3072, 2048, 32, H200, splitk=4, residual=True, wb=0)
    assert [p.name for p in spec.params] == [n for n, _ in gemv.QUANT_PARAMS]
    assert spec.entry.startswith("skinny_nvfp4w_") and "NVFP4 weights" in spec.doc and row_bytes(spec.values) == 1024
    assert stage_limit(0) == 32 and dict(spec.values)["STAGES"] == 32  # x: 32 tokens x 512 columns; 4 KB stages
    assert spec.smem == smem_bytes(2048, 32, 2, 32, 4, wb=0) == smem_bytes(2048, 32, 2, 8, 4) + 24 * 16
    assert not supported(16384, 2048, 64, H200, x_stream=True, wb=0)  # x streamed: not with NVFP4
    assert not supported(2048, 1536, 16, H200, splitk=4, wb=0)  # K slices of 384 columns
    assert supported(2048, 1536, 16, H200, wb=0) and supported(2048, 1024, 16, H200, splitk=4, wb=0)
    with pytest.raises(ValueError, match="NVFP4: x staged whole, K slices a multiple of 256"):
        skinny_spec(16384, 2048, 64, H200, x_stream=True, wb=0)

    def templates(n: int, k: int = 2048) -> dict[int, str]:
        op = QuantizedLinear(weight_format="nvfp4", weight_granularity="block", act_format="none", in_features=k)
        inputs = [TensorType(DType.bf16, ("T", k)), TensorType(DType.u8, (n, k // 2)),
                  TensorType(DType.u8, (n, k // 16)), TensorType(DType.f32, ())]
        out = {}
        for mb, spec in quant_variants(op, inputs, H200):
            v = dict(spec.values)
            assert v["WB"] == 0, spec.entry
            out[mb] = spec.template + (f"/sk{v['SPLITK']}" if is_skinny(spec) and v["SPLITK"] > 1 else "")
        return out

    for var in (ENV, SPLITK_ENV, XS_ENV, NVFP4_ENV, "INGOT_GEMV_NVFP4"):
        monkeypatch.delenv(var, raising=False)
    assert set(templates(3072).values()) == set(templates(16384).values()) == {"kernel.cu"}
    monkeypatch.setenv(NVFP4_ENV, "1")
    # (qkv's bucket 8 split: INGOT_GEMV_NVFP4_SPLIT8, tests/codegen/test_gemv_cluster.py)
    assert templates(3072) == {4: "kernel.cu", 8: "kernel.cu", 16: "skinny.cu/sk4", 32: "skinny.cu/sk4",
                               64: "skinny.cu/sk4"}
    # gate_up at 64 tokens would stream x: kernel.cu's
    assert templates(16384) == {8: "kernel.cu", 16: "skinny.cu", 32: "skinny.cu", 64: "kernel.cu"}
    monkeypatch.setenv(NVFP4_ENV, "yes")
    with pytest.raises(ValueError, match="INGOT_GEMV_SKINNY_NVFP4='yes': expected 0 or 1"):
        templates(3072)


@needs_compiler
@pytest.mark.parametrize("n,k,mb,wgs,splitk", [(16384, 2048, 32, 2, 1), (3072, 2048, 16, 2, 4), (300, 1024, 16, 1, 1)])
def test_nvfp4_weights_compile_to_register_fragments_and_wgmma(n, k, mb, wgs, splitk):
    """NVFP4 codes by TMA, 8 bytes a row a lane (LDS.64), turned into f16 fragments times their block scale (the
    scale bytes by 16-byte global loads a 4-stage group, converted by the hardware) and multiplied as wgmma's register
    A: four f16 HGMMAs a stage, the loop unrolled over a group of 4 stages; x rewritten once in f16; no local
    memory."""
    spec = skinny_spec(n, k, mb, H200, warpgroups=wgs, splitk=splitk, bias=True, residual=True, wb=0)
    ops, hgmma = _compiled_rs(spec, mb, "mul.rn.f16x2")
    assert len(hgmma) == 16, hgmma
    assert ops["LDS.64"] == 8 and ops["HMUL2"] == 64 and ops["UTMALDG.2D"] >= 1 and ops["SHFL.IDX"] == 0
    assert ops["LDG.E.128.CONSTANT"] >= 2 and ops["LDS.128"] >= 8 and ops["STS.128"] >= 8


def test_spec_launch_and_stages():
    spec = skinny_spec(16384, 2048, 32, H200)
    assert spec.template == "skinny.cu" and spec.arch == "sm_90a"
    assert [(p.name, p.ctype) for p in spec.params] == PARAMS
    assert spec.block == (384, 1, 1)
    assert spec.grid_dims({"M": 32}) == (128, 1, 1)  # 16384 / 128 row tiles, fewer than the SMs
    assert skinny_spec(128256, 2048, 8, H200).grid_dims({"M": 8}) == (132, 1, 1)  # persistent over 1,002 tiles
    # as many stages as fit beside x: 6 of 16 KB at 32 tokens (x 128 KB), 8 at 8 tokens
    assert max_stages(2048, 32, H200) == 6 and max_stages(2048, 8, H200) == 8
    limit = H200.smem_per_block  # 227 KB
    # x, the stages, their barriers, the rms_norm sums (32 tokens x 9 floats), the panels' alignment
    assert spec.smem == smem_bytes(2048, 32, 2, 6) == 1024 + 32 * 2048 * 2 + 6 * 128 * 128 + 6 * 16 + 32 * 9 * 4
    assert spec.smem <= limit
    assert smem_bytes(2048, 32, 2, 7) > limit
    assert needs_w_tma(spec) and not needs_kv_tma(spec)


def test_the_rms_norm_prologue_variant():
    """``rule.fused_spec`` of a skinny variant (decode fusion): the same launch, ``norm_weight`` after the plain
    parameters (kernel.cu's order), the norm's eps in the source; no swiglu prologue."""
    plain = skinny_spec(16384, 2048, 8, H200)
    fused = gemv.fused_spec(plain, gemv.Prologue("rms_norm", eps=1e-5), H200)
    assert is_skinny(fused) and fused.entry.startswith("skinny_bf16_n16384_k2048_m8_wg2_s8_rms_norm")
    assert [p.name for p in fused.params] == [p.name for p in plain.params] + ["norm_weight"]
    assert (fused.block, fused.smem, fused.grid_dims({"M": 8})) == (plain.block, plain.smem, plain.grid_dims({"M": 8}))
    assert dict(fused.values)["PROLOGUE"] == 1 and "norm_weight" in fused.source()
    assert [p.name for p in gemv.gemv_spec(16384, 2048, 8, H200, prologue=gemv.Prologue("rms_norm", 1e-5)).params] \
        == [p.name for p in fused.params]  # the binding decode fusion makes for either
    with pytest.raises(ValueError, match="no swiglu prologue"):
        gemv.fused_spec(skinny_spec(2048, 8192, 8, H200, stages=4), gemv.Prologue("swiglu"), H200)
    with pytest.raises(ValueError, match="not a skinny variant without a prologue"):
        gemv.fused_spec(fused, gemv.Prologue("rms_norm", eps=1e-5), H200)


def _compiled_rs(spec, mb: int, *ptx: str) -> tuple[Counter, list[str]]:
    """Compile a quantized-weight skinny variant: f16 wgmma (no bf16 one), e4m3 -> f16 conversions, x's f32 -> f16
    rewrite and ``ptx``'s instructions in the PTX, no local memory; its SASS opcode counts and the A operands of its
    HGMMAs (all registers)."""
    from ingot.codegen.compile import compile_spec
    from ingot.codegen.sass import disassemble

    built = compile_spec(spec)
    assert f"wgmma.mma_async.sync.aligned.m64n{mb}k16.f32.f16.f16" in built.ptx and ".bf16.bf16" not in built.ptx
    for instr in ("cvt.rn.f16x2.e4m3x2", "cvt.rn.f16x2.f32", *ptx):
        assert instr in built.ptx, instr
    assert not re.search(r"\.local\b", built.ptx)
    sass = disassemble(built.cubin)
    ops = Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.x]*)", sass))
    assert not any(o.startswith(("LDL", "STL")) for o in ops)
    hgmma = re.findall(rf"HGMMA\.64x{mb}x16\.F32 R\d+, (\S+), gdesc", sass)
    assert hgmma and all(a.startswith("R") for a in hgmma), hgmma
    return ops, hgmma


@needs_compiler
@pytest.mark.parametrize("n,k,mb,wgs,splitk,xs", [
    (16384, 2048, 32, 2, 1, False), (3072, 2048, 16, 2, 4, False), (2048, 8192, 64, 2, 4, True),
    (1000, 256, 16, 1, 1, True)])
def test_fp8_weights_compile_to_register_fragments_and_wgmma(n, k, mb, wgs, splitk, xs):
    """e4m3 codes by TMA (one copy a stage), read as 32-bit words (four a row, rows g8 and g8 + 8) and converted by the
    hardware (e4m3x2 -> f16x2, exact) into wgmma's A fragments in registers: f16 HGMMAs with a register A operand,
    four a stage (the loop unrolled twice where K has more than one stage), no shuffles; x rewritten once in f16 and
    the fragment order (16-byte loads and stores of shared memory); no local memory."""
    spec = skinny_spec(n, k, mb, H200, warpgroups=wgs, splitk=splitk, x_stream=xs, residual=True, wb=1)
    ops, hgmma = _compiled_rs(spec, mb)
    assert len(hgmma) == (8 if k // splitk > 64 else 4), hgmma
    assert ops["UTMALDG.2D"] >= 1 and ops["ACQBULK"] == 1 and ops["SHFL.IDX"] == 0
    assert ops["F2FP.F16.E4M3.UNPACK_B"] >= 8 and ops["LDS"] >= 8 and ops["LDS.128"] >= 2 and ops["STS.128"] >= 2


@needs_compiler
@pytest.mark.parametrize("n,k,mb,wgs,stages,norm,splitk,residual,xs", [
    (16384, 2048, 32, 2, None, False, 1, False, False), (128256, 2048, 8, 2, None, False, 1, False, False),
    (1000, 64, 16, 1, 3, False, 1, True, False), (16384, 2048, 32, 2, None, True, 1, False, False),
    (1000, 64, 8, 1, 2, True, 1, True, False),
    (3072, 256, 32, 2, None, False, 4, False, False), (2048, 512, 64, 2, None, False, 8, True, False),
    (1000, 128, 64, 1, 2, False, 2, False, False), (2048, 2048, 32, 2, None, False, 4, True, False),
    # x streamed: 64 tokens persistent, down's split-K at 64 with the residual, one warpgroup and 4 stages
    (16384, 2048, 64, 2, None, False, 1, False, True), (2048, 8192, 64, 2, None, False, 4, True, True),
    (1000, 256, 16, 1, 4, False, 1, False, True),
])
def test_compiles_to_wgmma_with_tma(n, k, mb, wgs, stages, norm, splitk, residual, xs):
    from ingot.codegen.compile import compile_spec
    from ingot.codegen.kernel import render
    from ingot.codegen.sass import disassemble

    spec = skinny_spec(n, k, mb, H200, warpgroups=wgs, stages=stages,
                       prologue=gemv.Prologue("rms_norm", 1e-5) if norm else None, splitk=splitk, bias=residual,
                       residual=residual, x_stream=xs)
    built = compile_spec(spec)
    assert f"wgmma.mma_async.sync.aligned.m64n{mb}k16.f32.bf16.bf16" in built.ptx
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in built.ptx
    assert "setmaxnreg" in built.ptx if wgs == 2 else "setmaxnreg" not in built.ptx
    assert not re.search(r"\.local\b", built.ptx)
    sass = disassemble(built.cubin)
    ops = Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.x]*)", sass))
    assert ops[f"HGMMA.64x{mb}x16.F32.BF16"] == 4  # four 16-column k-steps a 64-column stage
    assert ops["UTMALDG.2D"] >= 1 and not any(o.startswith(("LDL", "STL", "HMMA")) for o in ops)
    assert ops["ACQBULK"] == 1  # one grid-dependency wait, the consumers' (the producer's copies start at once)
    # split-K: cluster barriers (every thread, the producer's too) and the peers' partial tiles read through DSMEM
    assert ("barrier.cluster.arrive.release" in built.ptx and "ld.shared::cluster.f32" in built.ptx
            and ops["UCGABAR_ARV"] >= 2) == (splitk > 1)
    assert render(spec).count("griddepcontrol.wait") == 1
    # the residual (the previous kernel's output) by coherent loads, after the wait; the bias (a weight) may be .nc
    wait = built.ptx.index("griddepcontrol.wait")
    loads = [m.start() for m in re.finditer(r"ld\.global(\.nc)?\.u16", built.ptx)]
    assert ("ld.global.u16" in built.ptx) == residual and all(at > wait for at in loads)
    # x (the previous kernel's output) by the consumers' cp.async after it too; streamed: STAGES - 3 panels ahead
    copies = [m.start() for m in re.finditer(r"cp\.async\.c[ag]\.shared", built.ptx)]
    assert copies and all(at > wait for at in copies)
    assert not xs or f"cp.async.wait_group {dict(spec.values)['STAGES'] - 3};" in built.ptx
    if wgs == 2:  # setmaxnreg only moves registers: the CTA must start with the 40 + 2 x 232 it hands out
        from tests.codegen.test_prefill_wgmma import _registers

        assert _registers(built.cubin) * spec.block[0] >= 128 * (40 + 2 * 232)
