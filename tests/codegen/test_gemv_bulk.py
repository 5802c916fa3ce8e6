"""The bulk-copy decode GEMV (``codegen/kernels/gemv/bulk.cu``, opt-in) without a GPU: configurations, the
``INGOT_GEMV_BULK`` switch in ``rule.variants`` and ``quant_rule.quant_variants``, the fused (prologue) bulk variants
``rule.fused_spec`` makes, a numpy model of the FP8-weight variant's fragments (ldmatrix on e4m3 bytes, the K
permutation x follows, the exact e4m3 -> bf16 conversion), and compile + SASS checks for sm_90a and sm_100a (the
weights' bulk copies before the grid-dependency wait, tensor cores, no local memory). The numerics:
test_gemv_bulk_gpu.py, test_gemv_bulk_quant_gpu.py, test_decode_fusion_gpu.py (the prologues)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernel import PDL_MARKER
from ingot.codegen.kernels.gemv import bulk_rule, skinny_rule
from ingot.codegen.kernels.gemv.bulk_rule import (
    SMEM_BUDGET,
    WORKSPACE_BUDGET,
    bulk_config,
    bulk_quant_spec,
    bulk_spec,
    fused_bulk_spec,
    smem_bytes,
    spec_config,
    workspace_bytes,
    x_bytes,
)
from ingot.codegen.kernels.gemv.quant_rule import PARAMS as QUANT_PARAMS
from ingot.codegen.kernels.gemv.quant_rule import quant_variants
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
from tests.codegen.test_gemv_quant import qtypes
from tests.helpers import rng

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
        assert smem_bytes(mb, c) <= SMEM_BUDGET and workspace_bytes(n, mb, c) <= WORKSPACE_BUDGET


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
    monkeypatch.setenv("INGOT_GEMV_SKINNY", "0")  # (its split-K would take buckets 16-64 of this matrix)
    monkeypatch.delenv(bulk_rule.ENV, raising=False)
    assert {s.template for _, s in variants(Linear(), [x, w], h200)} == {"kernel.cu"}
    monkeypatch.setenv(bulk_rule.ENV, "1")  # the measured buckets (up to MAX_BUCKET) only
    on = dict(variants(Linear(), [x, w], h200))
    assert list(on) == list(BUCKETS) and 8 <= bulk_rule.MAX_BUCKET < 32
    assert all(s.template == ("bulk.cu" if mb <= bulk_rule.MAX_BUCKET else "kernel.cu") for mb, s in on.items())
    monkeypatch.setenv(bulk_rule.ENV, "all")  # every bucket
    found = variants(Linear(), [x, w], h200)
    assert [mb for mb, _ in found] == list(BUCKETS) and {s.template for _, s in found} == {"bulk.cu"}
    assert all(is_plain(s) and s.params == found[0][1].params for _, s in found)
    assert found[0][1] == on[8]
    monkeypatch.setenv(bulk_rule.ENV, "yes")
    with pytest.raises(ValueError, match="INGOT_GEMV_BULK='yes'"):
        variants(Linear(), [x, w], h200)
    monkeypatch.setenv(bulk_rule.ENV, "all")
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


def _copies_before_the_wait(spec, arch: str, not_before: tuple[str, ...] = ("LDG", "LDS", "HMMA")):
    """The SASS opcodes of ``spec`` and the positions of its bulk copies (UBLKCP), checked: one grid-dependency wait
    (ACQBULK), the first bulk copy and launch_dependents (PREEXIT) before it in program order, and no ``not_before``
    instruction before it (nothing read from global or shared memory, no tensor-core work)."""
    seq = sass_sequence(disassembled(compiled(spec), arch))
    assert seq.count(WAIT) == 1
    wait = seq.index(WAIT)
    copies = [i for i, o in enumerate(seq) if o.startswith("UBLKCP")]
    assert copies and copies[0] < wait and "PREEXIT" in seq[:wait], (copies, wait)
    assert not any(o.startswith(not_before) for o in seq[:wait]), seq[:wait]
    return set(seq), copies


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("n,k,mb", [(3072, 2048, 8), (1000, 4128, 32)])
def test_sass_bulk_copies_before_the_wait(target, n, k, mb):
    """The weights' bulk copies (UBLKCP) and launch_dependents (PREEXIT) come before the one grid-dependency wait
    (ACQBULK) in program order; tensor cores from ldmatrix fragments; no local memory."""
    tgt = get_target(target)
    spec = bulk_spec(n, k, mb, tgt, bias=True, residual=True)
    ops, copies = _copies_before_the_wait(spec, tgt.arch, not_before=("LDG", "LDSM", "HMMA"))
    assert len(copies) >= 3, copies  # ring fill; x after; refill
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
    ops, _ = _copies_before_the_wait(fused, tgt.arch)
    assert any(o.startswith("HMMA.16816.F32.BF16") for o in ops) and any(o.startswith("LDSM") for o in ops)
    assert ("MUFU.EX2" in ops) == (kind == "swiglu") and ("SHFL.BFLY" in ops) == (kind == "rms_norm"), sorted(ops)
    assert_no_local_memory(ops, "the fused bulk GEMV")


# -- FP8 weights (weight-only quantized_linear) ----------------------------------------------------------------------


@pytest.mark.parametrize("n,k", [(3072, 2048), (2048, 8192), (128256, 2048), (200, 128), (1000, 4160)])
def test_fp8_configs_cover_k_and_fit(n, k):
    for mb in BUCKETS:
        c = bulk_config(n, k, mb, 132, wb=1)
        if (n, mb) == (128256, 64):  # its split-K workspace would exceed the budget: quant.cu keeps the bucket
            assert c is None
            continue
        assert c is not None, (n, k, mb)
        assert workspace_bytes(n, mb, c) <= WORKSPACE_BUDGET
        assert c.splitk * c.slice_k >= k > (c.splitk - 1) * c.slice_k and c.stage_cols % 128 == 0
        assert smem_bytes(mb, c, wb=1) <= SMEM_BUDGET and x_bytes(mb, c.slice_k, wb=1) == mb * (2 * c.slice_k + 32)
        spec = bulk_quant_spec(n, k, mb, get_target("h200"))
        assert spec is not None and spec.smem == smem_bytes(mb, c, wb=1) and spec.value("WB") == 1


def test_fp8_switch_picks_the_template(monkeypatch):
    """FP8 weight-only buckets are bulk.cu's with ``INGOT_GEMV_BULK=all`` (quant.cu's parameters); FP8 activations
    stay on quant.cu, NVFP4 weights where ``INGOT_GEMV_NVFP4`` puts them (kernel.cu by default,
    tests/codegen/test_gemv_nvfp4.py); a bulk FP8 variant is no plain bf16 variant (decode fusion never fuses it)."""
    h200 = get_target("h200")
    op, ins = qtypes("fp8", 3072, 2048, residual=True)
    monkeypatch.delenv(bulk_rule.ENV, raising=False)
    monkeypatch.delenv("INGOT_GEMV_FP8", raising=False)  # the default: kernel.cu (tests/codegen/test_gemv_fp8.py)
    monkeypatch.delenv(skinny_rule.FP8_ENV, raising=False)  # and the skinny GEMM from bucket 16 on
    default = ["kernel.cu", "skinny.cu", "skinny.cu", "skinny.cu"]
    assert [s.template for _, s in quant_variants(op, ins, h200)] == default
    monkeypatch.setenv(bulk_rule.ENV, "1")  # measured slower than quant.cu / kernel.cu: only on request
    assert [s.template for _, s in quant_variants(op, ins, h200)] == default
    monkeypatch.setenv(bulk_rule.ENV, "all")
    found = quant_variants(op, ins, h200)
    assert [mb for mb, _ in found] == list(BUCKETS) and {s.template for _, s in found} == {"bulk.cu"}
    assert all([p.name for p in s.params] == [p for p, _ in QUANT_PARAMS] and s.value("WB") == 1 and
               s.value("HAS_RESIDUAL") and not is_plain(s) for _, s in found)
    for fmt, act, gran in (("fp8", "fp8", "token"), ("fp8", "fp8", "tensor"), ("nvfp4", "none", "token")):
        op, ins = qtypes(fmt, 3072, 2048, act, gran)
        want = "kernel.cu" if fmt == "nvfp4" else "quant.cu"
        assert {s.template for _, s in quant_variants(op, ins, h200)} == {want}, (fmt, act, gran)


def _ldmatrix_x4(rows: np.ndarray, lane_addr) -> np.ndarray:
    """``ldmatrix.sync.aligned.m8n8.x4.b16`` on ``rows`` (bytes, [row][byte]): lane ``8 m + r`` gives matrix m's row
    r address as (row, byte); lane l receives, of each matrix, bytes 4 (l % 4) .. + 3 of its row l / 4, as uint32."""
    out = np.zeros((32, 4), np.uint32)
    for m in range(4):
        for lane in range(32):
            row, byte = lane_addr(8 * m + lane // 4)
            b = rows[row, byte + 4 * (lane % 4): byte + 4 * (lane % 4) + 4].astype(np.uint32)
            out[lane, m] = b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24
    return out


def _e4m3x4_bf16(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """bulk.cu's bk_e4m3x4_bf16 on uint32 words: (bytes 0, 1) and (bytes 2, 3) as bf16 pairs (low half first), f32."""
    def half(b: np.ndarray) -> np.ndarray:  # a code byte placed in the high byte of a bf16, then the bit shuffle
        a = (b.astype(np.uint32) << 8)
        bits = (a & 0x8000) | ((a >> 4) & 0x07F0)
        return (bits << 16).view(np.float32) * np.float32(2.0 ** 120)  # exact (a bf16 times a power of 2)

    def pair(b0, b1):
        return np.stack([half(b0), half(b1)], axis=-1)

    byte = [(v >> (8 * i)) & 0xFF for i in range(4)]
    return pair(byte[0], byte[1]), pair(byte[2], byte[3])


def test_fp8_conversion_is_exact():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint32)  # all but NaN
    v = codes | codes << 8 | codes << 16 | codes << 24
    lo, hi = _e4m3x4_bf16(v)
    want = codes.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    for got in (lo[:, 0], lo[:, 1], hi[:, 0], hi[:, 1]):
        np.testing.assert_array_equal(got, want)


def test_fp8_fragments_model_the_product():
    """One 32-column step of 16 weight rows and 8 tokens, lane by lane as bulk.cu computes it: ldmatrix.x4 of the
    e4m3 bytes (a_lane's addresses), the conversion, x's two 8-byte loads (columns 4q.. and 16 + 4q..) and the two
    m16n8k16 MMAs (A: a0 = row g, k 2q..2q+1; a1 = row g + 8; a2, a3 = k + 8; B: b0 = k 2q.., b1 = k 2q + 8.., token
    g) give w @ x^T."""
    r = rng()
    codes = r.integers(0, 256, (16, 32), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # no NaN
    w = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    x = r.standard_normal((8, 32)).astype(ml_dtypes.bfloat16).astype(np.float64)
    regs = _ldmatrix_x4(codes, lambda lane: ((lane & 7) + 8 * ((lane >> 3) & 1), 16 * (lane >> 4)))
    acc = np.zeros((16, 8))
    for h in range(2):  # the two MMAs: columns 0-15, 16-31
        a = np.zeros((16, 16))
        b = np.zeros((16, 8))
        for lane in range(32):
            g, q = lane >> 2, lane & 3
            lo_g, hi_g = _e4m3x4_bf16(regs[lane, 2 * h])
            lo_g8, hi_g8 = _e4m3x4_bf16(regs[lane, 2 * h + 1])
            a[g, 2 * q: 2 * q + 2], a[g + 8, 2 * q: 2 * q + 2] = lo_g, lo_g8  # a0, a1
            a[g, 2 * q + 8: 2 * q + 10], a[g + 8, 2 * q + 8: 2 * q + 10] = hi_g, hi_g8  # a2, a3
            xc = x[g, 16 * h + 4 * q: 16 * h + 4 * q + 4]  # the 8-byte load: b0 = xc[0:2], b1 = xc[2:4]
            b[2 * q: 2 * q + 2, g], b[2 * q + 8: 2 * q + 10, g] = xc[0:2], xc[2:4]
        acc += a @ b
    np.testing.assert_allclose(acc, w @ x.T, rtol=1e-12, atol=1e-12)


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("n,k,mb", [(3072, 2048, 8), (1000, 4160, 16)])
def test_sass_fp8_bulk_copies_before_the_wait(target, n, k, mb):
    """The FP8 variant: weights' bulk copies before the one wait, nothing read before it; ldmatrix for w, 8-byte
    shared loads for x, bf16 tensor cores; no local memory."""
    tgt = get_target(target)
    spec = bulk_quant_spec(n, k, mb, tgt, bias=True, residual=True)
    assert spec is not None
    ops, _ = _copies_before_the_wait(spec, tgt.arch)
    assert {"LDS.64", "HMMA.16816.F32.BF16"} <= ops and any(o.startswith("LDSM") for o in ops), sorted(ops)
    assert_no_local_memory(ops, "the FP8 bulk GEMV")


@pytest.mark.parametrize("wb", [2, 1])
def test_workspace_budget_keeps_the_lm_head_at_64_tokens_off_bulk(monkeypatch, wb):
    """The lm_head at 64 tokens needs split-K >= 4 for x's slice to fit the shared-memory budget, i.e. a >= 131 MB
    module-scope workspace: over WORKSPACE_BUDGET, so that bucket keeps the register-streaming template; without the
    budget a configuration would be found (the workspace is the only reason)."""
    assert bulk_config(128256, 2048, 64, 132, wb=wb) is None
    monkeypatch.setattr(bulk_rule, "WORKSPACE_BUDGET", 1 << 40)
    c = bulk_config(128256, 2048, 64, 132, wb=wb)
    assert c is not None and workspace_bytes(128256, 64, c) > WORKSPACE_BUDGET
    monkeypatch.undo()
    monkeypatch.setenv(bulk_rule.ENV, "all")
    monkeypatch.setenv("INGOT_GEMV_SKINNY", "0")  # (else bucket 64 falls to the skinny GEMM, x streamed)
    h200 = get_target("h200")
    if wb == 2:
        x, w = TensorType(DType.bf16, ("T", 2048)), TensorType(DType.bf16, (128256, 2048))
        found = dict(variants(Linear(), [x, w], h200))
        assert found[64].template == "kernel.cu" and found[32].template == "bulk.cu"
    else:
        op, ins = qtypes("fp8", 128256, 2048)
        found = dict(quant_variants(op, ins, h200))
        assert found[64].template == "quant.cu" and found[32].template == "bulk.cu"
