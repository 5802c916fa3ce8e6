"""bench/bench_skinny.py without a GPU: the kernels a run would time (kernel.cu's rule for the bucket, then the skinny
kernel per stage count it takes) and ``--dry-run``, which compiles them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.codegen.common import module_kernel_cache, needs_compiler  # noqa: F401 (autouse fixture)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_skinny.py"
sys.path.insert(0, str(ROOT / "bench"))

from bench_skinny import specs  # noqa: E402


def test_specs_per_shape():
    labels = [label for label, _ in specs(16384, 2048, 32, [None, 4, 7])]
    assert labels == ["kernel.cu", "skinny-s6", "skinny-s4"]  # 7 stages do not fit beside 32 tokens' x
    assert [label for label, _ in specs(16384, 2048, 5, [None])] == ["kernel.cu", "skinny-s8"]  # bucket 8
    assert [label for label, _ in specs(2048, 8192, 32, [None])] == ["kernel.cu"]  # x too large for the kernel
    assert [label for label, _ in specs(16384, 2048, 64, [None])] == ["kernel.cu"]  # x of 64 tokens fits only streamed
    assert [label for label, _ in specs(16384, 2048, 64, [None], [1, 4], xs=True)] == [
        "kernel.cu", "skinny-s8-xs", "skinny-s7-k4", "skinny-s7-k4-xs"]
    # one consumer warpgroup (64-row tiles: twice the CTAs, half the shared memory for the weight stages)
    assert [label for label, _ in specs(3072, 2048, 64, [None], [4], warpgroups=(1, 2))] == [
        "kernel.cu", "skinny-s8-k4-w1", "skinny-s7-k4"]
    # --fp8: kernel.cu's FP8-weight variant and the skinny kernel's (wb=1)
    assert [s.entry.split("_")[1] for _, s in specs(3072, 2048, 32, [None], [4], wb=1)] == ["fp8w", "fp8w"]


@needs_compiler
def test_dry_run_compiles_every_kernel():
    p = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--shapes", "4096,512", "--m", "8", "32"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("4096x512 ")]
    assert [ln.split()[2] for ln in lines] == ["kernel.cu:", "skinny-s8:", "kernel.cu:", "skinny-s8:"]
    assert all("cubin" in ln for ln in lines)
