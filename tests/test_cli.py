"""The `ingot` command line, run as a user would (a subprocess per command)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import rng
from tests.model_factory import cast_model, save


def ingot(*args, ok=True):
    p = subprocess.run([sys.executable, "-m", "ingot.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=120)
    if ok:
        assert p.returncode == 0, f"ingot {args} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture
def model(tmp_path):
    w = rng().standard_normal((4, 3)).astype(np.float32)
    return save(cast_model(w), tmp_path / "m.onnx"), w


@pytest.mark.parametrize("cmd", ["inspect", "compile", "run"])
def test_help(cmd):
    p = ingot(cmd, "--help")
    assert "usage: ingot " + cmd in p.stdout


def test_compile_inspect_run(tmp_path, model):
    src, w = model
    art = tmp_path / "m.ingot"
    p = ingot("compile", src, "--target", "cpu", "-o", art)
    assert f"-> {art}" in p.stderr
    p = ingot("inspect", src)
    assert "f32[B,3]" in p.stdout and "parameters: 12 in 1 weights" in p.stdout
    p = ingot("inspect", art, "--ir")
    assert "artifact (target cpu, mode graph)" in p.stdout and "cast(%x) {to=f16" in p.stdout
    x = rng().standard_normal((2, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    ingot("run", art, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "out")
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), x.astype(np.float16))
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "w_out.npy"), w)
    p = ingot("run", art, "--input", "x=[[1.5, 2, 3]]")
    assert "y: float16[1, 3] [1.5 2.  3. ]" in p.stdout


def test_errors_are_one_line_and_exit_2(tmp_path, model):
    src, _ = model
    art = tmp_path / "m.ingot"
    ingot("compile", src, "-o", art)
    p = ingot("run", art, "--input", f"x={src}", ok=False)
    assert p.returncode == 2 and "cannot read" in p.stderr and "Traceback" not in p.stderr
    p = ingot("run", art, "--input", "x=[[1, 2]]", ok=False)
    assert p.returncode == 2 and "input 'x' must have shape f32[B,3], got (1, 2)" in p.stderr
    p = ingot("inspect", tmp_path / "missing.onnx", ok=False)
    assert p.returncode == 2 and "no such file" in p.stderr
    m = json.loads((art / "manifest.json").read_text())
    m["files"]["weights.safetensors"] = "0" * 64
    (art / "manifest.json").write_text(json.dumps(m))
    p = ingot("run", art, "--input", "x=[[1, 2, 3]]", ok=False)
    assert p.returncode == 2 and "weights.safetensors: checksum mismatch" in p.stderr
