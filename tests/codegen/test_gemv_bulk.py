"""The bulk-copy decode GEMV (``codegen/kernels/gemv/bulk.cu``, opt-in) without a GPU: configurations, the
``INGOT_GEMV_BULK`` switch in ``rule.variants``, the fused (prologue) bulk variants ``rule.fused_spec`` makes, and
compile + SASS checks for sm_90a and sm_100a (the weights' bulk copies before the grid-dependency wait, tensor cores,
no local memory). The numerics: test_gemv_bulk_gpu.py, test_decode_fusion_gpu.py (the prologues)."""

from __future__ import annotations

import pytest

from ingot.codegen.kernel import PDL_MARKER
from ingot.codegen.kernels.gemv import bulk_rule
from ingot.codegen.kernels.gemv.bulk_rule import (
    SMEM_BUDGET,
    bulk_config,
    bulk_spec,
    fused_bulk_spec,
    smem_bytes,
    spec_config,
    x_bytes,
)
from ingot.codegen.kernels.gemv.rule import BUCKETS, PARAMS, PROLOGUES, Prologue, fused_spec, is_plain, variants
from ingot.codegen.target import get_target
from ingot.ir.ops.llm import Linear
from ingot.ir.types import DType, TensorType
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    compiled,
    disassembled,
    module_kernel_cache,
    needs_compiler,
)
from tests.codegen.test_decode_fusion import WAIT, sass_sequence

#: the Llama-3.2-1B layer shapes (qkv, o, gate_up, down, lm_head) and awkward ones
SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048), (200, 96), (1000, 4128)]


@pytest.mark.parametrize("n,k", SHAPES)
def test_configs_cover_k_and_fit(n, k):
    for mb in BUCKETS:
        c = bulk_config(n, k, mb, 132)
        if c is None:
            continue
        assert c.splitk * c.slice_k >= k > (c.splitk - 1) * c.slice_k
        assert c.stage_cols % 64 == 0 and c.slice_k % c.stage_cols == 0 and 16 * c.tiles <= 32
        assert min(2, c.slice_k // c.stage_cols) <= c.stages <= c.slice_k // c.stage_cols
        assert smem_bytes(mb, c) <= SMEM_BUDGET


@pytest.mark.parametrize("n,k", [(3072, 2048), (2048, 2048)])
def test_small_matrices_fit_their_ring_in_one_wave(n, k):
    """qkv and o at 8 tokens: at most one CTA per SM and the whole tile in the ring (all of it fetched before the
    grid-dependency wait)."""
    c = bulk_config(n, k, 8, 132)
    assert c is not None
    assert -(-n // c.rows) * c.splitk <= 132 and c.stages * c.stage_cols >= c.slice_k


def test_switch_picks_the_template(monkeypatch):
    h200 = get_target("h200")
    x, w = TensorType(DType.bf16, ("T", 2048)), TensorType(DType.bf16, (3072, 2048))
    monkeypatch.delenv(bulk_rule.ENV, raising=False)
    assert {s.template for _, s in variants(Linear(), [x, w], h200)} == {"kernel.cu"}
    monkeypatch.setenv(bulk_rule.ENV, "1")
    found = variants(Linear(), [x, w], h200)
    assert [mb for mb, _ in found] == list(BUCKETS) and {s.template for _, s in found} == {"bulk.cu"}
    assert all(is_plain(s) and s.params == found[0][1].params for _, s in found)
    plain = found[0][1]
    assert bulk_spec(3072, 2048, 8, h200, config=spec_config(plain)) == plain
    fused = fused_spec(plain, Prologue("rms_norm", 1e-5), h200)  # a bulk variant's prologue is a bulk one
    assert fused.template == "bulk.cu" and fused.value("MB") == 8 and fused.value("PROLOGUE") == 1
    # no configuration fits: that bucket keeps kernel.cu
    wide = TensorType(DType.bf16, (1000, 4128))
    odd = dict(variants(Linear(), [TensorType(DType.bf16, ("T", 4128)), wide], h200))
    assert bulk_config(1000, 4128, 64, 132) is None and odd[64].template == "kernel.cu"


def test_source_orders_copies_wait_and_launch():
    src = bulk_spec(3072, 2048, 8, get_target("h200")).source()
    body = src[src.index('extern "C" __global__'):]
    assert body.count("griddepcontrol.wait;") == 1
    wait = body.index("griddepcontrol.wait;")
    assert body.index("griddepcontrol.launch_dependents") < body.index("issue(i);") < wait
    assert body.index("reinterpret_cast<const unsigned short*>(x)") > wait


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("n,k,mb", [(3072, 2048, 8), (1000, 4128, 32)])
def test_sass_bulk_copies_before_the_wait(target, n, k, mb):
    """The weights' bulk copies (UBLKCP) and launch_dependents (PREEXIT) come before the one grid-dependency wait
    (ACQBULK) in program order; tensor cores from ldmatrix fragments; no local memory."""
    tgt = get_target(target)
    seq = sass_sequence(disassembled(compiled(bulk_spec(n, k, mb, tgt, bias=True, residual=True)), tgt.arch))
    assert seq.count(WAIT) == 1
    wait = seq.index(WAIT)
    copies = [i for i, o in enumerate(seq) if o.startswith("UBLKCP")]
    assert copies and copies[0] < wait and len(copies) >= 3, (copies, wait)  # ring fill; x after; refill
    assert "PREEXIT" in seq[:wait]
    assert not any(o.startswith(("LDG", "LDSM", "HMMA")) for o in seq[:wait]), seq[:wait]
    ops = set(seq)
    assert any(o.startswith("HMMA.16816.F32.BF16") for o in ops) and any(o.startswith("LDSM") for o in ops)
    assert_no_local_memory(ops, "the bulk GEMV")


def _fused(n: int, k: int, mb: int, kind: str, target: str = "h200", residual: bool = False):
    """(the plain bulk variant, ``rule.fused_spec`` of it with ``kind``'s prologue)."""
    tgt = get_target(target)
    plain = bulk_spec(n, k, mb, tgt, residual=residual)
    assert plain is not None
    pro = Prologue("rms_norm", eps=1e-5) if kind == "rms_norm" else Prologue("swiglu", alpha=1.0)
    return plain, fused_spec(plain, pro, tgt)


def test_fused_bulk_specs():
    """kernel.cu's prologue parameters and literals; the plain variant's configuration, with fewer ring stages where
    the prologue's x region needs the room (down's swiglu stages gate and up: a configuration of its own), within
    the budget; kernel.cu's fused variant where no bulk configuration fits."""
    h200 = get_target("h200")
    for n, k, kind in ((3072, 2048, "rms_norm"), (16384, 2048, "rms_norm"), (128256, 2048, "rms_norm"),
                       (576, 576, "rms_norm"), (2048, 8192, "swiglu"), (1000, 4128, "swiglu")):
        plain, fused = _fused(n, k, 8, kind, residual=kind == "swiglu")
        assert fused.template == "bulk.cu" and fused.value("PROLOGUE") == PROLOGUES[kind], (n, k, kind)
        assert [p.name for p in fused.params] == [p for p, _ in PARAMS] + (["norm_weight"] if kind == "rms_norm"
                                                                             else [])
        assert fused.value("HAS_RESIDUAL") == plain.value("HAS_RESIDUAL") and not is_plain(fused)
        c, f = spec_config(plain), spec_config(fused)
        assert fused.smem == smem_bytes(8, f, kind) <= SMEM_BUDGET
        if kind == "rms_norm":
            assert f == c and fused.value("EPS") == 1e-5  # qkv / gate_up / lm_head of the 1B model keep theirs
        assert f.splitk * f.slice_k >= k > (f.splitk - 1) * f.slice_k
    assert x_bytes(8, 1024, "swiglu") == 2 * x_bytes(8, 1024)
    assert x_bytes(8, 1024, "rms_norm") == x_bytes(8, 1024) + 2048  # the norm weight's slice
    _, down = _fused(2048, 8192, 8, "swiglu", residual=True)
    assert down.value("ALPHA") == 1.0 and spec_config(down).splitk == 8  # gate and up: half the slice
    plain, fused = _fused(1000, 4128, 32, "swiglu")
    assert fused_bulk_spec(plain, Prologue("swiglu"), h200) is None and fused.template == "kernel.cu"
    assert fused.value("PROLOGUE") == PROLOGUES["swiglu"]


@pytest.mark.parametrize("kind", ["rms_norm", "swiglu"])
def test_fused_source_reads_inputs_after_the_wait(kind):
    """The ring before the wait, the raw slices (x, gate and up, the norm weight) copied after it."""
    _, fused = _fused(3072, 2048, 8, kind)
    body = fused.source()[fused.source().index('extern "C" __global__'):]
    assert body.count(PDL_MARKER) == 1
    wait = body.index(PDL_MARKER)
    assert body.index("issue(i);") < wait < body.index("reinterpret_cast<const unsigned short*>(x)")
    if kind == "rms_norm":
        assert body.index("norm_weight) + kb") > wait


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("n,k,kind", [(3072, 2048, "rms_norm"), (2048, 8192, "swiglu")])
def test_sass_fused_bulk_copies_before_the_wait(target, n, k, kind):
    """The 1B model's qkv (rms_norm, split-K: the sums of squares' workspace) and down (swiglu): the weights' bulk
    copies before the one wait, nothing read from global or shared memory before it; the prologue's instructions
    (the 9 shuffles, ex2); no local memory."""
    tgt = get_target(target)
    _, fused = _fused(n, k, 8, kind, target, residual=kind == "swiglu")
    seq = sass_sequence(disassembled(compiled(fused), tgt.arch))
    assert seq.count(WAIT) == 1
    wait = seq.index(WAIT)
    copies = [i for i, o in enumerate(seq) if o.startswith("UBLKCP")]
    assert copies and copies[0] < wait and "PREEXIT" in seq[:wait], (copies, wait)
    assert not any(o.startswith(("LDG", "LDS", "HMMA")) for o in seq[:wait]), seq[:wait]
    ops = set(seq)
    assert any(o.startswith("HMMA.16816.F32.BF16") for o in ops) and any(o.startswith("LDSM") for o in ops)
    assert ("MUFU.EX2" in ops) == (kind == "swiglu") and ("SHFL.BFLY" in ops) == (kind == "rms_norm"), sorted(ops)
    assert_no_local_memory(ops, "the fused bulk GEMV")
