"""The GPU lowering of a 1-layer Llama-3.2-1B-shaped serving form (GQA 32:8, head_dim 64, llama3 rope
scaling) after serving-fuse: ten launches per layer, no ``split`` copies; the new kernels (``rope_qkv``, the
packed ``swiglu``) compile for sm_90a and sm_100a. No weights are read (shapes only)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.make_llama1b import LLAMA_1B, tensor_shapes
from ingot.codegen import compile as cc
from ingot.codegen.lower import plan_launches, to_device_dtypes
from ingot.codegen.target import get_target
from ingot.frontend.hf import hf_config
from ingot.frontend.llama_builder import Tensor, build_llama
from ingot.passes import PassContext, run_passes
from tests.codegen.common import module_kernel_cache, needs_compiler  # noqa: F401 (autouse fixture)

LAYER = ["rms_norm", "linear", "rope_qkv", "paged_attention", "paged_attention", "linear", "rms_norm", "linear",
         "swiglu", "linear"]


def _graph(tmp_path, layers: int = 1):
    cfg = {**LLAMA_1B, "num_hidden_layers": layers, "vocab_size": 512}
    (tmp_path / "config.json").write_text(json.dumps(cfg))

    def never() -> np.ndarray:
        raise AssertionError("the lowering plan reads no weights")

    tensors = {n: Tensor(s, never) for n, s in tensor_shapes(cfg).items()}
    return build_llama(hf_config(tmp_path), tensors)


def _layer_ops(launches) -> list[str]:
    return [node.op.name for _, node, _, _ in launches if node.source == "layers.0"]


@pytest.mark.parametrize("target", ["h200", "b200"])
def test_one_layer_lowers_to_ten_launches(tmp_path, target):
    g = _graph(tmp_path)
    run_passes(g, "serving-fuse", PassContext(verify_each=True))
    to_device_dtypes(g)
    launches = plan_launches(g, get_target(target))
    assert _layer_ops(launches) == LAYER
    assert not any(node.op.name == "split" for _, node, _, _ in launches)
    (rope,) = [(spec, args) for _, node, spec, args in launches if node.op.name == "rope_qkv"]
    assert (dict(rope[0].values)["NQ"], dict(rope[0].values)["NKV"]) == (32, 8)
    q, k, v = (rope[1][n]["buffer"] for n in ("q", "k", "v"))
    assert (q, k, v) == ("layers.0.q_rot", "layers.0.k_rot", "layers.0.v")  # the values keep their names
    (act,) = [(spec, args) for _, node, spec, args in launches if node.op.name == "swiglu"]
    assert act[1]["a"] == act[1]["b"] and dict(act[0].values)["B_OFFSET"] == dict(act[0].values)["WIDTH"] == 8192


def test_without_serving_fuse_the_splits_stay(tmp_path):
    g = _graph(tmp_path)
    to_device_dtypes(g)
    ops = _layer_ops(plan_launches(g, get_target("h200")))
    assert len(ops) == 16 and ops.count("split") == 5  # one copy launch per split output


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
def test_new_kernels_compile(tmp_path, target):
    g = _graph(tmp_path)
    run_passes(g, "serving-fuse", PassContext())
    to_device_dtypes(g)
    launches = plan_launches(g, get_target(target))
    specs = [spec for _, node, spec, _ in launches if node.op.name in ("rope_qkv", "swiglu")]
    assert len(specs) == 2
    for spec in specs:
        k = cc.compile_spec(spec)
        assert k.cubin[:4] == b"\x7fELF" and f".target {spec.arch}" in k.ptx and spec.entry in k.ptx
