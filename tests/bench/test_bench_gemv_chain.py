"""bench/bench_gemv.py --chain without a GPU: its --dry-run builds and compiles every spec the fused chain with
interleaved norm launches would launch (M = 1: bucket 8), both GEMV families and the norm kernel."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.bench_gemv import CHAIN, CHAIN_ALPHA, CHAIN_EPS, chain_variant, dry_run_chain, main  # noqa: E402
from ingot.codegen.kernels.gemv.bulk_rule import bulk_spec, fused_bulk_spec  # noqa: E402
from ingot.codegen.kernels.gemv.rule import Prologue  # noqa: E402
from ingot.codegen.target import get_target  # noqa: E402
from tests.codegen.common import module_kernel_cache, needs_compiler  # noqa: E402, F401  (the fixture: autouse)

#: chain GEMV -> the template's PROLOGUE code of its fused variant (o stays plain)
PROLOGUE = {"qkv": 1, "o": 0, "gate_up": 1, "down": 2}


def test_variant_names():
    assert [chain_variant(f, i) for f in (False, True) for i in (None, "norm")] == [
        "plain", "interleave-norm", "fused", "fused+interleave-norm"]


@needs_compiler
def test_dry_run_fused_interleaved_chain_builds_every_spec(capsys):
    tgt = get_target("h200")
    got = dry_run_chain([1], tgt, fused=True, interleave="norm")
    assert {r["mb"] for r in got} == {8}
    for r in got:  # compiled for the H200, entry in the PTX
        assert r["built"].cubin and r["spec"].entry in r["built"].ptx and r["spec"].arch == "sm_90a"
    gemvs = {(r["family"], r["gemv"]): r["spec"] for r in got if r["family"] != "norm"}
    for name, n, k, residual in CHAIN:
        pro = {1: Prologue("rms_norm", eps=CHAIN_EPS), 2: Prologue("swiglu", alpha=CHAIN_ALPHA)}.get(PROLOGUE[name])
        plain_bulk = bulk_spec(n, k, 8, tgt, residual=residual)
        has_bulk = plain_bulk is not None and (pro is None or fused_bulk_spec(plain_bulk, pro, tgt) is not None)
        for family in ("kernel.cu", "bulk.cu"):
            spec = gemvs.get((family, name))
            if family == "bulk.cu" and not has_bulk:  # the kernel.cu spec, listed once under kernel.cu
                assert spec is None or spec.template == "kernel.cu"
                continue
            assert spec is not None, (family, name)
            v = dict(spec.values)
            assert spec.template == family and (v["N"], v["K"], v["MB"]) == (n, k, 8)
            assert v["PROLOGUE"] == PROLOGUE[name] and bool(v["HAS_RESIDUAL"]) == residual
            assert ("norm_weight" in [p.name for p in spec.params]) == (PROLOGUE[name] == 1)
            if PROLOGUE[name] == 1:
                assert v["EPS"] == CHAIN_EPS
            if PROLOGUE[name] == 2:
                assert v["ALPHA"] == CHAIN_ALPHA
    # all four GEMVs have a bulk configuration at bucket 8 (as measured on the H200)
    assert sum(s.template == "bulk.cu" for s in gemvs.values()) == 4
    norms = [r["spec"] for r in got if r["family"] == "norm"]
    assert sorted(dict(s.values)["HIDDEN"] for s in norms) == sorted({k for _, _, k, _ in CHAIN})
    for s in norms:
        v = dict(s.values)
        assert s.family == "norm" and v["KIND"] == 0 and v["EPS"] == CHAIN_EPS and v["DT"] == v["WT"] == "bf16"
        assert not v["RESIDUAL"] and not v["BIAS"]
    capsys.readouterr()
    # the command line: the same specs (now cached), one line each, exit 0
    assert main(["--chain", "--fused", "--interleave", "norm", "--m", "1", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "fused+interleave-norm" in lines[0]
    for r in got:
        assert sum(r["spec"].entry in line for line in lines) == 1
