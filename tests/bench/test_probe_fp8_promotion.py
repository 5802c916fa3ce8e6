"""bench/probe_fp8_promotion.py: the promotion interval read back from column sums, on a numpy model of the tensor
core's truncating accumulation and on the losses the H200 measured (docs/PERF.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import probe_fp8_promotion as probe  # noqa: E402


@pytest.mark.parametrize("cancel", [False, True], ids=["f32-out", "bf16-out"])
@pytest.mark.parametrize("p", [64, 128, 256, 1024])
def test_interval_recovered_from_the_model(p, cancel):
    k = 1024
    k0 = probe.big_positions(96, k)
    got = probe.simulate(k, k0, p, cancel)
    if cancel:  # what a bf16 output keeps of the sums
        got = got.astype(ml_dtypes.bfloat16).astype(np.float64)
    lost = probe.lost_terms(got, k, cancel)
    assert lost.max() > 0  # the small terms beside BIG are lost at all
    assert probe.promotion_interval(k0, lost, k, cancel) == p


def test_exact_sums_match_no_interval():
    """An accumulator that loses nothing (f64) is not mistaken for any promotion interval."""
    k = 512
    k0 = probe.big_positions(32, k)
    exact = np.full(len(k0), probe.BIG + (k - 1) * probe.SMALL)
    assert probe.promotion_interval(k0, probe.lost_terms(exact, k, False), k, False) is None


def test_the_h200s_losses():
    """L at k0 = 0, 32, ..., 480 on 4096^3 as torch._scaled_mm (cuBLASLt) returned them on the H200 (2026-12-02):
    promotion every 128 without fast accumulation, never with it."""
    k, k0 = 4096, np.arange(0, 512, 32)
    assert probe.promotion_interval(k0, np.array([127.0, 95, 63, 31] * 4), k, False) == 128
    assert probe.promotion_interval(k0, np.array([158.0, 126, 94, 62] * 4), k, True) == 128
    assert probe.promotion_interval(k0, 4095.0 - k0, k, False) == k
    assert probe.promotion_interval(k0, 4094.0 - k0, k, True) == k
