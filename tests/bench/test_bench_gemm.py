"""bench/bench_gemm.py without a GPU: its options, ``--only``'s refusal of a configuration it does not know (before
any build), and the parse of nvidia-smi's clock / power samples behind ``--sustain``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_gemm.py"
sys.path.insert(0, str(ROOT / "bench"))

from bench_gemm import _fits, build, interleaved_order, parse_smi, samples_in_windows  # noqa: E402


def test_help_names_the_options():
    p = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0 and all(o in p.stdout for o in ("--top", "--only", "--sustain", "--sustain-all",
                                                             "--build", "--weight-scales"))


def test_weight_scale_builds_fit_their_modes_only():
    """``TAG+wt`` (``--weight-scales tensor``: the weight's scale one f32) runs where the reference has scalar scales,
    ``TAG+wb`` (block scales) in ``fp8-block`` only, which no other build runs; the FastAccum split holds for them as
    for the vector builds."""
    assert _fits("fp8-tensor", "coopov128x128x128c2x1d+wt") and _fits("fp8-tensor", "coopov128x128x128c2x1d")
    assert not _fits("fp8-row", "coopov128x128x128c2x1d+wt") and _fits("fp8-row", "coopov128x128x128c2x1d")
    assert _fits("fp8-tensor-fast", "coopfa128x128x128c1x2+wt") and not _fits("fp8-tensor", "coopfa128x128x128c1x2+wt")
    assert not _fits("fp8-row-fast", "coopfa128x128x128c1x2+wt")
    assert _fits("fp8-block", "coopov128x128x128c2x1d+wb") and not _fits("fp8-block", "coopov128x128x128c2x1d")
    assert not any(_fits(mode, "coopov128x128x128c2x1d+wb") for mode in ("fp8-row", "fp8-tensor", "bf16"))


def test_only_refuses_an_unknown_configuration(tmp_path):
    with pytest.raises(SystemExit, match=r"no bf16 configuration named \['coop999x128x64c1x1'\]"):
        build(tmp_path / "k", "h200", ("bf16",), ("pp128x128x64c2x1", "coop999x128x64c1x1"))
    assert not (tmp_path / "k" / "manifest.json").exists()


def test_parse_smi():
    clocks, powers = parse_smi("1980, 652.31\n1755, 699.80\n[N/A], 12.0\n1830, 6")
    assert clocks == [1980.0, 1755.0, 1830.0] and powers == [652.31, 699.8, 6.0]
    assert parse_smi("") == ([], [])


def test_samples_fall_in_their_windows():
    """--sustain-all's one nvidia-smi run: each timestamped sample goes to the kernel that ran then; samples between
    runs (a warm-up, the gap) and lines that do not parse go nowhere."""
    import datetime

    t = datetime.datetime(2026, 12, 2, 11, 39, 20)
    s = datetime.timedelta(seconds=1)
    windows = [("reference", t, t + s), ("coop", t + 2 * s, t + 3 * s), ("idle", t + 5 * s, t + 6 * s)]
    text = "\n".join([
        "2026/12/02 11:39:20.100, 1500, 690.10",  # reference
        "2026/12/02 11:39:20.900, 1440, 689.00",  # reference
        "2026/12/02 11:39:21.500, 1980, 300.00",  # between runs
        "2026/12/02 11:39:22.250, 1575, 690.50",  # coop
        "2026/12/02 11:39:22.350, [N/A], 690.50",  # unparsable
        "garbage",
    ])
    got = samples_in_windows(text, windows)
    assert got == {"reference": [(1500.0, 690.1), (1440.0, 689.0)], "coop": [(1575.0, 690.5)], "idle": []}


def test_interleaved_order_alternates_direction():
    """The A/B rounds run forward then backward: every graph runs reps times, first in a round as often as last."""
    assert interleaved_order(2, 4) == [0, 1, 1, 0, 0, 1, 1, 0]
    order = interleaved_order(3, 6)
    assert [order.count(i) for i in range(3)] == [6, 6, 6]
    firsts = [order[3 * r] for r in range(6)]
    assert firsts.count(0) == firsts.count(2) == 3
