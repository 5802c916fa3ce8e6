"""bench/ab_summary.py: medians of interleaved end-to-end runs per variant, from bench_e2e.py's JSON layout."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import ab_summary  # noqa: E402

BYTES = 2_000_000_000  # weight bytes a token: bound 4.19e12 / 2e9 = 2095 tok/s


def _run(tok1: float, gpu1: float, tok8: float, gpu8: float) -> dict:
    return {"model": {"weight_bytes_per_token": {"bf16": BYTES}},
            "ingot": {"bf16": {"decode": {
                "1": {"tokens_per_s": tok1, "decode_steps": 1, "breakdown": {"gpu_ms": gpu1}},
                "1:k8": {"tokens_per_s": tok8, "decode_steps": 8, "breakdown": {"gpu_ms": gpu8}},
                "64": {"tokens_per_s": 20000.0 + tok1, "decode_steps": 1}}}}}


def test_medians_ranges_and_ratios(tmp_path, capsys):
    runs = {1: ("a", _run(900, 1.0, 950, 8.2)), 2: ("b", _run(1000, 0.9, 1040, 7.4)),
            3: ("b", _run(990, 0.91, 1020, 7.3)), 4: ("a", _run(880, 1.01, 940, 8.1)),
            5: ("a", _run(905, 0.99, 960, 8.0)), 6: ("b", _run(1010, 0.89, 1030, 7.5))}
    for i, (name, data) in runs.items():
        (tmp_path / f"e2e_{i}_{name}.json").write_text(json.dumps(data))
    (tmp_path / "summary.txt").write_text("not a run")
    assert ab_summary.main([str(tmp_path), "--json", str(tmp_path / "s.json")]) == 0
    figs = json.loads((tmp_path / "s.json").read_text())
    assert list(figs) == ["a", "b"]  # in the order of their first run
    a, b = figs["a"], figs["b"]
    assert a["1"]["tok_s"] == 900 and (a["1"]["lo"], a["1"]["hi"], a["1"]["runs"]) == (880, 905, 3)
    assert b["1:k8"]["tok_s"] == 1030 and b["1:k8"]["gpu_ms_token"] == pytest.approx(7.4 / 8)
    assert a["1"]["gpu_ms_token"] == 1.0
    assert b["1:k8"]["fraction_of_bound"] == pytest.approx(1030 / (4.19e12 / BYTES))
    assert "fraction_of_bound" not in a["64"] and "gpu_ms_token" not in a["64"]
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("b ") and " 1:k8 " in x)
    assert f"{1030 / 950:.3f}x" in line and "1020.0-1040.0 (3)" in line


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(SystemExit, match="no e2e_"):
        ab_summary.main([str(tmp_path)])
    (tmp_path / "e2e_1_a.json").write_text(json.dumps(_run(1, 1, 1, 1)))
    with pytest.raises(SystemExit, match="fp8-w8a16"):
        ab_summary.main([str(tmp_path), "--format", "fp8-w8a16"])
    with pytest.raises(SystemExit, match="not a directory"):
        ab_summary.main([str(tmp_path / "e2e_1_a.json")])
