"""Artifact v1: atomic writes, checksums, version checks, lazy weights."""

import json

import numpy as np
import pytest

import ingot
from ingot.api import CompileError
from ingot.frontend.onnx import ImportError_, import_onnx
from ingot.ir.graph import Weight
from ingot.runtime.artifact import MANIFEST, WEIGHTS, ArtifactError, write_artifact
from ingot.runtime.cpu import FeedError
from tests.helpers import assert_close, rng
from tests.model_factory import cast_model, save


@pytest.fixture
def model_path(tmp_path):
    w = rng().standard_normal((4, 3)).astype(np.float32)
    return save(cast_model(w), tmp_path / "m.onnx"), w


def test_compile_load_run(tmp_path, model_path):
    src, w = model_path
    art = ingot.compile(src, target="cpu", out=tmp_path / "m.ingot", mode="graph")
    assert (art / MANIFEST).is_file() and (art / WEIGHTS).is_file()
    manifest = json.loads((art / MANIFEST).read_text())
    assert manifest["format_version"] == 1 and manifest["target"] == "cpu"
    assert manifest["source"]["sha256"] and set(manifest["files"]) == {WEIGHTS}
    model = ingot.load(art)
    x = rng().standard_normal((5, 3)).astype(np.float32)
    out = model.run({"x": x})
    assert set(out) == {"y", "w_out"}
    assert_close(out["y"], x.astype(np.float16))
    assert_close(out["w_out"], w)
    assert not list(tmp_path.glob(".*tmp")), "temporary directory left behind"


def test_external_data_model(tmp_path):
    w = rng().standard_normal((8, 3)).astype(np.float32)
    src = save(cast_model(w), tmp_path / "ext.onnx", external=True)
    assert (tmp_path / "ext.onnx.data").exists()
    model = ingot.load(ingot.compile(src, out=tmp_path / "ext.ingot"))
    assert_close(model.run({"x": np.ones((1, 3), np.float32)})["w_out"], w)


def test_tampered_weight_byte_is_named(tmp_path, model_path):
    art = ingot.compile(model_path[0], out=tmp_path / "m.ingot")
    data = bytearray((art / WEIGHTS).read_bytes())
    data[-1] ^= 0x01
    (art / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"weights\.safetensors: checksum mismatch"):
        ingot.load(art)


def test_tampered_manifest_graph_is_rejected(tmp_path, model_path):
    art = ingot.compile(model_path[0], out=tmp_path / "m.ingot")
    m = json.loads((art / MANIFEST).read_text())
    assert "cast(" in m["graph"]
    m["graph"] = m["graph"].replace("cast(", "import_os_system(")
    (art / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="unknown op 'import_os_system'"):
        ingot.load(art)


def test_missing_file_and_version(tmp_path, model_path):
    art = ingot.compile(model_path[0], out=tmp_path / "m.ingot")
    m = json.loads((art / MANIFEST).read_text())
    m["format_version"] = 99
    (art / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="format version 99 is not supported"):
        ingot.load(art)
    art = ingot.compile(model_path[0], out=tmp_path / "m.ingot")
    (art / WEIGHTS).unlink()
    with pytest.raises(ArtifactError, match="weights.safetensors: missing"):
        ingot.load(art)
    with pytest.raises(ArtifactError, match="no such artifact"):
        ingot.load(tmp_path / "nope.ingot")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ArtifactError, match="manifest.json is missing"):
        ingot.load(tmp_path / "plain")


def test_failed_compile_leaves_nothing_and_keeps_old_artifact(tmp_path, model_path):
    out = tmp_path / "m.ingot"
    ingot.compile(model_path[0], out=out)
    before = (out / MANIFEST).read_text()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(model_path[0].read_bytes()[:40])
    with pytest.raises(ImportError_, match="bad.onnx"):
        ingot.compile(bad, out=out)
    assert (out / MANIFEST).read_text() == before
    with pytest.raises(ImportError_):
        ingot.compile(bad, out=tmp_path / "fresh.ingot")
    assert not (tmp_path / "fresh.ingot").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx", "m.ingot", "m.onnx"]


def test_failure_while_writing_weights_leaves_nothing(tmp_path, model_path):
    """A weight that cannot be read half-way through writing: no partial artifact, old one kept."""
    out = tmp_path / "m.ingot"
    ingot.compile(model_path[0], out=out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    g = import_onnx(model_path[0])
    name = next(iter(g.weights))

    def broken():
        raise OSError("disk went away")

    g.weights[name] = Weight(g.weights[name].type, broken, source="broken")
    with pytest.raises(OSError, match="disk went away"):
        write_artifact(g, out, target="cpu", mode="graph", source={})
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ingot", "m.onnx"]


def test_refuses_to_replace_a_foreign_directory(tmp_path, model_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.txt").write_text("do not delete")
    with pytest.raises(ArtifactError, match="not an ingot artifact"):
        ingot.compile(model_path[0], out=out)
    assert (out / "thesis.txt").read_text() == "do not delete"


def test_bad_feeds_are_named(tmp_path, model_path):
    model = ingot.load(ingot.compile(model_path[0], out=tmp_path / "m.ingot"))
    with pytest.raises(FeedError, match="input 'x' must be f32, got f64"):
        model.run({"x": np.ones((2, 3))})
    with pytest.raises(FeedError, match=r"input 'x' must have shape f32\[B,3\], got \(2, 4\)"):
        model.run({"x": np.ones((2, 4), np.float32)})
    with pytest.raises(FeedError, match="rank 2"):
        model.run({"x": np.ones((3,), np.float32)})
    with pytest.raises(FeedError, match="missing input"):
        model.run({})
    with pytest.raises(FeedError, match="unknown input"):
        model.run({"x": np.ones((2, 3), np.float32), "z": np.ones(1)})


def test_bad_compile_options(model_path):
    with pytest.raises(CompileError, match="unknown target 'a100'; known targets: cpu, h100, h200, b200"):
        ingot.compile(model_path[0], target="a100")
    with pytest.raises(CompileError, match="unknown mode"):
        ingot.compile(model_path[0], mode="fast")
