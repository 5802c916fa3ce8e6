"""Pass registry, pipelines, instruments, and third-party passes through the entry point."""

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ingot.ir.text import parse_graph
from ingot.passes import (
    PASSES,
    DumpIRInstrument,
    PassContext,
    PassError,
    TimingInstrument,
    function_pass,
    get_pass,
    manager,
    run_passes,
)
from ingot.runtime.cpu import run_graph
from tests.helpers import assert_close, rng

PLUGIN = Path(__file__).resolve().parent.parent / "plugins" / "ingot-example-plugin"

GRAPH = """graph @g(%x: f32[4], %y: f32[4]) {
  %m = mul(%x, %y) : f32[4]
  %a = add(%m, %x) : f32[4]
  %u = neg(%y) : f32[4]
  return %a
}"""


def test_unknown_pass_and_bad_names():
    with pytest.raises(PassError, match="unknown pass 'nope'; known passes: .*dce"):
        get_pass("nope")
    with pytest.raises(PassError, match="kebab-case"):
        function_pass("Bad_Name")(lambda g, ctx: False)
    with pytest.raises(PassError, match="unknown pipeline"):
        run_passes(parse_graph(GRAPH), "O9")
    with pytest.raises(PassError, match="unknown pass"):
        run_passes(parse_graph(GRAPH), ["dce"], disabled=["no-such-pass"])


def test_instruments_time_dump_and_verify(tmp_path):
    g = parse_graph(GRAPH)
    timing = TimingInstrument()
    run_passes(g, ["dce"], PassContext(instruments=[timing, DumpIRInstrument(tmp_path)], verify_each=True))
    (rec,) = timing.records
    assert rec.name == "dce" and rec.changed and rec.nodes_before == 3 and rec.nodes_after == 2
    assert rec.stats == {"nodes-removed": 1, "weights-removed": 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00-input.ir", "01-dce.ir"]
    assert "neg(" in (tmp_path / "00-input.ir").read_text()
    assert "neg(" not in (tmp_path / "01-dce.ir").read_text()


def test_a_pass_that_breaks_the_graph_is_caught():
    @function_pass("break-types")
    def break_types(g, ctx):
        """Declares a wrong output type (for this test only)."""
        from ingot.ir.types import DType, TensorType

        g.nodes[0].outputs[0].type = TensorType(DType.f16, (4,))
        return True

    try:
        with pytest.raises(PassError, match="pass 'break-types' left an invalid graph"):
            run_passes(parse_graph(GRAPH), ["break-types"], PassContext(verify_each=True))
    finally:
        PASSES.pop("break-types")


def test_disabled_passes_are_skipped():
    g = parse_graph(GRAPH)
    run_passes(g, ["dce"], disabled=["dce"])
    assert len(g.nodes) == 3


@pytest.fixture
def plugin_installed(tmp_path, monkeypatch):
    """Installs tests/plugins/ingot-example-plugin into a private directory, as a user would."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(PLUGIN)], check=True, capture_output=True, timeout=300)
    monkeypatch.syspath_prepend(str(target))
    importlib.invalidate_caches()
    monkeypatch.setattr(manager, "_PLUGINS_LOADED", False)
    saved = {k: list(v) for k, v in manager.PIPELINES.items()}
    yield target
    manager.PIPELINES.clear()
    manager.PIPELINES.update(saved)
    PASSES.pop("fuse-mul-add", None)


def test_plugin_pass_registers_through_entry_point_and_runs(plugin_installed):
    cls = get_pass("fuse-mul-add")  # loads the entry points
    assert cls.__module__ == "ingot_example_plugin"
    assert "fuse-mul-add" in manager.PIPELINES["O1"]
    g = parse_graph(GRAPH)
    feeds = {"x": rng().standard_normal(4).astype(np.float32), "y": rng().standard_normal(4).astype(np.float32)}
    want = run_graph(g, feeds)["a"]
    timing = TimingInstrument()
    run_passes(g, ["dce", "fuse-mul-add"], PassContext(instruments=[timing], verify_each=True))
    assert [n.op.name for n in g.nodes] == ["fma"]
    assert timing.records[-1].stats == {"mul-add": 1}
    assert_close(run_graph(g, feeds)["a"], want, rtol=1e-6, atol=1e-6)
    # and the command line lists it
    env_path = f"{plugin_installed}"
    p = subprocess.run([sys.executable, "-m", "ingot.cli", "passes", "list"], capture_output=True, text=True,
                       env={**__import__("os").environ, "PYTHONPATH": env_path}, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "fuse-mul-add" in p.stdout


@pytest.mark.parametrize("value,on", [("", False), ("0", False), (" 0 ", False), ("1", True), ("yes", True)])
def test_verify_each_pass_switch(tmp_path, monkeypatch, value, on):
    """``INGOT_VERIFY_EACH_PASS`` (docs/ENVIRONMENT.md): any value but empty or ``0`` turns on the check after every
    pass of ``ingot.compile``'s pipelines; ``0`` leaves it off."""
    import ingot

    monkeypatch.setenv("INGOT_VERIFY_EACH_PASS", value)
    ctx = PassContext()
    ingot.compile(Path(__file__).resolve().parents[1] / "fixtures" / "tiny_llama.onnx", target="cpu",
                  out=tmp_path / "t.ingot", mode="graph", pass_context=ctx)
    assert ctx.verify_each is on
