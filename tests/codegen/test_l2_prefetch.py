"""The decode L2 prefetch (``codegen/l2_prefetch.py``) without a GPU: ``INGOT_L2_PREFETCH=MB`` gives each fused rope +
cache-write launch of a Llama table the prefetching kernel (``cache_rule.with_prefetch``) bound to the weights of the
next linear launches of its layer (o, then gate_up; bf16 and FP8 weights), clipped to the budget; unset or 0 the
table is unchanged; a bad value is an error naming the variable; the kernel compiles for sm_90a and sm_100a with the
bulk L2 prefetch (UBLKPF) and no local memory, and, built for the host, writes what the plain fused kernel writes.
On the GPU: ``test_rope_cache_fusion_gpu.py`` (the kernel) and ``tests/runtime/test_l2_prefetch_gpu.py`` (the
artifact's logits)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ingot
from ingot.codegen import l2_prefetch
from ingot.codegen.kernels.rope.cache_rule import PF_PARAMS, PARAMS, with_prefetch
from ingot.codegen.target import get_target
from ingot.runtime.artifact import load_graph
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    module_kernel_cache,
    needs_compiler,
    sass_opcodes,
)
from tests.codegen.host_emulation import CXX, HostKernel, aligned
from tests.codegen.test_lower import FIXTURES
from tests.codegen.test_rope_cache_fusion import ARCH, CASES, draw, fused_spec
from tests.helpers import rng

MIB = 1 << 20


def test_budget_from_the_environment(monkeypatch):
    monkeypatch.delenv(l2_prefetch.ENV, raising=False)
    assert l2_prefetch.budget_bytes() == l2_prefetch.DEFAULT_MB * MIB
    for raw, want in (("0", 0), ("24", 24 * MIB), (" 1.5 ", 3 * MIB // 2), ("0.00001", 0)):
        monkeypatch.setenv(l2_prefetch.ENV, raw)
        assert l2_prefetch.budget_bytes() == want, raw
    for bad in ("-1", "lots", "nan"):
        monkeypatch.setenv(l2_prefetch.ENV, bad)
        with pytest.raises(ValueError, match=l2_prefetch.ENV):
            l2_prefetch.budget_bytes()


def _compile(tmp_path, name: str, monkeypatch, budget: str | None, quant: bool = False):
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    if budget is None:
        monkeypatch.delenv(l2_prefetch.ENV, raising=False)
    else:
        monkeypatch.setenv(l2_prefetch.ENV, budget)
    if quant:
        from tests.codegen.test_lower_quant import CASES as QUANT_CASES
        from tests.codegen.test_lower_quant import compile_quant, quant_checkpoint

        path = compile_quant(quant_checkpoint(tmp_path / name), "h200", QUANT_CASES["fp8-kv"], tmp_path / f"{name}.ingot")
    else:
        path = ingot.compile(FIXTURES / "tiny_llama_kv.onnx", target="h200", out=tmp_path / f"{name}.ingot", mode="llm")
    graph, _ = load_graph(path)
    return json.loads((path / "manifest.json").read_text())["cuda"], graph


def _nbytes(graph, name: str) -> int:
    w = graph.weights[name]
    return w.type.numel() * w.type.dtype.itemsize_bits // 8


def _expected(cuda: dict, graph, j: int, budget: int) -> list[tuple[str, int]]:
    """The next two linear launches' weights of rope launch ``j``'s layer, each clipped to what is left."""
    out, left = [], budget
    for ln in cuda["launches"][j + 1:]:
        if ln["op"] == "rope_qkv" or len(out) == 2 or left < 16:
            break
        if ln["op"] in ("linear", "quantized_linear") and ln["args"]["weight"]["buffer"] in graph.weights:
            take = min(_nbytes(graph, ln["args"]["weight"]["buffer"]), left) // 16 * 16
            out.append((ln["args"]["weight"]["buffer"], take))
            left -= take
    return out


@needs_compiler
@pytest.mark.parametrize("quant", [False, True], ids=["bf16", "fp8"])
def test_rope_launches_prefetch_the_next_weights(tmp_path, monkeypatch, quant):
    off, _ = _compile(tmp_path, "off", monkeypatch, None, quant)
    zero, _ = _compile(tmp_path, "zero", monkeypatch, "0", quant)
    assert zero["launches"] == off["launches"]  # off by default, and 0 is off
    assert not any("pf0" in ln["args"] for ln in off["launches"])
    for budget in ("64", "0.005"):  # every layer's o and gate_up whole; part of o alone
        on, graph = _compile(tmp_path, f"on{budget}", monkeypatch, budget, quant)
        assert [ln["op"] for ln in on["launches"]] == [ln["op"] for ln in off["launches"]]
        ropes = [j for j, ln in enumerate(on["launches"]) if ln["op"] == "rope_qkv"]
        assert len(ropes) == 2
        for j, ln in enumerate(on["launches"]):
            if j not in ropes:
                assert ln == off["launches"][j]
                continue
            k = on["kernels"][ln["kernel"]]
            assert [p for p, _ in k["params"]] == [p for p, _ in PARAMS + PF_PARAMS]
            assert k["grid"][1]["const"] == 1 + l2_prefetch.PREFETCH_CTAS
            assert {n: a for n, a in ln["args"].items() if not n.startswith("pf")} == off["launches"][j]["args"]
            want = _expected(on, graph, j, int(float(budget) * MIB) // 16 * 16)
            got = [(ln["args"][f"pf{r}"].get("buffer"), ln["args"][f"pf{r}_bytes"]["value"]) for r in (0, 1)]
            assert got[:len(want)] == want
            assert all(b is None and n == 0 for b, n in got[len(want):])
            names = [name for name, _ in want]
            assert "o_proj" in names[0], names
            if budget == "64":
                assert len(want) == 2 and "up" in names[1], names
                assert all(n == _nbytes(graph, name) for name, n in want)
            else:
                assert want == [(names[0], int(0.005 * MIB) // 16 * 16)] and _nbytes(graph, names[0]) > want[0][1]


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
def test_prefetching_kernel_compiles_with_bulk_prefetch(target):
    tgt = get_target(target)
    spec = with_prefetch(fused_spec("llama1b-bf16", tgt), 32, tgt)
    ops = sass_opcodes(spec, ARCH[target])
    assert any(o.startswith("UBLKPF") for o in ops), sorted(ops)
    assert_no_local_memory(ops, "the prefetching rope kernel")
    assert not any(o.startswith("UBLKPF") for o in sass_opcodes(fused_spec("llama1b-bf16", tgt), ARCH[target]))


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
def test_prefetching_kernel_on_the_host_writes_what_the_plain_one_writes():
    """On the host the prefetch itself is compiled out (no __CUDA_ARCH__): what is checked is that the extra rows of
    blocks write nothing and the token blocks are unchanged."""
    tgt = get_target("h200")
    plain = fused_spec("llama1b-bf16", tgt)
    pf = with_prefetch(plain, 4, tgt)
    kernels = HostKernel(plain), HostKernel(pf)
    dt, nq, d = CASES["llama1b-bf16"][0], CASES["llama1b-bf16"][4], CASES["llama1b-bf16"][6]
    region = aligned(np.arange(4096, dtype=np.uint8))
    for tokens in (1, 12):
        inputs = {n: aligned(a) if a is not None else None for n, a in draw(rng(), "llama1b-bf16", tokens).items()}
        got = []
        for kernel in kernels:
            q = aligned(np.full((tokens, nq * d), np.nan, np.float32).astype(dt.np))
            cache = aligned(inputs["kv_cache"])
            extra = ({"pf0": region, "pf0_bytes": region.size, "pf1": None, "pf1_bytes": 0}
                     if kernel is kernels[1] else {})
            kernel.launch(**{n: inputs[n] for n in ("qkv", "positions", "cos", "sin")}, q=q, kv_cache=cache,
                          slot_mapping=inputs["slot_mapping"], kv_scale=None, num_tokens=tokens, **extra)
            got.append((q.view(np.uint8), cache.view(np.uint8)))
        assert all(np.array_equal(a, b) for a, b in zip(*got))
        assert np.array_equal(region, np.arange(4096, dtype=np.uint8))
