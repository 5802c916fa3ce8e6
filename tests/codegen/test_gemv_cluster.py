"""Split-K over a thread-block cluster in the decode GEMV (``kernel.cu``'s ``CLUSTER``, ``rule.GemvConfig.cluster``;
the default, ``INGOT_GEMV_CLUSTER=0`` turns it off) on the CPU: the rule's choices for the Llama-3.2-1B shapes, the
switch, the limits a cluster configuration must meet, specs that keep it through the fusions, and the compiled
kernels for sm_90a and sm_100a (the cluster shape in the PTX, cluster barriers and no split-K counter in the SASS, the
first weight stage still before the grid-dependency wait, no spills). GPU runs: test_gemv_cluster_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest

from ingot.codegen.kernels.gemv.rule import (
    BUCKETS,
    CLUSTER_ENV,
    CLUSTER_MAX,
    CLUSTER_SHAPE,
    CLUSTER_SHAPE_ENV,
    CLUSTER_SHAPE_NVFP4,
    CLUSTER_SMEM,
    KW_ENV,
    NVFP4_SPLIT8_ENV,
    NVFP4_SPLIT8_ROWS,
    NVFP4_SPLIT8_SHAPE,
    SHAPE_BY_BUCKET,
    WB_NAMES,
    WB_NVFP4,
    WB_STEP_COLS,
    GemvConfig,
    Prologue,
    RopeEpilogue,
    cluster_fits,
    fused_spec,
    gemv_config,
    gemv_spec,
    is_plain,
    nvfp4_split8_config,
    smem_bytes,
    spec_config,
    variants,
    with_rope,
)
from ingot.codegen.target import Target, get_target
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    compiled,
    disassembled,
    module_kernel_cache,
    needs_compiler,
)
from tests.codegen.test_decode_fusion import CP_ASYNC, W_FIRST, WAIT, check_pdl_order, sass_sequence
from tests.codegen.test_prefill_wgmma import _registers

H200 = get_target("h200")
#: the Llama-3.2-1B linears: qkv, o, gate_up, down, lm_head
QKV, O, GATE_UP, DOWN, LM_HEAD = (3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048)
#: the rule's choice per shape (bf16, FP8 and NVFP4 weights alike but below): the buckets whose variant reduces in a
#: cluster. qkv and o split K in every bucket, each slice's x small (at most 36 KB a CTA); down's 1056-column slices
#: take 67 KB a CTA at 32 tokens, 135 KB at 64: 8 of them exceed CLUSTER_SMEM; gate_up and the lm_head split K (2
#: ways) only at 64 tokens. NVFP4 weights keep the row groups of bucket 8 for qkv and o (ROW_GROUPS_NVFP4)
CLUSTERED = {QKV: (8, 16, 32, 64), O: (8, 16, 32, 64), DOWN: (8, 16), GATE_UP: (64,), LM_HEAD: (64,)}
ROW_GROUPS_NVFP4 = {(QKV, 8), (O, 8)}
#: NVFP4 weights' down at bucket 8 splits K through the workspace (rule.NVFP4_SHAPE: 7.13 us in a cluster, 6.30 without)
WORKSPACE_NVFP4 = {(DOWN, 8)}


@pytest.fixture(autouse=True)
def _switches(monkeypatch):
    for name in (CLUSTER_ENV, KW_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("wb", [2, 1, 0], ids=lambda wb: WB_NAMES[wb])
def test_the_rule_for_the_1b_model(wb):
    for shape, buckets in CLUSTERED.items():
        for mb in BUCKETS:
            cfg = gemv_config(*shape, mb, H200.num_sms, wb=wb)
            if wb == WB_NVFP4 and (shape, mb) in ROW_GROUPS_NVFP4:
                assert cfg.kwarps > 1 and cfg.splitk == 1 and not cfg.cluster, (shape, mb, cfg)
                continue
            assert cfg.cluster == (mb in buckets and (wb != WB_NVFP4 or (shape, mb) not in WORKSPACE_NVFP4)), \
                (shape, mb, cfg)
            assert cfg.kwarps == 1, (shape, mb, cfg)  # the cluster's reduction replaces the row groups
            if cfg.cluster:
                assert 1 < cfg.splitk <= CLUSTER_MAX and cluster_fits(mb, cfg, wb)
                assert cfg.splitk * smem_bytes(mb, cfg.slice_k, wb=wb) <= CLUSTER_SMEM
            elif cfg.splitk > 1 and (shape, mb) not in WORKSPACE_NVFP4:  # the cluster's CTAs: too much shared memory
                assert cfg.splitk * smem_bytes(mb, cfg.slice_k, wb=wb) > CLUSTER_SMEM


def test_cluster_shape_at_32_tokens():
    """bf16 qkv and o at 32 tokens: 64-row CTAs, 8 slices of 256 columns, in clusters (``CLUSTER_SHAPE``); down keeps
    the bucket's 128-row CTAs without a cluster (8 of its 67 KB slices exceed CLUSTER_SMEM), gate_up and the lm_head
    their unsplit shapes; FP8 weights keep the bucket's shape (the cluster shape was measured with bf16 only)."""
    warps, tiles, steps, per_sm = CLUSTER_SHAPE[32]
    for shape in (QKV, O):
        cfg = gemv_config(*shape, 32, H200.num_sms)
        assert (cfg.warps, cfg.tiles, cfg.stage_steps, cfg.splitk, cfg.slice_k, cfg.cluster) == \
            (warps, tiles, steps, 8, 256, True), (shape, cfg)
        assert -(-shape[0] // cfg.rows) * cfg.splitk >= per_sm * H200.num_sms
        fp8 = gemv_config(*shape, 32, H200.num_sms, wb=1)
        assert (fp8.warps, fp8.stage_steps) == SHAPE_BY_BUCKET[32][::2] and fp8.cluster, fp8
    for shape in (DOWN, GATE_UP, LM_HEAD):
        cfg = gemv_config(*shape, 32, H200.num_sms)
        assert not cfg.cluster and (cfg.warps, cfg.stage_steps) != (warps, steps), (shape, cfg)


@pytest.mark.parametrize("mb, qkv_split, o_split", [(16, 8, 8), (32, 4, 8), (64, 8, 8)])
def test_nvfp4_cluster_shape(mb, qkv_split, o_split):
    """NVFP4 qkv and o at 16-64 tokens (``CLUSTER_SHAPE_NVFP4``): 128-row CTAs of 2-step (256-column) stages, split-K
    doubled while the grid has fewer than ``per_sm`` CTAs an SM, down to one stage a slice (at 32 tokens qkv 24 row
    blocks x 4 slices of 512, o 16 x 8 of 256), in clusters; the bucket's own shape split them 2 x 1024 at 32. gate_up
    and the lm_head, which need no split for the CTAs, keep the bucket's configuration (at 64 tokens they split for x's
    shared memory alone); down keeps it where its cluster would be too large (32 and 64 tokens)."""
    warps, tiles, steps, per_sm = CLUSTER_SHAPE_NVFP4[mb]
    stage = WB_STEP_COLS[WB_NVFP4] * steps
    for shape, splitk in ((QKV, qkv_split), (O, o_split)):
        cfg = gemv_config(*shape, mb, H200.num_sms, wb=WB_NVFP4)
        assert (cfg.warps, cfg.tiles, cfg.stage_steps, cfg.splitk, cfg.cluster) == \
            (warps, tiles, steps, splitk, True), (shape, cfg)
        blocks = -(-shape[0] // cfg.rows)
        # the fewest slices that reach per_sm CTAs an SM (half as many would not), or the most a cluster takes
        assert blocks * splitk >= per_sm * H200.num_sms > blocks * splitk // 2 or splitk == CLUSTER_MAX
        assert cfg.slice_k == shape[1] // splitk and cfg.slice_k % stage == 0
        assert cluster_fits(mb, cfg, WB_NVFP4)
    for shape in (GATE_UP, LM_HEAD) + ((DOWN,) if mb > 16 else ()):
        cfg = gemv_config(*shape, mb, H200.num_sms, wb=WB_NVFP4)
        assert (cfg.warps, cfg.stage_steps) != (warps, steps) or cfg.tiles != tiles, (shape, cfg)
    # bucket 8 keeps its shape (row groups)
    assert gemv_config(*QKV, 8, H200.num_sms, wb=WB_NVFP4).kwarps > 1


#: NVFP4 qkv and o at 5-8 tokens (``NVFP4_SPLIT8_SHAPE``): 128-row CTAs of 4-step (512-column) stages, K in 4 slices
#: of one stage each (qkv 24 row blocks x 4 = 96 CTAs, o 16 x 4 = 64: short of 0.7 an SM, but a slice is down to one
#: stage), in clusters of 4
SPLIT8 = {QKV: 4, O: 4}


def test_nvfp4_bucket_8_splits_for_qkv_and_o(monkeypatch):
    """NVFP4 weights with row groups at bucket 8 (qkv and o) split it: the row groups up to ``NVFP4_SPLIT8_ROWS``
    tokens, ``NVFP4_SPLIT8_SHAPE`` in a cluster for the rest; gate_up, down and the lm_head (``NVFP4_SHAPE``, no row
    groups) keep bucket 8 whole. ``INGOT_GEMV_NVFP4_SPLIT8=0`` or the cluster off: no split; another value is an
    error naming the variable."""
    warps, tiles, steps, _ = NVFP4_SPLIT8_SHAPE
    stage = WB_STEP_COLS[WB_NVFP4] * steps
    assert NVFP4_SPLIT8_ROWS == 4 and NVFP4_SPLIT8_ENV == "INGOT_GEMV_NVFP4_SPLIT8"
    for shape, splitk in SPLIT8.items():
        assert gemv_config(*shape, 8, H200.num_sms, wb=WB_NVFP4).kwarps > 1  # what bucket 8 runs whole
        cfg = nvfp4_split8_config(*shape, H200.num_sms)
        assert cfg is not None and cfg.cluster and cfg.kwarps == 1, (shape, cfg)
        assert (cfg.warps, cfg.tiles, cfg.stage_steps, cfg.splitk, cfg.slice_k) == \
            (warps, tiles, steps, splitk, stage), (shape, cfg)
        assert cfg.splitk * cfg.slice_k == shape[1] and cluster_fits(8, cfg, WB_NVFP4)
        spec = gemv_spec(*shape, 8, H200, config=cfg, wb=WB_NVFP4)
        assert spec.value("CLUSTER") is True and spec.value("KW") == 1 and spec_config(spec) == cfg
    for shape in (GATE_UP, DOWN, LM_HEAD):
        assert nvfp4_split8_config(*shape, H200.num_sms) is None, shape
    for env, value in ((NVFP4_SPLIT8_ENV, "0"), (CLUSTER_ENV, "0")):
        monkeypatch.setenv(env, value)
        assert nvfp4_split8_config(*QKV, H200.num_sms) is None, env
        monkeypatch.delenv(env)
    monkeypatch.setenv(NVFP4_SPLIT8_ENV, "on")
    with pytest.raises(ValueError, match=NVFP4_SPLIT8_ENV):
        nvfp4_split8_config(*QKV, H200.num_sms)


@pytest.mark.parametrize("target", ["h200", "b200"])
def test_nvfp4_weight_only_variants_split_bucket_8(target, monkeypatch):
    """The quantized linear's kernel.cu variants (NVFP4 weight-only qkv): bucket 4 the row groups (bucket 8's own
    spec), bucket 8 the split configuration, the larger buckets as before; ``INGOT_GEMV_NVFP4_SPLIT8=0`` gives the
    whole bucket 8 back and leaves the others alone; FP8 weights never split."""
    from ingot.codegen.kernels.gemv import quant_rule
    from tests.codegen.test_gemv_quant import qtypes

    tgt = get_target(target)
    for name in (quant_rule.NVFP4_ENV, "INGOT_GEMV_SKINNY_NVFP4", NVFP4_SPLIT8_ENV):
        monkeypatch.delenv(name, raising=False)
    op, ins = qtypes("nvfp4", *QKV, bias=True, residual=True)
    found = variants(op, ins, tgt)
    assert [mb for mb, _ in found] == [NVFP4_SPLIT8_ROWS, *BUCKETS]
    (four, rows), (eight, split), *rest = found
    whole = gemv_spec(*QKV, 8, tgt, bias=True, residual=True, wb=WB_NVFP4)
    assert rows.key == whole.key and rows.value("KW") > 1 and is_plain(rows)
    cfg = nvfp4_split8_config(*QKV, tgt.num_sms)
    assert split.key == gemv_spec(*QKV, 8, tgt, bias=True, residual=True, config=cfg, wb=WB_NVFP4).key
    assert split.template == "kernel.cu" and split.value("WB") == WB_NVFP4 and split.value("CLUSTER") is True
    assert [p.name for p in split.params] == [p for p, _ in quant_rule.PARAMS] and is_plain(split)
    monkeypatch.setenv(NVFP4_SPLIT8_ENV, "0")
    off = variants(op, ins, tgt)
    assert [mb for mb, _ in off] == list(BUCKETS)
    assert off[0][1].key == whole.key and [s.key for _, s in off[1:]] == [s.key for _, s in rest]
    monkeypatch.delenv(NVFP4_SPLIT8_ENV)
    assert [mb for mb, _ in variants(*qtypes("fp8", *QKV), tgt)] == list(BUCKETS)


def _nvfp4_llama_plan(tmp_path, monkeypatch):
    """The Llama-3.2-1B-shaped layer (one layer, vocab 512) with its layers' linears NVFP4 weight-only (the lm_head
    bf16), planned by ``lower.plan_kernels`` (nothing compiled; the prefill GEMM off: the variants take the quantized
    launch's arguments): its launches and the variant lists with decode fusion and the qkv rope fusion in place, and
    the launches decode steps skip (``skips``, ``into``). Weights are never read."""
    from ingot.codegen.lower import plan_kernels
    from ingot.passes import PassContext, run_passes
    from ingot.passes.quantize import quantize_linear_node
    from ingot.quant.config import parse_spec
    from tests.codegen.test_fuse_split_lower import _graph

    g = _graph(tmp_path)
    run_passes(g, "serving-fuse", PassContext())  # the fused names (layers.0.qkv) the quantization below finds
    q, users = parse_spec("nvfp4:wo", "h200"), g.users()
    for node in list(g.nodes):
        if node.op.name == "linear" and node.outputs[0].name.startswith("layers."):
            quantize_linear_node(g, node, q, None, users)
    monkeypatch.setenv("INGOT_NO_SERVING_FUSE", "1")  # done above
    return plan_kernels(g, H200)


def test_nvfp4_split_bucket_8_takes_the_decode_fusions(tmp_path, monkeypatch):
    """Both bucket-8 variants of the NVFP4 qkv (the row groups up to 4 tokens, the cluster for 5-8) get the
    attention norm's rms_norm prologue and the rope epilogue, with the same arguments; the norm and rope launches are
    skipped up to 8 tokens. o has nothing to fuse: its two variants stay plain; down and gate_up keep bucket 8
    whole."""
    for name in ("INGOT_GEMV_NVFP4", "INGOT_GEMV_SKINNY_NVFP4", NVFP4_SPLIT8_ENV, "INGOT_QKV_ROPE_FUSION",
                 "INGOT_ROPE_CACHE_FUSION", "INGOT_DECODE_FUSION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("INGOT_QUANT_PREFILL_GEMM", "0")
    kp = _nvfp4_llama_plan(tmp_path, monkeypatch)
    launches, lists = kp.launches, kp.variant_lists
    by_out = {node.outputs[0].name: j for j, (_, node, _, _) in enumerate(launches)}
    qkv, o = by_out["layers.0.qkv"], by_out["layers.0.attn_out"]
    assert launches[qkv][1].op.name == launches[o][1].op.name == "quantized_linear"
    norm = by_out["layers.0.attn_norm"]
    assert kp.skips[norm][1] == 8 and kp.into[norm] == qkv
    (j_rope,) = [j for j in kp.into if launches[j][1].op.name == "rope_qkv"]
    assert kp.into[j_rope] == qkv
    (m4, rows, own4), (m8, split, own8), *rest = lists[qkv]
    assert (m4, m8) == (NVFP4_SPLIT8_ROWS, 8) and [mr for mr, _, _ in rest] == [16, 32, 64]
    assert rows.value("KW") > 1 and not rows.value("CLUSTER")
    assert split.value("CLUSTER") is True and split.value("SPLITK") == SPLIT8[QKV] and split.value("KW") == 1
    for s in (rows, split):
        assert s.value("PROLOGUE") == 1 and s.value("ROPE") and s.value("WB") == WB_NVFP4
    assert own4 == own8 and "norm_weight" in own4 and "positions" in own4
    assert all(not s.value("PROLOGUE") and not s.value("ROPE") for _, s, _ in rest)
    (o4, o_rows, a4), (o8, o_split, a8), *_ = lists[o]
    assert (o4, o8) == (4, 8) and a4 is a8 is None and is_plain(o_rows) and is_plain(o_split)
    assert o_split.value("CLUSTER") is True
    for name in ("layers.0.gate_up", "layers.0.mlp_out"):
        assert [mr for mr, _, _ in lists[by_out[name]]] == list(BUCKETS), name


def test_cluster_shape_switch(monkeypatch):
    """``INGOT_GEMV_CLUSTER_SHAPE=0``: the bucket's own shape (still in a cluster where it splits), for bf16 and NVFP4
    weights alike; an unknown value is an error that names the variable."""
    on = {wb: gemv_config(*QKV, 32, H200.num_sms, wb=wb) for wb in (2, WB_NVFP4)}
    monkeypatch.setenv(CLUSTER_SHAPE_ENV, "0")
    for wb in (2, WB_NVFP4):
        off = gemv_config(*QKV, 32, H200.num_sms, wb=wb)
        assert off != on[wb] and (off.warps, off.stage_steps) == SHAPE_BY_BUCKET[32][::2] and off.cluster, off
    monkeypatch.setenv(CLUSTER_SHAPE_ENV, "no")
    with pytest.raises(ValueError, match=CLUSTER_SHAPE_ENV):
        gemv_config(*QKV, 32, H200.num_sms)


def test_off_is_the_workspace_rule_with_row_groups(monkeypatch):
    monkeypatch.setenv(CLUSTER_ENV, "0")
    for shape in CLUSTERED:
        for mb in BUCKETS:
            assert not gemv_config(*shape, mb, H200.num_sms).cluster
    # the small matrices at batch 1 go back to row groups (16-row CTAs, no split over CTAs)
    for shape in (QKV, O):
        cfg = gemv_config(*shape, 8, H200.num_sms)
        assert cfg.kwarps > 1 and cfg.splitk == 1, cfg
    monkeypatch.setenv(CLUSTER_ENV, "yes")
    with pytest.raises(ValueError, match=CLUSTER_ENV):
        gemv_config(*QKV, 8, H200.num_sms)


def test_explicit_choice_wins_over_the_switch(monkeypatch):
    monkeypatch.setenv(CLUSTER_ENV, "0")
    assert gemv_config(*DOWN, 64, H200.num_sms, cluster=True).cluster  # past CLUSTER_SMEM, but asked for
    monkeypatch.delenv(CLUSTER_ENV)
    assert not gemv_config(*QKV, 8, H200.num_sms, cluster=False).cluster


def test_what_a_cluster_needs():
    base = gemv_config(*QKV, 32, H200.num_sms, cluster=False)
    assert base.splitk == 8 and cluster_fits(32, base)
    assert not cluster_fits(32, dataclasses.replace(base, splitk=1))  # nothing to reduce
    assert not cluster_fits(32, dataclasses.replace(base, splitk=16))  # past a portable cluster
    # the CTA's partial tile (rows x tokens, f32) is stored in x's region: 256 rows x 64 tokens do not fit 64 columns
    tight = GemvConfig(warps=8, tiles=2, splitk=2, stage_steps=2, slice_k=64)
    assert tight.rows * 64 * 4 > smem_bytes(64, 64) and not cluster_fits(64, tight)
    with pytest.raises(ValueError, match="cluster"):
        gemv_spec(*QKV, 32, H200, config=dataclasses.replace(base, splitk=1, slice_k=2048, cluster=True))
    with pytest.raises(ValueError, match="cluster"):
        gemv_spec(2048, 128, 64, H200, config=dataclasses.replace(tight, cluster=True))
    old = Target(name="sm80", arch="sm_80", sm=80, num_sms=108)
    with pytest.raises(ValueError, match="sm_90"):
        gemv_spec(*QKV, 32, old, config=dataclasses.replace(base, cluster=True))


@pytest.mark.parametrize("wb", [2, 1, 0], ids=lambda wb: WB_NAMES[wb])
def test_specs_keep_the_cluster(wb):
    spec = gemv_spec(*QKV, 16, H200, residual=False, wb=wb)
    assert spec.value("CLUSTER") is True and "in a cluster" in spec.doc
    assert spec_config(spec).cluster and gemv_spec(*QKV, 16, H200, config=spec_config(spec), wb=wb) == spec
    fused = fused_spec(spec, Prologue("rms_norm", eps=1e-5), H200)
    rope = with_rope(fused, RopeEpilogue(32, 8, 64, False, 16), H200)
    for s in (fused, rope):
        assert s.value("CLUSTER") is True and s.value("SPLITK") == spec.value("SPLITK")
    down = fused_spec(gemv_spec(*DOWN, 16, H200, residual=True, wb=wb), Prologue("swiglu", alpha=1.0), H200)
    assert down.value("CLUSTER") is True


#: (weights, N, K, bucket, prologue, rope): the compiled variants checked below
COMPILED = [(2, *QKV, 8, "rms_norm", True), (2, *DOWN, 8, "swiglu", False), (2, *O, 32, "none", False),
            (2, *QKV, 64, "rms_norm", False), (2, *LM_HEAD, 64, "rms_norm", False), (1, *QKV, 8, "rms_norm", True),
            (1, *DOWN, 16, "swiglu", False), (0, *QKV, 16, "rms_norm", True), (0, *O, 32, "none", False),
            (0, *DOWN, 8, "swiglu", False)]


def _variant(wb: int, n: int, k: int, mb: int, prologue: str, rope: bool, target: Target, cluster: bool):
    cfg = dataclasses.replace(gemv_config(n, k, mb, target.num_sms, wb=wb), cluster=cluster)
    spec = gemv_spec(n, k, mb, target, residual=prologue != "rms_norm", config=cfg, wb=wb)
    if prologue != "none":
        spec = fused_spec(spec, Prologue(prologue, eps=1e-5, alpha=1.0), target)
    return with_rope(spec, RopeEpilogue(32, 8, 64, False, 16), target) if rope else spec


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("case", COMPILED, ids=lambda c: f"{WB_NAMES[c[0]]}-{c[1]}x{c[2]}-m{c[3]}-{c[4]}"
                         + ("-rope" if c[5] else ""))
def test_compiles_as_a_cluster(target, case):
    """The PTX asks for the cluster (1 x SPLITK); the SASS has its barriers and distributed shared-memory loads, no
    split-K counter (an atomic) and no spills, and still loads the first weight stage before the grid-dependency
    wait; registers leave 4 CTAs of 128 threads an SM. The same configuration without the cluster keeps its counter."""
    tgt = get_target(target)
    arch = "sm_90a" if target == "h200" else "sm_100a"
    spec = _variant(*case, tgt, cluster=True)
    assert spec.value("CLUSTER") is True and spec.value("SPLITK") > 1
    built = compiled(spec)
    assert f".reqnctapercluster 1, {spec.value('SPLITK')}, 1" in built.ptx
    seq = sass_sequence(disassembled(built, arch))
    ops = set(seq)
    assert {"UCGABAR_ARV", "UCGABAR_WAIT"} <= ops and "LD.E" in ops, sorted(ops)
    assert not any(o.startswith(("ATOMG", "RED")) for o in ops), sorted(ops)
    assert_no_local_memory(ops, spec.doc)
    if case[4] != "none":  # the fused variants load weights first (what the lowering makes)
        check_pdl_order(seq, 1, (CP_ASYNC,))
        assert seq.index(W_FIRST) < seq.index(WAIT)
    assert _registers(built.cubin) <= 128
    ws = sass_sequence(disassembled(compiled(_variant(*case, tgt, cluster=False)), arch))
    assert any(o.startswith("ATOMG") for o in ws) and "UCGABAR_ARV" not in ws


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
def test_nvfp4_split_bucket_8_compiles_as_a_cluster(target):
    """The split bucket 8 of NVFP4 qkv as the lowering makes it (rms_norm prologue, rope epilogue): clusters of 4 in
    the PTX, cluster barriers and no split-K counter in the SASS, the first weight stage before the grid-dependency
    wait, no spills, at most 128 registers a thread (two of its 256-thread CTAs an SM)."""
    tgt = get_target(target)
    arch = "sm_90a" if target == "h200" else "sm_100a"
    cfg = nvfp4_split8_config(*QKV, tgt.num_sms)
    assert cfg is not None
    spec = gemv_spec(*QKV, 8, tgt, config=cfg, wb=WB_NVFP4)
    spec = with_rope(fused_spec(spec, Prologue("rms_norm", eps=1e-5), tgt), RopeEpilogue(32, 8, 64, False, 16), tgt)
    built = compiled(spec)
    assert f".reqnctapercluster 1, {SPLIT8[QKV]}, 1" in built.ptx
    seq = sass_sequence(disassembled(built, arch))
    ops = set(seq)
    assert {"UCGABAR_ARV", "UCGABAR_WAIT"} <= ops and not any(o.startswith(("ATOMG", "RED")) for o in ops)
    assert_no_local_memory(ops, spec.doc)
    check_pdl_order(seq, 1, (CP_ASYNC,))
    assert seq.index(W_FIRST) < seq.index(WAIT)
    assert _registers(built.cubin) <= 128
