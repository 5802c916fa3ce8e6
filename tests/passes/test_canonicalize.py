"""canonicalize on the tiny Llama exports: same outputs, fewer nodes, shape chains gone.

Remaining shape nodes after canonicalize (for the record; the asserts below keep them from growing):
the ``shape -> gather`` reads that feed ``range`` (positions need ``seq`` at run time), the mask's
flat-index arithmetic of the TorchScript export, and the dynamo export's ``expand``s that broadcast to
a shape only known at run time (``[1, seq] -> [batch, seq]``). No reshape keeps a runtime shape input.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import pytest

from ingot.frontend.onnx import import_onnx
from ingot.ir.graph import Graph
from ingot.ir.verify import verify
from ingot.passes import PassContext, TimingInstrument, run_passes
from ingot.runtime.cpu import run_graph
from tests.helpers import rng

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
#: fixture -> (most shape/size nodes left, most expands with a runtime shape left)
LIMITS = {
    "tiny_llama.onnx": (4, 5),
    "tiny_llama_ts.onnx": (2, 0),
    "tiny_llama_kv.onnx": (4, 2),
    "tiny_llama_kv_ts.onnx": (3, 0),
}


@functools.cache
def _model(name: str) -> onnx.ModelProto:
    return onnx.load(str(FIXTURES / name))


def feeds(g: Graph, batch: int, seq: int, past: int, seed: int) -> dict[str, np.ndarray]:
    r = rng(seed)
    out: dict[str, np.ndarray] = {}
    for v in g.inputs:
        if v.name == "input_ids":
            out[v.name] = r.integers(0, 256, (batch, seq))
        elif v.name == "attention_mask":
            total = seq + (past if len(g.inputs) > 2 else 0)
            m = np.ones((batch, total), np.int64)
            m[0, : r.integers(0, 2)] = 0  # some left padding
            out[v.name] = m
        elif v.name == "position_ids":
            out[v.name] = np.broadcast_to(np.arange(past, past + seq), (batch, seq)).copy()
        else:  # past key/values
            out[v.name] = r.standard_normal((batch, 2, past, 16)).astype(np.float32)
    return out


def shape_report(g: Graph) -> dict[str, int]:
    """What is left of the shape computations."""
    return {
        "shape-nodes": sum(n.op.name in ("shape", "size") for n in g.nodes),
        "runtime-reshapes": sum(n.op.name == "reshape" and len(n.inputs) > 1 for n in g.nodes),
        "runtime-expands": sum(n.op.name == "expand" and len(n.inputs) > 1 for n in g.nodes),
        "runtime-constant-of-shape": sum(n.op.name == "constant_of_shape" and len(n.inputs) > 0
                                          for n in g.nodes),
    }


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_tiny_llama_canonicalize(name: str):
    before = import_onnx(_model(name))
    g = import_onnx(_model(name))
    timing = TimingInstrument()
    run_passes(g, "O1", PassContext(instruments=[timing], verify_each=True))
    verify(g)
    assert len(g.nodes) < len(before.nodes)
    report = shape_report(g)
    max_shape, max_expand = LIMITS[name]
    assert report["shape-nodes"] <= max_shape, report
    assert report["runtime-expands"] <= max_expand, report
    assert report["runtime-reshapes"] == 0, report
    assert report["runtime-constant-of-shape"] == 0, report
    # a second canonicalize finds nothing left to do
    again = TimingInstrument()
    n = len(g.nodes)
    run_passes(g, ["canonicalize"], PassContext(instruments=[again]))
    assert len(g.nodes) == n and not again.records[0].changed
    seed = int(np.random.SeedSequence().generate_state(1)[0])
    for batch, seq, past in ((2, 5, 3), (1, 1, 6)):
        f = feeds(before, batch, seq, past, seed)
        want, got = run_graph(before, f), run_graph(g, f)
        for k, w in want.items():
            scale = max(float(np.abs(w).max()), 1e-30)
            err = float(np.abs(got[k].astype(np.float64) - w).max())
            assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
            assert err <= 1e-6 * scale, f"{name} {k}: {err} (seed {seed})"


def test_stats_and_rounds():
    g = import_onnx(_model("tiny_llama_ts.onnx"))
    timing = TimingInstrument()
    run_passes(g, ["canonicalize"], PassContext(instruments=[timing]))
    stats = timing.records[0].stats
    assert stats["rounds"] >= 2
    assert stats["cse/merged"] > 0 and stats["shape-fold/reshape-static"] > 0
