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

from bench_gemm import build, parse_smi  # noqa: E402


def test_help_names_the_options():
    p = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0 and all(o in p.stdout for o in ("--top", "--only", "--sustain", "--build"))


def test_only_refuses_an_unknown_configuration(tmp_path):
    with pytest.raises(SystemExit, match=r"no bf16 configuration named \['coop999x128x64c1x1'\]"):
        build(tmp_path / "k", "h200", ("bf16",), ("pp128x128x64c2x1", "coop999x128x64c1x1"))
    assert not (tmp_path / "k" / "manifest.json").exists()


def test_parse_smi():
    clocks, powers = parse_smi("1980, 652.31\n1755, 699.80\n[N/A], 12.0\n1830, 6")
    assert clocks == [1980.0, 1755.0, 1830.0] and powers == [652.31, 699.8, 6.0]
    assert parse_smi("") == ([], [])
