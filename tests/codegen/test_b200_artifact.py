"""The b200 artifact: CUTLASS tcgen05 GEMMs for ``linear``, launchable from the cubin alone (issue 6).

On a CPU-only machine with pip-installed CUDA wheels (nvcc, cuobjdump, nvidia-cutlass): the tiny Llama
compiled for ``b200`` has a cubin for sm_100a for every kernel; its bf16 linears run on the shape-generic
CUTLASS sm100 kernels (``codegen/kernels/gemm_cutlass/cutlass_params.py``), with the plain template GEMM
recorded as each launch's alternative; the CUTLASS cubin's SASS has ``UTCHMMA`` (tcgen05 BF16 MMA); and the
kernel table carries the Params layout, derived at compile time from CUTLASS's own ``to_underlying_arguments``
(the probe) and checked to reproduce it byte for byte for several (M, N, K).

Builds (two CUTLASS configs, with and without the residual epilogue: cubin + probe each, ~1-2 min cold on
two cores) go to the kernel cache (``$INGOT_CACHE_DIR``); reruns take seconds.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

import ingot
from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp
from ingot.codegen.kernels.gemm_cutlass.build import cutlass_available
from ingot.codegen.sass import disassemble, opcodes, sass_arch
from ingot.codegen.target import get_target
from tests.codegen.common import needs_cuobjdump

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

needs_cutlass = pytest.mark.skipif(not cutlass_available(),
                                   reason="needs nvcc and CUTLASS headers: pip install nvidia-cutlass nvidia-cuda-nvcc")


def _cache(tmp_path_factory) -> str:
    """The kernel cache test_lower.py uses, so a session builds each CUTLASS config once."""
    return os.environ.get("INGOT_TEST_KERNEL_CACHE") or str(tmp_path_factory.getbasetemp() / "kernel-cache")


@pytest.fixture(scope="module")
def b200_artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("b200") / "tiny.ingot"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INGOT_CACHE_DIR", _cache(tmp_path_factory))
        return ingot.compile(FIXTURES / "tiny_llama_kv.onnx", target="b200", out=out, mode="llm")


def test_generic_spec_is_shape_free():
    b200 = get_target("b200")
    spec = cp.generic_linear_spec("bf16", b200)
    assert spec.entry == cp.generic_linear_spec("bf16", b200).entry
    assert [p.name for p in spec.params] == [n for n, _ in cp.LINEAR_PARAMS]
    assert spec.template == "sm100.cu" and spec.value("ABI") == cp.ABI and spec.value("N") == 0
    assert cp.generic_linear_spec("bf16", b200, residual=True).entry != spec.entry


@pytest.mark.slow
@needs_cutlass
def test_params_layout_reproduces_cutlass(b200_artifact, tmp_path_factory, monkeypatch):
    """The layout is derived and checked against every probe shape (``derive_layout`` raises otherwise);
    here: what it holds, and a blob built from it for one more shape. After the artifact (``b200_artifact``), whose
    lowering runs this probe beside the CUTLASS cubins' nvcc on the other core: here it comes from the cache."""
    monkeypatch.setenv("INGOT_CACHE_DIR", _cache(tmp_path_factory))
    spec = cp.generic_linear_spec("bf16", get_target("b200"))
    layout = cp.params_layout(spec)
    assert layout["version"] == cp.LAYOUT_VERSION and layout["cluster"] == [2, 1, 1]
    assert layout["block"] == [256, 1, 1] and 0 < layout["smem"] <= get_target("b200").smem_per_block
    assert {t["tensor"] for t in layout["tma"]} == {"x", "weight", "out"}
    assert {name for _, name in layout["pointers"]} >= {"bias", "weight_scale"}
    encoded = []

    def encode(t, address, dims, strides):
        encoded.append((t["tensor"], address, dims, strides))
        return bytes(cp.TMA_BYTES)

    ptrs = {"x": 0x1000, "weight": 0x2000, "out": 0x3000, "bias": 0x4000}
    blob, launch = cp.build_params(layout, ptrs, 77, 960, 576, 148, encode=encode)
    assert len(blob) == layout["size"]
    assert struct.unpack_from("<4i", blob, layout["problem_shape"]) == (77, 960, 576, 1)
    assert ("x", 0x1000, [576, 77, 1], [1152, 0]) in encoded
    assert ("out", 0x3000, [960, 77, 1], [1920, 0]) in encoded
    for off, name in layout["pointers"]:
        assert struct.unpack_from("<Q", blob, off)[0] == ptrs.get(name, 0)
    # M = 77 -> one 256-row 2-SM tile (2 CTAs), N = 960 -> 8 tiles of 128: rasterized along M
    assert launch["grid"] == (2, 8, 1) and launch["cluster"] == (2, 1, 1)


@pytest.mark.slow
@needs_cutlass
@needs_cuobjdump
def test_b200_artifact_has_tcgen05_gemms(b200_artifact):
    manifest = json.loads((b200_artifact / "manifest.json").read_text())
    cuda = manifest["cuda"]
    assert cuda["arch"] == "sm_100a"
    kernels = {**cuda["kernels"], **cuda.get("variant_kernels", {}), **cuda["alternative_kernels"]}
    for entry, k in kernels.items():
        sass = disassemble((b200_artifact / k["cubin"]).read_bytes())
        assert sass_arch(sass) == "sm_100a", f"{entry}: {sass_arch(sass)}"
    linears = [ln for ln in cuda["launches"] if ln["op"] == "linear"]
    assert linears
    cutlass_entries = set()
    for ln in linears:
        k = cuda["kernels"][ln["kernel"]]
        assert k["spec"]["family"] == "gemm_cutlass" and "cutlass" in k, ln["kernel"]
        cutlass_entries.add(ln["kernel"])
        (alt,) = ln["alternatives"]
        assert cuda["alternative_kernels"][alt["kernel"]]["spec"]["family"] == "gemm"
        assert cuda["alternative_kernels"][alt["kernel"]]["params"] == k["params"]
    # shape-generic: one kernel per epilogue (plain, + residual) for all the model's linears
    assert len(cutlass_entries) == 2
    for entry in cutlass_entries:
        ops = opcodes(disassemble((b200_artifact / cuda["kernels"][entry]["cubin"]).read_bytes()))
        assert any(o.startswith("UTCHMMA") for o in ops), sorted(o for o in ops if "MMA" in o)
        assert any(o.startswith("UTMALDG") for o in ops)
    # no host code in the artifact: only sources, cubins, PTX, weights, JSON
    assert not list(b200_artifact.rglob("*.so"))


def test_without_cutlass_the_plain_gemm_is_planned(monkeypatch, tmp_path):
    monkeypatch.setenv("INGOT_NO_CUTLASS", "1")
    from ingot.codegen.kernels.gemm.rule import FAMILY as GEMM
    from ingot.ir.ops.llm import Linear
    from ingot.ir.types import DType, TensorType

    b200 = get_target("b200")
    (spec,) = GEMM.plan(Linear(), [TensorType(DType.bf16, ("T", 64)), TensorType(DType.bf16, (128, 64))], b200)

    class _Node:
        op = Linear()
        inputs = ()

    assert cp.plan_linear(_Node(), spec, b200) is None  # type: ignore[arg-type]


def _probe_runs(runs: list) -> list:
    return [(tuple(r["shape"]), *({**x, "blob": bytes.fromhex(x["blob"])} for x in r["runs"])) for r in runs]


def test_layout_from_a_gpu_host_probe_equals_a_cpu_hosts():
    """The Params probe's runs of the b200 bf16 GEMM (5 shapes, 5 stack fills each), recorded on this CPU-only
    machine and on an H200 host compiling for b200 (2026-11-30; each spec's runs captured around
    ``cutlass_params._probe`` during a b200 compile of the tiny Llama): on the GPU host the second half of every TMA
    atom (aux params and padding) held host-stack words that are the same in every fill but differ between shapes,
    which failed the derivation with ``LayoutError``. Both hosts' runs now give the same layout, with those bytes
    zero, and the descriptors, pointers and scheduler fields where they were."""
    import gzip

    data = json.loads(gzip.decompress((FIXTURES / "cutlass_probe_runs_b200_bf16.json.gz").read_bytes()))
    spec = cp.generic_linear_spec("bf16", get_target("b200"))
    cpu, gpu = _probe_runs(data["cpu_host"]), _probe_runs(data["gpu_host"])
    tails = [(off, off + cp.TMA_BYTES) for off in (256, 512, 768, 1024, 1792)]
    assert any(gpu[0][1]["blob"][a:b] != bytes(b - a) for a, b in tails)  # the dirty bytes are in the recording
    layout = cp.derive_layout(spec, gpu)
    assert layout == cp.derive_layout(spec, cpu)
    template = bytes.fromhex(layout["template"])
    assert all(template[a:b] == bytes(b - a) for a, b in tails)
    assert [t["offset"] for t in layout["tma"]] == [128, 384, 640, 896, 1664]
    assert {t["tensor"] for t in layout["tma"]} == {"x", "weight", "out"}
    assert {name for _, name in layout["pointers"]} >= {"bias", "weight_scale"}
