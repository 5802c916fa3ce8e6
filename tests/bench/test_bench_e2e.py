"""bench/bench_e2e.py without a GPU: its --dry-run path (tiny shape, CPU backend) end to end, and the weight bytes
behind its bandwidth-bound column."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_e2e.py"
TINY = ["--dry-run", "--layers", "1", "--batches", "1,3", "--steps", "3,2", "--warmup", "1", "--context", "8",
        "--breakdown-steps", "2", "--prefill", "2x32", "--max-num-batched-tokens", "32"]


def run_bench(tmp_path: Path, *args: str) -> tuple[dict, str]:
    out = tmp_path / "e2e.json"
    p = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--workdir", str(tmp_path / "work"), "--out", str(out),
                        *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return json.loads(out.read_text()), p.stdout


def positive(x) -> bool:
    return isinstance(x, (int, float)) and x > 0


def test_dry_run_measures_every_format(tmp_path):
    res, stdout = run_bench(tmp_path, "--skip-hf")
    assert set(res["ingot"]) == {"bf16", "fp8-w8a16", "fp8-w8a8"}
    wb = res["model"]["weight_bytes_per_token"]
    assert f"fp8-w8a16 {wb['bf16'] / wb['fp8-w8a16']:.2f}x" in stdout  # the most FP8 weights can gain at batch 1
    for fmt, r in res["ingot"].items():
        assert positive(res["compile"][fmt]["seconds"]) or res["compile"][fmt]["seconds"] == 0.0
        for bs, steps in (("1", 3), ("3", 2)):
            d = r["decode"][bs]
            assert positive(d["tokens_per_s"]) and positive(d["step_ms"]), (fmt, bs, d)
            assert d["tokens"] == d["expected_tokens"] == int(bs) * steps
        b = r["decode"]["1"]["breakdown"]
        assert b["steps"] == 2 and positive(b["engine_step_ms"]) and positive(b["executor_run_ms"])
        assert b["executor_run_ms"] <= b["engine_step_ms"] and b["gpu_ms"] is None  # CPU backend: no CUDA events
        assert positive(r["prefill"]["tokens_per_s"]) and positive(r["prefill"]["ttft_all_ms"])
        assert r["prefill"]["ttft_mean_ms"] <= r["prefill"]["ttft_all_ms"]
    wb = res["model"]["weight_bytes_per_token"]
    assert wb["fp8-w8a16"] == wb["fp8-w8a8"] < wb["bf16"]
    rows = res["table"]
    assert len(rows) == 4 * 3  # decode bs=1, bs=3, prefill, TTFT x three formats
    assert all(positive(r["ingot"]) and r["hf_eager"] is None and r["hf_compile"] is None for r in rows)
    bs1 = [r for r in rows if r["config"].startswith("decode bs=1,")]
    assert len(bs1) == 3 and all(0 < r["fraction_of_bound"] < 1 for r in bs1)
    for r in rows:  # the printed table has every row
        assert f"| {r['config']} | " in stdout
    assert res["env"]["git_commit"] and res["args"]["device"] == "cpu"


@pytest.mark.slow
def test_dry_run_with_hf_eager_reference(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    res, stdout = run_bench(tmp_path, "--formats", "bf16", "--skip-compile")
    eager = res["hf"]["eager"]
    for bs in ("1", "3"):
        assert positive(eager["decode"][bs]["tokens_per_s"]), eager
    assert positive(eager["prefill"]["tokens_per_s"]) and "compile" not in res["hf"]
    for r in res["table"]:
        assert positive(r["hf_eager"]) and positive(r["ingot_over_best_ref"]), r
    assert res["env"]["torch"] and res["env"]["transformers"]


def _header_only_checkpoint(path: Path, cfg: dict) -> None:
    """config.json and a safetensors file holding only the header (weight_bytes reads shapes, never data)."""
    from bench.make_llama1b import tensor_shapes

    header, off = {}, 0
    for name, shape in tensor_shapes(cfg).items():
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    path.mkdir()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    (path / "config.json").write_text(json.dumps(cfg))


def test_weight_bytes_of_the_1b_shape(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench.bench_e2e import weight_bytes
    from bench.make_llama1b import LLAMA_1B

    _header_only_checkpoint(tmp_path / "ckpt", LLAMA_1B)
    wb = weight_bytes(tmp_path / "ckpt")
    H, I, V, L = 2048, 8192, 128256, 16
    linear = H * (32 * 64) + 2 * H * (8 * 64) + (32 * 64) * H + 3 * H * I  # q, k, v, o, gate, up, down
    out_channels = 32 * 64 + 2 * 8 * 64 + H + 2 * I + H
    norms = 2 * H * L + H
    assert wb["bf16"] == 2 * (V * H + L * linear + norms)  # the tied embedding once, as the lm_head
    assert abs(wb["bf16"] / 1e9 - 2.47) < 0.01  # ../shared/GPU.md: 2.47 GB per token
    assert wb["fp8-w8a16"] == 2 * (V * H + norms) + L * (linear + 4 * out_channels)

    untied = {**LLAMA_1B, "tie_word_embeddings": False}
    _header_only_checkpoint(tmp_path / "untied", untied)
    assert weight_bytes(tmp_path / "untied")["bf16"] == wb["bf16"]  # lm_head read whole, the embedding one row
