"""The decode GEMV family (``codegen/kernels/gemv``) without a GPU: configurations, the variants the
lowering records for ``linear`` launches, and compile + SASS checks for sm_90a and sm_100a."""

from __future__ import annotations

import json

import pytest

from ingot.codegen.kernels.gemv.rule import (
    BUCKETS,
    KW_BUCKETS,
    KW_ENV,
    KW_SHAPE,
    SHAPE_BY_BUCKET,
    SMEM_BUDGET,
    WIDE_N_SHAPE,
    GemvConfig,
    gemv_config,
    gemv_spec,
    kw_fits,
    smem_bytes,
    spec_config,
    variants,
)
from ingot.codegen.target import get_target
from ingot.ir.ops.llm import Linear
from ingot.ir.types import DType, TensorType
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    compiled,
    disassembled,
    module_kernel_cache,
    needs_compiler,
    needs_cuobjdump,
    sass_opcodes,
    session_kernel_cache,
)
from tests.codegen.test_decode_fusion import W_FIRST, W_NC, WAIT, X_LOAD, X_NC, check_pdl_order, sass_sequence


@pytest.fixture(autouse=True)
def _workspace_split_k(monkeypatch):
    """The workspace split-K and row groups these tests were written for (``INGOT_GEMV_CLUSTER=0``); the cluster
    reduction, the default, has its own tests (test_gemv_cluster.py, test_gemv_cluster_gpu.py)."""
    monkeypatch.setenv("INGOT_GEMV_CLUSTER", "0")


#: the Llama-3.2-1B layer shapes of bench/bench_gemv.py, and awkward ones (N, K not multiples of the tiles)
SHAPES = [(3072, 2048), (16384, 2048), (2048, 8192), (128256, 2048), (576, 576), (200, 96), (1000, 4128)]


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("mb", BUCKETS)
def test_config_covers_k_and_fits(n, k, mb):
    c = gemv_config(n, k, mb, 132)
    assert c.slice_k % (32 * c.stage_steps * c.kwarps) == 0  # each warp of a row group: whole stages
    assert c.splitk * c.slice_k >= k > (c.splitk - 1) * c.slice_k
    assert smem_bytes(mb, c.slice_k) <= SMEM_BUDGET and kw_fits(mb, c)
    assert c.warps % c.kwarps == 0 and c.rows == 16 * c.tiles * c.warps // c.kwarps


#: the 1B model's layer GEMVs (N, K) -> (warps a row group, split-K) in buckets 8 and 16: qkv and o (too few 64-row
#: blocks for 1.5 CTAs an SM) get 16-row CTAs whose 4 warps split the whole of K, no split-K; down's 8192-column x
#: slice is over KW_MAX_X (measured slower with row groups), so it keeps split-K 8; gate_up and the lm_head have
#: rows enough
ROW_GROUPS = {(3072, 2048): (4, 1), (2048, 2048): (4, 1), (2048, 8192): (1, 8), (16384, 2048): (1, 1),
              (128256, 2048): (1, 1)}


@pytest.mark.parametrize("n,k", list(ROW_GROUPS))
def test_row_groups_for_the_small_matrices_only(n, k, monkeypatch):
    monkeypatch.delenv(KW_ENV, raising=False)
    kw, split = ROW_GROUPS[(n, k)]
    for mb in KW_BUCKETS:
        c = gemv_config(n, k, mb, 132)
        assert (c.kwarps, c.splitk) == (kw, split), (mb, c)
        assert (c.warps, c.tiles, c.stage_steps) == (KW_SHAPE if kw > 1 else SHAPE_BY_BUCKET[mb]), (mb, c)
        spec = gemv_spec(n, k, mb, get_target("h200"))
        assert spec.value("KW") == kw and spec_config(spec) == c
        assert spec.grid[0].const * spec.grid[1].const >= 0.9 * 132  # CTAs: at least 0.9 an SM
    for mb in set(BUCKETS) - set(KW_BUCKETS):  # 32 and 64 tokens: as before row groups existed
        assert gemv_config(n, k, mb, 132).kwarps == 1
    monkeypatch.setenv(KW_ENV, "0")  # INGOT_GEMV_KW=0: none, the configuration the rule made before them
    off = gemv_config(n, k, 8, 132)
    assert off.kwarps == 1 and (off.warps, off.tiles, off.stage_steps) == SHAPE_BY_BUCKET[8]
    assert off == gemv_config(n, k, 8, 132, kwarps=1)
    monkeypatch.setenv(KW_ENV, "all")  # all: quant.cu's too; the bf16 ones as with 1
    assert gemv_config(n, k, 8, 132).kwarps == kw
    monkeypatch.setenv(KW_ENV, "yes")
    with pytest.raises(ValueError, match=KW_ENV):
        gemv_config(n, k, 8, 132)


def test_bucket_16_takes_the_wide_shape_for_wide_matrices():
    """Bucket 16 (9-16 tokens): the 1B model's gate_up and lm_head (N alone gives 0.9 CTAs an SM with 8-warp, 16-row
    CTAs) take WIDE_N_SHAPE without split-K, as swept on the H200; narrower matrices keep the bucket's own shape."""
    for n in (16384, 128256):
        c = gemv_config(n, 2048, 16, 132)
        assert (c.warps, c.tiles, c.stage_steps, c.splitk, c.kwarps) == (*WIDE_N_SHAPE[16], 1, 1)
        assert gemv_config(n, 2048, 8, 132) == GemvConfig(*SHAPE_BY_BUCKET[8][:2], 1, SHAPE_BY_BUCKET[8][2], 2048)
    for n, k in ((3072, 2048), (2048, 8192), (1000, 4128)):
        c = gemv_config(n, k, 16, 132)
        assert (c.warps, c.tiles, c.stage_steps) == SHAPE_BY_BUCKET[16] and c.splitk > 1


def test_row_group_configs_are_checked():
    with pytest.raises(ValueError, match="divide"):
        gemv_config(3072, 2048, 8, 132, warps=4, kwarps=3)
    # 8 warps a row group, 2 tiles each, 64 tokens: 7 partial tiles of 2 x 8 n-tiles (7 x 16 KB) do not fit x's
    # 64 x (128 + 32) bf16 region
    assert not kw_fits(64, GemvConfig(warps=8, tiles=2, splitk=1, stage_steps=1, slice_k=128, kwarps=8))
    with pytest.raises(ValueError, match="row group"):
        gemv_config(200, 96, 64, 132, warps=8, tiles=2, stage_steps=1, kwarps=8)


def test_variants_only_for_bf16_linear():
    h200 = get_target("h200")
    x, w = TensorType(DType.bf16, ("T", 256)), TensorType(DType.bf16, (512, 256))
    found = variants(Linear(), [x, w], h200)
    assert [mb for mb, _ in found] == list(BUCKETS)
    assert all(s.params == found[0][1].params for _, s in found)
    assert variants(Linear(), [TensorType(DType.f32, ("T", 256)), TensorType(DType.f32, (512, 256))], h200) == []
    assert variants(Linear(), [TensorType(DType.bf16, ("T", 100)), TensorType(DType.bf16, (512, 100))], h200) == []
    assert variants(Linear(), [x, w], get_target("cpu")) == []


@needs_compiler
@pytest.mark.usefixtures("session_kernel_cache")
def test_lowering_records_variants(tmp_path, monkeypatch):
    """Every linear of the tiny Llama lowered for h200 has its GEMV variants. Compiled through the session's kernel
    cache (test_lower.py's), not this module's: the lowering also builds the h200 CUTLASS GEMMs, minutes cold, and
    test_lower.py builds the same ones."""
    from pathlib import Path

    import ingot

    monkeypatch.setenv(KW_ENV, "1")  # the default, set: recorded among the artifact's switches
    fixtures = Path(__file__).resolve().parent.parent / "fixtures"
    path = ingot.compile(fixtures / "tiny_llama_kv.onnx", target="h200", out=tmp_path / "t.ingot", mode="llm")
    cuda = json.loads((path / "manifest.json").read_text())["cuda"]
    # the INGOT_* switches the compile saw, without directories / caches / test-only variables
    assert cuda["switches"][KW_ENV] == "1" and "INGOT_CACHE_DIR" not in cuda["switches"]
    assert not any(k.startswith("INGOT_TEST_") for k in cuda["switches"])
    linears = [ln for ln in cuda["launches"] if ln["op"] == "linear"]
    assert linears and all(ln.get("variants") for ln in linears)
    for ln in linears:
        assert [v["max_rows"] for v in ln["variants"]] == list(BUCKETS)
        for v in ln["variants"]:
            k = cuda["variant_kernels"][v["kernel"]]
            assert (path / k["cubin"]).is_file()
            if "args" in v:  # a fused variant (codegen/decode_fusion.py): its own arguments
                assert {p[0] for p in k["params"]} == set(v["args"])
            else:
                assert [p[0] for p in k["params"]] == [p[0] for p in cuda["kernels"][ln["kernel"]]["params"]]


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("n,k,mb", [(3072, 2048, 8), (2048, 8192, 32), (200, 96, 64), (1000, 4128, 16)])
def test_compiles_with_tensor_cores_and_wide_loads(target, n, k, mb):
    tgt = get_target(target)
    ops = sass_opcodes(gemv_spec(n, k, mb, tgt, bias=True, residual=True), tgt.arch)
    assert any(o.startswith("HMMA.16816.F32.BF16") for o in ops), sorted(ops)
    assert any(o.startswith("LDG.E") and o.endswith(".128") or ".128." in o for o in ops if o.startswith("LDG")), \
        sorted(ops)
    assert_no_local_memory(ops, "the GEMV")


#: row-group configurations (warps, tiles, steps a stage, split-K, warps a row group) beyond the rule's defaults:
#: split-K on top, 2 tiles a warp, a partial last slice, 64 tokens (tests/codegen/test_gemv_gpu.py runs the same)
KW_CASES = [(1000, 4128, 8, (8, 1, 4, 3, 8)), (3072, 2048, 32, (8, 2, 2, 1, 2)), (2048, 8192, 16, (4, 1, 8, 4, 4)),
            (200, 96, 64, (8, 1, 1, 1, 2))]


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("n,k,mb,c", KW_CASES)
def test_row_groups_compile_without_spills(target, n, k, mb, c):
    tgt = get_target(target)
    w, t, u, sk, kw = c
    cfg = gemv_config(n, k, mb, 132, warps=w, tiles=t, stage_steps=u, splitk=sk, kwarps=kw)
    assert (cfg.splitk, cfg.kwarps) == (sk, kw)
    ops = sass_opcodes(gemv_spec(n, k, mb, tgt, bias=True, residual=True, config=cfg), tgt.arch)
    assert any(o.startswith("HMMA.16816.F32.BF16") for o in ops), sorted(ops)
    assert any(o.startswith("BAR") for o in ops), sorted(ops)  # the row group's reduction through shared memory
    assert_no_local_memory(ops, "the GEMV with row groups")


def test_weights_first_switch(monkeypatch):
    """``INGOT_GEMV_WEIGHTS_FIRST``: plain variants load weights first unless ``fused`` (the default: ``all``); fused
    ones load weights first either way; an explicit ``weights_first`` wins."""
    from ingot.codegen.kernels.gemv.rule import WEIGHTS_FIRST_ENV, Prologue, fused_spec

    tgt = get_target("h200")
    monkeypatch.delenv(WEIGHTS_FIRST_ENV, raising=False)
    assert gemv_spec(2048, 2048, 8, tgt).value("WEIGHTS_FIRST") is True
    for raw, plain_first in (("", True), ("fused", False), (" FUSED ", False), (" ALL ", True)):
        monkeypatch.setenv(WEIGHTS_FIRST_ENV, raw)
        plain = gemv_spec(2048, 2048, 8, tgt)
        assert plain.value("WEIGHTS_FIRST") is plain_first, raw
        assert fused_spec(plain, Prologue("rms_norm", eps=1e-5), tgt).value("WEIGHTS_FIRST") is True
        assert gemv_spec(2048, 2048, 8, tgt, weights_first=False).value("WEIGHTS_FIRST") is False
    monkeypatch.setenv(WEIGHTS_FIRST_ENV, "some")
    with pytest.raises(ValueError, match=WEIGHTS_FIRST_ENV):
        gemv_spec(2048, 2048, 8, tgt)


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("n,k,mb", [(16384, 2048, 8), (2048, 8192, 32), (200, 96, 64)])
def test_where_the_weights_load_against_the_pdl_wait(target, n, k, mb):
    """The SASS of a variant without ``weights_first`` (``INGOT_GEMV_WEIGHTS_FIRST=fused``'s plain variants) waits
    for the previous grid (ACQBULK) before its first weight load (ptxas moves the .nc loads past the wait); with
    ``weights_first`` (the default since the fourteenth session) the first stage's U x MT x 2 loads (fewer where K is
    shorter than a stage) come before the wait, x's and the residual's after it (coherent loads: ptxas keeps them on
    their side)."""
    tgt = get_target(target)
    plain = gemv_spec(n, k, mb, tgt, residual=True, weights_first=False)
    seq = sass_sequence(disassembled(compiled(plain), tgt.arch))
    assert seq.index(WAIT) < seq.index(W_NC) and seq.index(WAIT) < seq.index(X_NC) and W_FIRST not in seq
    first = gemv_spec(n, k, mb, tgt, residual=True, weights_first=True)
    stage = min(first.value("U"), k // 32) * first.value("MT") * 2  # steps past K are never loaded
    seq = sass_sequence(disassembled(compiled(first), tgt.arch))
    check_pdl_order(seq, stage, (X_LOAD, "LDG.E.U16"))
    ops = set(seq)
    assert_no_local_memory(ops, "the GEMV with its weights first")
