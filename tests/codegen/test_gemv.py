"""The decode GEMV family (``codegen/kernels/gemv``) without a GPU: configurations, the variants the
lowering records for ``linear`` launches, and compile + SASS checks for sm_90a and sm_100a."""

from __future__ import annotations

import json
import os

import pytest

from ingot.codegen.kernels.gemv.rule import BUCKETS, SMEM_BUDGET, gemv_config, gemv_spec, smem_bytes, variants
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
)
from tests.codegen.test_decode_fusion import W_FIRST, W_NC, WAIT, X_LOAD, X_NC, check_pdl_order, sass_sequence

#: the Llama-3.2-1B layer shapes of bench/bench_gemv.py, and awkward ones (N, K not multiples of the tiles)
SHAPES = [(3072, 2048), (16384, 2048), (2048, 8192), (128256, 2048), (576, 576), (200, 96), (1000, 4128)]


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("mb", BUCKETS)
def test_config_covers_k_and_fits(n, k, mb):
    c = gemv_config(n, k, mb, 132)
    assert c.slice_k % (32 * c.stage_steps) == 0
    assert c.splitk * c.slice_k >= k > (c.splitk - 1) * c.slice_k
    assert smem_bytes(mb, c.slice_k) <= SMEM_BUDGET


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
def test_lowering_records_variants(tmp_path, tmp_path_factory, monkeypatch):
    """Every linear of the tiny Llama lowered for h200 has its GEMV variants. Compiled through the session's kernel
    cache (test_lower.py's), not this module's: the lowering also builds the h200 CUTLASS GEMMs, minutes cold, and
    test_lower.py builds the same ones."""
    from pathlib import Path

    import ingot

    monkeypatch.setenv("INGOT_CACHE_DIR", os.environ.get("INGOT_TEST_KERNEL_CACHE")
                       or str(tmp_path_factory.getbasetemp() / "kernel-cache"))
    fixtures = Path(__file__).resolve().parent.parent / "fixtures"
    path = ingot.compile(fixtures / "tiny_llama_kv.onnx", target="h200", out=tmp_path / "t.ingot", mode="llm")
    cuda = json.loads((path / "manifest.json").read_text())["cuda"]
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


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("n,k,mb", [(16384, 2048, 8), (2048, 8192, 32), (200, 96, 64)])
def test_where_the_weights_load_against_the_pdl_wait(target, n, k, mb):
    """The SASS of a plain variant waits for the previous grid (ACQBULK) before its first weight load (ptxas moves
    the .nc loads past the wait: what docs/PERF.md measured); with ``weights_first`` the first stage's U x MT x 2
    loads (fewer where K is shorter than a stage) come before the wait, x's and the residual's after it (coherent
    loads: ptxas keeps them on their side). Not yet timed on a GPU (bench/bench_decode_fusion.py)."""
    tgt = get_target(target)
    plain = gemv_spec(n, k, mb, tgt, residual=True)
    seq = sass_sequence(disassembled(compiled(plain), tgt.arch))
    assert seq.index(WAIT) < seq.index(W_NC) and seq.index(WAIT) < seq.index(X_NC) and W_FIRST not in seq
    first = gemv_spec(n, k, mb, tgt, residual=True, weights_first=True)
    stage = min(first.value("U"), k // 32) * first.value("MT") * 2  # steps past K are never loaded
    seq = sass_sequence(disassembled(compiled(first), tgt.arch))
    check_pdl_order(seq, stage, (X_LOAD, "LDG.E.U16"))
    ops = set(seq)
    assert_no_local_memory(ops, "the GEMV with its weights first")
