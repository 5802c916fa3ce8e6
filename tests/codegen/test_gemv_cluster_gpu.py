"""Split-K over a thread-block cluster in the decode GEMV (``kernel.cu``'s ``CLUSTER``, ``rule.GemvConfig.cluster``,
``INGOT_GEMV_CLUSTER=1``) on the GPU (``-m gpu``; skipped without one).

Each cluster variant is launched beside the same configuration reduced the other way (the module-scope workspace
and the row block's last CTA): the cluster adds the same partials in the same order, so their outputs must be equal
bit for bit; the workspace variant is itself checked against the reference (numpy for bf16 weights,
``QuantizedLinear.ref`` for FP8 and NVFP4 ones) within the GEMV tests' tolerance. Weights bf16, FP8 and NVFP4; the
1B model's qkv at 32 tokens (8 slices of 256 columns), down at batch 1 (8 slices of 1024), a partial last slice with
N off the tiles, 64 tokens, row groups (the in-CTA sum first, one row group for more slices than groups: only rank 0
reduces), 2 tiles a warp; plain and bias + residual epilogues, the rms_norm and swiglu prologues (against numpy and
the launches they replace: ``test_decode_fusion_gpu.check_rms_norm`` / ``check_swiglu``) and the rope epilogue
(``test_qkv_rope_fusion_gpu.check_rope_epilogue``: q and the cache bit for bit as the plain cluster variant followed
by ``rope/qkv_cache.cu``). Outputs poisoned before each launch, each launch done twice.

    python -m pytest tests/codegen/test_gemv_cluster_gpu.py -m gpu -v
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from ingot.codegen.kernels.gemv.rule import (
    WB_NAMES,
    WB_NVFP4,
    Prologue,
    RopeEpilogue,
    fused_spec,
    gemv_config,
    gemv_spec,
    nvfp4_split8_config,
    with_rope,
)
from ingot.codegen.kernels.rope.cache_rule import rope_qkv_cache_spec
from ingot.ir.types import DType
from tests.codegen.common import gpu_target
from tests.codegen.test_decode_fusion_gpu import EPS, TOL, bf16_weight, check_rms_norm, check_swiglu
from tests.codegen.test_gemv_fp8_gpu import _fp8_linear, _fp8_weight
from tests.codegen.test_gemv_fp8_gpu import _op as _fp8_op
from tests.codegen.test_gemv_nvfp4_gpu import _nvfp4_linear, _nvfp4_weight
from tests.codegen.test_gemv_nvfp4_gpu import _op as _nvfp4_op
from tests.codegen.test_gemv_quant_gpu import activations
from tests.codegen.test_qkv_rope_fusion_gpu import BLOCK, CTYPE, check_rope_epilogue
from tests.codegen.test_qkv_rope_fusion_gpu import CASES as ROPE_CASES
from tests.helpers import rng

pytestmark = pytest.mark.gpu
BF16 = ml_dtypes.bfloat16

#: (weights: ``wb``, N, K, bucket, (warps, tiles, steps a stage, split-K, warps a row group), token counts)
CASES = [
    (2, 3072, 2048, 32, (8, 1, 4, 8, 1), (1, 17, 32)),  # qkv at 32 tokens, the rule's shape: 8 slices of 256
    (2, 2048, 8192, 8, (4, 1, 8, 8, 1), (1, 3, 8)),  # down at batch 1: 8 slices of 1024
    (2, 1000, 4128, 16, (4, 1, 8, 3, 1), (5, 16)),  # N off the tiles, a partial last slice (4128 = 2 x 1536 + 1056)
    (2, 200, 1024, 64, (4, 1, 4, 2, 1), (33, 64)),  # 64 tokens
    (2, 1000, 4128, 8, (8, 1, 4, 3, 8), (1, 8)),  # one row group of 8 warps, 3 slices: rank 0 reduces, 1 and 2 idle
    (2, 2048, 8192, 16, (4, 1, 8, 4, 4), (1, 16)),  # row groups of 4 warps, then 4 slices
    (2, 3072, 2048, 32, (8, 2, 2, 4, 1), (9, 32)),  # 2 tiles a warp: a 256-row block's partials (32 KB)
    (2, 2048, 2048, 32, (4, 1, 8, 8, 1), (1, 17, 32)),  # o at 32 tokens, the rule's CLUSTER_SHAPE
    (1, 3072, 2048, 32, (8, 1, 4, 4, 1), (1, 17, 32)),  # FP8 weights
    (1, 2048, 8192, 8, (4, 1, 8, 8, 1), (1, 8)),
    (0, 3072, 2048, 32, (8, 1, 4, 2, 1), (1, 17, 32)),  # NVFP4 weights
    (0, 3072, 2048, 32, (8, 1, 2, 4, 1), (1, 17, 32)),  # NVFP4 qkv at 32 tokens, the rule's CLUSTER_SHAPE_NVFP4
    (0, 2048, 2048, 32, (8, 1, 2, 8, 1), (1, 17, 32)),  # NVFP4 o: 8 slices of one 256-column stage
    (0, 3072, 2048, 16, (8, 1, 2, 8, 1), (9, 16)),  # NVFP4 qkv at 16 tokens
    (0, 2048, 2048, 64, (8, 1, 2, 8, 1), (33, 64)),  # NVFP4 o at 64 tokens
    (0, 2048, 8192, 16, (8, 1, 2, 8, 1), (16,)),  # NVFP4 down at 16 tokens: 8 slices of 1024
    (0, 2048, 8192, 8, (4, 1, 8, 8, 1), (1, 8)),
    (0, 3072, 2048, 8, (8, 1, 4, 4, 1), (5, 8)),  # NVFP4 qkv at 5-8 tokens, the rule's NVFP4_SPLIT8_SHAPE
    (0, 2048, 2048, 8, (8, 1, 4, 4, 1), (1, 6, 8)),  # NVFP4 o at 5-8 tokens
]


#: weight format -> (its weights' buffers ``(gpu, r, n, k) -> (inputs, buffers)``, its op ``k -> QuantizedLinear``)
QUANT = {1: (_fp8_weight, _fp8_op), 0: (_nvfp4_weight, _nvfp4_op)}


def _ids(case) -> str:
    wb, n, k, mb, c, _ = case
    return f"{WB_NAMES[wb]}-{n}x{k}-m{mb}-w{c[0]}t{c[1]}u{c[2]}sk{c[3]}kw{c[4]}"


def _pair(gpu, wb: int, n: int, k: int, mb: int, c, bias: bool, residual: bool, prologue: Prologue | None = None):
    """(the workspace variant, the cluster variant) of one configuration."""
    warps, tiles, u, sk, kw = c
    tgt = gpu_target(gpu)
    cfg = gemv_config(n, k, mb, tgt.num_sms or 132, warps=warps, tiles=tiles, stage_steps=u, splitk=sk, kwarps=kw,
                      wb=wb, cluster=False)
    assert cfg.splitk == sk and not cfg.cluster
    specs = [gemv_spec(n, k, mb, tgt, bias=bias, residual=residual, config=conf, wb=wb)
             for conf in (cfg, dataclasses.replace(cfg, cluster=True))]
    if prologue is not None:
        specs = [fused_spec(s, prologue, tgt) for s in specs]
    assert [s.value("CLUSTER") for s in specs] == [False, True]
    assert all(s.value("SPLITK") == sk and s.value("KW") == kw for s in specs)
    return specs


def _weights(gpu, r: np.random.Generator, wb: int, n: int, k: int):
    """(the weight parameters' device buffers, reference ``(x, bias, res) -> y`` in f64)."""
    if wb == 2:
        w = (0.05 * r.standard_normal((n, k), np.float32)).astype(BF16)

        def ref(x, bias, res):
            y = x.astype(np.float64) @ w.astype(np.float64).T
            return y if bias is None else y + bias.astype(np.float64) + res.astype(np.float64)

        return {"weight": gpu.upload(w), "weight_scale": None}, ref
    make, op = QUANT[wb]  # the FP8 / NVFP4 GEMV tests' own buffers and op
    wq, bufs = make(gpu, r, n, k)

    def ref(x, bias, res):
        y = op(k).ref(x, wq["weight"], wq["weight_scale"], wq["weight_scale_2"], None, bias, res)
        return y.astype(np.float64)

    return bufs, ref


@pytest.mark.parametrize("epilogue", ["plain", "bias+residual"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_cluster_reduction_is_the_workspace_reduction(gpu, case, epilogue):
    wb, n, k, mb, c, ms = case
    has = epilogue != "plain"
    ws, cl = _pair(gpu, wb, n, k, mb, c, has, has)
    r = rng()
    bufs, ref = _weights(gpu, r, wb, n, k)
    bias = r.standard_normal(n).astype(BF16) if has else None
    bd = gpu.upload(bias) if has else None
    for m in ms:
        x = activations(r, m, k)
        res = r.standard_normal((m, n)).astype(BF16) if has else None
        xd, rd = gpu.upload(x), gpu.upload(res) if has else None
        outs = {}
        for spec in (ws, cl, ws, cl):  # twice each: the workspace's counters reset, nothing left over in a cluster
            out = gpu.alloc((m, n), BF16)  # poisoned: NaN
            gpu.launch(spec, x=xd, **bufs, bias=bd, residual=rd, out=out, M=m)
            got = gpu.download(out)
            assert np.isfinite(got.astype(np.float32)).all(), f"{spec.doc} M={m}: unwritten or non-finite outputs"
            if spec.entry in outs:
                assert np.array_equal(got.view(np.uint16), outs[spec.entry].view(np.uint16)), \
                    f"{spec.doc} M={m}: the second launch differs from the first"
            outs[spec.entry] = got
        want = ref(x, bias, res)
        err = float(np.abs(outs[ws.entry].astype(np.float64) - want).max() / np.abs(want).max())
        assert err < TOL, f"{ws.doc} M={m}: relative error {err:.2e} against the reference"
        diff = int((outs[cl.entry].view(np.uint16) != outs[ws.entry].view(np.uint16)).sum())
        assert diff == 0, f"{cl.doc} M={m}: {diff} outputs differ from the workspace reduction's"


#: ``check_rms_norm`` / ``check_swiglu``'s ``weight`` per weight format: buffers and reference ``(x, res) -> y``
LINEAR = {2: bf16_weight, 1: _fp8_linear, 0: _nvfp4_linear}


#: (weights, N, K, bucket, configuration) for the prologues (their checks run the bucket's edge token counts)
PROLOGUE_CASES = [(2, 3072, 2048, 8, (4, 1, 8, 8, 1)), (2, 3072, 2048, 16, (4, 1, 8, 4, 1)),
                  (2, 1000, 4128, 8, (8, 1, 4, 3, 8)), (1, 3072, 2048, 8, (4, 1, 8, 4, 1)),
                  (0, 3072, 2048, 16, (4, 1, 4, 2, 1)), (0, 3072, 2048, 8, (8, 1, 4, 4, 1))]
SWIGLU_CASES = [(2, 2048, 8192, 8, (4, 1, 8, 8, 1)), (2, 1000, 4128, 16, (4, 1, 8, 3, 1)),
                (1, 2048, 8192, 16, (4, 1, 8, 4, 1)), (0, 2048, 8192, 8, (4, 1, 8, 8, 1))]


def _prologue_ids(case) -> str:
    wb, n, k, mb, c = case
    return f"{WB_NAMES[wb]}-{n}x{k}-m{mb}-w{c[0]}sk{c[3]}kw{c[4]}"


def _bitwise(gpu, ws, cl, r, wb: int, x_host: np.ndarray, extra: dict, residual: bool) -> None:
    n, m = ws.value("N"), x_host.shape[0]
    bufs, _ = _weights(gpu, r, wb, n, ws.value("K"))
    res = gpu.upload(r.standard_normal((m, n)).astype(BF16)) if residual else None
    x = gpu.upload(x_host)
    got = []
    for spec in (ws, cl):
        out = gpu.alloc((m, n), BF16)
        gpu.launch(spec, x=x, **bufs, bias=None, residual=res, out=out, M=m, **extra)
        got.append(gpu.download(out).view(np.uint16))
    assert np.array_equal(got[0], got[1]), f"{cl.doc} M={m}: differs from the workspace reduction's"


@pytest.mark.parametrize("case", PROLOGUE_CASES, ids=_prologue_ids)
def test_cluster_rms_norm_prologue(gpu, case):
    """The sums of x^2 go through the peers' shared memory too: against numpy and the norm kernel + plain cluster
    variant, and bit for bit against the workspace's (each slice's sum over its warps, then over the slices)."""
    wb, n, k, mb, c = case
    pro = Prologue("rms_norm", eps=EPS)
    _, plain_cl = _pair(gpu, wb, n, k, mb, c, False, False)
    ws, cl = _pair(gpu, wb, n, k, mb, c, False, False, pro)
    check_rms_norm(gpu, plain_cl, cl, False, f"cluster {WB_NAMES[wb]}", weight=LINEAR[wb])
    r = rng()
    g = gpu.upload((1 + 0.2 * r.standard_normal(k)).astype(BF16))
    for m in (1, mb):
        _bitwise(gpu, ws, cl, r, wb, (20 * r.standard_normal((m, k))).astype(BF16), {"norm_weight": g}, False)


@pytest.mark.parametrize("case", SWIGLU_CASES, ids=_prologue_ids)
def test_cluster_swiglu_prologue(gpu, case):
    wb, n, k, mb, c = case
    pro = Prologue("swiglu", alpha=1.0)
    _, plain_cl = _pair(gpu, wb, n, k, mb, c, False, True)
    ws, cl = _pair(gpu, wb, n, k, mb, c, False, True, pro)
    check_swiglu(gpu, plain_cl, cl, f"cluster {WB_NAMES[wb]}", weight=LINEAR[wb])
    r = rng()
    for m in (1, mb):
        _bitwise(gpu, ws, cl, r, wb, (3 * r.standard_normal((m, 2 * k))).astype(BF16), {}, True)


@pytest.mark.parametrize("prologue", ["none", "rms_norm"])
@pytest.mark.parametrize("wb", [2, 1, 0], ids=lambda wb: WB_NAMES[wb])
def test_cluster_rope_epilogue(gpu, wb, prologue):
    """The 1B model's qkv at batch 1 split 4 ways in a cluster, with the rope epilogue: q and the cache bit for bit
    as the plain cluster variant followed by qkv_cache.cu."""
    _check_cluster_rope(gpu, wb, prologue, dict(warps=4, stage_steps=4, splitk=4, kwarps=1))


@pytest.mark.parametrize("prologue", ["none", "rms_norm"])
def test_nvfp4_split_bucket_8_rope_epilogue(gpu, prologue):
    """NVFP4 qkv's bucket 8 for 5-8 tokens as the rule splits it (``nvfp4_split8_config``: 8 warps, 4 slices of one
    512-column stage), with the rope epilogue (and the rms_norm prologue), as the lowering makes it."""
    tgt = gpu_target(gpu)
    cfg = nvfp4_split8_config(3072, 2048, tgt.num_sms or 132)
    assert cfg is not None and cfg.cluster
    _check_cluster_rope(gpu, WB_NVFP4, prologue, dict(warps=cfg.warps, tiles=cfg.tiles, stage_steps=cfg.stage_steps,
                                                      splitk=cfg.splitk, kwarps=1))


def _check_cluster_rope(gpu, wb: int, prologue: str, shape: dict) -> None:
    case = "llama1b"
    nq, nkv, d, k, inter, kt, ct, scaled, bias = ROPE_CASES[case]
    n = (nq + 2 * nkv) * d
    tgt = gpu_target(gpu)
    cfg = gemv_config(n, k, 8, tgt.num_sms or 132, **shape, wb=wb, cluster=True)
    assert cfg.cluster and cfg.splitk == shape["splitk"]
    pro = Prologue("rms_norm", eps=EPS) if prologue == "rms_norm" else None
    plain = gemv_spec(n, k, 8, tgt, bias=bias, config=cfg, prologue=pro, wb=wb)
    fused = with_rope(plain, RopeEpilogue(nq, nkv, d, inter, BLOCK, CTYPE[kt], CTYPE[ct], scaled), tgt)
    assert fused.value("CLUSTER") and fused.value("SPLITK") == cfg.splitk
    rope = rope_qkv_cache_spec(DType.bf16, ct, kt, nq, nkv, d, d, inter, BLOCK, scaled, tgt)
    r = rng()
    bufs, ref = _weights(gpu, r, wb, n, k)
    extra = {"norm_weight": gpu.upload((1 + 0.2 * r.standard_normal(k)).astype(BF16))} if pro else {}
    pairs = check_rope_epilogue(gpu, r, case, plain, fused, rope, {**bufs, "bias": None}, extra)
    if pro is None:  # the plain cluster variant compared against is right
        for x_host, qkv in pairs:
            want = ref(x_host, None, None)
            err = float(np.abs(qkv.astype(np.float64) - want).max() / np.abs(want).max())
            assert err < TOL, f"{plain.doc} M={x_host.shape[0]}: {err:.2e} against the reference"
