"""The CUDA backend (``runtime/cuda_backend.py``) against the CPU backend.

Without a GPU: ``device="cuda"`` fails with a clear message. On a GPU (``-m gpu``): the tiny Llama
fixture and a SmolLM2-shaped model (random weights from a seed; SmolLM2's own shapes, fewer layers:
``INGOT_SMOLLM2_LAYERS``, default 4, because the real checkpoint is not on the GPU machine) compiled
for the device's target; prefill and decode logits within bf16 tolerance of the CPU backend, greedy
tokens equal for 16 tokens of 4 prompts (a divergence is accepted only where the reference's top-2
logits are closer than 1e-2, and reported), CUDA-graph decode equal to plain launches, a graph-mode
model (every op with a kernel) matching the CPU. ``INGOT_CUDA_REPORT=path`` writes the errors as JSON.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import ingot
from ingot.runtime.artifact import load_graph
from ingot.runtime.paged import PagedModel, iter_greedy
from tests.frontend.dense_llama import random_weights, write_checkpoint
from tests.runtime.serving_models import drive_steps

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SMOLLM2_CONFIG = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False,
}
REPORT: dict[str, object] = {}


def _has_gpu() -> bool:
    try:
        from ingot.runtime import cuda_driver

        cuda_driver.init()
        return True
    except Exception:
        return False


def test_cuda_device_without_gpu_is_a_clear_error(tmp_path):
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    from ingot.runtime.cuda_driver import CudaUnavailable

    path = ingot.compile(FIXTURES / "tiny_llama_kv.onnx", target="h200", out=tmp_path / "t.ingot", mode="llm")
    with pytest.raises(CudaUnavailable, match="device='cpu'"):
        ingot.load(path, device="cuda")
    assert ingot.load(path, device="cpu") is not None  # the CPU backend still runs the GPU artifact


def test_launch_choice_skips_and_packs_variant_arguments(monkeypatch):
    """``cuda_launch.Launch`` without a GPU (the driver's launch recorded): a launch marked ``skip`` launches nothing up
    to its ``max_rows``; a variant with its own ``args`` (a fused decode GEMV) launches with its own argument block,
    whose pointers are its buffers and whose row count is set per step; other variants share the launch's block."""
    from ingot.codegen.kernels.gemv.rule import Prologue, fused_spec, gemv_spec
    from ingot.codegen.kernels.norm.rule import norm_spec
    from ingot.codegen.target import get_target
    from ingot.ir.types import DType
    from ingot.runtime import cuda_driver
    from ingot.runtime import cuda_launch as cl

    calls = []
    monkeypatch.setattr(cuda_driver, "launch", lambda fn, grid, block, smem, stream, params, what, pdl=False:
                        calls.append((fn, grid, params)))
    h200 = get_target("h200")
    address = {"h": 0x1000, "n": 0x2000, "nw": 0x3000, "w": 0x4000, "y": 0x5000}.__getitem__
    norm = norm_spec("rms", DType.bf16, DType.bf16, 2048, 1e-5, h200)
    norm_args = {"x": {"buffer": "h"}, "weight": {"buffer": "nw"}, "bias": {"null": True},
                 "residual": {"null": True}, "residual_out": {"null": True}, "out": {"buffer": "n"},
                 "rows": {"dim": "T"}}
    skipped = cl.Launch("norm", norm, norm_args, address, "rms_norm", rows_arg="rows", skip_rows=8)
    plain8, plain16 = gemv_spec(512, 2048, 8, h200), gemv_spec(512, 2048, 16, h200)
    fused = fused_spec(plain8, Prologue("rms_norm", 1e-5), h200)
    args = {"x": {"buffer": "n"}, "weight": {"buffer": "w"}, "weight_scale": {"null": True}, "bias": {"null": True},
            "residual": {"null": True}, "out": {"buffer": "y"}, "M": {"dim": "T"}}
    own = cl.Arguments(fused, {**args, "x": {"buffer": "h"}, "norm_weight": {"buffer": "nw"}}, address)
    linear = cl.Launch("gemm", plain16, args, address, "linear",
                        [(8, "fused", fused, own), (16, "gemv16", plain16, None)])
    for t, norm_fn, linear_fn in ((3, None, "fused"), (8, None, "fused"), (9, "norm", "gemv16"), (40, "norm", "gemm")):
        calls.clear()
        assert skipped.enqueue({"T": t}, None) == (None if norm_fn is None else norm.entry)  # type: ignore[arg-type]
        entry = linear.enqueue({"T": t}, None)  # type: ignore[arg-type]
        assert [c[0] for c in calls] == [f for f in (norm_fn, linear_fn) if f is not None], t
        params = calls[-1][2]
        if linear_fn == "fused":
            assert entry == fused.entry and params == own.addr and params != linear.params_addr
            names = [p.name for p in fused.params]
            assert own.values[names.index("x")].value == 0x1000 and own.values[names.index("norm_weight")].value \
                == 0x3000 and own.values[names.index("M")].value == t
        else:
            assert params == linear.params_addr and linear.values[0].value == 0x2000
    assert skipped.skips == 2 and linear.variant_launches == 3


# -- on the GPU -----------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    path = os.environ.get("INGOT_CUDA_REPORT")
    if path and REPORT:
        Path(path).write_text(json.dumps(REPORT, indent=1, default=float))


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def _mixed_steps(vocab: int, seed: int = 0) -> list[list[tuple[int, list[int]]]]:
    """Steps over 3 sequences: a batched prefill (two prompts, one chunked), then mixed, then decode."""
    r = np.random.default_rng(seed)
    p = [[int(t) for t in r.integers(3, vocab, n)] for n in (13, 21, 5)]
    return [
        [(0, p[0]), (1, p[1][:10])],
        [(1, p[1][10:]), (0, [7]), (2, p[2])],
        [(0, [11]), (1, [12]), (2, [13])],
        [(0, [14]), (1, [15]), (2, [16])],
        [(2, [17])],
    ]


@pytest.mark.gpu
def test_tiny_llama_matches_cpu(gpu_target, tmp_path):
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    src = FIXTURES / "tiny_llama_kv.onnx"
    gpu = ingot.compile(src, target=gpu_target, out=tmp_path / "g.ingot", mode="llm")
    cpu = ingot.compile(src, target="cpu", out=tmp_path / "c.ingot", mode="llm")
    steps = _mixed_steps(256)
    ref32 = drive_steps(PagedModel(load_graph(cpu)[0], 16), steps)
    ref16 = drive_steps(PagedModel(load_graph(gpu)[0], 16), steps)
    errs = {}
    prev: list[np.ndarray] = []
    for graphs in (False, True):
        ex = CudaExecutor.from_artifact(gpu, num_blocks=16, cuda_graphs=graphs)
        got = drive_steps(CudaPagedModel(ex), steps)
        e32 = [_rel(g, r) for g, r in zip(got, ref32)]
        e16 = [_rel(g, r) for g, r in zip(got, ref16)]
        errs[f"graphs={graphs}"] = {"vs_f32": e32, "vs_cpu_bf16": e16, "stats": dict(ex.stats)}
        assert all(np.isfinite(g).all() for g in got)
        assert max(e16) < 2e-2, e16
        assert max(e32) < 5e-2, e32
        if graphs:
            assert ex.stats["graph_steps"] == 3 and ex.stats["captures"] == 2  # decode: 3 seqs (bucket 4), 1 seq
            assert all(np.array_equal(a, b) for a, b in zip(got, prev)), "graph replay differs from launches"
        prev = got
        ex.close()
    REPORT["tiny_llama"] = errs


def smollm2_like(tmp_path: Path, layers: int, seed: int = 0) -> Path:
    cfg = {**SMOLLM2_CONFIG, "num_hidden_layers": layers}
    return write_checkpoint(tmp_path / "smollm2-like", cfg, random_weights(cfg, np.random.default_rng(seed)))


@pytest.mark.gpu
def test_smollm2_shaped_logits_and_greedy(gpu_target, tmp_path):
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    layers = int(os.environ.get("INGOT_SMOLLM2_LAYERS", "4"))
    ckpt = smollm2_like(tmp_path, layers)
    gpu = ingot.compile(ckpt, target=gpu_target, out=tmp_path / "g.ingot")
    cpu = ingot.compile(ckpt, target="cpu", out=tmp_path / "c.ingot")
    g32, _ = load_graph(cpu)
    ex = CudaExecutor.from_artifact(gpu, num_blocks=64)
    r = np.random.default_rng(1)
    prompts = [[int(t) for t in r.integers(3, 49152, n)] for n in (7, 19, 33, 50)]
    report: dict[str, object] = {"layers": layers, "model": "random SmolLM2-shaped (seed 0)"}
    # first position: the prefill logits of each prompt
    first = []
    for p in prompts:
        ref_model, dev = PagedModel(g32, 8), CudaPagedModel(ex)
        ref = ref_model.step([(ref_model.add_sequence(), p)])
        s = dev.add_sequence()
        got = dev.step([(s, p)])
        dev.free_sequence(s)
        first.append(_rel(got, ref))
    report["first_logits_rel_err"] = first
    assert max(first) < 5e-2, first
    # greedy: 16 tokens of each prompt, one at a time (CUDA graphs, bucket 1) ...
    notes = []
    for i, p in enumerate(prompts):
        ref_tokens, ref_logits = [], []
        m = PagedModel(g32, 8)
        seq = m.add_sequence()
        logits = m.step([(seq, p)])
        for _ in range(16):
            t = int(np.argmax(logits[0]))
            ref_tokens.append(t)
            ref_logits.append(logits[0])
            logits = m.step([(seq, [t])])
        got = list(iter_greedy(g32, p, 16, stop_ids=(), model=CudaPagedModel(ex)))
        for j, (a, b) in enumerate(zip(got, ref_tokens)):
            if a != b:
                top2 = np.sort(ref_logits[j])[-2:]
                gap = float(top2[1] - top2[0])
                assert gap < 1e-2, f"prompt {i}: token {j} is {a} on the GPU, {b} on the CPU (top-2 gap {gap})"
                notes.append(f"prompt {i}: diverged at token {j} where the reference's top-2 gap is {gap:.2e}")
                print(notes[-1])
                break
        else:
            assert got == ref_tokens
    report["greedy_divergences"] = notes
    # ... and all 4 prompts batched (decode bucket 4)
    dev = CudaPagedModel(ex)
    ids = [dev.add_sequence() for _ in prompts]
    logits = dev.step(list(zip(ids, prompts)))
    batched = [[] for _ in prompts]
    for _ in range(8):
        toks = [int(t) for t in np.argmax(logits, axis=1)]
        for b, t in zip(batched, toks):
            b.append(t)
        logits = dev.step([(s, [t]) for s, t in zip(ids, toks)])
    singles = [list(iter_greedy(g32, p, 8, stop_ids=(), model=CudaPagedModel(ex))) for p in prompts]
    assert batched == singles
    report["stats"] = dict(ex.stats)
    REPORT["smollm2_shaped"] = report
    ex.close()


@pytest.mark.gpu
def test_long_prefill_matches_cpu(gpu_target, tmp_path):
    """Steps of more than 256 tokens run the prefill attention kernel (on sm_90a ``prefill_wgmma.cu`` loading K/V by
    TMA through the tensor map the executor fills over its whole KV region, every layer's cache at its offset in it):
    two prompts of 300 and 530 tokens in one step, then 280 more tokens of the first over its cached prefix, then a
    decode step of both; logits within bf16 tolerance of the CPU backend."""
    from ingot.codegen.kernel import KernelSpec
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel
    from ingot.runtime.kv_tma import needs_kv_tma

    ckpt = smollm2_like(tmp_path, 3)
    gpu = ingot.compile(ckpt, target=gpu_target, out=tmp_path / "g.ingot")
    cpu = ingot.compile(ckpt, target="cpu", out=tmp_path / "c.ingot")
    ex = CudaExecutor.from_artifact(gpu, num_blocks=128)
    tables = (ex.cuda["kernels"], ex.cuda.get("variant_kernels", {}))
    tma = [e for table in tables for e, k in table.items() if needs_kv_tma(KernelSpec.from_dict(k["spec"]))]
    assert bool(tma) == (gpu_target == "h200"), tma  # the wgmma kernel is sm_90a's (b200: prefill_flash.cu)
    r = np.random.default_rng(7)
    prompts = [[int(t) for t in r.integers(3, 49152, n)] for n in (300, 530)]
    ref_model, dev = PagedModel(load_graph(cpu)[0], 128), CudaPagedModel(ex)
    ids = [(ref_model.add_sequence(), dev.add_sequence()) for _ in prompts]
    more = [int(t) for t in r.integers(3, 49152, 280)]
    errs = []
    for step in ([(i, p) for i, p in zip(ids, prompts)], [(ids[0], more)], [(i, [5]) for i in ids]):
        ref = ref_model.step([(i[0], p) for i, p in step])
        got = dev.step([(i[1], p) for i, p in step])
        assert np.isfinite(got).all()
        errs.append(_rel(got, ref))
    REPORT["long_prefill"] = {"rel_err": errs, "tma_kernels": tma}
    assert max(errs) < 5e-2, errs
    ex.close()


def assert_same_steps(runs: dict, reference: tuple, what: str) -> None:
    """Every run's per-step logits finite and bit-identical to ``runs[reference]``'s."""
    for key, got in runs.items():
        assert all(np.isfinite(g).all() for g in got), key
        same = [np.array_equal(a, b) for a, b in zip(got, runs[reference])]
        assert all(same), f"{key}: steps {[i for i, ok in enumerate(same) if not ok]} differ from {what}"


@pytest.mark.gpu
def test_pdl_launches_give_the_same_logits(gpu_target, tmp_path, monkeypatch):
    """Programmatic dependent launch (kernels wait for the grid before them themselves, codegen/kernel.py) changes
    no bit of any step's logits, with and without CUDA graphs: prefill, mixed and 40 decode steps of 4 sequences
    (every launch boundary of the model, repeatedly), against the same artifact with INGOT_PDL=0."""
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    gpu = ingot.compile(smollm2_like(tmp_path, 2), target=gpu_target, out=tmp_path / "g.ingot")
    steps = _mixed_steps(49152, seed=3)
    r = np.random.default_rng(5)
    steps += [[(s, [int(t)]) for s, t in zip(range(3), r.integers(3, 49152, 3))] for _ in range(40)]
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("INGOT_PDL", flag)
        for graphs in (False, True):
            ex = CudaExecutor.from_artifact(gpu, num_blocks=32, cuda_graphs=graphs)
            assert bool(ex.pdl_kernels) == (flag == "1")
            runs[flag, graphs] = drive_steps(CudaPagedModel(ex), steps)
            ex.close()
    assert_same_steps(runs, ("0", False), "plain launches")


@pytest.mark.gpu
def test_decode_fusion_changes_no_logit(gpu_target, tmp_path, monkeypatch):
    """Decode fusion (codegen/decode_fusion.py: rms_norm and swiglu computed in the next linear's GEMV, their
    launches skipped for steps of <= 8 rows) gives the unfused logits up to rounding, the same bits with and without
    CUDA graphs: prefill, mixed and decode steps of 3 sequences (the final norm is skipped in the prefill steps too:
    S <= 8), 20 more decode steps of 3 (graph bucket 4) and 10 of one (bucket 1), against the same model compiled
    with decode fusion off (INGOT_DECODE_FUSION=0; on by default). Not bit-identical across: the fused GEMV applies
    the norm's 1/rms to its f32 sums and stages x * g (and silu(gate) * up with ex2/rcp.approx) in bf16, where the
    unfused kernels round the normalized x and the activation to bf16 first."""
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    ckpt = smollm2_like(tmp_path, 2)
    monkeypatch.setenv("INGOT_QKV_ROPE_FUSION", "0")  # its rope launch skips too: decode fusion alone here
    monkeypatch.setenv("INGOT_DECODE_FUSION", "1")
    on = ingot.compile(ckpt, target=gpu_target, out=tmp_path / "on.ingot")
    monkeypatch.setenv("INGOT_DECODE_FUSION", "0")
    off = ingot.compile(ckpt, target=gpu_target, out=tmp_path / "off.ingot")
    skips = sum("skip" in ln for ln in load_graph(on)[1]["cuda"]["launches"])
    # per layer: both norms and the swiglu; then the final norm (before the lm_head)
    assert skips == 2 * 3 + 1 and not any("skip" in ln for ln in load_graph(off)[1]["cuda"]["launches"])
    steps = _mixed_steps(49152, seed=7)
    r = np.random.default_rng(9)
    steps += [[(s, [int(t)]) for s, t in zip(range(3), r.integers(3, 49152, 3))] for _ in range(20)]
    steps += [[(1, [int(t)])] for t in r.integers(3, 49152, 10)]
    runs = {}
    for name, path in (("on", on), ("off", off)):
        for graphs in (False, True):
            ex = CudaExecutor.from_artifact(path, num_blocks=32, cuda_graphs=graphs)
            runs[name, graphs] = drive_steps(CudaPagedModel(ex), steps)
            skipped = sum(getattr(ln, "skips", 0) for ln in ex.launches)
            assert (skipped > 0) == (name == "on"), (name, graphs, skipped)
            if graphs:
                assert ex.stats["graph_steps"] == 3 + 20 + 10
            ex.close()
    for name in ("on", "off"):
        assert_same_steps({k: v for k, v in runs.items() if k[0] == name}, (name, False), f"{name} without graphs")
    agree = rows = 0
    for i, (got, ref) in enumerate(zip(runs["on", False], runs["off", False])):
        err = float(np.abs(got.astype(np.float32) - ref).max() / np.abs(ref).max())
        assert err <= 2e-2, (i, err)
        agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
        rows += ref.shape[0]
    assert agree >= 0.9 * rows, (agree, rows)  # the greedy tokens: rounding flips only near-ties


@pytest.mark.gpu
def test_skinny_gemm_variants_match_cpu(gpu_target, tmp_path, monkeypatch):
    """The skinny wgmma GEMM's decode variants (codegen/kernels/gemv/skinny_rule.py) in a served model: compiled with
    ``INGOT_GEMV_SKINNY=force`` (every linear, every bucket, 64 with x streamed: the lm_head, qkv, o, gate_up and
    down of a 2-layer SmolLM2-shaped model, o and down adding the residual; in bucket 8 with decode fusion's rms_norm
    prologue), decode steps of 40, 24, 12 and 3 sequences (buckets 64, 32, 16, 8) match the CPU backend within bf16
    tolerance, the same bits with and without CUDA graphs. Each module's weight tensor map views the whole weights
    region (several layers' weights through one map)."""

    if gpu_target != "h200":
        pytest.skip(f"the skinny GEMM is sm_90a only (target {gpu_target})")
    ckpt = smollm2_like(tmp_path, 2)
    monkeypatch.setenv("INGOT_GEMV_SKINNY", "force")
    gpu = ingot.compile(ckpt, target=gpu_target, out=tmp_path / "g.ingot")
    cuda = load_graph(gpu)[1]["cuda"]
    skinny = {e for e, k in cuda["variant_kernels"].items() if k["spec"]["template"] == "skinny.cu"}
    users = [ln["op"] for ln in cuda["launches"] if any(v["kernel"] in skinny for v in ln.get("variants", ()))]
    assert len(users) == 2 * 4 + 1, users  # per layer qkv, o, gate_up and down (o and down with the residual); lm_head
    monkeypatch.delenv("INGOT_GEMV_SKINNY")
    REPORT["skinny"] = _steps_match_cpu(ckpt, gpu, tmp_path, 5, SMOLLM2_CONFIG["vocab_size"], lambda s: 4 + s % 5,
                                        (40, 24, 24, 12, 12, 3, 3))


def _steps_match_cpu(ckpt: Path, gpu: Path, tmp_path: Path, seed: int, vocab: int, prompt_len, decode: tuple[int, ...],
                     num_blocks: int = 64, tol: float = 5e-2, **compile_kwargs: object) -> list[float]:
    """One prefill step of ``decode[0]`` sequences (``prompt_len(s)`` random tokens each), then decode steps of
    ``decode`` sequences, on ``gpu`` without and with CUDA graphs (the same bits) and on the CPU backend's compile of
    ``ckpt`` (with ``compile_kwargs``, e.g. its quantization; within ``tol`` relative): the relative errors per
    step."""
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    cpu = ingot.compile(ckpt, target="cpu", out=tmp_path / "c.ingot", **compile_kwargs)
    r = np.random.default_rng(seed)
    steps = [[(s, [int(t) for t in r.integers(3, vocab, prompt_len(s))]) for s in range(decode[0])]]
    for n in decode:
        steps.append([(s, [int(r.integers(3, vocab))]) for s in range(n)])
    ref = drive_steps(PagedModel(load_graph(cpu)[0], num_blocks), steps)
    runs = {}
    for graphs in (False, True):
        ex = CudaExecutor.from_artifact(gpu, num_blocks=num_blocks, cuda_graphs=graphs)
        runs[graphs] = drive_steps(CudaPagedModel(ex), steps)
        ex.close()
    assert_same_steps(runs, False, "plain launches")
    errs = [_rel(g, r) for g, r in zip(runs[False], ref)]
    assert max(errs) < tol, errs
    return errs


@pytest.mark.gpu
def test_skinny_split_k_variants_match_cpu(gpu_target, tmp_path, monkeypatch):
    """The skinny GEMM's split-K variants as the default rule makes them (``skinny_rule.choice``): a 2-layer model of
    hidden 512 (K a multiple of 4 x 64), whose qkv, o, gate_up and down are narrow (split-K over 4 CTAs at buckets
    16-64; o and down add the residual stream in the epilogue) and whose lm_head is wide (the persistent kernel at
    16-64, and for 5-8 tokens of the split bucket 8). Decode steps of 40, 24, 12 and 3 sequences (buckets 64, 32, 16,
    8) match the CPU backend within bf16 tolerance, the same bits with and without CUDA graphs."""

    if gpu_target != "h200":
        pytest.skip(f"the skinny GEMM is sm_90a only (target {gpu_target})")
    for var in ("INGOT_GEMV_SKINNY", "INGOT_GEMV_SKINNY_SPLITK", "INGOT_GEMV_BULK"):
        monkeypatch.delenv(var, raising=False)
    cfg = {**SMOLLM2_CONFIG, "num_hidden_layers": 2, "hidden_size": 512, "num_attention_heads": 8,
           "num_key_value_heads": 2}
    ckpt = write_checkpoint(tmp_path / "h512", cfg, random_weights(cfg, np.random.default_rng(3)))
    gpu = ingot.compile(ckpt, target=gpu_target, out=tmp_path / "g.ingot")
    cuda = load_graph(gpu)[1]["cuda"]
    values = {e: dict(k["spec"]["values"]) for e, k in cuda["variant_kernels"].items()
              if k["spec"]["template"] == "skinny.cu"}
    split, residual = Counter(), Counter()
    for ln in cuda["launches"]:
        for v in ln.get("variants", ()):
            if v["kernel"] in values and values[v["kernel"]]["SPLITK"] == 4:
                split[v["max_rows"]] += 1
                residual[v["max_rows"]] += bool(values[v["kernel"]]["HAS_RESIDUAL"])
    assert split == {16: 8, 32: 8, 64: 8} and residual == {16: 4, 32: 4, 64: 4}, (split, residual)
    # the lm_head's (x of 64 tokens at K = 512 fits whole; bucket 8's for 5-8 tokens, the split bucket 8)
    lm_head = sorted((v["MB"], v["XS"]) for v in values.values() if v["SPLITK"] == 1)
    assert lm_head == [(mb, 0) for mb in (8, 16, 32, 64)], lm_head
    REPORT["skinny_split_k"] = _steps_match_cpu(ckpt, gpu, tmp_path, 7, cfg["vocab_size"], lambda s: 2 + s % 4,
                                                (40, 40, 24, 12, 3))


@pytest.mark.gpu
def test_skinny_any_m_variant_matches_cpu(gpu_target, tmp_path, monkeypatch):
    """The skinny GEMM's any-M variant (``skinny_rule.any_m_spec``, the default): a 2-layer model of hidden 512 and
    intermediate 8192, whose down projections (512 x 8192: narrow, K >= ANY_MIN_K, the residual in the epilogue) run
    decode steps of 65-256 rows as 64-token chunks of their split-K variant on grid.z (2 to 4 chunks, the last one
    partial). Decode steps of 200, 130 and 65 sequences match the CPU backend within bf16 tolerance, the same bits with
    and without CUDA graphs (the decode graphs' buckets up to 256)."""
    if gpu_target != "h200":
        pytest.skip(f"the skinny GEMM is sm_90a only (target {gpu_target})")
    for var in ("INGOT_GEMV_SKINNY", "INGOT_GEMV_SKINNY_SPLITK", "INGOT_GEMV_SKINNY_ANY", "INGOT_GEMV_BULK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("INGOT_CUTLASS_SHORT_M", "0")  # on, the CUTLASS GEMM's short-step build takes these steps
    cfg = {**SMOLLM2_CONFIG, "num_hidden_layers": 2, "hidden_size": 512, "intermediate_size": 8192,
           "num_attention_heads": 8, "num_key_value_heads": 2}
    ckpt = write_checkpoint(tmp_path / "i8192", cfg, random_weights(cfg, np.random.default_rng(5)))
    gpu = ingot.compile(ckpt, target=gpu_target, out=tmp_path / "g.ingot")
    cuda = load_graph(gpu)[1]["cuda"]
    chunked = {e for e, k in cuda["variant_kernels"].items() if k["spec"]["values"].get("CHUNKS")}
    found = [(v["max_rows"], ln["args"]["residual"] != {"null": True}) for ln in cuda["launches"]
             for v in ln.get("variants", ()) if v["kernel"] in chunked]
    assert found == [(256, True)] * 2, found  # each layer's down, with the residual
    REPORT["skinny_any_m"] = _steps_match_cpu(ckpt, gpu, tmp_path, 11, cfg["vocab_size"], lambda s: 2 + s % 3,
                                              (200, 200, 130, 65), num_blocks=512)


@pytest.mark.gpu
@pytest.mark.parametrize("quant", [None, "fp8"])
def test_cutlass_short_m_variants_match_cpu(gpu_target, tmp_path, monkeypatch, quant):
    """The CUTLASS GEMM's short-step configurations (``cutlass_params.short_variants``, the default): a 2-layer model
    of the 1B shape's widths (hidden 2048, intermediate 8192, a 4096-token vocabulary), whose qkv, o, down and lm_head
    are narrow, runs their steps past the GEMV buckets up to 256 rows (bf16: 65-256; W8A8 FP8, ``quant="fp8"``: 17-256,
    after the activation quantizer) on 64 x 64 tiles and the down projections' (K = 8192) steps of 257-512 rows on
    64 x 128 tiles, o and down with the residual, the skinny any-M variant of the down projections no longer listed;
    gate_up (wide) keeps its own. A prefill step of 399 rows (the 512 tier on down, the prefill configuration on the
    others), then decode steps of 200, 130, 65 (and for W8A8 40 and 24) sequences match the CPU backend (bf16's
    tolerance; W8A8's one e4m3 step), the same bits with and without CUDA graphs."""
    from ingot.codegen.kernels.gemm_cutlass.build import cutlass_available
    from ingot.codegen.kernels.gemm_cutlass.rule import SHORT_M_TIERS, config_tag
    from tests.runtime.test_quant_cuda import TOL_FP8_ACTIVATIONS

    if gpu_target != "h200":
        pytest.skip(f"the short-step configurations are sm_90a ones (target {gpu_target})")
    if not cutlass_available():
        pytest.skip("CUTLASS kernels need nvcc and the nvidia-cutlass wheel's headers")
    for var in ("INGOT_CUTLASS_SHORT_M", "INGOT_NO_CUTLASS", "INGOT_GEMV_SKINNY_ANY", "INGOT_W8A8_GEMM_ROWS"):
        monkeypatch.delenv(var, raising=False)
    cfg = {**SMOLLM2_CONFIG, "num_hidden_layers": 2, "hidden_size": 2048, "intermediate_size": 8192,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 4096}
    ckpt = write_checkpoint(tmp_path / "h2048", cfg, random_weights(cfg, np.random.default_rng(13)))
    gpu = ingot.compile(ckpt, target=gpu_target, out=tmp_path / "g.ingot", quant=quant)
    cuda = load_graph(gpu)[1]["cuda"]
    tags = {t.rows: {config_tag(c) for c in t.configs.values()} for t in SHORT_M_TIERS}  # W8A8: a bf16 lm_head
    found = Counter((v["max_rows"], ln["args"]["residual"] != {"null": True}) for ln in cuda["launches"]
                    for v in ln.get("variants", ()) if "cutlass" in cuda["variant_kernels"][v["kernel"]]
                    and any(t in v["kernel"] for t in tags.get(v["max_rows"], ())))
    # 256: qkv and the lm_head without the residual, o and down with it; 512: down alone
    assert found == {(256, False): 3, (256, True): 4, (512, True): 2}, found
    assert not any(k["spec"]["values"].get("CHUNKS") for k in cuda["variant_kernels"].values())
    decode = (200, 200, 130, 65) if quant is None else (200, 200, 130, 65, 40, 24)
    tol = 5e-2 if quant is None else TOL_FP8_ACTIVATIONS  # W8A8: one e4m3 step
    REPORT[f"cutlass_short_m_{quant or 'bf16'}"] = _steps_match_cpu(
        ckpt, gpu, tmp_path, 17, cfg["vocab_size"], lambda s: 1 + s % 3, decode, num_blocks=512, tol=tol,
        quant=quant)


@pytest.mark.gpu
def test_skinny_split_bucket_8_matches_cpu(gpu_target, tmp_path, monkeypatch):
    """``INGOT_GEMV_SKINNY=split8`` (the default, set here all the same): the hidden-512 model's wide lm_head has
    kernel.cu's variant up to 4 tokens and the skinny kernel's (4 stages, the final norm fused into both) for 5-8;
    steps of 8 to 1 sequences match the CPU backend, the same bits with and without CUDA graphs."""
    if gpu_target != "h200":
        pytest.skip(f"the skinny GEMM is sm_90a only (target {gpu_target})")
    for var in ("INGOT_GEMV_SKINNY_SPLITK", "INGOT_GEMV_BULK", "INGOT_GEMV_SKINNY_STAGES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("INGOT_GEMV_SKINNY", "split8")
    cfg = {**SMOLLM2_CONFIG, "num_hidden_layers": 2, "hidden_size": 512, "num_attention_heads": 8,
           "num_key_value_heads": 2}
    ckpt = write_checkpoint(tmp_path / "h512", cfg, random_weights(cfg, np.random.default_rng(5)))
    gpu = ingot.compile(ckpt, target=gpu_target, out=tmp_path / "g.ingot")
    monkeypatch.delenv("INGOT_GEMV_SKINNY")
    cuda = load_graph(gpu)[1]["cuda"]
    split = [[(v["max_rows"], cuda["variant_kernels"][v["kernel"]]["spec"]["template"]) for v in ln["variants"][:2]]
             for ln in cuda["launches"] if ln.get("variants") and ln["variants"][0]["max_rows"] == 4]
    assert split == [[(4, "kernel.cu"), (8, "skinny.cu")]], split  # the lm_head's
    REPORT["skinny_split8"] = _steps_match_cpu(ckpt, gpu, tmp_path, 11, cfg["vocab_size"], lambda s: 3 + s % 4,
                                               (8, 8, 6, 5, 4, 3, 1))


def _skinny_formats(artifact: Path) -> Counter:
    """(max rows, WB) -> how many decode variants of the artifact are the skinny GEMM's with that weight format."""
    cuda = load_graph(artifact)[1]["cuda"]
    wb: Counter = Counter()
    for ln in cuda["launches"]:
        for v in ln.get("variants", ()):
            spec = cuda["variant_kernels"][v["kernel"]]["spec"]
            if spec["template"] == "skinny.cu":
                wb[(v["max_rows"], int(dict(spec["values"])["WB"]))] += 1
    return wb


@pytest.mark.gpu
def test_skinny_fp8_weights_match_cpu(gpu_target, tmp_path, monkeypatch):
    """Weight-only FP8 on the skinny GEMM (the default): the hidden-512 model quantized ``fp8:wo``, its qkv, o,
    gate_up and down split-K over 4 CTAs at buckets 16-64 with e4m3 codes converted to f16 in registers and x staged
    in f16 (the lm_head stays bf16, persistent, from 5 tokens: the split bucket 8); decode steps of 40, 24, 12 and 3
    sequences match the CPU backend's emulation of the same quantized model within bf16 tolerance, the same bits with
    and without graphs."""
    if gpu_target != "h200":
        pytest.skip(f"the skinny GEMM is sm_90a only (target {gpu_target})")
    for var in ("INGOT_GEMV_SKINNY", "INGOT_GEMV_SKINNY_SPLITK", "INGOT_GEMV_BULK", "INGOT_GEMV_FP8",
                "INGOT_GEMV_SKINNY_FP8"):
        monkeypatch.delenv(var, raising=False)
    cfg = {**SMOLLM2_CONFIG, "num_hidden_layers": 2, "hidden_size": 512, "num_attention_heads": 8,
           "num_key_value_heads": 2}
    ckpt = write_checkpoint(tmp_path / "h512", cfg, random_weights(cfg, np.random.default_rng(4)))
    quant = {"quant_config": {"default": "fp8:wo"}}
    gpu = ingot.compile(ckpt, target=gpu_target, out=tmp_path / "g.ingot", **quant)
    wb = _skinny_formats(gpu)
    assert wb == {(mb, 1): 8 for mb in (16, 32, 64)} | {(mb, 2): 1 for mb in (8, 16, 32, 64)}, wb
    REPORT["skinny_fp8"] = _steps_match_cpu(ckpt, gpu, tmp_path, 9, cfg["vocab_size"], lambda s: 2 + s % 4,
                                            (40, 40, 24, 12, 3), **quant)


@pytest.mark.gpu
def test_skinny_nvfp4_weights_match_cpu(gpu_target, tmp_path, monkeypatch):
    """Weight-only NVFP4 on the skinny GEMM (``INGOT_GEMV_SKINNY_NVFP4=1``, opt-in): a hidden-1024 model (K slices of
    whole 256-column scale groups) quantized ``nvfp4:wo``, its qkv, o, gate_up and down split-K over 4 CTAs at buckets
    16-64 with e2m1 codes and block scales converted to f16 in registers (the lm_head stays bf16, on the bf16 skinny
    GEMM from 5 tokens); decode steps of 40, 24, 12 and 3 sequences match the CPU backend's emulation of the same
    quantized model, with and without graphs."""
    if gpu_target != "h200":
        pytest.skip(f"the skinny GEMM is sm_90a only (target {gpu_target})")
    for var in ("INGOT_GEMV_SKINNY", "INGOT_GEMV_SKINNY_SPLITK", "INGOT_GEMV_BULK", "INGOT_GEMV_NVFP4"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("INGOT_GEMV_SKINNY_NVFP4", "1")
    cfg = {**SMOLLM2_CONFIG, "num_hidden_layers": 2, "hidden_size": 1024, "intermediate_size": 2048,
           "num_attention_heads": 16, "num_key_value_heads": 4}
    ckpt = write_checkpoint(tmp_path / "h1024", cfg, random_weights(cfg, np.random.default_rng(6)))
    quant = {"quant_config": {"default": "nvfp4:wo"}}
    gpu = ingot.compile(ckpt, target=gpu_target, out=tmp_path / "g.ingot", **quant)
    monkeypatch.delenv("INGOT_GEMV_SKINNY_NVFP4")
    wb = _skinny_formats(gpu)
    assert wb == {(mb, 0): 8 for mb in (16, 32, 64)} | {(mb, 2): 1 for mb in (8, 16, 32, 64)}, wb
    REPORT["skinny_nvfp4"] = _steps_match_cpu(ckpt, gpu, tmp_path, 10, cfg["vocab_size"], lambda s: 2 + s % 4,
                                              (40, 40, 24, 12, 3), **quant)


@pytest.mark.gpu
def test_graph_mode_model_matches_cpu(gpu_target, tmp_path):
    from ingot.passes import PassContext
    from tests.codegen.test_lower import mlp_onnx

    ctx = PassContext()
    ctx.options["cuda"] = {"N": 64}
    src = mlp_onnx(tmp_path / "mlp.onnx")
    gpu = ingot.compile(src, target=gpu_target, out=tmp_path / "g.ingot", mode="graph", passes="O2", pass_context=ctx)
    model = ingot.load(gpu, device="cuda")
    ref = ingot.load(gpu, device="cpu")
    for n in (1, 37, 64):
        x = np.random.default_rng(n).standard_normal((n, 64)).astype(np.float32)
        got, want = model.run({"x": x})["y"], ref.run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="bound 64"):
        model.run({"x": np.zeros((65, 64), np.float32)})
    REPORT["graph_mode_mlp"] = "ok"


@pytest.mark.gpu
def test_wrong_architecture_is_refused(gpu_target, tmp_path):
    from ingot.runtime.cuda_backend import CudaArtifactError

    other = "b200" if gpu_target != "b200" else "h200"
    path = ingot.compile(FIXTURES / "tiny_llama_kv.onnx", target=other, out=tmp_path / "o.ingot", mode="llm")
    with pytest.raises(CudaArtifactError, match="compiled for sm_"):
        ingot.load(path, device="cuda")


@pytest.mark.gpu
def test_profile_times_every_launch_of_a_step(gpu_target, tmp_path):
    """``CudaExecutor.profile`` (bench/bench_profile.py): one row per launch that ran, in launch order, with the
    kernel that ran (the decode variant for a decode step), a positive time, and the step's results unchanged."""
    from ingot.runtime.cuda_backend import CudaExecutor, CudaPagedModel

    gpu = ingot.compile(FIXTURES / "tiny_llama_kv.onnx", target=gpu_target, out=tmp_path / "g.ingot", mode="llm")
    ex = CudaExecutor.from_artifact(gpu, num_blocks=16, cuda_graphs=False)
    seen: list[dict[str, np.ndarray]] = []
    run = ex.run

    def keep(feeds, *args, **kwargs):
        seen.append({k: np.array(v, copy=True) for k, v in feeds.items() if not k.startswith("kv_cache")})
        return run(feeds, *args, **kwargs)

    ex.run = keep  # type: ignore[method-assign]
    got = drive_steps(CudaPagedModel(ex), _mixed_steps(256))
    launches = ex.cuda["launches"]
    tables = {**ex.cuda["kernels"], **ex.cuda.get("variant_kernels", {})}
    for i, feeds in ((0, seen[0]), (len(seen) - 2, seen[-2])):  # the batched prefill and a 3-sequence decode step
        rows = ex.profile(feeds, repeats=3)
        # launches that did not run: empty grids (at most 2) and those decode fusion skips for small steps
        fused = sum("skip" in ln for ln in launches)
        assert [r["launch"] for r in rows] == sorted(r["launch"] for r in rows)
        assert len(rows) >= len(launches) - 2 - fused
        for r in rows:
            ln = launches[r["launch"]]
            assert r["op"] == ln["op"] and r["us"] > 0 and r["kernel"] in tables
            assert r["kernel"] in [ln["kernel"]] + [v["kernel"] for v in ln.get("variants", ())]
        if len(feeds["input_ids"]) == len(feeds["seq_lens"]):  # decode: every linear at <= 8 rows runs a variant
            linears = [r for r in rows if r["op"] == "linear" and launches[r["launch"]].get("variants")]
            assert all(r["kernel"] != launches[r["launch"]]["kernel"] for r in linears)
        again = run(feeds)["logits"]
        assert np.array_equal(again, got[i]), "the profiled step changed the step's results"
    ex.close()
