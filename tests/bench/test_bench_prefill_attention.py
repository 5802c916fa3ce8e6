"""bench/bench_prefill_attention.py without a GPU: ``--help``, the kernels a run would bench (``ingot_kernels``:
flash at 4 and 8 warps, then each wgmma config the rule takes, named by its label) and ``--dry-run``, which
compiles them all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.codegen.common import module_kernel_cache, needs_compiler  # noqa: F401 (autouse fixture)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_prefill_attention.py"
sys.path.insert(0, str(ROOT / "bench"))

from bench_prefill_attention import DEFAULT_WGMMA_CONFIGS, ingot_kernels  # noqa: E402


def run(*args: str) -> str:
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return p.stdout


def test_help_names_the_wgmma_configs():
    out = run("--help")
    assert "--wgmma-configs" in out and "--dry-run" in out


def test_kernels_per_shape():
    labels = [label for label, _ in ingot_kernels("8x2048x32x8x64", 16, list(DEFAULT_WGMMA_CONFIGS))]
    assert labels[:2] == ["w4", "w8"] and len(labels) == len(set(labels))
    assert {"wgmma_2x128x3", "wgmma_2x128x3ov", "wgmma_2x128x2ws", "wgmma_2x128x3ovws"} <= set(labels)
    assert "wgmma_default" not in labels  # the default (at head_dim 128 2x128x3wshflmpptmvz) under its own name
    specs = dict(ingot_kernels("1x4096x32x32x128", 16, ["default", "2x128x2", "1x64x3ws", "2x128x2ov",
                                                         "2x128x3lmtmwshfppvz", "2x128x3tm"]))
    # duplicates (the default spelled out) and declined configs (overlap needs 3 stages, TMA a producer) dropped
    assert list(specs) == ["w4", "w8", "wgmma_2x128x3wshflmpptmvz", "wgmma_2x128x2", "wgmma_1x64x3ws"]
    # a cache whose blocks TMA copies cannot tile: the default loads by cp.async, TMA configs are declined
    labels = [label for label, _ in ingot_kernels("1x4096x32x32x128", 12, ["default", "2x128x3wshflmtm"])]
    assert labels == ["w4", "w8", "wgmma_2x128x3wshflm"]
    assert specs["wgmma_1x64x3ws"].template == "prefill_wgmma.cu" and specs["wgmma_1x64x3ws"].block == (256, 1, 1)


@needs_compiler
def test_dry_run_compiles_every_kernel():
    out = run("--dry-run", "--shapes", "1x256x8x8x64", "--wgmma-configs", "default", "2x64x3ov", "1x64x2ws")
    lines = [ln for ln in out.splitlines() if ln.startswith("1x256x8x8x64 ")]
    assert [ln.split()[1] for ln in lines] == ["w4:", "w8:", "wgmma_2x128x3wshflmtmvz:", "wgmma_2x64x3ov:",
                                             "wgmma_1x64x2ws:"]
    assert all("cubin" in ln for ln in lines)
