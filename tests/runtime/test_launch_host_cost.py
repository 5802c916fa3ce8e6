"""What a prefill step's launches cost the host (``runtime/cuda_launch.py``), without a GPU (the driver call stubbed).

A 2048-token prefill step of the 1B shape queues 150-210 launches in Python, and its GPU work is ~6-8 ms, so host
work per launch shows in the step time: on the H200, hashing each spec's JSON on every launch (``KernelSpec.entry``)
and rebuilding the CUTLASS launch configuration made the W8A8 FP8 prefill host-bound (157k prompt tok/s; 301k once
both were done once, docs/PERF.md "W8A8 prefill on FP8 tensor cores"). These tests keep them out of the launch path.
"""

from __future__ import annotations

from ingot.codegen.kernel import KernelSpec
from ingot.codegen.kernels.quant_act.rule import fp8_quantizer_spec
from ingot.codegen.target import get_target
from ingot.runtime import cuda_driver as cd
from ingot.runtime import cuda_launch as cl

ARGS = {"x": {"buffer": "x"}, "input_scale": {"null": True}, "x_fp8": {"buffer": "q"}, "x_scale": {"buffer": "s"},
        "M": {"dim": "T"}}


def test_spec_key_and_entry_are_computed_once(monkeypatch):
    spec = fp8_quantizer_spec(2048, get_target("h200"), False)
    fresh = KernelSpec.from_dict(spec.to_dict())
    assert fresh.key == spec.key and fresh.entry == spec.entry == f"{spec.name}_{spec.key[:10]}"
    calls = []
    real = KernelSpec.to_json
    monkeypatch.setattr(KernelSpec, "to_json", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    launches = []
    monkeypatch.setattr(cd, "launch", lambda *a, **k: launches.append(a))
    ln = cl.Launch("fn", spec, ARGS, lambda name: 1 << 20, "quantizer", skip_rows=256)
    for t in (2048, 2048, 300, 5):
        ln.enqueue({"T": t}, None)  # type: ignore[arg-type]
    assert len(launches) == 3 and ln.skips == 1 and [a[1] for a in launches] == [(2048, 1, 1)] * 2 + [(300, 1, 1)]
    assert not calls, "the launch path serialized the spec"
    # another spec of the same values has its own (equal) key, computed on first use only
    other = KernelSpec.from_dict(spec.to_dict())
    assert other.key == spec.key and len(calls) == 1


def test_cutlass_launch_prepares_each_row_count_once(monkeypatch):
    from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp

    spec = cp.generic_linear_spec("fp8", get_target("h200"))
    args = {p.name: {"buffer": p.name} for p in spec.params if p.ctype == "ptr"} | {"M": {"dim": "T"}}
    built, launched = [], []

    class Prepared:
        def __init__(self, blob, config, stream):
            self.blob = blob

        def __call__(self, fn):
            launched.append(self.blob)

    monkeypatch.setattr(cp, "build_params", lambda layout, ptrs, m, n, k, sms: built.append(m) or (f"blob{m}", {}))
    monkeypatch.setattr(cp, "PreparedLaunch", Prepared)

    class Stream:
        handle = 7

    ln = cl.CutlassLaunch("fn", spec, args, lambda name: 1 << 20, "gemm", [], {}, 3072, 2048, 132)
    for t in (2048, 2048, 310, 2048, 310):
        ln.enqueue({"T": t}, Stream())  # type: ignore[arg-type]
    assert built == [2048, 310] and launched == ["blob2048", "blob2048", "blob310", "blob2048", "blob310"]
    # bounded: chunked prefill makes a new row count almost every step
    for t in range(1, 3 * cl.PREPARED_MAX):
        ln.enqueue({"T": t}, Stream())  # type: ignore[arg-type]
    assert 0 < len(ln.runner.prepared) <= cl.PREPARED_MAX and launched[-1] == f"blob{3 * cl.PREPARED_MAX - 1}"


def test_cutlass_variants_take_their_row_counts(monkeypatch):
    """A CUTLASS launch with short-step CUTLASS variants (``CutlassRunner``s, ``codegen/lower.py`` "Short steps on
    CUTLASS"): each row count runs the first variant covering it, past them the launch's own kernel; each with the
    launch's pointers, its Params prepared once per row count."""
    from ingot.codegen.kernels.gemm_cutlass import cutlass_params as cp
    from ingot.codegen.kernels.gemm_cutlass.rule import SHORT_M_TIERS

    tgt = get_target("h200")
    spec = cp.generic_linear_spec("bf16", tgt, residual=True)
    shorts = [cp.generic_linear_spec("bf16", tgt, residual=True, config=t.configs["bf16"]) for t in SHORT_M_TIERS]
    args = {p.name: {"buffer": p.name} for p in spec.params if p.ctype == "ptr"} | {"M": {"dim": "T"}}
    address = {name: (i + 1) << 20 for i, name in enumerate(args)}.__getitem__
    built, launched = [], []

    class Prepared:
        def __init__(self, blob, config, stream):
            self.blob = blob

        def __call__(self, fn):
            launched.append((fn, self.blob))

    def build(layout, ptrs, m, n, k, sms):
        built.append((layout["name"], m))
        assert ptrs == {name: address(name) for name in ptrs} and set(ptrs) >= {"x", "weight", "residual", "out"}
        return f"{layout['name']}{m}", {}

    monkeypatch.setattr(cp, "build_params", build)
    monkeypatch.setattr(cp, "PreparedLaunch", Prepared)

    class Stream:
        handle = 7

    own_args = cl.Arguments(spec, args, address)
    variants = [(t.rows, cl.CutlassRunner(f"fn{i}", s.entry, {"name": f"short{i}-"}, cl.pointer_args(s, own_args),
                                          2048, 8192, 132), s, None)
                for i, (t, s) in enumerate(zip(SHORT_M_TIERS, shorts))]
    ln = cl.CutlassLaunch("fn", spec, args, address, "down", variants, {"name": "own-"}, 2048, 8192, 132)
    for t in (65, 256, 257, 512, 513, 2048, 65):
        ln.enqueue({"T": t}, Stream())  # type: ignore[arg-type]
    assert launched == [("fn0", "short0-65"), ("fn0", "short0-256"), ("fn1", "short1-257"), ("fn1", "short1-512"),
                        ("fn", "own-513"), ("fn", "own-2048"), ("fn0", "short0-65")]
    assert built == [("short0-", 65), ("short0-", 256), ("short1-", 257), ("short1-", 512), ("own-", 513),
                     ("own-", 2048)] and ln.variant_launches == 5
