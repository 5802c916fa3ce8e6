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
import struct
from pathlib import Path

import pytest

import ingot
from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp
from ingot.codegen.kernels.gemm_cutlass.build import cutlass_available
from ingot.codegen.sass import disassemble, opcodes, sass_arch
from ingot.codegen.target import get_target
from tests.codegen.common import needs_cuobjdump
from tests.helpers import session_cache_dir

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

needs_cutlass = pytest.mark.skipif(not cutlass_available(),
                                   reason="needs nvcc and CUTLASS headers: pip install nvidia-cutlass nvidia-cuda-nvcc")


def _cache(tmp_path_factory) -> str:
    """The kernel cache test_lower.py uses, so a session builds each CUTLASS config once."""
    return session_cache_dir(tmp_path_factory)


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


def _live_bytes(layout: dict) -> set[int]:
    """Every byte ``build_params`` writes: descriptors, pointers, shape-dependent ints, problem shape, SM count and
    the scheduler's fields."""
    live = {t["offset"] + i for t in layout["tma"] for i in range(cp.TMA_BYTES)}
    live |= {o + j for o, _ in layout["pointers"] for j in range(8)}
    live |= {o + j for o, *_ in layout.get("ints", ()) for j in range(4)}
    live |= set(range(layout["problem_shape"], layout["problem_shape"] + 16))
    live |= set(range(layout["sm_count"], layout["sm_count"] + 4))
    return live | {layout["scheduler"]["offset"] + i for i in cp._scheduler_field_bytes("sm100")}


@pytest.mark.parametrize("residual", [False, True])
def test_blockscaled_layout_loses_only_its_atoms_second_halves(residual, monkeypatch):
    """The b200 block-scaled NVFP4 GEMM (``sm100_blockscaled.cu``): its Params probe's runs (5 shapes, 5 stack fills
    each), recorded on this CPU-only machine (2026-11-30), derived with and without the second half of every TMA
    atom taken as padding (``cutlass_params._atom_tails``). Its atoms' aux params are empty static types (a probe
    printing offsetof/sizeof: A, B, SFA, SFB and their fallbacks at 128 ... 1920, the scale-factor layouts at 2176 and
    2196, the epilogue's C and D atoms at 2432 and 2688), so the layout changes only there: the bytes newly padding
    are exactly those halves less what was padding already, none of them live, and the template differs only in the
    store atom's half (host-stack addresses' 0x7f bytes, now 0). An H200 compiling for b200 failed this spec's
    derivation with a shape-dependent word that fits no coef * symbol; words like that in those halves (here
    written into every fill of each shape) fail the old derivation and leave the new layout as it is."""
    import gzip

    from ingot.codegen.kernels.gemm_cutlass import blockscaled_rule as bs

    data = json.loads(gzip.decompress((FIXTURES / "cutlass_probe_runs_b200_nvfp4.json.gz").read_bytes()))
    recorded = data["cpu_host"]["residual" if residual else "plain"]
    spec = bs.blockscaled_spec("nvfp4", get_target("b200"), residual=residual)
    runs = _probe_runs(recorded["runs"])
    layout = cp.derive_layout(spec, runs)
    with monkeypatch.context() as m:
        m.setattr(cp, "_atom_tails", lambda tmas: set())
        old = cp.derive_layout(spec, runs)
    atoms = [128, 384, 640, 896, 1152, 1408, 1664, 1920, *([2432] if residual else []), 2688]
    assert sorted(t["offset"] for t in layout["tma"]) == atoms
    tails = {a + cp.TMA_BYTES + i for a in atoms for i in range(cp.TMA_BYTES)}
    assert cp._atom_tails(layout["tma"]) == tails
    # the scale-factor layouts (M/128, K/64 and their strides) are live ints, after the mainloop's last atom
    assert [o for o, *_ in layout["ints"]] == [2176, 2180, 2188, 2192, 2196, 2200, 2208, 2212]
    assert not tails & _live_bytes(layout) and not tails & _live_bytes(old)
    padding = {i for a, b in layout["padding"] for i in range(a, b)}
    old_padding = {i for a, b in old["padding"] for i in range(a, b)}
    assert padding >= old_padding and padding - old_padding == tails - old_padding
    assert {k: v for k, v in layout.items() if k not in ("padding", "template")} == \
        {k: v for k, v in old.items() if k not in ("padding", "template")}
    template, old_template = bytes.fromhex(layout["template"]), bytes.fromhex(old["template"])
    changed = {i for i in range(layout["size"]) if template[i] != old_template[i]}
    assert changed and changed <= set(range(2688 + cp.TMA_BYTES, 2688 + 2 * cp.TMA_BYTES))
    assert {old_template[i] for i in changed} == {0x7F} and all(template[i] == 0 for i in tails)
    # a GPU host's dirty halves: a word the same in every fill of a shape, different between shapes
    dirty = []
    for (shape, *fills), word in zip(runs, (152, 24, 408, 152, 24)):
        blobs = [bytearray(f["blob"]) for f in fills]
        for b in blobs:
            struct.pack_into("<i", b, 896 + cp.TMA_BYTES + 48, word)  # in SFB's second half
        dirty.append((shape, *({**f, "blob": bytes(b)} for f, b in zip(fills, blobs))))
    with monkeypatch.context() as m:
        m.setattr(cp, "_atom_tails", lambda tmas: set())
        with pytest.raises(cp.LayoutError, match="byte 176 of the TMA atom at 896"):
            cp.derive_layout(spec, dirty)
    assert cp.derive_layout(spec, dirty) == layout
